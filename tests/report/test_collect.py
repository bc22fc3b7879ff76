"""Gathering experiments into a folder and collecting the comparison from it: the selection by
validation NLL, the p-values against each run's own NLL model (instances and stories), the copy
baseline's comparison, the stage records and the files of the bundle."""
from __future__ import annotations

import gzip
import io
import json
import re
import subprocess

import pytest
import yaml

from helpers import ROOT, DictFS, system_metrics, training_summary
from storyrewrite.io import InputError
from storyrewrite.report.collect import NOT_TESTED, Entry, kept_original, load_runs, param_cell, systems_without_a_run, write_bundle
from storyrewrite.objectives.registry import RLConfig
from storyrewrite.params import ScoreConfig, TrainConfig
from storyrewrite.report.gather import (
    ADDED_LATER, duplicates, gather_run, gathered_before, listed, main as gather, plan, store_blob, sweep_runs,
)
from storyrewrite.significance.compare import compare

STORIES = 3  # three stories of three endings each: nine test instances


def _png() -> bytes:
    """A figure: bytes that are not UTF-8, an RGB PNG of 4,096 colours that the collector saves as a palette PNG."""
    import numpy as np
    from PIL import Image

    ramp = np.arange(64, dtype=np.uint8) * 4
    buffer = io.BytesIO()
    Image.fromarray(np.stack(np.broadcast_arrays(ramp[:, None], ramp[None, :], 255 - ramp[:, None]), axis=-1)).save(buffer, format="png")
    return buffer.getvalue()


PNG = _png()


def _scores(shift: float) -> list[dict]:
    """Per-instance scores: the NLL model's values plus `shift` on every instance (original-ending
    scores unchanged), so a positive shift beats NLL on every resample."""
    rows = []
    for s in range(STORIES):
        for e in range(3):
            base = -2.0 + 0.1 * s - 0.05 * e
            rows.append({"id": f"s{s}:{e}", "story_id": f"s{s}", "bartscore": base + shift, "bartscore_original": -1.0,
                         "rougeL": 50 + 10 * shift + e, "rougeL_original": 70.0, "sacrebleu": 30 + 10 * shift + s,
                         "sacrebleu_original": 60.0, "cf_pmi": 0.01 * (e - 1) + shift / 10, "drift": 0.3 + shift / 10})
    return rows


def _metrics(bart: float, rouge: float = 60.0) -> dict:
    return {**system_metrics(bart, rouge), "instances": 3 * STORIES, "coherence_metrics": "available",
            "cf_pmi": round((bart + 1.9) / 10, 4), "cf_follow": 0.5, "drift": round(0.3 + (bart + 1.9) / 10, 4),
            "evaluators": {"judge": "bundled:smollm2-135m-instruct", "embedder": "bundled:all-minilm-l6-v2", "nli": None,
                           "judge_is_scorer": True}}


def _record(stage: str, experiment: str, wall: float) -> dict:
    return {"stage": stage, "device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16", "wall_s": wall,
            "items": 100, "unit": "steps", "items_per_s": 100 / wall, "peak_rss_gb": 3.0, "peak_cuda_gb": 10.0,
            "started_at": f"2026-11-23T10:00:{int(wall):02d}+00:00", "experiment": experiment, "torch": "2.13.0"}


def _files(name, objective, val_nll, shift, bart, settings=None, label=None, nll_record_from="exp-nll",
           counterpart=None) -> dict[str, bytes]:
    def dump(obj):
        return json.dumps(obj).encode()

    def jsonl(rows):
        return "".join(json.dumps(r) + "\n" for r in rows).encode()

    params = {"seed": 0, "task": "timetravel", "objective": objective, "train": {"lr": 1e-5}, "llm": {"modes": ["zero_shot"]},
              "cpo": {"beta": (settings or {}).get("beta", 0.1)}, "significance": {"n_resamples": 200, "unit": "instance"},
              "rl": {"reward": (settings or {}).get("reward", "score")}}
    return {
        "params.yaml": yaml.safe_dump(params).encode(),
        "reports/metrics/nll.json": dump(_metrics(-1.9)),
        "reports/metrics/finetuned.json": dump(_metrics(bart, 60 + 10 * shift)),
        "reports/metrics/llm_zero_shot.json": dump(_metrics(-2.5, 40.0)),
        "reports/metrics/llm_rag.json": dump(_metrics(-2.2, 45.0)),  # a mode since dropped from llm.modes: in git, not a system
        "reports/sanity/metrics/copy_reference.json": dump(_metrics(-0.5, 100.0)),
        "reports/sanity/metrics/copy_original.json": dump(_metrics(-1.0, 70.0)),
        "reports/scores/nll.jsonl": jsonl(_scores(0.0)),
        "reports/scores/finetuned.jsonl": jsonl(_scores(shift)),
        "reports/scores/llm_zero_shot.jsonl": jsonl(_scores(-0.5)),
        "reports/scores/.gitignore": b"/finetuned.jsonl\n",
        "reports/sanity/scores/copy_reference.jsonl": jsonl(_scores(2.0)),
        "reports/sanity/scores/copy_original.jsonl": jsonl(_scores(1.0)),
        "reports/significance.json": dump({"baseline": "nll", "n_resamples": 200, "unit": "instance",
                                           "p_values": {"finetuned": {"bartscore/predictive": 0.0 if shift > 0 else 1.0}}}),
        "reports/llm/zero_shot.json": dump({"mode": "zero_shot", "model": "SmolLM2", "mode_label": "zero-shot", "backend": "local",
                                            "instances": 9, "prompts": 3, "prompt_tokens": 30, "completion_tokens": 15}),
        "reports/train/nll/metrics.json": dump(training_summary(global_step=316)),
        "reports/train/finetuned/metrics.json": dump(training_summary(label=label or objective.upper(), objective=objective,
                                                                      settings=settings, global_step=300, best_step=200,
                                                                      best_val_nll=val_nll, counterpart=counterpart)),
        "reports/train/finetuned/plots/metrics/train_loss.tsv": b"step\ttrain_loss\n1\t2.0\n300\t1.5\n",
        "reports/train/finetuned.png": PNG,
        "reports/stages/train_nll.json": dump(_record("train_nll", nll_record_from, 90.0) | {"train_s": 88.0}),
        "reports/stages/train.json": dump(_record("train", name, 60.0 + val_nll) | {"train_s": 58.0}),
        # A stage that runs no torch: its machine, without a CPU's features.
        "reports/stages/significance.json": dump({"stage": "significance", "device": "cpu", "device_name": "AMD EPYC (2 cores)",
                                                  "dtype": None, "wall_s": 0.1, "items": 200, "unit": "resamples", "items_per_s": 2000.0,
                                                  "started_at": "2026-11-23T10:02:00+00:00", "experiment": name}),
    }


RUNS = [  # name, objective, best val NLL, score shift against NLL, BARTScore, settings, label
    ("exp-nll", "nll", 1.50, 0.0, -1.9, None, "NLL"),
    ("cpo-a", "cpo", 1.60, 0.5, -1.5, {"beta": 0.1, "lambda": 1.0}, "CPO"),
    ("cpo-b", "cpo", 1.40, -0.2, -2.0, {"beta": 2, "lambda": 1.0}, "CPO"),
    ("dto", "score", 1.45, 0.3, -1.7, {"tau": 1.0, "hard": False}, "DTO-Score"),
]


@pytest.fixture()
def gathered(tmp_path):
    root = tmp_path / "runs"
    for name, objective, val_nll, shift, bart, settings, label in RUNS:
        gather_run(DictFS(_files(name, objective, val_nll, shift, bart, settings, label)),
                   {"name": name, "rev": f"{name}-rev".ljust(40, "0"), "base": "abcdef1234"}, root)
    return root


def _gather_from(tmp_path, monkeypatch, exp_show, *names):
    """gather's command line on saved `dvc exp show --json` output, each revision's files a DictFS;
    returns the names of the runs it gathered."""
    import dvc.api

    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "show.json").write_text(json.dumps(exp_show))
    monkeypatch.setattr(dvc.api, "DVCFileSystem", lambda root, rev: DictFS(_files(rev.rstrip("0"), "score", 1.45, 0.3, -1.7)))
    gather(["--json", str(tmp_path / "show.json"), "--out", str(tmp_path / "runs"), *(["--names", *names] if names else [])])
    return sorted(path.stem for path in (tmp_path / "runs").glob("*.json"))


def test_experiments_are_read_from_dvc_exp_show_and_selected_by_name(tmp_path, monkeypatch):
    exp_show = [
        {"rev": "workspace", "name": None, "data": {}, "experiments": None},
        {"rev": "abcdef1234", "name": "main", "data": {},
         "experiments": [{"name": "gpu-dto", "revs": [{"rev": "9876", "name": "gpu-dto", "data": {}}]},
                         {"name": "cpu-dto", "revs": [{"rev": "5432", "name": "cpu-dto", "data": {}}]},
                         {"name": "gpu.shared-nll", "revs": [{"rev": "1234", "name": "gpu.shared-nll", "data": {}}]}]},
    ]
    assert [(r["name"], r["rev"], r["base"], r["state"]) for r in listed(exp_show)] == [
        ("gpu-dto", "9876", "abcdef1234", None), ("cpu-dto", "5432", "abcdef1234", None)]  # a shared stages' one is no run
    assert _gather_from(tmp_path / "a", monkeypatch, exp_show, "gpu-*") == ["gpu-dto"]
    assert _gather_from(tmp_path / "b", monkeypatch, exp_show, "cpu-dto", "gpu-dto") == ["cpu-dto", "gpu-dto"]
    manifest = json.loads((tmp_path / "b" / "runs" / "gpu-dto.json").read_text())
    assert {"name": "gpu-dto", "rev": "9876", "base": "abcdef1234"}.items() <= manifest.items() and "state" not in manifest
    with pytest.raises(InputError, match=r"--names 'tpu-\*' matches no experiment; experiments: gpu-dto, cpu-dto"):
        _gather_from(tmp_path / "c", monkeypatch, exp_show, "tpu-*")


