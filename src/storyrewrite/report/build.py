"""Assemble reports/results.md (and the LaTeX table) from what the pipeline wrote."""
from __future__ import annotations

import random
from pathlib import Path

from storyrewrite import artifacts
from storyrewrite.metrics.artifacts import Significance, SystemMetrics, Validity
from storyrewrite.io import InputError, find_file, read_jsonl
from storyrewrite.params import ReportConfig
from storyrewrite.records import read_records
from storyrewrite.report.stages import stages_table
from storyrewrite.curves import read_curves
from storyrewrite.report.examples import example_block
from storyrewrite.report.figure import ECHO_LIMIT, results_figure, training_figure, training_panels
from storyrewrite.markdown import table
from storyrewrite.metrics.columns import keeps_original
from storyrewrite.report.tables import Row, coherence_columns, latex_table, latex_text, markdown_table
from storyrewrite.significance.validity import markdown as validity_markdown
from storyrewrite.systems import COPY_BASELINES, TRAIN_STAGES, of_the_run

UNIT_PLURALS = {"instance": "instances", "story": "stories"}  # `significance.unit`: what the bootstrap resamples


def read_summaries(systems: list[str], train_logs: Path) -> dict[str, dict]:
    """system -> its training summary, for the systems that were trained."""
    return {s: artifacts.read(path, artifacts.TrainingSummary).model_dump() for s in systems
            if (path := train_logs / s / "metrics.json").exists()}


def train_seconds(records: list[dict], key: str = "train_s") -> dict[str, float]:
    """system -> its training's wall time (`key` validate_s: the part of it spent validating), from
    its train stage's record."""
    by_stage = {record["stage"]: record for record in records}
    return {system: by_stage[stage][key] for system, stage in TRAIN_STAGES.items()
            if stage in by_stage and by_stage[stage].get(key) is not None}


def echo_notes(labels: dict[str, str], metrics: dict[str, dict]) -> list[str]:
    """In plain words, the systems whose predictions are mostly not endings (storyrewrite.metrics.echo)."""
    echoing = [f"{labels[s]} ({100 * m['prompt_echo']:.0f} %)" for s, m in metrics.items() if m["prompt_echo"] > ECHO_LIMIT]
    if not echoing:
        return []
    return [f"**Mostly not endings:** the predictions of {'; '.join(echoing)} echo the prompt (they hold a field label "
            "such as `Premise:` or repeat the premise word for word), and the tables score them as if they were "
            "rewrites. Their rows say little about what these models can do."]


def empty_notes(labels: dict[str, str], metrics: dict[str, dict]) -> list[str]:
    """In plain words, the systems that wrote empty endings, and how many: the tables score an
    empty ending like any other (ROUGE-L and SacreBLEU 0), so a row of them reads as a weak model."""
    empty = [f"{labels[s]} ({m['empty_predictions']:,} of {m['instances']:,})" for s, m in metrics.items() if m["empty_predictions"]]
    if not empty:
        return []
    return [f"**Empty endings:** {'; '.join(empty)}. These predictions are empty or whitespace, and the tables score "
            "them as empty rewrites (ROUGE-L and SacreBLEU 0)."]


def cut_count(system: str, records: list[dict], usage: dict | None) -> int | None:
    """How many of a system's endings stopped at the token limit before the model ended them:
    from an LLM baseline's usage file, else from the system's generate stage record (None: not
    counted, as in runs made before the count was kept)."""
    if usage is not None:
        return usage.get("cut_at_limit")
    return next((r.get("cut_at_limit") for r in records if r["stage"] == f"generate-{system}"), None)


def cut_notes(labels: dict[str, str], cut: dict[str, tuple[int, int]]) -> list[str]:
    """In plain words, the systems with endings cut at the token limit (system -> (cut, instances)):
    a cut ending loses its last words, and the overlap metrics score it as written."""
    shown = [f"{labels[s]} ({k:,} of {n:,})" for s, (k, n) in cut.items() if k]
    if not shown:
        return []
    return [f"**Cut at the token limit:** {'; '.join(shown)}. These endings stopped at `generate.max_new_tokens` "
            "(trained systems) or `llm.max_new_tokens` (LLM baselines) before the model ended them, and the tables "
            "score them as cut."]


def llm_label(usage: dict) -> str:
    """An LLM baseline's name in reports, from its stage's usage file: model, mode, backend."""
    return f"{usage['model']} {usage['mode_label']} ({usage['backend']})"


