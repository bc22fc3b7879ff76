"""params.yaml, typed: the schema of every setting, and the one object the stages read.

`Params.load()` reads params.yaml once; each top-level key is an attribute (`params.seed`,
`params.generate.split`, `params.llm.openai.model`) typed by the dataclasses below, which
follow params.yaml section by section. A key is built and checked the first time a stage reads
it, so a stage never depends on a section it does not read (dvc.yaml lists, per stage, the params
it reads: an invalid `dto` section cannot break NLL training). An unknown key, a missing key, a
value of the wrong type or outside its valid choices is an error that names the key, nested
containers included (`download.bundled.files.<name>.path`), and what is allowed.

    python -m storyrewrite.params check [PROFILE ...]      # validate every section (with profiles)
    python -m storyrewrite.params overrides PROFILE [...]  # the profiles as `dvc exp run -S` flags
    python -m storyrewrite.params apply PROFILE [...]      # write the profiles into params.yaml
"""
from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml

from storyrewrite.io import InputError, read_text

TASKS = ("timetravel", "timetravel_ablated", "art")
DTYPES = ("float32", "bfloat16", "float16")

T = TypeVar("T")


def choices(*values: str, default: Any = dataclasses.MISSING) -> Any:
    """A dataclass field whose value must be one of `values`."""
    return dataclasses.field(default=default, metadata={"choices": values})


def positive(where: str, **values: float | int | None) -> None:
    for name, value in values.items():
        if value is not None and value <= 0:
            raise InputError(f"params: `{where}.{name}` = {value!r} must be > 0")


# --- the sections, in params.yaml's order ------------------------------------------------------


@dataclass(frozen=True)
class BundledFile:
    path: str  # relative to the bundled data directory
    sha256: str


@dataclass(frozen=True)
class BundledSource:
    files: dict[str, BundledFile]  # raw name (relative to data/raw) -> the committed file


@dataclass(frozen=True)
class Archive:
    url: str
    members: dict[str, str]  # raw name -> file name inside the zip (matched on its last path component)
    sha256: dict[str, str] = field(default_factory=dict)  # raw name -> expected sha256, where one is published


@dataclass(frozen=True)
class UrlSource:
    archives: dict[str, Archive]


@dataclass(frozen=True)
class DownloadConfig:
    """`download`: where the raw files come from (see storyrewrite.data.sources)."""

    bundled: BundledSource
    url: UrlSource
    source: str = choices("bundled", "url")


@dataclass(frozen=True)
class DataConfig:
    """`data`: splits and subsets (see storyrewrite.data.prepare)."""

    val_fraction: float
    max_train: int | None = None  # at most this many instances, whole stories, seeded
    max_eval: int | None = None  # the same for val and test

    def check(self, where: str) -> None:
        positive(where, max_train=self.max_train, max_eval=self.max_eval)
        if not 0 < self.val_fraction < 1:
            raise InputError(f"params: `{where}.val_fraction` = {self.val_fraction} must be in (0, 1)")


@dataclass(frozen=True)
class ModelsConfig:
    """`models`: model specs (see storyrewrite.models.specs and .roles) and token budgets."""

    generator: str
    scorer: str
    max_input_tokens: int
    max_output_tokens: int
    # Evaluation models (the eval_models stage); null leaves their metrics out
    judge: str | None = None  # causal LM of CF-PMI
    embedder: str | None = None  # sentence encoder of drift similarity
    nli: str | None = None  # NLI classifier of EntScore / HMean

    def check(self, where: str) -> None:
        positive(where, max_input_tokens=self.max_input_tokens, max_output_tokens=self.max_output_tokens)


