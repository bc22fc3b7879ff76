"""params.yaml, typed: one pydantic model per section, and the one object the stages read.

`Params.load()` reads params.yaml once; each top-level key is an attribute (`params.seed`,
`params.generate.split`) built and validated the first time a stage reads it, so a stage never
depends on a section it does not read (an invalid `dto` section cannot break NLL training). A bad
key or value stops the stage with one line naming the key (nested ones too), the value and what is
allowed, and exit status 2. `python -m storyrewrite.profiles` checks profiles and overrides.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError,
                      field_validator)

from storyrewrite.io import InputError, read_text

Task = Literal["timetravel", "timetravel_ablated", "art"]
Dtype = Literal["float32", "bfloat16", "float16"]  # a model's weights
Positive = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
MAX_SEED = 2**32 - 1  # the largest seed Lightning takes (numpy: none below 0)
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]

# The Trainer's own values, checked here so that a typo stops `profiles check` and the training
# stage as it starts, with the valid values, rather than Lightning's traceback after the stages
# before it. Written out, not read from Lightning (whose import would cost every stage seconds);
# tests/test_params.py checks them against Lightning's precision type and registries.
LIGHTNING_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true",
                        "transformer-engine", "transformer-engine-float16")
LIGHTNING_PRECISION_ALIASES = {"64": "64-true", "32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}
LIGHTNING_ACCELERATORS = ("auto", "cpu", "cuda", "gpu", "mps", "tpu")
LIGHTNING_STRATEGIES = (
    "auto", "ddp", "ddp_spawn", "ddp_fork", "ddp_notebook", "ddp_find_unused_parameters_false",
    "ddp_find_unused_parameters_true", "ddp_spawn_find_unused_parameters_false",
    "ddp_spawn_find_unused_parameters_true", "ddp_fork_find_unused_parameters_false",
    "ddp_fork_find_unused_parameters_true", "ddp_notebook_find_unused_parameters_false",
    "ddp_notebook_find_unused_parameters_true", "deepspeed", "deepspeed_stage_1", "deepspeed_stage_2",
    "deepspeed_stage_2_offload", "deepspeed_stage_3", "deepspeed_stage_3_offload",
    "deepspeed_stage_3_offload_nvme", "fsdp", "fsdp_cpu_offload", "single_device", "single_xla", "xla_debug",
    "xla", "single_tpu",
)


def _one_of(values: tuple[str, ...], aliases: dict[str, str] | None = None):
    """A validator that passes one of `values` (an alias as the value it stands for), and else
    says which are valid."""
    def check(value: Any) -> str:
        value = (aliases or {}).get(str(value), value)
        if value not in values:
            raise ValueError(f"valid values: {', '.join(values)}" + (f" (or {', '.join(aliases)})" if aliases else ""))
        return value
    return check


def _devices(value: int | str | list[int]) -> int | str | list[int]:
    """Lightning's `devices`: auto, a count (-1: all), or which ones (a list, or "0,1")."""
    if isinstance(value, list):
        ok = bool(value) and all(index >= 0 for index in value)
    elif isinstance(value, int):
        ok = value >= 1 or value == -1
    else:
        ok = value == "auto" or re.fullmatch(r"-1|[1-9][0-9]*|[0-9]+(,[0-9]+)*(,|,[0-9]+)", value.strip()) is not None
    if not ok:
        raise ValueError('valid values: auto, a count (-1: all), a list of device indices or "0,1"')
    return value


