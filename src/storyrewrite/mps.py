"""NVIDIA's Multi-Process Service (MPS) for the stages that share one GPU (`comparison.sh` with
`COMPARISON_MPS=1`). Without it, processes on one GPU take turns on it (time slices); through one
MPS server their kernels run at once, which suits steps bound by kernel launches.

    python -m storyrewrite.mps start DIR   the daemon, its pipes and logs in DIR; stdout: the
                                           variables that make a process its client
    python -m storyrewrite.mps stop DIR    stops it (once its clients have ended)

Only processes given DIR's variables join it: other programs on the machine run as before. It is
checked first with two clients at once, and stopped again where they fail (a container that does
not pass MPS through, say): a program that finds no daemon runs without MPS, but one that finds a
daemon whose server cannot start fails. No stage imports this module: a change here reruns none.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"
# A probe client: CUDA work through the MPS server (a context, a product, a read back).
PROBE = "import torch; x = torch.ones(256, 256, device='cuda'); print(float((x @ x).sum()))"
PROBED = "16777216.0"  # what PROBE prints: 256 ones summed, 256 x 256 times


def client_env(directory: Path) -> dict[str, str]:
    """The variables that make a CUDA process a client of the daemon started in `directory`."""
    return {"CUDA_MPS_PIPE_DIRECTORY": str(directory / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(directory / "log")}


def _last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "no output")


def start(directory: Path, clients: int = 2, timeout: float = 60.0, probe: list[str] | None = None) -> str | None:
    """Starts an MPS control daemon whose pipes and logs are in `directory`, then runs `clients`
    probe processes through it at once (`probe`, default PROBE under this Python), all within
    `timeout` seconds. None where they ran; else why not, with the daemon stopped again."""
    control = shutil.which(CONTROL)
    if control is None:
        return f"{CONTROL} not found on PATH"
    env = {**os.environ, **client_env(directory)}
    for folder in ("pipe", "log"):
        (directory / folder).mkdir(parents=True, exist_ok=True)
    try:
        started = subprocess.run([control, "-d"], env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        return f"{CONTROL} -d: {error}"
    if started.returncode != 0:
        return f"{CONTROL} -d exited with {started.returncode}: {_last_line(started.stderr + started.stdout)}"
    command = probe or [sys.executable, "-c", PROBE]
    runs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(clients)]
    failure, deadline = None, time.monotonic() + timeout
    for run in runs:
        try:
            out, err = run.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            run.kill()
            out, err = run.communicate()
            failure = failure or f"the probe clients took over {timeout:g} s"
        if run.returncode != 0 or out.strip() != PROBED:
            failure = failure or f"a probe client failed ({run.returncode}): {_last_line(err + out)}"
    if failure is not None:
        stop(directory)
    return failure


def stop(directory: Path, timeout: float = 30.0) -> None:
    """Stops the MPS control daemon of `directory` and its server (`quit`: once its clients have ended)."""
    control = shutil.which(CONTROL)
    if control is None:
        return
    try:
        subprocess.run([control], input="quit\n", env={**os.environ, **client_env(directory)}, capture_output=True,
                       text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        pass  # (no daemon there, or one that does not answer: nothing more to stop)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m storyrewrite.mps", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("directory", type=Path, help="the daemon's pipes and logs (a folder of its own)")
    args = parser.parse_args(argv)
    if args.action == "stop":
        stop(args.directory)
        return
    why = start(args.directory)
    if why is not None:
        print(f"MPS not started: {why}", file=sys.stderr)
        raise SystemExit(3)
    for key, value in client_env(args.directory).items():
        print(f"{key}={value}")


if __name__ == "__main__":
    main()
