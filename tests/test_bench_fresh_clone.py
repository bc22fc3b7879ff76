"""The fresh-clone bench's reading of two dvc.lock files (bench/fresh_clone.py)."""
import sys

import yaml

from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import fresh_clone as bench  # noqa: E402  (bench/ is a folder of scripts, not a package)


def test_a_changed_stage_record_or_curve_is_timing_and_a_changed_score_or_metric_a_result():
    """HEAD's dvc.lock against a copy with, by hand: a stage record's and a training curve's md5
    changed (timing), the NLL model's metrics changed and the finetuned scores' output dropped
    (results). A dep's md5 is no output: changing one changes nothing."""
    text = (ROOT / "dvc.lock").read_text()
    lock = yaml.safe_load(text)
    before = bench.lock_outputs(text)
    assert {"models/pretrained", "reports/stages/train_nll.json", "reports/metrics/nll.json", "reports/train/nll/plots/metrics",
            "reports/results.md"} <= before.keys()
    assert before == bench.lock_outputs(yaml.safe_dump(lock)) and bench.changed(before, before) == ([], [])

    def outs(stage):
        return {out["path"]: out for out in lock["stages"][stage]["outs"]}

    outs("train_nll")["reports/stages/train_nll.json"]["md5"] = "0" * 32
    outs("train_nll")["reports/train/nll/plots/metrics"]["md5"] = "1" * 32 + ".dir"
    outs("score@nll")["reports/metrics/nll.json"]["md5"] = "2" * 32
    lock["stages"]["score@finetuned"]["outs"] = [out for out in lock["stages"]["score@finetuned"]["outs"]
                                                 if out["path"] != "reports/scores/finetuned.jsonl"]
    lock["stages"]["train"]["deps"][0]["md5"] = "3" * 32
    after = bench.lock_outputs(yaml.safe_dump(lock))
    assert bench.changed(before, after) == (
        ["reports/metrics/nll.json", "reports/scores/finetuned.jsonl", "reports/stages/train_nll.json",
         "reports/train/nll/plots/metrics"],
        ["reports/metrics/nll.json", "reports/scores/finetuned.jsonl"])
