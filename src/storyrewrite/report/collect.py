"""Collect gathered experiments (storyrewrite.report.gather) into one folder of tables.

    python -m storyrewrite.report.collect runs/gpu [runs/gpu-part2 ...] --out reports/gpu

`--out` is replaced as a whole, atomically. It gets results.md and results.png (NLL, then each
objective's run with the lowest validation NLL at its best checkpoint, the LLM modes and the
copy baselines, each tested against the NLL model of its own run over instances and over
stories), objectives.md, experiments.md, stages.md, significance.json, and each run's metrics,
training curves, stage records and params: docs/training.md says what each holds.
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import subprocess
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pandas as pd
import yaml

from storyrewrite.curves import parse_curve
from storyrewrite.data.schema import TASK_COLUMNS
from storyrewrite.io import InputError, atomic_dir, write_bytes_atomic, write_json_atomic, write_text_atomic
from storyrewrite.params import leaves, yaml_scalar
from storyrewrite import artifacts
from storyrewrite.metrics.artifacts import Significance, SystemMetrics
from storyrewrite.markdown import table
from storyrewrite.metrics.columns import keeps_original
from storyrewrite.objectives.registry import OBJECTIVES, reads_section
from storyrewrite.records import where_ran
from storyrewrite.report.stages import STAGE_HEADER, stage_rows
from storyrewrite.report.build import (coherence_notes, cut_count, cut_notes, echo_notes, empty_notes, kept_original_section, llm_label, train_seconds, training_section,
                                       what_m_scores)
from storyrewrite.report.figure import compact_png, results_figure
from storyrewrite.report.gather import manifests, params_key, read_blob, with_added_later
from storyrewrite.report.tables import (Row, coherence_columns, column_label, markdown_table, metric_value, number, overlap_columns,
                                        plain_cells)
from storyrewrite.significance.compare import UNITS, Pair, bound_note, compare_tests, p_text
from storyrewrite.systems import COPY_BASELINES, pipeline_systems

BASELINE, FINETUNED = "nll", "finetuned"


class Run:
    """One gathered experiment: its name, revision and the files its stages wrote."""

    def __init__(self, manifest: dict, root: Path):
        self.name, self.rev = manifest["name"], manifest["rev"]
        # The project's commit the experiment derives from: where it ran in a git repository made
        # of a copy of the tree (offline/job.sh compare), the commit that copy was of.
        self.base = manifest.get("source_commit") or manifest.get("base")
        self.files, self.root = manifest["files"], Path(root)
        self._texts: dict[str, str] = {}  # each file decompressed and checked once
        self._scores: dict[str, list[dict]] = {}

    def has(self, path: str) -> bool:
        return path in self.files

    def text(self, path: str) -> str:
        if path not in self.files:
            raise InputError(f"{self.root}/{self.name}.json: run {self.name} has no {path}")
        if path not in self._texts:
            try:
                self._texts[path] = read_blob(self.root, self.files[path]).decode("utf-8")
            except UnicodeDecodeError as err:
                raise InputError(f"{path} of run {self.name} ({self.root}): not valid UTF-8 ({err.reason})") from None
        return self._texts[path]

    def artifact(self, path: str, model: type, optional: bool = False) -> dict | None:
        """The file at `path` read as its artifact (storyrewrite.artifacts), as a dict of the
        fields it holds; None for an `optional` one the run lacks."""
        if optional and not self.has(path):
            return None
        return artifacts.read(f"{path} of run {self.name} ({self.root})", model, text=self.text(path)).model_dump(exclude_unset=True)

    @cached_property
    def params(self) -> dict:
        """Its params.yaml, with the value that computes what it did for each setting added since
        (gather.ADDED_LATER): no column of the tables tells runs apart by a key only newer ones have."""
        return with_added_later(yaml.safe_load(self.text("params.yaml")) or {})

    @cached_property
    def flat_params(self) -> dict:
        return dict(leaves(self.params))

    def _metrics_path(self, system: str) -> str | None:
        return next((path for folder in ("reports/metrics", "reports/sanity/metrics") if self.has(path := f"{folder}/{system}.json")), None)

    def metrics(self, system: str) -> dict | None:
        path = self._metrics_path(system)
        return None if path is None else self.artifact(path, SystemMetrics)

    def scores_path(self, system: str) -> str:
        return self._metrics_path(system).replace("/metrics/", "/scores/").removesuffix(".json") + ".jsonl"

    def scores(self, system: str) -> list[dict]:
        """`system`'s per-instance score rows, parsed once (the same list each call: read, never changed)."""
        if system not in self._scores:
            self._scores[system] = [json.loads(line) for line in self.text(self.scores_path(system)).splitlines() if line.strip()]
        return self._scores[system]

    def summary(self, system: str) -> dict | None:
        return self.artifact(f"reports/train/{system}/metrics.json", artifacts.TrainingSummary, optional=True)

    def curves(self, system: str) -> dict[str, list[dict]]:
        """name -> the rows of each training curve of `system` the run holds (storyrewrite.curves:
        `rewards/chosen` from plots/metrics/rewards/chosen.tsv); empty for a system not trained."""
        root = f"reports/train/{system}/plots/metrics/"
        return {path.removeprefix(root).removesuffix(".tsv"): parse_curve(self.text(path), Path(path).stem, f"{self.root}/{self.name}: {path}")
                for path in sorted(self.files) if path.startswith(root) and path.endswith(".tsv")}

    def systems(self) -> list[str]:
        """The systems of the run's pipeline, named by its own params as the report stage names
        them (storyrewrite.systems): never whatever metrics files its commit holds, for the
        metrics of an LLM mode since dropped from `llm.modes` stay in git."""
        task, modes = self.params.get("task"), (self.params.get("llm") or {}).get("modes")
        if task not in TASK_COLUMNS or not isinstance(modes, list):
            raise InputError(f"{self.root}/{self.name}.json: the run's params.yaml needs `task` (one of {', '.join(TASK_COLUMNS)}) "
                             f"and `llm.modes` (a list); it has task {task!r}, llm.modes {modes!r}")
        return pipeline_systems([BASELINE, FINETUNED], modes, task)

    @property
    def val_nll(self) -> float | None:
        summary = self.summary(FINETUNED)
        return None if summary is None else summary.get("best_val_nll")

    @cached_property
    def records(self) -> list[dict]:
        """Its stage records (storyrewrite.records)."""
        return [self.artifact(path, artifacts.Record) for path in sorted(self.files) if path.startswith("reports/stages/")]


