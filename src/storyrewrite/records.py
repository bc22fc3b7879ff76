"""Where a stage ran and how long it took: `reports/stages/<stage>.json`, one per model stage.

Every stage that loads a model (and the bootstrap) writes one when it succeeds:

    {"stage": "generate-nll", "device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3",
     "dtype": "bfloat16", "wall_s": 31.2, "items": 5613, "unit": "predictions",
     "items_per_s": 179.9, "peak_rss_gb": 3.1, "peak_cuda_gb": 9.8, "started_at": "...",
     "experiment": "gpu-dto-score", "torch": "2.13.0", "cuda": "12.8"}

Memory peaks are GiB (bytes / 2**30) under their `_gb` keys, as records have always held them.
The report and the experiment collector turn them into a table (`report.stages`), so a GPU run states which stage
ran where (the issue's "no model stage on the CPU") and what each cost. The wall time runs from
`StageRecord.start` (after the stage's imports and argument parsing; loading models and starting
CUDA count in it) to `finish`; `startup_s`, from the process's start to `StageRecord.start` (the
interpreter, the imports, the arguments: what each stage pays before its work). No torch import
here: the device is described from the object the stage passes, importing torch only for a CUDA
device.

A stage that ran torch.compile (a static KV cache, `compile: true`) also records what it did:
`compiled_graphs`, `graph_breaks`, and `cudagraph_skips` with the first `cudagraph_skip_reason`:
graphs inductor ran without replaying them as CUDA graphs, a launch per kernel again. torch logs
such a skip only where TORCH_LOGS asks for it.
"""
from __future__ import annotations

import argparse
import logging
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from storyrewrite import artifacts

# Stage records are tabulated in the order the pipeline runs their stages.
PIPELINE_ORDER = ("train_nll", "train", "generate", "llm_index", "llm", "score", "score_llm", "score_sanity", "significance")


