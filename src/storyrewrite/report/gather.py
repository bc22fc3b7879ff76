"""Gather what DVC experiments produced into a plain folder that travels, to collect tables from.

    dvc exp run --queue -n lr -S 'train.lr=1e-5,3e-5' && dvc queue start   # named lr-1, lr-2
    python -m storyrewrite.report.gather --out runs/lr --names 'lr-*'
    python -m storyrewrite.report.collect runs/lr --out reports/lr

Of each experiment in `dvc exp show --json` that ran to the end, it reads through DVC's file
system, at the experiment's revision, the params, dvc.lock and every report its stages wrote
(GATHERED; models and predictions stay behind). Files are stored once by content
(`blobs/<sha256>.gz`: the NLL model's scores are the same in every run), and each run gets a
manifest `<name>.json` {path: sha256}. Experiments still queued or running, and failed ones,
are named, not gathered. `--plan` and `--dedupe` serve scripts/comparison.sh.
"""
from __future__ import annotations

import argparse
import fnmatch
import gzip
import hashlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from storyrewrite.io import InputError, read_json, write_bytes_atomic, write_json_atomic, write_text_atomic
from storyrewrite.data.schema import TASK_COLUMNS
from storyrewrite.objectives.registry import OBJECTIVES, reads_section
from storyrewrite.queue import dvc_root

# What a run's stages write that the tables need (models and predictions stay behind).
GATHERED = ("params.yaml", "dvc.lock", "reports/data_counts.json", "reports/metrics", "reports/sanity/metrics",
            "reports/sanity/scores", "reports/scores", "reports/significance.json", "reports/results.md",
            "reports/train", "reports/llm", "reports/stages")


PARTIAL = ".shared-"
# How far an experiment has gone: queued, running, then ended (None: ran to the end, or failed).
# DVC's `exp show` reads the queue, then the running experiments, then the finished ones, one after
# another (dvc.repo.experiments.collect.collect): one that moves on between two reads is listed
# twice, queued and running, or running and finished. The later state is the one that holds.
PROGRESS = {"queued": 0, "running": 1}


def listed(exp_show: list[dict]) -> list[dict]:
    """{name, rev, base, params, state} of every experiment in `dvc exp show --json` output (not the
    commits they derive from, nor the workspace: those did not run as experiments), once each, in
    its latest state (PROGRESS). The state is None for an experiment that ran to the end; DVC lists
    its queue's others too, each with the commit it was queued as (its params, none of its
    outputs): `queued`, `running` or `failed` (`executor.state`; a failed one's revision also
    carries DVC's `error`). The experiments of scripts/comparison.sh's shared stages
    (`NAME.shared-GROUP`) are no runs: their commits hold the workspace's reports of every other stage."""
    found: dict[tuple[str, str], dict] = {}  # (commit, name) -> the experiment in its latest state, where DVC listed it first
    for commit in exp_show:
        for experiment in commit.get("experiments") or []:
            state = (experiment.get("executor") or {}).get("state")
            for rev in experiment.get("revs", []):
                name = rev.get("name") or experiment.get("name") or rev["rev"][:7]
                if PARTIAL not in name:
                    params = ((rev.get("data") or {}).get("params") or {}).get("params.yaml", {}).get("data")
                    run = {"name": name, "rev": rev["rev"], "base": commit["rev"], "params": params, "state": (
                        state if state in ("queued", "running", "failed") else "failed" if rev.get("error") else None)}
                    before = found.get((commit["rev"], name))
                    if before is None or PROGRESS.get(run["state"], 2) >= PROGRESS.get(before["state"], 2):
                        found[commit["rev"], name] = run
    return list(found.values())


# Settings that change how fast a run goes, not what it computes (tests check that either value
# samples and trains the same): they tell no two runs apart, so a run gathered before one of them
# existed, or with another value of it, stands for the run with this one.
SPEED_ONLY = {"rl": ("cache", "early_stop")}
# Settings added after runs were gathered, each with the value that computes what those runs did:
# a run gathered without the key stands for a run with this value, and for no other.
# (the Trainer's settings of both training sections: absent from params.yaml, at their defaults, before)
_TRAINER_ADDED = {"num_nodes": 1, "accumulate_grad_batches": 1, "limit_val_batches": None}
ADDED_LATER = {"score": {"fp32_matmul": "ieee"}, "rl": {"sample_dtype": None},
               "train_nll": _TRAINER_ADDED, "train": _TRAINER_ADDED}