def load_runs(roots: list[Path]) -> list[Run]:
    """The runs gathered into `roots`. A run is its params: of runs with equal params (one
    queued again, or run on two machines) the one gathered last stands. Sorted by objective, then
    by params."""
    latest: dict[str, tuple[str, Run]] = {}
    for root in roots:
        for manifest in manifests(root):
            run = Run(manifest, root)
            key = params_key(run.params)
            if key not in latest or manifest.get("gathered_at", "") >= latest[key][0]:
                latest[key] = (manifest.get("gathered_at", ""), run)
    return sorted((run for _, run in latest.values()),
                  key=lambda run: (str(run.params.get("objective")), params_key(run.flat_params)))


def frame(runs: list[Run]) -> pd.DataFrame:
    """One row per run: the run, the label of the system its fine-tuning trained, its validation
    NLL, whether it was scored, and its flat params (a column each; None where a run lacks one)."""
    keys = sorted(set().union(*(run.flat_params for run in runs)))
    summaries = [run.summary(FINETUNED) for run in runs]
    facts = pd.DataFrame({"run": pd.Series(runs, dtype=object), "label": [s["label"] if s else None for s in summaries],
                          "val_nll": pd.Series([run.val_nll for run in runs], dtype=float),
                          "scored": pd.Series([run.metrics(FINETUNED) is not None and s is not None
                                               for run, s in zip(runs, summaries, strict=True)], dtype=bool)})
    # dtype object: each param as YAML read it (1 and 1.0 differ, as they do in params.yaml).
    params = pd.DataFrame([[run.flat_params.get(key) for key in keys] for run in runs], columns=[f"params.{k}" for k in keys],
                          dtype=object)
    return pd.concat([facts, params], axis=1)


def best_per_objective(runs: list[Run]) -> list[Run]:
    """For each system (an objective, or an objective's variant that makes a system of its own,
    as RLOO's reward: the label its summary carries), the scored run with the lowest validation NLL
    at its best checkpoint, in the order: the baseline objective continued (the equal-budget
    control), then by label."""
    runs_ = frame(runs)
    scored = runs_[runs_["scored"] & runs_["val_nll"].notna()]
    if scored.empty:
        raise InputError("no scored experiment among the gathered runs (run `dvc exp run -S objective=...` first)")
    best = scored.sort_values("val_nll", kind="stable").drop_duplicates("label")
    best = best.assign(later=best["params.objective"] != BASELINE).sort_values(["later", "label"], kind="stable")
    return list(best["run"])


def objective_label(run: Run, runs: list[Run]) -> str:
    """The label the run wrote (from the objective registry) and, for a system run several times
    (the CPO grid), the settings that differ between its runs."""
    summary = run.summary(FINETUNED)
    if run.params.get("objective") == BASELINE:
        return f"{summary['label']}, continued"
    siblings = [r.summary(FINETUNED).get("settings") or {} for r in runs
                if r.summary(FINETUNED) and r.summary(FINETUNED)["label"] == summary["label"]]
    settings = summary.get("settings") or {}
    varying = [k for k in settings if len({json.dumps(s.get(k)) for s in siblings}) > 1]
    # A field named after a Python keyword ends in "_" (CPO's lambda_); the paper says lambda.
    shown = [f"{key.removesuffix('_')}={settings[key]}" for key in varying]
    return f"{summary['label']} ({', '.join(shown)})" if varying else summary["label"]


@dataclass
class Entry:
    """A system of the comparison: which run it comes from and its name there."""
    label: str
    run: Run
    system: str
    kind: str  # baseline | trained | llm | copy

    @property
    def metrics(self) -> dict | None:
        return self.run.metrics(self.system)


def all_columns(metrics: list[dict]) -> list[str]:
    """The overlap columns, then the coherence columns, that any of these metrics files has."""
    rows = [Row("", "", m, {}) for m in metrics]
    return overlap_columns(rows) + coherence_columns(rows)


def llm_usage(run: Run, system: str) -> dict | None:
    """An LLM baseline's usage file (mode, backend, model, cost) in `run`, if it has one."""
    return run.artifact(f"reports/llm/{system.removeprefix('llm_')}.json", artifacts.LLMUsage, optional=True)


