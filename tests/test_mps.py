"""NVIDIA's MPS for the stages sharing one GPU, against a stand-in control daemon and probe
clients (a machine without MPS, or without a GPU, runs the same code up to the probe)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from storyrewrite import mps


def _mps_control(tmp_path, monkeypatch, daemon_status: int = 0) -> Path:
    """A stand-in `nvidia-cuda-mps-control` first on PATH that logs each call (its arguments, the
    pipe folder it was given, what it read) and exits with `daemon_status` for `-d`."""
    bin_dir, log = tmp_path / "bin", tmp_path / "control.log"
    bin_dir.mkdir()
    control = bin_dir / mps.CONTROL
    control.write_text(f"""#!/usr/bin/env bash
read -t 1 -r line || true
echo "args=$* pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY stdin=$line" >> {log}
[ "$1" != -d ] || exit {daemon_status}
""")
    control.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def _probe(tmp_path, body: str) -> list[str]:
    """A probe client: a Python program that appends the pipe folder it was given to a file, then runs `body`."""
    seen = tmp_path / "clients.log"
    return [sys.executable, "-c", f"import os; open({str(seen)!r}, 'a').write(os.environ['CUDA_MPS_PIPE_DIRECTORY'] + '\\n'); {body}"]


def test_mps_starts_for_this_folder_alone_and_stays_once_two_clients_ran_through_it(tmp_path, monkeypatch):
    log = _mps_control(tmp_path, monkeypatch)
    folder = tmp_path / "mps"
    assert mps.start(folder, probe=_probe(tmp_path, f"print({mps.PROBED!r})")) is None
    # The daemon and both clients saw the folder's pipes (only processes given them join this daemon), and no quit.
    assert log.read_text().splitlines() == [f"args=-d pipe={folder}/pipe log={folder}/log stdin="]
    assert (tmp_path / "clients.log").read_text().splitlines() == [f"{folder}/pipe"] * 2
    assert (folder / "pipe").is_dir() and (folder / "log").is_dir()
    mps.stop(folder)
    assert log.read_text().splitlines()[-1] == f"args= pipe={folder}/pipe log={folder}/log stdin=quit"
    # The command line prints the variables for the script to export.
    assert mps.client_env(folder) == {"CUDA_MPS_PIPE_DIRECTORY": f"{folder}/pipe", "CUDA_MPS_LOG_DIRECTORY": f"{folder}/log"}


@pytest.mark.parametrize("body, why", [
    ("raise SystemExit('cudaErrorMpsConnectionFailed')", "a probe client failed (1): cudaErrorMpsConnectionFailed"),
    ("print('0.0')", "a probe client failed (0): 0.0"),  # ran, but the product is wrong
    ("import time; time.sleep(30)", "the probe clients took over 1 s"),
])
def test_mps_that_fails_its_probe_is_stopped_again_and_says_why(tmp_path, monkeypatch, body, why):
    log = _mps_control(tmp_path, monkeypatch)
    assert mps.start(tmp_path / "mps", timeout=1, probe=_probe(tmp_path, body)) == why
    assert [line.split(" pipe=")[0] + " " + line.split("stdin=")[1] for line in log.read_text().splitlines()] == ["args=-d ", "args= quit"]


def test_mps_is_not_started_where_its_daemon_is_missing_or_refuses(tmp_path, monkeypatch):
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert mps.start(tmp_path / "mps") == "nvidia-cuda-mps-control not found on PATH"
    monkeypatch.setenv("PATH", path)
    log = _mps_control(tmp_path, monkeypatch, daemon_status=1)
    assert mps.start(tmp_path / "mps", probe=_probe(tmp_path, "print(1)")) == "nvidia-cuda-mps-control -d exited with 1: no output"
    assert not (tmp_path / "clients.log").exists() and len(log.read_text().splitlines()) == 1
    # Through the command line: exit status 3 and the reason, nothing on stdout for the script to export.
    result = subprocess.run([sys.executable, "-m", "storyrewrite.mps", "start", str(tmp_path / "cli")],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path(mps.__file__).parents[1])})
    assert result.returncode == 3 and result.stdout == ""
    assert result.stderr == "MPS not started: nvidia-cuda-mps-control -d exited with 1: no output\n"
