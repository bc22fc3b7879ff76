"""Run one prompting mode over the evaluated split: choose the example, build the messages,
answer from the cache or the backend, and count what it cost."""
from __future__ import annotations

import hashlib
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from storyrewrite.io import InputError
from storyrewrite.llm.cache import ResponseCache, cache_key
from storyrewrite.llm.prompts import Template, messages
from storyrewrite.params import choices, positive

MODES = ("zero_shot", "one_shot_random", "one_shot_fixed", "rag")


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


@dataclass(frozen=True)
class LLMConfig:
    """`llm` section of params.yaml."""

    modes: list  # the prompting modes run as DVC stages (any of MODES)
    templates: dict  # task -> template file
    temperature: float
    max_new_tokens: int
    fixed_example_id: dict  # task -> training instance id for one_shot_fixed (None: the first one)
    local_batch_size: int
    openai: OpenAISettings
    backend: str = choices("local", "openai", default="local")

    def check(self, where: str) -> None:
        positive(where, max_new_tokens=self.max_new_tokens, local_batch_size=self.local_batch_size)
        unknown = [m for m in self.modes if m not in MODES]
        if unknown:
            raise InputError(f"params: `{where}.modes` has {unknown[0]!r}; valid values: {', '.join(MODES)}")


@dataclass
class Usage:
    requests: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    retries: int = 0
    seconds: float = 0.0
    per_request_seconds: list = field(default_factory=list)

    def summary(self) -> dict:
        latency = sorted(self.per_request_seconds)
        return {
            "requests": self.requests, "cache_hits": self.cache_hits, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens, "retries": self.retries, "seconds": round(self.seconds, 2),
            "median_request_seconds": round(latency[len(latency) // 2], 3) if latency else None,
        }


def _seeded_choice(rows: list[dict], seed: int, instance_id: str) -> dict:
    # Seeded per query (not per run order), so a resumed or reordered run draws the same example.
    digest = hashlib.sha256(f"{seed}:{instance_id}".encode()).hexdigest()
    return random.Random(int(digest[:16], 16)).choice(rows)


def choose_examples(mode: str, instances: list[dict], train: list[dict], task: str, config: LLMConfig,
                    seed: int, retrieve=None) -> list[dict | None]:
    """The solved example shown before each query (None for zero-shot). Examples only ever come
    from the training split."""
    if mode == "zero_shot":
        return [None] * len(instances)
    if mode == "one_shot_random":
        return [_seeded_choice(train, seed, row["id"]) for row in instances]
    if mode == "one_shot_fixed":
        wanted = config.fixed_example_id.get(task)
        fixed = train[0] if wanted is None else next((row for row in train if row["id"] == wanted), None)
        if fixed is None:
            raise InputError(f"params: `llm.fixed_example_id.{task}` = {wanted!r} is not a training instance id "
                             f"(e.g. {train[0]['id']!r})")
        return [fixed] * len(instances)
    if mode == "rag":
        by_id = {row["id"]: row for row in train}
        return [by_id[i] for i in retrieve(instances)]
    raise InputError(f"unknown LLM mode {mode!r}; valid values: {', '.join(MODES)}")


def clean_reply(text: str) -> str:
    """The ending alone: the first paragraph, without a label the model may have echoed."""
    text = text.strip().split("\n\n", 1)[0].strip()
    for label in ("Rewritten ending:", "Edited ending:", "Ending:"):
        if text.lower().startswith(label.lower()):
            text = text[len(label):].strip()
    return " ".join(text.split())


def run_mode(mode: str, instances: list[dict], train: list[dict], task: str, config: LLMConfig, backend,
             model_id: str, cache: ResponseCache, seed: int, retrieve=None) -> tuple[list[dict], Usage]:
    """Predictions [{id, prediction}] in instance order, and the usage of this run."""
    template = Template.read(config.templates[task])
    examples = choose_examples(mode, instances, train, task, config, seed, retrieve)
    settings = {"temperature": config.temperature, "max_new_tokens": config.max_new_tokens}
    queries = [messages(template, row, example) for row, example in zip(instances, examples)]
    keys = [cache_key(backend.name, model_id, m, settings) for m in queries]
    usage, replies = Usage(), {}
    for key in keys:
        if key not in replies and (entry := cache.get(key)) is not None:
            replies[key] = entry["text"]
            usage.cache_hits += 1
    todo = list(dict.fromkeys(k for k in keys if k not in replies))  # each distinct prompt once
    by_key = dict(zip(keys, queries))
    started = time.perf_counter()

    def answer(batch_keys: list[str]) -> None:
        t0 = time.perf_counter()
        if hasattr(backend, "complete_many"):
            results = backend.complete_many([by_key[k] for k in batch_keys], config.max_new_tokens, config.temperature)
        else:
            results = [backend.complete(by_key[batch_keys[0]], config.max_new_tokens, config.temperature)]
        elapsed = (time.perf_counter() - t0) / len(batch_keys)
        for key, reply in zip(batch_keys, results):
            # Cached at once, one file per answer: an interruption loses at most the calls in flight.
            cache.put(key, {"text": reply.text, "prompt_tokens": reply.prompt_tokens,
                            "completion_tokens": reply.completion_tokens})
            replies[key] = reply.text
            usage.requests += 1
            usage.prompt_tokens += reply.prompt_tokens
            usage.completion_tokens += reply.completion_tokens
            usage.per_request_seconds.append(elapsed)

    if hasattr(backend, "complete_many"):
        for start in range(0, len(todo), config.local_batch_size):
            answer(todo[start : start + config.local_batch_size])
    else:
        with ThreadPoolExecutor(max_workers=config.openai.concurrency) as pool:
            list(pool.map(lambda k: answer([k]), todo))  # list(): re-raise the first failure
    usage.seconds = time.perf_counter() - started
    usage.retries = getattr(backend, "retries", 0)
    return [{"id": row["id"], "prediction": clean_reply(replies[key])} for row, key in zip(instances, keys)], usage