def comparison(runs: list[Run]) -> list[Entry]:
    chosen = best_per_objective(runs)
    # The NLL model, the LLM modes and the copy baselines of one commit are the same in every run
    # (DVC's run cache); they are taken from the first chosen run.
    reference = chosen[0]
    entries = [Entry(reference.summary(BASELINE)["label"] if reference.summary(BASELINE) else BASELINE, reference, BASELINE, "baseline")]
    entries += [Entry(objective_label(run, runs), run, FINETUNED, "trained") for run in chosen]
    systems = reference.systems()
    for system in sorted(s for s in systems if s.startswith("llm_")):
        info = llm_usage(reference, system)
        entries.append(Entry(llm_label(info) if info else system, reference, system, "llm"))
    entries += [Entry(label, reference, system, "copy") for system, (_, label) in COPY_BASELINES.items() if system in systems]
    return entries


def bootstrap_settings(reference: Run) -> tuple[int, int]:
    """The reference run's `significance.n_resamples` and `seed`."""
    return reference.params.get("significance", {}).get("n_resamples", 10000), reference.params.get("seed", 0)


def p_values(entries: list[Entry], reference: Run) -> dict[str, dict[str, dict]]:
    """{label: {unit: {"<metric>/<form>": p}}}: each system against the NLL model of its own run,
    resampling instances and, separately, whole stories (a story's endings share one input), with
    the reference run's `significance.n_resamples` and `seed`; every system shares one bootstrap
    per unit (compare_tests)."""
    tests = {e.label: Pair(e.label, e.run.scores(e.system), BASELINE, e.run.scores(BASELINE)) for e in entries if e.kind != "baseline"}
    found = compare_tests(tests, *bootstrap_settings(reference))
    return {label: {unit: found[unit][label] for unit in UNITS} for label in tests}


def counterpart_run(run: Run, chosen: Run, groups: list[list[Run]]) -> Run:
    """The run to set `run` against for the system whose tables show `chosen`: of the runs that
    differ from `chosen` only in their training seeds (`groups`: seed_groups), the one with
    `run`'s seeds; `chosen` where there is none."""
    group = next((g for g in groups if chosen in g), [chosen])
    return next((r for r in group if training_seeds(r) == training_seeds(run)), chosen)


def head_to_head(entries: list[Entry], reference: Run, runs: list[Run]) -> dict[str, dict]:
    """{label: {"against", "run", "shown", "differs", unit: {"better": {column: p}, "worse": ...}}}
    for each trained system whose summary names a counterpart among the entries (RLOO: the DTO
    objective of the same reward): one-tailed paired bootstraps both ways, against the
    counterpart's run of the system's training seeds (counterpart_run), with what the two runs do
    not share (start_differences)."""
    by_label = {e.label: e for e in entries if e.kind == "trained"}
    groups, found, tests = seed_groups(runs), {}, {}
    for entry in by_label.values():
        against = (entry.run.summary(entry.system) or {}).get("counterpart")
        if against not in by_label:
            continue
        other = by_label[against]
        run = counterpart_run(entry.run, other.run, groups)
        own, theirs = entry.run.scores(entry.system), run.scores(other.system)
        tests[entry.label, "better"] = Pair(entry.label, own, against, theirs)
        tests[entry.label, "worse"] = Pair(against, theirs, entry.label, own)
        found[entry.label] = {"against": against, "run": run.name, "shown": run is other.run, "differs": start_differences(entry.run, run)}
    p = compare_tests(tests, *bootstrap_settings(reference))  # every duel, both ways, in one bootstrap per unit
    for label, duel in found.items():
        duel.update({unit: {way: p[unit][label, way] for way in ("better", "worse")} for unit in UNITS})
    return found


# Said under a table of p-values with an n/a cell (significance.compare.compare_tests leaves such a column out).
NOT_TESTED = ("n/a: not tested, as the two score files do not both hold the column, or name different models for it "
              "(`scored_by`: another scorer, judge or precision).")


def head_to_head_markdown(duels: dict[str, dict], columns: list[str], alpha: float, n_resamples: int) -> list[str]:
    """The head-to-head section (empty where no system has a counterpart among the runs)."""
    if not duels:
        return []
    tested = [c for c in columns if c != "hmean"]
    rows = []
    for label, duel in duels.items():
        cells = []
        for column in tested:
            better, worse = duel["instance"]["better"].get(column), duel["instance"]["worse"].get(column)
            cells.append("n/a" if better is None else f"{p_text(better, n_resamples)} / {p_text(worse, n_resamples)}"
                         + (" (better)" if better < alpha else " (worse)" if worse < alpha else ""))
        against = duel["against"] + ("" if duel.get("shown", True) else f" ({duel['run']})")
        against += f" (not the same {', '.join(differs)})" if (differs := duel.get("differs")) else ""
        rows.append([label, against, *cells])
    shared = ("the same NLL model to start from, the same steps, batch size and training seeds"
              if not any(d.get("differs") for d in duels.values())
              else "the same NLL model to start from, steps, batch size and training seeds except where the row says otherwise")
    named = (" Where the row names a run, it is not the one the tables above show for that system (another training "
             "seed of it): the one that shares the system's seeds." if not all(d.get("shown", True) for d in duels.values()) else "")
    return ["## Against the DTO objective of the same reward", table(["System", "against", *(column_label(c) for c in tested)], rows),
            f"Each cell: p (H1: the system scores higher than the one it is set against) / p (H1: it scores lower), "
            f"one-tailed paired bootstraps over instances (over stories: significance.json); (better) or (worse) where "
            f"one of them is below {alpha}, nothing where neither shows. The same reward; {shared}.{named}"
            + bound_note([cell for row in rows for cell in row[2:]], n_resamples)
            + (f" {NOT_TESTED}" if any("n/a" in row for row in rows) else "")]


