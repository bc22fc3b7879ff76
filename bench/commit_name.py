"""The commit that benchmark figures name: HEAD's short name, `+changes` where the tracked files
other than reports/ (outputs, the bench figures among them) differ from it. STORYREWRITE_COMMIT,
where set, names it instead: a copy of the tree that is not a checkout (sent to a GPU machine
without its .git) cannot say which commit it is.

    python bench/commit_name.py   # the commit of the checkout in the current folder

Standard library only: offline/pack.sh runs it to write .device/commit, before the project's
environment exists on the machine that will run the benches (bench/common.py imports torch).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path


def commit_name(directory: str | Path = ".") -> str:
    """The name of the commit checked out in `directory`; empty outside a git checkout."""
    if os.environ.get("STORYREWRITE_COMMIT"):
        return os.environ["STORYREWRITE_COMMIT"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=directory, capture_output=True, text=True).stdout.strip()
    if not commit:
        return ""
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!reports"], cwd=directory,
                           capture_output=True, text=True).stdout.strip()
    return commit + ("+changes" if dirty else "")


if __name__ == "__main__":
    print(commit_name())
