"""docs/extending.md's worked examples, run as written.

- The objective: the code of its example blocks becomes a params section, an objective module, a
  registry entry and its curves; the loss is checked against torch's label-smoothed
  cross-entropy, and the objective trains through the real training loop.
- The metric (chrF): its functions, registry entry and metrics-file field; it is scored in both
  forms against values computed apart, measured by the validity check, and (in a fresh
  interpreter, where the registry is extended before the modules that read it are imported)
  becomes table columns, significance columns and a figure panel."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from pydantic import Field, ValidationError

from storyrewrite import closure
from storyrewrite.metrics.artifacts import Overlap, SystemMetrics
from storyrewrite.metrics import registry as metric_registry
from storyrewrite.metrics.evaluate import Evaluators, score_system
from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.metrics.validity import gold_and_copy
from storyrewrite.curves import read_curve
from storyrewrite.io import InputError
from storyrewrite.objectives import registry
from storyrewrite.params import Section, build
from storyrewrite.training.run import fit

from helpers import ROOT, tiny_run

PAGE = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
MODULE = "storyrewrite.objectives.smoothing"


def example(name: str) -> str:
    """The code of the block marked `<!-- example: name -->`."""
    found = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```", PAGE, re.S)
    assert found, f"docs/extending.md has no example block `{name}`"
    return found.group(1)


@pytest.fixture
def smoothing(tmp_path, monkeypatch):
    """The example installed as the page says: (its settings type, its module)."""
    namespace = {"Section": Section, "Field": Field}
    exec(example("params"), namespace)
    config = namespace["SmoothingConfig"]
    # The module as the package file the page names (the run's code fingerprint reads the file).
    source = tmp_path / "smoothing.py"
    source.write_text(example("module"), encoding="utf-8")
    module = types.ModuleType(MODULE)
    module.__file__ = str(source)
    exec(compile(source.read_text(encoding="utf-8"), str(source), "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, MODULE, module)
    files = closure.module_file
    monkeypatch.setattr(closure, "module_file", lambda name: source if name == MODULE else files(name))
    scope = {"Objective": registry.Objective, "SmoothingConfig": config}
    for name, table in (("registry", registry.OBJECTIVES), ("curves", registry.CURVES)):
        for key, value in eval("{" + example(name) + "}", scope).items():
            monkeypatch.setitem(table, key, value)
    monkeypatch.setitem(registry.SETTINGS, "smoothing", config)  # as the edited registry derives it from its entries
    return config, module


def test_the_example_params_section_refuses_a_bad_epsilon(smoothing):
    config, _ = smoothing
    assert build(config, {"epsilon": 0.1}, "smoothing").epsilon == 0.1
    with pytest.raises(InputError, match=r"smoothing\.epsilon"):
        build(config, {"epsilon": 1.5}, "smoothing")


def test_the_example_loss_is_torchs_label_smoothed_cross_entropy(smoothing):
    _, module = smoothing
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=generator)
    target_ids = torch.randint(0, 11, (3, 5), generator=generator)
    target_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    loss, nll, uniform = module.smoothed_nll_loss(logits, target_ids, target_mask, 0.2)
    labels = target_ids.masked_fill(target_mask == 0, -100)  # padding ignored, as the mask does
    expected = F.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1), ignore_index=-100, label_smoothing=0.2)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert nll.item() == pytest.approx(F.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1)).item(), rel=1e-6)
    assert uniform.item() > nll.item()  # the uniform target is far from a trained-looking one


def test_the_example_objective_trains_and_logs_its_terms(smoothing, tmp_path, tiny_model_dirs, small_prepared):
    config, _ = smoothing
    assert registry.get_objective("smoothed_nll", "timetravel").label == "NLL, label-smoothed"
    run = tiny_run(tiny_model_dirs["llama"], small_prepared, objective="smoothed_nll", settings=config(epsilon=0.1),
                   section="train", max_steps=2)
    summary = fit(run, tmp_path / "out", tmp_path / "ckpt", tmp_path / "logs", (), diagnostics=True)
    assert summary["global_step"] == 2 and summary["label"] == "NLL, label-smoothed"
    curves = tmp_path / "logs" / "plots" / "metrics"
    for name in ("train_loss", "nll_term", "uniform_term", "token_accuracy", "val_nll"):
        assert [row["step"] for row in read_curve(curves / f"{name}.tsv")], name
    nll, uniform, loss = (read_curve(curves / f"{name}.tsv")[-1]["value"] for name in ("nll_term", "uniform_term", "train_loss"))
    assert loss == pytest.approx(0.9 * nll + 0.1 * uniform, rel=1e-4)
    assert (tmp_path / "out" / "config.json").is_file()


# The chrF example built from the page's blocks: (its functions by name, its registry entry). Its
# functions run among the names of the module the page puts them in, with that module's import
# line as the page changes it, so a name the module lacks fails here as it would there. It runs
# here, and as source in a fresh interpreter, where the registry is extended before the modules
# that read it are imported (as the edited file would be).
BUILD_METRIC = """
import types

