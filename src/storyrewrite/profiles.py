"""Profiles and overrides from the command line, as `dvc exp run` takes them:

    python -m storyrewrite.profiles check [PROFILE ...] [-S KEY=VALUE ...] [--elsewhere]
    python -m storyrewrite.profiles overrides [PROFILE ...] [-S KEY=VALUE ...]
    python -m storyrewrite.profiles get [PROFILE ...] --key KEY

A module apart from storyrewrite.params, which every stage imports: this one also imports the
objective and LLM-mode registries and the model catalogue, to check the names `objective`,
`llm.modes` and the `bundled:`/`tiny:` model specs look up, and the models that a local
directory or a hub name in the Hugging Face cache holds (their configs and tokenizers: then it
imports transformers).
"""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from storyrewrite.errors import line_setting, locate
from storyrewrite.io import InputError, run_cli
from storyrewrite.llm.modes import get_mode
from storyrewrite.llm.prompts import template_path
from storyrewrite.models.catalogue import ROLES, check_specs, local_models
from storyrewrite.objectives.registry import SETTINGS, get_objective, reads_section
from storyrewrite.params import Params, leaves, load_yaml, overlay, with_overrides, yaml_scalar
from storyrewrite.records import cpu_has_bf16
from storyrewrite.systems import TRAIN_STAGES, pipeline_systems


def check_registered_names(params: Params) -> list[InputError]:
    """The errors in the names a stage looks up in a registry: `objective` (for the task),
    `llm.modes` (and the task's prompt template, a file), `significance.baseline` (a system of
    the run), and the models that `bundled:` and `tiny:` specs name, or that a directory or a
    cached hub name holds (each fit for its role, the generator's and the scorer's of one
    vocabulary; a hub name not cached is left to its stage). A look-up whose sections do not
    validate is left out: Params.errors names them, and the other look-ups still run, so that one
    check names every error."""
    def built(*names: str) -> list[Any] | None:
        try:
            return [params.section(name) for name in names]
        except InputError:
            return None

    look_ups = []
    if (sections := built("objective", "task")) is not None:
        look_ups.append(lambda: get_objective(*sections, lambda name: (built(name) or [None])[0]))
    if (llm := built("llm")) is not None:
        look_ups += [lambda name=name: get_mode(name) for name in llm[0].modes]
    if (prompted := built("llm", "task")) is not None and prompted[0].modes:
        look_ups.append(lambda: template_path(prompted[0].templates, prompted[1]))
    if (tested := built("significance", "llm", "task")) is not None:
        look_ups.append(lambda: check_baseline(*tested))
    errors = []
    if (models := built("models")) is not None:
        specs = {role: getattr(models[0], role) for role in ROLES}
        directories, unloadable = local_models(specs)
        errors += check_specs(specs) + unloadable
        if directories:
            from storyrewrite.models.roles import check_local_specs  # transformers: only for a model found here

            errors += check_local_specs(specs, directories)
    for look_up in look_ups:
        try:
            look_up()
        except InputError as error:
            errors.append(error)
    return errors


def check_baseline(significance: Any, llm: Any, task: str) -> None:
    """`significance.baseline` names a system of the run (the significance and report stages
    refuse another only after the training)."""
    systems = pipeline_systems(list(TRAIN_STAGES), llm.modes, task)
    if significance.baseline not in systems:
        raise InputError(f"params: `significance.baseline` = {significance.baseline!r} is not a system of this run; "
                         f"systems: {', '.join(systems)}", key="significance.baseline")


def override_keys(overrides: list[str]) -> list[str]:
    """The dotted keys that `-S` overrides set (`cpo.beta` of `params.yaml:++cpo.beta=2`), parsed
    by DVC's own functions as storyrewrite.params.with_overrides parses them."""
    if not overrides:
        return []
    from dvc.utils.cli_parse import to_path_overrides
    from dvc.utils.hydra import to_hydra_overrides

    return [override.key_or_group for override in to_hydra_overrides(to_path_overrides(overrides).get("params.yaml", []))]


def spell(value: Any) -> str:
    """How `dvc exp run -S` takes `value` (YAML's flow style: null, 1.0e-05, bf16-mixed), a list
    without spaces ([zero_shot,rag]), so that a flag stays one word of the shell's."""
    if isinstance(value, list):
        return "[" + ",".join(map(spell, value)) + "]"
    return yaml_scalar(value)


