"""Fixtures: tiny random-init models built from configs, and small prepared data (what tests
share beside them is in helpers.py)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from helpers import ROOT, deal, tiny_models_config, write_raw
from storyrewrite.data.prepare import prepare
from storyrewrite.models.materialise import materialise
from storyrewrite.models.catalogue import EVAL_ROLES
from storyrewrite.models.store import resolve_model_dir
from storyrewrite.params import DataConfig, ModelsConfig
from storyrewrite.parallel import cores, share_machine

# The DVC commands the tests run, in repositories they `dvc init` (whose config does not turn
# analytics off, as this repository's .dvc/config does), send no usage report: offline, each
# report's file would stay in the temporary folder.
os.environ["DVC_NO_ANALYTICS"] = "1"

# `make test` runs the suite on pytest-xdist's workers, one per core (`-n auto`). Each worker takes
# its share of the cores, as DVC's queue workers do (storyrewrite.parallel): torch's threads here,
# and OpenMP's in the stage processes the pipeline tests start. (Through OMP_NUM_THREADS rather
# than STORYREWRITE_WORKERS: a stage under that says so on stderr, which the error tests read whole.)
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    if (_threads := share_machine(int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))) is not None:
        os.environ["OMP_NUM_THREADS"] = str(_threads)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: the cores this process may use (xdist's own count asks psutil, which counts the
    host's cores, not a container's share)."""
    return cores()


def pytest_collection_modifyitems(config, items):
    """With several workers, the longest tests first, dealt out so that none starts late
    (helpers.deal). Every worker collects, and orders, the same way."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers < 2:
        return
    known = _expected_seconds()
    expected = {item.nodeid: known.get(item.nodeid, SLOW_TEST_SECONDS if item.get_closest_marker("slow") else 0.0)
                for item in items}
    by_id = {item.nodeid: item for item in items}
    items[:] = [by_id[nodeid] for nodeid in deal([item.nodeid for item in items], expected, workers)]


DURATIONS = ROOT / "reports" / "tests" / "durations.json"
# A test marked slow and not among the last run's slowest: less than the slowest's last (8 s
# on a 2-core AMD EPYC), more than an unmarked test (a second or less).
SLOW_TEST_SECONDS = 5.0


def _expected_seconds() -> dict[str, float]:
    """test id -> seconds, the slowest tests of the last `make test-durations` (none if unread)."""
    import json

    try:
        return {t["test"]: float(t["seconds"]) for t in json.loads(DURATIONS.read_text())["slowest"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


@pytest.fixture(autouse=True)
def _cuda_settings_restored():
    """A test that resolves a (faked) CUDA device turns cuDNN attention off process-wide
    (storyrewrite.models.device.attention_off_cudnn), or sets the precision of float32 products
    (set_fp32_matmul): the next test starts as torch does."""
    enabled, precision = torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.matmul.fp32_precision
    yield
    torch.backends.cuda.enable_cudnn_sdp(enabled)
    torch.backends.cuda.matmul.fp32_precision = precision


# The objectives this repository ships, in the registry's order.
SHIPPED_OBJECTIVES = ("nll", "cpo", "score", "delta", "score_delta", "rloo")


@pytest.fixture
def shipped_objectives():
    """The objectives registry as this repository ships it, for a test that spells out its whole
    list (an error's valid values, the systems a comparison has no run of). An objective a user
    adds (docs/extending.md) is left out there (its params section stays known: params.yaml has
    it); the tests of what it needs (test_dvc_deps.py, the docs' generated tables,
    test_extending.py) still read the registry whole. The registry is put back in its order,
    wherever the user's entry stands in it: monkeypatch would put a deleted entry back last, and
    the docs' tables that a later test in the same process makes would follow that order."""
    from storyrewrite.objectives import registry

    saved = dict(registry.OBJECTIVES)
    registry.OBJECTIVES.clear()
    registry.OBJECTIVES.update({name: saved[name] for name in SHIPPED_OBJECTIVES})
    yield
    registry.OBJECTIVES.clear()
    registry.OBJECTIVES.update(saved)


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
    tiny:roberta ([CLS]), NLI classifier tiny:roberta-nli (MNLI labels); no BERTScore encoder."""
    out = tmp_path_factory.mktemp("evaluators")
    config = ModelsConfig(generator="tiny:llama", scorer="tiny:llama", max_input_tokens=96, max_output_tokens=40,
                          judge="tiny:llama", embedder="tiny:roberta", nli="tiny:roberta-nli")
    materialise(config, out, seed=0, roles=EVAL_ROLES)  # models.bertscore null
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


# `make test-durations`: the suite's wall time and slowest tests (setup + call + teardown), for
# docs/testing.md. Written by the controller, which receives every worker's reports.
_DURATIONS: dict[str, float] = {}
_STARTED = time.monotonic()


def pytest_runtest_logreport(report):
    _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    import os
    import platform
    from datetime import datetime, timezone

    target = os.environ.get("STORYREWRITE_TEST_DURATIONS")
    if not target or exitstatus != 0 or not _DURATIONS or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from storyrewrite.io import write_json_atomic
    from storyrewrite.records import cpu_facts, cpu_features, cpu_name

    slowest = sorted(_DURATIONS.items(), key=lambda item: -item[1])[:15]
    write_json_atomic(target, {
        "tests": len(_DURATIONS), "seconds": round(time.monotonic() - _STARTED, 1),
        "workers": getattr(session.config.option, "numprocesses", None) or 1,
        # The CPU's features beside its name: one cloud CPU name runs the suite at twice the speed of another.
        "machine": f"{cpu_name()}, {cpu_features(cpu_facts())}, Python {platform.python_version()}",
        "when": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "slowest": [{"test": name, "seconds": round(seconds, 1)} for name, seconds in slowest],
    })
