#!/usr/bin/env bash
# The whole comparison of a profile as DVC experiment sweeps, gathered into runs/NAME/ and
# collected into reports/NAME/ (docs/gpu.md):
#
#   bash scripts/comparison.sh -j auto gpu all params/gpu.yaml # on a GPU machine: reports/gpu/
#   bash scripts/comparison.sh -j 2 grid all                   # the default profile, 2 queue workers
#
# Arguments: [-j N|auto] (DVC queue workers, default 1; auto: as many as the cores and the memory
# hold), [-n N] (queue at most N of the runs not yet run, in the order below: on a machine whose
# time is short, some runs end whole rather than all half-run; the same command later queues the
# rest), NAME (runs/NAME/ and reports/NAME/), PART, then the params profiles to
# overlay (none: params.yaml as it is). PART: `core` = RLOO on each of the three rewards (queued
# first: the longest runs), NLL continued, DTO-Score, -Delta, -Score+Delta (with the NLL model, the
# LLM modes and the copy baselines every run holds); `cpo` = the CPO grid; `all` = both, side by
# side; `seeds` = NLL continued and DTO
# again with each fine-tuning seed of COMPARISON_SEEDS (a DVC sweep value, default `range(1,3)`).
#
# The sweeps are DVC's own, run by `dvc queue start -j N`; docs/gpu.md says how they share the GPU
# and DVC's run cache. A run whose params equal those of one that finished, runs or is queued here,
# or was gathered before into runs/NAME or runs/NAME.<anything>, is not queued, so the same command
# goes on where an interrupted one stopped; one that other sweeps left queued runs, named, but is
# not gathered. A failed experiment does not stop the others: what ran is gathered and
# collected, the failures are named with the end of each one's log, and the exit code is 1.
# COMPARISON_MPS=1 with several workers: their stages share the GPU through NVIDIA's Multi-Process
# Service, started for them alone and checked first (storyrewrite.mps), so that their kernels
# run at once instead of in turns; where the check fails, it says why and goes on without.
set -euo pipefail

usage() { echo "usage: bash scripts/comparison.sh [-j N|auto] [-n N] NAME core|cpo|all|seeds [PROFILE.yaml ...]" >&2; }
JOBS=1 LIMIT=
while getopts "j:n:" option; do
  case $option in
  j) JOBS=$OPTARG ;;
  n) LIMIT=$OPTARG ;;
  *) usage; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 2 ] || { usage; exit 2; }
[[ $JOBS =~ ^([1-9][0-9]*|auto)$ ]] || { echo "error: -j must be a whole number >= 1 or auto, got '$JOBS'" >&2; exit 2; }
[[ $LIMIT =~ ^([1-9][0-9]*)?$ ]] || { echo "error: -n must be a whole number >= 1, got '$LIMIT'" >&2; exit 2; }
NAME=$1 PART=$2 STARTED=$(date +%s)
shift 2
[[ ${COMPARISON_MPS:-0} =~ ^[01]$ ]] || { echo "error: COMPARISON_MPS must be 0 or 1, got '$COMPARISON_MPS'" >&2; exit 2; }
SEEDS=${COMPARISON_SEEDS:-range(1,3)}
# The sweeps, each the -S arguments of one `dvc exp run --queue`, and the number of runs they make.
SWEEPS=() PLANNED=0
case $PART in
core | all) SWEEPS+=("-S objective=rloo -S rl.reward=score,delta,score_delta" "-S objective=nll,score,delta,score_delta") PLANNED=7 ;;&
cpo | all) SWEEPS+=("-S objective=cpo -S cpo.beta=0.1,0.5,1,2 -S cpo.lambda=0.5,1,2") PLANNED=$((PLANNED + 12)) ;;
seeds)
  if [[ $SEEDS =~ ^range\(([0-9]+),([0-9]+)\)$ ]]; then count=$((BASH_REMATCH[2] - BASH_REMATCH[1]))
  elif [[ $SEEDS =~ ^[0-9]+(,[0-9]+)*$ ]]; then count=$(($(tr -cd , <<<"$SEEDS" | wc -c) + 1))
  else echo "error: COMPARISON_SEEDS must be range(A,B) or whole numbers separated by commas, got '$SEEDS'" >&2; exit 2; fi
  SWEEPS+=("-S objective=nll,score,delta,score_delta -S train.seed=$SEEDS") PLANNED=$((4 * count)) ;;