from storyrewrite.metrics import lexical as lexical_module
from storyrewrite.metrics.registry import OverlapMetric


def build_metric(import_block, functions_block, entry_block):
    functions = dict(vars(lexical_module))
    exec(import_block, functions)
    exec(functions_block, functions)
    lexical = types.SimpleNamespace(**functions)
    return functions, eval(entry_block.strip().rstrip(","), {"OverlapMetric": OverlapMetric, "lexical": lexical})
"""
_built: dict = {}
exec(BUILD_METRIC, _built)
build_metric = _built["build_metric"]


def install_metric(monkeypatch) -> dict:
    """The chrF example in this interpreter's registry: its functions by name."""
    functions, entry = build_metric(example("metric-import"), example("metric"), example("metric-registry"))
    monkeypatch.setitem(metric_registry.OVERLAP_METRICS, "chrf", entry)
    return functions


STORIES = [
    {"id": "s1:0", "story_id": "s1", "original_ending": "She won a prize at the fair.", "target": "She threw the cake away."},
    {"id": "s1:1", "story_id": "s1", "original_ending": "She won a prize at the fair.", "target": "She won no prize at the fair."},
    {"id": "s2:0", "story_id": "s2", "original_ending": "He ate it for dinner.", "target": "He went home without fish."},
]
PREDICTIONS = {"s1:0": "She threw the cake in the bin.", "s1:1": "She won a prize at the fair.", "s2:0": "He went home."}


def test_the_example_metric_changes_an_import_line_the_module_has():
    """The page's import line is one of lexical.py's with the names the example uses added, so the
    functions run there with the names build_metric gives them here."""
    line = example("metric-import").strip()
    lines = (ROOT / "src" / "storyrewrite" / "metrics" / "lexical.py").read_text(encoding="utf-8").splitlines()
    assert "\n" not in line and any(line.startswith(f"{existing}, ") for existing in lines if existing.startswith("from ")), line


def test_the_example_metric_is_scored_in_both_forms_and_stored(monkeypatch, tiny_model_dirs):
    import sacrebleu

    functions = install_metric(monkeypatch)
    rows, metrics = score_system(PREDICTIONS, STORIES, LMScorer.from_dir(tiny_model_dirs["bart"]), batch_size=2)
    predictions = [PREDICTIONS[row["id"]] for row in STORIES]
    for suffix, reference in (("", "target"), ("_original", "original_ending")):
        apart = [sacrebleu.metrics.CHRF().sentence_score(p, [row[reference]]).score for p, row in zip(predictions, STORIES, strict=True)]
        assert [row[f"chrf{suffix}"] for row in rows] == pytest.approx(apart, abs=1e-9)
    assert rows[1]["chrf_original"] == pytest.approx(100.0)  # the copy of the original ending
    edited = sacrebleu.metrics.CHRF().corpus_score(predictions, [[row["target"] for row in STORIES]]).score
    original = sacrebleu.metrics.CHRF().corpus_score(predictions, [[row["original_ending"] for row in STORIES]]).score
    assert metrics["chrf"]["predictive"] == pytest.approx(edited, abs=1e-4)
    assert metrics["chrf"]["counterfactual"] == pytest.approx(2 * edited - original, abs=1e-4)
    # Refused by the metrics files' schema until the page's field is added; then stored.
    with pytest.raises(ValidationError, match="chrf"):
        SystemMetrics.model_validate(metrics)
    scope = {"SystemMetrics": SystemMetrics, "Overlap": Overlap}
    body = "class WithChrf(SystemMetrics):\n    " + example("metric-field").strip()
    exec(compile(body, "docs/extending.md", "exec", dont_inherit=True), scope)  # the annotation a class, not a string
    assert scope["WithChrf"].model_validate(metrics).chrf.counterfactual == metrics["chrf"]["counterfactual"]
    # Its best-of-references form is the best single reference (what the validity check uses).
    several = [["She won no prize at the fair.", "She threw the cake away."], ["He went home without fish."]]
    assert functions["best_chrf"](predictions[:2], several) == pytest.approx(
        [max(functions["sentence_chrf"]([p], [r])[0] for r in refs) for p, refs in zip(predictions[:2], several, strict=True)])


