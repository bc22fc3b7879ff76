"""LM scorer throughput: `LMScorer.score` (length-sorted batches) against a plain loop scoring one
pair at a time, on the same model and the same pairs, in one run; the fp32 scores must agree.
Then the batched rate in bf16, and on CUDA with float32 products on TF32 tensor cores
(`score.fp32_matmul: tf32`), each with its largest difference from fp32 and the shift of the mean
(a corpus BARTScore's); the largest difference between bf16 scores of the same pairs batched
at two sizes (`largest_bf16_layout_difference`: other neighbours and padding, the rounding a tie
between two systems' identical predictions must absorb, storyrewrite.significance.compare; the
fp32 one is `largest_fp32_difference`, batched against one pair at a time); and the paired
bootstrap: 10,000 resamples over 5,613 instances and 6 metrics.

    python bench/scorer_and_bootstrap.py [--device auto] [--pairs 200] [--batch-size 16] [--profile params/gpu.yaml]
        [--trace DIR] [--batch-sizes 64 128 256]

Each batched pass is timed after one untimed pass over the same pairs, so that every batch shape
has run once (kernel choice, the allocator's blocks). Where the batched pass spends its time:
`tokenise_share`, the seconds of tokenising its pairs over its own; on CUDA, `gpu_busy` (fp32 and
bf16), the share of a pass's wall time during which GPU kernels ran, by torch's profiler, and the
host's waits for the device per batch (`syncs_per_batch`): a low share with a host that waits once
a batch says that the host, not the GPU's arithmetic, sets the scorer's rate. `--trace DIR` writes
the profiler's operator tables of both passes (by device time and by host time). `--batch-sizes`:
the batched fp32 rate at each size (and on CUDA the TF32 rate), each after a pass of its own
shapes: what `score.batch_size` should be.

Target (H100, SmolLM2-135M): batched >= 3x the one-pair loop, fp32 scores within 1e-4.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from common import clock, count_syncs, describe, gpu_busy, inputs, write_result

from storyrewrite.data.prepare import load_instances
from storyrewrite.io import run_cli
from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.models.device import resolve_device, set_fp32_matmul
from storyrewrite.models.store import resolve_model_dir
from storyrewrite.significance import paired_bootstrap_many


def one_pair_at_a_time(scorer: LMScorer, sources: list[str], targets: list[str]) -> list[float]:
    """The obvious loop: tokenize one pair, run the model on it, average the target log-probs."""
    scores, device = [], scorer.device
    with torch.no_grad():
        for source, target in zip(sources, targets, strict=True):
            source_ids = scorer.encoder.source_ids([source])[0]
            target_ids = scorer.encoder.target_ids([" " + target if not scorer.seq2seq else target])[0]
            if scorer.seq2seq:
                decoder = [scorer.model.config.decoder_start_token_id] + target_ids[:-1]
                logits = scorer.model(input_ids=torch.tensor([source_ids], device=device),
                                      decoder_input_ids=torch.tensor([decoder], device=device)).logits[0]
            else:
                logits = scorer.model(input_ids=torch.tensor([source_ids + target_ids[:-1]], device=device)).logits[0, len(source_ids) - 1 :]
            log_probs = F.log_softmax(logits.float(), dim=-1)[torch.arange(len(target_ids)), torch.tensor(target_ids, device=device)]
            scores.append(log_probs.mean().item())
    return scores


def differences(name: str, values: list[float], exact: list[float]) -> dict[str, float]:
    """How far `values` are from the fp32 scores `exact`: the largest difference of a pair, and
    the shift of their mean (what a corpus BARTScore would move by)."""
    values, exact = np.array(values), np.array(exact)
    return {f"largest_{name}_difference": float(np.max(np.abs(values - exact))),
            f"mean_{name}_shift": float(abs(values.mean() - exact.mean()))}


def timed(device: torch.device, function, *args, **kwargs):
    started = clock(device)
    result = function(*args, **kwargs)
    return result, clock(device) - started


def arguments() -> argparse.ArgumentParser:
    """The command line (scripts/gpu_bench.sh's calls are parsed by it in the tests)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--profile", type=Path, action="append", default=[], help="params overlay(s), e.g. params/gpu.yaml")
    parser.add_argument("--trace", type=Path, help="write the profiler's operator tables of the batched passes here (CUDA)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[], help="also the batched rate at each of these sizes")
    return parser


def where_time_goes(scorer: LMScorer, sources: list[str], targets: list[str], batch_size: int, seconds: float,
                    device: torch.device, trace: Path | None, name: str) -> dict:
    """How a batched pass of `seconds` spends them: tokenising (any device); on CUDA the GPU's
    busy share and the host's waits per batch, and with `trace` the operator tables."""
    started = time.perf_counter()
    scorer.encoder.source_ids(sources)
    scorer.target_rows.ids(targets)
    figures = {"tokenise_share": round((time.perf_counter() - started) / seconds, 3)}
    if device.type != "cuda":
        return figures
    work = lambda: scorer.score(sources, targets, batch_size=batch_size)  # noqa: E731
    busy, profiler = gpu_busy(work, device, 1)
    batches = -(-len(set(zip(sources, targets, strict=True))) // batch_size)
    figures |= {"gpu_busy": round(busy, 3), "syncs_per_batch": round(count_syncs(work) / batches, 2)}
    if trace:
        trace.mkdir(parents=True, exist_ok=True)
        averages = profiler.key_averages()
        (trace / f"scorer-{name}.txt").write_text(
            averages.table(sort_by="self_device_time_total", row_limit=25) + "\n"
            + averages.table(sort_by="self_cpu_time_total", row_limit=25))
    return figures


def tf32_pass(scorer: LMScorer, sources: list[str], targets: list[str], batch_size: int, batched: list[float],
              batched_seconds: float, device: torch.device, trace: Path | None) -> dict:
    """The batched pass again with float32 products on TF32 tensor cores (`score.fp32_matmul:
    tf32`; a CPU has none and runs fp32): its rate, its speed-up over the fp32 pass (`batched`,
    `batched_seconds`), how far its scores move, where its time goes. Leaves products in fp32."""
    set_fp32_matmul(device, "float32", "tf32")
    try:
        scorer.score(sources, targets, batch_size=batch_size)  # every batch shape once, on TF32's kernels
        tf32, seconds = timed(device, scorer.score, sources, targets, batch_size=batch_size)
        return {"batched_tf32_pairs_per_s": round(len(sources) / seconds, 2),
                "tf32_speedup_over_fp32": round(batched_seconds / seconds, 3), **differences("tf32", tf32, batched),
                "tf32": where_time_goes(scorer, sources, targets, batch_size, seconds, device, trace, "tf32")}
    finally:
        set_fp32_matmul(device, "float32", "ieee")


def by_batch_size(scorer: LMScorer, sources: list[str], targets: list[str], sizes: list[int],
                  device: torch.device) -> dict[str, dict[str, float]]:
    """{size: {fp32_pairs_per_s, and on CUDA tf32_pairs_per_s}}: the batched pass at each batch
    size, timed after an untimed pass of the same shapes."""
    found = {}
    for size in sizes:
        rates = {}
        for precision in ("ieee", "tf32") if device.type == "cuda" else ("ieee",):
            set_fp32_matmul(device, "float32", precision)
            try:
                scorer.score(sources, targets, batch_size=size)
                _, seconds = timed(device, scorer.score, sources, targets, batch_size=size)
            finally:
                set_fp32_matmul(device, "float32", "ieee")
            rates[f"{'fp32' if precision == 'ieee' else 'tf32'}_pairs_per_s"] = round(len(sources) / seconds, 2)
        found[str(size)] = rates
    return found


def main() -> None:
    args = arguments().parse_args()
    params, pretrained, prepared = inputs(args.profile)
    device = resolve_device(args.device)
    models = params.models
    test = load_instances(prepared, params.task, "test")[: args.pairs]
    # Score the original ending against the edited one: realistic lengths, as in the score stage.
    sources, targets = [r["original_ending"] for r in test], [r["target"] for r in test]
    directory = resolve_model_dir(pretrained, "scorer")
    scorer = LMScorer.from_dir(directory, models.max_input_tokens, models.max_output_tokens, device=device)

    scorer.score(sources, targets, batch_size=args.batch_size)  # every batch shape once
    batched, batched_seconds = timed(device, scorer.score, sources, targets, batch_size=args.batch_size)
    fp32 = where_time_goes(scorer, sources, targets, args.batch_size, batched_seconds, device, args.trace, "fp32")
    reduced = (tf32_pass(scorer, sources, targets, args.batch_size, batched, batched_seconds, device, args.trace)
               if device.type == "cuda" else {})
    sizes = by_batch_size(scorer, sources, targets, args.batch_sizes, device)
    one_pair_at_a_time(scorer, sources[:4], targets[:4])
    looped, looped_seconds = timed(device, one_pair_at_a_time, scorer, sources, targets)
    max_diff = float(np.max(np.abs(np.array(batched) - np.array(looped))))
    del scorer
    half = LMScorer.from_dir(directory, models.max_input_tokens, models.max_output_tokens, dtype="bfloat16", device=device)
    half.score(sources, targets, batch_size=args.batch_size)
    bf16, bf16_seconds = timed(device, half.score, sources, targets, batch_size=args.batch_size)
    bf16_diff = differences("bf16", bf16, batched)
    layout_size = max(1, args.batch_size // 2 - 1)  # other neighbours, other padding
    bf16_layout = float(np.max(np.abs(np.array(half.score(sources, targets, batch_size=layout_size)) - np.array(bf16))))
    bf16_where = where_time_goes(half, sources, targets, args.batch_size, bf16_seconds, device, args.trace, "bf16")

    print(f"{describe(device)}; scorer {models.scorer}; {len(sources)} distinct pairs")
    print(f"LMScorer.score, fp32 (batch {args.batch_size}): {len(sources) / batched_seconds:.1f} pairs/s")
    print(f"one pair at a time, fp32:          {len(sources) / looped_seconds:.1f} pairs/s")
    print(f"speed-up: {looped_seconds / batched_seconds:.2f}x; largest fp32 score difference {max_diff:.2e}")
    print(f"LMScorer.score, bf16 (batch {args.batch_size}): {len(sources) / bf16_seconds:.1f} pairs/s "
          f"({looped_seconds / bf16_seconds:.2f}x the fp32 loop); from fp32: largest difference "
          f"{bf16_diff['largest_bf16_difference']:.2e}, mean shifted {bf16_diff['mean_bf16_shift']:.2e}; "
          f"batches of {args.batch_size} against {layout_size}: largest difference {bf16_layout:.2e}")
    if reduced:
        print(f"LMScorer.score, fp32 on TF32 (batch {args.batch_size}): {reduced['batched_tf32_pairs_per_s']:.1f} pairs/s "
              f"({reduced['tf32_speedup_over_fp32']:.2f}x fp32); from fp32: largest difference "
              f"{reduced['largest_tf32_difference']:.2e}, mean shifted {reduced['mean_tf32_shift']:.2e}")
    for size, rates in sizes.items():
        print(f"batch {size}: " + ", ".join(f"{name.removesuffix('_pairs_per_s')} {rate:.1f} pairs/s" for name, rate in rates.items()))
    for name, where in (("fp32", fp32), ("tf32", reduced.get("tf32")), ("bf16", bf16_where)):
        if where:
            print(f"batched {name}: " + ", ".join(f"{key} {value}" for key, value in where.items()))

    rng = np.random.default_rng(0)
    a, b = rng.normal(0.01, 1, (5613, 6)), rng.normal(0, 1, (5613, 6))
    started = time.perf_counter()
    paired_bootstrap_many(a, b, n_resamples=10_000, seed=0)
    bootstrap_seconds = time.perf_counter() - started
    print(f"paired bootstrap, 10,000 resamples x 5,613 instances x 6 metrics: {bootstrap_seconds:.2f} s (CPU)")
    write_result("scorer_and_bootstrap", device, {
        "batched_fp32_pairs_per_s": round(len(sources) / batched_seconds, 2), "loop_fp32_pairs_per_s": round(len(sources) / looped_seconds, 2),
        "batched_speedup": round(looped_seconds / batched_seconds, 3), "largest_fp32_difference": max_diff,
        "batched_bf16_pairs_per_s": round(len(sources) / bf16_seconds, 2), "bf16_speedup": round(looped_seconds / bf16_seconds, 3),
        **bf16_diff, "largest_bf16_layout_difference": bf16_layout, "bootstrap_seconds_cpu": round(bootstrap_seconds, 3),
        "fp32": fp32, "bf16": bf16_where, **reduced, **({"by_batch_size": sizes} if sizes else {}),
    }, {"scorer": models.scorer, "pairs": len(sources), "batch_size": args.batch_size, "profiles": [str(p) for p in args.profile],
        "warm_up": "one untimed pass over the pairs", "bf16_layout_batch_size": layout_size, "bootstrap": "10,000 resamples x 5,613 instances x 6 metrics"},
        {"largest_fp32_difference": {"max": 1e-4}, **({"batched_speedup": {"min": 3.0}} if device.type == "cuda" else {})})


if __name__ == "__main__":
    run_cli(main)
