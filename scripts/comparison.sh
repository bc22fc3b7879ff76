#!/usr/bin/env bash
# The whole comparison of a profile as DVC experiments, gathered and collected into
# reports/<name>/ (results, objectives with p-values, every run, stage devices and wall times,
# per-run metrics, curves and params):
#
#   bash scripts/comparison.sh -j auto gpu all params/gpu.yaml # on a GPU machine: reports/gpu/
#   bash scripts/comparison.sh -j 2 grid all                   # the default profile, 2 queue workers
#
# Arguments: [-j N|auto] (DVC queue workers, default 1; auto: as many as the cores and the GPU's
# free memory hold, `python -m storyrewrite.parallel workers`), NAME (experiment prefix, runs/NAME/
# and reports/NAME/), PART, then the params profiles to overlay (none: params.yaml as it is). PART:
# `core` = NLL, NLL continued, DTO-Score, -Delta, -Score+Delta, RLOO on each of the three rewards,
# the LLM modes and the copy baselines; `cpo` = the CPO grid (4 betas x 3 lambdas); `all` = both;
# `seeds` = NLL continued and the three DTO objectives again with each of the fine-tuning seeds
# COMPARISON_SEEDS (default "1 2"; `train.seed`, the same NLL model), which the collected results
# add to the `core` runs' as the spread over seeds.
#
# What DVC does, DVC does. Every experiment is queued (`dvc exp run --queue`) and run by
# `dvc queue start -j N`. With several workers, the stages every experiment shares (the NLL model,
# each LLM mode, the copy baselines, the metric check) first run side by side, each group an
# experiment of its own targets; the experiments then restore them from DVC's run cache and run
# only `train` and what follows. dvc.lock forgets, while the experiments are queued, the stages
# whose outputs this machine's cache lacks (storyrewrite.report.lockfile), so that DVC looks them
# up in the run cache. Each stage takes its share of the machine (STORYREWRITE_WORKERS=N: cores / N
# threads, a GPU of its own where there are several; src/storyrewrite/parallel.py).
# What DVC cannot do stays here: naming the experiments, gathering each one as soon as it has
# finished (runs/NAME holds what ran even if the machine goes away), skipping those that exist
# (after an interruption the same command goes on where it stopped), and collecting. An experiment
# that fails (a diverging CPO setting, say) does not stop the others: the script gathers and
# collects what ran, names the failures and exits 1. A folder gathered on another machine, put
# beside this one as runs/NAME.<anything>, is collected with it, and its experiments are not run
# again (docs/gpu.md). Without names, DVC's own sweep runs the CPO grid too:
#   dvc exp run --queue -S objective=cpo -S 'cpo.beta=0.1,0.5,1,2' -S 'cpo.lambda=0.5,1,2'
set -euo pipefail

usage() { echo "usage: bash scripts/comparison.sh [-j N|auto] NAME core|cpo|all|seeds [PROFILE.yaml ...]" >&2; }
JOBS=1
while getopts "j:" option; do
  case $option in
  j) JOBS=$OPTARG ;;
  *) usage; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -lt 2 ]; then
  usage
  exit 2
fi
if ! [[ $JOBS =~ ^([1-9][0-9]*|auto)$ ]]; then
  echo "error: -j must be a whole number >= 1 or auto, got '$JOBS'" >&2
  exit 2
fi
NAME=$1 PART=$2
shift 2
case $PART in core | cpo | all | seeds) ;; *)
  echo "error: PART must be core, cpo, all or seeds, got '$PART'" >&2
  exit 2
  ;;
esac
SEEDS=${COMPARISON_SEEDS:-1 2}
if [ "$PART" = seeds ] && ! [[ $SEEDS =~ ^[0-9]+( [0-9]+)*$ ]]; then
  echo "error: COMPARISON_SEEDS must be whole numbers separated by spaces, got '$SEEDS'" >&2
  exit 2