def lookup(tree: dict, key: str) -> Any:
    """The value of the dotted `key` (`llm.modes`) in the params `tree`; KeyError where it has none."""
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            raise KeyError(key)
        tree = tree[part]
    return tree


# The settings that can ask for bf16 (a precision of Lightning's, a dtype of the weights), each
# with the setting that places its stage: a training section's `accelerator` (Lightning's), or
# the top-level `device` for generation, scoring and the LLM baselines.
BF16_SETTINGS = (("train_nll.precision", "train_nll.accelerator"), ("train.precision", "train.accelerator"),
                 ("rl.sample_dtype", "train.accelerator"), ("generate.dtype", "device"), ("score.dtype", "device"),
                 ("llm.local_dtype", "device"))


def _setting(raw: dict, key: str) -> Any:
    """The dotted `key` of `raw`, None where it is not set."""
    try:
        return lookup(raw, key)
    except KeyError:
        return None


def _on_cpu(raw: dict, place: str, cuda: Callable[[], bool]) -> bool:
    """Whether the stage that the setting `place` places runs on the CPU: `cpu`, or `auto` with
    `cuda()` false (no CUDA GPU here; asked last, as it imports torch)."""
    value = _setting(raw, place)
    return value == "cpu" or (value == "auto" and not cuda())


def emulated_bf16(raw: dict, has_bf16: bool | None, cuda: Callable[[], bool]) -> list[str]:
    """The settings of `raw` (`key=value`) that ask for bf16 where torch would emulate it: a stage
    placed on the CPU (_on_cpu) on a CPU without bf16 instructions (`has_bf16`:
    records.cpu_has_bf16; None, not known, is no warning), of a section the run reads (RLOO's
    `rl.sample_dtype` in an RLOO run alone). The stages warn too, but in a queue worker's log; the
    comparison warns before it queues hours of it."""
    if has_bf16 is not False:
        return []
    return [f"{key}={value}" for key, place in BF16_SETTINGS
            if str(value := _setting(raw, key)).startswith(("bf16", "bfloat16")) and _on_cpu(raw, place, cuda)
            and reads_section(_setting(raw, "objective"), key.split(".")[0])]


COMPILE_SETTINGS = (("train_nll.compile", "train_nll.accelerator"), ("train.compile", "train.accelerator"))


def compiled_on_cpu(raw: dict, cuda: Callable[[], bool]) -> list[str]:
    """The training sections' `compile` settings of `raw` (`key=value`) whose steps would run on
    the CPU (_on_cpu). torch.compile is for a GPU: on a CPU it compiles before the first step,
    longer than a short run saves."""
    return [f"{key}={spell(value)}" for key, place in COMPILE_SETTINGS
            if (value := _setting(raw, key)) not in (None, False) and _on_cpu(raw, place, cuda)]


def cuda_available() -> bool:
    import torch  # asked only where a stage placed `auto` asks for bf16 or a compile: torch's import costs seconds

    return torch.cuda.is_available()


def warn_emulated_bf16(experiments: list[dict]) -> None:
    """One warning on stderr naming the settings of `experiments` (each one's params) that this
    machine would run in emulated bf16 (emulated_bf16), each setting once over a sweep."""
    has_bf16 = cpu_has_bf16()
    if slow := dict.fromkeys(setting for raw in experiments for setting in emulated_bf16(raw, has_bf16, cuda_available)):
        print(f"warning: {' '.join(slow)} would run on this machine's CPU, which has no bf16 instructions "
              "(AVX512-BF16, AMX or Arm BF16): torch emulates bf16 there, and each bf16 step takes several times "
              "as long as in float32; add params/fp32.yaml last to run in float32", file=sys.stderr)


