"""Prompting modes of the LLM baselines, registered by name in `MODES`: how each chooses the
solved example shown before a query (only ever from the training split), its label in reports,
and whether it needs the retrieval index. Nothing else branches on a mode's name."""
from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from storyrewrite.data.schema import TASK_INPUT_FIELDS
from storyrewrite.io import InputError
from storyrewrite.params import LLMConfig


@dataclass(frozen=True)
class ExampleSource:
    """What a mode may draw its solved example from: the training split only."""

    train: list[dict]
    task: str
    config: LLMConfig
    seed: int
    retrieve: Callable[[list[dict]], list[str]] | None = None  # queries -> nearest training ids (RAG)


def _zero_shot(instances: list[dict], source: ExampleSource) -> list[dict | None]:
    return [None] * len(instances)


def _seeded_choice(rows: list[dict], seed: int, query: str) -> dict:
    # Seeded per query (not per run order), so a resumed or reordered run draws the same example.
    digest = hashlib.sha256(f"{seed}:{query}".encode()).hexdigest()
    return random.Random(int(digest[:16], 16)).choice(rows)


def _one_shot_random(instances: list[dict], source: ExampleSource) -> list[dict | None]:
    # The query is the model's input, not the instance: the instances of one input (a TimeTravel
    # test story's three human rewrites) get the same example, so one prompt and one answer, as
    # every other system gives one ending per input.
    fields = TASK_INPUT_FIELDS[source.task]
    return [_seeded_choice(source.train, source.seed, json.dumps([row[f] for f in fields])) for row in instances]


def _one_shot_fixed(instances: list[dict], source: ExampleSource) -> list[dict | None]:
    wanted = source.config.fixed_example_id.get(source.task)
    fixed = source.train[0] if wanted is None else next((row for row in source.train if row["id"] == wanted), None)
    if fixed is None:
        raise InputError(f"params: `llm.fixed_example_id.{source.task}` = {wanted!r} is not a training instance id "
                         f"(e.g. {source.train[0]['id']!r})", key=f"llm.fixed_example_id.{source.task}")
    return [fixed] * len(instances)


def _rag(instances: list[dict], source: ExampleSource) -> list[dict | None]:
    by_id = {row["id"]: row for row in source.train}
    return [by_id[i] for i in source.retrieve(instances)]


@dataclass(frozen=True)
class Mode:
    name: str
    label: str  # in reports
    examples: Callable[[list[dict], ExampleSource], list[dict | None]]  # the example shown before each query
    needs_index: bool = False  # the llm_index stage's embeddings of the training split


MODES: dict[str, Mode] = {
    "zero_shot": Mode("zero_shot", "zero-shot", _zero_shot),
    "one_shot_random": Mode("one_shot_random", "one-shot, random example", _one_shot_random),
    "one_shot_fixed": Mode("one_shot_fixed", "one-shot, fixed example", _one_shot_fixed),
    "rag": Mode("rag", "RAG (nearest training example)", _rag, needs_index=True),
}


def get_mode(name: str) -> Mode:
    if name not in MODES:
        raise InputError(f"params: `llm.modes` has {name!r}; valid values: {', '.join(MODES)}", key="llm.modes")
    return MODES[name]


def needs_index(modes: list[str]) -> bool:
    """Whether any of `modes` reads the retrieval index (so that llm_index must build it)."""
    return any(get_mode(name).needs_index for name in modes)
