"""Typed views of params.yaml sections.

params.yaml is the single source of truth; this module only gives each section a type and
checks it. An unknown key, a missing key, a value of the wrong type or outside its valid
choices is an error that names the key and what is allowed.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from storyrewrite.io import InputError

TASKS = ("timetravel", "timetravel_ablated", "art")

T = TypeVar("T")


def choices(*values: str, default: Any = dataclasses.MISSING) -> Any:
    """A dataclass field whose value must be one of `values`."""
    return dataclasses.field(default=default, metadata={"choices": values})


def load_params(path: str | Path = "params.yaml") -> dict:
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: params file not found")
    with open(path, encoding="utf-8") as f:
        params = yaml.safe_load(f)
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
    if origin is dict or annotation is dict:
        return isinstance(value, dict)
    if origin is list or annotation is list:
        return isinstance(value, list)
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    return isinstance(value, annotation)


def _coerce_float(value: Any, annotation: Any) -> Any:
    # PyYAML reads "5e-9" (no dot) as a string; a researcher writes it that way all the time.
    if isinstance(value, str) and float in (annotation, *typing.get_args(annotation)):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def build(cls: type[T], values: Any, where: str) -> T:
    """Build dataclass `cls` from the mapping `values`; `where` names the section in errors."""
    if not isinstance(values, dict):
        raise InputError(f"params: `{where}` must be a mapping, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    # A field may be spelled differently in params (`lambda` is a Python keyword: field `lambda_`).
    fields = {f.metadata.get("key", f.name): f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise InputError(
            f"params: unknown key(s) {', '.join(f'`{where}.{k}`' for k in unknown)}; "
            f"valid keys: {', '.join(fields)}"
        )
    kwargs = {}
    for name, field in fields.items():
        key = f"{where}.{name}" if where else name
        if name not in values:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise InputError(f"params: missing key `{key}`")
            continue
        hint = hints[field.name]
        value = _coerce_float(values[name], hint)
        if dataclasses.is_dataclass(hint):
            value = build(hint, value, key)
        elif not _type_ok(value, hint):
            raise InputError(
                f"params: `{key}` = {value!r} has the wrong type; expected {_type_name(hint)}"
            )
        allowed = field.metadata.get("choices")
        if allowed is not None and value not in allowed:
            raise InputError(f"params: `{key}` = {value!r} is not valid; valid values: {', '.join(allowed)}")
        kwargs[field.name] = value
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if check is not None:
        check(where)
    return obj


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    return "null" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def positive(where: str, **values: float | int | None) -> None:
    for name, value in values.items():
        if value is not None and value <= 0:
            raise InputError(f"params: `{where}.{name}` = {value!r} must be > 0")


@dataclasses.dataclass(frozen=True)
class Experiment:
    """The top-level keys of params.yaml that several stages share."""

    seed: int
    task: str = choices(*TASKS)
    objective: str = "nll"  # checked against storyrewrite.objectives.OBJECTIVES by the train stage


def experiment(params: dict) -> Experiment:
    return build(Experiment, {k: params[k] for k in ("seed", "task", "objective") if k in params}, "")


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


def _leaves(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def main(argv: list[str] | None = None) -> None:
    """`python -m storyrewrite.params overrides PROFILE`: the profile as `-S key=value` flags for
    `dvc exp run`; `... apply PROFILE`: write the profile into params.yaml."""
    import argparse
    import shlex

    from storyrewrite.io import write_text_atomic

    parser = argparse.ArgumentParser(prog="python -m storyrewrite.params", description=main.__doc__)
    parser.add_argument("action", choices=("overrides", "apply"))
    parser.add_argument("profile", type=Path)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    args = parser.parse_args(argv)
    base, changes = load_params(args.params), load_params(args.profile)
    merged = overlay(base, changes)
    if args.action == "apply":
        write_text_atomic(args.params, yaml.safe_dump(merged, sort_keys=False))
    else:
        flags = [f"-S {shlex.quote(f'{key}={_yaml_scalar(value)}')}" for key, value in _leaves(changes)]
        print(" ".join(flags))


def _yaml_scalar(value: Any) -> str:
    # How YAML spells the value (null, 1.0e-05, bf16-mixed), as `dvc exp run -S` parses it.
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


if __name__ == "__main__":
    main()
