"""Does a metric tell the gold rewrite from a copy of the original ending? Measured on the data.

For each metric and test instance: does the reference rewrite Y_EE score higher than the copy of
the original ending X_OE (a win), the same (a tie), or lower (a loss)? A metric that cannot say
that the human rewrite follows the counterfactual better than the unchanged ending cannot rank
systems on rewriting either. The values come from storyrewrite.metrics.validity (which says how
reference-based metrics are kept from scoring Y_EE against itself).

Shares come with 95 % bootstrap intervals resampling whole stories (a story's three instances
share their contexts). A metric *separates* the two when the interval of (win share − loss
share) lies above 0. Torch-free: the report reads it.
"""
from __future__ import annotations

import numpy as np

from storyrewrite.markdown import table
from storyrewrite.metrics.registry import OVERLAP_METRICS
from storyrewrite.significance.bootstrap import percentile_interval

LABELS = {"cf_pmi": "CF-PMI", "drift": "drift similarity", "ents": "EntScore",
          **{name: f"{metric.label} (M)" for name, metric in OVERLAP_METRICS.items()}}
REFERENCE_FREE = ("cf_pmi", "ents")


def outcomes(gold: list[float], copy: list[float]) -> np.ndarray:
    """n×3 indicator columns (gold wins, tie, copy wins); a tie is equality to 1e-9 (relative)."""
    gold_values, copy_values = np.asarray(gold, dtype=np.float64), np.asarray(copy, dtype=np.float64)
    tie = np.isclose(gold_values, copy_values, rtol=1e-9, atol=1e-12)
    return np.stack([~tie & (gold_values > copy_values), tie, ~tie & (gold_values < copy_values)], axis=1).astype(np.float64)


def summarise(gold: list[float], copy: list[float], stories: list[str], n_resamples: int, seed: int) -> dict:
    """Shares of wins, ties and losses of the gold rewrite over the copy, with story-resampled
    95 % intervals of the win share and of the margin (wins − losses)."""
    table = outcomes(gold, copy)
    columns = np.hstack([table, table[:, :1] - table[:, 2:]])  # wins, ties, losses, margin
    intervals = percentile_interval(columns, 0.95, n_resamples, seed, clusters=stories)
    wins, ties, losses, margin = columns.mean(axis=0)
    return {"instances": len(gold), "wins": round(float(wins), 4), "ties": round(float(ties), 4),
            "losses": round(float(losses), 4), "wins_ci": [round(float(v), 4) for v in intervals[0]],
            "margin": round(float(margin), 4), "margin_ci": [round(float(v), 4) for v in intervals[3]],
            "gold_mean": round(float(np.mean(gold)), 4), "copy_mean": round(float(np.mean(copy)), 4),
            "separates": bool(intervals[3][0] > 0)}


def validity(pairs: dict, not_measured: dict[str, str], n_resamples: int = 10_000, seed: int = 0) -> dict:
    """The figures of every metric: `pairs` {metric: (gold values, copy values, story ids)}."""
    stories = {story for _, _, ids in pairs.values() for story in ids}
    instances = max((len(ids) for _, _, ids in pairs.values()), default=0)
    return {"instances": instances, "stories": len(stories), "n_resamples": n_resamples,
            "metrics": {name: {"compared": "as they are" if name in REFERENCE_FREE else "against the story's other references",
                               **summarise(gold, copy, ids, n_resamples, seed)} for name, (gold, copy, ids) in pairs.items()},
            "not_measured": not_measured}


def _share(value: float) -> str:
    return f"{100 * value:.1f} %"


def markdown(result: dict) -> str:
    """The validity table and, in plain words, what each metric that does not separate the two
    cannot show."""
    rows, verdicts = [], []
    for name, figures in result["metrics"].items():
        low, high = figures["margin_ci"]
        rows.append([LABELS[name], figures["compared"], f"{figures['instances']:,}",
                     f"{_share(figures['wins'])} ({_share(figures['wins_ci'][0])}–{_share(figures['wins_ci'][1])})",
                     _share(figures["ties"]), _share(figures["losses"]),
                     f"{100 * figures['margin']:+.1f} ({100 * low:+.1f} to {100 * high:+.1f})",
                     "yes" if figures["separates"] else "**no**"])
        interval = f"{100 * figures['margin']:+.1f} points, 95 % CI {100 * low:+.1f} to {100 * high:+.1f}"
        if high < 0:
            verdicts.append(
                f"**{LABELS[name]} prefers the unchanged original ending to the reference rewrite**: the copy scores "
                f"higher on {_share(figures['losses'])} of instances, the rewrite on {_share(figures['wins'])} ({interval}). "
                "A system gains on it by copying X_OE rather than rewriting it.")
        elif not figures["separates"]:
            verdicts.append(
                f"**{LABELS[name]} does not tell the reference rewrite from the unchanged original ending**: the rewrite "
                f"scores higher on {_share(figures['wins'])} of instances, the copy on {_share(figures['losses'])} "
                f"({interval}). On it, copying X_OE does as well as rewriting it.")
    notes = [f"{LABELS[name]}: not measured ({why})." for name, why in result["not_measured"].items()]
    header = ["Metric", "compared", "instances", "Y_EE wins (95 % CI)", "ties", "X_OE wins",
              "wins − losses, points (95 % CI)", "separates"]
    return "\n\n".join([table(header, rows), *verdicts, *notes,
                        f"{result['instances']:,} instances of {result['stories']:,} stories; intervals: {result['n_resamples']:,} "
                        "bootstrap resamples of whole stories. Reference-based metrics score both endings against the "
                        "story's other references (the best of them), never against the instance's own."])