fi
# Where DVC is importable but has no command (the GPU machine's `pip install --target`, see
# offline/README.md), a `dvc` on PATH that runs it as a module: DVC starts its queue
# workers as `dvc exp queue-worker`.
if ! command -v dvc >/dev/null 2>&1; then
  SHIM=$(mktemp -d)
  printf '#!/usr/bin/env bash\nexec python -m dvc "$@"\n' >"$SHIM/dvc"
  chmod +x "$SHIM/dvc"
  PATH="$SHIM:$PATH"
fi
OVERRIDES=()
if [ $# -gt 0 ]; then
  # shellcheck disable=SC2207  # the overrides are -S key=value words without spaces
  OVERRIDES=($(python -m storyrewrite.profiles overrides "$@"))
fi
EXISTING=" $(dvc exp list --name-only 2>/dev/null | tr '\n' ' ') "
# Experiments gathered before, here (runs/NAME) or on another machine (runs/NAME.<anything>): a
# folder with a run's manifest (a run that finished none may have brought home its run cache alone).
shopt -s nullglob
FOLDERS=()
for folder in "runs/$NAME" "runs/$NAME".*; do
  manifests=("$folder"/*.json)
  [ -d "$folder" ] && [ ${#manifests[@]} -gt 0 ] && FOLDERS+=("$folder")
done
GATHERED_BEFORE=" "
for manifest in "runs/$NAME"/*.json "runs/$NAME".*/*.json; do
  GATHERED_BEFORE+="$(basename "$manifest" .json) "
done
shopt -u nullglob

# The experiments, in order: "suffix|-S overrides".
PLAN=()
if [ "$PART" = core ] || [ "$PART" = all ]; then
  PLAN+=("nll-continued|-S objective=nll")
  for objective in score delta score_delta; do
    PLAN+=("dto-${objective//_/-}|-S objective=$objective")
  done
  for reward in score delta score_delta; do  # the policy-gradient baseline on each DTO reward
    PLAN+=("rloo-${reward//_/-}|-S objective=rloo -S rl.reward=$reward")
  done
fi
if [ "$PART" = cpo ] || [ "$PART" = all ]; then
  for beta in 0.1 0.5 1 2; do
    for lambda in 0.5 1 2; do
      PLAN+=("cpo-b$beta-l$lambda|-S objective=cpo -S cpo.beta=$beta -S cpo.lambda=$lambda")
    done
  done
fi
if [ "$PART" = seeds ]; then
  for seed in $SEEDS; do
    PLAN+=("nll-continued-seed$seed|-S objective=nll -S train.seed=$seed")
    for objective in score delta score_delta; do
      PLAN+=("dto-${objective//_/-}-seed$seed|-S objective=$objective -S train.seed=$seed")
    done
  done
fi

FAILED=() UNGATHERED=() RAN=0
gather() { python -m storyrewrite.report.gather --out "runs/$NAME" --names "$1" || UNGATHERED+=("$1"); }

# drain GATHER NAME...: runs the queued experiments NAME... with $JOBS workers and waits until each
# has finished (GATHER=1: gathers it at once) or failed (into DRAIN_FAILED).
drain() {
  local gather_each=$1 status busy done_now experiment idle_polls=0 restarts=0 still
  shift
  local remaining=("$@")
  DRAIN_FAILED=()
  dvc queue start -j "$JOBS"
  while [ ${#remaining[@]} -gt 0 ]; do
    status=$(dvc queue status 2>/dev/null || true)
    busy=$(grep -cwE 'Queued|Running' <<<"$status" || true)
    # DVC's workers can stop with experiments still queued (a worker that read its file-system
    # broker's message mid-write exits with a JSONDecodeError in its log, .dvc/tmp/exps/celery/):
    # seen on two polls in a row (a worker just started may not be up yet), start them again.
    if grep -qw Queued <<<"$status" && ! grep -qw Running <<<"$status" && grep -q 'Worker status: 0 active' <<<"$status"; then
      idle_polls=$((idle_polls + 1))
    else
      idle_polls=0
    fi
    if [ $idle_polls -ge 2 ]; then
      restarts=$((restarts + 1))
      if [ $restarts -gt "${COMPARISON_MAX_RESTARTS:-5}" ]; then
        echo "error: DVC's queue workers stopped $restarts times with experiments queued; see .dvc/tmp/exps/celery/*.out" >&2
        busy=0
      else
        echo "== the queue's workers stopped with experiments queued: started again ($(date -u +%H:%M:%S))"
        dvc queue start -j "$JOBS"
        idle_polls=0
      fi
    fi
    done_now=" $(dvc exp list --name-only 2>/dev/null | tr '\n' ' ') "
    still=()
    for experiment in "${remaining[@]}"; do
      if [[ $done_now == *" $experiment "* ]]; then
        echo "== $experiment: finished ($(date -u +%H:%M:%S))"
        if [ "$gather_each" = 1 ]; then
          RAN=1
          gather "$experiment"
        fi
      elif [ "$busy" -gt 0 ]; then
        still+=("$experiment")
      else
        DRAIN_FAILED+=("$experiment")  # the queue is empty and it never finished: `dvc queue logs $experiment`
      fi
    done
    remaining=("${still[@]+"${still[@]}"}")
    if [ ${#remaining[@]} -gt 0 ]; then sleep "${COMPARISON_POLL_SECONDS:-15}"; fi
  done
}

TODO=()  # "experiment|-S overrides" of those still to run
for entry in "${PLAN[@]}"; do
  experiment="$NAME-${entry%%|*}"
  if [[ $EXISTING == *" $experiment "* ]]; then
    echo "== $experiment: exists, skipped"
  elif [[ $GATHERED_BEFORE == *" $experiment "* ]]; then
    echo "== $experiment: gathered before (runs/$NAME*), skipped"
  else
    TODO+=("$experiment|${entry#*|}")
  fi
done

if [ ${#TODO[@]} -gt 0 ]; then
  if [ "$JOBS" = auto ]; then
    shopt -s nullglob
    JOBS=$(python -m storyrewrite.parallel workers --experiments ${#TODO[@]} --records reports/stages/*.json "runs/$NAME".*/stages/*.json)
    shopt -u nullglob
  fi
  export STORYREWRITE_WORKERS=$JOBS
  # Every experiment restores from DVC's run cache what another built here: dvc.lock forgets the
  # stages whose outputs this machine's cache lacks (storyrewrite.report.lockfile), for as long as
  # the experiments are queued (each takes the workspace as it is then); then it is put back.
  LOCK_KEPT=
  if [ -f dvc.lock ]; then
    LOCK_KEPT=$(mktemp)
    cp dvc.lock "$LOCK_KEPT"
    python -m storyrewrite.report.lockfile forget
  fi
  if [ "$JOBS" -gt 1 ]; then
    # The stages every experiment shares, side by side: the NLL model (with its predictions and
    # scores), each LLM mode, the copy baselines and the metric check, each group an experiment
    # of its own targets. The experiments then restore them from the run cache; a group that
    # failed is run again by each experiment that needs it.
    # shellcheck disable=SC2207  # the modes are words without spaces
    MODES=($(python -m storyrewrite.profiles get "$@" --key llm.modes))
    GROUPS_=("nll|score@nll" "sanity|score_sanity" "validity|validity")
    for mode in "${MODES[@]}"; do GROUPS_+=("llm-$mode|score_llm@$mode"); done
    SHARED=()
    for group in "${GROUPS_[@]}"; do SHARED+=("$NAME.shared-${group%%|*}"); done
    # What an interrupted comparison left of them would pass for finished, or clash by name.
    dvc exp remove "${SHARED[@]}" >/dev/null 2>&1 || true
    for group in "${GROUPS_[@]}"; do
      dvc exp run --queue -n "$NAME.shared-${group%%|*}" "${OVERRIDES[@]}" "${group#*|}" >/dev/null
    done
    echo "== the shared stages: ${#SHARED[@]} group(s), $JOBS worker(s) ($(date -u +%H:%M:%S))"
    drain 0 "${SHARED[@]}"
    if [ ${#DRAIN_FAILED[@]} -gt 0 ]; then
      echo "warning: shared stages failed (${DRAIN_FAILED[*]}): each experiment runs them itself (\`dvc queue logs NAME\`)" >&2
    fi
    # Their stages stay in the run cache; the partial experiments themselves go.
    dvc exp remove "${SHARED[@]}" >/dev/null 2>&1 || true
    # Their workers end by themselves once the queue is empty (DVC's TemporaryWorker, within about
    # 10 s). Wait for that before more experiments are queued: `dvc queue start` does not always see
    # a live worker, and then starts a second one of the same name beside it. (Not `dvc queue stop`:
    # its shutdown message stays in the file broker, and the next workers take it and stop.)
    for _ in $(seq "${COMPARISON_WORKER_WAIT:-120}"); do
      grep -qsa 'queue-worke[r]' /proc/[0-9]*/cmdline || break
      sleep 1
    done
  fi
  QUEUED=()
  for entry in "${TODO[@]}"; do
    experiment=${entry%%|*}
    # shellcheck disable=SC2206  # the overrides are words without spaces
    settings=(${entry#*|})
    echo "== $experiment: queued, ${settings[*]}"
    dvc exp run --queue -n "$experiment" "${OVERRIDES[@]}" "${settings[@]}" >/dev/null
    QUEUED+=("$experiment")
  done
  if [ -n "$LOCK_KEPT" ]; then mv "$LOCK_KEPT" dvc.lock; fi
  echo "== ${#QUEUED[@]} queued experiment(s), $JOBS worker(s) ($(date -u +%H:%M:%S))"
  drain 1 "${QUEUED[@]}"
  FAILED+=("${DRAIN_FAILED[@]+"${DRAIN_FAILED[@]}"}")
fi

# What could not be gathered as it finished (DVC's `exp show` failing while a queue worker set up
# the next experiment, beyond gather's own retries), once more now that the queue is idle.
for experiment in "${UNGATHERED[@]+"${UNGATHERED[@]}"}"; do
  python -m storyrewrite.report.gather --out "runs/$NAME" --names "$experiment" || FAILED+=("$experiment (gather)")
done
# Everything of this name that ran here (nothing, where every experiment was gathered before).
if [ $RAN = 1 ] || grep -q "^$NAME-" <<<"$(dvc exp list --name-only 2>/dev/null | tr ' ' '\n')"; then
  python -m storyrewrite.report.gather --out "runs/$NAME" --names "$NAME-*" || FAILED+=("$NAME-* (gather)")
  # Collected where a gather stored something (none may have: every gather failing).
  if [ -d "runs/$NAME" ] && [[ " ${FOLDERS[*]+"${FOLDERS[*]}"} " != *" runs/$NAME "* ]]; then
    FOLDERS=("runs/$NAME" "${FOLDERS[@]+"${FOLDERS[@]}"}")
  fi
fi
COLLECTED=0
if [ ${#FOLDERS[@]} -eq 0 ]; then
  echo "error: nothing of $NAME ran here or was gathered before (runs/$NAME, runs/$NAME.*): no tables to collect" >&2
elif python -m storyrewrite.report.collect "${FOLDERS[@]}" --out "reports/$NAME" --title "$NAME (${*:-params.yaml})"; then
  COLLECTED=1
fi  # a collect that fails has said why; the failed experiments are still named below
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "error: ${#FAILED[@]} experiment(s) failed (see their output above, or \`dvc queue logs NAME\`): ${FAILED[*]}" >&2
  exit 1
fi
[ $COLLECTED = 1 ]
