"""The whole pipeline through `dvc repro`, in a temporary copy of the repository, with tiny
random-init models: the default profile (causal LM path) and the paper profile (seq2seq path)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from storyrewrite.params import load_yaml, overlay

from helpers import ROOT, read_jsonl

TINY = {
    "data": {"max_train": 6, "max_eval": 3},
    "train_nll": {"max_steps": 2, "val_check_interval": 2, "checkpoint_every_n_steps": 2, "accelerator": "cpu",
                  "precision": "32-true", "max_epochs": 1},
    "train": {"max_steps": 1, "val_check_interval": 1, "checkpoint_every_n_steps": 1, "accelerator": "cpu",
              "precision": "32-true", "max_epochs": 1},
    "generate": {"max_new_tokens": 4, "batch_size": 4, "num_beams": 1},
    "llm": {"max_new_tokens": 4},
    "rl": {"samples": 2, "max_new_tokens": 4},
    "significance": {"n_resamples": 1000},
}
# One LLM mode per profile: here one that does not retrieve (llm_index writes its empty index), in
# the paper profile's test rag (llm_index builds the index). The other two modes are the same
# stages with another choice of example (tests/llm); each mode costs two stage processes, most of
# it imports.
MODES = ("one_shot_fixed",)
ALL_STAGES = {"download", "prepare", "models", "eval_models", "train_nll", "train", "generate@nll", "generate@finetuned",
              "sanity", "score@nll", "score@finetuned", "score_sanity", "validity", "significance", "report", "llm_index",
              *(f"llm@{m}" for m in MODES), *(f"score_llm@{m}" for m in MODES)}


def _copy_repo(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    for name in files:
        if name == "dvc.lock" or not (ROOT / name).is_file():
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    _commit(dest, "clone")  # as a clone is: DVC's experiments and DVCLive need a commit to stand on


def _commit(repo: Path, message: str) -> None:
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True, capture_output=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message], cwd=repo, check=True)


def _dvc(repo: Path, *args: str, ok: bool = True) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert (result.returncode == 0) == ok, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout if ok else result.stdout + result.stderr


def _ran(output: str) -> set[str]:
    """The stages DVC ran (or, dry, would run): its `Running stage 'NAME':` lines, not a stage's own output quoting one."""
    return set(re.findall(r"^Running stage '([^']+)':", output, flags=re.MULTILINE))


def _write_params(repo: Path, *layers: dict) -> None:
    params = load_yaml(repo / "params.yaml")
    for layer in layers:
        params = overlay(params, layer)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.mark.slow
