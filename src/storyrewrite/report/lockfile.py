"""Let the queued experiments of a comparison restore what its first experiment built.

    python -m storyrewrite.report.lockfile adopt runs/grid/grid-nll-continued.json

A queued experiment starts from the workspace's dvc.lock. A stage whose command, deps and params
are those dvc.lock records counts as unchanged, and DVC restores it from the outputs that
dvc.lock names, never from its run cache (dvc/stage/cache.py, `StageCache.restore`, DVC 3.67).
Where those outputs were built on another machine (a fresh clone: the committed dvc.lock names
the outputs of the machine that committed it, and no DVC remote holds them), they are in no
cache here, so every queued experiment runs that stage again: the NLL model, the LLM baselines
and their scores, once per experiment, though the first experiment built them with the same
command, deps and params.

`adopt` puts the first experiment's entries for those stages (and only those: the same command,
deps and params, outputs that this machine's DVC cache lacks) into the workspace's dvc.lock, as
`dvc repro` here would have recorded them, so that the queued experiments restore them. DVC has
no command for this: `dvc repro` and `dvc commit` need the outputs in the workspace, and a
stage that DVC counts as unchanged is never looked up in the run cache. Where dvc.lock's outputs
are in the cache (after `dvc repro` on this machine) it changes nothing.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from storyrewrite.io import InputError, read_json, run_stage, write_text_atomic
from storyrewrite.report.gather import read_blob

SAME = ("cmd", "deps", "params")  # what makes DVC count a stage as unchanged


def stale_stages(workspace: dict, experiment: dict, uncached: set[str]) -> list[str]:
    """The stages of the workspace's lock (`workspace`, dvc.lock as a dict) whose outputs are not
    in the cache (`uncached`) and that the experiment's lock records with the same command, deps
    and params but other outputs: those a queued experiment would run again."""
    ours, theirs = workspace.get("stages") or {}, experiment.get("stages") or {}
    return [name for name, entry in ours.items()
            if name in uncached and name in theirs
            and all(entry.get(key) == theirs[name].get(key) for key in SAME)
            and entry.get("outs") != theirs[name].get("outs")]


def uncached_stages(root: Path) -> set[str]:
    """The stages whose outputs, as the workspace's dvc.lock names them, DVC's cache lacks."""
    from dvc.repo import Repo  # DVC's own check (Stage.outs_cached), with the lock's hashes

    with Repo(str(root)) as repo:
        pipeline = Path(repo.root_dir) / "dvc.yaml"  # dvc.lock's stages: those of the top dvc.yaml
        return {stage.name for stage in repo.index.stages
                if Path(stage.path) == pipeline and stage.outs and not stage.outs_cached()}


def adopt(root: Path, manifest_path: Path) -> list[str]:
    """Put the gathered experiment's (`manifest_path`, storyrewrite.report.gather) entries for
    the stale stages into `root`/dvc.lock; returns their names."""
    # DVC's YAML (ruamel, YAML 1.2) both to compare and to write: PyYAML reads `3e-05` as a
    # string, and a round trip keeps DVC's layout of the entries it does not replace.
    from dvc.utils.serialize import dumps_yaml, parse_yaml_for_update

    if not manifest_path.is_file():
        raise InputError(f"{manifest_path}: no such gathered run (python -m storyrewrite.report.gather --out "
                         f"{manifest_path.parent} --names {manifest_path.stem} writes it)")
    manifest = read_json(manifest_path)
    if "dvc.lock" not in manifest.get("files", {}):
        raise InputError(f"{manifest_path}: the gathered run has no dvc.lock")
    theirs = read_blob(manifest_path.parent, manifest["files"]["dvc.lock"]).decode("utf-8")
    lock_path = Path(root) / "dvc.lock"
    if not lock_path.exists():  # nothing committed or run here: every stage is looked up in the run cache
        return []
    lock = parse_yaml_for_update(lock_path.read_text(encoding="utf-8"), str(lock_path)) or {}
    experiment = parse_yaml_for_update(theirs, str(manifest_path)) or {}
    stale = stale_stages(lock, experiment, uncached_stages(root))
    if stale:
        for name in stale:
            lock["stages"][name] = experiment["stages"][name]
        write_text_atomic(lock_path, dumps_yaml(lock))
    return stale


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m storyrewrite.report.lockfile", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    adopt_parser = commands.add_parser("adopt", help="the stale entries of dvc.lock from a gathered experiment")
    adopt_parser.add_argument("manifest", type=Path, help="the experiment's manifest, runs/NAME/EXPERIMENT.json")
    adopt_parser.add_argument("--root", type=Path, default=Path("."), help="the repository (default: here)")
    args = parser.parse_args(argv)
    stale = adopt(args.root, args.manifest)
    name = args.manifest.stem
    if stale:
        print(f"dvc.lock named outputs of {', '.join(stale)} that this machine's DVC cache lacks (built elsewhere, as in a fresh "
              f"clone): it now names {name}'s, built here with the same commands, deps and params, so that the queued experiments "
              f"restore those stages rather than run each again")


if __name__ == "__main__":
    run_stage(main)
