"""storyrewrite.queue, the comparison's poll of DVC's queue, against DVC's own `dvc queue status`
on a real queue and a real worker."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.mark.slow
def test_the_queue_is_dvc_queue_status_without_asking_the_workers(tmp_path):
    """`python -m storyrewrite.queue` against DVC's own `dvc queue status` on a real queue:
    two experiments queued, then run by one worker. The same revisions, names and statuses, and with
    --workers the same worker line."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}

    def run(*args: str) -> str:
        result = subprocess.run(list(args), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def ours(*flags: str) -> list[list[str]]:
        return [line.split() for line in run(sys.executable, "-m", "storyrewrite.queue", *flags).splitlines()]

    def dvcs() -> list[list[str]]:  # Task, Name, Created (a time of two words), Status; a blank line; the workers
        lines = run("dvc", "queue", "status").splitlines()[1:]
        return [fields if not fields or fields[0] == "Worker" else [*fields[:2], fields[-1]] for fields in map(str.split, lines)]

    outside = subprocess.run([sys.executable, "-m", "storyrewrite.queue"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert outside.returncode == 2 and outside.stderr == (f"error: {tmp_path}: not in a DVC repository (`dvc init` makes one); "
                                                          "run this where `dvc queue status` runs\n")
    run("git", "init", "-q")
    run("dvc", "init", "-q")
    (tmp_path / "params.yaml").write_text("objective: nll\n")
    (tmp_path / "dvc.yaml").write_text("stages:\n  train:\n    cmd: python -c \"open('m.txt', 'w').write(open('params.yaml').read())\"\n"
                                       "    params: [objective]\n    outs: [m.txt]\n")
    run("git", "add", "-A")
    run("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "pipeline")
    for name, objective in (("exp-a", "score"), ("exp-b", "delta")):
        run("dvc", "exp", "run", "--queue", "-n", name, "-S", f"objective={objective}")
    queued = ours()
    assert [fields[1:] for fields in queued] == [["exp-a", "Queued"], ["exp-b", "Queued"]]
    assert ours("--workers") == dvcs() == [*queued, [], ["Worker", "status:", "0", "active,", "0", "idle"]]
    # (no pipes: the worker it spawns would hold them open until it ends)
    subprocess.run(["dvc", "queue", "start", "-j", "1"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=120, check=True)
    try:
        for _ in range(240):
            state = ours()
            if not any(fields[-1] in ("Queued", "Running") for fields in state):
                break
            time.sleep(0.5)
        assert sorted(fields[1:] for fields in state) == [["exp-a", "Success"], ["exp-b", "Success"]]
        assert sorted(state) == sorted(dvcs()[:-2])
    finally:
        run("dvc", "queue", "stop")
