"""Reading the training curves DVCLive writes (one `step<TAB><name>` TSV per logged quantity
under `<log dir>/plots/metrics/`), torch-free: for training's summary and for the report's figures."""
from __future__ import annotations

import csv
from pathlib import Path

from storyrewrite.io import InputError


def curve_files(directory: Path) -> dict[str, Path]:
    """name -> its curve file, under a DVCLive directory (`rewards/chosen` -> plots/metrics/rewards/chosen.tsv)."""
    root = Path(directory) / "plots" / "metrics"
    return {path.relative_to(root).with_suffix("").as_posix(): path for path in sorted(root.rglob("*.tsv"))}


def read_curve(path: Path) -> list[dict]:
    """The rows of a DVCLive curve: {"step": int, "value": float}. A last line cut short (a kill
    during the write: no newline at its end) is dropped; a malformed line before it is an error
    naming file:line."""
    complete = path.read_text(encoding="utf-8").split("\n")[:-1]
    rows = []
    for number, row in enumerate(csv.DictReader(complete, delimiter="\t"), start=2):
        try:
            rows.append({"step": int(row["step"]), "value": float(row[path.stem])})
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{path}:{number}: not a `step<TAB>{path.stem}` row") from None
    return rows