def test_a_run_gathered_before_at_its_revision_is_not_read_again(tmp_path, monkeypatch, capsys):
    """A poller gathered gpu-dto while cpu-dto ran: the gather at the end reads cpu-dto alone
    through DVC, names gpu-dto as gathered before, and leaves its manifest as it was."""
    import dvc.api

    exp_show = [{"rev": "abcdef1234", "name": "main", "data": {},
                 "experiments": [{"name": "gpu-dto", "revs": [{"rev": "9876", "name": "gpu-dto", "data": {}}]},
                                 {"name": "cpu-dto", "revs": [{"rev": "5432", "name": "cpu-dto", "data": {}}]}]}]
    assert _gather_from(tmp_path, monkeypatch, exp_show, "gpu-dto") == ["gpu-dto"]
    first = (tmp_path / "runs" / "gpu-dto.json").read_text()
    opened = []
    monkeypatch.setattr(dvc.api, "DVCFileSystem", lambda root, rev: opened.append(rev) or DictFS(_files(rev, "score", 1.45, 0.3, -1.7)))
    capsys.readouterr()
    gather(["--json", str(tmp_path / "show.json"), "--out", str(tmp_path / "runs")])
    assert opened == ["5432"] and (tmp_path / "runs" / "gpu-dto.json").read_text() == first
    said = capsys.readouterr().out.splitlines()
    assert said[0] == "gpu-dto (9876): gathered before" and re.fullmatch(r"cpu-dto \(5432\): \d+ files", said[1])


def test_experiments_of_the_queue_that_did_not_finish_are_named_not_gathered(tmp_path, monkeypatch):
    """`dvc exp show --json` lists the queue's experiments beside those that ran (DVC 3.67's shape:
    `executor.state` on the experiment, a failed one's `error` on its revision), each with the commit
    it was queued as, whose outputs were never built: only the finished ones are gathered, and the
    others are named with their state."""
    def entry(name, rev, state=None, error=None):
        executor = None if state is None else {"state": state, "name": None, "local": {"returncode": 255}}
        return {"executor": executor, "name": name, "revs": [{"rev": rev, "name": name, "error": error, "data": {}}]}
    exp_show = [
        {"rev": "workspace", "name": None, "data": {}, "experiments": None},
        {"rev": "abcdef1234", "name": "main", "data": {}, "experiments": [
            entry("gpu-score", "1111", "success"), entry("gpu-nll", "2222"),
            entry("gpu-delta", "3333", "failed", {"msg": "Experiment run failed", "type": ""}),
            entry("gpu-cpo", "4444", "running"), entry("cpu-cpo", "5555", "queued"),
            entry("gpu-odd", "6666", None, {"msg": "unreadable", "type": "SCMError"})]},
    ]
    assert [(r["name"], r["state"]) for r in listed(exp_show)] == [
        ("gpu-score", None), ("gpu-nll", None), ("gpu-delta", "failed"), ("gpu-cpo", "running"), ("cpu-cpo", "queued"),
        ("gpu-odd", "failed")]
    with pytest.raises(InputError, match=r"3 experiment\(s\) did not finish, not gathered: gpu-delta \(failed\), "
                                         r"gpu-cpo \(running\), gpu-odd \(failed\)"):
        _gather_from(tmp_path / "a", monkeypatch, exp_show, "gpu-*")
    assert sorted(path.stem for path in (tmp_path / "a" / "runs").glob("*.json")) == ["gpu-nll", "gpu-score"]  # gathered all the same
    with pytest.raises(InputError, match=r"1 experiment\(s\) did not finish, not gathered: cpu-cpo \(queued\)"):
        _gather_from(tmp_path / "b", monkeypatch, exp_show, "cpu-*")


def test_an_experiment_dvc_lists_twice_as_it_moves_on_is_one_run_in_its_later_state(tmp_path, monkeypatch, capsys):
    """`dvc exp show` reads the queue, then the running experiments, then the finished ones: an
    experiment a worker takes between two reads is listed queued and running (or running and
    finished). It is one run, in its later state, and never the twin of itself: the dedupe once
    removed such a one from the queue in favour of itself, `dvc queue remove` failed on it (it ran
    by then), and the comparison gathered none of its 19 runs."""
    def entry(name, rev, state=None, objective=None):  # (its params: `objective`, else its name)
        params = {"objective": objective or name}
        return {"executor": None if state is None else {"state": state}, "name": name,
                "revs": [{"rev": rev, "name": name, "data": {"params": {"params.yaml": {"data": params}}}}]}
    exp_show = [{"rev": "workspace", "experiments": None}, {"rev": "abcdef1234", "experiments": [
        entry("taken", "1111", "running"), entry("ended", "2222", "running"), entry("ended", "3333"),  # active, successful,
        entry("taken", "1111", "queued"), entry("waits", "4444", "queued")]}]  # then the queue (DVC's order of ranges)
    assert [(r["name"], r["rev"], r["state"]) for r in listed(exp_show)] == [
        ("taken", "1111", "running"), ("ended", "3333", None), ("waits", "4444", "queued")]
    assert duplicates(exp_show, gathered=[]) == (["waits"], [], [], [])
    # A twin that a worker takes before `dvc queue remove` reaches it runs all the same; the others
    # still leave the queue (DVC removes none of a list where one is missing: each goes on its own).
    exp_show[1]["experiments"] += [entry("twin", "5555", "queued", objective="ended"),
                                   entry("copy", "6666", "queued", objective="taken")]
    show = tmp_path / "show.json"
    show.write_text(json.dumps(exp_show))
    removed = []

    def queue_remove(command, **kwargs):
        names = command[command.index("remove") + 1:]
        ok = "twin" not in names  # a worker took it
        removed.extend(names if ok else [])
        return subprocess.CompletedProcess(command, 0 if ok else 255)
    monkeypatch.setattr(subprocess, "run", queue_remove)
    gather(["--json", str(show), "--dedupe"])
    out, err = capsys.readouterr()
    assert removed == ["copy"] and out.split() == ["waits", "ended", "taken"]
    assert "1 queued experiment(s) have the params of one that ran before: removed from the queue" in err
    assert "1 of them left the queue for a worker first and run all the same: twin" in err


def test_a_queued_run_whose_params_ran_before_leaves_the_queue(tmp_path, capsys):
    """An experiment is its params: a queued one equal to one finished here, to one gathered
    before, or to one queued earlier need not run; the others stay, and the finished ones that
    stand in for removed ones are named to be gathered."""
    def entry(name, params, state=None):
        executor = None if state is None else {"state": state}
        return {"executor": executor, "name": name,
                "revs": [{"rev": name * 4, "name": name, "data": {"params": {"params.yaml": {"data": params}}}}]}

    def params(objective, beta=0.1):
        return {"objective": objective, "cpo": {"beta": beta, "lambda": 1.0}}
    exp_show = [{"rev": "workspace", "experiments": None}, {"rev": "abcdef1234", "experiments": [
        entry("done", params("score")), entry("lost", params("nll"), "failed"),
        entry("q1", params("score"), "queued"), entry("q2", params("cpo", 0.5), "queued"), entry("q3", params("cpo", 0.5), "queued"),
        entry("q4", params("delta"), "queued"), entry("q5", params("nll"), "queued"), entry("q6", params("cpo", 2), "queued")]}]
    keep, remove, done, others = duplicates(exp_show, gathered=[params("delta")])
    assert (keep, remove, done, others) == (["q2", "q5", "q6"], ["q1", "q3", "q4"], ["done"], [])
    # One still running (its worker outlived an interrupted comparison) stands in for its queued twin.
    running = [{**exp_show[0]}, {**exp_show[1], "experiments": [*exp_show[1]["experiments"], entry("busy", params("cpo", 2), "running")]}]
    assert duplicates(running, [params("delta")]) == (["q2", "q5"], ["q1", "q3", "q4", "q6"], ["busy", "done"], [])
    # Of a comparison that queued q3 and q6 (`mine`), q2 stands in for q3 (an interrupted one's, with
    # q3's params) and q6 runs; q5, queued by another sweep, runs beside them but is not theirs.
    assert duplicates(exp_show, [params("delta")], mine={"q3", "q6"}) == (["q2", "q6"], ["q1", "q3", "q4"], ["done"], ["q5"])
    # On the command line (nothing to remove here: no `dvc queue remove`).
    show, mine = tmp_path / "show.json", tmp_path / "mine"
    show.write_text(json.dumps([{"rev": "abcdef1234", "experiments": [entry("q5", params("nll"), "queued"),
                                                                      entry("q6", params("cpo", 2), "queued")]}]))
    mine.write_text("q6\n")
    gather(["--json", str(show), "--dedupe", "--mine", str(mine)])
    out, err = capsys.readouterr()
    assert out == "q6\n" and "1 experiment(s) queued before, not of these sweeps, run beside them and are not gathered" in err
    with pytest.raises(InputError, match=r"--mine .*/none: no such file"):
        gather(["--json", str(show), "--dedupe", "--mine", str(tmp_path / "none")])
    mine.write_text("")  # no names known: every queued one is the caller's
    gather(["--json", str(show), "--dedupe", "--mine", str(mine)])
    assert capsys.readouterr().out == "q5\nq6\n"
    # Key order in the YAML does not matter; any value that differs does.
    assert duplicates(exp_show, gathered=[{"cpo": {"lambda": 1.0, "beta": 2}, "objective": "cpo"}])[1] == ["q1", "q3", "q6"]
    # But a setting of speed alone does not (a run gathered before `rl.early_stop` existed stands for
    # one queued with it); another `rl` value does.
    fast = [{"rev": "abcdef1234", "experiments": [
        entry("q7", {**params("rloo"), "rl": {"reward": "score", "cache": "static", "early_stop": False}}, "queued"),
        entry("q8", {**params("rloo"), "rl": {"reward": "delta", "early_stop": False}}, "queued")]}]
    assert duplicates(fast, gathered=[{**params("rloo"), "rl": {"reward": "score"}}])[:2] == (["q8"], ["q7"])
    # The settings of another objective tell no two runs apart (a DTO run reads no `rl`, a CPO run
    # no `dto`); an RLOO run gathered before `rl.sample_dtype` existed stands for one sampling in
    # the weights' own dtype (null), not in bfloat16.
    half = {"reward": "score", "sample_dtype": "bfloat16"}
    other = [{"rev": "abcdef1234", "experiments": [
        entry("q11", {**params("score"), "rl": half}, "queued"), entry("q12", {**params("cpo"), "dto": {"tau": 2.0}}, "queued"),
        entry("q13", {**params("rloo"), "rl": half}, "queued"), entry("q14", {**params("rloo"), "rl": {**half, "sample_dtype": None}}, "queued"),
        entry("q15", {**params("mine"), "rl": half}, "queued")]}]
    before = [{**params("score"), "rl": {"reward": "delta"}}, {**params("cpo"), "dto": {"tau": 1.0}}, {**params("rloo"), "rl": {"reward": "score"}},
              {**params("mine"), "rl": {"reward": "score"}}]
    assert duplicates(other, gathered=before)[:2] == (["q13", "q15"], ["q11", "q12", "q14"])
    # A setting added later stands, where a gathered run lacks it, at the value that computes what
    # the run did (`score.fp32_matmul: ieee`), and at no other value.
    scored = [{"rev": "abcdef1234", "experiments": [
        entry("q9", {**params("score"), "score": {"batch_size": 64, "fp32_matmul": "ieee"}}, "queued"),
        entry("q10", {**params("delta"), "score": {"batch_size": 64, "fp32_matmul": "tf32"}}, "queued")]}]
    before = [{**params("score"), "score": {"batch_size": 64}}, {**params("delta"), "score": {"batch_size": 64}}]
    assert duplicates(scored, gathered=before)[:2] == (["q10"], ["q9"])
    assert all(ScoreConfig.model_fields[key].default == value for key, value in ADDED_LATER["score"].items())
    assert all(RLConfig.model_fields[key].default == value for key, value in ADDED_LATER["rl"].items())
    assert all(TrainConfig.model_fields[key].default == value for section in ("train_nll", "train")
               for key, value in ADDED_LATER[section].items())


