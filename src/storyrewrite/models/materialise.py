"""Materialise every role's model once as a plain `save_pretrained` directory.

The `models` stage materialises the generator and the scorer into `models/pretrained/`, the
`eval_models` stage the evaluation models (judge, embedder, NLI classifier, BERTScore's
encoder) into `models/evaluators/`: two stages, so that changing an evaluation model rescores
the systems without retraining them. Each directory has an `index.json` (role -> model
directory, and the spec each came from); a spec two roles share is materialised once, and
`eval_models` copies a model `models` materialised already (`reuse`: the bundled SmolLM2 is both
the generator and the judge of the default profile) instead of de-quantising the GGUF file again.
Later stages load the saved directories (storyrewrite.models.store), which takes a fraction of a
second instead of the GGUF de-quantisation's twenty.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from transformers import AutoTokenizer

from storyrewrite.io import InputError, atomic_dir, read_json, write_json_atomic
from storyrewrite.models.catalogue import ROLES, cannot_be_loaded, directory_problem, is_path, refused
from storyrewrite.models.roles import check_role, check_same_vocabulary
from storyrewrite.models.specs import fetch
from storyrewrite.params import ModelsConfig


def spec_dir(models_dir: str | Path, spec: str, kind: str = "lm") -> Path:
    """The materialised directory of a spec (one per distinct spec and kind, shared by roles)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "--", spec).strip("-.")
    return Path(models_dir) / (name if kind == "lm" else f"{name}--{kind}")


def _materialised(models_dir: Path | None, spec: str, kind: str) -> Path | None:
    """The directory another models stage's output (`models_dir`) holds for `spec` as `kind`, if
    it materialised that spec (its index says so) as that kind."""
    if models_dir is None or not (models_dir / "index.json").is_file():
        return None
    found = spec_dir(models_dir, spec, kind)
    return found if spec in read_json(models_dir / "index.json")["specs"].values() and found.is_dir() else None


def materialise(config: ModelsConfig, out: Path, seed: int, roles: tuple[str, ...] = ("generator", "scorer"),
                reuse: Path | None = None) -> dict:
    """Save the model of each of `roles` (a role whose spec is null is left out) under `out`,
    each checked for its role; return the index (also written to `out/index.json`). A spec that
    `reuse` (another models stage's output, made with the same `seed`) holds as the same kind is
    copied from there."""
    specs = {role: getattr(config, role) for role in roles}
    # Built in a staging directory and swapped in whole: a failure (a role's check, a download)
    # leaves the previous directory as it was.
    with atomic_dir(out) as staging:
        for role, spec in specs.items():
            if spec is None:
                continue
            directory = spec_dir(staging, spec, ROLES[role].kind)
            if not directory.exists() and (source := _materialised(reuse, spec, ROLES[role].kind)) is not None:
                shutil.copytree(source, directory)
            if not directory.exists():
                directory.mkdir()
                try:
                    if is_path(spec) and (problem := directory_problem(Path(spec).expanduser())) is not None:
                        raise OSError(problem)  # (transformers reads an empty directory's spec as a hub name)
                    fetch(spec, ROLES[role].kind, directory, seed)
                except InputError as error:  # a spec's own (an unknown bundled or tiny name): which param set it
                    if error.key is not None:
                        raise
                    raise refused(role, spec, f": {error}") from None
                except OSError as error:  # transformers: neither a local directory nor a model it can reach on the hub
                    raise cannot_be_loaded(role, spec, error) from None
                except ValueError as error:  # transformers: a local config.json it cannot read as a model's
                    if not is_path(spec):
                        raise
                    raise cannot_be_loaded(role, spec, error) from None
            check_role(role, directory, spec)
        if {"generator", "scorer"} <= set(roles):
            check_same_vocabulary(*(AutoTokenizer.from_pretrained(spec_dir(staging, specs[r])) for r in ("generator", "scorer")),
                                  (specs["generator"], specs["scorer"]))
        index = {role: None if spec is None else spec_dir(out, spec, ROLES[role].kind).name for role, spec in specs.items()}
        index["specs"] = specs
        write_json_atomic(staging / "index.json", index)
    return index