def warn_compiled_on_cpu(experiments: list[dict]) -> None:
    """One warning on stderr naming the compile settings of `experiments` that this machine would
    run on its CPU (compiled_on_cpu), each setting once over a sweep."""
    if compiled := dict.fromkeys(setting for raw in experiments for setting in compiled_on_cpu(raw, cuda_available)):
        print(f"warning: {' '.join(compiled)} would compile on this machine's CPU: torch.compile is for a GPU, "
              "and on a CPU it compiles before the first step, longer than a short run saves "
              "(docs/training.md, Devices and speed)", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    """Profiles are overlays of params.yaml (params/gpu.yaml, params/paper.yaml), applied in the
    order given, then the `-S` overrides as `dvc exp run` applies them (a sweep: each of its
    experiments): `check` validates every section of the result and the names `objective` and
    `llm.modes` look up, `overrides` checks the same and prints the profiles' keys as `-S
    key=value` flags for `dvc exp run` (DVC writes them into the experiment's params.yaml,
    comments kept), the `-S` given after them; `get --key KEY` prints one merged value (a list's
    items separated by spaces)."""
    parser = argparse.ArgumentParser(prog="python -m storyrewrite.profiles", description=main.__doc__)
    parser.add_argument("action", choices=("check", "overrides", "get"))
    parser.add_argument("profiles", type=Path, nargs="*")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--key", help="get: the dotted key to print (llm.modes, say)")
    parser.add_argument("--elsewhere", action="store_true",
                        help="check or overrides for a run on another machine (a GPU's): no warning about this one's CPU")
    parser.add_argument("-S", "--set-param", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="an override as `dvc exp run -S` takes it (repeatable; a sweep checks each experiment)")
    args = parser.parse_intermixed_args(argv)  # profiles after --params too

    def run() -> None:
        merged, changes = load_yaml(args.params), {}
        # params.yaml named again as a profile changes nothing: dropped, or `overrides` would print
        # every one of its keys and `check` would name it twice.
        profiles = [profile for profile in args.profiles if profile.resolve() != args.params.resolve()]
        for profile in profiles:
            layer = load_yaml(profile)
            try:
                merged = overlay(merged, layer, source=str(profile))
            except InputError as error:  # a key params.yaml lacks: the profile's line that writes it
                line = line_setting(profile, error.key) if error.key and profile.is_file() else None
                raise InputError(str(error).replace(f"{profile}:", f"{profile}:{line}:", 1), key=error.key) if line else error from None
            changes = overlay(changes, layer, strict=False)
        layers = [args.params, *profiles]
        source = " + ".join(map(str, layers))
        experiments = with_overrides(merged, args.overrides)
        overridden, errors = override_keys(args.overrides), []
        for label, raw in experiments:
            try:
                params = Params(raw, f"{source} {label}".strip(), SETTINGS)
                found = params.errors() + check_registered_names(params)
            except InputError as error:  # a top-level key params.yaml lacks (`-S +foo=1`)
                found = [error]
            lines = [str(locate(error, layers, overridden)) for error in found]
            errors += [f"{line} (experiment {label})" if len(experiments) > 1 else line for line in lines]
        if errors:  # printed as `error: ...` by run_cli: every line reads the same
            raise InputError("\nerror: ".join(errors))
        if args.action != "get" and not args.elsewhere:
            warn_emulated_bf16([raw for _, raw in experiments])
            warn_compiled_on_cpu([raw for _, raw in experiments])
        if args.action == "overrides":
            # Each flag one word of `dvc exp run $(... overrides ...)`, which the shell splits at
            # spaces and never unquotes: a value with a space or a quote is refused.
            flags = [f"{key}={spell(value)}" for key, value in leaves(changes)] + args.overrides
            if unsplittable := [flag for flag in flags if re.search(r"[\s'\"]", flag)]:
                raise InputError(f"overrides: `{unsplittable[0]}` has a space or a quote, which `$(...)` would split or "
                                 "keep: give dvc exp run that one as -S '<key>=<value>' yourself")
            print(" ".join(f"-S {flag}" for flag in flags))
        elif args.action == "get":
            if not args.key:
                raise InputError("get: --key KEY is needed (a dotted key of params.yaml: llm.modes, say)")
            if len(experiments) > 1:
                raise InputError("get: a sweep has one value an experiment; give -S without a sweep")
            try:
                value = lookup(experiments[0][1], args.key)
            except KeyError:
                raise InputError(f"get: --key {args.key!r} is not a key of {source}") from None
            print(" ".join(map(spell, value)) if isinstance(value, list) else spell(value))
        else:
            count = f" ({len(experiments)} experiments)" if len(experiments) > 1 else ""
            print(f"ok: {' '.join([source, *(f'-S {item}' for item in args.overrides)])}{count}")

    run_cli(run)


if __name__ == "__main__":
    main()
