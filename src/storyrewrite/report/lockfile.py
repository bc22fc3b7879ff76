"""Let a comparison's experiments restore from DVC's run cache what another of them built.

    python -m storyrewrite.report.lockfile forget

A queued experiment starts from the workspace's dvc.lock. A stage whose command, deps and params
are those dvc.lock records counts as unchanged, and DVC restores it from the outputs that
dvc.lock names, never from its run cache (dvc/stage/cache.py, `StageCache.restore`, DVC 3.67).
Where those outputs were built on another machine (a fresh clone: the committed dvc.lock names
the outputs of the machine that committed it, and no DVC remote holds them), they are in no
cache here, so every experiment would run that stage again, though another experiment of the
comparison built it with the same command, deps and params.

`forget` drops those entries (the stages whose outputs, as dvc.lock names them, this machine's
cache lacks) from the workspace's dvc.lock. DVC then looks each such stage up in its run cache,
as it does for a stage it has never run, and restores what any experiment built here. Where
dvc.lock's outputs are in the cache (after `dvc repro` on this machine) it changes nothing. DVC
has no command for this: a stage it counts as unchanged is never looked up in the run cache.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from storyrewrite.io import run_cli, write_text_atomic


def uncached_stages(root: Path) -> set[str]:
    """The stages whose outputs, as the workspace's dvc.lock names them, DVC's cache lacks."""
    from dvc.repo import Repo  # DVC's own check (Stage.outs_cached), with the lock's hashes

    with Repo(str(root)) as repo:
        pipeline = Path(repo.root_dir) / "dvc.yaml"  # dvc.lock's stages: those of the top dvc.yaml
        return {stage.name for stage in repo.index.stages
                if Path(stage.path) == pipeline and stage.outs and not stage.outs_cached()}


def forget(root: Path) -> list[str]:
    """Drop from `root`/dvc.lock the entries of the stages whose outputs the cache lacks; returns
    their names."""
    # DVC's YAML (ruamel, YAML 1.2) to read and write: a round trip keeps DVC's layout of the
    # entries it does not drop, and PyYAML would read `3e-05` as a string.
    from dvc.utils.serialize import dumps_yaml, parse_yaml_for_update

    lock_path = Path(root) / "dvc.lock"
    if not lock_path.exists():  # nothing committed or run here: every stage is looked up in the run cache
        return []
    lock = parse_yaml_for_update(lock_path.read_text(encoding="utf-8"), str(lock_path)) or {}
    stages = lock.get("stages") or {}
    uncached = uncached_stages(Path(root))  # (DVC's index of every stage: built once)
    gone = [name for name in list(stages) if name in uncached]
    for name in gone:
        del stages[name]
    if gone:
        write_text_atomic(lock_path, dumps_yaml(lock))
    return gone


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m storyrewrite.report.lockfile", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    forget_parser = commands.add_parser("forget", help="drop the entries of dvc.lock whose outputs this machine's cache lacks")
    forget_parser.add_argument("--root", type=Path, default=Path("."), help="the repository (default: here)")
    args = parser.parse_args(argv)
    gone = forget(args.root)
    if gone:
        print(f"dvc.lock named outputs of {len(gone)} stage(s) that this machine's DVC cache lacks (built elsewhere, as in a "
              f"fresh clone): their entries are dropped, so that DVC restores them from its run cache once an experiment "
              f"here has built them ({', '.join(gone)})")


if __name__ == "__main__":
    run_cli(main)