def test_a_poller_gathers_a_run_once_and_again_only_at_another_revision(tmp_path):
    run = {"name": "dto", "rev": "a" * 40, "base": "abcdef1234"}
    assert not gathered_before(tmp_path, run)
    gather_run(DictFS(_files("dto", "score", 1.45, 0.3, -1.7)), run, tmp_path)
    assert gathered_before(tmp_path, run) and not gathered_before(tmp_path, {**run, "rev": "b" * 40})
    # A manifest whose files are not all there (a folder copied in part) is gathered again.
    next((tmp_path / "blobs").iterdir()).unlink()
    assert not gathered_before(tmp_path, run)


def test_an_output_missing_from_the_dvc_cache_is_named_with_its_experiment(tmp_path):
    """DVC's file system lists a cached output that this machine's cache lacks (an experiment
    pulled without its data) and fails only when it is read: the error names the run and the file."""
    class Uncached(DictFS):
        def read_bytes(self, path):
            if path.startswith("reports/stages/"):
                raise FileNotFoundError(2, "No storage files available", path)
            return super().read_bytes(path)

    files = {"params.yaml": b"objective: nll\n", "reports/stages/train.json": b"{}"}
    run = {"name": "gpu-dto", "rev": "9876543210".ljust(40, "0"), "base": "abcdef1234"}
    with pytest.raises(InputError, match=r"experiment gpu-dto \(9876543\): reports/stages/train.json is not in this "
                                         r"repository's DVC cache"):
        gather_run(Uncached(files), run, tmp_path / "runs")
    assert not (tmp_path / "runs" / "gpu-dto.json").exists()


def test_gathering_stores_each_file_once_by_content(gathered):
    manifest = json.loads((gathered / "cpo-a.json").read_text())
    assert "reports/scores/.gitignore" not in manifest["files"]
    assert manifest["rev"].startswith("cpo-a-rev") and manifest["base"] == "abcdef1234"
    # The NLL scores are the same bytes in every run: one blob; the fine-tuned ones differ by run.
    nll = {json.loads((gathered / f"{r[0]}.json").read_text())["files"]["reports/scores/nll.jsonl"] for r in RUNS}
    finetuned = {json.loads((gathered / f"{r[0]}.json").read_text())["files"]["reports/scores/finetuned.jsonl"] for r in RUNS}
    assert len(nll) == 1 and len(finetuned) == len(RUNS)
    assert len(list((gathered / "blobs").iterdir())) < sum(len(json.loads((gathered / f"{r[0]}.json").read_text())["files"]) for r in RUNS)


def test_the_bundle_compares_the_best_run_of_each_objective_with_nll(gathered, tmp_path, shipped_objectives):
    out = tmp_path / "reports" / "gpu"
    runs = load_runs([gathered])
    write_bundle(runs, out, "test profile")
    results = (out / "results.md").read_text()
    table = [line for line in results.split("## Following")[0].splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in table[1:]] == [
        "| NLL", "| NLL, continued", "| CPO (beta=2)", "| DTO-Score", "| SmolLM2 zero-shot (local)", "| Copy of the reference (upper bound)",
        "| Copy of the original ending"]  # the systems of the runs' params: not llm_rag, whose metrics lie in their commits
    from PIL import Image

    with Image.open(out / "train" / "dto" / "finetuned.png") as figure:  # the gathered figure, with 256 colours
        assert figure.mode == "P" and figure.size == (64, 64) and (out / "results.png").exists()
    # cpo-b (val NLL 1.40) is chosen over cpo-a (1.60), although cpo-a scores higher on test.
    assert "CPO (beta=2): cpo-b" in results
    # The devices the models ran on: not the machine that ran the bootstrap without torch.
    assert "4 runs (experiments of commit abcdef1), devices: cuda:0 (NVIDIA H100 80GB HBM3). Collected" in results
    # The runs train NLL, CPO and DTO-Score: the page names the registry's other systems.
    assert ("No run here trained DTO-Delta, DTO-Score+Delta, RLOO-Score, RLOO-Delta, RLOO-Score+Delta: not in these "
            "tables.") in results
    assert "M(Ŷ, Y_EE) scores the prediction against the edited ending; M + Δ_M = 2·M(Ŷ, Y_EE) − M(Ŷ, X_OE) rewards" in results
    # DTO-Score is above NLL on every instance: p = 0 resampling instances and stories (*†);
    # CPO (cpo-b) is below on every instance: p = 1, no mark.
    assert "| DTO-Score | **-1.700**\\*† | **63.0**\\*† |" in results
    assert "| CPO (beta=2) | -2.000 | 58.0 |" in results
    significance = json.loads((out / "significance.json").read_text())
    assert significance["DTO-Score"]["run"] == "dto"
    assert significance["DTO-Score"]["instance"]["bartscore/predictive"] == 0.0
    assert significance["CPO (beta=2)"]["story"]["bartscore/predictive"] == 1.0
    # Each p-value is the bootstrap of that run's fine-tuned scores against that run's NLL scores.
    for unit in ("instance", "story"):
        direct = compare({"nll": _scores(0.0), "x": _scores(-0.5)}, "nll", 200, 0, by_story=unit == "story")["x"]
        assert significance["SmolLM2 zero-shot (local)"][unit] == direct
    # The copy of the original ending (ROUGE-L 70.0) beats every trained system on ROUGE-L (M).
    assert "| ROUGE-L (M) | 70.0 | DTO-Score: 63.0 | 4 of 4 (NLL; NLL, continued; CPO (beta=2); DTO-Score) |" in results
    assert "| BARTScore (M) | -1.000 | DTO-Score: -1.700 | 4 of 4" in results
    # The coherence table: DTO-Score's CF-PMI is above NLL's on every instance (*†); the copy's row too.
    following = results.split("## Following the counterfactual")[1].split("## The copy")[0]
    assert "| System | CF-PMI | follows X_CE (%) | drift |" in following
    assert "| DTO-Score | **0.020**\\*† | **50.0**\\*† | **0.320**\\*† |" in following and "The judge is the training scorer" in following
    assert significance["DTO-Score"]["instance"]["cf_pmi"] == 0.0
    assert "| CF-PMI | 0.090 | DTO-Score: 0.020 | 4 of 4" in results

    objectives = (out / "objectives.md").read_text()
    assert "| DTO-Score | dto: 1.4500 | -1.700\\* |" in objectives
    # p = k/n = 0 of 200 resamples: shown as the bound 1/200, and said so.
    assert "| DTO-Score | < 0.0050 / < 0.0050 |" in objectives and "| CF-PMI | follows X_CE (%) | drift |" in objectives
    assert "< 0.0050: not one of the 200 resamples went against H1 (the bootstrap's k/n is 0)." in objectives

    experiments_table = (out / "experiments.md").read_text()
    assert "| cpo-a | cpo | 0.1 | -1.500\\* | 65.0 |" in experiments_table  # cpo.beta varies across runs
    # ... and is no setting of the DTO run's objective: `-`, and said so.
    assert "| dto | score | - |" in experiments_table and "-: a setting of another objective" in experiments_table
    stages = (out / "stages.md").read_text()
    # train_nll ran once (in exp-nll) and was restored in the three others: one row, used by 4 runs.
    assert stages.count("| train_nll |") == 1 and "| exp-nll | 4 runs |" in stages
    assert stages.count("| train |") == 4 and "cuda:0 (NVIDIA H100 80GB HBM3)" in stages
    assert "ran on the CPU although a GPU" not in stages

    assert yaml.safe_load((out / "params" / "dto.yaml").read_text())["objective"] == "score"
    assert (out / "train" / "dto" / "finetuned" / "plots" / "metrics" / "train_loss.tsv").read_text().startswith("step\ttrain_loss")
    # The wall time from the stage record; the final training loss, the last row of the gathered curve.
    assert "| DTO-Score | 300 | 58 s | 200 | 1.5 |" in results
    assert json.loads((out / "metrics" / "cpo-a" / "copy_original.json").read_text())["rougeL"]["predictive"] == 70.0
    assert json.loads((out / "stages" / "dto" / "train.json").read_text())["experiment"] == "dto"
    # Each system of the tables with its per-instance scores, as its run wrote them (gzip): the NLL
    # model's, the LLM mode's and the copies' from the first chosen run.
    scores = sorted(str(p.relative_to(out / "scores")) for p in (out / "scores").rglob("*.jsonl.gz"))
    assert scores == ["cpo-b/finetuned.jsonl.gz", "dto/finetuned.jsonl.gz", *(f"exp-nll/{s}.jsonl.gz" for s in (
        "copy_original", "copy_reference", "finetuned", "llm_zero_shot", "nll"))]
    dto = [json.loads(line) for line in gzip.decompress((out / "scores" / "dto" / "finetuned.jsonl.gz").read_bytes()).splitlines()]
    assert dto == _scores(0.3)

    # Collecting again replaces the folder as a whole: nothing of an earlier bundle stays.
    (out / "stale.md").write_text("old")
    write_bundle(runs, out, "test profile")
    assert not (out / "stale.md").exists() and (out / "results.md").exists()
    assert [p.name for p in out.parent.iterdir()] == ["gpu"]


