"""The score stage's lexical metrics for one system on the whole test split: ROUGE-L and SacreBLEU
through `storyrewrite.metrics.lexical` (rouge-score's tokenizer with each word stemmed once,
sacrebleu's BLEU objects kept, corpus BLEU summed from the pairs' sentence statistics) against the libraries' plain calls (a new stemming of every token,
`sacrebleu.sentence_bleu` and `corpus_bleu` building their objects on every call), alternating in
one process, the median of `--repeats`. The values must be equal.

The work is `score_system`'s: per instance and per corpus against the edited ending, again
against the original ending, and corpus BLEU for HMean (the plain calls compute it once more; the
score stage takes the one it has, and computes a pair that repeats once). The predictions are the
copy of the original ending: the lengths of a real system's, and as a generator's, one prediction
for a story's three instances. It runs on the CPU (one torch thread does
not matter: neither library uses torch), beside the GPU in every `score` stage.

    python bench/lexical_metrics.py [--profile params/gpu.yaml] [--instances N] [--repeats 3]

Target: none; the figure is the time each `score` stage saves.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import sacrebleu
import torch
from common import inputs, write_result
from rouge_score import rouge_scorer

from storyrewrite.data.prepare import load_instances
from storyrewrite.io import run_cli
from storyrewrite.metrics import lexical


def plain(predictions: list[str], reference_sets: list[list[str]]) -> list:
    """The libraries as their documentation calls them, rouge-score's scorer made once for all pairs."""
    rouge = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    values = []
    for references in reference_sets:
        values.append([100 * rouge.score(r, p)["rougeL"].fmeasure for p, r in zip(predictions, references, strict=True)])
        values.append([sacrebleu.sentence_bleu(p, [r]).score for p, r in zip(predictions, references, strict=True)])
        values.append(sacrebleu.corpus_bleu(predictions, [references]).score)
    values.append(sacrebleu.corpus_bleu(predictions, [reference_sets[0]]).score)  # HMean's
    return values


def kept(predictions: list[str], reference_sets: list[list[str]]) -> list:
    """The same calls through `storyrewrite.metrics.lexical`, as `score_system` makes them, from
    empty caches (a `score` stage is a process of its own)."""
    for make in (lexical._rouge, lexical._sentence_bleu, lexical._corpus_bleu, lexical._pair_bleu):
        make.cache_clear()
    values = []
    for references in reference_sets:
        values.append(lexical.rouge_l(predictions, references))
        values.append(lexical.sentence_bleu(predictions, references))
        values.append(lexical.corpus_bleu(predictions, references))
    values.append(values[2])  # HMean's: score_system takes the edited ending's corpus BLEU computed above
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, action="append", default=[], help="params overlay(s), e.g. params/gpu.yaml")
    parser.add_argument("--instances", type=int, default=None, help="the first N test instances (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.repeats < 1 or (args.instances is not None and args.instances < 1):
        raise SystemExit("error: --repeats and --instances must be at least 1")
    params, _, prepared = inputs(args.profile)
    test = load_instances(prepared, params.task, "test")[: args.instances]
    predictions = [row["original_ending"] for row in test]
    reference_sets = [[row["target"] for row in test], [row["original_ending"] for row in test]]

    seconds: dict[str, list[float]] = {"plain": [], "kept": []}
    results = {}
    for _ in range(args.repeats):
        for name, function in (("plain", plain), ("kept", kept)):
            started = time.perf_counter()
            results[name] = function(predictions, reference_sets)
            seconds[name].append(time.perf_counter() - started)
    if results["kept"] != results["plain"]:
        raise SystemExit("error: storyrewrite.metrics.lexical's values differ from the libraries' plain calls")
    plain_s, kept_s = statistics.median(seconds["plain"]), statistics.median(seconds["kept"])
    print(f"{len(test)} test instances, {args.repeats} repeats, the median; CPU, one process")
    print(f"the libraries' plain calls:         {plain_s:.2f} s")
    print(f"storyrewrite.metrics.lexical:       {kept_s:.2f} s ({plain_s / kept_s:.2f}x faster), the same values")
    write_result("lexical_metrics", torch.device("cpu"), {
        "plain_s": round(plain_s, 3), "kept_s": round(kept_s, 3), "speedup": round(plain_s / kept_s, 3),
        "equal_values": True,
    }, {"instances": len(test), "repeats": args.repeats, "profiles": [str(p) for p in args.profile]})


if __name__ == "__main__":
    run_cli(main)
