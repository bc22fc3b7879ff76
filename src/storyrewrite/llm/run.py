"""Run one prompting mode over the evaluated split: choose the example (storyrewrite.llm.modes),
build the messages, answer from the cache or the backend, and count what it cost."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from storyrewrite.llm.backends import Backend
from storyrewrite.llm.cache import ResponseCache, cache_key
from storyrewrite.llm.modes import ExampleSource, get_mode
from storyrewrite.llm.prompts import Template, messages, template_path


@dataclass
class Usage:
    """What a mode's predictions cost, and what this run of it did.

    The cost (`metrics`: distinct prompts, their prompt and completion tokens, the instances whose
    ending stopped at the token limit) counts every answer, from the backend or from the response
    cache, so it is the same for the same predictions whatever the cache held. What this run did
    (`run_facts`: requests sent, cache hits, retries, request time) depends on the cache, and goes
    to the stage record."""
    instances: int = 0
    prompts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cut_at_limit: int = 0  # instances whose ending stopped at max_new_tokens (`cut_at_limit`)
    requests: int = 0
    cache_hits: int = 0
    retries: int = 0
    seconds: float = 0.0
    per_request_seconds: list = field(default_factory=list)

    def count(self, answer: dict) -> None:
        """One distinct prompt's answer (a cache entry or a reply just cached)."""
        self.prompts += 1
        self.prompt_tokens += answer["prompt_tokens"]
        self.completion_tokens += answer["completion_tokens"]

    def metrics(self) -> dict:
        return {"instances": self.instances, "prompts": self.prompts, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "cut_at_limit": self.cut_at_limit}

    def run_facts(self) -> dict:
        latency = sorted(self.per_request_seconds)
        return {
            "requests": self.requests, "cache_hits": self.cache_hits, "retries": self.retries,
            "request_seconds": round(self.seconds, 2),
            "median_request_seconds": round(latency[len(latency) // 2], 3) if latency else None,
        }


def cut_at_limit(answer: dict, max_new_tokens: int) -> bool:
    """Whether an answer stopped at the token limit in mid-ending: all `max_new_tokens` used, and
    no paragraph break after the ending began (`clean_reply` keeps the first paragraph, so an
    ending followed by a break was finished, whatever came after it)."""
    return answer["completion_tokens"] >= max_new_tokens and "\n\n" not in answer["text"].lstrip()


def clean_reply(text: str) -> str:
    """The ending alone: the first paragraph, without a label the model may have echoed."""
    text = text.strip().split("\n\n", 1)[0].strip()
    for label in ("Rewritten ending:", "Edited ending:", "Ending:"):
        if text.lower().startswith(label.lower()):
            text = text[len(label):].strip()
    return " ".join(text.split())


def prompt_chars(messages: list[dict]) -> int:
    """A prompt's length in characters, which stand for its tokens whatever the backend's tokenizer."""
    return sum(len(turn["content"]) for turn in messages)


def longest_first(prompts: list[list[dict]]) -> list[int]:
    """The positions of `prompts` in the order `run_mode` sends them: longest first, equal
    lengths in their given order."""
    return sorted(range(len(prompts)), key=lambda i: -prompt_chars(prompts[i]))


def run_mode(mode: str, instances: list[dict], source: ExampleSource, backend: Backend,
             cache: ResponseCache, length_sorted: bool = True) -> tuple[list[dict], Usage]:
    """Predictions [{id, prediction}] in instance order, and their `Usage`.

    The prompts go to the backend longest first (`length_sorted`), as `generate` orders its
    sources: a batch then holds prompts of like length, so little of a local model's batch is
    padding, and the largest batch, the memory peak, comes first. False keeps instance order
    (bench/llm_batching.py measures the two)."""
    config = source.config
    template = Template.read(template_path(config.templates, source.task))
    examples = get_mode(mode).examples(instances, source)
    settings = {"temperature": config.temperature, "max_new_tokens": config.max_new_tokens}
    queries = [messages(template, row, example) for row, example in zip(instances, examples, strict=True)]
    keys = [cache_key(backend.name, backend.model_id, m, settings) for m in queries]
    usage, replies, cut = Usage(instances=len(instances)), {}, {}  # cut: key -> stopped at the limit
    for key in keys:
        if key not in replies and (entry := cache.get(key)) is not None:
            replies[key], cut[key] = entry["text"], cut_at_limit(entry, config.max_new_tokens)
            usage.count(entry)
            usage.cache_hits += 1
    todo = list(dict.fromkeys(k for k in keys if k not in replies))  # each distinct prompt once
    by_key = dict(zip(keys, queries, strict=True))
    if length_sorted:
        todo = [todo[i] for i in longest_first([by_key[k] for k in todo])]
    started = time.perf_counter()
    for start in range(0, len(todo), backend.batch_size):
        batch = todo[start : start + backend.batch_size]
        # Replies arrive one by one (from the backend's threads, for a server) and are counted
        # and cached here, in this thread: an interruption loses at most the calls in flight.
        for position, reply in backend.complete_many([by_key[k] for k in batch], config.max_new_tokens, config.temperature):
            key = batch[position]
            entry = {"text": reply.text, "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens}
            cache.put(key, entry)
            replies[key], cut[key] = reply.text, cut_at_limit(entry, config.max_new_tokens)
            usage.count(entry)
            usage.requests += 1
            usage.per_request_seconds.append(reply.seconds)
    usage.seconds = time.perf_counter() - started
    usage.retries = backend.retries
    usage.cut_at_limit = sum(cut[key] for key in keys)
    return [{"id": row["id"], "prediction": clean_reply(replies[key])} for row, key in zip(instances, keys, strict=True)], usage
