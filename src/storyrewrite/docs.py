"""The generated parts of README.md and docs/: tables that restate code (stages from dvc.yaml,
params from the schema and params.yaml, objectives and curves from the registry) or measured
data (the results of the committed run, reports/bench/*.json, the test suite's durations).

    python -m storyrewrite.docs           # rewrite every generated block (`make docs`)
    python -m storyrewrite.docs --check   # exit 1 naming each stale block (tests/test_docs.py)

A generated block sits between `<!-- generated: NAME -->` and `<!-- end generated -->`; the
text around it is written by hand. Hand-written text holds no measured number: those live in
the blocks, taken from the files the code wrote.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

import yaml

from storyrewrite.io import InputError, read_json, read_text, write_text_atomic
from storyrewrite.markdown import table
from storyrewrite.records import cpu_features
from storyrewrite.systems import COPY_BASELINES

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end generated -->)", re.S)
PAGES = ("README.md", "docs/*.md")


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> str:
    return table(header, [[_cell(c) for c in row] for row in rows])


# -- code ---------------------------------------------------------------------------------------

def stages() -> str:
    """Every stage of dvc.yaml: the params it reads and what it writes."""
    pipeline = yaml.safe_load(read_text(ROOT / "dvc.yaml"))["stages"]
    rows = []
    for name, stage in pipeline.items():
        body = stage.get("do", stage)
        items = stage.get("foreach")
        if isinstance(items, str):  # `${llm.modes}`: one stage per value of a param
            shown = f"`{name}@<each of {items.strip('${}')}>`"
        else:
            shown = f"`{name}@{{{','.join(items if isinstance(items, list) else list(items))}}}`" if items else f"`{name}`"
        params = [p if isinstance(p, str) else next(iter(p)) for p in body.get("params", [])]
        writes = []
        for kind in ("outs", "metrics", "plots"):
            for out in body.get(kind, []):
                path = out if isinstance(out, str) else next(iter(out))
                writes.append(f"`{path}`" + ("" if kind == "outs" else f" ({kind})"))
        rows.append([shown, ", ".join(f"`{p}`" for p in params) or "-", ", ".join(writes)])
    return _table(["stage", "params it reads", "writes"], rows)


def _yaml_comments(path: Path) -> dict[str, str]:
    """dotted key -> the comment on its line in a YAML file laid out one key per line."""
    comments, stack = {}, []
    for line in read_text(path).splitlines():
        match = re.match(r"^(\s*)([\w.-]+):(.*?)(?:\s+#\s*(.*))?$", line)
        if not match:
            continue
        indent = len(match.group(1))
        stack = [(i, k) for i, k in stack if i < indent] + [(indent, match.group(2))]
        if match.group(4):
            comments[".".join(k for _, k in stack)] = match.group(4)
    return comments


def _type_name(annotation: Any) -> str:
    """A field's type as a reader writes it: `int`, `a | b` for a Literal, `float | None`."""
    import types
    import typing

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)  # escaped for the table by _cell, as every cell
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin in (list, dict):
        return f"{origin.__name__} of " + ", ".join(_type_name(a) for a in args)
    return "None" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def _schema_comments() -> dict[str, str]:
    """class name.field -> the comment on the field's line in storyrewrite/params.py and, for the
    objectives' sections, storyrewrite/objectives/registry.py."""
    found, current = {}, None
    here = Path(__file__).parent
    lines = read_text(here / "params.py").splitlines() + read_text(here / "objectives" / "registry.py").splitlines()
    for line in lines:
        if match := re.match(r"^class (\w+)\(", line):
            current = match.group(1)
        elif current and (match := re.match(r"^    (\w+): .*?#\s*(.*)$", line)):
            found[f"{current}.{match.group(1)}"] = match.group(2)
    return found


def params() -> str:
    """Every key of params.yaml, its type (storyrewrite.params) and value and comment there."""
    from pydantic import BaseModel

    from storyrewrite.objectives.registry import SETTINGS
    from storyrewrite.params import SECTIONS, leaves, load_yaml

    raw = load_yaml(ROOT / "params.yaml")
    comments, schema = _yaml_comments(ROOT / "params.yaml"), _schema_comments()
    kinds = {**SECTIONS, **SETTINGS}
    rows = []
    for section in sorted(kinds, key=lambda name: list(raw).index(name) if name in raw else len(raw)):  # params.yaml's order
        kind = kinds[section]
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            for name, field in kind.model_fields.items():
                key = field.alias or name
                value = raw.get(section, {}).get(key)
                if isinstance(value, dict) and section == "download":
                    value = f"{len(dict(leaves(value)))} settings"
                rows.append([f"`{section}.{key}`", _type_name(field.annotation), json.dumps(value, ensure_ascii=False),
                             comments.get(f"{section}.{key}") or schema.get(f"{kind.__name__}.{name}", "")])
        else:
            rows.append([f"`{section}`", _type_name(kind), json.dumps(raw.get(section)), comments.get(section, "")])
    return _table(["key", "type", "in params.yaml", "what it is"], rows)