def with_added_later(params: dict) -> dict:
    """A run's params with ADDED_LATER's value for each such key its params.yaml lacks."""
    return {section: {**ADDED_LATER[section], **value} if section in ADDED_LATER and isinstance(value, dict) else value
            for section, value in params.items()}


def params_key(params: dict) -> str:
    """What tells two runs apart: their params, whatever the order of keys, without SPEED_ONLY's,
    with ADDED_LATER's value where a run has no such key, and without the sections it does not
    read (another objective's settings: registry.reads_section; a test checks the train stage's)."""
    kept = {}
    for section, value in with_added_later(params).items():
        if not reads_section(params.get("objective"), section):
            continue
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in SPEED_ONLY.get(section, ())}
        kept[section] = value
    return json.dumps(kept, sort_keys=True)


def named_by_params(runs: list[dict], states: tuple) -> dict[str, str]:
    """params_key -> the name of the first of `runs` (listed) with those params, of the runs in one
    of `states` (None: ran to the end)."""
    names: dict[str, str] = {}
    for run in runs:
        if run["state"] in states and run["params"] is not None:
            names.setdefault(params_key(run["params"]), run["name"])
    return names


def duplicates(exp_show: list[dict], gathered: list[dict], mine: set[str] | None = None
               ) -> tuple[list[str], list[str], list[str], list[str]]:
    """An experiment is its params. Of the queued experiments in `dvc exp show --json` output,
    those whose params.yaml equals that of one that ran to the end here or is running (a worker
    an interrupted comparison left), of one `gathered` before (params dicts), or of one queued
    before it, need not run. Returns (the queued to keep, the queued to remove, the finished or
    running ones here that stand in for removed ones, the kept ones that are none of `mine`'s: the
    names a comparison queued, None: all are). A kept one with the params of one of `mine` (left
    queued by an interrupted comparison) counts as `mine`."""
    runs = listed(exp_show)
    finished = named_by_params(runs, (None, "running"))
    seen = {params_key(params) for params in gathered}
    keep, remove, done = {}, [], []
    for run in runs:
        if run["state"] != "queued":
            continue
        key = params_key(run["params"])
        if key in finished:
            remove.append(run["name"])
            done.append(finished[key])
        elif key in seen:
            remove.append(run["name"])
        else:
            keep[run["name"]] = key
            seen.add(key)
    ours = {params_key(run["params"]) for run in runs if mine is None or run["name"] in mine}
    return ([name for name, key in keep.items() if key in ours], remove, sorted(set(done)),
            [name for name, key in keep.items() if key not in ours])


def sweep_runs(settings: list[str], params_file: Path) -> list[tuple[list[str], dict]]:
    """The runs of one `dvc exp run --queue -S ...` call (`settings`: its `key=value` words, a sweep
    where a value lists several), expanded as DVC expands them, each with its own words and the
    params.yaml DVC queues it with: DVC's own functions, on a copy of `params_file`."""
    import shutil
    import tempfile

    from dvc.exceptions import DvcException
    from dvc.utils.cli_parse import to_path_overrides
    from dvc.utils.hydra import apply_overrides, get_hydra_sweeps
    from dvc.utils.serialize import parse_yaml

    runs = []
    try:
        with tempfile.TemporaryDirectory() as folder:
            copy = Path(folder) / "params.yaml"
            for point in get_hydra_sweeps(to_path_overrides(settings)):
                words = [override if path == "params.yaml" else f"{path}:{override}" for path, overrides in point.items()
                         for override in overrides]
                shutil.copyfile(params_file, copy)  # (each run from the file as it is: DVC changes the copy in place)
                apply_overrides(copy, point.get("params.yaml", []))
                runs.append((words, parse_yaml(copy.read_text(encoding="utf-8"), "params.yaml")))
    except DvcException as error:  # (DVC's message; the cause names the setting, e.g. a key params.yaml lacks)
        cause = f": {error.__cause__}" if error.__cause__ else ""
        raise InputError(f"-S {' -S '.join(settings)}: {error}{cause}") from error
    return runs


