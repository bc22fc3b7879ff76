"""The scorer bench's reduced-precision figures (bench/scorer_and_bootstrap.py)."""
import sys

import pytest

from helpers import ROOT
from storyrewrite.metrics.lm_scorer import LMScorer

sys.path.insert(0, str(ROOT / "bench"))
import scorer_and_bootstrap as bench  # noqa: E402  (bench/ is a folder of scripts, not a package)


def test_the_differences_from_fp32_are_the_largest_of_a_pair_and_the_shift_of_the_mean():
    """By hand: pairs off by 0.5 and 0.5 in opposite directions leave the mean where it was; a
    third off by 0.3 moves the mean of three by 0.1."""
    assert bench.differences("tf32", [1.0, 2.5], [1.5, 2.0]) == {"largest_tf32_difference": 0.5, "mean_tf32_shift": 0.0}
    figures = bench.differences("bf16", [1.0, 2.5, 3.3], [1.5, 2.0, 3.0])
    assert figures["largest_bf16_difference"] == pytest.approx(0.5) and figures["mean_bf16_shift"] == pytest.approx(0.1)


def test_the_tf32_pass_on_a_cpu_runs_fp32_and_gives_its_figures(tiny_model_dirs):
    """A CPU has no TF32: the pass runs in fp32 and its scores equal the fp32 pass's."""
    import torch

    scorer = LMScorer.from_dir(tiny_model_dirs["bart"])
    sources, targets = ["He went home.", "She sang a song to them."], ["He stayed out.", "She sang."]
    exact = scorer.score(sources, targets, batch_size=2)
    figures = bench.tf32_pass(scorer, sources, targets, 2, exact, 1.0, torch.device("cpu"), None)
    assert figures["largest_tf32_difference"] == 0.0 and figures["mean_tf32_shift"] == 0.0
    assert figures["batched_tf32_pairs_per_s"] > 0 and figures["tf32_speedup_over_fp32"] > 0
    assert set(figures["tf32"]) == {"tokenise_share"}


def test_each_batch_size_gets_its_fp32_rate_and_on_a_cpu_no_tf32_rate(tiny_model_dirs):
    import torch

    scorer = LMScorer.from_dir(tiny_model_dirs["bart"])
    sources, targets = ["He went home.", "She sang a song to them.", "It rained."], ["He stayed out.", "She sang.", "Sun."]
    found = bench.by_batch_size(scorer, sources, targets, [1, 3], torch.device("cpu"))
    assert list(found) == ["1", "3"] and all(set(rates) == {"fp32_pairs_per_s"} and rates["fp32_pairs_per_s"] > 0
                                             for rates in found.values())