def kept_original(entries: list[Entry]) -> list[str]:
    """How often each system (the copy of X_OE aside) keeps the original ending word for word
    (storyrewrite.report.build.kept_original_section)."""
    return kept_original_section({e.label: keeps_original(e.run.scores(e.system)) for e in entries if e.system != "copy_original"})


def copy_against_trained(entries: list[Entry]) -> str:
    """Per column: the copy of the original ending against the trained systems (NLL included)."""
    copy = next((e for e in entries if e.system == "copy_original"), None)
    if copy is None:
        return "The task has no original ending: no copy baseline of it."
    trained, rows = [e for e in entries if e.kind in ("baseline", "trained")], []
    for column in all_columns([e.metrics for e in entries]):
        copied = metric_value(copy.metrics, column)
        values = [(e.label, v) for e in trained if (v := metric_value(e.metrics, column)) is not None]
        if copied is None or not values:
            continue
        best_label, best = max(values, key=lambda item: item[1])
        beaten = [label for label, v in values if copied >= v]
        rows.append([column_label(column), number(column, copied), f"{best_label}: {number(column, best)}",
                     f"{len(beaten)} of {len(values)}" + (f" ({'; '.join(beaten)})" if beaten else "")])
    return table(["Column", "copy of the original ending", "best trained system", "trained systems it matches or beats"], rows)


def nll_model(run: Run) -> str:
    """What tells the NLL models of two runs apart: the NLL system's metrics on the test set (the
    same model, trained once and restored from DVC's run cache, scores the same in every run of a
    machine; models trained apart, e.g. on two machines, score differently)."""
    return json.dumps(run.metrics(BASELINE), sort_keys=True)


def start_differences(run: Run, other: Run) -> list[str]:
    """What two fine-tuning runs set against each other do not share: their NLL model, the
    number of steps, the batch size, the training seeds (empty: a like-for-like comparison)."""
    found = [] if nll_model(run) == nll_model(other) else ["NLL model"]
    for key, name in (("max_steps", "steps"), ("batch_size", "batch size")):
        if run.params.get("train", {}).get(key) != other.params.get("train", {}).get(key):
            found.append(name)
    if training_seeds(run) != training_seeds(other):
        found.append("training seeds")
    return found


def baseline_note(entries: list[Entry]) -> str | None:
    """Where the chosen runs do not share one NLL model (gathered on different machines), say so:
    each of them is tested against its own."""
    models: dict[str, list[str]] = {}
    for e in (e for e in entries if e.kind in ("baseline", "trained")):
        models.setdefault(nll_model(e.run), []).append(e.run.name)
    if len(models) < 2:
        return None
    parts = [f"{', '.join(sorted(set(names)))}: BARTScore (M) {number('bartscore/predictive', json.loads(key)['bartscore']['predictive'])}"
             for key, names in models.items()]
    return (f"The chosen runs hold {len(models)} different NLL models (trained apart, e.g. on different machines): "
            f"{'; '.join(parts)}. The NLL row is the first; each system is tested against the NLL model of its own run.")


# The params that give a training run its own randomness (storyrewrite.params.TrainConfig.seed):
# runs that differ in these alone are one system trained with several seeds.
SEED_KEYS = ("train.seed", "train_nll.seed")


def training_seeds(run: Run) -> tuple[int, int]:
    """(the NLL run's seed, the fine-tuning run's seed): each section's own, else the top-level one."""
    top = run.params.get("seed", 0)
    return tuple(top if (own := run.params.get(section, {}).get("seed")) is None else own
                 for section in ("train_nll", "train"))


def seed_groups(runs: list[Run]) -> list[list[Run]]:
    """The scored runs that differ only in their training seeds (SEED_KEYS), in groups of two or
    more seeds, sorted by seed. Of runs with the same seeds (`train.seed` null and set to the
    top-level seed are one seed) one counts, a repeat is not another seed: the one that leaves
    the seeds to the top-level one (the `core` run of scripts/comparison.sh), else the first by name."""
    runs_ = frame(runs)
    runs_ = runs_[runs_["scored"]].copy()
    others = [c for c in runs_.columns if c.startswith("params.") and c.removeprefix("params.") not in SEED_KEYS]
    runs_["group"] = runs_[others].apply(lambda row: json.dumps(row.to_dict(), sort_keys=True, default=str), axis=1)
    runs_["seeds"] = runs_["run"].map(training_seeds)
    runs_["explicit"] = runs_["run"].map(lambda run: (*(run.params.get(section, {}).get("seed") is not None
                                                       for section in ("train_nll", "train")), run.name))
    unique = runs_.sort_values("explicit", kind="stable").drop_duplicates(["group", "seeds"])
    return [list(group.sort_values("seeds")["run"]) for _, group in unique.groupby("group", sort=False) if len(group) > 1]


