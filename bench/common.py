"""What every bench script starts from: the default profile's params, its materialised models
and its prepared splits (taken from the pipeline's outputs when `dvc repro` has made them)."""
from __future__ import annotations

import tempfile
from pathlib import Path

from storyrewrite.data.prepare import build_splits
from storyrewrite.data.sources import download
from storyrewrite.models.loading import materialise
from storyrewrite.params import Params

ROOT = Path(__file__).resolve().parents[1]


def default_inputs() -> tuple[Params, Path, dict]:
    """(params, the models stage's directory, {split: instances} of the params' task)."""
    params = Params.load(ROOT / "params.yaml")
    pretrained = ROOT / "models" / "pretrained"
    if not (pretrained / "index.json").exists():  # before `dvc repro models`
        pretrained = Path(tempfile.mkdtemp()) / "pretrained"
        materialise(params.models, pretrained, params.seed)
    raw = ROOT / "data" / "raw"
    if not raw.exists():  # before `dvc repro download`: check and copy the bundled files
        raw = Path(tempfile.mkdtemp()) / "raw"
        download(params.download, raw, ROOT / "data" / "bundled", raw.parent / "sums.json")
    splits = build_splits(raw, params.data, params.seed)[params.task]
    return params, pretrained, splits
