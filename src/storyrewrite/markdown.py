"""The project's one Markdown table writer: every table in reports/ and docs/ goes through it.

Not pandas' `DataFrame.to_markdown`: it pads every column to its widest cell (tabulate's pipe
format), so one changed cell in a committed report rewrites every row of its column in git's
diff, and it reads cells that look like numbers as numbers and formats them again unless told
not to. Here each row stays one line whatever its neighbours, and cells are written as given.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence


def table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> str:
    """A pipe table: the header, its rule, then one line per row (cells as `str` gives them)."""
    lines = [_row(header), "|" + "---|" * len(header)]
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"a row of {len(row)} cells under a header of {len(header)}: {list(row)}")
        lines.append(_row(row))
    return "\n".join(lines)


def _row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"
