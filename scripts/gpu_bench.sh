#!/usr/bin/env bash
# The GPU benchmarks, with nvidia-smi sampled every second beside them (docs/benchmarks.md says
# what each measures and which targets it checks). Everything lands in OUT:
#   bash scripts/gpu_bench.sh [OUT] [BENCH ...]          (defaults: bench-out, all)
# BENCH is a name of the list below; `all` is every one but `compile`. They run in the list's
# order whatever the order given: the open questions first, so that a run cut short has measured
# what matters most. A bench that fails does not stop the others, and the script exits 1 naming
# them; `compile` only warns (torch.compile's Triton also needs a C compiler on the machine).
set -uo pipefail
OUT=${1:-bench-out}
shift || true
TRAINING="--device cuda --precision bf16-mixed --profile params/gpu.yaml"  # the training step benches' settings
GENERATION="bench/nll_throughput.py --device cuda --profile params/gpu.yaml --generate 1024"
STEPS="bench/objective_step_time.py $TRAINING"
# Each bench: its name, the file in OUT its output goes to, then `python`'s arguments (words without spaces).
BENCHES=(
  "training training_paths.txt bench/training_paths.py --device cuda --profile params/gpu.yaml --tiny"
  "generation nll_throughput.txt $GENERATION --steps 20 --compare-batch-sizes 128 1024"
  "generation-cudnn nll_throughput_cudnn.txt $GENERATION --steps 1 --cudnn-attention"
  "pairs objective_pairs.txt bench/objective_pairs.py $TRAINING --batch-size 16"
  "steps objective_step_time.txt $STEPS --batch-size 16 --objectives nll score score_delta --trace $OUT/traces"
  "nan-fill nan_fill.txt bench/nan_fill.py $TRAINING --batch-size 16"
  "generation-static nll_throughput_static.txt $GENERATION --steps 1 --cache static"
  "scorer scorer_and_bootstrap.txt bench/scorer_and_bootstrap.py --device cuda --profile params/gpu.yaml --pairs 1000 --batch-size 64
   --trace $OUT/traces-scorer --batch-sizes 128 256"
  "llm llm_batching.txt bench/llm_batching.py --device cuda --profile params/gpu.yaml --mode one_shot_random --prompts 1024 --repeats 2"
  "steps-batch64 objective_step_time_batch64.txt $STEPS --batch-size 64 --objectives nll score score_delta
   --name objective_step_time-bf16-mixed-batch64 --trace $OUT/traces-batch64"
  "steps-others objective_step_time_others.txt $STEPS --batch-size 16 --objectives nll delta cpo rloo
   --name objective_step_time-bf16-mixed-others --trace $OUT/traces-others --profile-steps 1"
  "steps-rloo-static objective_step_time_rloo_static.txt $STEPS --batch-size 16 --objectives nll rloo --set rl.cache=static
   --name objective_step_time-bf16-mixed-rloo-static --profile-steps 1"
  "rloo-side-by-side objective_step_time_rloo_side_by_side.txt $STEPS --batch-size 16 --objectives nll rloo --side-by-side 4
   --set rl.early_stop=false --name objective_step_time-bf16-mixed-rloo-side-by-side4 --profile-steps 1"
  "rloo-side-by-side-early-stop objective_step_time_rloo_side_by_side_early_stop.txt $STEPS --batch-size 16 --objectives nll rloo
   --side-by-side 4 --set rl.early_stop=true --name objective_step_time-bf16-mixed-rloo-side-by-side4-early-stop --profile-steps 1"
  "rloo-side-by-side-mps objective_step_time_rloo_side_by_side_mps.txt $STEPS --batch-size 16 --objectives nll rloo --side-by-side 4
   --set rl.early_stop=false --mps --name objective_step_time-bf16-mixed-rloo-side-by-side4-mps --profile-steps 1"
  "memory-share gpu_memory_share.txt bench/gpu_memory_share.py --mps"
  "startup stage_startup.txt bench/stage_startup.py --stages train generate score significance --side-by-side 8"
  "compile compiled_steps.txt bench/compiled_steps.py $TRAINING --batch-sizes 16 32 64"
)
NAMES=()
for bench in "${BENCHES[@]}"; do NAMES+=("${bench%% *}"); done
declare -A WANTED=()
for name in "${@:-all}"; do
  if [ "$name" = all ]; then
    for each in "${NAMES[@]}"; do [ "$each" = compile ] || WANTED[$each]=1; done
  elif [[ " ${NAMES[*]} " == *" $name "* ]]; then
    WANTED[$name]=1
  else
    echo "error: no bench '$name'; valid: ${NAMES[*]} all" >&2
    exit 2
  fi
done
[ -z "${GPU_BENCH_CHECK_NAMES:-}" ] || exit 0  # (offline/job.sh: the names checked, nothing run)
if ! command -v nvidia-smi >/dev/null; then
  echo "error: no nvidia-smi here: these benches measure an NVIDIA GPU; on a CPU run a bench script alone" \
       "with --device cpu (docs/benchmarks.md)" >&2
  exit 2
fi
mkdir -p "$OUT"
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 1 > "$OUT/nvidia-smi.csv" 2>&1 &
SMI=$!
trap 'kill $SMI 2>/dev/null || true' EXIT
export PYTHONUNBUFFERED=1
FAILED=()
for bench in "${BENCHES[@]}"; do
  read -ra words <<<"${bench//$'\n'/ }"
  [ -n "${WANTED[${words[0]}]:-}" ] || continue
  python "${words[@]:2}" 2>&1 | tee "$OUT/${words[1]}" && continue
  if [ "${words[0]}" = compile ]; then
    echo "warning: the compiled step bench failed (see above); the eager results stand" >&2
  else
    FAILED+=("${words[1]}")
  fi
done
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "error: these benches failed (their output in $OUT): ${FAILED[*]}" >&2
  exit 1
fi