def what_m_scores(metrics: dict) -> str:
    """The caption's sentence on what M scores against, for the task of a system's `metrics`:
    the counterfactual form where the task has an original ending (TimeTravel), n/a where not (ART)."""
    if metrics.get("counterfactual_metrics") == "available":
        return ("M(Ŷ, Y_EE) scores the prediction against the edited ending; M + Δ_M = 2·M(Ŷ, Y_EE) − M(Ŷ, X_OE) "
                "rewards moving away from the original ending as well.")
    return ("M(Ŷ, Y) scores the prediction against the reference ending. The task has no original ending, so "
            "there is no counterfactual form (M + Δ_M).")


def read_llm_usage(system: str, llm_usage: Path) -> dict | None:
    """An LLM baseline's usage file (mode, backend, model, cost) in `llm_usage`; None for another system."""
    path = llm_usage / f"{system.removeprefix('llm_')}.json"
    return artifacts.read(path, artifacts.LLMUsage).model_dump() if system.startswith("llm_") and path.exists() else None


def system_label(system: str, summary: dict | None, usage: dict | None) -> str:
    """How the report names a system: from what its run wrote (the training summary or the LLM
    stage's usage file, read_llm_usage, whose labels come from the objective and mode registries)."""
    if system in COPY_BASELINES:
        return COPY_BASELINES[system][1]
    if usage is not None:
        return llm_label(usage)
    if summary is not None:
        if system == "nll":
            return summary["label"]
        return f"{summary['label']}, continued (+{summary['global_step']} steps)" if summary["objective"] == "nll" \
            else f"{summary['label']} (from NLL, +{summary['global_step']} steps)"
    return system


def _value(number: float) -> str:
    return f"{number:.4g}"


def training_section(summaries: dict[str, dict], curves: dict[str, dict[str, list[dict]]], labels: dict[str, str],
                     seconds: dict[str, float], validating: dict[str, float] | None = None) -> str:
    """A table of the trained systems from their runs' summaries and curves (system -> name ->
    rows, storyrewrite.curves): steps, wall time (with the part of it spent validating, where
    `validating` has it), the step of the exported (best-on-validation)
    checkpoint, the final training loss, the validation loss of the starting weights and of the
    exported checkpoint (did training improve its own objective on validation?), and the first →
    last values of the objective's main diagnostics: on validation where it logs them (the same
    instances each time, from the starting weights at step 0 with `validate_at_start`), else from
    training (one batch a step: noisy at small batch sizes)."""
    rows = []
    for system, info in summaries.items():
        logged = {name: values for name, values in curves.get(system, {}).items() if values}
        shown = []
        for name in info.get("main_diagnostics", []):
            for key, where in ((f"val_{name}", " (val)"), (name, "")):
                if key in logged:
                    shown.append(f"{name}{where} {_value(logged[key][0]['value'])} → {_value(logged[key][-1]['value'])}")
                    break
        train = _value(logged["train_loss"][-1]["value"]) if "train_loss" in logged else "n/a"
        start, best = info.get("start_val_loss"), info.get("best_val_loss")
        val = " → ".join(_value(v) if v is not None else "n/a" for v in (start, best))
        wall = f"{seconds[system]:.0f} s" if system in seconds else "n/a"
        if system in seconds and system in (validating or {}):
            wall += f" ({validating[system]:.0f} s validating)"
        rows.append([labels[system], info["global_step"], wall, info.get("best_step") or "n/a", train, val,
                     "; ".join(shown) or "-"])
    return table(["System", "steps", "wall time", "best step", "final train loss", "val loss, start → best",
                  "diagnostics, first → last"], rows)


def judge_wrote(usages: dict[str, dict], judge: str | None) -> list[str]:
    """The LLM baselines (label -> usage file) whose endings the CF-PMI judge itself wrote: the
    local backend runs the generator's pretrained weights, the same spec as the judge's."""
    return [label for label, usage in usages.items() if usage["backend"] == "local" and usage["model"] == judge]