@dataclass(frozen=True)
class TrainConfig:
    """`train_nll` and `train`: the same shape (NLL warm-up, then the objective's fine-tuning)."""

    batch_size: int
    max_steps: int  # -1: train for max_epochs
    max_epochs: int
    lr: float
    weight_decay: float
    warmup_steps: int
    val_check_interval: int  # validate every this many training batches
    checkpoint_every_n_steps: int  # save the resumable last.ckpt this often
    resume: bool  # continue an interrupted run from last.ckpt when it is the same run
    accelerator: str  # Lightning Trainer arguments, passed through ("auto" picks a GPU)
    devices: int | str
    strategy: str
    precision: str
    gradient_clip_val: float | None = None  # clip the gradient norm to this (None: no clipping)
    num_nodes: int = 1
    accumulate_grad_batches: int = 1
    limit_val_batches: int | float | None = None
    num_workers: int = 0
    validate_at_start: bool = True  # validate the starting weights (the curves' step 0) before training
    # torch.compile the generator's (and a DTO scorer's) transformer body: for a GPU, where an
    # eager step of a small model waits on kernel launches; no faster on the CPU (see README)
    compile: bool = False

    def check(self, where: str) -> None:
        positive(
            where, batch_size=self.batch_size, lr=self.lr, val_check_interval=self.val_check_interval,
            checkpoint_every_n_steps=self.checkpoint_every_n_steps, num_nodes=self.num_nodes,
            accumulate_grad_batches=self.accumulate_grad_batches, gradient_clip_val=self.gradient_clip_val,
        )
        if self.max_steps == -1 and self.max_epochs < 1:
            raise InputError(f"params: `{where}.max_steps` is -1, so `{where}.max_epochs` must be >= 1")
        if self.max_steps == 0 or self.max_steps < -1:
            raise InputError(f"params: `{where}.max_steps` = {self.max_steps} must be -1 or > 0")


@dataclass(frozen=True)
class DTOConfig:
    """`dto`: differentiable training objectives (objective score | delta | score_delta)."""

    tau: float  # Gumbel-softmax temperature (paper: 1.0, no annealing)
    hard: bool  # straight-through one-hot samples instead of soft ones (paper: soft)
    scorer_dtype: str = choices(*DTYPES, default="float32")

    def check(self, where: str) -> None:
        positive(where, tau=self.tau)


@dataclass(frozen=True)
class CPOConfig:
    """`cpo` (paper grid: beta ∈ {0.1, 0.5, 1, 2}, lambda ∈ {0.5, 1, 2})."""

    beta: float
    lambda_: float = field(metadata={"key": "lambda"})  # `lambda` is a Python keyword

    def check(self, where: str) -> None:
        positive(where, beta=self.beta)
        if self.lambda_ < 0:
            raise InputError(f"params: `{where}.lambda` = {self.lambda_} must be >= 0")


@dataclass(frozen=True)
class GenerateConfig:
    """`generate`: decoding of the trained systems' predictions."""

    batch_size: int
    num_beams: int  # 1 = greedy
    max_new_tokens: int
    split: str = choices("val", "test", default="test")
    dtype: str = choices(*DTYPES, default="float32")  # the model's weights while generating
    cache: str = choices("dynamic", "static", default="dynamic")  # the KV cache (static: fixed-size, GPU)

    def check(self, where: str) -> None:
        positive(where, batch_size=self.batch_size, num_beams=self.num_beams, max_new_tokens=self.max_new_tokens)


@dataclass(frozen=True)
class ScoreConfig:
    """`score`: the LM scorer (BARTScore)."""

    batch_size: int  # pairs per forward pass
    dtype: str = choices(*DTYPES, default="float32")  # the scorer's weights

    def check(self, where: str) -> None:
        positive(where, batch_size=self.batch_size)


@dataclass(frozen=True)
class SignificanceConfig:
    baseline: str  # the system every other one is tested against
    n_resamples: int
    alpha: float  # the level marked in the report
    unit: str = choices("instance", "story", default="instance")  # what the bootstrap resamples

    def check(self, where: str) -> None:
        positive(where, n_resamples=self.n_resamples, alpha=self.alpha)


@dataclass(frozen=True)
class ReportConfig:
    examples: int  # qualitative examples shown

    def check(self, where: str) -> None:
        positive(where, examples=self.examples)


@dataclass(frozen=True)
class OpenAISettings:
    base_url: str
    model: str
    api_key_env: str  # the *name* of the environment variable holding the key
    timeout: float
    max_retries: int
    initial_delay: float
    max_delay: float
    concurrency: int  # requests in flight at once

    def check(self, where: str) -> None:
        positive(where, timeout=self.timeout, concurrency=self.concurrency)


@dataclass(frozen=True)
class LLMConfig:
    """`llm`: the LLM baselines (modes are checked against storyrewrite.llm.modes by the llm stage)."""

    modes: list[str]  # the prompting modes run as DVC stages
    templates: dict[str, str]  # task -> template file
    temperature: float
    max_new_tokens: int
    fixed_example_id: dict[str, str | None]  # task -> training instance id for one_shot_fixed (None: the first)
    local_batch_size: int
    openai: OpenAISettings
    backend: str = choices("local", "openai", default="local")
    local_dtype: str = choices(*DTYPES, default="float32")  # the local chat model's weights

    def check(self, where: str) -> None:
        positive(where, max_new_tokens=self.max_new_tokens, local_batch_size=self.local_batch_size)
        for mapping in ("templates", "fixed_example_id"):
            unknown = sorted(set(getattr(self, mapping)) - set(TASKS))
            if unknown:
                raise InputError(f"params: unknown key `{where}.{mapping}.{unknown[0]}`; valid keys: {', '.join(TASKS)}")


