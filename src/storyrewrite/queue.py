"""DVC's experiment queue as scripts/comparison.sh polls it:

    python -m storyrewrite.queue             # each experiment task: revision, name, status
    python -m storyrewrite.queue --workers   # then a blank line and `Worker status: A active, I idle`

The lines are those of `dvc queue status` (the time column left out). Our own, as DVC's command
always asks the workers: a celery broadcast through kombu's file broker, whose workers can read a
message mid-write and then stop (celery/kombu#1551, treeverse/dvc#10428). Without `--workers` the
statuses come from the broker's queue and the result backend, as DVC's do, with no message to the
workers and no wait for their answers. Each worker's own monitor (dvc-task's TemporaryWorker)
still asks three questions every 10 s; a poll no longer adds one. Not a stage's code: changing
this module reruns no stage.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from storyrewrite.io import InputError


def status(repo: Path, ask_workers: bool = False) -> list[str]:
    """A line per experiment task of the DVC repository at `repo` (its revision, name and status:
    Queued, Running, Success or Failed), then, with `ask_workers`, a blank line and the workers'."""
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    try:
        dvc_repo = Repo(str(repo))
    except NotDvcRepoError:
        raise InputError(f"{repo}: not in a DVC repository (`dvc init` makes one); run this where `dvc queue status` runs") from None
    with dvc_repo:
        queue = dvc_repo.experiments.celery_queue
        lines = [f"{task['rev'][:7]}  {task.get('name') or '-'}  {task['status']}" for task in queue.status()]
        if ask_workers:
            answers = queue.worker_status()
            active = sum(1 for tasks in answers.values() if tasks)
            lines += ["", f"Worker status: {active} active, {len(answers) - active} idle"]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m storyrewrite.queue", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", action="store_true", help="ask the workers too (a broadcast), as `dvc queue status` does")
    args = parser.parse_args(argv)
    print("\n".join(status(Path.cwd(), args.workers)))


if __name__ == "__main__":
    from storyrewrite.io import run_cli

    run_cli(main)
