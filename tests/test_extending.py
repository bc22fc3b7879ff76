"""docs/extending.md's worked example, run as written: the code of its example blocks becomes a
params section, an objective module, a registry entry and its curves; the loss is checked against
torch's label-smoothed cross-entropy, and the objective trains through the real training loop."""
from __future__ import annotations

import re
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from pydantic import Field

from storyrewrite import closure
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
