"""Fixtures: tiny random-init models built from configs, and small prepared data (what tests
share beside them is in helpers.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import tiny_models_config, write_raw
from storyrewrite.data.prepare import prepare
from storyrewrite.models.materialise import materialise
from storyrewrite.models.store import resolve_model_dir
from storyrewrite.params import DataConfig, ModelsConfig


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


@pytest.fixture(scope="session")
def raw_dir(tmp_path_factory) -> Path:
    return write_raw(tmp_path_factory.mktemp("raw"))


@pytest.fixture(scope="session")
def small_prepared(tmp_path_factory, raw_dir) -> Path:
    """Prepared tables with 12 train and 6 val/test instances per task."""
    out = tmp_path_factory.mktemp("prepared")
    prepare(raw_dir, out, DataConfig(val_fraction=0.1, max_train=12, max_eval=6), seed=0)
    return out


# `make test-durations`: the suite's slowest tests (setup + call + teardown), for docs/testing.md.
_DURATIONS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    import json
    import os
    import platform
    from datetime import datetime, timezone

    target = os.environ.get("STORYREWRITE_TEST_DURATIONS")
    if not target or exitstatus != 0 or not _DURATIONS:
        return
    from storyrewrite.io import write_json_atomic
    from storyrewrite.records import cpu_name

    slowest = sorted(_DURATIONS.items(), key=lambda item: -item[1])[:15]
    write_json_atomic(target, {
        "tests": len(_DURATIONS), "seconds": round(sum(_DURATIONS.values()), 1),
        "machine": f"{cpu_name()}, Python {platform.python_version()}",
        "when": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "slowest": [{"test": name, "seconds": round(seconds, 1)} for name, seconds in slowest],
    })
