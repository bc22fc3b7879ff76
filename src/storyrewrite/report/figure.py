"""The results at a glance (`results.png`) and each trained system's main curves
(`reports/train/<system>.png`), drawn with matplotlib's Agg backend (no display needed) and
saved as 256-colour PNGs (`compact_png`).

results.png: one panel per metric column that has per-instance scores (the predictive and
counterfactual overlap metrics, CF-PMI and drift where measured); in each, every system's mean
over the test instances with its bootstrap 95 % percentile interval (resampling instances, the
report's seed), the baseline (NLL) drawn in its own colour, and the copy baselines as vertical
reference lines, not as points. A system whose predictions mostly echo the prompt (prompt_echo
above a half) is drawn hollow, as the legend says; long labels wrap onto two lines. The values
are means of sentence-level scores: for SacreBLEU that is not the corpus BLEU of the tables,
and the panel says so.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from storyrewrite.io import write_bytes_atomic
from storyrewrite.metrics.columns import OVERLAP
from storyrewrite.metrics.counterfactual import instance_value
from storyrewrite.metrics.registry import OVERLAP_METRICS
from storyrewrite.report.tables import column_label
from storyrewrite.significance.bootstrap import percentile_interval

ECHO_LIMIT = 0.5  # prompt_echo above this: the system's predictions are mostly not endings
LABEL_WIDTH = 36  # characters per line of a system's label (an LLM's names its model, mode and backend)
PANEL_COLUMNS = (*OVERLAP, "cf_pmi", "drift")  # every overlap metric, predictive then counterfactual


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _value(row: dict, column: str) -> float | None:
    if "/" in column:
        metric, form = column.split("/")
        if metric not in row or (form != "predictive" and f"{metric}_original" not in row):
            return None
        return instance_value(row, metric, form)
    return row.get(column)


def intervals(scores: dict[str, list[dict]], columns: list[str], n_resamples: int, seed: int) -> dict[str, dict[str, tuple]]:
    """{column: {system: (mean, low, high)}} over the systems whose every row has the column."""
    wanted = []  # (column, system, values), in the order of the columns, then the systems
    for column in columns:
        for system, rows in scores.items():
            values = [_value(row, column) for row in rows]
            if values and all(v is not None for v in values):
                wanted.append((column, system, np.array(values, dtype=np.float64)))
    # One bootstrap per number of instances: the resamples depend on the seed and the units alone
    # (resample_means), so each interval is that of a bootstrap of its own, drawn once for all.
    bounds = {}
    for length in dict.fromkeys(len(values) for _, _, values in wanted):
        group = [(column, system, values) for column, system, values in wanted if len(values) == length]
        group_bounds = percentile_interval(np.stack([values for _, _, values in group], axis=1), 0.95, n_resamples, seed)
        bounds.update({(column, system): pair for (column, system, _), pair in zip(group, group_bounds, strict=True)})
    found: dict[str, dict[str, tuple]] = {}
    for column, system, values in wanted:
        low, high = bounds[column, system]
        found.setdefault(column, {})[system] = (float(values.mean()), float(low), float(high))
    return found


def _panels(plt, n: int, width: int, panel_height: float, **kwargs) -> tuple:
    """A figure of `n` panels, `width` to a row, and their axes in reading order (the grid's unused
    cells hidden)."""
    rows = -(-n // width)
    figure, axes = plt.subplots(rows, width, figsize=(3.6 * width, panel_height * rows), squeeze=False, **kwargs)
    for axis in axes.flat[n:]:
        axis.axis("off")
    return figure, list(axes.flat[:n])


def compact_png(data: bytes) -> bytes:
    """PNG bytes again as a 256-colour palette image: Pillow's median cut, no dithering, zlib at
    its best. For these figures (a few flat colours, antialiased edges) that is about half the bytes
    of matplotlib's RGBA, with the drawn colours exact and the rarer edge shades approximated. An
    image with transparency or with a palette already, or bytes Pillow cannot read as a PNG, come
    back as they are."""
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format != "PNG" or image.mode not in ("RGB", "RGBA"):
                return data
            if image.mode == "RGBA" and image.getchannel("A").getextrema() != (255, 255):
                return data
            palette = image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    except (UnidentifiedImageError, OSError):
        return data
    buffer = io.BytesIO()
    palette.save(buffer, format="png", optimize=True)
    return buffer.getvalue()


def _save(figure, path: Path) -> None:
    import io

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    write_bytes_atomic(Path(path), compact_png(buffer.getvalue()))


def results_figure(path: Path, scores: dict[str, list[dict]], labels: dict[str, str], baseline: str, copies: list[str],
                   echo: dict[str, float], title: str, n_resamples: int = 2000, seed: int = 0) -> dict[str, dict[str, tuple]]:
    """Draw results.png (see the module's docstring) for the systems in `scores` (in order; the
    ones in `copies` as reference lines). Returns what it drew: {column: {system: (mean, low, high)}}."""
    plt = _pyplot()
    columns = [c for c in PANEL_COLUMNS if any(_value(rows[0], c) is not None for rows in scores.values() if rows)]
    drawn = intervals(scores, columns, n_resamples, seed)
    columns = [c for c in columns if c in drawn]
    systems = [s for s in scores if s not in copies]
    shown = {s: textwrap.fill(labels[s], LABEL_WIDTH, break_on_hyphens=False) for s in systems}
    echoing = {s for s in systems if echo.get(s, 0) > ECHO_LIMIT}
    figure, axes = _panels(plt, len(columns), min(4, len(columns)), 0.35 * len(systems) + 1.6, sharey=True)
    positions = np.arange(len(systems))[::-1]
    for axis, column in zip(axes, columns, strict=True):
        for position, system in zip(positions, systems, strict=True):
            if system not in drawn[column]:
                continue
            mean, low, high = drawn[column][system]
            colour = "tab:red" if system == baseline else "tab:blue"
            axis.errorbar(mean, position, xerr=[[mean - low], [high - mean]], fmt="o", color=colour, capsize=3,
                          markerfacecolor="white" if system in echoing else colour)
        if baseline in drawn[column]:
            axis.axvline(drawn[column][baseline][0], color="tab:red", linestyle=":", linewidth=1)
        for copy, style in zip(copies, ("--", "-."), strict=False):  # a style for each of up to two copies
            if copy in drawn[column]:
                axis.axvline(drawn[column][copy][0], color="0.35", linestyle=style, linewidth=1, label=labels[copy])
        name = column_label(column)
        if "/" in column and (metric := OVERLAP_METRICS[column.split("/")[0]]).instance_label:
            name = name.replace(metric.label, metric.instance_label)  # the panels show per-instance values
        axis.set_title(name, fontsize=9)
        axis.tick_params(labelsize=8)
        axis.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(positions, [shown[s] for s in systems])
    handles, names = axes[0].get_legend_handles_labels()
    if echoing:
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], marker="o", linestyle="none", color="tab:blue", markerfacecolor="white"))
        names.append(f"hollow: most predictions echo the prompt (prompt_echo > {ECHO_LIMIT})")
    if handles:
        figure.legend(handles, names, loc="lower center", ncol=len(handles), fontsize=8, frameon=False,
                      bbox_to_anchor=(0.5, -0.02))
    figure.suptitle(f"{title}: mean per instance with bootstrap 95 % interval; red: {labels[baseline]}", fontsize=10)
    _save(figure, path)
    plt.close(figure)
    return drawn


def training_panels(main_diagnostics: list[str]) -> list[tuple[str, str | None, str | None]]:
    """(title, training curve, validation curve) of a system's main curves: its loss, the
    validation NLL of Y_EE (comparable across objectives) and its objective's main diagnostics."""
    return [("loss", "train_loss", "val_loss"), ("NLL of Y_EE", None, "val_nll"),
            *((name, name, f"val_{name}") for name in main_diagnostics)]


def training_figure(path: Path, curves: dict[str, list[dict]], panels: list[tuple[str, str | None, str | None]],
                    title: str) -> list[str]:
    """Draw each panel's training and validation curves (each a list of {"step", "value"}) that
    exist. Returns the titles of the panels drawn."""
    plt = _pyplot()
    drawn = [p for p in panels if curves.get(p[1]) or curves.get(p[2])]
    if not drawn:
        return []
    figure, axes = _panels(plt, len(drawn), min(3, len(drawn)), 2.6)
    for axis, (name, train, val) in zip(axes, drawn, strict=True):
        for key, style, label in ((train, "-", "training"), (val, "o--", "validation")):
            rows = curves.get(key) or []
            if rows:
                axis.plot([r["step"] for r in rows], [r["value"] for r in rows], style, markersize=3, label=label)
        axis.set_title(name, fontsize=9)
        axis.set_xlabel("step", fontsize=8)
        axis.tick_params(labelsize=8)
        axis.legend(fontsize=7)
        axis.grid(alpha=0.3)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    _save(figure, path)
    plt.close(figure)
    return [p[0] for p in drawn]