def check_device(value: str, where: str) -> None:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", value):
        raise InputError(f"params: `{where}` = {value!r} is not valid; valid values: auto, cpu, cuda, cuda:N")


# --- the root ----------------------------------------------------------------------------------


class Key(Generic[T]):
    """One top-level key of params.yaml: built from its raw value and checked on first read."""

    def __init__(self, annotation: type[T], choices: tuple[str, ...] | None = None, check=None):
        self.annotation, self.choices, self.check = annotation, choices, check

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, params: "Params | None", owner: type | None = None) -> T:
        if params is None:
            return self  # type: ignore[return-value]
        if self.name not in params.built:
            if self.name not in params.raw:
                raise InputError(f"params: missing key `{self.name}` in {params.source}")
            value = build_value(self.annotation, params.raw[self.name], self.name)
            if self.choices is not None and value not in self.choices:
                raise InputError(f"params: `{self.name}` = {value!r} is not valid; valid values: {', '.join(self.choices)}")
            if self.check is not None:
                self.check(value, self.name)
            params.built[self.name] = value
        return params.built[self.name]


class Params:
    """The whole of params.yaml; each attribute is one top-level key."""

    seed = Key(int)
    task = Key(str, choices=TASKS)
    objective = Key(str)  # the `train` stage's objective: checked against storyrewrite.objectives
    device = Key(str, check=check_device)  # generation, scoring, LLM, retrieval: auto | cpu | cuda[:N]
    download = Key(DownloadConfig)
    data = Key(DataConfig)
    models = Key(ModelsConfig)
    train_nll = Key(TrainConfig)
    train = Key(TrainConfig)
    dto = Key(DTOConfig)
    cpo = Key(CPOConfig)
    generate = Key(GenerateConfig)
    score = Key(ScoreConfig)
    significance = Key(SignificanceConfig)
    report = Key(ReportConfig)
    llm = Key(LLMConfig)

    def __init__(self, raw: dict, source: str = "params.yaml"):
        if not isinstance(raw, dict):
            raise InputError(f"{source}: expected a mapping of sections at the top level")
        unknown = sorted(set(raw) - set(self.keys()))
        if unknown:
            raise InputError(f"params: unknown key(s) {', '.join(f'`{k}`' for k in unknown)} in {source}; "
                             f"valid keys: {', '.join(self.keys())}")
        self.raw, self.source, self.built = raw, source, {}

    @classmethod
    def keys(cls) -> list[str]:
        return [name for name, value in vars(cls).items() if isinstance(value, Key)]

    @classmethod
    def load(cls, path: str | Path = "params.yaml") -> "Params":
        return cls(load_yaml(path), str(path))

    def section(self, name: str) -> Any:
        """The key `name` (for code that is told which section to read, e.g. `--section train`)."""
        if name not in self.keys():
            raise InputError(f"params: no section `{name}`; valid: {', '.join(self.keys())}")
        return getattr(self, name)

    def check_all(self) -> None:
        for name in self.keys():
            getattr(self, name)


# --- building typed values ---------------------------------------------------------------------


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: params file not found")
    try:
        params = yaml.safe_load(read_text(path))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise InputError(f"{where}: invalid YAML ({getattr(err, 'problem', None) or err})") from None
    if not isinstance(params, dict):
        raise InputError(f"{path}: expected a mapping of sections at the top level")
    return params


