"""LM scorer throughput: `LMScorer.score` (length-sorted batches) against a plain loop scoring one
pair at a time, on the same model and the same pairs, in one run; the scores must agree. Then
the paired bootstrap: 10,000 resamples over 5,613 instances and 6 metrics.

    python bench/scorer_and_bootstrap.py [--pairs 200] [--batch-size 16]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from common import default_inputs

from storyrewrite.metrics import LMScorer
from storyrewrite.models.loading import ModelsConfig, resolve_model_dir
from storyrewrite.params import build
from storyrewrite.significance import paired_bootstrap_many


def one_pair_at_a_time(scorer: LMScorer, sources: list[str], targets: list[str]) -> list[float]:
    """The obvious loop: tokenize one pair, run the model on it, average the target log-probs."""
    scores = []
    with torch.no_grad():
        for source, target in zip(sources, targets):
            source_ids = scorer.encoder.source_ids([source])[0]
            target_ids = scorer.encoder.target_ids([" " + target if not scorer.seq2seq else target])[0]
            if scorer.seq2seq:
                decoder = [scorer.model.config.decoder_start_token_id] + target_ids[:-1]
                logits = scorer.model(input_ids=torch.tensor([source_ids]), decoder_input_ids=torch.tensor([decoder])).logits[0]
            else:
                logits = scorer.model(input_ids=torch.tensor([source_ids + target_ids[:-1]])).logits[0, len(source_ids) - 1 :]
            log_probs = F.log_softmax(logits.float(), dim=-1)[torch.arange(len(target_ids)), torch.tensor(target_ids)]
            scores.append(log_probs.mean().item())
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the scorer's weights (both ways)")
    args = parser.parse_args()
    params, pretrained, splits = default_inputs()
    models = build(ModelsConfig, params["models"], "models")
    test = splits["test"][: args.pairs]
    # Score the original ending against the edited one: realistic lengths, as in the score stage.
    sources, targets = [r["original_ending"] for r in test], [r["target"] for r in test]
    scorer = LMScorer.from_dir(resolve_model_dir(pretrained, "scorer"), models.max_input_tokens, models.max_output_tokens,
                               dtype=getattr(torch, args.dtype))

    scorer.score(sources[:4], targets[:4])  # warm-up
    started = time.perf_counter()
    batched = scorer.score(sources, targets, batch_size=args.batch_size)
    batched_seconds = time.perf_counter() - started
    started = time.perf_counter()
    looped = one_pair_at_a_time(scorer, sources, targets)
    looped_seconds = time.perf_counter() - started
    max_diff = float(np.max(np.abs(np.array(batched) - np.array(looped))))

    print(f"scorer {models.scorer} ({args.dtype}), {len(sources)} pairs, {torch.get_num_threads()} torch threads")
    print(f"LMScorer.score (batch {args.batch_size}): {len(sources) / batched_seconds:.1f} pairs/s")
    print(f"one pair at a time:        {len(sources) / looped_seconds:.1f} pairs/s")
    print(f"speed-up: {looped_seconds / batched_seconds:.2f}x; largest score difference {max_diff:.2e}")

    rng = np.random.default_rng(0)
    a, b = rng.normal(0.01, 1, (5613, 6)), rng.normal(0, 1, (5613, 6))
    started = time.perf_counter()
    paired_bootstrap_many(a, b, n_resamples=10_000, seed=0)
    print(f"paired bootstrap, 10,000 resamples x 5,613 instances x 6 metrics: {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
