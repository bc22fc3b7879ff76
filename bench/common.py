"""What every bench script starts from: the default profile's params, its materialised models
and its prepared splits (taken from the pipeline's outputs when `dvc repro` has made them)."""
from __future__ import annotations

import tempfile
from pathlib import Path

from storyrewrite.data.prepare import DataConfig, build_splits
from storyrewrite.data.sources import DownloadConfig, download
from storyrewrite.models.loading import ModelsConfig, materialise
from storyrewrite.params import build, experiment, load_params

ROOT = Path(__file__).resolve().parents[1]


def default_inputs() -> tuple[dict, Path, dict]:
    """(params, the models stage's directory, {split: instances} of the params' task)."""
    params = load_params(ROOT / "params.yaml")
    seed = experiment(params).seed
    pretrained = ROOT / "models" / "pretrained"
    if not (pretrained / "index.json").exists():  # before `dvc repro models`
        pretrained = Path(tempfile.mkdtemp()) / "pretrained"
        materialise(build(ModelsConfig, params["models"], "models"), pretrained, seed)
    raw = ROOT / "data" / "raw"
    if not raw.exists():  # before `dvc repro download`: check and copy the bundled files
        raw = Path(tempfile.mkdtemp()) / "raw"
        download(build(DownloadConfig, params["download"], "download"), raw, ROOT / "data" / "bundled", raw.parent / "sums.json")
    splits = build_splits(raw, build(DataConfig, params["data"], "data"), seed)[experiment(params).task]
    return params, pretrained, splits