def unserved(params: dict) -> str | None:
    """The objective of a run's params, as a plan names it, where the run's task lacks what it
    needs (DTO-Delta, CPO, RLOO on the delta reward on ART: the original ending); else None."""
    objective, task = OBJECTIVES.get(params.get("objective")), params.get("task")
    if objective is None or task not in TASK_COLUMNS:
        return None  # refused by the train stage, naming the valid values
    variant = (params.get(objective.settings) or {}).get(objective.variant) if objective.variant else None
    if objective.serves(task, variant):
        return None
    named = f"{objective.name} ({objective.settings}.{objective.variant}={variant})" if variant else objective.name
    return f"{named} on {task}"


class Plan(NamedTuple):
    """What `plan` queues, and what it leaves out."""
    calls: list[list[str]]  # the words of each `dvc exp run --queue` call to make
    stand_ins: list[str]  # the experiments here that stand in for runs left out
    left_out: int  # runs left out as run (or queued) before
    refused: list[str]  # the objective of each run left out for its task
    queued: int  # runs the calls queue
    deferred: int = 0  # runs left for a later plan by its limit


def plan(sweeps: list[list[str]], params_file: Path, exp_show: list[dict], gathered: list[dict],
         limit: int | None = None) -> Plan:
    """What to queue of `sweeps` (each the `key=value` words of one `dvc exp run --queue` call),
    leaving out each run whose params equal those of one gathered before (params dicts), of one
    here that finished, runs or is queued (`dvc exp show --json` output), or of one planned before
    it, and each run whose task lacks what its objective needs (`unserved`: a comparison on ART
    runs what ART can). Returns the words of each call to make: a sweep as given where it leaves
    nothing out, else each of its runs to queue on its own; the names of the experiments here that
    stand in for runs left out; how many runs it left out as run before; the objectives of
    those left out for their task, one a run; how many runs the calls queue; and how many
    `limit` left for a later plan: it queues at most that many runs, the first in the sweeps'
    order (a machine whose time is short lands some runs whole, not all of them half-run; the
    same plan made again once they are gathered queues the rest).

    scripts/comparison.sh queues the sweeps while queue workers run, and a worker takes a queued
    experiment at once: a duplicate has to be left out before it is queued, not removed after."""
    here = named_by_params(listed(exp_show), (None, "running", "queued"))
    seen = {params_key(params) for params in gathered}
    later: set[str] = set()  # the params of the runs the limit left for later
    calls, stand_ins, left_out, refused, queued, deferred = [], [], 0, [], 0, 0
    for settings in sweeps:
        runs, kept = sweep_runs(settings, params_file), []
        for words, params in runs:
            key = params_key(params)
            if (objective := unserved(params)) is not None:
                refused.append(objective)
            elif key in here:
                stand_ins.append(here[key])
                left_out += 1
            elif key in later:  # (a later plan queues it once, as it leaves the repeat out)
                deferred += 1
            elif key in seen:
                left_out += 1
            elif limit is not None and queued + len(kept) >= limit:
                later.add(key)
                deferred += 1
            else:
                kept.append(words)
                seen.add(key)
        calls += [settings] if len(kept) == len(runs) else kept
        queued += len(kept)
    return Plan(calls, sorted(set(stand_ins)), left_out, refused, queued, deferred)


def sweep_settings(line: str, where: str) -> list[str]:
    """The `key=value` words of a line of `-S key=value` pairs."""
    words = line.split()
    if not words or len(words) % 2 or any(flag != "-S" for flag in words[::2]) or any("=" not in w for w in words[1::2]):
        raise InputError(f"{where}: not a line of `-S key=value` pairs: {line.strip()!r}")
    return words[1::2]


def gathered_before(out: Path, run: dict) -> bool:
    """Whether `out` holds the manifest of this run at this revision, with each of its files. A
    run's revision never changes and its manifest is written after its files: such a run is
    gathered already (by a poller while the others ran: scripts/comparison.sh, offline/job.sh)."""
    path = Path(out) / f"{run['name']}.json"
    if not path.exists():
        return False
    manifest = read_json(path)
    return manifest.get("rev") == run["rev"] and all(
        (Path(out) / "blobs" / f"{digest}.gz").exists() for digest in (manifest.get("files") or {}).values())


def store_blob(data: bytes, blobs: Path) -> str:
    digest = hashlib.sha256(data).hexdigest()
    path = blobs / f"{digest}.gz"
    if not path.exists():
        # mtime=0: the same content gives the same bytes, whoever gathers it.
        write_bytes_atomic(path, gzip.compress(data, mtime=0))
    return digest