def test_default_profile_end_to_end(tmp_path):
    _copy_repo(tmp_path)
    # The objective as params.yaml ships it: NLL continued, whatever a clone has made its default.
    _write_params(tmp_path, TINY, {"objective": "nll", "models": {"generator": "tiny:llama", "scorer": "tiny:llama",
                                                                 "judge": "tiny:llama", "embedder": "tiny:roberta"},
                                   "llm": {"modes": list(MODES)}})
    output = _dvc(tmp_path, "repro")
    assert _ran(output) == ALL_STAGES
    for system in ("nll", "finetuned"):
        predictions = read_jsonl(tmp_path / "predictions" / f"{system}.jsonl")
        assert len(predictions) == 3
    counts = yaml.safe_load((tmp_path / "reports" / "data_counts.json").read_text())
    assert counts["timetravel"]["test"]["instances_full"] == 5613
    results = (tmp_path / "reports" / "results.md").read_text()
    for label in ("| NLL |", "| NLL, continued (+1 steps) |", "| Copy of the reference (upper bound) |", "| Copy of the original ending |",
                  "| tiny:llama one-shot, fixed example (local) |"):
        assert label in results
    assert "zero-shot" not in results and "random example" not in results and "RAG" not in results  # `llm.modes` only
    assert json.loads((tmp_path / "reports" / "stages" / "llm_index.json").read_text())["built"] is False
    assert (tmp_path / "reports" / "results.tex").read_text().startswith("\\begin{table}")
    # The coherence table, with the judge named as the training scorer, and the validity figures.
    following = results.split("## Following the counterfactual")[1].split("## Metric validity")[0]
    assert "| System | CF-PMI | follows X_CE (%) | drift |" in following and "The judge is the training scorer" in following
    assert "The judge wrote the endings of tiny:llama one-shot, fixed example (local) itself" in following
    assert "EntScore and HMean: not computed (`models.nli` is null" in following
    assert "| CF-PMI | as they are | 3 |" in results and "| drift similarity | against the story's other references | 3 |" in results
    significance = json.loads((tmp_path / "reports" / "significance.json").read_text())
    assert {"cf_pmi", "cf_follow", "drift"} <= set(significance["p_values"]["finetuned"])
    # How often each system keeps X_OE word for word (storyrewrite.metrics.columns.keeps_original, tested
    # against a count of its own in test_collect), from the score stage's rows: every system but the copy of X_OE.
    kept = results.split("| System | endings that keep X_OE word for word (%) |")[1].split("\n\n")[0].splitlines()[2:]
    assert [row.split(" | ")[0] for row in kept] == ["| NLL", "| NLL, continued (+1 steps)", "| tiny:llama one-shot, fixed example (local)",
                                                    "| Copy of the reference (upper bound)"]
    # The stage records count what the stages wrote (reports/results.md's cost rows divide by them).
    records = {path.stem: json.loads(path.read_text()) for path in (tmp_path / "reports" / "stages").glob("*.json")}
    for stage, files in (("score-nll", [tmp_path / "reports" / "scores" / "nll.jsonl"]),
                         ("score_sanity", sorted((tmp_path / "reports" / "sanity" / "scores").glob("*.jsonl")))):
        assert records[stage]["items"] == sum(len(read_jsonl(path)) for path in files) > 0
        assert records[stage]["systems"] == len(files) and {"load_models", "bartscore", "rougeL", "cf_pmi", "drift"} <= set(records[stage]["seconds"])
    assert (records["validity"]["items"], records["validity"]["unit"]) == (3, "instances")
    p_values = json.loads((tmp_path / "reports" / "significance.json").read_text())["p_values"]
    assert records["significance"]["items"] == len(p_values) * TINY["significance"]["n_resamples"]
    # The three test instances are one story's three rewrites: one input, decoded once; a random-init
    # model ends no ending within 4 tokens, so each is cut at the limit, and the report says so.
    for system in ("nll", "finetuned"):
        record = records[f"generate-{system}"]
        assert (record["items"], record["predictions"], record["resumed"], record["cut_at_limit"]) == (1, 3, 0, 3)
    assert "**Cut at the token limit:** NLL (3 of 3); NLL, continued (+1 steps) (3 of 3);" in results

    output = _dvc(tmp_path, "repro")
    assert _ran(output) == set() and "up to date" in output

    # One parameter changed: only the stages that read it run again (as DVC plans it: a dry run names
    # the stages whose own deps changed), and what their changed outputs feed follows them.
    before = (tmp_path / "params.yaml").read_text()
    for change, readers in (({"generate": {"max_new_tokens": 3}}, {"generate@nll", "generate@finetuned"}),
                            ({"train": {"lr": 2.0e-5}}, {"train"}),
                            ({"significance": {"n_resamples": 500}}, {"significance", "validity"}),  # both resample
                            ({"significance": {"alpha": 0.5}}, {"report"})):
        _write_params(tmp_path, change)
        assert _ran(_dvc(tmp_path, "repro", "--dry")) == readers, change
        (tmp_path / "params.yaml").write_text(before)

    # A code edit reruns the stages that run that code, and only those (their outputs' consumers follow).
    with open(tmp_path / "src" / "storyrewrite" / "models" / "encoding.py", "a") as f:
        f.write("# an edit\n")
    planned = _ran(_dvc(tmp_path, "repro", "--dry"))
    assert {"score@nll", "score@finetuned", "score_sanity", *(f"score_llm@{m}" for m in MODES)} <= planned
    assert not planned & {"download", "prepare", "models", "sanity", "llm_index"}
    (tmp_path / "src" / "storyrewrite" / "models" / "encoding.py").write_bytes(
        (ROOT / "src" / "storyrewrite" / "models" / "encoding.py").read_bytes())
    # An edit to a DTO loss reruns the fine-tuning, never the NLL baseline every system starts from.
    dto = tmp_path / "src" / "storyrewrite" / "objectives" / "dto.py"
    dto.write_text(dto.read_text() + "# an edit\n")
    planned = _ran(_dvc(tmp_path, "repro", "--dry"))
    assert "train" in planned and planned <= {"train", "generate@finetuned", "score@finetuned", "significance", "report"}
    dto.write_bytes((ROOT / "src" / "storyrewrite" / "objectives" / "dto.py").read_bytes())

    # An experiment, its metrics and curves against the baseline commit, and the collected table.
    _commit(tmp_path, "baseline")
    output = _dvc(tmp_path, "exp", "run", "-n", "dto-score-delta", "-S", "objective=score_delta")
    assert {"train", "generate@finetuned"} <= _ran(output) and "train_nll" not in _ran(output)
    diff = _dvc(tmp_path, "metrics", "diff", "--all")
    assert "reports/metrics/finetuned.json" in diff and "bartscore.predictive" in diff
    assert all(re.search(rf"\s{name}\s", diff) for name in ("cf_pmi", "cf_follow", "drift"))
    assert '"objective": "score_delta"' in (tmp_path / "reports" / "train" / "finetuned" / "metrics.json").read_text()
    # `dvc exp show` lists the training summary; `dvc plots show` draws every DTO curve (DVCLive's files).
    shown = json.loads(_dvc(tmp_path, "exp", "show", "--json"))
    assert "reports/train/finetuned/metrics.json" in json.dumps(shown) and "best_val_nll" in json.dumps(shown)
    plots = json.loads(_dvc(tmp_path, "plots", "show", "--json"))["data"]
    for name in ("m_target", "m_original", "delta", "gumbel_entropy", "gumbel_max_prob", "nll_target", "val_m_target"):
        drawn = plots[f"reports/train/finetuned/plots/metrics/{name}.tsv"][0]["content"]
        assert drawn["layer"][0]["encoding"]["y"]["field"] == name
    # RLOO on the score+delta reward through DVC (its train stage; `dvc exp run` is the DTO run's
    # above), its curves drawn by `dvc plots show`.
    _write_params(tmp_path, {"objective": "rloo", "rl": {"reward": "score_delta"}})
    output = _dvc(tmp_path, "repro", "train")
    assert _ran(output) == {"train"}
    plots = json.loads(_dvc(tmp_path, "plots", "show", "--json"))["data"]
    for name in ("reward", "reward_std", "kl", "advantage_abs", "completions/mean_length", "completions/clipped_ratio",
                 "sample_time_share", "val_reward"):
        drawn = plots[f"reports/train/finetuned/plots/metrics/{name}.tsv"][0]["content"]
        assert drawn["layer"][0]["encoding"]["y"]["field"] == name.split("/")[-1]
    assert "RLOO-Score+Delta" in (tmp_path / "reports" / "train" / "finetuned" / "metrics.json").read_text()
    # Gathered through DVC's file system at the experiment's revision (cached scores included),
    # then collected into the comparison's folder.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for command in (["gather", "--out", "runs/test", "--names", "dto-*"], ["collect", "runs/test", "--out", "reports/test"]):
        subprocess.run([sys.executable, "-m", f"storyrewrite.report.{command[0]}", *command[1:]], cwd=tmp_path, check=True,
                       capture_output=True, env=env)
    collected = (tmp_path / "reports" / "test" / "experiments.md").read_text()
    assert "| dto-score-delta | score_delta |" in collected
    assert "| DTO-Score+Delta | dto-score-delta: " in (tmp_path / "reports" / "test" / "objectives.md").read_text()
    stages = (tmp_path / "reports" / "test" / "stages.md").read_text()
    assert "| train | cpu (" in stages and "| generate-finetuned | cpu (" in stages

    # A stage whose deps and params are those of an earlier run is restored from DVC's run cache,
    # not run: without it, each queued experiment of a profile overlay (its train_nll params the
    # same, but not the baseline commit's) would train the NLL model again. Here the outputs are
    # removed so that the stage must be run or restored.
    shutil.rmtree(tmp_path / "models" / "nll")
    output = _dvc(tmp_path, "repro", "train_nll")
    assert _ran(output) == set() and "Stage 'train_nll' is cached - skipping run" in output
    assert (tmp_path / "models" / "nll" / "model.safetensors").is_file()
    summary = json.loads((tmp_path / "reports" / "train" / "nll" / "metrics.json").read_text())
    assert summary["global_step"] == TINY["train_nll"]["max_steps"]
    # The record of the run restored: the first `dvc repro`'s, not an experiment's.
    record = json.loads((tmp_path / "reports" / "stages" / "train_nll.json").read_text())
    assert record["items"] == TINY["train_nll"]["max_steps"] and record["experiment"] is None

    # An LLM stage run again finds every reply in its response cache: the same predictions, and
    # no model loaded (its record names none).
    mode = MODES[0]
    before = (tmp_path / "predictions" / f"llm_{mode}.jsonl").read_bytes()
    assert _ran(_dvc(tmp_path, "repro", "--force", "--single-item", f"llm@{mode}")) == {f"llm@{mode}"}
    assert (tmp_path / "predictions" / f"llm_{mode}.jsonl").read_bytes() == before
    record = json.loads((tmp_path / "reports" / "stages" / f"llm-{mode}.json").read_text())
    assert record["items"] == 0 and record["cache_hits"] > 0 and record["dtype"] is None and record["device"] == "cpu"

    # The significance level is the report's alone: it runs again, and its stars and notes say the new one.
    _write_params(tmp_path, {"significance": {"alpha": 0.5}})
    assert _ran(_dvc(tmp_path, "repro", "--single-item", "report")) == {"report"}
    assert "p < 0.5. **Bold**" in (tmp_path / "reports" / "results.md").read_text()