core) ;;
*) echo "error: PART must be core, cpo, all or seeds, got '$PART'" >&2; exit 2 ;;
esac
python -m storyrewrite.report.collect --check-name "$NAME" || exit 2  # (runs/NAME and reports/NAME: its own folders)
OVERRIDES=()
# shellcheck disable=SC2207  # the overrides are -S key=value words without spaces
[ $# -eq 0 ] || OVERRIDES=($(python -m storyrewrite.profiles overrides "$@"))
# folders: the gathered folders of this comparison (with a run's manifest), here (runs/NAME) and
# from other machines (runs/NAME.<anything>).
folders() { local folder; for folder in runs/"$NAME" runs/"$NAME".*; do ! compgen -G "$folder/*.json" >/dev/null || echo "$folder"; done; }
# A folder that offline/pack.sh HOLD slimmed to its manifests, params and stage records (its `.held`
# names the folder that holds the rest) serves the plan, not the collect. On the offline machine
# (COMPARISON_HELD=skip: offline/job.sh) it is left out of the collect; elsewhere it stops the
# comparison before anything runs, with the command that moves its files back.
[[ ${COMPARISON_HELD:-} =~ ^(skip)?$ ]] || { echo "error: COMPARISON_HELD must be skip or unset, got '$COMPARISON_HELD'" >&2; exit 2; }
HELD=()
for folder in $(folders); do [ ! -f "$folder/.held" ] || HELD+=("$folder"); done
if [ ${#HELD[@]} -gt 0 ] && [ -z "${COMPARISON_HELD:-}" ]; then
  echo "error: ${HELD[*]}: offline/pack.sh moved their scores out of the tree; move them back first: HOLD=$(cat "${HELD[0]}/.held") bash offline/pack.sh restore" >&2
  exit 2
fi
shopt -s nullglob
RECORDS=(reports/stages/*.json "runs/$NAME".*/stages/*.json)  # the stage records that say what a worker needs
shopt -u nullglob

# workers: the pids of this repository's DVC queue workers (`dvc exp queue-worker` processes whose
# working directory is the repository), from /proc; without one (macOS), through psutil.
HERE=$(pwd -P)
workers() {
  local cmdline
  if [ ! -d /proc/self ]; then
    python -m storyrewrite.parallel queue-workers --cwd "$HERE"
    return
  fi
  for cmdline in $(grep -lsa 'queue-worke[r]' /proc/[0-9]*/cmdline || true); do
    [ "$(readlink "${cmdline%/cmdline}/cwd" 2>/dev/null)" != "$HERE" ] || basename "${cmdline%/cmdline}"
  done
}

# run_queue: starts the queue's workers and waits until nothing is queued or running. DVC's workers
# can stop with experiments still queued: one that reads a message of its file broker mid-write
# exits with a JSONDecodeError once its experiment ends (.dvc/tmp/exps/celery/*.out; kombu writes a
# message file after creating it, and reads it without the lock: celery/kombu#1551,
# treeverse/dvc#10428). The polls read the queue without a message to the workers (`python -m
# storyrewrite.queue`): `dvc queue status` asks them through that broker (a broadcast), one
# more chance for the race beside the three questions each worker's own monitor asks every 10 s
# (dvc-task's TemporaryWorker; a monitor that meets the race dies, its worker runs on). The workers
# are asked only where the answer decides something: with experiments queued, where fewer of this
# repository's workers are alive than started or none runs an experiment; and where none is alive.
# All of them, or some: with experiments queued, fewer workers answering than started and fewer
# alive, seen on two polls in a row, the missing ones are started again (`dvc queue start` starts
# those of its numbers that do not answer). The more workers, the more often: the script gives up
# only after COMPARISON_MAX_RESTARTS restarts in a row with no experiment leaving the queue in
# between (a worker that cannot start at all). A poll reads the broker's files too, and can fail the
# same way: a failed poll is tried again, COMPARISON_STATUS_TRIES times in a row at most. An
# experiment whose worker was killed mid-run shows Running for ever (its result never comes): with
# nothing queued, no worker answering and none of this repository's alive, seen on three polls in a
# row, it is named and not waited for.
# The polls are COMPARISON_POLL_SECONDS apart: by default 15 s, or 5 s on a host of 8 cores or more
# (a GPU machine), where a poll's half second of one core is under 1 % of the host. Where fewer
# experiments are queued or running than at the poll before, those that finished are gathered
# into runs/NAME while the others run (gather_finished): the gather at the end reads the rest.
# run_queue NAME: waits only until the experiment NAME has left the queue and ended (polls 5 s apart),
# and gathers nothing. Gives up with 1. While experiments run, every COMPARISON_PROGRESS_SECONDS (300; 0: each poll) it
# prints the time, how many run and are queued, and each training under way: its step of its
# total, its pace so far and its time to go (`python -m storyrewrite.queue --trainings`).
queue_state() { python -m storyrewrite.queue "$@"; }  # [--workers]: the workers' line too
POLL_SECONDS=15
[ "$(nproc 2>/dev/null || echo 1)" -lt 8 ] || POLL_SECONDS=5
# gather_finished: the experiments of RUNS that finished, gathered (quietly: the others still run;
# a gather that fails here is tried again at the end).
gather_finished() {
  [ ${#RUNS[@]} -gt 0 ] || return 0
  python -m storyrewrite.report.gather --out "runs/$NAME" --names "${RUNS[@]}" --finished >/dev/null 2>&1 || true
}
state_of() { awk -v name="$1" '$2 == name {print $NF; exit}'; }  # state_of NAME < a poll's lines: its status
run_queue() {
  local until=${1:-} state poll=${COMPARISON_POLL_SECONDS:-$POLL_SECONDS}
  local status idle=0 restarts=0 failures=0 orphaned=0 answering active alive queued running last_queued= left= progress_at=$SECONDS
  [ -z "$until" ] || poll=${COMPARISON_POLL_SECONDS:-5}
  # Workers only for what is queued; what still runs (a worker an interrupted comparison left) is waited for.
  ! grep -qw Queued <<<"$(queue_state 2>/dev/null)" || dvc queue start -j "$JOBS"
  while :; do
    if ! status=$(queue_state 2>"$KEPT/status.err"); then
      failures=$((failures + 1))
      if [ $failures -ge "${COMPARISON_STATUS_TRIES:-5}" ]; then
        echo "error: reading DVC's queue failed $failures times in a row, the last with: $(tail -n 1 "$KEPT/status.err")" >&2
        return 1
      fi
      sleep "$poll"
      continue
    fi
    failures=0
    if [ -n "$until" ]; then
      state=$(state_of "$until" <<<"$status")
      [ "$state" = Queued ] || [ "$state" = Running ] || break
    fi
    queued=$(grep -cw Queued <<<"$status" || true)
    running=$(grep -cw Running <<<"$status" || true)
    [ $((queued + running)) -gt 0 ] || break
    [ -n "$until" ] || [ -z "$left" ] || [ $((queued + running)) -ge "$left" ] || gather_finished
    left=$((queued + running))
    if [ "$running" -gt 0 ] && [ $((SECONDS - progress_at)) -ge "${COMPARISON_PROGRESS_SECONDS:-300}" ]; then
      progress_at=$SECONDS
      echo "== $(date -u +%H:%M:%S): $running running, $queued queued"
      queue_state --trainings 2>/dev/null || true
    fi
    [ -z "$last_queued" ] || [ "$queued" -ge "$last_queued" ] || restarts=0
    last_queued=$queued
    alive=$(workers | wc -l)
    answering= active=
    if { [ "$queued" -gt 0 ] && { [ "$alive" -lt "$JOBS" ] || [ "$running" -eq 0 ]; }; } || [ "$alive" -eq 0 ]; then
      # "A + I": the workers that answer, active and idle (none where the broadcast fails)
      answering=$(queue_state --workers 2>/dev/null | sed -n 's/^Worker status: \([0-9]*\) active, \([0-9]*\) idle$/\1 + \2/p')
      active=${answering%% *}
    fi
    if [ "$running" -gt 0 ] && [ "$queued" -eq 0 ] && [ -n "$answering" ] && [ $((answering)) -eq 0 ] && [ "$alive" -eq 0 ]; then
      orphaned=$((orphaned + 1))
      if [ $orphaned -ge 3 ]; then
        echo "error: $(awk '$NF == "Running" {print $2}' <<<"$status" | xargs) still Running with no queue worker alive (killed mid-run?): not waited for; see .dvc/tmp/exps/celery/*.out" >&2
        return 1
      fi
    else
      orphaned=0
    fi
    if { [ "$running" -eq 0 ] && [ "$active" = 0 ]; } ||
      { [ "$queued" -gt 0 ] && [ -n "$answering" ] && [ $((answering)) -lt "$JOBS" ] && [ "$alive" -lt "$JOBS" ]; }; then
      idle=$((idle + 1))
    else
      idle=0
    fi
    if [ $idle -ge 2 ]; then
      restarts=$((restarts + 1))
      if [ $restarts -gt "${COMPARISON_MAX_RESTARTS:-5}" ]; then
        echo "error: DVC's queue workers stopped $restarts times in a row with experiments queued, none started in between; see .dvc/tmp/exps/celery/*.out" >&2
        return 1
      fi
      echo "== the queue's workers stopped with experiments queued: started again ($(date -u +%H:%M:%S))"
      dvc queue start -j "$JOBS"
      idle=0
    fi
    sleep "$poll"
  done
}

# stop_workers: once nothing is queued or running, this repository's workers are stopped and waited
# for (COMPARISON_WORKER_WAIT seconds at most). Each would end by itself about 10 s later, or never:
# the monitor thread that ends it dies of the broker race too. SIGTERM is celery's warm shutdown,
# which lets a running task end first. Not `dvc queue stop`: its message stays in the broker for
# the next workers. And before new experiments are queued, as `dvc queue start` does not always
# see a worker that is ending, and then starts a second of its name.
stop_workers() {
  local pids
  pids=$(workers)
  [ -n "$pids" ] || return 0
  # shellcheck disable=SC2086  # pids: numbers, one a line
  kill -TERM $pids 2>/dev/null || true
  for _ in $(seq "${COMPARISON_WORKER_WAIT:-120}"); do
    [ -n "$(workers)" ] || return 0
    sleep 1
  done
  echo "warning: DVC's queue workers $(workers | xargs) still run ${COMPARISON_WORKER_WAIT:-120} s after SIGTERM" >&2
}

# queue ARGS...: `dvc exp run --queue ARGS...` with dvc.lock set aside while DVC copies the workspace;
# the names DVC gives the experiments go to $KEPT/mine.
KEPT=$(mktemp -d)
# stop_mps: NVIDIA's MPS, where this comparison started it (COMPARISON_MPS=1), stopped once no worker
# is left. Workers that go on after an interrupted comparison keep it, told how to stop it after them.
MPS_DIR=
stop_mps() {
  [ -n "$MPS_DIR" ] || return 0
  if [ -n "$(workers)" ]; then
    echo "warning: NVIDIA's MPS left running for the queue's workers; once they end: python -m storyrewrite.mps stop $MPS_DIR" >&2
  else
    python -m storyrewrite.mps stop "$MPS_DIR" || true
    rm -rf "$MPS_DIR"
  fi
  MPS_DIR=
}
# The exit, also when interrupted, first waits for a `dvc exp run --queue` still running (queue):
# SIGTERM reaches the script alone, and that DVC would, at its end, put the workspace back as it
# found it, without dvc.lock, after the exit had put it back. Ctrl-C (SIGINT) reaches DVC too, which
# ends cleanly. Queue workers are detached: they go on either way.
trap 'wait || true; [ ! -f "$KEPT/dvc.lock" ] || mv "$KEPT/dvc.lock" dvc.lock; rm -rf "$KEPT"; stop_mps' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# DVC runs in the background and is waited for, so that the exit above can wait for it too: bash
# defers a trap until a foreground command ends only once it waits for it, and a stop that comes
# between the fork and that wait ran the exit at once. `trap - INT`: Ctrl-C reaches it as it
# reaches a foreground command (bash has a background one ignore SIGINT).
queue() {
  local rc=0
  [ ! -f dvc.lock ] || mv dvc.lock "$KEPT/dvc.lock"
  (trap - INT; exec dvc exp run --queue "$@") > "$KEPT/queued" &
  wait $! || rc=$?
  sed -n "s/^Queued experiment '\(.*\)' for future execution\.$/\1/p" "$KEPT/queued" >> "$KEPT/mine"
  [ ! -f "$KEPT/dvc.lock" ] || mv "$KEPT/dvc.lock" dvc.lock
  return $rc
}
# The sweeps' runs to queue, planned before any worker starts: a run whose params equal those of one
# gathered before (runs/NAME, runs/NAME.*) or one here (finished, running or queued) is left out
# before it is queued, as the workers are running by then and would take it at once. A sweep that
# leaves nothing out is queued as it is; else each of its runs on its own. The experiments here that
# stand in for runs left out are gathered with the rest.
: > "$KEPT/standins"; : > "$KEPT/refused"
for sweep in "${SWEEPS[@]}"; do echo "${OVERRIDES[*]} $sweep"; done |
  python -m storyrewrite.report.gather --plan $(folders) --stand-ins "$KEPT/standins" --refused "$KEPT/refused" \
    --runs "$KEPT/runs" ${LIMIT:+--limit "$LIMIT" --deferred "$KEPT/deferred"} > "$KEPT/plan"
mapfile -t PLAN < <(grep . "$KEPT/plan" || true)
PLANNED=$((PLANNED - $(wc -l < "$KEPT/refused")))  # (a task without an original ending: the runs it cannot serve, named above)
# The stages every run shares, where several workers will run them first (below), each group an
# experiment of its own targets: the NLL model (with what comes before it), the copy baselines' scores
# with the metric check that reads them (`validity`, after `score_sanity`), each LLM mode, and the
# NLL model's scores (SCORES: after `train` in DVC's order, queued beside the sweeps).
# COMPARISON_SHARED=0 skips them where an earlier part of the same comparison ran them (bench/comparison.py),
# and so does a plan that queues nothing (every run ran before).
GROUPS_=() SCORES=
if [ "$JOBS" != 1 ] && [ "${COMPARISON_SHARED:-1}" != 0 ] && [ ${#PLAN[@]} -gt 0 ]; then
  # shellcheck disable=SC2207  # the modes are words without spaces
  MODES=($(python -m storyrewrite.profiles get "$@" --key llm.modes))
  GROUPS_=("nll|train_nll" "sanity|validity")
  for mode in "${MODES[@]}"; do GROUPS_+=("llm-$mode|score_llm@$mode"); done
  SCORES="nll-scores|score@nll"
fi
# -j auto: as many workers as the machine holds, and no more than the experiments to run, counted once
# the plan is made: the runs it queues, those queued here before that stand in for some, and the shared
# stages' groups, which run beside the runs (so many workers that the runs need not wait for them).
if [ "$JOBS" = auto ]; then
  experiments=$(($(cat "$KEPT/runs") + ${#GROUPS_[@]} + (${#SCORES} > 0)))
  JOBS=$(python -m storyrewrite.parallel workers --experiments "$experiments" --records "${RECORDS[@]}")
fi
export STORYREWRITE_WORKERS=$JOBS
# What each worker needs of a GPU they share, by the same records: a stage caps its memory at what
# the other workers leave it (storyrewrite.parallel.share_gpu_memory), so that one larger than the
# records' (RLOO's training) still fits. Unused on a CPU.
if [ "$JOBS" -gt 1 ]; then
  STORYREWRITE_WORKER_GPU_GB=$(python -m storyrewrite.parallel gpu-reserve --records "${RECORDS[@]}")
  export STORYREWRITE_WORKER_GPU_GB
fi
echo "== planned: ${#PLAN[@]} call(s) of dvc exp run --queue ($(date -u +%H:%M:%S))"  # (the times: where the start of a run goes)
if [ "${COMPARISON_MPS:-0}" = 1 ] && [ "$JOBS" -gt 1 ] && [ ${#PLAN[@]} -gt 0 ]; then
  # Before any worker starts: the workers, and the stages they start, inherit the variables that make them its clients.
  MPS_DIR=$(mktemp -d "${TMPDIR:-/tmp}/storyrewrite-mps.XXXXXX")
  if assignments=$(python -m storyrewrite.mps start "$MPS_DIR" 2>"$KEPT/mps.err"); then
    while IFS='=' read -r key value; do export "$key=$value"; done <<< "$assignments"
    mps="on, for this comparison's workers ($MPS_DIR)"
  else
    rm -rf "$MPS_DIR"
    MPS_DIR= mps="off: $(tail -n 1 "$KEPT/mps.err")"
  fi
  echo "== NVIDIA's MPS: $mps"
  [ -z "${COMPARISON_MPS_STATE:-}" ] || echo "$mps" > "$COMPARISON_MPS_STATE"  # (bench/comparison.py's record)
fi
SHARED=()  # the shared stages' experiments, removed at the end (their stages are in the run cache)
# remove_shared: those DVC knows (an experiment's ref, or a task of its queue), in one call (each
# call costs about a second); one at a time where that fails, as DVC removes none of the names given
# when one is unknown (a group that failed).
remove_shared() {
  local name known present=()
  [ ${#SHARED[@]} -gt 0 ] || return 0
  known=$( { git for-each-ref --format='%(refname:lstrip=4)' refs/exps/ 2>/dev/null || true; queue_state 2>/dev/null | awk '{print $2}' || true; } )
  for name in "${SHARED[@]}"; do ! grep -qxF -- "$name" <<<"$known" || present+=("$name"); done
  [ ${#present[@]} -gt 0 ] || return 0
  dvc exp remove "${present[@]}" >/dev/null 2>&1 && return 0
  for name in "${present[@]}"; do dvc exp remove "$name" >/dev/null 2>&1 || true; done
}
if [ "$JOBS" -gt 1 ] && [ ${#GROUPS_[@]} -gt 0 ]; then
  # The shared stages (GROUPS_ above) run first, side by side. The sweeps are queued as soon as the
  # NLL model's group ends, the other groups still running: in DVC's order (dvc.yaml's) an
  # experiment reaches their stages only after its `train`, when they have ended and are in the run
  # cache. The NLL model's scores come after `train` too: queued first beside the sweeps. A group
  # that failed is run again by each experiment that needs it.
  for group in "${GROUPS_[@]}" "$SCORES"; do SHARED+=("$NAME.shared-${group%%|*}"); done
  remove_shared  # what an interrupted comparison left
  for group in "${GROUPS_[@]}"; do
    queue -n "$NAME.shared-${group%%|*}" "${OVERRIDES[@]}" "${group#*|}"
    # The NLL model's group, which the sweeps wait for, starts as soon as it is queued: one worker
    # runs it while the other groups are queued (a few seconds each); run_queue starts the others.
    [ "$group" != "${GROUPS_[0]}" ] || dvc queue start -j 1
  done
  # Once that worker has taken the group (60 s at most): `dvc queue start` starts a second worker
  # of a name whose worker is still booting, as it does not answer yet.
  for _ in $(seq 60); do
    [ "$(queue_state 2>/dev/null | state_of "$NAME.shared-nll")" = Queued ] || break
    sleep 1
  done
  echo "== the shared stages: ${#GROUPS_[@]} group(s), $JOBS worker(s) ($(date -u +%H:%M:%S))"
  run_queue "$NAME.shared-nll" || true  # (a queue given up on: the sweeps still go in, their workers started again)
  echo "== the NLL model's group ended ($(date -u +%H:%M:%S))"
  queue -n "$NAME.shared-${SCORES%%|*}" "${OVERRIDES[@]}" "${SCORES#*|}"
fi
QUEUED=0
for call in "${PLAN[@]}"; do
  echo "== queued: $call"
  # shellcheck disable=SC2086  # the settings are words without spaces
  queue $call
  QUEUED=$((QUEUED + 1))
done
KEEP=
if [ "$QUEUED" -gt 0 ]; then
  # The stand-ins count as queued by this comparison (where DVC printed no names, every queued one does).
  [ ! -s "$KEPT/mine" ] || cat "$KEPT/standins" >> "$KEPT/mine"
  # shellcheck disable=SC2046  # the folders' names are words without spaces
  if ! KEEP=$(python -m storyrewrite.report.gather --dedupe $(folders) --mine "$KEPT/mine"); then
    # (Twins of earlier runs then stay queued: they run, and of runs with equal params the collector keeps one.)
    echo "warning: the dedupe above failed: every experiment queued here runs and is gathered" >&2
    KEEP=$(grep -vF "$NAME.shared-" "$KEPT/mine" || true)
  fi
fi
# With nothing queued, the stand-ins alone: the runs of these sweeps that ran before, or are queued from before.
# shellcheck disable=SC2207  # experiment names are words without spaces
RUNS=($( { echo "$KEEP"; cat "$KEPT/standins"; } | awk 'NF && !seen[$0]++'))
echo "== ${#RUNS[@]} experiment(s) of $PLANNED to gather, $JOBS worker(s) ($(date -u +%H:%M:%S))"
run_queue && stop_workers
echo "== the queue is empty ($(date -u +%H:%M:%S))"  # (the times: where the end of a run goes)
remove_shared
# Why each experiment that failed since this comparison started did: the end of its log, as
# `dvc queue logs NAME` prints it (the failed stage's error, then DVC's line naming the stage).
queue_state --failed --since "$STARTED" >&2 || true

FAILED=0
[ ${#RUNS[@]} -eq 0 ] || echo "== gathering ${#RUNS[@]} experiment(s) into runs/$NAME ($(date -u +%H:%M:%S))"
[ ${#RUNS[@]} -eq 0 ] || python -m storyrewrite.report.gather --out "runs/$NAME" --names "${RUNS[@]}" || FAILED=1
FOLDERS=()
for folder in $(folders); do [ -f "$folder/.held" ] || FOLDERS+=("$folder"); done
if [ ${#HELD[@]} -gt 0 ]; then
  echo "== left out of reports/$NAME here: ${HELD[*]} (their scores are held elsewhere: offline/pack.sh HOLD)"
  [ ${#FOLDERS[@]} -gt 0 ] || exit $FAILED
fi
if [ ${#FOLDERS[@]} -eq 0 ]; then
  echo "error: nothing of $NAME ran here or was gathered before (runs/$NAME, runs/$NAME.*): no tables to collect" >&2
  exit 1
fi
echo "== collecting reports/$NAME from ${FOLDERS[*]} ($(date -u +%H:%M:%S))"
python -m storyrewrite.report.collect "${FOLDERS[@]}" --out "reports/$NAME" --title "$NAME (${*:-params.yaml})" || FAILED=1
echo "== collected ($(date -u +%H:%M:%S))"
# -n N: the runs left for a later command, said again at the end, where a poll's tail reads it.
[ ! -s "$KEPT/deferred" ] || echo "== $(cat "$KEPT/deferred")"
exit $FAILED
