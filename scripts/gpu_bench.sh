#!/usr/bin/env bash
# The GPU benchmarks (issue 10's targets), each printing ratios measured in one run, with the GPU's
# utilisation sampled every second beside them. Everything lands in OUT (default bench-out/):
#   bash scripts/gpu_bench.sh [OUT] [BENCH ...]
# BENCH, run in this order whatever the order given (the first ones answer the questions still open,
# so that a run cut short has measured what matters most):
#   training           training_paths: every objective trains 2 steps through the train stage's own
#                      fit on the GPU (tiny models; validation at the start, checkpoints, export): the
#                      code paths only the GPU shows, checked before anything long
#   generation         nll_throughput: NLL steps through Lightning's loop, and generation >= 200 test
#                      predictions/s (dynamic KV cache), at the profile's batch size and at 128 and 1024
#   generation-cudnn   generation with attention on cuDNN's kernels (torch's own choice, which the
#                      project keeps it off; training, deterministic as in the stage, never uses them)
#   pairs              objective_pairs: the same targets' ratios with the objectives' steps interleaved
#                      in one process (NLL, DTO-Score, Score+Delta in turn), where the host's drift
#                      falls on each alike; the ratios with their quartiles
#   steps              objective_step_time: DTO-Score <= 1.5x and Score+Delta <= 1.8x an NLL step
#                      (bf16-mixed, batch 16), GPU busy share from torch.profiler, operator tables in
#                      OUT/traces/
#   nan-fill           nan_fill: the same training steps (NLL, DTO-Score) with torch's NaN fill of new
#                      tensors and without it (the train stage runs without), alternating in one process
#   generation-static  nll_throughput with a static KV cache (compiled in a timed-apart warm-up)
#   scorer             scorer_and_bootstrap: LMScorer >= 3x a one-pair loop, fp32 within 1e-4, its bf16 rate
#   llm                llm_batching: the local LLM backend's prompts/s sent longest first (as the llm
#                      stages do) against instance order, and the share of padding each way
#   steps-batch64      objective_step_time as `steps` at batch 64: whether four times the work per
#                      kernel launch keeps the GPU busy and brings the step ratios to the arithmetic's
#                      (the FLOP ratios): what params/gpu.yaml's batch size waits on; into
#                      objective_step_time-bf16-mixed-batch64.json, tables in OUT/traces-batch64/
#   steps-others       objective_step_time of the objectives without a target (DTO-Delta, CPO, RLOO:
#                      sampling included) against an NLL step of their own run, into
#                      objective_step_time-bf16-mixed-others.json (the targets' run stays); tables in
#                      OUT/traces-others/ of one profiled step (RLOO's four steps are 1.5 million
#                      profiler events on a CPU, minutes to tabulate)
#   compile            compiled_steps: NLL, DTO-Score and Score+Delta steps compiled as `compile:
#                      reduce-overhead` trains (CUDA graphs) at batch 16, 32 and 64 against the eager
#                      step (each process first compiles, a minute or more); its failure is a warning only
#   all                every one above but compile (the default)
# A bench that fails does not stop the others (a GPU's time is short): the script goes on
# and exits 1 at the end naming those that failed.
set -uo pipefail
OUT=${1:-bench-out}
shift || true
NAMES=(training generation generation-cudnn pairs steps nan-fill generation-static scorer llm steps-batch64 steps-others compile)
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
mkdir -p "$OUT"
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 1 > "$OUT/nvidia-smi.csv" 2>&1 &
SMI=$!
trap 'kill $SMI 2>/dev/null || true' EXIT
export PYTHONUNBUFFERED=1
FAILED=()
bench() {  # bench NAME LOG ARGS...: if NAME is wanted, runs `python ARGS...`, its output also in OUT/LOG
  local name=$1 log=$2
  shift 2
  [ -n "${WANTED[$name]:-}" ] || return 0
  python "$@" 2>&1 | tee "$OUT/$log" || FAILED+=("$log")
}
bench training training_paths.txt bench/training_paths.py --device cuda --profile params/gpu.yaml --tiny
GENERATION=(bench/nll_throughput.py --device cuda --profile params/gpu.yaml --generate 1024)
bench generation nll_throughput.txt "${GENERATION[@]}" --steps 20 --compare-batch-sizes 128 1024
bench generation-cudnn nll_throughput_cudnn.txt "${GENERATION[@]}" --steps 1 --cudnn-attention
TRAINING=(--device cuda --precision bf16-mixed --profile params/gpu.yaml)  # the training step benches' settings
STEPS=(bench/objective_step_time.py "${TRAINING[@]}")
bench pairs objective_pairs.txt bench/objective_pairs.py "${TRAINING[@]}" --batch-size 16
bench steps objective_step_time.txt "${STEPS[@]}" --batch-size 16 --objectives nll score score_delta --trace "$OUT/traces"
bench nan-fill nan_fill.txt bench/nan_fill.py "${TRAINING[@]}" --batch-size 16
bench generation-static nll_throughput_static.txt "${GENERATION[@]}" --steps 1 --cache static
bench scorer scorer_and_bootstrap.txt bench/scorer_and_bootstrap.py --device cuda --profile params/gpu.yaml --pairs 1000 --batch-size 64
bench llm llm_batching.txt bench/llm_batching.py --device cuda --profile params/gpu.yaml --mode one_shot_random --prompts 1024 --repeats 2
bench steps-batch64 objective_step_time_batch64.txt "${STEPS[@]}" --batch-size 64 --objectives nll score score_delta \
  --name objective_step_time-bf16-mixed-batch64 --trace "$OUT/traces-batch64"
bench steps-others objective_step_time_others.txt "${STEPS[@]}" --batch-size 16 --objectives nll delta cpo rloo \
  --name objective_step_time-bf16-mixed-others --trace "$OUT/traces-others" --profile-steps 1
if [ -n "${WANTED[compile]:-}" ]; then
  # Not fatal: torch.compile has never run on this project's GPU (Triton also needs a C compiler
  # there), and whatever follows this script (a comparison run) should not depend on it.
  python bench/compiled_steps.py "${TRAINING[@]}" --batch-sizes 16 32 64 2>&1 \
    | tee "$OUT/compiled_steps.txt" || echo "warning: the compiled step bench failed (see above); the eager results stand" >&2
fi
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "error: these benches failed (their output in $OUT): ${FAILED[*]}" >&2
  exit 1
fi
