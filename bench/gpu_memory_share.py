"""Several processes on one GPU, each with torch's caching allocator: what each holds, and whether
all of them fit, with the allocator as torch sets it and with the share the stages take
(storyrewrite.parallel: expandable segments, and a cap of GPU_HEADROOM / workers of the GPU).

    python bench/gpu_memory_share.py [--processes 8] [--steps 200] [--mps]

Each process runs the memory pattern of a preference objective's log-probabilities (CPO's
`token_log_probs`): a language model's head over batches of varying length, the logits upcast
and log-softmaxed over a 49,152-token vocabulary (SmolLM2's), a backward pass on training
batches (32 sequences) and none on every fifth, a validation batch (128). The lengths vary from
batch to batch, as the data's do, which fragments a cache of blocks. The processes start
together and hold what they took until all have ended, as queue workers do. Per setting: how many
processes ran out of memory, and each one's peak of memory handed out and held. The shared
setting's first process also replays a compiled function as CUDA graphs (`reduce-overhead`, what
RLOO's static-cache sampling compiles) and a captured graph, and says whether both match eager.
`--mps`: every process a client of one MPS server (storyrewrite.mps), as `comparison.sh --mps`
runs them. Needs a CUDA GPU. Figures go to reports/bench/gpu_memory_share.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import ROOT, write_result

from storyrewrite import mps as nvidia_mps
from storyrewrite.io import InputError, run_cli
from storyrewrite.parallel import ALLOC_CONF_ENVS, share_gpu_memory, share_machine

VOCAB, HIDDEN = 49152, 576  # SmolLM2-135M's vocabulary and hidden size
SETTINGS = ("torch-default", "shared")
GB = 2**30
BARRIER_S = 60  # the longest a process holds its memory, waiting for the others


def work(steps: int, seed: int, device: torch.device) -> None:
    """The log-probabilities' memory pattern (module doc), `steps` batches."""
    rng = random.Random(seed)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False, device=device, dtype=torch.bfloat16)
    for step in range(steps):
        validation = step % 5 == 4
        batch, length = (128 if validation else 32), rng.randint(24, 150)
        hidden = torch.randn(batch, length, HIDDEN, device=device, dtype=torch.bfloat16, requires_grad=not validation)
        with torch.set_grad_enabled(not validation):
            log_probs = torch.log_softmax(head(hidden).float(), dim=-1)
            targets = torch.randint(VOCAB, (batch, length, 1), device=device)
            loss = -log_probs.gather(2, targets).mean()
            if not validation:
                loss.backward()
                head.weight.grad = None


def said(error: Exception) -> str:
    """An error in one line, for the record: its type and its message's first line."""
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"


def graphs_match(device: torch.device) -> dict:
    """A compiled function replayed as CUDA graphs, and a captured graph, against eager."""
    def step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x @ w, dim=-1).sum(dim=0)

    x, w = torch.randn(64, 576, device=device), torch.randn(576, 4096, device=device)
    expected = step(x, w)
    result = {}
    try:
        compiled = torch.compile(step, mode="reduce-overhead")
        outputs = [compiled(x, w).clone() for _ in range(4)]  # recorded, then replayed
        result["compiled_reduce_overhead"] = all(torch.allclose(out, expected, rtol=1e-3, atol=1e-4) for out in outputs)
    except Exception as error:  # noqa: BLE001 - the record says what failed
        result["compiled_reduce_overhead"] = said(error)
    try:
        static_x = x.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step(static_x, w)  # warm-up on a side stream, as torch's documentation asks before a capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = step(static_x, w)
        graph.replay()
        result["captured_graph"] = bool(torch.allclose(static_out, expected, rtol=1e-3, atol=1e-4))
    except Exception as error:  # noqa: BLE001
        result["captured_graph"] = said(error)
    return result


def worker(setting: str, steps: int, seed: int, barrier: Path, processes: int) -> dict:
    """One process of a setting: its figures as a dict (printed as JSON by main). It holds what it
    took until every process of the setting is done (`<seed>.done` in `barrier`; the parent marks
    one that ended early), or BARRIER_S has passed."""
    if setting == "shared":
        share_machine(processes)  # expandable segments, before CUDA starts here
    device = torch.device("cuda", 0)
    figures = {"cap_gb": None, "allocator": os.environ.get(ALLOC_CONF_ENVS[0], ""), "out_of_memory": None}
    started = time.perf_counter()
    try:
        figures["cap_gb"] = share_gpu_memory(device, processes) if setting == "shared" else None
        work(steps, seed, device)
        torch.cuda.synchronize(device)
    except torch.OutOfMemoryError as error:
        figures["out_of_memory"] = str(error).splitlines()[0]
    except Exception as error:  # noqa: BLE001 - a CUDA error of another kind: said, and the barrier still reached
        figures["error"] = said(error)
    figures["seconds"] = round(time.perf_counter() - started, 2)
    figures["peak_allocated_gb"] = round(torch.cuda.max_memory_allocated(device) / GB, 2)
    figures["peak_reserved_gb"] = round(torch.cuda.max_memory_reserved(device) / GB, 2)
    if setting == "shared" and seed == 0:
        figures["graphs"] = graphs_match(device)
    (barrier / f"{seed}.done").touch()
    deadline = time.monotonic() + BARRIER_S
    while len(list(barrier.glob("*.done"))) < processes and time.monotonic() < deadline:
        time.sleep(0.2)
    return figures