def seeds_markdown(runs: list[Run], alpha: float) -> list[str]:
    """The spread over training seeds of each system run with several (empty where none was):
    per column the mean ± standard deviation over the seeds, and in how many of them the system
    beats the NLL model of its own run (p < alpha in the run's own significance.json)."""
    groups = sorted(seed_groups(runs), key=lambda group: objective_label(group[0], runs))
    if not groups:
        return []
    columns = [c for c in all_columns([run.metrics(FINETUNED) for group in groups for run in group]) if c != "hmean"]
    rows = []

    def spread(column: str, group: list[Run], system: str) -> str | None:
        values = [v for run in group if (v := metric_value(run.metrics(system), column)) is not None]
        return None if len(values) < 2 else f"{number(column, statistics.fmean(values))} ± {number(column, statistics.stdev(values))}"

    nll_models: dict[str, Run] = {}  # the first run of each NLL model
    for run in (run for group in groups for run in group):
        nll_models.setdefault(nll_model(run), run)
    for group in groups:
        beats = {c: sum(own_p_values(run).get(FINETUNED, {}).get(c, 1.0) < alpha for run in group) for c in columns}
        cells = ["n/a" if (cell := spread(c, group, FINETUNED)) is None else f"{cell} ({beats[c]}/{len(group)})" for c in columns]
        rows.append([objective_label(group[0], runs), ", ".join(f"{a}/{b}" for a, b in map(training_seeds, group)), *cells])
    if len(nll_models) > 1:  # the NLL models differ too (train_nll.seed varied): their own spread
        models = list(nll_models.values())
        rows.append([f"NLL ({len(models)} models)", ", ".join(str(training_seeds(run)[0]) for run in models),
                     *(spread(c, models, BASELINE) or "n/a" for c in columns)])
    header = ["System", "seeds (NLL / fine-tuning)", *(column_label(c) for c in columns)]
    return ["## Across training seeds", table(header, rows),
            f"Systems run with several training seeds (`train.seed`, `train_nll.seed`; the data, splits and bootstrap "
            f"unchanged): mean ± standard deviation over the seeds, and in brackets in how many of them the system beats "
            f"the NLL model of its own run (p < {alpha}, the run's own significance stage: its `significance.unit`). The tables above "
            f"show one seed per system, the one with the lowest validation NLL."]


def systems_without_a_run(runs: list[Run]) -> list[str]:
    """The registry's trained systems that no run here trained, in the registry's order, so that a
    partial comparison says what it lacks: "NLL, continued" for `nll`, each RLOO reward apart.
    Systems the task cannot train (the ones that need an original ending it lacks) are left out."""
    task = runs[0].params.get("task")
    held = set()
    for run in runs:
        objective = OBJECTIVES.get(run.params.get("objective"))
        if objective is not None:
            setting = (run.params.get(objective.settings) or {}).get(objective.variant) if objective.variant else None
            held.add((objective.name, setting))
    missing = []
    for name, objective in OBJECTIVES.items():
        if objective.variant:
            for value, label in objective.variant_labels.items():
                if objective.serves(task, value) and (name, value) not in held:
                    missing.append(label)
        elif objective.serves(task) and (name, None) not in held:
            missing.append(f"{objective.label}, continued" if name == BASELINE else objective.label)
    return missing


def results_markdown(entries: list[Entry], tests: dict, runs: list[Run], title: str, alpha: float,
                     duels: dict | None = None) -> str:
    reference = entries[0].run
    rows = [Row(e.system, e.label, e.metrics, tests.get(e.label, {}).get("instance", {}), sanity=e.kind == "copy",
                story_p_values=tests.get(e.label, {}).get("story", {})) for e in entries]
    base_metrics = reference.metrics(BASELINE)
    labels, by_label = {e.label: e.label for e in entries}, {e.label: e.metrics for e in entries}  # (the notes' arguments)
    usage_of = {e.label: llm_usage(e.run, e.system) if e.kind == "llm" else None for e in entries}
    usages = {label: usage for label, usage in usage_of.items() if usage is not None}
    bases = sorted({run.base[:7] for run in runs if run.base})
    devices = where_models_ran(runs)
    runs_of = {e.label: e.run.name for e in entries if e.kind == "trained"}
    summaries = {e.label: summary for e in entries if e.kind in ("baseline", "trained") and (summary := e.run.summary(e.system))}
    curves = {e.label: e.run.curves(e.system) for e in entries if e.label in summaries}
    seconds = {e.label: wall for e in entries if (wall := train_seconds(e.run.records).get(e.system)) is not None}
    validating = {e.label: wall for e in entries if (wall := train_seconds(e.run.records, "validate_s").get(e.system)) is not None}
    n_resamples = bootstrap_settings(reference)[0]
    return "\n\n".join([
        f"# Results: {title}",
        f"Task `{reference.params.get('task')}`, {base_metrics['instances']:,} test instances; {len(runs)} runs "
        f"(experiments of commit {', '.join(bases) or 'unknown'}), devices: {', '.join(devices) or 'not recorded'}. "
        "Collected by `python -m storyrewrite.report.collect`; every number below comes from the runs' own outputs.",
        markdown_table(rows, alpha),
        "![Each system's mean per test instance with its bootstrap 95 % interval](results.png)",
        f"Each objective fine-tunes the NLL model; of several runs of an objective (the CPO grid) the one with the "
        f"lowest validation NLL at its best checkpoint is shown (runs: {', '.join(f'{k}: {v}' for k, v in runs_of.items())}). "
        f"One-tailed paired bootstrap against the NLL model of the same run ({n_resamples:,} resamples): \\* p < {alpha} "
        f"resampling instances, † p < {alpha} resampling stories. **Bold**: best of the column, copy baselines excluded. "
        f"{what_m_scores(base_metrics)}",
        *([note] if (note := baseline_note(entries)) else []),
        *([f"No run here trained {', '.join(missing)}: not in these tables."] if (missing := systems_without_a_run(runs)) else []),
        *echo_notes(labels, by_label),
        *empty_notes(labels, by_label),
        *cut_notes(labels, {e.label: (k, e.metrics["instances"]) for e in entries
                            if e.kind != "copy" and (k := cut_count(e.system, e.run.records, usage_of[e.label])) is not None}),
        *head_to_head_markdown(duels or {}, all_columns([e.metrics for e in entries]), alpha, n_resamples),
        *seeds_markdown(runs, alpha),
        "## Following the counterfactual",
        *([markdown_table(rows, alpha, coherence), "Marks as above."] if (coherence := coherence_columns(rows)) else []),
        *coherence_notes(base_metrics, usages),
        "## The copy of the original ending", copy_against_trained(entries), *kept_original(entries),
        "## Training", training_section(summaries, curves, {label: label for label in summaries}, seconds, validating),
        "Curves: `train/<run>/<system>/plots/metrics/` (DVCLive, one TSV per quantity); every stage's device and wall "
        "time: stages.md; each system's per-instance scores: `scores/<run>/<system>.jsonl.gz` (`python -m "
        "storyrewrite.significance.compare A B` tests any two again).",
    ]) + "\n"