@pytest.mark.slow
def test_paper_profile_code_path_with_tiny_bart(tmp_path):
    """params/paper.yaml as a user applies it, with bart-large-cnn swapped for a tiny random BART
    (the hub is out of reach here), bundled data, CPU fp32 and a tiny budget."""
    _copy_repo(tmp_path)
    paper = load_yaml(tmp_path / "params" / "paper.yaml")
    offline = {"download": {"source": "bundled"}, "models": {"generator": "tiny:bart", "scorer": "tiny:bart", "judge": "tiny:llama",
                                                             "embedder": "tiny:roberta", "nli": "tiny:roberta-nli"},
               "llm": {"backend": "local", "modes": ["rag"]}}
    _write_params(tmp_path, paper, TINY, offline)
    params = load_yaml(tmp_path / "params.yaml")
    assert params["models"]["max_input_tokens"] == 1024 and params["train"]["lr"] == 5e-9
    _dvc(tmp_path, "repro")
    for system in ("finetuned", "llm_rag"):
        assert len(read_jsonl(tmp_path / "predictions" / f"{system}.jsonl")) == 3
    # The retrieving mode: llm_index built the index of the training split it retrieves from.
    index = json.loads((tmp_path / "reports" / "stages" / "llm_index.json").read_text())
    counts = json.loads((tmp_path / "reports" / "data_counts.json").read_text())
    assert index["built"] is True and index["items"] == counts["timetravel"]["train"]["instances"] > 0
    # The RAG stage's record names where its retrieval's embedder ran, beside the LLM's device.
    rag = json.loads((tmp_path / "reports" / "stages" / "llm-rag.json").read_text())
    assert rag["embedder_device"] == rag["device"] == "cpu" and rag["dtype"] is not None
    assert rag["embedder_device_name"] == rag["device_name"]
    # A judge other than the scorer, and the NLI classifier: EntScore and HMean in the table.
    results = (tmp_path / "reports" / "results.md").read_text()
    assert "| EntScore | HMean |" in results and "The judge is the training scorer" not in results
    assert "wrote the endings" not in results  # the LLM row is tiny:bart's, the judge tiny:llama
    row = read_jsonl(tmp_path / "reports" / "scores" / "nll.jsonl")[0]
    assert "ents" in row
    # Each model column names its model, the LMs with the precision the stage record names.
    dtype = json.loads((tmp_path / "reports" / "stages" / "score-nll.json").read_text())["dtype"]
    assert row["scored_by"] == {"bartscore": f"tiny:bart ({dtype})", "cf_pmi": f"tiny:llama ({dtype})", "drift": "tiny:roberta",
                                "ents": "tiny:roberta-nli"}
