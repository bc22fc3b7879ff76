#!/usr/bin/env bash
# The whole comparison of a profile as DVC experiments, run one after the other, gathered and
# collected into reports/<name>/ (results, objectives with p-values, every run, stage devices and
# wall times, per-run metrics, curves and params):
#
#   bash scripts/comparison.sh gpu all params/gpu.yaml     # on a GPU machine: reports/gpu/
#   bash scripts/comparison.sh grid all                    # the default profile (CPU): reports/grid/
#
# Arguments: NAME (experiment prefix, runs/NAME/ and reports/NAME/), PART, then the params
# profiles to overlay (none: params.yaml as it is). PART splits the work for machines lent for a
# short time: `core` = NLL, NLL continued, DTO-Score, -Delta, -Score+Delta, the LLM modes and the
# copy baselines; `cpo` = the CPO grid (4 betas x 3 lambdas); `all` = both. Each experiment runs
# with `dvc exp run --temp` (the workspace and params.yaml stay as they are); stages whose deps and
# params are unchanged (the NLL model, the LLM baselines) come from DVC's run cache, so they run
# once. Each finished experiment is gathered into runs/NAME/ at once, so that folder holds what
# ran even if the machine goes away before the end. An experiment that already exists is skipped:
# after an interruption, the same command goes on where it stopped. An experiment that fails (a
# diverging CPO setting, say) does not stop the others: the script gathers and collects what ran,
# names the failures and exits 1. A folder gathered on another machine (one part there, the other
# here), put beside this one as runs/NAME.<anything>, is collected together with it.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: bash scripts/comparison.sh NAME core|cpo|all [PROFILE.yaml ...]" >&2
  exit 2
fi
NAME=$1 PART=$2
shift 2
case $PART in core | cpo | all) ;; *)
  echo "error: PART must be core, cpo or all, got '$PART'" >&2
  exit 2
  ;;
esac
# Where DVC is importable but its command is not on PATH (the GPU machine's `pip install --target`,
# see ../shared/gpu/README.md), run it as a module.
command -v dvc >/dev/null 2>&1 || dvc() { python -m dvc "$@"; }
OVERRIDES=()
if [ $# -gt 0 ]; then
  # shellcheck disable=SC2207  # the overrides are -S key=value words without spaces
  OVERRIDES=($(python -m storyrewrite.params overrides "$@"))
fi
EXISTING=" $(dvc exp list --name-only 2>/dev/null | tr '\n' ' ') "

FAILED=()
run() {  # run NAME-SUFFIX with the profile's overrides and the given ones, unless it exists
  local experiment="$NAME-$1"
  shift
  if [[ $EXISTING == *" $experiment "* ]]; then
    echo "== $experiment: exists, skipped"
    return
  fi
  echo "== $experiment: $* ($(date -u +%H:%M:%S))"
  if dvc exp run --temp -n "$experiment" "${OVERRIDES[@]}" "$@"; then
    # Gathered at once: runs/NAME holds every finished experiment even if the machine goes away
    # before the end (bring it home with a tar at any time).
    python -m storyrewrite.report.gather --out "runs/$NAME" --names "$experiment" || FAILED+=("$experiment (gather)")
  else
    FAILED+=("$experiment")
  fi
}

if [ "$PART" != cpo ]; then
  run nll-continued -S objective=nll
  for objective in score delta score_delta; do
    run "dto-${objective//_/-}" -S objective=$objective
  done
fi
if [ "$PART" != core ]; then
  for beta in 0.1 0.5 1 2; do
    for lambda in 0.5 1 2; do
      run "cpo-b$beta-l$lambda" -S objective=cpo -S cpo.beta=$beta -S cpo.lambda=$lambda
    done
  done
fi

python -m storyrewrite.report.gather --out "runs/$NAME" --names "$NAME-*"
shopt -s nullglob
python -m storyrewrite.report.collect "runs/$NAME" "runs/$NAME".* --out "reports/$NAME" --title "$NAME (${*:-params.yaml})"
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "error: ${#FAILED[@]} experiment(s) failed (see their output above): ${FAILED[*]}" >&2
  exit 1
fi