def run_setting(setting: str, processes: int, steps: int, env: dict) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        barrier, logs = Path(folder, "barrier"), Path(folder)
        barrier.mkdir()
        started = time.perf_counter()
        children = []
        for seed in range(processes):
            with open(logs / f"{seed}.out", "w") as out, open(logs / f"{seed}.err", "w") as err:
                children.append(subprocess.Popen(
                    [sys.executable, __file__, "--worker", setting, "--seed", str(seed), "--steps", str(steps),
                     "--processes", str(processes), "--barrier", str(barrier)], stdout=out, stderr=err, env=env))
        while any(child.poll() is None for child in children):
            for seed, child in enumerate(children):
                if child.poll() is not None:
                    (barrier / f"{seed}.done").touch()  # one that ended early keeps no other waiting
            time.sleep(0.2)
        wall = time.perf_counter() - started
        each = []
        for seed, child in enumerate(children):
            lines = [line for line in (logs / f"{seed}.out").read_text().splitlines() if line.startswith("{")]
            err = (logs / f"{seed}.err").read_text().strip().splitlines() or ["no output"]
            each.append(json.loads(lines[-1]) if child.returncode == 0 and lines else {"failed": f"exit {child.returncode}: {err[-1]}"})
    ran = [e for e in each if "failed" not in e]
    return {
        "processes": processes, "wall_s": round(wall, 1),
        "out_of_memory": sum(1 for e in ran if e["out_of_memory"]),
        "failed": sum(1 for e in each if "failed" in e or e.get("error")),
        "peak_allocated_gb_max": max((e["peak_allocated_gb"] for e in ran), default=None),
        "peak_reserved_gb_max": max((e["peak_reserved_gb"] for e in ran), default=None),
        "peak_reserved_gb_sum": round(sum(e["peak_reserved_gb"] for e in ran), 2),
        "each": each,
    }


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=8, help="processes side by side (default 8)")
    parser.add_argument("--steps", type=int, default=200, help="batches each process runs (default 200)")
    parser.add_argument("--mps", action="store_true", help="every process a client of one MPS server")
    parser.add_argument("--worker", choices=SETTINGS, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--barrier", type=Path, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = arguments().parse_args()
    if args.processes < 1 or args.steps < 1:
        raise InputError(f"--processes and --steps must be whole numbers >= 1, got {args.processes} and {args.steps}")
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.seed, args.barrier, args.processes)))
        return
    if not torch.cuda.is_available():
        raise InputError("bench/gpu_memory_share.py needs a CUDA GPU: it measures how processes share one")
    env = {k: v for k, v in os.environ.items() if k not in ALLOC_CONF_ENVS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH", "")]))
    mps_dir, mps = None, "off"
    if args.mps:
        mps_dir = Path(tempfile.mkdtemp(prefix="gpu-memory-share-mps."))
        why = nvidia_mps.start(mps_dir)  # None: started (else measured without it, and the record says why)
        mps = "on" if why is None else f"off: {why}"
        if why is None:
            env.update(nvidia_mps.client_env(mps_dir))
    figures = {}
    try:
        for setting in SETTINGS:
            figures[setting] = run_setting(setting, args.processes, args.steps, env)
            f = figures[setting]
            print(f"{setting:>14}: {f['processes']} processes, {f['out_of_memory']} out of memory, {f['failed']} failed; "
                  f"peak per process {f['peak_allocated_gb_max']} GB handed out, {f['peak_reserved_gb_max']} GB held; "
                  f"held together {f['peak_reserved_gb_sum']} GB; {f['wall_s']} s", flush=True)
    finally:
        if mps_dir is not None:
            if mps == "on":
                nvidia_mps.stop(mps_dir)
            shutil.rmtree(mps_dir, ignore_errors=True)
    graphs = next((e.get("graphs") for e in figures["shared"]["each"] if "graphs" in e), None)
    print(f"graphs in the shared setting: {graphs}")
    total = torch.cuda.get_device_properties(0).total_memory / GB
    write_result("gpu_memory_share" + ("-mps" if args.mps else ""), torch.device("cuda", 0), {**figures, "graphs": graphs, "gpu_total_gb": round(total, 1)},
                 {"processes": args.processes, "steps": args.steps, "mps": mps, "vocab": VOCAB, "hidden": HIDDEN})


if __name__ == "__main__":
    run_cli(main)
