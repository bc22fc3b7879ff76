"""The figures are written and hold the systems; whether they read well is checked by looking."""
import numpy as np
from PIL import Image

from storyrewrite.metrics.columns import value
from storyrewrite.report.figure import intervals, results_figure, training_figure, training_panels
from storyrewrite.significance.bootstrap import percentile_interval


def _rows(shift, n=12):
    return [{"id": f"s{i // 3}:{i % 3}", "story_id": f"s{i // 3}", "bartscore": -2.0 + shift + 0.01 * i, "bartscore_original": -1.0,
             "rougeL": 50.0 + 10 * shift + i, "rougeL_original": 80.0, "sacrebleu": 30.0 + i, "sacrebleu_original": 70.0}
            for i in range(n)]


def test_the_results_figure_has_every_system_with_its_interval_and_the_copies_as_lines(tmp_path):
    scores = {"nll": _rows(0.0), "finetuned": _rows(0.2), "llm_zero_shot": _rows(-0.5), "copy_original": _rows(1.0)}
    labels = {"nll": "NLL", "finetuned": "DTO-Score", "llm_zero_shot": "zero-shot", "copy_original": "Copy of X_OE"}
    drawn = results_figure(tmp_path / "results.png", scores, labels, "nll", ["copy_original"], {"llm_zero_shot": 0.9}, "test")
    with Image.open(tmp_path / "results.png") as image:
        assert image.format == "PNG" and image.size[0] > 400
    assert set(drawn) == {"bartscore/predictive", "rougeL/predictive", "sacrebleu/predictive", "bartscore/counterfactual",
                          "rougeL/counterfactual", "sacrebleu/counterfactual"}
    assert set(drawn["bartscore/predictive"]) == set(scores)
    mean, low, high = drawn["bartscore/predictive"]["finetuned"]
    assert mean == np.mean([r["bartscore"] for r in _rows(0.2)]) and low < mean < high


def test_each_interval_is_that_of_a_bootstrap_of_its_own():
    """intervals draws the resamples once per number of instances: each system's interval in each
    column is the percentile interval of that column alone, for systems of different lengths and
    a system that lacks a column."""
    rng = np.random.default_rng(2)
    noisy = lambda rows: [{**row, "bartscore": row["bartscore"] + float(rng.normal(0, 0.3))} for row in rows]  # noqa: E731
    scores = {"nll": noisy(_rows(0.0)), "finetuned": noisy(_rows(0.2)), "short": noisy(_rows(0.1, n=9)),
              "no_original": [{k: v for k, v in row.items() if not k.endswith("_original")} for row in noisy(_rows(0.3))]}
    columns = ["bartscore/predictive", "bartscore/counterfactual", "rougeL/predictive"]
    found = intervals(scores, columns, n_resamples=400, seed=4)
    assert set(found["bartscore/counterfactual"]) == {"nll", "finetuned", "short"}
    assert [(c, s) for c in found for s in found[c]][:4] == [("bartscore/predictive", s) for s in scores]
    for column in columns:
        for system, (mean, low, high) in found[column].items():
            values = np.array([value(row, column) for row in scores[system]])[:, None]
            assert (low, high) == tuple(percentile_interval(values, 0.95, 400, 4)[0]) and mean == values.mean()
    assert len({bounds for column in found.values() for bounds in column.values()}) == 11  # none the same


def test_a_training_figure_draws_the_panels_that_have_curves(tmp_path):
    curves = {"train_loss": [{"step": 1, "value": 2.0}, {"step": 2, "value": 1.5}], "val_loss": [{"step": 0, "value": 2.1}],
              "val_nll": [{"step": 0, "value": 2.1}], "m_target": [{"step": 1, "value": -3.0}]}
    drawn = training_figure(tmp_path / "nll.png", curves, training_panels(["m_target", "gumbel_max_prob"]), "DTO-Score")
    assert drawn == ["loss", "NLL of Y_EE", "m_target"]
    with Image.open(tmp_path / "nll.png") as image:
        assert image.format == "PNG"


def test_figures_are_saved_with_256_colours_their_drawn_colours_exact(tmp_path, monkeypatch):
    import io

    from storyrewrite.report import figure

    curves = {"train_loss": [{"step": s, "value": 2.0 + np.sin(s / 5)} for s in range(1, 200)],
              "val_loss": [{"step": s, "value": 2.1 - s / 400} for s in range(0, 200, 50)], "m_target": [{"step": 1, "value": -3.0}]}
    training_figure(tmp_path / "compact.png", curves, training_panels(["m_target"]), "DTO-Score")
    monkeypatch.setattr(figure, "compact_png", lambda data: data)  # matplotlib's own RGBA bytes, for reference
    training_figure(tmp_path / "rgba.png", curves, training_panels(["m_target"]), "DTO-Score")
    with Image.open(tmp_path / "rgba.png") as rgba, Image.open(tmp_path / "compact.png") as compact:
        assert rgba.mode == "RGBA" and compact.mode == "P" and compact.size == rgba.size
        drawn, shown = np.asarray(rgba.convert("RGB")).astype(int), np.asarray(compact.convert("RGB")).astype(int)
    colours, counts = np.unique(drawn.reshape(-1, 3), axis=0, return_counts=True)
    assert len(colours) > 256  # antialiased: more colours than a palette holds
    for colour in colours[np.argsort(-counts)[:8]]:  # the background, the lines, the grid and the text: exact
        assert (shown[(drawn == colour).all(-1)] == colour).all()
    assert (shown == drawn).all(-1).mean() > 0.95 and np.abs(shown - drawn).mean() < 0.5
    assert (tmp_path / "compact.png").stat().st_size < 0.7 * (tmp_path / "rgba.png").stat().st_size
    # A palette PNG, one with transparency, and bytes that are no PNG come back as they are.
    compacted = (tmp_path / "compact.png").read_bytes()
    monkeypatch.undo()
    assert figure.compact_png(compacted) == compacted
    buffer = io.BytesIO()
    Image.new("RGBA", (8, 8), (10, 20, 30, 128)).save(buffer, format="png")
    assert figure.compact_png(buffer.getvalue()) == buffer.getvalue()
    assert figure.compact_png(b"\x89PNG\r\n\x1a\n\xff\x00 not a whole PNG") == b"\x89PNG\r\n\x1a\n\xff\x00 not a whole PNG"
