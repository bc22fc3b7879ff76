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


def read_curves(directory: Path) -> dict[str, list[dict]]:
    """name -> the rows of each curve under a DVCLive directory (curve_files, read_curve)."""
    return {name: read_curve(path) for name, path in curve_files(directory).items()}


def read_curve(path: Path) -> list[dict]:
    """The rows of a DVCLive curve file: {"step": int, "value": float} (see parse_curve)."""
    return parse_curve(path.read_text(encoding="utf-8"), path.stem, str(path))


def parse_curve(text: str, column: str, where: str) -> list[dict]:
    """The rows of a DVCLive curve's text (its value column named `column`, the file's stem):
    {"step": int, "value": float}. A last line cut short (a kill during the write: no newline at
    its end) is dropped; a malformed line before it is an error naming `where`:line."""
    complete = text.split("\n")[:-1]
    rows = []
    for number, row in enumerate(csv.DictReader(complete, delimiter="\t"), start=2):
        try:
            rows.append({"step": int(row["step"]), "value": float(row[column])})
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{where}:{number}: not a `step<TAB>{column}` row") from None
    return rows
