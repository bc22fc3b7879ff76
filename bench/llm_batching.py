"""The local LLM backend with its prompts sent longest first (what the `llm` stages do) against
instance order, measured in one run on the same prompts and model: prompts/s, the share of each
batch's prompt tokens that is padding, and how many replies the two orders give alike.

    python bench/llm_batching.py [--device auto] [--mode zero_shot] [--prompts 64] [--batch-size N]
        [--dtype float32] [--repeats 3] [--profile params/gpu.yaml]

The queries are the first `--prompts` distinct stories of the params' training split, answered by
the `local` backend (`llm.local_dtype` unless --dtype, batches of `llm.local_batch_size` unless --batch-size) with
the models stage's generator, through `storyrewrite.llm.run.run_mode` into an empty response cache
each time; the two orders alternate and the median of `--repeats` counts. Figures go to
reports/bench/llm_batching.json. Target: longest first no slower than instance order.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from common import clock, describe, inputs, peak_memory_gb, write_result

from storyrewrite.data.prepare import load_instances
from storyrewrite.io import run_cli
from storyrewrite.llm.backends import LocalBackend
from storyrewrite.llm.cache import ResponseCache
from storyrewrite.llm.modes import MODES, ExampleSource, get_mode
from storyrewrite.llm.prompts import Template, messages, template_path
from storyrewrite.llm.run import longest_first, run_mode
from storyrewrite.models.device import resolve_device
from storyrewrite.models.store import resolve_model_dir


def padding_share(lengths: list[int], batch_size: int) -> float:
    """The share of the batches' prompt positions that are padding, the prompts batched in the
    order given (each batch padded to its longest prompt)."""
    padded = used = 0
    for start in range(0, len(lengths), batch_size):
        batch = lengths[start : start + batch_size]
        padded += max(batch) * len(batch)
        used += sum(batch)
    return (padded - used) / padded


def arguments() -> argparse.ArgumentParser:
    """The command line (scripts/gpu_bench.sh's calls are parsed by it in the tests)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--mode", default="zero_shot", choices=[m for m in MODES if not MODES[m].needs_index],
                        help="prompting mode (not rag: it needs the llm_index stage)")
    parser.add_argument("--prompts", type=int, default=64, help="distinct training stories to ask about")
    parser.add_argument("--batch-size", type=int, default=None, help="prompts per batch (default: llm.local_batch_size)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="the model's weights (default: llm.local_dtype)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", type=Path, action="append", default=[], help="params overlay(s), e.g. params/gpu.yaml")
    return parser


def main() -> None:
    args = arguments().parse_args()
    params, pretrained, prepared = inputs(args.profile)
    config, device = params.llm, resolve_device(args.device)
    dtype = args.dtype or config.local_dtype
    train = load_instances(prepared, params.task, "train")
    seen, queries = set(), []
    for row in train:
        story = (row["premise"], row["initial"], row["original_ending"], row["counterfactual"])
        if story not in seen and len(queries) < args.prompts:
            seen.add(story)
            queries.append(row)
    if len(queries) < args.prompts:
        print(f"note: the training split has {len(queries)} distinct stories, fewer than --prompts {args.prompts}")
    backend = LocalBackend(resolve_model_dir(pretrained, "generator"), params.models.generator,
                           args.batch_size or config.local_batch_size, device, dtype)
    source = ExampleSource(train, params.task, config, params.seed)

    # Padding, counted in the backend's own tokens for the order each way sends the prompts.
    template = Template.read(template_path(config.templates, params.task))
    chats = [messages(template, row, example) for row, example in zip(queries, get_mode(args.mode).examples(queries, source), strict=True)]
    tokens = backend.encode(chats)["attention_mask"].sum(dim=1).tolist()
    padding = {"length_sorted": padding_share([tokens[i] for i in longest_first(chats)], backend.batch_size),
               "instance_order": padding_share(tokens, backend.batch_size)}

    with tempfile.TemporaryDirectory() as cache:  # warm-up
        run_mode(args.mode, queries[: backend.batch_size], source, backend, ResponseCache(cache))
    seconds: dict[bool, list[float]] = {True: [], False: []}
    replies: dict[bool, list[dict]] = {}
    for repeat in range(args.repeats):
        for length_sorted in ([True, False] if repeat % 2 == 0 else [False, True]):
            with tempfile.TemporaryDirectory() as cache:
                started = clock(device)
                replies[length_sorted], _ = run_mode(args.mode, queries, source, backend, ResponseCache(cache), length_sorted)
                seconds[length_sorted].append(clock(device) - started)
    rate = {way: len(queries) / statistics.median(seconds[way]) for way in seconds}
    alike = sum(a == b for a, b in zip(replies[True], replies[False], strict=True))
    speedup = rate[True] / rate[False]
    print(f"{describe(device)}; {params.models.generator} ({dtype}); mode {args.mode}; {len(queries)} prompts "
          f"({min(tokens)}-{max(tokens)} tokens), batches of {backend.batch_size}, {config.max_new_tokens} new tokens at most")
    print(f"longest first:  {rate[True]:.2f} prompts/s, padding {padding['length_sorted']:.1%} of the prompt positions")
    print(f"instance order: {rate[False]:.2f} prompts/s, padding {padding['instance_order']:.1%}")
    print(f"speed-up {speedup:.2f}x (medians of {args.repeats}); replies alike in both orders: {alike} of {len(queries)}")

    write_result("llm_batching", device, {
        "length_sorted_prompts_per_s": round(rate[True], 3), "instance_order_prompts_per_s": round(rate[False], 3),
        "speedup": round(speedup, 3), "padding_length_sorted": round(padding["length_sorted"], 4),
        "padding_instance_order": round(padding["instance_order"], 4), "replies_alike": alike,
        "peak_memory_gb": round(peak_memory_gb(device), 2),
    }, {"generator": params.models.generator, "dtype": dtype, "mode": args.mode, "prompts": len(queries),
        "prompt_tokens": [min(tokens), max(tokens)], "batch_size": backend.batch_size,
        "max_new_tokens": config.max_new_tokens, "repeats": args.repeats, "profiles": [str(p) for p in args.profile]},
        {"speedup": {"min": 1.0}})


if __name__ == "__main__":
    run_cli(main)
