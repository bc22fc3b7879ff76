import subprocess
import sys

import pytest
import yaml

from storyrewrite.io import InputError, run_stage
from storyrewrite.objectives.registry import OBJECTIVES, SETTINGS, get_objective
from storyrewrite.params import Params, load_yaml

from helpers import ROOT


def test_a_stage_reports_bad_params_in_one_line_and_exits_2(tmp_path):
    params = load_yaml(ROOT / "params.yaml")
    params["data"]["max_train"] = "many"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    result = subprocess.run([sys.executable, str(ROOT / "stages" / "prepare.py"), "--raw", "raw", "--out", "out",
                             "--counts", "counts.json"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    # Named by its line of the stage's params.yaml, found here by reading the file.
    lines = (tmp_path / "params.yaml").read_text().splitlines()
    section = lines.index("data:")
    line = next(number for number, text in enumerate(lines[section:], section + 1) if text.strip().startswith("max_train:"))
    assert result.returncode == 2
    assert result.stderr.strip() == (f"error: params.yaml:{line}: `data.max_train` = 'many': Input should be a valid integer, "
                                     "unable to parse string as an integer")
    assert not (tmp_path / "out").exists()


def test_a_stage_names_the_line_of_a_value_it_refuses_after_reading_it(tmp_path, monkeypatch, capsys):
    # A value the section's schema takes and the stage then refuses (a registry's name), by its
    # line of the stage's params.yaml; an error naming a key the file does not set, or none, as it is.
    params = load_yaml(ROOT / "params.yaml")
    params["objective"] = "dto"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    line = next(number for number, text in enumerate((tmp_path / "params.yaml").read_text().splitlines(), 1)
                if text.startswith("objective:"))
    monkeypatch.chdir(tmp_path)

    def stderr_of(main) -> str:
        with pytest.raises(SystemExit) as stop:
            run_stage(main)
        assert stop.value.code == 2
        return capsys.readouterr().err.strip()

    assert stderr_of(lambda: get_objective(Params.load().objective, "timetravel")) == (
        f"error: params.yaml:{line}: `objective` = 'dto' is not valid; valid values: {', '.join(OBJECTIVES)}")
    unset = "params: `llm.fixed_example_id.nowhere` = 'x' is not a training instance id"

    def refuse(message: str, key: str | None) -> None:
        raise InputError(message, key=key)

    assert stderr_of(lambda: refuse(unset, "llm.fixed_example_id.nowhere")) == f"error: {unset}"
    assert stderr_of(lambda: refuse("data/x.jsonl:3: malformed JSON", None)) == "error: data/x.jsonl:3: malformed JSON"


def test_an_unknown_top_level_key_is_named_by_its_line(tmp_path):
    """A typo'd top-level key: a scalar stops every stage; a mapping (an objective's section,
    for all a stage without the registry knows) stops the train stage, which knows them all.
    Each names the line of the stage's params.yaml that sets it."""
    text = (ROOT / "params.yaml").read_text()
    for typo, stage, args in (("seeed: 3", "prepare.py", ["--raw", "raw", "--out", "out", "--counts", "counts.json"]),
                              ("smothing:\n  epsilon: 0.1", "train.py", ["--init", "i", "--data", "d", "--out", "out",
                                                                        "--checkpoints", "c", "--logs", "l"])):
        (tmp_path / "params.yaml").write_text(text + "\n" + typo + "\n")
        line = len(text.splitlines()) + 2
        result = subprocess.run([sys.executable, str(ROOT / "stages" / stage), *args], cwd=tmp_path, capture_output=True,
                                text=True, timeout=120)
        key = typo.split(":")[0]
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().startswith(f"error: params.yaml:{line}: unknown key(s) `{key}` in params.yaml; valid keys: seed, ")
        assert not (tmp_path / "out").exists()


def test_the_train_stage_refuses_rloo_on_a_reward_the_task_cannot_give_before_any_model_loads(tmp_path):
    """RLOO serves ART on the score reward only: `rl.reward` delta needs the original ending. The
    stage names the line of `reward:`, and the valid values, before it reads a model or the data
    (none exists here); `profiles check` refuses the same experiment before it is queued."""
    from storyrewrite.profiles import main as profiles

    params = load_yaml(ROOT / "params.yaml")
    params.update(task="art", objective="rloo")
    params["rl"]["reward"] = "delta"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    lines = (tmp_path / "params.yaml").read_text().splitlines()
    section = lines.index("rl:")
    line = next(number for number, text in enumerate(lines[section:], section + 1) if text.strip().startswith("reward:"))
    result = subprocess.run([sys.executable, str(ROOT / "stages" / "train.py"), "--init", "none", "--data", "none",
                             "--out", "out", "--checkpoints", "ckpt", "--logs", "logs", "--scorer", "none"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    refused = ("`rl.reward` = 'delta' needs the original ending, which task 'art' does not have; "
               "valid values for this task: score")
    assert result.returncode == 2 and result.stderr.strip() == f"error: params.yaml:{line}: {refused}"
    assert not (tmp_path / "out").exists() and not (tmp_path / "logs").exists()
    with pytest.raises(SystemExit) as stop:
        profiles(["check", "--params", str(tmp_path / "params.yaml")])
    assert stop.value.code == 2
    # On TimeTravel, and with the score reward on ART, the same look-up passes.
    for task, reward in (("timetravel", "delta"), ("art", "score")):
        settings = Params({**params, "task": task, "rl": {**params["rl"], "reward": reward}}, "p", SETTINGS)
        assert get_objective("rloo", task, settings.section).name == "rloo"


def test_the_generate_and_score_stages_name_a_missing_model_or_predictions_before_any_model_loads(tmp_path, small_prepared):
    """Run by hand (docs/evaluation.md, Predictions of your own), a path that is not there is named
    in one line: the generate stage's model folder was taken for a hub name, and the score stage's
    predictions ended in a traceback after its models had loaded."""
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())

    def stage(name: str, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(ROOT / "stages" / f"{name}.py"), *argv, "--data", str(small_prepared)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)

    generated = stage("generate", "--model", "models/nll", "--out", "p.jsonl")
    assert (generated.returncode, generated.stderr.splitlines()[-1]) == (
        2, "error: models/nll: not a model directory (no config.json); run `dvc repro` first")
    (tmp_path / "empty").mkdir()
    for predictions, problem in (("mine.jsonl", "no such file"), ("empty", "no .jsonl file in it")):
        scored = stage("score", "--predictions", predictions, "--scorer", "none", "--evaluators", "none",
                       "--scores-dir", "s", "--metrics-dir", "m")
        assert (scored.returncode, scored.stderr.strip()) == (2, f"error: --predictions {predictions}: {problem}")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["empty", "params.yaml"]