def _type_ok(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is float:  # YAML writes 1e-5 as a string unless it has a dot; accept ints too
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _coerce_float(value: Any, annotation: Any) -> Any:
    # PyYAML reads "5e-9" (no dot) as a string; a researcher writes it that way all the time.
    if isinstance(value, str) and float in (annotation, *typing.get_args(annotation)):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is dict:
        return "a mapping"
    if origin is list:
        return "a list"
    if dataclasses.is_dataclass(annotation):
        return "a mapping"
    return "null" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def build_value(annotation: Any, value: Any, key: str) -> Any:
    """`value` as `annotation` (a dataclass, dict[str, X], list[X] or a scalar type); `key` names
    it in errors."""
    if dataclasses.is_dataclass(annotation):
        return build(annotation, value, key)
    origin = typing.get_origin(annotation)
    if origin is dict:
        if not isinstance(value, dict):
            raise InputError(f"params: `{key}` must be a mapping, got {type(value).__name__}")
        item = typing.get_args(annotation)[1]
        return {name: build_value(item, v, f"{key}.{name}") for name, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise InputError(f"params: `{key}` must be a list, got {type(value).__name__}")
        item = typing.get_args(annotation)[0]
        return [build_value(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
    value = _coerce_float(value, annotation)
    if not _type_ok(value, annotation):
        raise InputError(f"params: `{key}` = {value!r} has the wrong type; expected {_type_name(annotation)}")
    return value


def build(cls: type[T], values: Any, where: str) -> T:
    """Dataclass `cls` from the mapping `values`; `where` names the section in errors."""
    if not isinstance(values, dict):
        raise InputError(f"params: `{where}` must be a mapping, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    # A field may be spelled differently in params (`lambda` is a Python keyword: field `lambda_`).
    fields = {f.metadata.get("key", f.name): f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise InputError(
            f"params: unknown key(s) {', '.join(f'`{where}.{k}`' for k in unknown)}; valid keys: {', '.join(fields)}"
        )
    kwargs = {}
    for name, spec in fields.items():
        key = f"{where}.{name}" if where else name
        if name not in values:
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                raise InputError(f"params: missing key `{key}`")
            continue
        value = build_value(hints[spec.name], values[name], key)
        allowed = spec.metadata.get("choices")
        if allowed is not None and value not in allowed:
            raise InputError(f"params: `{key}` = {value!r} is not valid; valid values: {', '.join(allowed)}")
        kwargs[spec.name] = value
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if check is not None:
        check(where)
    return obj


# --- profiles ----------------------------------------------------------------------------------


def overlay(base: dict, changes: dict, where: str = "") -> dict:
    """`base` with the keys of `changes` replaced, section by section. A key that `base` does
    not have is an error: a profile only changes settings, it never invents them."""
    merged = dict(base)
    for key, value in changes.items():
        name = f"{where}.{key}" if where else key
        if key not in base:
            raise InputError(f"profile: unknown key `{name}`")
        merged[key] = overlay(base[key], value, name) if isinstance(value, dict) and isinstance(base[key], dict) else value
    return merged


def leaves(tree: dict, prefix: str = ""):
    """(dotted key, value) of every leaf of a nested dict: {a: {b: 1}} -> ("a.b", 1)."""
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _yaml_scalar(value: Any) -> str:
    # How YAML spells the value (null, 1.0e-05, bf16-mixed, [a, b]), as `dvc exp run -S` parses it.
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def main(argv: list[str] | None = None) -> None:
    """Profiles are overlays of params.yaml (params/gpu.yaml, params/paper.yaml), applied in the
    order given: `check` validates every section of the result, `overrides` prints it as
    `-S key=value` flags for `dvc exp run`, `apply` writes it into params.yaml."""
    import argparse
    import shlex

    from storyrewrite.io import run_stage, write_text_atomic

    parser = argparse.ArgumentParser(prog="python -m storyrewrite.params", description=main.__doc__)
    parser.add_argument("action", choices=("check", "overrides", "apply"))
    parser.add_argument("profiles", type=Path, nargs="*")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    args = parser.parse_args(argv)

    def run() -> None:
        merged, changes = load_yaml(args.params), {}
        for profile in args.profiles:
            layer = load_yaml(profile)
            merged, changes = overlay(merged, layer), overlay_changes(changes, layer)
        Params(merged, " + ".join(map(str, [args.params, *args.profiles]))).check_all()
        if args.action == "apply":
            write_text_atomic(args.params, yaml.safe_dump(merged, sort_keys=False))
        elif args.action == "overrides":
            print(" ".join(f"-S {shlex.quote(f'{key}={_yaml_scalar(value)}')}" for key, value in leaves(changes)))
        else:
            print(f"ok: {' + '.join(map(str, [args.params, *args.profiles]))}")

    run_stage(run)


def overlay_changes(changes: dict, layer: dict) -> dict:
    """The union of two profiles' changes, the later one winning (no key check: both are checked
    against params.yaml by `overlay`)."""
    merged = dict(changes)
    for key, value in layer.items():
        merged[key] = overlay_changes(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


if __name__ == "__main__":
    main()