def test_folders_gathered_apart_are_collected_together_and_a_run_is_its_params(gathered, tmp_path, monkeypatch):
    second = tmp_path / "runs-2"
    # Gathered on another machine: its own NLL model (BARTScore -1.95), its own scores; in a git
    # repository made there of a copy of commit 1234abc (offline/job.sh compare), whose own
    # commit (fedcba9) names nothing of the project.
    files = _files("dto-delta", "delta", 1.42, 0.2, -1.8, {"tau": 1.0}, "DTO-Delta")
    files["reports/metrics/nll.json"] = json.dumps(_metrics(-1.95)).encode()
    files["reports/stages/generate-finetuned.json"] = json.dumps({**_record("generate-finetuned", "dto-delta", 30.0),
                                                                  "device": "cpu", "device_name": "cpu", "dtype": "float32",
                                                                  "cut_at_limit": 3}).encode()
    # A RAG mode whose replies were all cached (no LLM ran: no dtype) but whose embedder ran on the CPU.
    files["reports/stages/llm-rag.json"] = json.dumps({**_record("llm-rag", "dto-delta", 2.0), "dtype": None,
                                                       "embedder_device": "cpu", "embedder_device_name": "AMD EPYC (16 cores)"}).encode()
    monkeypatch.setenv("STORYREWRITE_COMMIT", "1234abc")
    gather_run(DictFS(files), {"name": "dto-delta", "rev": "f" * 40, "base": "fedcba9876"}, second)
    monkeypatch.delenv("STORYREWRITE_COMMIT")
    runs = load_runs([gathered, second])
    assert len(runs) == 5
    write_bundle(runs, tmp_path / "out", "two parts")
    results = (tmp_path / "out" / "results.md").read_text()
    assert "| DTO-Delta |" in results
    # Its generate record counted endings cut at the token limit; the other runs' records hold no count.
    assert re.search(r"\*\*Cut at the token limit:\*\* DTO-Delta \(3 of \d+\)\. These endings", results)
    # The CPU the embedder ran on is listed among the devices, apart from the generation's record.
    assert ("5 runs (experiments of commit 1234abc, abcdef1), devices: cpu, cpu (AMD EPYC (16 cores)), "
            "cuda:0 (NVIDIA H100 80GB HBM3). Collected") in results
    assert ("The chosen runs hold 2 different NLL models (trained apart, e.g. on different machines): "
            "cpo-b, dto, exp-nll: BARTScore (M) -1.900; dto-delta: BARTScore (M) -1.950.") in results
    assert ("**Model stages that ran on the CPU although a GPU was used:** generate-finetuned (dto-delta), "
            "llm-rag's embedder (dto-delta)." in (tmp_path / "out" / "stages.md").read_text())
    write_bundle(load_runs([gathered]), tmp_path / "one", "one part")
    assert "different NLL models" not in (tmp_path / "one" / "results.md").read_text()
    # The same params queued again and gathered later (another name, as DVC names a run): it stands for the first.
    gather_run(DictFS(_files("dto", "score", 1.45, 0.3, -1.7, {"tau": 1.0, "hard": False}, "DTO-Score")),
               {"name": "dto-again", "rev": "e" * 40, "base": "abcdef1234"}, second)
    names = [run.name for run in load_runs([gathered, second])]
    assert "dto-again" in names and "dto" not in names and len(names) == 5
    # Sorted by objective, then params, whatever the names.
    assert names == ["cpo-a", "cpo-b", "dto-delta", "exp-nll", "dto-again"]