def _proc_cpuinfo() -> str | None:
    """The text of /proc/cpuinfo; None where there is none (not Linux)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return None


def _sysctl(name: str) -> str | None:
    """macOS's value of the kernel setting `name` (`sysctl -n NAME`): where a Mac, which has no
    /proc, names its CPU and its features. None elsewhere, or where it has no such setting."""
    if sys.platform != "darwin":
        return None
    try:
        result = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (result.stdout.strip() or None) if result.returncode == 0 else None


def cpu_name() -> str:
    """The CPU model as /proc/cpuinfo names it (macOS: `machdep.cpu.brand_string`, "Apple M2";
    platform's guess elsewhere), with its core count."""
    names = [line.split(":", 1)[1].strip() for line in (_proc_cpuinfo() or "").splitlines() if line.startswith("model name")]
    name = names[0] if names else _sysctl("machdep.cpu.brand_string") or platform.processor() or platform.machine()
    return f"{name} ({os.cpu_count()} cores)"


def cpu_has_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether the CPU has bf16 arithmetic instructions, from its flags in /proc/cpuinfo (or
    `cpuinfo`, that file's text): x86 `avx512_bf16` or `amx_bf16`, Arm `bf16`. Without them torch
    computes bf16 in emulation. On macOS, Apple silicon's `hw.optional.arm.FEAT_BF16` (M2 and
    later). None where nothing tells (an Intel Mac; no /proc/cpuinfo elsewhere)."""
    if cpuinfo is None and (cpuinfo := _proc_cpuinfo()) is None:
        return {"1": True, "0": False}.get(_sysctl("hw.optional.arm.FEAT_BF16") or "")
    flags = [set(line.split(":", 1)[1].split()) for line in cpuinfo.splitlines()
             if line.split(":", 1)[0].strip() in ("flags", "Features") and ":" in line]
    if not flags:
        return None
    return all(cpu & {"avx512_bf16", "amx_bf16", "bf16"} for cpu in flags)


def cpu_features(facts: Mapping) -> str:
    """"AVX2, no bf16 instructions": of `facts` (cpu_facts(), or a record holding them), torch's
    CPU capability and the bf16 answer where there is one: what a CPU timing depends on beyond
    the model name."""
    bf16 = {True: ", bf16 instructions", False: ", no bf16 instructions"}.get(facts.get("cpu_bf16"), "")
    return facts["cpu_capability"] + bf16


def cpu_facts() -> dict:
    """{"cpu_capability", "cpu_bf16"}: the vector instructions torch's CPU kernels use
    (torch.backends.cpu.get_cpu_capability) and whether the CPU has bf16 instructions
    (cpu_has_bf16): what a CPU's timings, and the last digits of its sums, depend on beyond the
    CPU's name (a cloud's "AMD EPYC" is AVX2 on one machine and AVX512 on another)."""
    import torch

    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_bf16": cpu_has_bf16()}


def where_ran(record: dict) -> str:
    """"cpu (AMD EPYC (2 cores), AVX2, no bf16 instructions)", "cuda:0 (NVIDIA H100 80GB HBM3)":
    a record's device and its name, with a CPU's features where the record holds them."""
    name = record["device_name"]
    if "cpu_capability" in record:
        name += ", " + cpu_features(record)
    return record["device"] if name == record["device"] else f"{record['device']} ({name})"


def describe_device(device) -> dict:
    """{"device": "cuda:0" | "cpu", "device_name": ...} for a torch.device or its string;
    "remote HOST" (a remote LLM backend's server) gives {"device": "remote", "device_name": HOST}."""
    text = str(device)
    if text.startswith("cuda"):
        import torch

        index = torch.device(text).index
        index = torch.cuda.current_device() if index is None else index
        return {"device": f"cuda:{index}", "device_name": torch.cuda.get_device_name(index)}
    if text.startswith("cpu"):
        return {"device": "cpu", "device_name": cpu_name()}
    if text.startswith("remote "):
        return {"device": "remote", "device_name": text.removeprefix("remote ")}
    return {"device": text, "device_name": text}


def peak_rss_gb(status: Path = Path("/proc/self/status")) -> float:
    """The process's peak resident memory in GiB: VmHWM of its `status`, which starts afresh with
    the process (getrusage's ru_maxrss carries a parent's peak across exec: DVC's, for a stage);
    where there is no /proc (macOS), getrusage's."""
    if status.exists():
        line = next(line for line in status.read_text().splitlines() if line.startswith("VmHWM:"))
        return int(line.split()[1]) / 2**20  # kB
    # Elsewhere getrusage's peak: in bytes on macOS, in KiB on Linux and the BSDs (getrusage(2)).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**30 if sys.platform == "darwin" else 2**20)


def process_age_s() -> float | None:
    """Seconds since this process started, from /proc: its start in clock ticks since boot
    against /proc/uptime (both to 10 ms). None where there is no /proc (not Linux)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError):
        return None
    # Field 22, starttime; the fields after the name, which is in parentheses and may hold spaces, start at field 3.
    started = int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    return max(0.0, uptime - started)


def _peak_memory(device: str) -> dict:
    peak = {"peak_rss_gb": round(peak_rss_gb(), 2)}
    if device.startswith("cuda"):
        import torch

        # Handed out to tensors, and held by torch's pool (what the GPU's other processes cannot have).
        peak["peak_cuda_gb"] = round(torch.cuda.max_memory_allocated(torch.device(device)) / 2**30, 2)
        peak["peak_cuda_reserved_gb"] = round(torch.cuda.max_memory_reserved(torch.device(device)) / 2**30, 2)
    return peak


def _versions() -> dict:
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    return {"torch": torch.__version__, "cuda": torch.version.cuda}


# inductor's log of the graphs it does not replay as CUDA graphs (torch._inductor.cudagraph_utils:
# an artifact logger, silent unless TORCH_LOGS names `cudagraphs`).
CUDAGRAPH_LOG = "torch._inductor.cudagraph_utils.__cudagraphs"


class _SkipReasons(logging.Handler):
    """Keeps the distinct messages of CUDAGRAPH_LOG, and prints each once to stderr."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if (message := record.getMessage()) not in self.messages:
            self.messages.append(message)
            print(f"torch: {message}", file=sys.stderr)


def _dynamo_counters():
    """torch._dynamo's counters in this process; None where it was never imported (no import here)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return None if utils is None else utils.counters


def compile_counts() -> dict[str, int]:
    """What torch.compile has done in this process so far (torch._dynamo's counters; none where
    it was never imported): graphs compiled, graph breaks, graphs not replayed as CUDA graphs."""
    counters = _dynamo_counters()
    if counters is None:
        return {}
    return {"compiled_graphs": counters["stats"]["unique_graphs"], "graph_breaks": counters["graph_break"].total(),
            "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}


def dynamo_frames() -> int:
    """The Python frames torch.compile's dynamo has been asked to compile in this process so far (0
    where it was never imported): with no graph compiled, whether torch.compile was entered at all."""
    counters = _dynamo_counters()
    return 0 if counters is None else counters["frames"]["total"]


class StageRecord:
    """Started when the stage begins its work; `finish` writes the record atomically (a failed
    stage writes none)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.started = time.perf_counter()
        self.started_at = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
        self.startup_s = process_age_s()
        self.compiled_before = compile_counts()
        self.skip_reasons = _SkipReasons()
        logging.getLogger(CUDAGRAPH_LOG).addHandler(self.skip_reasons)

    @staticmethod
    def add_argument(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--record", type=Path, help="stage record: where it ran, how long (reports/stages/<stage>.json)")

    @classmethod
    def start(cls, path: str | os.PathLike | None) -> StageRecord | None:
        return None if path is None else cls(path)

    def finish(self, device, dtype: str | None = None, items: int | None = None, unit: str | None = None,
               **extra) -> dict:
        """Write the record: `device` where the stage's model ran; `items` of `unit` it
        processed (for a rate); `extra` any further facts (numbers or short strings)."""
        wall = time.perf_counter() - self.started
        logging.getLogger(CUDAGRAPH_LOG).removeHandler(self.skip_reasons)
        compiled = {key: count - self.compiled_before.get(key, 0) for key, count in compile_counts().items()}
        if not compiled.get("compiled_graphs"):  # nothing compiled in the stage: no facts of it
            compiled = {}
        elif compiled["cudagraph_skips"] and self.skip_reasons.messages:
            compiled["cudagraph_skip_reason"] = self.skip_reasons.messages[0][:300]
        where = describe_device(device)
        if where["device"] == "cpu" and "torch" in sys.modules:  # a stage that runs no torch has no kernels to name
            where |= cpu_facts()
        record = {"stage": self.path.stem, **where, "dtype": dtype, "wall_s": round(wall, 2),
                  "items": items, "unit": unit,
                  "items_per_s": round(items / wall, 3) if items is not None and wall > 0 else None,
                  **_peak_memory(where["device"]), **compiled, **extra, "started_at": self.started_at,
                  **({} if self.startup_s is None else {"startup_s": round(self.startup_s, 2)}),
                  "experiment": os.environ.get("DVC_EXP_NAME"), **_versions()}
        # Under DDP every process runs the stage; the first process of the first node writes.
        if os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0":
            artifacts.write(self.path, artifacts.Record.model_validate(record), only_set=True)
        return record


def _pipeline_position(record: dict) -> tuple[int, str]:
    stage = record["stage"].split("-")[0]  # generate-nll -> generate
    return (PIPELINE_ORDER.index(stage) if stage in PIPELINE_ORDER else len(PIPELINE_ORDER), record["stage"])


def read_records(directory: Path) -> list[dict]:
    """The stage records in `directory`, in the order the pipeline runs them."""
    records = [artifacts.read(path, artifacts.Record).model_dump(exclude_unset=True) for path in sorted(Path(directory).glob("*.json"))]
    return sorted(records, key=_pipeline_position)
