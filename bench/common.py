"""What every bench script starts from: the default profile's params, its materialised models
and its prepared splits (taken from the pipeline's outputs when `dvc repro` has made them), and
timing that is honest on a GPU (synchronised) as on a CPU."""
from __future__ import annotations

import platform
import tempfile
import time
from pathlib import Path

import torch

from storyrewrite.data.prepare import prepare
from storyrewrite.data.sources import download
from storyrewrite.models.loading import materialise
from storyrewrite.params import Params, load_yaml, overlay
from storyrewrite.records import peak_rss_gb

ROOT = Path(__file__).resolve().parents[1]


def inputs(profiles: list[Path] = ()) -> tuple[Params, Path, Path]:
    """(params.yaml with the profiles overlaid, the models stage's directory, prepared tables).

    The pipeline's outputs (`dvc repro`) are used where their settings are these params' (the
    models, the data); anything else is built in a temporary directory."""
    raw_params = load_yaml(ROOT / "params.yaml")
    for profile in profiles:
        raw_params = overlay(raw_params, load_yaml(profile))
    params, workspace = Params(raw_params), Params.load(ROOT / "params.yaml")
    pretrained = ROOT / "models" / "pretrained"
    if params.models != workspace.models or not (pretrained / "index.json").exists():
        pretrained = Path(tempfile.mkdtemp()) / "pretrained"
        materialise(params.models, pretrained, params.seed)
    prepared = ROOT / "data" / "prepared"
    same_data = (params.data, params.download, params.seed) == (workspace.data, workspace.download, workspace.seed)
    if not same_data or not (prepared / params.task / "train.jsonl").exists():
        raw = ROOT / "data" / "raw"
        if not raw.exists():  # before `dvc repro download`: check and copy the bundled files
            raw = Path(tempfile.mkdtemp()) / "raw"
            download(params.download, raw, ROOT / "data" / "bundled", raw.parent / "sums.json")
        prepared = Path(tempfile.mkdtemp()) / "prepared"
        prepare(raw, prepared, params.data, params.seed)
    return params, pretrained, prepared


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: torch.device) -> float:
    """Wall time after everything queued on the device has run."""
    synchronize(device)
    return time.perf_counter()


def peak_memory_gb(device: torch.device) -> float:
    """Peak GPU memory allocated by torch on CUDA, else the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1024**3
    return peak_rss_gb()


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return f"CPU {platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"