def objectives_markdown(entries: list[Entry], tests: dict, alpha: float, duels: dict | None = None) -> str:
    columns = all_columns([e.metrics for e in entries])
    rows = []
    for e in entries:
        if e.kind not in ("baseline", "trained"):
            continue
        test = tests.get(e.label, {})
        chosen = f"{e.run.name}: {e.run.val_nll:.4f}" if e.kind == "trained" else "-"
        rows.append([e.label, chosen, *plain_cells(e.metrics, test.get("instance", {}), alpha, columns)])
    tested = [c for c in columns if c != "hmean"]  # a corpus figure: not resampled
    n_resamples = bootstrap_settings(entries[0].run)[0]
    p_rows = [[e.label] + [" / ".join(p_text(tests[e.label][u][c], n_resamples) if c in tests[e.label][u] else "n/a" for u in UNITS)
                           for c in tested] for e in entries if e.label in tests]
    return "\n\n".join([
        "# Objectives", table(["System", "run: best val NLL", *(column_label(c) for c in columns)], rows),
        f"Of several runs of an objective the one with the lowest validation NLL at its best checkpoint is shown; "
        f"\\* p < {alpha}, one-tailed paired bootstrap over instances against the NLL model of the same run.",
        "## p-values against NLL (instances / stories)", table(["System", *(column_label(c) for c in tested)], p_rows),
        "One-tailed (H1: the system scores higher than NLL); resampling instances / resampling whole stories."
        + bound_note([cell for row in p_rows for cell in row[1:]], n_resamples)
        + (f" {NOT_TESTED}" if any("n/a" in cell for row in p_rows for cell in row) else ""),
        *head_to_head_markdown(duels or {}, columns, alpha, n_resamples),
    ]) + "\n"


def own_p_values(run: Run) -> dict[str, dict[str, float]]:
    """{system: {column: p}} of the run's own significance stage (its `significance.unit`),
    empty where the run has none."""
    return (run.artifact("reports/significance.json", Significance, optional=True) or {}).get("p_values", {})


