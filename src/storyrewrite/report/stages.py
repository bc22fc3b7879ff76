"""The stages table of the report and of a collected comparison: one row per stage record
(`reports/stages/<stage>.json`, `storyrewrite.records`): where it ran, its dtype, wall time, the
work it did and its rate, its peak memory.

Here rather than beside the records: every stage imports `storyrewrite.records` to write its
record, so DVC reruns every stage when that file changes; how the report shows the records is
the report stage's code alone."""
from __future__ import annotations

import numpy as np

from storyrewrite.markdown import table
from storyrewrite.records import where_ran

STAGE_HEADER = ["Stage", "device", "dtype", "wall time", "work", "rate", "peak memory"]


def seconds(value: float) -> str:
    """A wall time: whole seconds from 10 s, tenths below."""
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def rate(value: float) -> str:
    """A rate to three significant digits, in digits with thousands separators (2,520,000, not
    2.52e+06; 0.00123 and 0.0000123 below 1, not 1.23e-05)."""
    rounded = float(f"{value:.3g}")
    return f"{rounded:,.0f}" if rounded >= 1000 else np.format_float_positional(rounded, trim="-")


def stages_table(records: list[dict]) -> str:
    """Markdown: one row per stage record (`stage_rows`)."""
    return table(STAGE_HEADER, stage_rows(records))


def stage_rows(records: list[dict]) -> list[list[str]]:
    """The cells of each stage record under STAGE_HEADER: device, dtype, wall time, work done and
    its rate, peak memory; an LLM stage's replies from its response cache beside its requests."""
    rows = []
    for r in records:
        work = "-" if r["items"] is None else f"{r['items']:,} {r['unit']}"
        if r.get("cache_hits"):  # an LLM stage: the replies its response cache held cost no request
            work += f" (+{r['cache_hits']:,} from the response cache)"
        speed = "-" if not r["items_per_s"] else f"{rate(r['items_per_s'])} {r['unit']}/s"
        # (GiB: the records' `*_gb` keys hold bytes / 2**30, as records._peak_memory measures them)
        memory = f"RSS {r.get('peak_rss_gb', 'n/a')} GiB" + (f", CUDA {r['peak_cuda_gb']} GiB" if "peak_cuda_gb" in r else "") + (
            f" ({r['peak_cuda_reserved_gb']} GiB held)" if "peak_cuda_reserved_gb" in r else "")
        rows.append([r["stage"], where_ran(r), r["dtype"] or "-", seconds(r["wall_s"]), work, speed, memory])
    return rows