def coherence_notes(metrics: dict, llm_usages: dict[str, dict] | None = None) -> list[str]:
    """What the "Following the counterfactual" columns measure, with which models, and what they
    leave out, from a system's metrics (the same evaluators scored every system); of the LLM
    baselines (label -> usage file), those the judge wrote itself are named."""
    if metrics.get("coherence_metrics") != "available":
        why = metrics.get("coherence_metrics") or "not computed"  # under the section's heading: why not, alone
        return [f"{why[0].upper()}{why[1:]}."]
    models = metrics["evaluators"]
    notes = []
    if models.get("judge"):
        notes.append(f"CF-PMI = M_J(Ŷ | X_P ⊕ X_CE) − M_J(Ŷ | X_P ⊕ X_IE), the judge J = `{models['judge']}`: positive when "
                     "the ending fits the counterfactual story better than the original one; follows X_CE: the share of "
                     "instances with CF-PMI > 0.")
        if models.get("judge_is_scorer"):
            notes.append("The judge is the training scorer: DTO optimised this model's likelihoods, so its CF-PMI may "
                         "favour the DTO systems for that reason alone (the paper profile judges with another model).")
        if written := judge_wrote(llm_usages or {}, models["judge"]):
            notes.append(f"The judge wrote the endings of {'; '.join(written)} itself, after reading X_CE in the "
                         "prompt, so its CF-PMI may favour those rows for that reason alone.")
    if models.get("embedder"):
        notes.append(f"Drift (Qin et al. 2019): cos(φ(X_P ⊕ X_CE ⊕ Ŷ) − φ(X_P ⊕ X_IE ⊕ X_OE), φ(X_P ⊕ X_CE ⊕ Y_EE) − "
                     f"φ(X_P ⊕ X_IE ⊕ X_OE)), φ = `{models['embedder']}`: does the ending move the story the way the "
                     "reference rewrite does?")
    if models.get("nli"):
        notes.append(f"EntScore: P(entailment | X_P ⊕ X_CE, Ŷ) from `{models['nli']}`; HMean: the harmonic mean of corpus "
                     "SacreBLEU/100 and mean EntScore (a corpus figure, not resampled).")
    else:
        notes.append("EntScore and HMean: not computed (`models.nli` is null; no NLI model ships offline, the paper "
                     "profile names FacebookAI/roberta-large-mnli).")
    return notes


def kept_original_section(shares: dict[str, float | None]) -> list[str]:
    """{label: the share (%) of its endings that keep X_OE word for word, None where not known}
    (storyrewrite.metrics.columns.keeps_original) as a table and what it means; nothing where no
    share is known (a task without an original ending)."""
    rows = [[label, f"{share:.1f}"] for label, share in shares.items() if share is not None]
    if not rows:
        return []
    return [table(["System", "endings that keep X_OE word for word (%)"], rows),
            "An ending keeps X_OE where its ROUGE-L against X_OE is 100: the same words in the same order, case, "
            "punctuation and word endings aside. The copy of the reference shows how often the reference rewrite "
            "itself leaves X_OE as it was. The more often a system keeps X_OE, the closer its overlap columns come to "
            "those of the copy of X_OE."]