def objectives() -> str:
    """The objective registry: name, label, loss, its params section and what it needs."""
    from storyrewrite.objectives.registry import OBJECTIVES

    rows = []
    for name, o in OBJECTIVES.items():
        needs = [n for n, flag in (("scorer", o.needs_scorer), ("X_OE", o.needs_original_ending),
                                   ("chosen/rejected pairs", o.pairs)) if flag]
        label = ", ".join(o.variant_labels.values()) + f" (by `{o.settings}.{o.variant}`)" if o.variant else o.label
        rows.append([f"`{name}`", label, o.description, f"`{o.settings}`" if o.settings else "-", ", ".join(needs) or "-",
                     f"`storyrewrite.objectives.{o.module}`"])
    return _table(["`objective`", "reported as", "loss", "section", "needs", "code"], rows)


def curves() -> str:
    """Every training curve: which objectives log it and what it tells."""
    from storyrewrite.objectives.registry import COMMON_CURVES, CURVES

    rows = [[f"`{name}`", "all", text] for name, text in COMMON_CURVES.items()]
    seen: dict[str, list[str]] = {}
    for objective, curves in CURVES.items():
        for name in curves:
            seen.setdefault(name, []).append(objective)
    for name, users in seen.items():
        rows.append([f"`{name}`", ", ".join(users), CURVES[users[0]][name]])
    return _table(["curve", "objectives", "what it tells"], rows)


PROFILES = {  # profile -> (what it is for, how to run it)
    "params.yaml": ("the offline default, on a CPU", "`make repro`"),
    "params/gpu.yaml": ("one ~80 GB GPU", "`bash scripts/comparison.sh -j auto gpu all params/gpu.yaml`"),
    "params/paper.yaml": ("the paper's setting (needs the model hub and the original data)",
                          "`dvc exp run $(python -m storyrewrite.profiles overrides params/paper.yaml)`"),
    "params/smoke.yaml": ("on top of gpu.yaml: the GPU job rehearsed on a CPU",
                          "`bash scripts/comparison.sh -j 2 smoke core params/gpu.yaml params/smoke.yaml`"),
}


def profiles() -> str:
    """Each profile's main settings, from the files (an overlay over params.yaml; smoke over gpu)."""
    from storyrewrite.params import load_yaml, overlay

    base = load_yaml(ROOT / "params.yaml")
    rows = []
    for name, (purpose, command) in PROFILES.items():
        if name == "params.yaml":
            merged = base
        else:
            layers = ["params/gpu.yaml"] if name == "params/smoke.yaml" else []
            merged = base
            for layer in [*layers, name]:
                merged = overlay(merged, load_yaml(ROOT / layer), strict=False)
        data, nll, train = merged["data"], merged["train_nll"], merged["train"]
        size = (f"≤ {data['max_train']} train, ≤ {data['max_eval']} val and test instances" if data.get("max_train")
                else "all instances")

        def budget(section: dict) -> str:
            return f"{section['max_steps']} steps" if section["max_steps"] != -1 else f"{section['max_epochs']} epoch(s)"
        steps = f"NLL {budget(nll)}, then {budget(train)} of the objective; batch {train['batch_size']}, {train['precision']}"
        rows.append([f"`{name}`", purpose, f"`{merged['models']['generator']}`", size, steps, command])
    return _table(["profile", "for", "generator", "data", "training", "run it"], rows)


# -- measured -----------------------------------------------------------------------------------

def results() -> str:
    """The committed run's main table (reports/results.md), with its scale."""
    text = read_text(ROOT / "reports" / "results.md")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append(line)
    scale = next(line for line in lines if line.startswith("Task `")).split(". ")[0]
    data = yaml.safe_load(read_text(ROOT / "params.yaml"))
    trained = (f"{data['data']['max_train']} training instances, {data['train_nll']['max_steps']} NLL steps then "
               f"{data['train']['max_steps']} fine-tuning steps of batch {data['train']['batch_size']}, "
               f"objective `{data['objective']}`, generator `{data['models']['generator']}`")
    return "\n".join(table) + f"\n\n{scale} (the default profile, params.yaml: {trained}). From `reports/results.md`."