def gather_run(fs, run: dict, out: Path) -> dict:
    """Store one run's files (read through `fs`, a file system at the run's revision) and write
    its manifest; returns the manifest."""
    files = {}
    for top in GATHERED:
        if not fs.exists(top):
            continue
        paths = fs.find(top, detail=False) if fs.isdir(top) else [top]
        for path in sorted(paths):
            if Path(path).name == ".gitignore":
                continue
            try:
                data = fs.read_bytes(path)
            except FileNotFoundError as error:  # a cached output whose file this machine's DVC cache lacks
                raise InputError(f"experiment {run['name']} ({run['rev'][:7]}): {path} is not in this repository's DVC "
                                 f"cache; gather where the experiment ran, or fetch it first (`dvc exp pull "
                                 f"<git remote> {run['name']}`)") from error
            files[path] = store_blob(data, out / "blobs")
    if "params.yaml" not in files:
        raise InputError(f"experiment {run['name']} ({run['rev'][:7]}): no params.yaml at its revision")
    # In a git repository made of a copy of the tree (a GPU machine's: offline/job.sh compare)
    # `base` is that copy's commit; STORYREWRITE_COMMIT names the project's (bench/commit_name.py).
    source = {"source_commit": os.environ["STORYREWRITE_COMMIT"]} if os.environ.get("STORYREWRITE_COMMIT") else {}
    manifest = {key: run[key] for key in ("name", "rev", "base")} | source | {
        "gathered_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "files": files}
    write_json_atomic(out / f"{run['name']}.json", manifest)
    return manifest


def read_blob(root: Path, digest: str) -> bytes:
    path = root / "blobs" / f"{digest}.gz"
    if not path.exists():
        if (held := root / ".held").exists():  # offline/pack.sh HOLD
            hold = held.read_text().strip()
            raise InputError(f"{path}: offline/pack.sh moved it to {hold}; move it back first: "
                             f"HOLD={hold} bash offline/pack.sh restore")
        raise InputError(f"{path}: missing (the gathered folder {root} is incomplete)")
    data = gzip.decompress(path.read_bytes())
    if hashlib.sha256(data).hexdigest() != digest:
        raise InputError(f"{path}: content does not match its name (a damaged copy)")
    return data


def manifests(root: Path) -> list[dict]:
    """The manifests of a gathered folder, sorted by run name."""
    found = {path: read_json(path) for path in sorted(Path(root).glob("*.json"))}
    if not found:
        raise InputError(f"{root}: no gathered runs (run `python -m storyrewrite.report.gather --out {root}` first)")
    if bad := [path for path, manifest in found.items() if not {"name", "rev", "files"} <= set(manifest)]:
        raise InputError(f"{bad[0]}: not a run manifest (needs name, rev, files)")
    return list(found.values())


def gathered_params(folders: list[Path]) -> list[dict]:
    """The params of every run gathered into `folders` (those that exist)."""
    from dvc.utils.serialize import parse_yaml  # DVC's reading of params.yaml (YAML 1.2), as in `exp show`

    return [parse_yaml(read_blob(folder, manifest["files"]["params.yaml"]).decode(), "params.yaml")
            for folder in folders if folder.is_dir() for manifest in manifests(folder)]


# How long one `dvc exp show` may take before it is taken for hung and asked again. It can hang for
# ever: reading a running experiment's metrics from the git repository of its temporary workspace
# while the queue worker removes that workspace, pygit2's BlobIO (1.21) waits on a reader event that
# its writer thread, failed, never sets (seen in a poll of offline/job.sh: a process at 0 % CPU in
# _BlobIO.readinto for 14 min). Its usual time is seconds (1.9 s with 12 experiments on 2 cores).
EXP_SHOW_TIMEOUT_S = 60.0


def exp_show_output(command: list[str], attempts: int = 5, wait_s: float = 3.0, timeout_s: float = EXP_SHOW_TIMEOUT_S) -> str:
    """The output of `dvc exp show --json`, asked again after a failure or after `timeout_s` seconds
    without an answer. While a queue worker sets up or removes its temporary workspace, `dvc exp
    show` can fail for a moment ("failed to show experiments - directory '.dvc/tmp/exps/tmp…/.dvc'
    does not exist"), or hang (EXP_SHOW_TIMEOUT_S); DVC itself does not retry."""
    for attempt in range(1, attempts + 1):
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:  # (the hung process is killed)
            reason = f"no answer in {timeout_s:g} s"
        else:
            if result.returncode == 0:
                return result.stdout
            reason = (result.stderr.strip().splitlines() or ["no message"])[-1]
        if attempt < attempts:
            time.sleep(wait_s)
    raise InputError(f"`{' '.join(command[1:])}` failed {attempts} times, {wait_s:g} s apart: {reason}")


def leave_queue(names: list[str]) -> list[str]:
    """Takes the experiments `names` out of DVC's queue; returns those it could not take out: a
    worker took them meanwhile (they run). DVC removes none of the names it is given where it cannot
    remove one of them (celery_remove), so after a failure each is tried on its own."""
    command = [sys.executable, "-m", "dvc", "queue", "remove"]
    if subprocess.run([*command, *names], capture_output=True).returncode == 0:
        return []
    return [name for name in names if subprocess.run([*command, name], capture_output=True).returncode != 0]


def _at_least_one(value: str) -> int:
    """A whole number >= 1 (argparse's type for --limit)."""
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {value!r}")
    return int(value)


def main(argv: list[str] | None = None) -> None:
    from dvc.api import DVCFileSystem

    parser = argparse.ArgumentParser(prog="python -m storyrewrite.report.gather", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="folder of the gathered runs (added to, run by run)")
    parser.add_argument("--names", nargs="+", default=["*"], help="shell patterns of the experiment names to gather (default: all)")
    parser.add_argument("--finished", action="store_true",
                        help="gather whatever has finished, quietly (a poller's: none is no error, nor one still queued)")
    parser.add_argument("--dedupe", type=Path, nargs="*", metavar="FOLDER",
                        help="instead of gathering: remove from DVC's queue each experiment whose params equal those of one "
                             "that finished here, was gathered into a FOLDER, or was queued before it; print the names of the "
                             "queued experiments kept and of the finished ones that stand in for removed ones")
    parser.add_argument("--mine", type=Path, help="with --dedupe: a file of the names of the experiments the caller "
                        "queued; of the others still queued, only those with the params of one of these are printed")
    parser.add_argument("--plan", type=Path, nargs="*", metavar="FOLDER",
                        help="instead of gathering: read sweeps from stdin, a line of `-S key=value` pairs each (the "
                             "arguments of one `dvc exp run --queue`), and print the calls to make, one a line: a sweep as "
                             "it is, or each of its runs on its own where some have the params of one gathered into a "
                             "FOLDER, of one here (finished, running or queued), or of one planned before")
    parser.add_argument("--stand-ins", type=Path, help="with --plan: write here the names of the experiments here that "
                        "stand in for runs left out")
    parser.add_argument("--refused", type=Path, help="with --plan: write here, a line each, the runs left out because "
                                                     "their task lacks what their objective needs")
    parser.add_argument("--runs", type=Path, help="with --plan: write here how many experiments the queue's workers "
                        "will run: the runs the calls queue, and the experiments here, queued or running, that stand in "
                        "for runs left out (scripts/comparison.sh's `-j auto` counts its workers by it)")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"), help="with --plan: the params file the "
                        "sweeps change (default: params.yaml)")
    parser.add_argument("--limit", type=_at_least_one, metavar="N", help="with --plan: queue at most N runs, the first "
                        "in the sweeps' order; the same plan made again once they ran queues the rest")
    parser.add_argument("--deferred", type=Path, help="with --plan: write here the line saying how many runs --limit "
                        "left for a later command (empty: none)")
    parser.add_argument("--rev", help="the experiments derived from this commit (default: HEAD)")
    parser.add_argument("--json", type=Path, help="saved `dvc exp show --json` output (default: run it)")
    args = parser.parse_args(argv)
    if args.json:
        exp_show = read_json(args.json)
    else:
        # (outside a repository `dvc exp show` fails every time: said at once, not after its retries)
        dvc_root(Path.cwd(), "`dvc exp show` lists the experiments")
        if args.rev and subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{args.rev}^{{commit}}"],
                                       capture_output=True).returncode != 0:  # (DVC's refusal would be asked again)
            raise InputError(f"--rev {args.rev}: not a commit of this repository")
        # DVC as a module of this interpreter: also where it has no `dvc` command on PATH (the GPU machine).
        command = [sys.executable, "-m", "dvc", "exp", "show", "--json"] + (["--rev", args.rev] if args.rev else [])
        exp_show = json.loads(exp_show_output(command))
    if args.plan is not None:
        sweeps = [sweep_settings(line, f"stdin, line {number}") for number, line in enumerate(sys.stdin, 1) if line.strip()]
        if not args.params.is_file():
            raise InputError(f"--params {args.params}: no such file")
        calls, stand_ins, left_out, refused, queued, deferred = plan(sweeps, args.params, exp_show,
                                                                     gathered_params(args.plan), args.limit)
        if args.runs is not None:
            states = {run["name"]: run["state"] for run in listed(exp_show)}
            waiting = sum(states.get(name) in ("queued", "running") for name in stand_ins)
            write_text_atomic(args.runs, f"{queued + waiting}\n")
        if args.stand_ins is not None:
            write_text_atomic(args.stand_ins, "".join(f"{name}\n" for name in stand_ins))
        if left_out:
            print(f"{left_out} run(s) of these sweeps have the params of one that ran or is queued: not queued"
                  + (f" (here: {', '.join(stand_ins)})" if stand_ins else ""), file=sys.stderr)
        if args.refused is not None:
            write_text_atomic(args.refused, "".join(f"{label}\n" for label in refused))
        if refused:
            named = ", ".join(f"{label} ×{n}" if n > 1 else label for label, n in Counter(refused).items())
            print(f"{len(refused)} run(s) of these sweeps need the original ending, which their task does not have: "
                  f"not queued ({named})", file=sys.stderr)
        later = (f"{deferred} run(s) of these sweeps left for a later command (at most {args.limit} queued): the same "
                 "command queues them once these ran") if deferred else ""
        if args.deferred is not None:
            write_text_atomic(args.deferred, later + "\n" if later else "")
        if later:
            print(later, file=sys.stderr)
        for call in calls:
            print(" ".join(f"-S {word}" for word in call))
        return
    if args.dedupe is not None:
        gathered = gathered_params(args.dedupe)
        if args.mine is not None and not args.mine.is_file():
            raise InputError(f"--mine {args.mine}: no such file")
        # (An empty file: DVC printed no names, as another version of it might; every queued one counts.)
        mine = (set(args.mine.read_text(encoding="utf-8").split()) or None) if args.mine else None
        keep, remove, done, others = duplicates(exp_show, gathered, mine)
        if remove:
            started = leave_queue(remove)
            print(f"{len(remove) - len(started)} queued experiment(s) have the params of one that ran before: removed "
                  "from the queue", file=sys.stderr)
            if started:  # (not gathered: the run each stands for is, as for the others removed)
                print(f"{len(started)} of them left the queue for a worker first and run all the same: {', '.join(started)}",
                      file=sys.stderr)
        if others:
            print(f"{len(others)} experiment(s) queued before, not of these sweeps, run beside them and are not gathered with "
                  f"them: {', '.join(others)} (`dvc queue remove NAME` takes one out)", file=sys.stderr)
        print("\n".join(keep + done))
        return
    if args.out is None:
        parser.error("--out is required (or --dedupe)")
    everything = listed(exp_show)
    runs = [run for run in everything if any(fnmatch.fnmatchcase(run["name"], pattern) for pattern in args.names)]
    if not runs and not args.finished:
        names = ", ".join(run["name"] for run in everything) or "none"
        raise InputError(f"--names {' '.join(args.names)!r} matches no experiment; experiments: {names}")
    for run in runs:
        if run["state"] is None:
            if gathered_before(args.out, run):
                if not args.finished:
                    print(f"{run['name']} ({run['rev'][:7]}): gathered before")
                continue
            manifest = gather_run(DVCFileSystem(".", rev=run["rev"]), run, args.out)
            print(f"{run['name']} ({run['rev'][:7]}): {len(manifest['files'])} files")
    left = [f"{run['name']} ({run['state']})" for run in runs if run["state"]]
    if left and not args.finished:
        raise InputError(f"{len(left)} experiment(s) did not finish, not gathered: {', '.join(left)} "
                         f"(`dvc queue status`; `dvc queue logs NAME` says why one failed)")


if __name__ == "__main__":
    from storyrewrite.io import run_cli

    run_cli(main)