def _git(cwd, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_experiments_page_says_how_to_reach_the_runs_in_dvc_and_fetch_those_of_another_machine(gathered, tmp_path):
    """Runs from another machine come with the bundle offline/unpack.sh keeps beside them: DVC's
    refs of the experiments, filed under the project's commit. The page names that commit (read
    from the bundle, not from the machine's own commit in the manifest) and a `git fetch` that,
    run in a clone of the project, gives it the experiments."""
    import re

    project, clone, second = tmp_path / "project", tmp_path / "clone", tmp_path / "runs-2"
    project.mkdir()
    _git(project, "init", "-q")
    (project / "params.yaml").write_text("objective: nll\n")
    _git(project, "add", "-A")
    _git(project, "commit", "-qm", "project")
    base = _git(project, "rev-parse", "HEAD")
    _git(tmp_path, "clone", "-q", str(project), str(clone))
    (project / "params.yaml").write_text("objective: delta\n")
    _git(project, "commit", "-qam", "dto-delta")
    experiment = _git(project, "rev-parse", "HEAD")
    ref = f"refs/exps/{base[:2]}/{base[2:]}/dto-delta"
    _git(project, "update-ref", ref, experiment)
    gather_run(DictFS(_files("dto-delta", "delta", 1.42, 0.2, -1.8, {"tau": 1.0}, "DTO-Delta")),
               {"name": "dto-delta", "rev": experiment, "base": "fedcba9876"}, second)
    _git(project, "bundle", "create", "-q", str(second / "exps.bundle"), ref, "--not", base)

    write_bundle(load_runs([gathered, second]), tmp_path / "out", "two parts")
    page = (tmp_path / "out" / "experiments.md").read_text().split("## In DVC")[1]
    assert page.strip().endswith("`dvc metrics diff cpo-a cpo-b` compares two.")
    assert f"`dvc exp show --only-changed --rev abcdef1 --rev {base[:7]}` lists them" in page and "fedcba9" not in page
    fetch = re.findall(r"`(git fetch \S+ 'refs/exps/\*:refs/exps/\*')`", page)
    assert fetch == [f"git fetch {second}/exps.bundle 'refs/exps/*:refs/exps/*'"]
    subprocess.run(fetch[0], shell=True, cwd=clone, check=True, capture_output=True)
    assert _git(clone, "rev-parse", ref) == experiment
    # Runs gathered here: no bundle, no fetch.
    write_bundle(load_runs([gathered]), tmp_path / "here", "one part")
    here = (tmp_path / "here" / "experiments.md").read_text()
    assert "`dvc exp show --only-changed --rev abcdef1` lists them" in here and "git fetch" not in here
    (second / "exps.bundle").write_text("not a bundle\n")
    with pytest.raises(InputError, match=r"runs-2/exps\.bundle: not a git bundle git can read"):
        write_bundle(load_runs([gathered, second]), tmp_path / "out", "two parts")


def test_a_damaged_or_missing_blob_is_named(gathered):
    manifest = json.loads((gathered / "dto.json").read_text())
    digest = manifest["files"]["reports/train/finetuned/metrics.json"]
    blob = gathered / "blobs" / f"{digest}.gz"
    import gzip

    blob.write_bytes(gzip.compress(b"{}"))
    run = next(r for r in load_runs([gathered]) if r.name == "dto")
    with pytest.raises(InputError, match=r"blobs/[0-9a-f]{64}\.gz: content does not match its name"):
        run.summary("finetuned")
    blob.unlink()
    with pytest.raises(InputError, match=r"blobs/[0-9a-f]{64}\.gz: missing \(the gathered folder .* is incomplete\)"):
        run.summary("finetuned")
    (gathered / ".held").write_text("/elsewhere/hold\n")  # offline/pack.sh HOLD moved it
    with pytest.raises(InputError, match=r"blobs/[0-9a-f]{64}\.gz: offline/pack.sh moved it to /elsewhere/hold; move it back "
                                         r"first: HOLD=/elsewhere/hold bash offline/pack.sh restore"):
        run.summary("finetuned")


def test_a_run_whose_params_do_not_name_its_systems_is_named(tmp_path):
    files = _files("old", "score", 1.5, 0.3, -1.7)
    params = yaml.safe_load(files["params.yaml"])
    del params["llm"]
    files["params.yaml"] = yaml.safe_dump(params).encode()
    gather_run(DictFS(files), {"name": "old", "rev": "1" * 40, "base": "abcdef1234"}, tmp_path / "runs")
    with pytest.raises(InputError, match=r"runs/old\.json: the run's params\.yaml needs `task` \(one of timetravel, .*\) and "
                                         r"`llm\.modes` \(a list\); it has task 'timetravel', llm\.modes None"):
        write_bundle(load_runs([tmp_path / "runs"]), tmp_path / "out", "test profile")


def test_no_gathered_runs_is_an_error_naming_the_folder(tmp_path):
    with pytest.raises(InputError, match=r"empty: no gathered runs \(run `python -m storyrewrite.report.gather"):
        load_runs([tmp_path / "empty"])


def test_an_out_folder_that_no_collect_wrote_is_refused_before_any_run_is_read(tmp_path):
    """--out is replaced whole: `--out reports` would take the pipeline's reports with it."""
    from storyrewrite.report.collect import main as collect

    (tmp_path / "results.md").write_text("the pipeline's")
    for out in (tmp_path, tmp_path / "results.md"):
        with pytest.raises(InputError, match=f"^--out {out}: a (folder of other files|file;)"):
            collect([str(tmp_path / "no-runs"), "--out", str(out)])
    assert [p.name for p in tmp_path.iterdir()] == ["results.md"]
    # A folder a collect wrote, an empty one and a new one pass, to the runs' check.
    (tmp_path / "earlier").mkdir()
    (tmp_path / "earlier" / "experiments.md").write_text("")
    (tmp_path / "empty").mkdir()
    for out in ("earlier", "empty", "new"):
        with pytest.raises(InputError, match="no-runs"):
            collect([str(tmp_path / "no-runs"), "--out", str(tmp_path / out)])


def test_gather_runs_dvc_as_a_module_where_there_is_no_dvc_command(tmp_path):
    """As on the GPU machine (DVC installed with `pip --target`): gather still lists the
    experiments, and says there are none to match, naming the pattern; with one in DVC's queue,
    not run, it says so."""
    import os
    import shutil
    import subprocess
    import sys

    path = f"/usr/bin{os.pathsep}/bin"
    assert shutil.which("dvc", path=path) is None
    env = {**os.environ, "PATH": path}
    # Outside a DVC repository: said at once (`dvc exp show` would fail each of its tries, seconds apart).
    outside = subprocess.run([sys.executable, "-m", "storyrewrite.report.gather", "--out", "runs/x", "--finished"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert outside.returncode == 2 and outside.stderr == (f"error: {tmp_path}: not in a DVC repository (`dvc init` makes one); "
                                                          "run this where `dvc exp show` lists the experiments\n")
    for command in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(command, cwd=tmp_path, env=env, check=True, capture_output=True)
    result = subprocess.run([sys.executable, "-m", "storyrewrite.report.gather", "--out", "runs/x", "--names", "gpu-*"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "--names 'gpu-*' matches no experiment; experiments: none" in result.stderr
    # An experiment in DVC's queue, not run: `dvc exp show` lists it, and gather names it.
    (tmp_path / "params.yaml").write_text("x: 1\n")
    (tmp_path / "dvc.yaml").write_text("stages:\n  s:\n    cmd: exit 1\n    params: [x]\n")
    for command in (["git", "add", "-A"], ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                    [sys.executable, "-m", "dvc", "exp", "run", "--queue", "-n", "gpu-a", "-S", "x=2"]):
        subprocess.run(command, cwd=tmp_path, env=env, check=True, capture_output=True)
    result = subprocess.run([sys.executable, "-m", "storyrewrite.report.gather", "--out", "runs/x", "--names", "gpu-*"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "1 experiment(s) did not finish, not gathered: gpu-a (queued)" in result.stderr


def test_exp_show_is_asked_again_after_a_failure_and_a_lasting_one_is_named(tmp_path):
    """`dvc exp show` failing for a moment (as while a queue worker sets up its workspace): the
    third call answers and its output is used; failing every time: one error with DVC's message."""
    import sys

    from storyrewrite.report.gather import exp_show_output

    counter = tmp_path / "calls"
    flaky = [sys.executable, "-c", f"""import pathlib, sys
calls = pathlib.Path({str(counter)!r}); n = int(calls.read_text()) + 1 if calls.exists() else 1; calls.write_text(str(n))
if n < 3:
    sys.exit("ERROR: failed to show experiments - directory '.dvc/tmp/exps/tmpab12/.dvc' does not exist")
print('[]')"""]
    assert exp_show_output(flaky, attempts=5, wait_s=0) == "[]\n" and counter.read_text() == "3"
    counter.unlink()
    with pytest.raises(InputError, match=r"failed 2 times, 0 s apart: ERROR: failed to show experiments - directory"):
        exp_show_output(flaky, attempts=2, wait_s=0)


def test_a_rev_that_names_no_commit_is_refused_before_dvc_is_asked(tmp_path, monkeypatch):
    """`--rev` naming no commit: one error at once, not DVC's refusal asked five times (15 s)."""
    import subprocess

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".dvc").mkdir()  # (a DVC repository's root, as DVC finds one: `dvc exp show` itself is a stub here)
    monkeypatch.chdir(tmp_path)
    asked = []
    monkeypatch.setattr("storyrewrite.report.gather.exp_show_output", lambda command, **_: asked.append(command) or "[]")
    with pytest.raises(InputError, match=r"^--rev v9: not a commit of this repository$"):
        gather(["--out", "runs", "--rev", "v9"])
    assert asked == [] and not (tmp_path / "runs").exists()
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "a"], cwd=tmp_path,
                   check=True)
    with pytest.raises(InputError, match="matches no experiment"):  # a commit: DVC is asked, and lists none
        gather(["--out", "runs", "--rev", "HEAD"])
    assert len(asked) == 1 and asked[0][-2:] == ["--rev", "HEAD"]


def test_a_hung_exp_show_is_killed_and_asked_again(tmp_path):
    """`dvc exp show` that never answers (pygit2's BlobIO waiting for ever on a workspace the queue
    removed, report.gather.EXP_SHOW_TIMEOUT_S): the call is given up after the timeout and asked
    again, so a poll goes on; hanging every time, one error that says so."""
    import sys
    import time

    from storyrewrite.report.gather import exp_show_output

    counter = tmp_path / "calls"
    hangs_once = [sys.executable, "-c", f"""import pathlib, time
calls = pathlib.Path({str(counter)!r}); n = int(calls.read_text()) + 1 if calls.exists() else 1; calls.write_text(str(n))
if n == 1:
    time.sleep(60)
print('[]')"""]
    started = time.monotonic()
    assert exp_show_output(hangs_once, attempts=3, wait_s=0, timeout_s=3) == "[]\n" and counter.read_text() == "2"
    assert time.monotonic() - started < 30  # not the hung call's 60 s
    hangs = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(InputError, match=r"failed 2 times, 0 s apart: no answer in 1 s$"):
        exp_show_output(hangs, attempts=2, wait_s=0, timeout_s=1)


def test_rloo_variants_are_systems_of_their_own_tested_against_dto_of_the_same_reward(tmp_path):
    """Two RLOO runs that differ in their reward are two rows (not a grid to choose from), and
    the one whose counterpart ran is tested against it both ways: RLOO-Score beats DTO-Score on
    every instance (shift 0.6 against 0.3), so p(better) is 0 and p(worse) 1, as compare() says
    of the two score files directly."""
    root = tmp_path / "runs"
    rloo = [("rloo-s", "rloo", 1.47, 0.6, -1.6, {"reward": "score"}, "RLOO-Score", "DTO-Score"),
            ("rloo-d", "rloo", 1.48, 0.1, -1.8, {"reward": "delta"}, "RLOO-Delta", "DTO-Delta")]
    for name, objective, val_nll, shift, bart, settings, label, *counterpart in [*RUNS, *rloo]:
        gather_run(DictFS(_files(name, objective, val_nll, shift, bart, settings, label, counterpart=(counterpart or [None])[0])),
                   {"name": name, "rev": f"{name}-rev".ljust(40, "0"), "base": "abcdef1234"}, root)
    out = tmp_path / "out"
    write_bundle(load_runs([root]), out, "test")
    results = (out / "results.md").read_text()
    table = [line.split(" | ")[0] for line in results.split("## Against")[0].splitlines() if line.startswith("| ")]
    assert "| RLOO-Score" in table and "| RLOO-Delta" in table
    duel = [line for line in results.split("## Against the DTO objective of the same reward")[1].split("##")[0].splitlines() if line.startswith("| RLOO")]
    assert len(duel) == 1 and duel[0].startswith("| RLOO-Score | DTO-Score | < 0.0050 / 1.0000 (better) |")
    significance = json.loads((out / "significance.json").read_text())
    direct = compare({"RLOO-Score": _scores(0.6), "DTO-Score": _scores(0.3)}, "DTO-Score", 200, 0, by_story=True)["RLOO-Score"]
    assert significance["RLOO-Score"]["head_to_head"]["story"]["better"] == direct
    assert "head_to_head" not in significance["RLOO-Delta"]
    assert "## Against the DTO objective of the same reward" in (out / "objectives.md").read_text()
    assert "The same reward; the same NLL model to start from, the same steps, batch size and training seeds." in results


def test_a_head_to_head_names_what_its_two_runs_do_not_share(tmp_path):
    """RLOO gathered on another machine (its own NLL model) and with more steps than the DTO run
    it is set against: the row says so, and the note no longer claims the same start."""
    root, other = tmp_path / "runs", tmp_path / "runs.1"
    for name, objective, val_nll, shift, bart, settings, label in RUNS:
        gather_run(DictFS(_files(name, objective, val_nll, shift, bart, settings, label)),
                   {"name": name, "rev": f"{name}-rev".ljust(40, "0"), "base": "abcdef1234"}, root)
    files = _files("rloo-s", "rloo", 1.47, 0.6, -1.6, {"reward": "score"}, "RLOO-Score", counterpart="DTO-Score")
    files["reports/metrics/nll.json"] = json.dumps(_metrics(-1.95)).encode()
    params = yaml.safe_load(files["params.yaml"])
    params["train"]["max_steps"] = 600
    files["params.yaml"] = yaml.safe_dump(params).encode()
    gather_run(DictFS(files), {"name": "rloo-s", "rev": "f" * 40, "base": "abcdef1234"}, other)
    write_bundle(load_runs([root, other]), tmp_path / "out", "two machines")
    results = (tmp_path / "out" / "results.md").read_text()
    assert "| RLOO-Score | DTO-Score (not the same NLL model, steps) | " in results
    assert "the same NLL model to start from, steps, batch size and training seeds except where the row says otherwise." in results
    significance = json.loads((tmp_path / "out" / "significance.json").read_text())
    assert significance["RLOO-Score"]["head_to_head"]["differs"] == ["NLL model", "steps"]


def test_a_column_two_runs_scored_with_different_models_is_not_tested_head_to_head(tmp_path):
    """RLOO scored with another scorer than the DTO run it is set against (`scored_by`): its
    BARTScore columns are n/a in the head-to-head, and the note says why; ROUGE-L, no model's, is
    tested; against the NLL model of its own run, scored alike, every column is."""
    def scored_by(files: dict, scorer: str) -> dict:
        for path in [p for p in files if p.endswith(".jsonl")]:
            rows = [{**json.loads(line), "scored_by": {"bartscore": scorer}} for line in files[path].decode().splitlines()]
            files[path] = "".join(json.dumps(r) + "\n" for r in rows).encode()
        return files

    root, other = tmp_path / "runs", tmp_path / "runs.1"
    for name, objective, val_nll, shift, bart, settings, label in RUNS:
        gather_run(DictFS(scored_by(_files(name, objective, val_nll, shift, bart, settings, label), "my/lm (float32)")),
                   {"name": name, "rev": f"{name}-rev".ljust(40, "0"), "base": "abcdef1234"}, root)
    files = _files("rloo-s", "rloo", 1.47, 0.6, -1.6, {"reward": "score"}, "RLOO-Score", counterpart="DTO-Score")
    gather_run(DictFS(scored_by(files, "other/lm (bfloat16)")), {"name": "rloo-s", "rev": "f" * 40, "base": "abcdef1234"}, other)
    write_bundle(load_runs([root, other]), tmp_path / "out", "two scorers")
    results = (tmp_path / "out" / "results.md").read_text()
    duel = next(line for line in results.splitlines() if line.startswith("| RLOO-Score | DTO-Score"))
    cells = [cell.strip() for cell in duel.strip("|").split("|")][2:]
    assert cells[0] == "n/a" and cells[1].startswith("< 0.0050 / 1.0000")  # BARTScore (M); ROUGE-L (M): +6 on every instance
    assert NOT_TESTED in results
    significance = json.loads((tmp_path / "out" / "significance.json").read_text())
    assert "bartscore/predictive" in significance["RLOO-Score"]["instance"]
    assert "bartscore/predictive" not in significance["RLOO-Score"]["head_to_head"]["instance"]["better"]


def test_a_head_to_head_sets_the_system_against_the_counterparts_run_of_its_own_seeds(tmp_path):
    """DTO-Score ran with fine-tuning seeds 0 and 1, RLOO-Score with seed 0 only: the tables show
    DTO-Score's seed 1 (the lower validation NLL), and RLOO-Score is set against DTO-Score's seed 0
    run, which it names, as compare() says of those two score files; without that run it is set
    against seed 1 and the row says the seeds differ."""
    root = tmp_path / "runs"
    runs = [("exp-nll", "nll", None, 1.5, 0.0, -1.9, None, "NLL", None),
            ("dto", "score", None, 1.45, 0.3, -1.7, {"tau": 1.0}, "DTO-Score", None),
            ("dto-seed1", "score", 1, 1.40, -0.4, -2.1, {"tau": 1.0}, "DTO-Score", None),
            ("rloo-s", "rloo", None, 1.47, 0.1, -1.8, {"reward": "score"}, "RLOO-Score", "DTO-Score")]
    for name, objective, seed, val_nll, shift, bart, settings, label, counterpart in runs:
        files = _files(name, objective, val_nll, shift, bart, settings, label, counterpart=counterpart)
        params = yaml.safe_load(files["params.yaml"])
        params["train"]["seed"] = seed
        files["params.yaml"] = yaml.safe_dump(params).encode()
        gather_run(DictFS(files), {"name": name, "rev": f"{name}-rev".ljust(40, "0"), "base": "abcdef1234"}, root)
    write_bundle(load_runs([root]), tmp_path / "out", "seeds")
    results = (tmp_path / "out" / "results.md").read_text()
    assert "DTO-Score: dto-seed1" in results  # the main table's DTO-Score
    # RLOO (shift 0.1) below DTO-Score's seed 0 (0.3) on every instance: p(worse) 0.
    assert "| RLOO-Score | DTO-Score (dto) | 1.0000 / < 0.0050 (worse) |" in results
    assert "Where the row names a run, it is not the one the tables above show" in results
    duel = json.loads((tmp_path / "out" / "significance.json").read_text())["RLOO-Score"]["head_to_head"]
    direct = compare({"RLOO-Score": _scores(0.1), "DTO-Score": _scores(0.3)}, "RLOO-Score", 200, 0, by_story=False)["DTO-Score"]
    assert duel["run"] == "dto" and duel["differs"] == [] and duel["instance"]["worse"] == direct

    write_bundle([r for r in load_runs([root]) if r.name != "dto"], tmp_path / "out2", "seed 1 only")
    results = (tmp_path / "out2" / "results.md").read_text()
    # Against seed 1 (shift -0.4): better on every instance, and the row says the seeds differ.
    assert "| RLOO-Score | DTO-Score (not the same training seeds) | < 0.0050 / 1.0000 (better) |" in results
    assert "Where the row names a run" not in results
    # train.seed varies: a null one (the run's `seed`) as params.yaml spells it.
    experiments_table = (tmp_path / "out" / "experiments.md").read_text()
    assert "| rloo-s | rloo | null |" in experiments_table and "| dto-seed1 | score | 1 |" in experiments_table


def test_a_system_run_with_several_training_seeds_gets_its_spread(tmp_path):
    """DTO-Score with three fine-tuning seeds (`train.seed` null, 1, 2; the same NLL model; and a
    repeat of seed 0, which counts once) and NLL continued with one: a row for DTO-Score with the mean ± standard deviation of each column
    (computed here with numpy) and in how many seeds it beats its own NLL model (the two whose
    scores are shifted up, as compare() says of each and each run's significance.json records),
    and none for NLL continued; the main table
    keeps the seed with the lowest validation NLL."""
    import numpy as np

    root = tmp_path / "runs"
    seeds = [("dto", None, 1.45, 0.3, -1.7), ("dto-seed1", 1, 1.44, 0.2, -1.75), ("dto-seed2", 2, 1.47, -0.1, -1.95)]
    repeat = ("dto-seed0", 0, 1.46, 0.9, -1.0)  # train.seed 0 is the top-level seed: a repeat of "dto", not a fourth seed
    for name, seed, val_nll, shift, bart in [*seeds, repeat]:
        files = _files(name, "score", val_nll, shift, bart, {"tau": 1.0, "hard": False}, "DTO-Score")
        params = yaml.safe_load(files["params.yaml"])
        params["train"]["seed"] = seed
        files["params.yaml"] = yaml.safe_dump(params).encode()
        gather_run(DictFS(files), {"name": name, "rev": f"{name}-rev".ljust(40, "0"), "base": "abcdef1234"}, root)
    gather_run(DictFS(_files("exp-nll", "nll", 1.5, 0.0, -1.9, None, "NLL")),
               {"name": "exp-nll", "rev": "exp-nll-rev".ljust(40, "0"), "base": "abcdef1234"}, root)
    write_bundle(load_runs([root]), tmp_path / "out", "seeds")
    results = (tmp_path / "out" / "results.md").read_text()
    section = results.split("## Across training seeds")[1].split("##")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| System")]
    assert len(rows) == 1 and rows[0].startswith("| DTO-Score | 0/0, 0/1, 0/2 | ")
    bart = np.array([b for *_, b in seeds])
    rouge = np.array([60 + 10 * shift for *_, shift, _ in seeds])
    beats = sum(compare({"nll": _scores(0.0), "dto": _scores(shift)}, "nll", 200, 0, by_story=False)["dto"]["bartscore/predictive"] < 0.05
                for *_, shift, _ in seeds)
    assert beats == 2
    cells = rows[0].split(" | ")
    assert cells[2] == f"{bart.mean():.3f} ± {bart.std(ddof=1):.3f} ({beats}/3)"
    assert cells[3].startswith(f"{rouge.mean():.1f} ± {rouge.std(ddof=1):.1f} (")
    assert "NLL (" not in section  # one NLL model: no spread of its own
    assert "DTO-Score (dto-seed1)" not in results and "DTO-Score: dto-seed1" in results  # the lowest validation NLL

    # Without a second seed of any system there is no such section.
    write_bundle([r for r in load_runs([root]) if r.name in ("dto", "dto-seed0", "exp-nll")], tmp_path / "out2", "one seed")
    assert "## Across training seeds" not in (tmp_path / "out2" / "results.md").read_text()


def test_the_spread_over_seeds_lists_the_systems_by_label_whatever_the_run_names(tmp_path):
    """DVC names runs at random: the seeds section's rows follow the systems' labels."""
    root = tmp_path / "runs"
    for name, objective, label, seed in (("a-run", "score", "DTO-Score", None), ("b-run", "score", "DTO-Score", 1),
                                         ("c-run", "delta", "DTO-Delta", None), ("d-run", "delta", "DTO-Delta", 1)):
        files = _files(name, objective, 1.45, 0.3, -1.7, {"tau": 1.0}, label)
        params = yaml.safe_load(files["params.yaml"])
        params["train"]["seed"] = seed
        files["params.yaml"] = yaml.safe_dump(params).encode()
        gather_run(DictFS(files), {"name": name, "rev": f"{name}-rev".ljust(40, "0"), "base": "abcdef1234"}, root)
    write_bundle(load_runs([root]), tmp_path / "out", "order")
    section = (tmp_path / "out" / "results.md").read_text().split("## Across training seeds")[1].split("##")[0]
    rows = [line.split(" | ")[0] for line in section.splitlines() if line.startswith("| ") and not line.startswith("| System")]
    assert rows == ["| DTO-Delta", "| DTO-Score"]


def test_runs_with_their_own_nll_seeds_show_the_nll_models_spread_too(tmp_path):
    """Two DTO-Score runs whose NLL models were trained with different `train_nll.seed`: the
    system's row and a row of the two NLL models' own spread."""
    import numpy as np

    root = tmp_path / "runs"
    for name, nll_seed, nll_bart in (("dto", None, -1.9), ("dto-nll1", 1, -1.96)):
        files = _files(name, "score", 1.45, 0.3, -1.7 + nll_bart + 1.9, {"tau": 1.0, "hard": False}, "DTO-Score")
        params = yaml.safe_load(files["params.yaml"])
        params["train_nll"] = {"seed": nll_seed}
        files["params.yaml"] = yaml.safe_dump(params).encode()
        files["reports/metrics/nll.json"] = json.dumps(_metrics(nll_bart)).encode()
        gather_run(DictFS(files), {"name": name, "rev": f"{name}-rev".ljust(40, "0"), "base": "abcdef1234"}, root)
    write_bundle(load_runs([root]), tmp_path / "out", "NLL seeds")
    section = (tmp_path / "out" / "results.md").read_text().split("## Across training seeds")[1].split("##")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| System")]
    assert [row.split(" | ")[:2] for row in rows] == [["| DTO-Score", "0/0, 1/0"], ["| NLL (2 models)", "0, 1"]]
    nll = np.array([-1.9, -1.96])
    assert rows[1].split(" | ")[2] == f"{nll.mean():.3f} ± {nll.std(ddof=1):.3f}"


def test_the_systems_without_a_run_are_those_the_task_can_train(shipped_objectives):
    """ART has no original ending: DTO-Delta, DTO-Score+Delta, CPO and RLOO on those rewards cannot
    be trained there, so a comparison of ART lacks only what it could have run."""
    from types import SimpleNamespace

    def run(task, objective, reward="score"):
        return SimpleNamespace(params={"task": task, "objective": objective, "rl": {"reward": reward}})

    assert systems_without_a_run([run("art", "nll"), run("art", "score")]) == ["RLOO-Score"]
    assert systems_without_a_run([run("art", "nll"), run("art", "score"), run("art", "rloo")]) == []
    every = [run("timetravel", o) for o in ("nll", "cpo", "score", "delta", "score_delta")]
    every += [run("timetravel", "rloo", reward) for reward in ("score", "delta")]
    assert systems_without_a_run(every) == ["RLOO-Score+Delta"]


def test_the_readme_says_what_the_collected_comparison_shows(gathered, tmp_path, monkeypatch, shipped_objectives):
    """The README's three sentences (storyrewrite.docs, block gpu-results) restate the page the
    collector wrote: the marks of both bootstrap levels, the copy's column-by-column count and
    the systems with no run."""
    from storyrewrite import docs

    write_bundle(load_runs([gathered]), tmp_path / "reports" / "gpu", "gpu (params/gpu.yaml)")
    monkeypatch.setattr(docs, "ROOT", tmp_path)
    said = docs.gpu_results()
    assert said.startswith("[reports/gpu/results.md](reports/gpu/results.md), 9 test instances of `timetravel` "
                           "(`params/gpu.yaml`, cuda:0 (NVIDIA H100 80GB HBM3)), column by column, better than NLL at "
                           "p < 0.05 resampling both instances and stories: DTO-Score on BARTScore (M), ROUGE-L (M), ")
    # DTO-Score's p = 0 on every column at both levels (its scores beat NLL's on every instance), the
    # two others' p = 1 (test_the_bundle_compares_the_best_run_of_each_objective_with_nll).
    assert "(-1.700, 63.0, " in said and "; NLL, continued and CPO (beta=2) on none of them." in said
    assert "Copying the original ending matches or beats every trained system on BARTScore (M), ROUGE-L (M)" in said
    assert said.endswith("It holds no run of DTO-Delta, DTO-Score+Delta, RLOO-Score, RLOO-Delta or RLOO-Score+Delta yet.")
    # Columns where the copy beats some trained systems, grouped by which.
    page = tmp_path / "reports" / "gpu" / "results.md"
    text = page.read_text()
    copy = text.split("## The copy of the original ending")[1].split("## Training")[0]
    lines = [line for line in copy.splitlines() if line.startswith("| ") and not line.startswith("| Column")]
    changed = copy
    for line, beaten in zip(lines[:4], ["3 of 4 (NLL; NLL, continued; CPO (beta=2))", "1 of 4 (CPO (beta=2))",
                                    "3 of 4 (NLL; NLL, continued; CPO (beta=2))", "0 of 4"], strict=True):
        changed = changed.replace(line, line.rsplit(" | ", 1)[0] + f" | {beaten} |")
    page.write_text(text.replace(copy, changed))
    assert ("matches or beats 3 of 4 trained systems (all but DTO-Score) on BARTScore (M) and SacreBLEU (M); "
            "1 of 4 trained systems (CPO (beta=2)) on ROUGE-L (M); no trained system on BARTScore (M + Δ_M); every "
            "trained system on ") in docs.gpu_results()
    # How often each keeps X_OE word for word (0 % in every row of these runs: set here).
    kept = page.read_text().split("| System | endings that keep X_OE word for word (%) |")[1].split("\n\n")[0]
    shares = {"NLL": "66.3", "NLL, continued": "66.6", "CPO (beta=2)": "12.0", "DTO-Score": "86.8", "SmolLM2 zero-shot (local)": "0.4",
              "Copy of the reference (upper bound)": "1.0"}
    assert [line.split(" | ")[0].removeprefix("| ") for line in kept.splitlines()[2:]] == list(shares)
    page.write_text(page.read_text().replace(kept, "\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in shares.items())))
    assert ("; the fine-tuned systems keep X_OE word for word in 12.0 % (CPO (beta=2)) to 86.8 % (DTO-Score) of their "
            "endings, NLL in 66.3 %, the reference rewrites in 1.0 %. It holds no run") in docs.gpu_results()
    page.unlink()
    assert docs.gpu_results().startswith("No full-data comparison yet")


def test_how_often_each_system_keeps_the_original_ending_word_for_word():
    """An ending keeps X_OE where the score stage's ROUGE-L against X_OE is 100: the same words
    in the same order, case and punctuation aside, as counted here by comparing the words. The
    copy of X_OE itself is left out; a task without an original ending gets nothing."""
    import re

    from storyrewrite.metrics.columns import keeps_original
    from storyrewrite.metrics.lexical import rouge_l

    x_oe = ["She won a prize.", "He ate the trout.", "They went home.", "It rained all day."]
    endings = {"nll": ["she won a prize", "He ate the trout!", "They went home at last.", "It rained all day."],
               "finetuned": ["She won no prize.", "He ate the trout.", "Home they went.", "It snowed all day."],
               "copy_original": x_oe}

    class Scored:  # a run's per-instance rows, as the score stage writes them
        def scores(self, system):
            return [{"rougeL_original": value} for value in rouge_l(endings[system], x_oe)]

    def words(text):
        return re.findall(r"[a-z0-9]+", text.lower())

    counted = {system: 100 * sum(words(e) == words(o) for e, o in zip(found, x_oe, strict=True)) / len(x_oe)
               for system, found in endings.items()}
    assert counted == {"nll": 75.0, "finetuned": 25.0, "copy_original": 100.0}
    assert {system: keeps_original(Scored().scores(system)) for system in endings} == counted
    entries = [Entry("NLL", Scored(), "nll", "baseline"), Entry("DTO-Score", Scored(), "finetuned", "trained"),
               Entry("Copy of the original ending", Scored(), "copy_original", "copy")]
    table, meaning = kept_original(entries)
    assert table.splitlines()[2:] == ["| NLL | 75.0 |", "| DTO-Score | 25.0 |"] and "ROUGE-L against X_OE is 100" in meaning
    assert keeps_original([{"rougeL": 50.0}]) is None and keeps_original([]) is None  # ART: no original ending
    # A long ending with one word more is no copy, though its ROUGE-L against X_OE rounds to 100.
    long = " ".join(f"word{i}" for i in range(150))
    near = rouge_l([long + " more"], [long])
    assert 99.5 < near[0] < 100 and keeps_original([{"rougeL_original": v} for v in near]) == 0.0


def test_a_sweeps_runs_that_ran_before_are_left_out_before_they_are_queued(tmp_path, monkeypatch, capsys):
    """The plan expands a sweep as DVC does and applies each run to params.yaml with DVC's own code;
    a run with the params of one gathered before, or of one here that finished, runs or is queued,
    is left out, and the experiments here that stand in for runs are named. A sweep that leaves
    nothing out is queued as it is."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text((ROOT / "params.yaml").read_text())
    base = yaml.safe_load(params_file.read_text())

    def run(**changes) -> dict:  # params.yaml with `section.key` values changed, computed without DVC
        params = json.loads(json.dumps(base))
        for key, value in changes.items():
            section, _, name = key.partition("__")
            if name:
                params[section][name] = value
            else:
                params[section] = value
        return params

    def entry(name, params, state=None):
        return {"executor": None if state is None else {"state": state}, "name": name,
                "revs": [{"rev": name * 4, "name": name, "data": {"params": {"params.yaml": {"data": params}}}}]}
    cpo = ["device=cuda", "objective=cpo", "cpo.beta=0.1,0.5,2", "cpo.lambda=1,2"]
    dto = ["device=cuda", "objective=score,delta"]
    exp_show = [{"rev": "abcdef1234", "experiments": [
        entry("done", run(device="cuda", objective="cpo", cpo__beta=0.5, cpo__lambda=2)),
        entry("waiting", run(device="cuda", objective="cpo", cpo__beta=2, cpo__lambda=1), "queued"),
        entry("broke", run(device="cuda", objective="cpo", cpo__beta=0.1, cpo__lambda=1), "failed")]}]
    gathered = [run(device="cuda", objective="cpo", cpo__beta=0.1, cpo__lambda=2)]
    calls, stand_ins, left_out, refused, queued, _ = plan([cpo, dto], params_file, exp_show, gathered)
    assert (stand_ins, left_out, refused, queued) == (["done", "waiting"], 3, [], 3 + 2)
    # 0.1 x 1 failed here: queued again; 0.1 x 2 was gathered; 0.5 x 2 and 2 x 1 are here.
    expected = [["device=cuda", "objective=cpo", f"cpo.beta={beta}", f"cpo.lambda={lam}"]
                for beta, lam in (("0.1", "1"), ("0.5", "1"), ("2", "2"))]
    assert calls == [*expected, dto]
    # Each planned run's params, as DVC writes them, equal the ones computed here (a float stays one).
    assert [params for _, params in sweep_runs(expected[1], params_file)] == [run(device="cuda", objective="cpo", cpo__beta=0.5,
                                                                                  cpo__lambda=1)]
    # A setting of speed alone tells no runs apart (as in the dedupe).
    fast = ["objective=rloo", "rl.early_stop=false"]
    assert plan([fast], params_file, [], [run(objective="rloo")])[:2] == ([], [])

    # On the command line: sweeps on stdin, the calls on stdout, the stand-ins in a file.
    show, folder = tmp_path / "show.json", tmp_path / "runs" / "gpu.2"
    show.write_text(json.dumps(exp_show))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO(" ".join(f"-S {w}" for w in cpo) + "\n\n" + " ".join(f"-S {w}" for w in dto) + "\n"))
    gather(["--json", str(show), "--plan", str(folder), "--stand-ins", "names", "--runs", "runs"])  # (a folder not there: none gathered)
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "-S device=cuda -S objective=score,delta" and len(out.splitlines()) == 5
    assert (tmp_path / "names").read_text() == "done\nwaiting\n"
    # The workers' experiments: the 6 runs the calls queue (the 0.1 x 2 one was not gathered into
    # that folder), and `waiting`, queued here; `done` ran to the end and needs no worker.
    assert (tmp_path / "runs").read_text() == "7\n"
    assert "2 run(s) of these sweeps have the params of one that ran or is queued: not queued (here: done, waiting)" in err
    monkeypatch.setattr("sys.stdin", io.StringIO("-S device=cuda -S objective=cpo -S cpo.beta=0.5 -S cpo.lambda=2\n"))
    gather(["--json", str(show), "--plan"])
    assert capsys.readouterr().out == ""  # all left out: no call at all, not an empty one
    # On ART (no original ending) core's and cpo's sweeps queue only what the task serves: NLL
    # continued, DTO-Score, RLOO on the score reward; the rest is named, not queued to fail.
    core = [["task=art", "objective=rloo", "rl.reward=score,delta,score_delta"], ["task=art", "objective=nll,score,delta,score_delta"],
            ["task=art", "objective=cpo", "cpo.beta=0.1,0.5", "cpo.lambda=1"]]
    calls, stand_ins, left_out, refused, queued, _ = plan(core, params_file, [], [])
    assert calls == [["task=art", "objective=rloo", "rl.reward=score"], ["task=art", "objective=nll"], ["task=art", "objective=score"]]
    assert (stand_ins, left_out, queued) == ([], 0, 3) and refused == [
        "rloo (rl.reward=delta) on art", "rloo (rl.reward=score_delta) on art", "delta on art", "score_delta on art",
        "cpo on art", "cpo on art"]
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(" ".join(f"-S {w}" for w in sweep) + "\n" for sweep in core)))
    gather(["--json", str(show), "--plan", "--refused", "refused"])
    out, err = capsys.readouterr()
    assert out.splitlines() == ["-S task=art -S objective=rloo -S rl.reward=score", "-S task=art -S objective=nll",
                                "-S task=art -S objective=score"]
    assert (tmp_path / "refused").read_text().splitlines() == refused  # the script's count of runs to gather drops them
    assert err.strip() == ("6 run(s) of these sweeps need the original ending, which their task does not have: not queued "
                           "(rloo (rl.reward=delta) on art, rloo (rl.reward=score_delta) on art, delta on art, score_delta on art, "
                           "cpo on art ×2)")
    monkeypatch.setattr("sys.stdin", io.StringIO("-S objective=cpo\nobjective=cpo\n"))
    with pytest.raises(InputError, match=r"stdin, line 2: not a line of `-S key=value` pairs: 'objective=cpo'"):
        gather(["--json", str(show), "--plan"])
    monkeypatch.setattr("sys.stdin", io.StringIO("-S objective=cpo -S cpo.betta=0.1,0.5\n"))
    with pytest.raises(InputError, match=r"-S objective=cpo -S cpo.betta=0.1,0.5: .*Could not override 'cpo.betta'"):
        gather(["--json", str(show), "--plan"])


def test_a_plan_with_a_limit_queues_the_first_runs_and_leaves_the_rest_to_the_next(tmp_path, monkeypatch, capsys):
    """--limit N: at most N runs queued, the first in the sweeps' order (core's RLOO runs first);
    made again once those ran, the same plan queues the next ones; a limit above the runs left
    changes nothing."""
    params_file = tmp_path / "params.yaml"
    params_file.write_text((ROOT / "params.yaml").read_text())
    core = [["objective=rloo", "rl.reward=score,delta,score_delta"], ["objective=nll,score,delta,score_delta"]]
    one = lambda *words: list(words)  # noqa: E731
    assert plan(core, params_file, [], [], limit=2) == (
        [one("objective=rloo", "rl.reward=score"), one("objective=rloo", "rl.reward=delta")], [], 0, [], 2, 5)
    ran = [params for call in plan(core, params_file, [], [], limit=2).calls for _, params in sweep_runs(call, params_file)]
    assert plan(core, params_file, [], ran, limit=2) == (
        [one("objective=rloo", "rl.reward=score_delta"), one("objective=nll")], [], 2, [], 2, 3)
    assert plan(core, params_file, [], ran, limit=4) == (
        [one("objective=rloo", "rl.reward=score_delta"), one("objective=nll"), one("objective=score"), one("objective=delta")],
        [], 2, [], 4, 1)
    assert plan(core, params_file, [], [], limit=7) == plan(core, params_file, [], []) == (core, [], 0, [], 7, 0)
    # A run that repeats one left for later is left for later too, not counted as run before.
    again = [["objective=rloo", "rl.reward=score,delta"], ["objective=rloo", "rl.reward=delta"]]
    assert plan(again, params_file, [], [], limit=1) == ([one("objective=rloo", "rl.reward=score")], [], 0, [], 1, 2)
    assert plan(again, params_file, [], [], limit=2) == ([again[0]], [], 1, [], 2, 0)

    show = tmp_path / "show.json"
    show.write_text("[]")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(" ".join(f"-S {w}" for w in sweep) + "\n" for sweep in core)))
    gather(["--json", str(show), "--plan", "--limit", "1", "--runs", "runs", "--deferred", "deferred"])
    out, err = capsys.readouterr()
    assert out == "-S objective=rloo -S rl.reward=score\n" and (tmp_path / "runs").read_text() == "1\n"
    assert err == ("6 run(s) of these sweeps left for a later command (at most 1 queued): the same command queues them "
                   "once these ran\n") == (tmp_path / "deferred").read_text()
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(" ".join(f"-S {w}" for w in sweep) + "\n" for sweep in core)))
    gather(["--json", str(show), "--plan", "--limit", "7", "--deferred", "deferred"])  # nothing left for later
    assert (tmp_path / "deferred").read_text() == "" and capsys.readouterr().err == ""
    with pytest.raises(SystemExit):
        gather(["--json", str(show), "--plan", "--limit", "0"])
    assert "--limit: must be a whole number >= 1, got '0'" in capsys.readouterr().err


def test_the_gpu_runs_gathered_before_are_not_planned_again():
    """The GPU comparison gathered four runs into runs/gpu.2 (NLL continued, DTO-Score, -Delta,
    -Score+Delta): planned again with the GPU profile's overrides, core's DTO sweep leaves all
    four out. A setting added since (params.yaml) must not make them differ, or the next GPU run
    trains them again: a setting of speed alone goes in gather.SPEED_ONLY, one whose value would
    change the numbers in gather.ADDED_LATER with the value those runs had. A change that does
    alter what they compute fails here on purpose: then they have to run again."""
    import subprocess
    import sys

    from storyrewrite.report.gather import gathered_params

    overrides = subprocess.run([sys.executable, "-m", "storyrewrite.profiles", "overrides", "params/gpu.yaml"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.split()
    words = [word for word in overrides if word != "-S"]
    gathered = gathered_params([ROOT / "runs" / "gpu.2"])
    assert sorted(params["objective"] for params in gathered) == ["delta", "nll", "score", "score_delta"]
    assert plan([[*words, "objective=nll,score,delta,score_delta"]], ROOT / "params.yaml", [], gathered) == ([], [], 4, [], 0, 0)


class _ScoredRun:
    """A run as `p_values` reads it: per-instance scores by system, and its params."""

    def __init__(self, scores: dict[str, list[dict]]):
        self._scores, self.params = scores, {"significance": {"n_resamples": 500}, "seed": 3}

    def scores(self, system: str) -> list[dict]:
        return self._scores[system]


def test_systems_tested_together_get_the_p_values_of_their_own_tests():
    """p_values tests every system in one bootstrap per unit: each gets the p-values of its own
    test against its run's NLL model (compare_units), across two runs of different NLL scores."""
    import numpy as np

    from storyrewrite.report.collect import BASELINE, Entry, p_values
    from storyrewrite.significance.compare import compare_units

    rng = np.random.default_rng(5)

    def noisy(shift):
        return [{**row, "bartscore": row["bartscore"] + float(rng.normal(shift, 0.2)),
                 "rougeL": row["rougeL"] + float(rng.normal(10 * shift, 2))} for row in _scores(0.0)]

    first = _ScoredRun({BASELINE: noisy(0.0), "finetuned": noisy(0.05), "llm_zero_shot": noisy(-0.1), "copy_original": noisy(0.0)})
    second = _ScoredRun({BASELINE: noisy(0.02), "finetuned": noisy(0.1)})
    entries = [Entry("NLL", first, BASELINE, "baseline"), Entry("DTO-Score", first, "finetuned", "trained"),
               Entry("CPO", second, "finetuned", "trained"), Entry("zero-shot", first, "llm_zero_shot", "llm"),
               Entry("Copy of the original ending", first, "copy_original", "copy")]
    found = p_values(entries, first)
    assert list(found) == ["DTO-Score", "CPO", "zero-shot", "Copy of the original ending"]
    for e in entries[1:]:
        assert found[e.label] == compare_units({BASELINE: e.run.scores(BASELINE), e.label: e.run.scores(e.system)}, e.label, BASELINE, 500, 3)
    values = [p for e in entries[1:] for unit in ("instance", "story") for p in found[e.label][unit].values()]
    assert len(set(values)) > 4  # p-values that tell the systems apart


def test_a_param_cell_spells_the_value_as_params_yaml_and_dash_s_take_it(tmp_path):
    # The cell is what `dvc exp run -S key=<cell>` takes and what reads back as the run's value.
    files = _files("dto", "score", 1.45, 0.3, -1.7, {"tau": 1.0}, "DTO-Score")
    params = yaml.safe_load(files["params.yaml"])
    params["train"] |= {"lr": 2e-5, "seed": None, "bf16": True, "precision": "bf16-mixed"}
    files["params.yaml"] = yaml.safe_dump(params).encode()
    gather_run(DictFS(files), {"name": "dto", "rev": "dto-rev".ljust(40, "0"), "base": "abcdef1234"}, tmp_path)
    run = load_runs([tmp_path])[0]
    cells = {key: param_cell(run, key) for key in ("train.lr", "train.seed", "train.bf16", "train.precision", "llm.modes", "train.nowhere")}
    assert cells == {"train.lr": "2.0e-05", "train.seed": "null", "train.bf16": "true", "train.precision": "bf16-mixed",
                     "llm.modes": "[zero_shot]", "train.nowhere": ""}
    assert all(yaml.safe_load(cells[key]) == value for key, value in [("train.lr", 2e-5), ("train.seed", None), ("llm.modes", ["zero_shot"])])
    assert param_cell(run, "cpo.beta") == "-"  # a section the run's objective does not read


def test_the_experiments_table_shows_only_settings_some_run_reads_and_says_what_an_empty_cell_is(tmp_path):
    """A CPO run of a newer commit (score.fp32_matmul, score.bertscore_rescale, rl.early_stop in
    its params) beside a DTO run of an older one (none of them). score.fp32_matmul, added later
    (gather.ADDED_LATER), stands at ieee in the older run: shown where the newer run's differs
    (tf32), not where it is ieee too. score.bertscore_rescale varies and is shown, empty for the DTO
    run, and said so; rl.early_stop is RLOO's, read by neither run, and is left out."""
    def header_and_table(fp32_matmul: str) -> tuple[str, str]:
        runs, out = tmp_path / fp32_matmul / "runs", tmp_path / fp32_matmul / "out"
        for name, objective, newer in (("cpo-new", "cpo", True), ("dto-old", "score", False)):
            files = _files(name, objective, 1.4, 0.3, -1.7, {"beta": 0.5} if objective == "cpo" else {"tau": 1.0}, objective.upper())
            params = yaml.safe_load(files["params.yaml"])
            params["score"] = {"batch_size": 64}
            if newer:
                params["score"] |= {"fp32_matmul": fp32_matmul, "bertscore_rescale": True}
                params["rl"]["early_stop"] = False
            files["params.yaml"] = yaml.safe_dump(params).encode()
            gather_run(DictFS(files), {"name": name, "rev": f"{name}-rev".ljust(40, "0"), "base": "abcdef1234"}, runs)
        write_bundle(load_runs([runs]), out, "two commits")
        table = (out / "experiments.md").read_text()
        return next(line for line in table.splitlines() if line.startswith("| Experiment |")), table

    header, table = header_and_table("tf32")
    assert "| cpo.beta | score.bertscore_rescale | score.fp32_matmul |" in header and "rl.early_stop" not in header
    assert "| cpo-new | cpo | 0.5 | true | tf32 |" in table and "| dto-old | score | - |  | ieee |" in table
    assert "-: a setting of another objective" in table and "Empty: the run's params.yaml has no such setting" in table
    header, _ = header_and_table("ieee")
    assert "| cpo.beta | score.bertscore_rescale |" in header and "fp32_matmul" not in header


def test_a_blob_is_the_same_bytes_whenever_it_is_gathered(tmp_path, monkeypatch):
    """gzip writes the time into its header: a blob stored at another time would be another file
    for git, though its content is the same."""
    import time

    stored = []
    for now in (1.0e9, 2.0e9):
        monkeypatch.setattr(time, "time", lambda now=now: now)
        digest = store_blob(b"the same scores", tmp_path / str(now))
        stored.append((digest, (tmp_path / str(now) / f"{digest}.gz").read_bytes()))
    assert stored[0] == stored[1] and gzip.decompress(stored[0][1]) == b"the same scores"


def test_a_cpo_run_is_labelled_by_the_settings_its_grid_varies_as_the_paper_names_them():
    """The training summary holds the settings as the config dumps them (CPO's `lambda_`, a
    Python keyword's spelling); a label names the ones that differ between the system's runs,
    `lambda` as params.yaml and the paper spell it."""
    from types import SimpleNamespace

    from storyrewrite.objectives.registry import CPOConfig
    from storyrewrite.report.collect import objective_label

    def run(beta, lambda_):
        settings = CPOConfig.model_validate({"beta": beta, "lambda": lambda_}).model_dump()
        return SimpleNamespace(params={"objective": "cpo"}, summary=lambda system: {"label": "CPO", "settings": settings})

    grid = [run(0.1, 1.0), run(0.1, 2.0), run(0.5, 2.0)]
    assert [objective_label(r, grid) for r in grid] == ["CPO (beta=0.1, lambda=1.0)", "CPO (beta=0.1, lambda=2.0)",
                                                         "CPO (beta=0.5, lambda=2.0)"]
    assert objective_label(grid[1], grid[1:]) == "CPO (beta=0.1)"
    assert objective_label(grid[0], grid[:1]) == "CPO"