def _markdown_tables(text: str) -> list[list[list[str]]]:
    """The tables of a markdown page, each a list of rows of cells (header first, rule dropped)."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            if not set(line) <= set("|-: "):
                current.append([cell.strip() for cell in line.strip("|").split(" | ")])
        elif current:
            tables.append(current)
            current = []
    return tables


def _listed(items: list[str], last: str = "and") -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {last} {items[-1]}"


def gpu_results() -> str:
    """What the full-data comparison (reports/gpu/results.md, made by the collector) shows, in
    three sentences: the trained systems better than NLL at both bootstrap levels, the columns where
    the copy of the original ending scores as high as trained systems and how often each keeps it
    word for word, and the systems not run."""
    path = ROOT / "reports" / "gpu" / "results.md"
    if not path.exists():
        return ("No full-data comparison yet: `bash scripts/comparison.sh -j auto gpu all params/gpu.yaml` on a GPU "
                "collects it into `reports/gpu/` ([docs/gpu.md](docs/gpu.md)).")
    text = read_text(path)
    title = re.search(r"^# Results: (.*)$", text, re.M).group(1)
    scale = re.search(r"^Task `(\w+)`, ([\d,]+) test instances;.*devices: ([^.]*)\.", text, re.M)
    main, *_ = _markdown_tables(text)
    copy, *kept = _markdown_tables(text.split("## The copy of the original ending")[1].split("## Training")[0])
    trained = [row[0] for row in _markdown_tables(text.split("## Training")[1])[0][1:]]
    header, rows = main[0], {row[0]: row for row in main[1:]}

    def value(cell: str) -> str:
        return re.sub(r"[*\\†]", "", cell)

    better, none = [], []
    for system in trained[1:]:  # the first is NLL itself
        columns = [i for i, cell in enumerate(rows[system][1:], 1) if "\\*" in cell and "†" in cell]
        if not columns:
            none.append(system)
            continue
        better.append(f"{system} on {_listed([header[i] for i in columns])} "
                      f"({', '.join(value(rows[system][i]) for i in columns)} against "
                      f"{', '.join(value(rows[trained[0]][i]) for i in columns)})")
    if none:
        better.append(f"{_listed(none)} on none of them")
    groups: dict[str, list[str]] = {}
    for column, _, _, beaten in copy[1:]:
        groups.setdefault(beaten, []).append(column)
    said = []
    for beaten, columns in groups.items():
        count, total = (int(n) for n in re.match(r"(\d+) of (\d+)", beaten).groups())
        names = beaten[beaten.index("(") + 1:-1].split("; ") if count else []  # "k of n (A; B (x=1))"
        others = [s for s in trained if s not in names]
        how = ("every trained system" if count == total else "no trained system" if count == 0
               else f"{count} of {total} trained systems (all but {_listed(others)})" if len(others) <= len(names)
               else f"{count} of {total} trained systems ({_listed(names)})")
        said.append(f"{how} on {_listed(columns)}")
    if kept:  # how often each system keeps X_OE word for word (the collector's kept_original)
        shares = {row[0]: row[1] for row in kept[0][1:]}
        ranked = sorted((float(shares[s]), s) for s in trained[1:] if s in shares)
        reference = shares.get(COPY_BASELINES["copy_reference"][1])
        said[-1] += (f"; the fine-tuned systems keep X_OE word for word in {ranked[0][0]:.1f} % ({ranked[0][1]}) to "
                     f"{ranked[-1][0]:.1f} % ({ranked[-1][1]}) of their endings, NLL in {shares[trained[0]]} %"
                     + (f", the reference rewrites in {reference} %" if reference else "")) if ranked else ""
    missing = re.search(r"^No run here trained (.*): not in these tables\.$", text, re.M)
    profile = re.search(r"\((.*)\)$", title)
    return " ".join([
        f"[reports/gpu/results.md](reports/gpu/results.md), {scale.group(2)} test instances of `{scale.group(1)}` "
        f"({f'`{profile.group(1)}`' if profile else title}, {scale.group(3)}), column by column, better than NLL at "
        "p < 0.05 resampling both instances and stories: " + "; ".join(better) + ".",
        "Copying the original ending matches or beats " + "; ".join(said) + ".",
        *([f"It holds no run of {_listed(missing.group(1).split(', '), 'or')} yet."] if missing else []),
    ])


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [item for key, inner in value.items() for item in _flatten(inner, f"{prefix}.{key}" if prefix else str(key))]
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [item for i, inner in enumerate(value) for item in _flatten(inner, f"{prefix}[{i}]")]
    return [(prefix, value)]


def _mark(value: Any, target: dict | None, spec: str = "") -> str:
    """The target beside a figure: its bound, in the figure's own format (`spec`: a share shown as
    a percent has its bound shown as one), and whether the figure meets it."""
    if target is None or not isinstance(value, (int, float)):
        return ""
    if "max" in target:
        return f"≤ {format(target['max'], spec)} " + ("✓" if value <= target["max"] else "✗")
    return f"≥ {format(target['min'], spec)} " + ("✓" if value >= target["min"] else "✗")


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(_shown(v) for v in value)
    return str(value)


def _record_kind(run: dict) -> list[str]:
    """A line on a record that is not a whole run's (bench/comparison.py): an interim one,
    written while its run went on, and one of a comparison resumed from runs gathered before."""
    lines = []
    figures, settings = run["figures"], run.get("settings", {})
    if figures.get("complete") is False:
        lines.append(f"An interim record: written {figures.get('elapsed_s', '?')} s into a run that had not ended "
                     "(a target only where that time already exceeds it).")
    if before := settings.get("gathered_before"):
        lines.append(f"A resumed comparison: {len(before)} run(s) gathered before were not run again; no target applies.")
    return ["", " ".join(lines)] if lines else []


def _whole_run(run: dict) -> bool:
    """Whether a record's wall times are its whole run's: neither interim nor resumed (_record_kind)."""
    return not _record_kind(run)


def benchmarks() -> str:
    """Every reports/bench/<script>.json: per device, where it ran and each figure beside its target."""
    parts = []
    for path in sorted((ROOT / "reports" / "bench").glob("*.json")):
        for where, run in read_json(path).items():
            targets = run.get("targets", {})
            rows = [[f"`{name}`", _shown(value), _mark(value, targets.get(name))] for name, value in _flatten(run["figures"])]
            # A variant's results (objective_step_time-bf16-mixed.json) are named apart from the script's own.
            variant = path.stem.removeprefix(Path(run["script"]).stem).strip("-_")
            parts.append("\n".join([
                f"### `{run['script']}`{f' ({variant})' if variant else ''} on {where}",
                f"`{run['command']}`; {run['device_name'] if run['device'] != 'cpu' else run.get('machine', where)}"
                + (f" ({cpu_features(run)})" if "cpu_capability" in run else "") + ", "
                f"{run['torch_threads']} torch threads, torch {run['torch']}"
                + (f", CUDA {run['cuda']}" if run.get("cuda") else "") + f"; commit {run['commit']}, {run['measured_at']}.",
                *_record_kind(run),
                "", _table(["figure", "value", "target"], rows),
                "", "Settings: " + ", ".join(f"{k} = {_shown(v)}" for k, v in run.get("settings", {}).items()) + ".",
            ]))
    return "\n\n".join(parts) if parts else "No benchmark has been run yet."


# The GPU targets the README states, each: (figures file, dotted figure, how it reads, format).
# `{value}` is the figure; other fields are the run's own settings, as its record holds them.
GPU_FIGURES = [
    ("objective_step_time-bf16-mixed", "score.ratio",
     "a DTO-Score training step (batch {batch_size}, {precision}) {value}× an NLL step", "g"),
    ("objective_step_time-bf16-mixed", "score_delta.ratio", "DTO-Score+Delta {value}×", "g"),
    ("objective_step_time-bf16-mixed", "nll.gpu_busy", "GPU busy during NLL steps {value}", ".0%"),
    ("objective_pairs-bf16-mixed", "score.ratio", "interleaved in one process, DTO-Score {value}×", "g"),
    ("objective_pairs-bf16-mixed", "score_delta.ratio", "DTO-Score+Delta {value}×", "g"),
    ("nll_throughput", "generate_predictions_per_s",
     "generation (batches of {generate_batch_size}, {generate_dtype}) {value} test predictions/s", ".1f"),
    ("scorer_and_bootstrap", "batched_speedup", "the batched LMScorer {value}× a one-pair loop", ".1f"),
    ("scorer_and_bootstrap", "largest_fp32_difference", "with fp32 scores within {value} of it", ".1e"),
    ("comparison", "wall_s.core", "the whole comparison's `core` in {value} s", ".0f"),
    ("comparison", "wall_s.core_in_all", "`core` beside `cpo` in {value} s", ".0f"),
    ("comparison", "wall_s.total", "the whole comparison in {value} s", ".0f"),
    ("comparison", "load.gpu_busy_pct_mean", "the GPU busy {value} % of that run", ".0f"),
]


def gpu_speed() -> str:
    """The GPU targets' figures, per GPU that measured them (reports/bench/, non-CPU entries)."""
    by_device: dict[str, list[str]] = {}
    paths = {stem: ROOT / "reports" / "bench" / f"{stem}.json" for stem, *_ in GPU_FIGURES}
    records = {stem: read_json(path) if path.exists() else {} for stem, path in paths.items()}  # each file read once
    for stem, name, words, spec in GPU_FIGURES:
        for where, run in records[stem].items():
            figures = dict(_flatten(run["figures"]))
            if run["device"] == "cpu" or name not in figures or not _whole_run(run):
                continue
            mark = _mark(figures[name], run.get("targets", {}).get(name), spec if spec.endswith("%") else "")
            by_device.setdefault(f"{where} (commit {run['commit']}, {run['measured_at'][:10]})", []).append(
                words.format(**run.get("settings", {}), value=format(figures[name], spec)) + (f" (target {mark})" if mark else ""))
    if not by_device:
        return "No GPU figure yet: `bash scripts/gpu_bench.sh` measures them ([docs/gpu.md](docs/gpu.md))."
    return "\n\n".join(f"On one {where}: " + "; ".join(parts) + "." for where, parts in by_device.items()) \
        + (" Each target is the one its record was measured against, at that commit; every figure, with its command "
           "and machine: [docs/benchmarks.md](docs/benchmarks.md).")


