#!/usr/bin/env bash
# Here, in this repository: what offline/job.sh's polls brought back from a comparison.
#   bash offline/unpack.sh NAME RESULTS.tar.gz [EXPS.bundle]   (each file, or its parts: FILE.part_00, ...)
# The tar's runs/NAME becomes runs/NAME.<n>, the next free n: a later machine given that folder
# skips the runs it holds, and `bash scripts/comparison.sh NAME ...` collects them. Its
# reports/bench/ lands as it is; bench-out/, the records and curves of experiments that had not
# finished, and the logs of those and of those that failed (run/<rev>/<rev>.out) go to bench-out/NAME.<n>/
# (ignored by git). The bundle's experiments, DVC's git refs,
# are fetched. Each derives from a commit the machine made of a copy of the tree: where that tree
# is the one of the commit the runs name (their `source_commit`), the experiment is filed under
# that commit, as if it had run here, so `dvc exp show` lists it there. `dvc metrics diff A B`
# compares any two. They are kept in runs/NAME.<n>/exps.bundle without the objects of that commit;
# a clone fetches them with
#   git fetch runs/NAME.<n>/exps.bundle 'refs/exps/*:refs/exps/*'
# Results whose runs a runs/NAME.<n> already holds, file for file, are not unpacked again
# (only their bundle's experiments, where that folder has none).
set -euo pipefail
[ $# -ge 2 ] && [ $# -le 3 ] || { echo "usage: bash offline/unpack.sh NAME RESULTS.tar.gz [EXPS.bundle]" >&2; exit 2; }
NAME=$1 RESULTS=$2 BUNDLE=${3:-}
STAGING=$(mktemp -d) JOINED=$(mktemp -d)
trap 'rm -rf "$STAGING" "$JOINED"' EXIT
joined() {  # joined FILE: FILE, or FILE.part_00, FILE.part_01, ... (job.sh poll's OUT_FILE_MIB)
  # into a temporary folder, and checked against the sha256 that parts.sha256 beside them holds
  local file=$1 sums
  if [ -f "$file" ]; then echo "$file"; return; fi
  if ! compgen -G "$file.part_*" > /dev/null; then echo "error: $file not found (nor $file.part_*)" >&2; return 2; fi
  sums=$(dirname "$file")/parts.sha256
  cat "$file".part_* > "$JOINED/${file##*/}"
  if ! grep -qx "$(sha256sum < "$JOINED/${file##*/}" | cut -d' ' -f1)  ${file##*/}" "$sums" 2>/dev/null; then
    echo "error: $file.part_* joined do not match the sha256 of ${file##*/} in $sums (a part missing, or from another poll?)" >&2
    return 1
  fi
  echo "$JOINED/${file##*/}"
}
RESULTS=$(joined "$RESULTS") || exit $?
if [ -n "$BUNDLE" ]; then
  BUNDLE=$(joined "$BUNDLE") || exit $?
  verified=$(git bundle verify -q "$BUNDLE" 2>&1) || { echo "error: $BUNDLE: $verified" >&2; exit 1; }
fi
n=1
while [ -e "runs/$NAME.$n" ]; do n=$((n + 1)); done
INTO=runs/$NAME.$n
tar xzf "$RESULTS" -C "$STAGING"
[ -d "$STAGING/runs/$NAME" ] || { echo "error: $RESULTS holds no runs/$NAME (NAME is the comparison's)" >&2; exit 2; }
# The same results unpacked again make no second folder of the same runs (a pack would carry
# both to the next machine); the exps.bundle this script writes is not compared.
for earlier in runs/"$NAME".*; do
  if [ -d "$earlier" ] && diff -rq -x exps.bundle "$STAGING/runs/$NAME" "$earlier" > /dev/null 2>&1; then
    if [ -z "$BUNDLE" ] || [ -f "$earlier/exps.bundle" ]; then
      echo "$earlier already holds these runs: nothing unpacked"; exit 0
    fi
    INTO=$earlier  # unpacked before without the bundle: its experiments are fetched into that folder
  fi
done
refs=()
if [ -n "$BUNDLE" ]; then
  trap 'rm -rf "$STAGING" "$JOINED"; git for-each-ref --format="delete %(refname)" refs/unpacked | git update-ref --stdin' EXIT
  git fetch -q "$BUNDLE" 'refs/exps/*:refs/unpacked/*'
  source=$(python3 -c 'import glob, json, sys
print(next((json.load(open(p)).get("source_commit") or "" for p in sorted(glob.glob(sys.argv[1] + "/*.json"))), ""))' \
    "$STAGING/runs/$NAME")
  source=$(git rev-parse -q --verify "${source:-none}^{commit}" || true)  # none where this repository lacks it
  for ref in $(git for-each-ref --format='%(refname)' refs/unpacked); do
    commit=$(git rev-parse "$ref") target=refs/exps/${ref#refs/unpacked/}
    if [ -n "$source" ] && [ "$(git rev-parse "$commit^^{tree}")" = "$(git rev-parse "$source^{tree}")" ]; then
      # The same commit on $source in place of its copy (author, committer and dates kept).
      IFS=$'\n' read -r -d '' aname amail adate cname cmail cdate \
        < <(git log -1 --format='%an%n%ae%n%aI%n%cn%n%ce%n%cI' "$commit"; printf '\0')
      commit=$(git log -1 --format=%B "$commit" | GIT_AUTHOR_NAME=$aname GIT_AUTHOR_EMAIL=$amail GIT_AUTHOR_DATE=$adate \
        GIT_COMMITTER_NAME=$cname GIT_COMMITTER_EMAIL=$cmail GIT_COMMITTER_DATE=$cdate git commit-tree "$commit^{tree}" -p "$source")
      target=refs/exps/${source:0:2}/${source:2}/${ref##*/}
    fi
    existing=$(git rev-parse -q --verify "$target" || true)
    [ -z "$existing" ] || [ "$existing" = "$commit" ] || { echo "error: $target exists with another commit" >&2; exit 1; }
    git update-ref "$target" "$commit"
    refs+=("$target")
  done
  git bundle create -q "$STAGING/runs/$NAME/exps.bundle" "${refs[@]}" --not "${source:-HEAD}"
fi
if [ "$INTO" != "runs/$NAME.$n" ]; then
  cp "$STAGING/runs/$NAME/exps.bundle" "$INTO/"
  echo "$INTO: the same runs, unpacked before; ${#refs[@]} experiment(s) fetched (dvc metrics diff A B)"; exit 0
fi
mkdir -p runs "bench-out/$NAME.$n"
mv "$STAGING/runs/$NAME" "$INTO"
[ ! -d "$STAGING/reports/bench" ] || { mkdir -p reports/bench && cp -r "$STAGING/reports/bench/." reports/bench/; }
for folder in bench-out .dvc/tmp/exps; do [ ! -d "$STAGING/$folder" ] || cp -r "$STAGING/$folder/." "bench-out/$NAME.$n/"; done
echo "$INTO: $(find "$INTO" -maxdepth 1 -name '*.json' | wc -l) run(s), ${#refs[@]} experiment(s) fetched (dvc metrics diff A B)"