def bundle_bases(path: Path) -> dict[str, str]:
    """{experiment: the commit DVC files it under} of the git bundle `path` (offline/unpack.sh's
    runs/NAME.<n>/exps.bundle): its refs are DVC's experiment refs, read by git itself (`git
    bundle list-heads`, which needs no repository) and parsed by DVC (ExpRefInfo)."""
    from dvc.repo.experiments.exceptions import InvalidExpRefError
    from dvc.repo.experiments.refs import ExpRefInfo

    try:
        heads = subprocess.run(["git", "bundle", "list-heads", str(path)], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise InputError(f"{path}: not a git bundle git can read ({(getattr(error, 'stderr', '') or str(error)).strip()})") from None
    bases = {}
    for line in heads.splitlines():
        try:
            ref = ExpRefInfo.from_ref(line.split()[-1])
        except InvalidExpRefError:  # not an experiment's ref (a bundle's HEAD, say)
            continue
        if ref.name:  # (DVC's own refs under refs/exps, its queue's stash, name none)
            bases[ref.name] = ref.baseline_sha
    return bases


def in_dvc_markdown(runs: list[Run]) -> str:
    """How to reach the runs as DVC experiments: `dvc metrics diff` between two, `dvc exp show`
    at the commit they derive from, and for runs brought from another machine (a folder with an
    exps.bundle) the `git fetch` that adds them to a clone."""
    bundles = sorted({bundle for run in runs if (bundle := run.root / "exps.bundle").is_file()})
    bases = {name: commit for bundle in bundles for name, commit in bundle_bases(bundle).items()}
    commits = [c for c in dict.fromkeys(bases.get(run.name) or run.base or "" for run in runs) if c]  # in the runs' order
    lines = ["Each run is the DVC experiment of its name."]
    if bundles:
        fetch = "; ".join(f"`git fetch {bundle.as_posix()} 'refs/exps/*:refs/exps/*'`" for bundle in bundles)
        lines.append(f"The runs kept with their experiments (an exps.bundle beside them) reach a clone of this repository with {fetch}.")
    if commits:
        short = [commit[:7] for commit in commits]
        lines.append(f"`dvc exp show --only-changed {' '.join(f'--rev {c}' for c in short)}` lists them with the params "
                     f"and metrics in which they differ (they derive from commit{'s' if len(short) > 1 else ''} {', '.join(short)}).")
    lines.append(f"`dvc metrics diff {runs[0].name} {runs[1].name}` compares two." if len(runs) > 1
                 else f"`dvc metrics diff {runs[0].name}` compares it with the workspace.")
    return " ".join(lines)


def param_cell(run: Run, key: str) -> str:
    """A param as params.yaml and `-S` spell it (`null`, `true`, `1.0e-05`), `-` where the run's
    objective does not read its section (cpo.beta in a DTO run), empty where the run has no such key."""
    if not reads_section(run.params.get("objective"), key.split(".")[0]):
        return "-"
    return yaml_scalar(run.flat_params[key]) if key in run.flat_params else ""


def experiments_markdown(runs: list[Run], alpha: float) -> str:
    params = frame(runs).filter(like="params.", axis=1).map(json.dumps)
    varying = [c.removeprefix("params.") for c in params.columns if params[c].nunique() > 1 and c != "params.objective"]
    # A column of no run's own setting (`-` or absent in every row: rl.early_stop where no run is
    # RLOO's and older runs lack the key) tells nothing.
    varying = [key for key in varying if any(param_cell(run, key) not in ("-", "") for run in runs)]
    columns = all_columns([run.metrics(FINETUNED) or {} for run in runs])
    header = ["Experiment", "objective", *varying, *(column_label(c) for c in columns), "best val NLL", "NLL BARTScore (M)"]
    rows = [[run.name, str(run.params.get("objective", "")), *(param_cell(run, k) for k in varying),
             *plain_cells(run.metrics(FINETUNED) or {}, own_p_values(run).get(FINETUNED, {}), alpha, columns),
             "n/a" if run.val_nll is None else f"{run.val_nll:.4f}",
             "n/a" if (base := (run.metrics(BASELINE) or {}).get("bartscore", {}).get("predictive")) is None
             else number("bartscore/predictive", base)] for run in runs]
    return "\n\n".join([
        "# Experiments", table(header, rows),
        f"\\* p < {alpha}, the run's own significance stage (`finetuned` against its NLL model, its `significance.unit`). "
        "Rows with n/a have not been run to the score stage."
        + (" -: a setting of another objective, which the run's does not read." if any("-" in row[2:2 + len(varying)] for row in rows) else "")
        + (" Empty: the run's params.yaml has no such setting (its commit predates it)."
           if any("" in row[2:2 + len(varying)] for row in rows) else ""),
        "## In DVC", in_dvc_markdown(runs),
    ]) + "\n"


def models_of(record: dict) -> list[tuple[str, dict]]:
    """(what, where) of each model the stage of a record ran: its own, where the record names its
    dtype (a stage that runs none, significance or a remote LLM backend's, names none), and a RAG
    mode's retrieval embedder, which may have run elsewhere (its device and name, the CPU's
    features where the record holds them; records before its name was kept give its device only)."""
    found = [(record["stage"], record)] if record.get("dtype") else []
    if "embedder_device" in record:
        device = record["embedder_device"]
        cpu = {k: record[k] for k in ("cpu_capability", "cpu_bf16") if k in record} if device == "cpu" else {}
        found.append((f"{record['stage']}'s embedder", {"device": device, "device_name": record.get("embedder_device_name", device),
                                                        **cpu}))
    return found


def where_models_ran(runs: list[Run]) -> list[str]:
    """The devices the runs' models ran on (records.where_ran of models_of each record; every
    record's where none did). A stage that runs no model (significance) names its machine without
    the CPU's features, which would list one machine twice."""
    return sorted({where_ran(where) for run in runs for r in run.records for _, where in models_of(r)}
                  or {where_ran(r) for run in runs for r in run.records})


def stages_markdown(runs: list[Run]) -> str:
    """Every stage that ran, once: a stage DVC restored from its run cache in a later experiment
    carries the record of the run that computed it."""
    unique: dict[str, dict] = {}
    for run in runs:
        for record in run.records:
            # No experiment name: DVC restored the output of a plain `dvc repro` from its run cache.
            ran_in = record.get("experiment") or "`dvc repro` (no experiment)"
            unique.setdefault(json.dumps(record, sort_keys=True), {**record, "ran_in": ran_in, "used_by": []})["used_by"].append(run.name)
    records = sorted(unique.values(), key=lambda r: (r.get("started_at", ""), r["stage"]))
    # A model that ran on the CPU in a run that had a GPU elsewhere.
    on_cpu = sorted({f"{what} ({r['ran_in']})" for r in records for what, where in models_of(r) if where["device"] == "cpu"})
    gpu = any(r["device"].startswith("cuda") for r in records)
    rows = [[*row, r["ran_in"], f"{len(r['used_by'])} run{'s' if len(r['used_by']) > 1 else ''}"]
            for row, r in zip(stage_rows(records), records, strict=True)]
    return "\n\n".join([
        "# Stages", table([*STAGE_HEADER, "ran in", "used by"], rows),
        f"{len(records)} stage runs, {sum(r['wall_s'] for r in records) / 60:.1f} min of wall time in all (from the start of each stage's work to its "
        "last output; model loading included, Python's imports not). A stage DVC restored from its run cache is listed "
        "once, with the experiment that ran it.",
        *([f"**Model stages that ran on the CPU although a GPU was used:** {', '.join(on_cpu)}."] if gpu and on_cpu else []),
    ]) + "\n"


def write_bundle(runs: list[Run], out: Path, title: str, alpha: float = 0.05) -> None:
    entries = comparison(runs)
    reference = entries[0].run  # the NLL model's run: its bootstrap settings serve every test and the figure
    n_resamples, seed = bootstrap_settings(reference)
    tests = p_values(entries, reference)
    duels = head_to_head(entries, reference, runs)
    with atomic_dir(out) as staging:
        write_text_atomic(staging / "results.md", results_markdown(entries, tests, runs, title, alpha, duels))
        write_text_atomic(staging / "objectives.md", objectives_markdown(entries, tests, alpha, duels))
        write_text_atomic(staging / "experiments.md", experiments_markdown(runs, alpha))
        write_text_atomic(staging / "stages.md", stages_markdown(runs))
        results_figure(staging / "results.png", {e.label: e.run.scores(e.system) for e in entries}, {e.label: e.label for e in entries},
                       entries[0].label, [e.label for e in entries if e.kind == "copy"],
                       {e.label: e.metrics.get("prompt_echo", 0.0) for e in entries},
                       f"{title}: {reference.params.get('task')}, {reference.metrics(BASELINE)['instances']:,} test instances",
                       seed=seed)
        write_json_atomic(staging / "significance.json", {
            "_baseline": "NLL model of each system's own run", "_units": list(UNITS),
            "_n_resamples": n_resamples,
            **{label: {"run": next(e.run.name for e in entries if e.label == label), **by_unit,
                       **({"head_to_head": duels[label]} if label in duels else {})} for label, by_unit in tests.items()},
        })
        for e in entries:  # each system's per-instance scores (gzip: the same bytes each time), to test any two again
            data = e.run.text(e.run.scores_path(e.system)).encode("utf-8")  # read once already, for the tests above
            write_bytes_atomic(staging / "scores" / e.run.name / f"{e.system}.jsonl.gz", gzip.compress(data, mtime=0))
        for run in runs:
            write_text_atomic(staging / "params" / f"{run.name}.yaml", run.text("params.yaml"))
            for path, digest in run.files.items():  # the figures too, as 256-colour PNGs (compact_png)
                parts = Path(path).parts
                if parts[:2] == ("reports", "train"):
                    data = read_blob(run.root, digest)
                    write_bytes_atomic(staging / "train" / run.name / Path(*parts[2:]), compact_png(data) if path.endswith(".png") else data)
                elif parts[0] == "reports" and parts[-2] in ("stages", "metrics"):  # reports/stages/, [sanity/]metrics/
                    write_bytes_atomic(staging / parts[-2] / run.name / parts[-1], read_blob(run.root, digest))


def check_out(out: Path) -> None:
    """Refuse an --out that holds what no collect wrote: it is replaced whole, so `--out reports`
    (or `.`) would take the pipeline's reports (or the repository) with it. A folder that a collect
    wrote holds its experiments.md; an empty or missing one is new."""
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: a file; --out is the tables' folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "experiments.md").is_file():
        raise InputError(f"--out {out}: a folder of other files (no experiments.md, which a collect writes), and --out is "
                         "replaced whole; name a new folder, e.g. reports/NAME")


# A folder under reports/ that dvc.yaml names (a stage's output is in it): the pipeline's own.
PIPELINE_FOLDER = re.compile(r"\breports/([A-Za-z0-9_.-]+)/")


def check_name(name: str, root: Path = Path(".")) -> None:
    """Refuse a comparison's NAME (scripts/comparison.sh, bench/comparison.py, offline/job.sh
    compare) before anything runs, not at the collect after the last experiment: runs/NAME and
    reports/NAME must be its own. Letters, digits, '_' and '-' (no dot: runs/NAME.<n> hold other
    machines' runs of it); not a folder of reports/ that dvc.yaml's stages write; not a folder of
    other files (check_out: reports/bench, reports/tests)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name):
        raise InputError(f"NAME {name!r}: letters, digits, '_' and '-' only, a letter or digit first (runs/NAME and "
                         "reports/NAME; runs/NAME.<n> hold other machines' runs of it)")
    dvc_yaml = root / "dvc.yaml"
    if dvc_yaml.is_file() and name in PIPELINE_FOLDER.findall(dvc_yaml.read_text(encoding="utf-8")):
        raise InputError(f"NAME {name}: reports/{name} is the pipeline's own (dvc.yaml's stages write it); choose another name")
    try:
        check_out(root / "reports" / name)
    except InputError:
        raise InputError(f"NAME {name}: reports/{name} holds files that no collect wrote (it has no experiments.md), and the "
                         "collect replaces it whole; choose another name") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m storyrewrite.report.collect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="*", help="folders written by storyrewrite.report.gather")
    parser.add_argument("--out", type=Path, help="the tables' folder, replaced whole: a new one, or one a collect wrote")
    parser.add_argument("--title", default="gathered experiments", help="the results' title, e.g. the profile and device")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--check-name", metavar="NAME", help="instead: check a comparison's NAME for runs/NAME and "
                                                             "reports/NAME here, and exit")
    args = parser.parse_args(argv)
    if args.check_name is not None:
        check_name(args.check_name)
        return
    if not args.runs or args.out is None:
        parser.error("give the runs' folders and --out (or --check-name NAME)")
    if not 0 < args.alpha < 1:
        raise InputError(f"--alpha must lie in (0, 1), got {args.alpha}")
    check_out(args.out)
    runs = load_runs(args.runs)
    write_bundle(runs, args.out, args.title, args.alpha)
    print((args.out / "results.md").read_text(encoding="utf-8").split("## Training")[0])


if __name__ == "__main__":
    from storyrewrite.io import run_cli

    run_cli(main)