def test_durations() -> str:
    """The slowest tests of the last full run (reports/tests/durations.json, `make test`)."""
    path = ROOT / "reports" / "tests" / "durations.json"
    if not path.exists():
        return "Not measured yet: `make test` writes reports/tests/durations.json."
    data = read_json(path)
    rows = [[f"`{t['test']}`", f"{t['seconds']:.1f}"] for t in data["slowest"]]
    workers = data.get("workers", 1)
    run = "one process" if workers == 1 else f"{workers} pytest-xdist workers"
    return (f"{data['tests']} tests in {data['seconds'] / 60:.1f} min (wall clock, {run}) on {data['machine']} "
            f"({data['when']}); the slowest:\n\n"
            + _table(["test", "seconds (setup + call)"], rows))


GENERATORS: dict[str, Callable[[], str]] = {
    "stages": stages, "params": params, "profiles": profiles, "objectives": objectives, "curves": curves, "results": results,
    "benchmarks": benchmarks, "gpu-results": gpu_results, "gpu-speed": gpu_speed, "test-durations": test_durations,
}


def render(text: str, where: str) -> str:
    """`text` with every generated block's body made afresh."""
    def body(match: re.Match) -> str:
        name = match.group(2)
        if name not in GENERATORS:
            line = text[: match.start()].count("\n") + 1
            raise InputError(f"{where}:{line}: unknown generated block {name!r}; valid: {', '.join(GENERATORS)}")
        return f"{match.group(1)}{GENERATORS[name]().rstrip()}\n{match.group(4)}"
    return BLOCK.sub(body, text)


def pages() -> list[Path]:
    return sorted(p for pattern in PAGES for p in ROOT.glob(pattern))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m storyrewrite.docs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is stale")
    args = parser.parse_args(argv)
    stale = []
    for page in pages():
        text = read_text(page)
        fresh = render(text, str(page.relative_to(ROOT)))
        if fresh != text:
            stale.append(str(page.relative_to(ROOT)))
            if not args.check:
                write_text_atomic(page, fresh)
    if args.check and stale:
        print(f"stale: {', '.join(stale)} (run `make docs`)", file=sys.stderr)
        return 1
    print(("updated: " + ", ".join(stale)) if stale and not args.check else "docs are up to date")
    return 0


if __name__ == "__main__":
    from storyrewrite.io import run_cli

    run_cli(lambda: sys.exit(main()))