def test_the_example_metric_is_measured_by_the_validity_check(monkeypatch, tiny_model_dirs):
    functions = install_metric(monkeypatch)
    pairs, _ = gold_and_copy(STORIES, Evaluators(), LMScorer.from_dir(tiny_model_dirs["bart"]), batch_size=2)
    gold, copy, stories = pairs["chrf"]
    assert stories == ["s1", "s1"]  # s2 has a single reference: left out
    assert gold == pytest.approx(functions["best_chrf"](["She threw the cake away.", "She won no prize at the fair."],
                                                        [["She won no prize at the fair."], ["She threw the cake away."]]))
    assert copy == pytest.approx(functions["best_chrf"](["She won a prize at the fair."] * 2,
                                                        [["She won no prize at the fair."], ["She threw the cake away."]]))


def test_the_example_metric_becomes_columns_of_the_tables_tests_and_figure():
    check = BUILD_METRIC + """
import json, sys
from storyrewrite.metrics import registry
page = json.loads(sys.argv[1])
registry.OVERLAP_METRICS["chrf"] = build_metric(page["metric-import"], page["metric"], page["metric-registry"])[1]
from storyrewrite.metrics.columns import OVERLAP
from storyrewrite.report.figure import PANEL_COLUMNS
from storyrewrite.report.tables import COLUMNS, column_label, plain_cells
from storyrewrite.significance.compare import compare
from storyrewrite.significance.validity import LABELS
rows = lambda shift: [{"id": f"s{i}:0", "story_id": f"s{i}", **{m: 50.0 + shift + i for m in registry.OVERLAP_METRICS},
                       **{f"{m}_original": 70.0 for m in registry.OVERLAP_METRICS}} for i in range(30)]
p_values = compare({"nll": rows(0.0), "better": rows(5.0)}, "nll", n_resamples=200, seed=0, by_story=False)["better"]
metrics = {m: {"predictive": 61.25, "counterfactual": 52.5} for m in registry.OVERLAP_METRICS}
print(json.dumps({"overlap": OVERLAP, "columns": COLUMNS, "panels": PANEL_COLUMNS, "p_values": p_values,
                  "labels": [column_label(c) for c in COLUMNS], "validity": LABELS["chrf"],
                  "cells": plain_cells(metrics, p_values, 0.05)}))
"""
    page = {name: example(name) for name in ("metric-import", "metric", "metric-registry")}
    result = json.loads(subprocess.run([sys.executable, "-c", check, json.dumps(page)], check=True,
                                       capture_output=True, text=True).stdout)
    assert [c for c in result["overlap"] if c.startswith("chrf")] == ["chrf/predictive", "chrf/counterfactual"]
    assert result["columns"] == result["overlap"] and "chrf/counterfactual" in result["panels"]
    assert "chrF (M)" in result["labels"] and "chrF (M + Δ_M)" in result["labels"] and result["validity"] == "chrF (M)"
    assert result["p_values"]["chrf/predictive"] == 0.0 and "chrf/counterfactual" in result["p_values"]
    assert result["cells"][result["columns"].index("chrf/predictive")] == "61.2\\*"
