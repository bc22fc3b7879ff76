"""The scorer bench's reduced-precision figures (bench/scorer_and_bootstrap.py)."""
import sys

import pytest

from helpers import ROOT, tiny_bench
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


@pytest.mark.parametrize("kind", ["bart", "llama"])
def test_the_one_pair_loop_gives_the_batched_scorers_scores(kind, tiny_model_dirs):
    """The bench's plain loop (its own tokenising, no padding, one forward pass a pair) against
    LMScorer.score's length-sorted, padded batches: the same mean log-probabilities in fp32."""
    scorer = LMScorer.from_dir(tiny_model_dirs[kind])
    sources = ["He went home.", "She sang a song to them all night long.", "It rained.", "The dog barked at the cat."]
    targets = ["He stayed out late with his friends.", "She sang.", "Sun came out and dried the streets.", "It slept."]
    batched = scorer.score(sources, targets, batch_size=3)
    looped = bench.one_pair_at_a_time(scorer, sources, targets)
    assert len(set(looped)) == 4 and looped == pytest.approx(batched, abs=1e-5)


def test_the_scorer_bench_times_each_pass_after_an_untimed_one_and_records_its_rates(tmp_path, monkeypatch, capsys):
    """main() end to end on the CPU with a tiny scorer, on a clock of set ticks: the rates are the
    pairs over each timed pass's seconds, the speed-ups the loop's seconds over a pass's; the fp32
    scores of the loop and the batches agree; no TF32 pass and no speed-up target on a CPU."""
    profile, written = tiny_bench(bench, "", tmp_path, monkeypatch)
    # Two reads a timed pass: batched fp32 2 s, batch 2's fp32 3 s, the loop 8 s, batched bf16 1 s.
    ticks = iter([0, 2, 2, 5, 5, 13, 13, 14])
    monkeypatch.setattr(bench, "clock", lambda device: next(ticks))
    monkeypatch.setattr(sys, "argv", ["scorer_and_bootstrap.py", "--device", "cpu", "--pairs", "6", "--batch-size", "4",
                                      "--batch-sizes", "2", "--profile", str(profile)])
    bench.main()
    [(name, figures, settings, targets)] = written
    assert name == "scorer_and_bootstrap" and targets == {"largest_fp32_difference": {"max": 1e-4}}
    assert {key: figures[key] for key in ("batched_fp32_pairs_per_s", "loop_fp32_pairs_per_s", "batched_speedup",
                                           "batched_bf16_pairs_per_s", "bf16_speedup", "by_batch_size")} == {
        "batched_fp32_pairs_per_s": 3.0, "loop_fp32_pairs_per_s": 0.75, "batched_speedup": 4.0,
        "batched_bf16_pairs_per_s": 6.0, "bf16_speedup": 8.0, "by_batch_size": {"2": {"fp32_pairs_per_s": 2.0}}}
    assert figures["largest_fp32_difference"] < 1e-5 and 0 < figures["largest_bf16_difference"] < 0.5
    assert 0 <= figures["mean_bf16_shift"] <= figures["largest_bf16_difference"] and figures["bootstrap_seconds_cpu"] > 0
    assert set(figures["fp32"]) == set(figures["bf16"]) == {"tokenise_share"} and "batched_tf32_pairs_per_s" not in figures
    assert {key: settings[key] for key in ("scorer", "pairs", "batch_size", "bf16_layout_batch_size", "profiles")} == {
        "scorer": "tiny:llama", "pairs": 6, "batch_size": 4, "bf16_layout_batch_size": 1, "profiles": [str(profile)]}
    printed = capsys.readouterr().out
    assert "LMScorer.score, fp32 (batch 4): 3.0 pairs/s" in printed and "speed-up: 4.00x" in printed
    assert "batch 2: fp32 2.0 pairs/s" in printed
