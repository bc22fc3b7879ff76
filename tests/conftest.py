"""Shared fixtures: tiny random-init models built from configs, and small prepared data."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from storyrewrite.data.prepare import prepare
from storyrewrite.models.materialise import materialise
from storyrewrite.models.store import resolve_model_dir
from storyrewrite.params import DataConfig, DTOConfig, ModelsConfig, TrainConfig, build, load_yaml

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "data" / "bundled"


def tiny_train_config(**changes) -> TrainConfig:
    """The default `train_nll` section made tiny: 2 steps, CPU, checkpoints every step."""
    section = load_yaml(ROOT / "params.yaml")["train_nll"]
    section = {**section, "batch_size": 2, "max_steps": 2, "val_check_interval": 2,
               "checkpoint_every_n_steps": 1, "lr": 1e-3, "accelerator": "cpu", "devices": 1, **changes}
    return build(TrainConfig, section, "train_nll")


def tiny_run(model_dir: Path, prepared: Path, objective: str = "nll", settings=None, scorer_dir: Path | None = None,
             task: str = "timetravel", section: str = "train_nll", kind: str = "llama", **config_changes):
    """A training run of a tiny model (see `tiny_train_config` for the budget)."""
    from storyrewrite.training.run import Run

    return Run(section=section, config=tiny_train_config(**config_changes), models=tiny_models_config(kind), task=task,
               seed=0, objective=objective, settings=settings, init_dir=Path(model_dir), prepared_dir=Path(prepared),
               scorer_dir=scorer_dir)


DTO = DTOConfig(tau=1.0, hard=False)


def tiny_models_config(kind: str) -> ModelsConfig:
    return ModelsConfig(generator=f"tiny:{kind}", scorer=f"tiny:{kind}", max_input_tokens=96, max_output_tokens=40)


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, Path]:
    """kind ('bart' or 'llama') -> a materialised tiny model directory."""
    out = tmp_path_factory.mktemp("models")
    dirs = {}
    for kind in ("bart", "llama"):
        materialise(tiny_models_config(kind), out / kind, seed=0)
        dirs[kind] = resolve_model_dir(out / kind)
    return dirs


@pytest.fixture(scope="session")
def tiny_evaluators(tmp_path_factory) -> Path:
    """The eval_models stage's directory for tiny models: judge tiny:llama, embedder
    tiny:roberta ([CLS]), NLI classifier tiny:roberta-nli (MNLI labels)."""
    out = tmp_path_factory.mktemp("evaluators")
    config = ModelsConfig(generator="tiny:llama", scorer="tiny:llama", max_input_tokens=96, max_output_tokens=40,
                          judge="tiny:llama", embedder="tiny:roberta", nli="tiny:roberta-nli")
    materialise(config, out, seed=0, roles=("judge", "embedder", "nli"))
    return out


def write_raw(raw: Path) -> Path:
    """The raw layout the download stage writes, from the committed bundled files."""
    files = {
        "timetravel/dev.json": "timetravel/dev_data.json",
        "timetravel/test.json": "timetravel/test_data.json",
        "art/dev.jsonl": "art/dev.jsonl",
        "art/train.jsonl": "art/subsets/isi-nlp-ai2-increment7/train.jsonl",
    }
    for name, source in files.items():
        (raw / name).parent.mkdir(parents=True, exist_ok=True)
        (raw / name).write_bytes((BUNDLED / source).read_bytes())
    return raw


@pytest.fixture(scope="session")
def raw_dir(tmp_path_factory) -> Path:
    return write_raw(tmp_path_factory.mktemp("raw"))


@pytest.fixture(scope="session")
def small_prepared(tmp_path_factory, raw_dir) -> Path:
    """Prepared tables with 12 train and 6 val/test instances per task."""
    out = tmp_path_factory.mktemp("prepared")
    prepare(raw_dir, out, DataConfig(val_fraction=0.1, max_train=12, max_eval=6), seed=0)
    return out


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
