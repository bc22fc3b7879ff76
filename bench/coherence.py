"""The cost of the coherence metrics, measured in one run on the same instances and models:

1. the judge: CF-PMI of the test instances' reference endings, `coherence.cf_pmi` (both
   contexts of every instance in one length-sorted batched pass, each distinct pair once)
   against a loop that scores one context and one ending at a time; the values must agree to
   1e-5;
2. the score stage's work for one system (load the scorer, score; with the evaluators: load
   them too and add CF-PMI, drift and, where `models.nli` names one, EntScore), with the
   evaluators against without them, alternating, the median of `--repeats`.

    python bench/coherence.py [--device auto] [--instances 96] [--system nll] [--repeats 3] [--profile P.yaml]

Target: the score stage with the evaluators <= 1.6x without them. Figures go to
reports/bench/coherence.json.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from common import clock, describe, evaluators_dir, inputs, write_result

from storyrewrite.data.prepare import load_instances
from storyrewrite.io import run_cli
from storyrewrite.metrics.coherence import cf_pmi, judge_contexts
from storyrewrite.metrics.evaluate import load_scoring_models, read_predictions, score_system
from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.models.device import resolve_device
from storyrewrite.models.store import resolve_model_dir
from storyrewrite.systems import copy_predictions

ROOT = Path(__file__).resolve().parents[1]
AGREE = 1e-5  # the largest difference allowed between the batched judge's CF-PMI and the loop's


def one_context_at_a_time(judge: LMScorer, instances: list[dict], endings: list[str]) -> list[float]:
    """The obvious loop: each instance's two contexts scored one after the other, batch of one."""
    values = []
    for row, ending in zip(instances, endings, strict=True):
        counterfactual, initial = judge_contexts(row)
        values.append(judge.score([counterfactual], [ending], 1)[0] - judge.score([initial], [ending], 1)[0])
    return values


def stage_work(params, pretrained: Path, evaluators: Path | None, predictions: dict, instances: list[dict],
               device: torch.device) -> float:
    """Seconds for what the score stage does after its imports: load, then score one system."""
    models, config = params.models, params.score
    started = clock(device)
    scorer, loaded = load_scoring_models(pretrained, evaluators, models, config, device)
    score_system(predictions, instances, scorer, config.batch_size, loaded)
    return clock(device) - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--instances", type=int, default=96, help="test instances the judge scores (part 1)")
    parser.add_argument("--system", default="nll", help="whose predictions the score stage scores (part 2): "
                        "predictions/<system>.jsonl where the pipeline made it, else the copy of the original ending")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", type=Path, action="append", default=[], help="params overlay(s), e.g. params/gpu.yaml")
    args = parser.parse_args()
    params, pretrained, prepared = inputs(args.profile)
    evaluators = evaluators_dir(params)
    device = resolve_device(args.device)
    models, config = params.models, params.score
    test = load_instances(prepared, params.task, "test")

    # 1. The judge, batched against one context at a time.
    judge_dir = resolve_model_dir(evaluators, "judge")
    judge = LMScorer.from_dir(judge_dir, models.max_input_tokens, models.max_output_tokens, config.dtype, device)
    rows = test[: args.instances]
    endings = [row["target"] for row in rows]
    cf_pmi(judge, rows[:4], endings[:4])  # warm-up
    started = clock(device)
    batched = cf_pmi(judge, rows, endings, config.batch_size)
    batched_seconds = clock(device) - started
    started = clock(device)
    looped = one_context_at_a_time(judge, rows, endings)
    looped_seconds = clock(device) - started
    largest = max(abs(a - b) for a, b in zip(batched, looped, strict=True))
    pairs = 2 * len(rows)
    print(f"{describe(device)}; judge {models.judge}; {len(rows)} instances = {pairs} (context, ending) pairs")
    print(f"cf_pmi, batched (batch {config.batch_size}): {pairs / batched_seconds:.1f} pairs/s")
    print(f"one context at a time:        {pairs / looped_seconds:.1f} pairs/s")
    print(f"speed-up {looped_seconds / batched_seconds:.2f}x; largest difference {largest:.1e} (must be <= {AGREE})")
    if largest > AGREE:
        raise SystemExit(f"error: batched and one-at-a-time CF-PMI differ by {largest:.2e} > {AGREE}")
    del judge

    # 2. The score stage's work with and without the evaluators.
    path = ROOT / "predictions" / f"{args.system}.jsonl"
    if path.exists() and len(test) == sum(1 for _ in open(path, encoding="utf-8")):
        predictions, source = read_predictions(path, test), str(path.relative_to(ROOT))
    else:
        predictions, source = {r["id"]: r["prediction"] for r in copy_predictions(test, params.task)["copy_original"]}, "copy_original"
    without, with_evaluators = [], []
    for repeat in range(args.repeats):
        order = [None, evaluators] if repeat % 2 == 0 else [evaluators, None]
        for directory in order:
            seconds = stage_work(params, pretrained, directory, predictions, test, device)
            (without if directory is None else with_evaluators).append(seconds)
    ratio = statistics.median(with_evaluators) / statistics.median(without)
    print(f"score stage on {len(test)} predictions ({source}): without the evaluators {statistics.median(without):.2f} s, "
          f"with them {statistics.median(with_evaluators):.2f} s (medians of {args.repeats}): {ratio:.2f}x (target <= 1.6x)")

    write_result("coherence", device, {
        "judge_batched_pairs_per_s": round(pairs / batched_seconds, 2), "judge_loop_pairs_per_s": round(pairs / looped_seconds, 2),
        "judge_speedup": round(looped_seconds / batched_seconds, 2), "judge_largest_difference": largest,
        "score_stage_without_s": round(statistics.median(without), 3),
        "score_stage_with_s": round(statistics.median(with_evaluators), 3), "score_stage_ratio": round(ratio, 3),
    }, {"judge": models.judge, "embedder": models.embedder, "nli": models.nli, "judge_instances": len(rows),
        "score_predictions": len(test), "predictions": source, "batch_size": config.batch_size, "dtype": config.dtype,
        "repeats": args.repeats, "profiles": [str(p) for p in args.profile]},
        {"score_stage_ratio": {"max": 1.6}, "judge_largest_difference": {"max": AGREE}})


if __name__ == "__main__":
    run_cli(main)