def yaml_scalar(value: Any) -> str:
    """`value` as YAML's flow style writes it, as params.yaml and `-S` take it: null, true,
    1.0e-05, bf16-mixed."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def _as_name(value: Any) -> Any:
    """A scalar that YAML or `-S` read as a number, a boolean or null (`objective=1`), as the
    word it was written as, so that the name check says which names are valid rather than
    "Input should be a valid string". A list or a mapping stays as it is, and is refused."""
    return yaml_scalar(value) if value is None or isinstance(value, bool | int | float) else value


# A name looked up among a fixed set of values (here) or in a registry (the objective, an LLM mode).
Name = Annotated[str, BeforeValidator(_as_name)]
Precision = Annotated[str, BeforeValidator(_one_of(LIGHTNING_PRECISIONS, LIGHTNING_PRECISION_ALIASES))]
Accelerator = Annotated[Name, AfterValidator(_one_of(LIGHTNING_ACCELERATORS))]
Strategy = Annotated[Name, AfterValidator(_one_of(LIGHTNING_STRATEGIES))]
Devices = Annotated[int | str | list[Annotated[int, Field(ge=0)]], AfterValidator(_devices)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True)


class BundledFile(Section):
    path: str  # relative to the bundled data directory
    sha256: str


class BundledSource(Section):
    files: dict[str, BundledFile]  # raw name (relative to data/raw) -> the committed file


class Archive(Section):
    url: str
    members: dict[str, str]  # raw name -> file name inside the zip (matched on its last path component)
    sha256: dict[str, str] = {}  # raw name -> expected sha256, where one is published


class UrlSource(Section):
    archives: dict[str, Archive]


class DownloadConfig(Section):
    """`download`: where the raw files come from (storyrewrite.data.sources)."""
    source: Literal["bundled", "url"] = "bundled"
    bundled: BundledSource
    url: UrlSource


class DataConfig(Section):
    """`data`: splits and subsets (storyrewrite.data.prepare)."""
    val_fraction: float = Field(gt=0, lt=1)
    max_train: Positive | None = None  # at most this many instances, whole stories, seeded
    max_eval: Positive | None = None  # the same for val and test


class ModelsConfig(Section):
    """`models`: model specs (storyrewrite.models.specs and .roles) and token budgets."""
    generator: str
    scorer: str
    max_input_tokens: Positive
    max_output_tokens: Positive
    # Evaluation models (the eval_models stage); null leaves their metrics out
    judge: str | None = None  # causal LM of CF-PMI
    embedder: str | None = None  # sentence encoder of drift similarity
    nli: str | None = None  # NLI classifier of EntScore / HMean
    bertscore: str | None = None  # encoder of BERTScore (storyrewrite.metrics.bertscore)


def _batch_limit(value: object) -> object:
    """`limit_val_batches` as the Lightning Trainer takes it: a share of the batches (0 to 1) or
    a whole number of them; checked here, before the stage starts, rather than by the Trainer."""
    if value is None or (type(value) in (int, float) and (0 <= value <= 1 or (value > 1 and value % 1 == 0))):
        return value
    raise ValueError("must be a share of the batches from 0.0 to 1.0, a whole number of them, or null (all)")


BatchLimit = Annotated[int | float | None, BeforeValidator(_batch_limit)]


class TrainConfig(Section):
    """`train_nll` and `train`: the same shape (NLL warm-up, then the objective's fine-tuning)."""
    batch_size: Positive  # instances per training step (per device)
    max_steps: int  # -1: train for max_epochs
    max_epochs: int  # used where max_steps is -1
    lr: PositiveFloat  # AdamW's learning rate (constant after the warm-up, as in the paper)
    weight_decay: float = Field(ge=0)  # AdamW's decoupled weight decay
    warmup_steps: int = Field(ge=0)  # linear warm-up to lr over this many steps
    val_check_interval: Positive  # validate every this many training batches
    checkpoint_every_n_steps: Positive  # save the resumable last.ckpt this often
    resume: bool  # continue an interrupted run from last.ckpt when it is the same run
    accelerator: Accelerator  # Lightning Trainer arguments, checked against its values ("auto": a CUDA GPU, else the CPU)
    devices: Devices  # Lightning's: auto, a count (-1: all), or which ones ([0, 1] or "0,1")
    strategy: Strategy  # Lightning's: auto, ddp, fsdp, ...
    precision: Precision  # Lightning's: 32-true, bf16-mixed, 16-mixed, ... (an alias, bf16, as bf16-mixed)
    gradient_clip_val: PositiveFloat | None = None  # clip the gradient norm to this (None: no clipping)
    num_nodes: Positive = 1  # machines (Lightning's)
    accumulate_grad_batches: Positive = 1  # batches summed per optimiser step
    limit_val_batches: BatchLimit = None  # validate on this many batches (or this share); None: all
    # Instances per validation batch; None: batch_size. Validation keeps no activations for a
    # gradient, and RLOO's decodes a token at a time: on a GPU fewer, larger batches take less time
    val_batch_size: Positive | None = None
    num_workers: int = Field(0, ge=0)
    validate_at_start: bool = True  # validate the starting weights (the curves' step 0) before training
    # torch.compile the generator's (and a DTO scorer's) transformer body: for a GPU, where an
    # eager step of a small model waits on kernel launches; no faster on the CPU. true: inductor's
    # default mode; reduce-overhead: its kernels replayed as CUDA graphs, one per batch shape
    compile: bool | Literal["reduce-overhead"] = False
    # Length buckets: pad sources and targets to a multiple of this many tokens, so that a
    # compiled step sees a few shapes (CUDA graphs: one each); None pads to the batch's longest
    pad_to_multiple_of: Positive | None = None
    # Unlike the top-level `seed`, a section's own leaves the data, the splits, the models' starting
    # points and the bootstrap as they are: runs that differ in it alone measure the spread that
    # training randomness gives (`-S 'train.seed=1,2'`).
    seed: Seed | None = None  # this run's batch order, dropout and noise (DTO's, RLOO's samples); None: the top-level seed

    @field_validator("max_steps")
    @classmethod
    def _steps(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError("must be -1 (train for max_epochs) or > 0")
        return value

    @field_validator("max_epochs")
    @classmethod
    def _epochs(cls, value: int, info) -> int:
        if info.data.get("max_steps") == -1 and value < 1:
            raise ValueError("must be >= 1 where max_steps is -1")
        return value


class GenerateConfig(Section):
    """`generate`: decoding of the trained systems' predictions."""
    batch_size: Positive
    num_beams: Positive  # 1 = greedy
    max_new_tokens: Positive
    split: Literal["val", "test"] = "test"
    dtype: Dtype = "float32"  # the model's weights while generating
    cache: Literal["dynamic", "static"] = "dynamic"  # the KV cache (static: fixed-size, GPU)


class ScoreConfig(Section):
    """`score`: the LM scorer (BARTScore), the judge of CF-PMI and BERTScore."""
    batch_size: Positive  # pairs per forward pass
    dtype: Dtype = "float32"  # the scorer's and the judge's weights
    # float32 matrix products on a CUDA GPU (models.device.set_fp32_matmul): ieee, exact; tf32,
    # TensorFloat-32 tensor cores (Ampere and newer), inputs rounded to 10 mantissa bits
    fp32_matmul: Literal["ieee", "tf32"] = "ieee"
    bertscore_layer: Positive | None = None  # BERTScore's layer; None: bert_score's default for the model
    bertscore_rescale: bool = False  # rescale BERTScore with bert_score's baseline for the model


class SignificanceConfig(Section):
    baseline: str  # the system every other one is tested against
    n_resamples: Positive
    alpha: float = Field(gt=0, lt=1)  # the level marked in the report
    unit: Literal["instance", "story"] = "instance"  # what the bootstrap resamples


class ReportConfig(Section):
    examples: Positive  # qualitative examples shown


class OpenAISettings(Section):
    base_url: str
    model: str
    api_key_env: str  # the *name* of the environment variable holding the key
    timeout: PositiveFloat  # seconds per request
    max_retries: int = Field(ge=0)  # the client's own retries (429, 5xx, timeouts, dropped connections)
    concurrency: Positive  # requests in flight at once


class LLMConfig(Section):
    """`llm`: the LLM baselines (modes are checked against storyrewrite.llm.modes by the llm stage)."""
    modes: list[Name]  # the prompting modes run as DVC stages
    templates: dict[Task, str]  # task -> template file
    temperature: float = Field(ge=0)
    max_new_tokens: Positive
    fixed_example_id: dict[Task, str | None]  # task -> training instance id for one_shot_fixed (None: the first)
    local_batch_size: Positive
    openai: OpenAISettings
    backend: Literal["local", "openai"] = "local"
    local_dtype: Dtype = "float32"  # the local chat model's weights


Device = Annotated[str, Field(pattern=r"^(auto|cpu|cuda(:\d+)?)$")]

# Every top-level key every stage knows, and its type, in params.yaml's order. The objectives'
# settings sections (`dto`, `cpo`, `rl`: storyrewrite.objectives.registry.SETTINGS) are not here:
# a new objective adds its section to the registry, and params.py, a code dep of every stage,
# stays as it was (nothing reruns but `train`).
SECTIONS: dict[str, Any] = {
    "seed": Seed, "task": Task, "objective": Name, "device": Device, "download": DownloadConfig, "data": DataConfig,
    "models": ModelsConfig, "train_nll": TrainConfig, "train": TrainConfig, "generate": GenerateConfig,
    "score": ScoreConfig, "significance": SignificanceConfig, "report": ReportConfig, "llm": LLMConfig,
}


def _valid_keys(kind: Any, loc: tuple) -> list[str]:
    """The keys the model at `loc` inside `kind` accepts, by their params names."""
    for part in loc[:-1]:
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            kind = next((f.annotation for n, f in kind.model_fields.items() if (f.alias or n) == part), kind)
        elif getattr(kind, "__origin__", None) is dict:
            kind = kind.__args__[1]
    return [f.alias or n for n, f in kind.model_fields.items()] if isinstance(kind, type) and issubclass(kind, BaseModel) else []


# The parts of a pydantic error's location that name a validator or a member of a union (`bool |
# Literal["reduce-overhead"]` fails as `compile.bool` and `compile.literal['reduce-overhead']`), not a key.
UNION_MEMBERS = ("bool", "int", "float", "str")


def _key_path(loc: tuple) -> tuple:
    return tuple(part for part in loc if not (str(part).startswith(("function-", "literal[")) or part in UNION_MEMBERS))


def _union_values(errors: list[dict]) -> str | None:
    """A union of booleans and literals that refused a value: its valid values, each member's; else None."""
    values = []
    for error in errors:
        if error["type"] in ("bool_parsing", "bool_type"):
            values += ["true", "false"]
        elif error["type"] == "literal_error":
            values.append(error["ctx"]["expected"])
        else:
            return None
    return f"valid values: {', '.join(values)}" if len(errors) > 1 else None


def build(kind: Any, value: Any, key: str) -> Any:
    """`value` validated as `kind` (a section's model or a scalar type); the first error as one
    line naming the key (`key` and the nested path), the value and what is allowed."""
    try:
        return TypeAdapter(kind).validate_python(value)
    except ValidationError as error:
        # A typo is a missing key and an unknown one: name the one the user wrote.
        first = next((e for e in error.errors() if e["type"] == "extra_forbidden"), error.errors()[0])
        loc = _key_path(first["loc"])
        where = key + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)
        if first["type"] == "extra_forbidden":
            raise InputError(f"params: unknown key `{where}`; valid keys: {', '.join(_valid_keys(kind, loc))}", key=where) from None
        if first["type"] == "missing":
            raise InputError(f"params: missing key `{where}`", key=where) from None
        allowed = "valid values: auto, cpu, cuda, cuda:N" if first["type"] == "string_pattern_mismatch" else first["msg"]
        allowed = _union_values([e for e in error.errors() if _key_path(e["loc"]) == loc]) or allowed
        raise InputError(f"params: `{where}` = {first['input']!r}: {allowed.removeprefix('Value error, ')}", key=where) from None


class Params:
    """The whole of params.yaml; each top-level key is an attribute, built on first read.

    `settings`: the objectives' sections (storyrewrite.objectives.registry.SETTINGS), given by
    the code that knows the objectives (the train stage, `profiles check`). Without them, a
    top-level mapping outside SECTIONS is taken for an objective's section, left unread and
    unchecked; a top-level scalar outside SECTIONS is an error everywhere."""

    def __init__(self, raw: dict, source: str = "params.yaml", settings: dict[str, type[Section]] | None = None):
        if not isinstance(raw, dict):
            raise InputError(f"{source}: expected a mapping of sections at the top level")
        # params.yaml's order: the objectives' sections follow `train`, the section they tune
        before = list(SECTIONS)[:list(SECTIONS).index("train") + 1]
        self.kinds = {**{k: SECTIONS[k] for k in before}, **(settings or {}), **SECTIONS}
        unknown = sorted(k for k in set(raw) - set(self.kinds) if settings is not None or not isinstance(raw[k], dict))
        if unknown:
            valid = ", ".join(self.kinds) if settings is not None else f"{', '.join(SECTIONS)}, or an objective's section (a mapping)"
            raise InputError(f"params: unknown key(s) {', '.join(f'`{k}`' for k in unknown)} in {source}; valid keys: {valid}",
                             key=unknown[0])  # the first one's line is named (storyrewrite.errors.locate)
        self.raw, self.source, self.built = raw, source, {}

    @classmethod
    def load(cls, path: str | Path = "params.yaml", settings: dict[str, type[Section]] | None = None) -> "Params":
        return cls(load_yaml(path), str(path), settings)

    def section(self, name: str) -> Any:
        """The key `name` (for code that is told which section to read, e.g. `--section train`)."""
        if name not in self.kinds:
            raise InputError(f"params: no section `{name}`; valid: {', '.join(self.kinds)}")
        if name not in self.built:
            if name not in self.raw:
                raise InputError(f"params: missing key `{name}` in {self.source}", key=name)
            self.built[name] = build(self.kinds[name], self.raw[name], name)
        return self.built[name]

    def __getattr__(self, name: str) -> Any:
        if name in self.__dict__.get("kinds", SECTIONS):
            return self.section(name)
        raise AttributeError(name)

    def errors(self) -> list[InputError]:
        """Build every section; every error found, not only the first. (The names a stage looks
        up in a registry, `objective` and `llm.modes`, are checked by the stage that reads them
        and by storyrewrite.profiles, which imports the registries.)"""
        errors = []
        for name in self.kinds:
            try:
                self.section(name)
            except InputError as error:
                errors.append(error)
        return errors

    def check_all(self) -> None:
        """`errors()` as one InputError, a line each."""
        if errors := self.errors():  # printed as `error: ...` by run_stage: every line reads the same
            raise InputError("\nerror: ".join(map(str, errors)))


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


def overlay(base: dict, changes: dict, where: str = "", strict: bool = True, source: str = "profile") -> dict:
    """`base` with the keys of `changes` replaced, section by section. `strict`: a key that
    `base` does not have is an error naming `source` (the profile's file) and the keys `base` has
    there (a profile only changes settings, it never invents them)."""
    merged = dict(base)
    for key, value in changes.items():
        name = f"{where}.{key}" if where else key
        if strict and key not in base:
            raise InputError(f"{source}: unknown key `{name}`; valid keys{f' in `{where}`' if where else ''}: {', '.join(base)}",
                             key=name)
        nested = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = overlay(merged[key], value, name, strict, source) if nested else value
    return merged


def leaves(tree: dict, prefix: str = ""):
    """(dotted key, value) of every leaf of a nested dict: {a: {b: 1}} -> ("a.b", 1)."""
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def unparsable_override(overrides: list[str], error: Exception) -> InputError:
    """The error for `-S` overrides that Hydra's override grammar (which DVC's `-S` reads) cannot
    parse: the one it fails on, Hydra's reason, and the fix where the value is the cause (a model
    directory's `~`, a `#`): the value quoted, as the grammar takes any text."""
    from dvc.utils.hydra import to_hydra_overrides
    from hydra.errors import OverrideParseException

    override = " ".join(overrides)
    for each in overrides:  # Hydra's message names the override in some of its forms only
        try:
            to_hydra_overrides([each])
        except OverrideParseException as own:
            override, error = each, own
            break
    lines = str(error).splitlines()
    reason = lines[0].removesuffix(f": {override}")
    if reason == "LexerNoViableAltException" and len(lines) > 1 and "^" in lines[1]:  # a line with ^ under the character
        at = lines[1].index("^")
        reason = f"no token starts at `{lines[0][at]}`" if at < len(lines[0]) else reason
    key, equals, value = override.partition("=")
    # A value in the grammar's own syntax (a list, a dict, a sweep: [...], {...}, choice(...)) is
    # not text to quote.
    quoted = f"; quote the value: -S \"{key}='{value}'\"" if equals and value and "'" not in value \
        and re.fullmatch(r"\+{0,2}[A-Za-z_][\w.]*", key) and not value.startswith(('"', "[", "{")) and "(" not in value else ""
    return InputError(f"-S {override}: not an override DVC's -S can read (Hydra's override grammar: {reason}; "
                      f"https://hydra.cc/docs/advanced/override_grammar/basic){quoted}")


def with_overrides(params: dict, overrides: list[str]) -> list[tuple[str, dict]]:
    """`params` as `dvc exp run -S OVERRIDE ...` would leave them: one (label, params) per
    experiment, several where an override is a sweep (`objective=choice(score,delta)`, which
    `--queue` expands). DVC's own functions parse and apply them (Hydra's override grammar), so
    the check reads the values as the experiment will; a key params.yaml lacks is refused here as
    DVC refuses it, with the keys valid there."""
    if not overrides:
        return [("", params)]
    import tempfile

    from dvc.exceptions import InvalidArgumentError
    from dvc.utils.cli_parse import to_path_overrides
    from dvc.utils.hydra import apply_overrides, get_hydra_sweeps, to_hydra_overrides
    from hydra.errors import OverrideParseException

    by_file = to_path_overrides(overrides)
    if other := sorted(set(by_file) - {"params.yaml"}):
        raise InputError(f"-S: only params.yaml's keys are checked, not {', '.join(other)}'s")
    try:
        parsed = to_hydra_overrides(by_file["params.yaml"])
    except OverrideParseException as error:
        raise unparsable_override(by_file["params.yaml"], error) from None
    for override in parsed:
        if override.is_add() or override.is_delete():
            continue  # `+key=...` adds a key, `~key` removes one: the sections' check judges the result
        where, tree = "", params
        for part in override.key_or_group.split("."):
            if not isinstance(tree, dict) or part not in tree:
                valid = f" in `{where}`" if where else ""
                keys = ", ".join(tree) if isinstance(tree, dict) else f"none (`{where}` is a value)"
                raise InputError(f"-S {override.input_line}: unknown key `{override.key_or_group}`; valid keys{valid}: {keys}")
            where, tree = f"{where}.{part}" if where else part, tree[part]
    sweep = any(override.is_sweep_override() for override in parsed)
    experiments = []
    for each in get_hydra_sweeps(by_file) if sweep else [by_file]:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "params.yaml"
            path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
            try:
                apply_overrides(path, each["params.yaml"])
            except InvalidArgumentError as error:
                raise InputError(f"-S: {str(error.__cause__ or error).splitlines()[0]}") from None
            experiments.append((" ".join(f"-S {item}" for item in each["params.yaml"]), load_yaml(path)))
    return experiments
