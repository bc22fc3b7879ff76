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

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from storyrewrite.io import InputError, atomic_dir, read_json, write_json_atomic
from storyrewrite.models.catalogue import ROLES, refused, valid_specs, vocabularies_differ
from storyrewrite.models.roles import check_role
from storyrewrite.models.specs import fetch
from storyrewrite.params import ModelsConfig


def spec_dir(models_dir: str | Path, spec: str, kind: str = "lm") -> Path:
    """The materialised directory of a spec (one per distinct spec and kind, shared by roles)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "--", spec).strip("-.")
    return Path(models_dir) / (name if kind == "lm" else f"{name}--{kind}")


def check_same_vocabulary(generator: PreTrainedTokenizerBase, scorer: PreTrainedTokenizerBase, names: tuple[str, str]) -> None:
    """DTO feeds generator distributions to the scorer token by token: the vocabularies must match."""
    if generator.get_vocab() != scorer.get_vocab():
        raise vocabularies_differ((names[0], len(generator)), (names[1], len(scorer)))


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
                    fetch(spec, ROLES[role].kind, directory, seed)
                except InputError as error:  # a spec's own (an unknown bundled or tiny name): which param set it
                    if error.key is not None:
                        raise
                    raise refused(role, spec, f": {error}") from None
                except OSError as error:  # transformers: neither a local directory nor a model it can reach on the hub
                    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                    if spec.startswith((".", "/", "~")) and not Path(spec).expanduser().exists():
                        reason = "no such directory"
                    raise refused(role, spec, f" cannot be loaded ({reason}); a spec is a local model directory, a Hugging Face "
                                  f"hub name (the hub or its cache needed), {valid_specs('bundled')} or {valid_specs('tiny')}") from None
            check_role(role, directory, spec)
        if {"generator", "scorer"} <= set(roles):
            check_same_vocabulary(*(AutoTokenizer.from_pretrained(spec_dir(staging, specs[r])) for r in ("generator", "scorer")),
                                  (specs["generator"], specs["scorer"]))
        index = {role: None if spec is None else spec_dir(out, spec, ROLES[role].kind).name for role, spec in specs.items()}
        index["specs"] = specs
        write_json_atomic(staging / "index.json", index)
    return index