def build_report(systems: list[str], metrics_dirs: list[Path], significance_path: Path, prediction_dirs: list[Path],
                 instances: list[dict], train_logs: Path, llm_usage: Path, stage_records: Path, config: ReportConfig,
                 seed: int, task: str, baseline: str, alpha: float, validity_path: Path | None = None,
                 scores_dirs: list[Path] | None = None, figure: Path | None = None) -> tuple[str, str]:
    """(results.md, results.tex) for exactly `systems` (the run's, see storyrewrite.systems).
    With `scores_dirs` and `figure`: the results figure there (storyrewrite.report.figure), shown
    in results.md, and each trained system's main curves in `train_logs/<system>.png`."""
    if baseline not in systems:
        raise InputError(f"params: `significance.baseline` = {baseline!r} is not a system of this run; systems: {', '.join(systems)}",
                         key="significance.baseline")
    metrics = {s: artifacts.read(find_file(s, metrics_dirs, ".json"), SystemMetrics).model_dump() for s in systems}
    significance = artifacts.read(significance_path, Significance)
    records = [r for r in read_records(stage_records) if of_the_run(r["stage"], systems)]
    # The baseline first, then the trained systems in the run's order, the LLM modes by name, the copies.
    rest = [s for s in systems if s != baseline]
    order = [baseline, *(s for s in rest if not s.startswith("llm_") and s not in COPY_BASELINES),
             *sorted(s for s in rest if s.startswith("llm_")),
             *(s for s in COPY_BASELINES if s in rest)]
    summaries = read_summaries(order, train_logs)
    curves = {s: read_curves(train_logs / s) for s in summaries}
    usage_of = {s: read_llm_usage(s, llm_usage) for s in order}  # (None for a system that is no LLM mode)
    labels = {s: system_label(s, summaries.get(s), usage_of[s]) for s in order}
    usages = {labels[s]: usage for s, usage in usage_of.items() if usage is not None}
    rows = [Row(s, labels[s], metrics[s], significance.p_values.get(s, {}), sanity=s in COPY_BASELINES) for s in order]

    n = metrics[baseline]["instances"]
    tested = f"{n:,} test instance{'' if n == 1 else 's'}"
    notes = [
        f"Task `{task}`, {tested}. {what_m_scores(metrics[baseline])}",
        f"\\* one-tailed paired bootstrap against {labels[baseline]} ({significance.n_resamples:,} resamples "
        f"over {UNIT_PLURALS[significance.unit]}), p < {alpha}. **Bold**: best value of the column among the systems (copy baselines excluded).",
        *echo_notes(labels, metrics),
        *empty_notes(labels, metrics),
        *cut_notes(labels, {s: (k, metrics[s]["instances"]) for s in order
                            if (k := cut_count(s, records, usage_of[s])) is not None}),
    ]

    predictions = {system: {row["id"]: row["prediction"] for _, row in read_jsonl(find_file(system, prediction_dirs, ".jsonl"))}
                   for system in order}
    # One instance from each of a few stories drawn with the seed (a story's endings share its input).
    first_of_story = list({row["story_id"]: row for row in reversed(instances)}.values())[::-1]
    shown = random.Random(seed).sample(first_of_story, min(config.examples, len(first_of_story)))
    examples = [example_block(inst, {s: p[inst["id"]] for s, p in predictions.items() if s not in COPY_BASELINES}, labels)
                for inst in shown]

    coherence = coherence_columns(rows)
    following = [markdown_table(rows, alpha, coherence)] if coherence else []
    validity = artifacts.read(validity_path, Validity) if validity_path is not None else Validity()
    validity_section = ["## Metric validity"] + (
        ["Does each metric score the reference rewrite Y_EE above the original ending copied unchanged (X_OE), on "
         "this run's test instances? (`reports/metric_validity.md`: the same on the whole test set.)",
         validity_markdown(validity.model_dump())] if validity.metrics else [f"Not available: {validity.not_available or 'not measured'}."])

    shown_figure, kept = [], []
    if figure is not None and scores_dirs:
        scores = {s: [row for _, row in read_jsonl(find_file(s, scores_dirs, ".jsonl"))] for s in order}
        if shares := kept_original_section({labels[s]: keeps_original(scores[s]) for s in order if s != "copy_original"}):
            kept = ["## The copy of the original ending", *shares]
        results_figure(figure, scores, labels, baseline, [s for s in COPY_BASELINES if s in systems],
                       {s: metrics[s].get("prompt_echo", 0.0) for s in order}, f"{task}, {tested}",
                       seed=seed)
        shown_figure = [f"![Each system's mean per test instance with its bootstrap 95 % interval]({figure.name})"]
        for system, summary in summaries.items():
            training_figure(train_logs / f"{system}.png", curves[system], training_panels(summary.get("main_diagnostics", [])),
                            f"{labels[system]}: training (line) and validation (points)")

    markdown = "\n\n".join([
        "# Results", markdown_table(rows, alpha), *notes, *shown_figure,
        "## Following the counterfactual", *following,
        *coherence_notes(metrics[baseline], usages),
        *([f"\\* one-tailed paired bootstrap against {labels[baseline]}, p < {alpha}, as above."] if following else []),
        *kept,
        *validity_section,
        "## Training", training_section(summaries, curves, labels, train_seconds(records),
                                         train_seconds(records, "validate_s")),
        *([f"Main curves: {', '.join(f'`{train_logs.name}/{s}.png`' for s in summaries)}."] if shown_figure else []),
        "Every logged quantity over the steps: `dvc plots show reports/train/<system>/plots/metrics` "
        "(`dvc plots diff <experiment>` to compare runs); docs/training.md says what each curve tells.",
        "## Stages", stages_table(records),
        "Where each model stage ran and what it cost (from `reports/stages/<stage>.json`; wall time from the start of its work to its last output, after Python's imports; peak memory of the whole process).",
        "## Examples", *examples,
    ]) + "\n"
    caption = f"$^{{*}}$: one-tailed paired bootstrap against {latex_text(labels[baseline])}, $p < {alpha}$."
    latex = latex_table(rows, alpha, caption=f"Results on {latex_text(task)} ({tested}). {caption}") + "\n"
    if coherence:
        latex += "\n" + latex_table(rows, alpha, f"Following the counterfactual on {latex_text(task)} ({tested}). {caption}",
                                     coherence) + "\n"
    return markdown, latex
