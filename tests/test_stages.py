"""The thin stage scripts' own choices, run as DVC runs them (a params.yaml in the working
folder), on inputs that need no model: what they pass on from params.yaml and what their
records count."""
import json
import random
import subprocess
import sys

import yaml

from storyrewrite.io import write_jsonl_atomic
from storyrewrite.params import load_yaml
from storyrewrite.significance.compare import compare

from helpers import ROOT


def _stage(folder, name: str, params: dict, *argv: str) -> subprocess.CompletedProcess:
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return subprocess.run([sys.executable, str(ROOT / "stages" / f"{name}.py"), *argv], cwd=folder, capture_output=True,
                          text=True, timeout=120)


def _scores(shift: float, rng: random.Random) -> list[dict]:
    """Six stories of three instances each: a story-wide effect, then each instance's own noise."""
    rows = []
    for story in range(6):
        effect = rng.gauss(0.0, 1.0)
        for k in range(3):
            value = shift + effect + rng.gauss(0.0, 0.3)
            rows.append({"id": f"s{story}:{k}", "story_id": f"s{story}", "prediction_digest": f"{shift}-{story}-{k}",
                         "bartscore": value, "rougeL": 50.0 + 10 * value})
    return rows


def test_the_significance_stage_resamples_the_unit_params_yaml_names(tmp_path):
    """`significance.unit: story` reaches the bootstrap (stories resampled whole), the output says
    which unit it resampled, and the record counts every system's resamples."""
    rng = random.Random(0)
    scores = {"nll": _scores(0.0, rng), "finetuned": _scores(0.4, rng), "copy_reference": _scores(1.0, rng),
              "copy_original": _scores(0.2, rng)}
    for system, rows in scores.items():
        write_jsonl_atomic(tmp_path / "scores" / f"{system}.jsonl", rows)
    params = load_yaml(ROOT / "params.yaml")
    params["task"], params["llm"]["modes"] = "timetravel", []
    direct = {unit: compare(scores, "nll", 400, params["seed"], by_story=unit == "story") for unit in ("story", "instance")}
    assert direct["story"] != direct["instance"]  # the two units tell apart on these scores
    argv = ("--systems", "nll", "finetuned", "--scores", "scores", "--out", "significance.json", "--record", "record.json")
    for unit in ("story", "instance"):
        params["significance"].update(unit=unit, n_resamples=400, baseline="nll")
        result = _stage(tmp_path, "significance", params, *argv)
        assert result.returncode == 0, result.stderr
        written = json.loads((tmp_path / "significance.json").read_text())
        record = json.loads((tmp_path / "record.json").read_text())
        assert written["p_values"] == direct[unit] and written["unit"] == unit
        assert (record["items"], record["unit"], record["unit_of_resampling"]) == (3 * 400, "resamples", unit)


def test_the_validity_stage_says_a_task_without_an_original_ending_has_nothing_to_copy(tmp_path):
    """ART has no X_OE: the stage writes why there is no figure, and loads no model (the model
    folders named do not exist)."""
    params = load_yaml(ROOT / "params.yaml")
    params["task"] = "art"
    result = _stage(tmp_path, "validity", params, "--data", "none", "--scorer", "none", "--evaluators", "none",
                    "--out", "validity.json", "--record", "record.json")
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "validity.json").read_text())["not_available"] == "task art has no original ending to copy"
    record = json.loads((tmp_path / "record.json").read_text())
    assert (record["device"], record["items"], record["unit"]) == ("cpu", 0, "instances")


def test_the_generate_stage_counts_the_predictions_it_resumed_apart_from_those_it_generated(tmp_path, tiny_model_dirs,
                                                                                             small_prepared):
    """A run cut short leaves its finished predictions in `.partial/` beside the output; the next
    run of the same settings takes them and generates the rest. Its record counts each kind, and
    the output is the one a whole run writes."""
    import torch

    from storyrewrite.data.prepare import load_instances
    from storyrewrite.generation.generate import _fingerprint
    from storyrewrite.params import Params

    params = load_yaml(ROOT / "params.yaml")
    params["task"], params["device"] = "timetravel", "cpu"
    params["generate"].update(max_new_tokens=4, batch_size=4, split="test")
    model = tiny_model_dirs["llama"]
    argv = ("--model", str(model), "--data", str(small_prepared), "--out", "out.jsonl", "--record", "record.json")
    whole = _stage(tmp_path, "generate", params, *argv)
    assert whole.returncode == 0, whole.stderr
    lines = (tmp_path / "out.jsonl").read_text().splitlines(keepends=True)
    record = json.loads((tmp_path / "record.json").read_text())
    assert len(lines) == 6 and (record["predictions"], record["resumed"]) == (6, 0)

    typed = Params.load(tmp_path / "params.yaml")
    instances = load_instances(small_prepared, "timetravel", "test")
    fingerprint = _fingerprint(model, instances, typed.generate, typed.models, torch.device("cpu"))
    (tmp_path / ".partial").mkdir(exist_ok=True)
    (tmp_path / ".partial" / f"out-{fingerprint}.jsonl").write_text("".join(lines[:2]))
    (tmp_path / "out.jsonl").unlink()
    resumed = _stage(tmp_path, "generate", params, *argv)
    assert resumed.returncode == 0, resumed.stderr
    record = json.loads((tmp_path / "record.json").read_text())
    assert (record["predictions"], record["resumed"]) == (4, 2) and "(4 generated now" in resumed.stdout
    assert (tmp_path / "out.jsonl").read_text().splitlines(keepends=True) == lines
