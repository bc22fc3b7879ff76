"""What one stage writes and another reads, typed: one pydantic model per file, used by the writer
and by every reader (the report, the collector, the bench and docs scripts), so that a renamed or
missing field fails where the file is read, naming the file and the field, not at report time
after a run is spent. Torch-free.

| file                                   | written by            | model           |
|----------------------------------------|-----------------------|-----------------|
| reports/train/<system>/metrics.json    | train_nll, train      | TrainingSummary |
| reports/llm/<mode>.json                | llm                   | LLMUsage        |
| reports/stages/<stage>.json            | every model stage     | Record          |
| reports/bench/<script>.json            | bench/<script>.py     | BenchRuns       |

The evaluation's files (reports/metrics/, significance.json, validity.json) have their models in
storyrewrite.metrics.artifacts: the stages that train and generate list this module in their
deps, and a new metric's field here would train and generate everything again.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, RootModel, ValidationError

from storyrewrite.io import InputError, read_text, write_json_atomic

A = TypeVar("A", bound=BaseModel)


class Artifact(BaseModel):
    # A field the model does not know is a renamed one: refused, as a missing one is.
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Open(BaseModel):
    """An artifact that also carries open-ended values beside its named fields."""
    model_config = ConfigDict(extra="allow")


class TrainingSummary(Open):
    """The training run's facts; DVCLive's latest value of every curve sits beside them."""
    objective: str
    label: str
    settings: dict[str, Any] | None
    task: str
    global_step: int
    world_size: int
    device: str
    precision: str
    resumed_from_step: int | None
    best_val_loss: float | None
    best_step: int | None
    best_val_nll: float | None
    start_val_loss: float | None
    main_diagnostics: list[str]
    counterpart: str | None = None  # the system it is tested against head to head (RLOO: DTO of its reward)


class LLMUsage(Artifact):
    mode: str
    mode_label: str
    backend: str
    model: str
    instances: int
    prompts: int
    prompt_tokens: int
    completion_tokens: int
    cut_at_limit: int | None = None  # instances whose ending stopped at llm.max_new_tokens (None: not counted)


class Record(Open):
    """Where a stage ran and what it cost (storyrewrite.records); stage-specific facts beside."""
    stage: str
    device: str
    device_name: str
    cpu_capability: str | None = None  # on a CPU: records.cpu_facts
    cpu_bf16: bool | None = None
    dtype: str | None
    wall_s: float
    items: int | None
    unit: str | None
    items_per_s: float | None
    peak_rss_gb: float | None = None  # GiB (bytes / 2**30), as the other peaks
    peak_cuda_gb: float | None = None  # torch's max_memory_allocated
    peak_cuda_reserved_gb: float | None = None  # torch's max_memory_reserved: its pool, what it held of the GPU
    started_at: str | None = None
    startup_s: float | None = None  # from the process's start to the stage's: interpreter, imports, arguments
    experiment: str | None = None
    compiled_graphs: int | None = None  # torch.compile in the stage (records.compile_counts)
    graph_breaks: int | None = None
    cudagraph_skips: int | None = None  # graphs inductor ran without replaying them as CUDA graphs
    cudagraph_skip_reason: str | None = None
    # A train stage's: train_s, the seconds of its fit (the starting weights' validation included),
    # and validate_s, those of them spent validating.
    train_s: float | None = None
    validate_s: float | None = None


class BenchRun(Open):
    script: str
    command: str
    device: str
    device_name: str
    machine: str
    torch: str
    commit: str
    measured_at: str
    settings: dict[str, Any]
    figures: dict[str, Any]


class BenchRuns(RootModel[dict[str, BenchRun]]):
    """A bench script's latest run per device."""


def read(path: str | Path, model: type[A], text: str | None = None) -> A:
    """The artifact at `path` (or `text` read from it elsewhere), checked; an error names the
    file and the first field that is wrong."""
    try:
        data = json.loads(read_text(path) if text is None else text)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{err.lineno}: malformed JSON ({err.msg})") from None
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        if not field:  # the file as a whole is not of the model's kind (a list, a number)
            raise InputError(f"{path}: {first['msg']}") from None
        if first["type"] == "missing":  # worded as the data readers word a missing field
            raise InputError(f"{path}: missing field `{field}` ({model.__name__})") from None
        what = "not a field of " + model.__name__ if first["type"] == "extra_forbidden" else first["msg"]
        raise InputError(f"{path}: field `{field}`: {what}") from None


def write(path: str | Path, artifact: BaseModel, only_set: bool = False) -> None:
    """The artifact as JSON, atomically: every field (None ones too), or with `only_set` those
    the writer set."""
    write_json_atomic(path, artifact.model_dump(mode="json", by_alias=True, exclude_unset=only_set))
