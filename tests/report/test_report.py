import json

from helpers import system_metrics, training_summary
from storyrewrite.report.examples import word_diff
from storyrewrite.report.tables import Row, latex_table, latex_text, markdown_table


def test_word_diff_marks_removed_and_added_words():
    assert word_diff("She loved the gloves.", "She hated the gloves.") == "She ~~loved~~ **hated** the gloves."
    assert word_diff("A b c.", "A b c.") == "(no change)"
    assert word_diff("A b", "A b c") == "A b **c**"


def _rows():
    nll = Row("nll", "NLL", {"bartscore": {"predictive": -1.710, "counterfactual": -2.885}, "rougeL": {"predictive": 60.9, "counterfactual": 40.0},
                             "sacrebleu": {"predictive": 34.5, "counterfactual": 20.0}}, {})
    dto = Row("finetuned", "DTO-Score", {"bartscore": {"predictive": -1.683, "counterfactual": -2.990}, "rougeL": {"predictive": 61.5, "counterfactual": 39.0},
                                         "sacrebleu": {"predictive": 35.5, "counterfactual": 19.0}},
              {"bartscore/predictive": 0.01, "rougeL/predictive": 0.2, "sacrebleu/predictive": 0.05})  # p = alpha: no mark
    copy = Row("copy_reference", "Copy", {"bartscore": {"predictive": -0.5}, "rougeL": {"predictive": 100.0}, "sacrebleu": {"predictive": 100.0}}, {}, sanity=True)
    return [nll, dto, copy]


def test_markdown_table_bold_best_and_significance_marks():
    lines = markdown_table(_rows(), alpha=0.05).splitlines()
    assert lines[2] == "| NLL | -1.710 | 60.9 | 34.5 | **-2.885** | **40.0** | **20.0** |"
    assert lines[3] == "| DTO-Score | **-1.683**\\* | **61.5** | **35.5** | -2.990 | 39.0 | 19.0 |"
    # The copy baseline is never bold; its missing counterfactual values say n/a, not 0.
    assert lines[4] == "| Copy | -0.500 | 100.0 | 100.0 | n/a | n/a | n/a |"
    # Nor where it ties with the best real system; a mark from the story-level test is its own (†).
    rows = _rows()
    rows[1].story_p_values = {"bartscore/predictive": 0.02, "rougeL/predictive": 0.01}
    rows[2].metrics["rougeL"]["predictive"] = 61.5
    lines = markdown_table(rows, alpha=0.05).splitlines()
    assert lines[3] == "| DTO-Score | **-1.683**\\*† | **61.5**† | **35.5** | -2.990 | 39.0 | 19.0 |"
    assert lines[4] == "| Copy | -0.500 | 61.5 | 100.0 | n/a | n/a | n/a |"
    latex = latex_table(rows, alpha=0.05, caption="c")
    assert "DTO-Score & \\textbf{-1.683}$^{*}$$^{\\dagger}$ & \\textbf{61.5}$^{\\dagger}$ & \\textbf{35.5} &" in latex
    assert "Copy & -0.500 & 61.5 & 100.0 &" in latex


def test_latex_table():
    latex = latex_table(_rows(), alpha=0.05, caption="c")
    assert "DTO-Score & \\textbf{-1.683}$^{*}$ & \\textbf{61.5} & \\textbf{35.5} & -2.990 & 39.0 & 19.0 \\\\" in latex
    assert latex.startswith("\\begin{table}") and latex.rstrip().endswith("\\end{table}")


def test_latex_table_escapes_labels_and_keeps_the_headers_math():
    """A label holds what a model's spec holds (a local directory: `~`, `_`, `#`); LaTeX reads
    each of those as a command. Escaped as LaTeX's own commands write them, by hand here."""
    rows = _rows()
    rows[1] = Row("finetuned", "~/my_models/bart#2 & 50% {x}", rows[1].metrics, rows[1].p_values)
    latex = latex_table(rows, alpha=0.05, caption="c")
    assert ("\\textasciitilde /my\\_models/bart\\#2 \\& 50\\% \\{x\\} & \\textbf{-1.683}$^{*}$ & \\textbf{61.5} & \\textbf{35.5} "
            "& -2.990 & 39.0 & 19.0 \\\\") in latex
    assert "Predictive $M(\\hat{Y}, Y_{EE})$" in latex and "Counterfactual $M + \\Delta_M$" in latex  # math as written
    # The caption's names (pandas escapes no caption), each character on its own, by hand.
    assert latex_text("~/my_models/bart#2 & 50% {x} $^\\") == (
        "\\textasciitilde{}/my\\_models/bart\\#2 \\& 50\\% \\{x\\} \\$\\textasciicircum{}\\textbackslash{}")
    plain = latex_table(rows, alpha=0.05, caption="c", columns=["rougeL/counterfactual", "cf_follow"])
    assert "System & ROUGE-L (M + Δ\\_M) & follows X\\_CE (\\%) \\\\" in plain


def _metrics(bart, **extra):
    return system_metrics(bart, 50.0, 30.0, **extra)


def test_the_report_holds_exactly_the_systems_of_the_run(tmp_path):
    import pytest

    from storyrewrite.io import InputError
    from storyrewrite.params import ReportConfig
    from storyrewrite.report.build import build_report

    instance = {"id": "s:0", "story_id": "s", "premise": "p", "initial": "i", "counterfactual": "c",
                "original_ending": "o", "target": "t"}
    for directory in ("metrics", "predictions", "train/nll", "llm"):
        (tmp_path / directory).mkdir(parents=True)
    # llm_old: left behind by a mode no longer in llm.modes; it must not appear as if current.
    for system, bart in (("nll", -2.0), ("finetuned", -1.5), ("llm_old", -1.0)):
        (tmp_path / "metrics" / f"{system}.json").write_text(json.dumps(_metrics(bart)))
        (tmp_path / "predictions" / f"{system}.jsonl").write_text(json.dumps({"id": "s:0", "prediction": system}) + "\n")
    (tmp_path / "train" / "nll" / "metrics.json").write_text(json.dumps(training_summary()))
    (tmp_path / "significance.json").write_text(json.dumps({"baseline": "nll", "n_resamples": 10, "unit": "instance",
                                                            "p_values": {"finetuned": {"bartscore/predictive": 0.01}}}))
    (tmp_path / "stages").mkdir()
    for stage in ("generate-nll", "llm-old", "score_llm-old"):  # llm_old's records are left behind too
        (tmp_path / "stages" / f"{stage}.json").write_text(json.dumps(
            {"stage": stage, "device": "cuda:0", "device_name": "H100", "dtype": "bfloat16", "wall_s": 20.0,
             "items": 5000, "unit": "predictions", "items_per_s": 250.0, "peak_rss_gb": 3.0, "peak_cuda_gb": 9.5}))

    def report(systems):
        return build_report(systems, [tmp_path / "metrics"], tmp_path / "significance.json", [tmp_path / "predictions"],
                            [instance], tmp_path / "train", tmp_path / "llm", tmp_path / "stages", ReportConfig(examples=1), 0,
                            "timetravel", "nll", 0.05)

    markdown, _ = report(["nll", "finetuned"])
    table = [line for line in markdown.split("## Training")[0].splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in table[1:]] == ["| NLL", "| finetuned"]
    assert "llm_old" not in markdown and "llm-old" not in markdown
    # Another baseline comes first; the trained systems keep the run's order, above the LLM rows.
    for system in ("llm_zero_shot", "llm_fixed"):
        (tmp_path / "metrics" / f"{system}.json").write_text(json.dumps(_metrics(-1.2)))
        (tmp_path / "predictions" / f"{system}.jsonl").write_text(json.dumps({"id": "s:0", "prediction": system}) + "\n")
    other = build_report(["nll", "finetuned", "llm_zero_shot", "llm_fixed"], [tmp_path / "metrics"], tmp_path / "significance.json",
                         [tmp_path / "predictions"], [instance], tmp_path / "train", tmp_path / "llm", tmp_path / "stages",
                         ReportConfig(examples=1), 0, "timetravel", "finetuned", 0.05)[0]
    table = [line for line in other.split("## Training")[0].splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in table[1:]] == ["| finetuned", "| NLL", "| llm_fixed", "| llm_zero_shot"]
    (tmp_path / "metrics" / "copy_original.json").write_text(json.dumps(_metrics(-0.5)))
    (tmp_path / "predictions" / "copy_original.jsonl").write_text(json.dumps({"id": "s:0", "prediction": "o"}) + "\n")
    copied = build_report(["nll", "copy_original"], [tmp_path / "metrics"], tmp_path / "significance.json", [tmp_path / "predictions"],
                          [instance], tmp_path / "train", tmp_path / "llm", tmp_path / "stages", ReportConfig(examples=1), 0,
                          "timetravel", "copy_original", 0.05)[0]
    table = [line for line in copied.split("## Training")[0].splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in table[1:]] == ["| Copy of the original ending", "| NLL"]  # listed once
    assert "| generate-nll | cuda:0 (H100) | bfloat16 | 20 s | 5,000 predictions | 250 predictions/s | RSS 3.0 GiB, CUDA 9.5 GiB |" \
        in markdown.split("## Stages")[1]
    assert "Task `timetravel`, 1 test instance. M(Ŷ, Y_EE) scores the prediction against the edited ending;" in markdown
    assert "Empty endings" not in markdown
    assert "\\* one-tailed paired bootstrap against NLL (10 resamples over instances), p < 0.05." in markdown
    significance = json.loads((tmp_path / "significance.json").read_text())
    (tmp_path / "significance.json").write_text(json.dumps({**significance, "unit": "story"}))
    assert "(10 resamples over stories), p < 0.05." in report(["nll", "finetuned"])[0]
    ablated = build_report(["nll", "finetuned"], [tmp_path / "metrics"], tmp_path / "significance.json", [tmp_path / "predictions"],
                           [instance], tmp_path / "train", tmp_path / "llm", tmp_path / "stages", ReportConfig(examples=1), 0,
                           "timetravel_ablated", "nll", 0.05)[1]
    assert "\\caption{Results on timetravel\\_ablated (1 test instance). $^{*}$" in ablated  # LaTeX's `_` escaped
    # A system whose generator wrote nothing: the notes under the table say which and how many.
    (tmp_path / "metrics" / "finetuned.json").write_text(json.dumps(_metrics(-1.5, empty_predictions=1)))
    notes = report(["nll", "finetuned"])[0].split("## Following")[0]
    assert "**Empty endings:** finetuned (1 of 1). These predictions are empty or whitespace" in notes
    assert "Cut at the token limit" not in notes
    # Endings cut at the token limit: from the generate stage's record, or an LLM mode's usage file.
    record = json.loads((tmp_path / "stages" / "generate-nll.json").read_text())
    (tmp_path / "stages" / "generate-nll.json").write_text(json.dumps({**record, "cut_at_limit": 1}))
    (tmp_path / "stages" / "generate-finetuned.json").write_text(json.dumps({**record, "stage": "generate-finetuned", "cut_at_limit": 0}))
    (tmp_path / "llm" / "zero_shot.json").write_text(json.dumps({
        "mode": "zero_shot", "mode_label": "zero-shot", "backend": "local", "model": "m", "instances": 1, "prompts": 1,
        "prompt_tokens": 9, "completion_tokens": 50, "cut_at_limit": 1}))
    notes = report(["nll", "finetuned", "llm_zero_shot"])[0].split("## Following")[0]
    assert "**Cut at the token limit:** NLL (1 of 1); m zero-shot (local) (1 of 1). These endings stopped at" in notes
    (tmp_path / "llm" / "zero_shot.json").unlink()
    (tmp_path / "stages" / "generate-finetuned.json").unlink()
    (tmp_path / "stages" / "generate-nll.json").write_text(json.dumps(record))
    with pytest.raises(InputError, match=r"no llm_rag\.json in .*metrics \(is its stage in the pipeline\?\)"):
        report(["nll", "finetuned", "llm_rag"])
    # A task without an original ending (ART): the caption says so and what M scores against.
    for system in ("nll", "finetuned"):
        art = _metrics(-2.0, counterfactual_metrics="n/a: the task has no original ending")
        for metric in ("bartscore", "rougeL", "sacrebleu"):
            art[metric] = {"predictive": art[metric]["predictive"]}  # as the score stage writes it for ART
        (tmp_path / "metrics" / f"{system}.json").write_text(json.dumps(art))
    markdown, _ = report(["nll", "finetuned"])
    assert ("M(Ŷ, Y) scores the prediction against the reference ending. The task has no original ending, so "
            "there is no counterfactual form (M + Δ_M).") in markdown and "edited ending" not in markdown
    header = next(line for line in markdown.splitlines() if line.startswith("| System"))
    assert header == "| System | BARTScore (M) | ROUGE-L (M) | SacreBLEU (M) |"  # no column of n/a
    latex = report(["nll", "finetuned"])[1]
    assert "System & BARTScore (M) & ROUGE-L (M) & SacreBLEU (M) \\\\" in latex and "multicolumn" not in latex


def test_the_training_section_reads_the_runs_summaries_and_the_wall_time_from_the_stage_record(tmp_path):
    from storyrewrite.curves import read_curves
    from storyrewrite.report.build import read_summaries, train_seconds, training_section

    (tmp_path / "finetuned" / "plots" / "metrics").mkdir(parents=True)
    (tmp_path / "finetuned" / "metrics.json").write_text(json.dumps(training_summary(
        global_step=10, best_step=10, main_diagnostics=["m_target", "m_original", "delta"], start_val_loss=3.1, best_val_loss=2.75)))
    # DVCLive's files: the first and the last row of each are what the table shows.
    for name, (first, last) in {"train_loss": (3.2, 2.9), "val_loss": (3.1, 2.8), "m_target": (-3.21, -2.95),
                                "val_m_original": (-2.5, -2.6), "delta": (0.1, 0.3), "val_delta": (0.2, 0.25)}.items():
        (tmp_path / "finetuned" / "plots" / "metrics" / f"{name}.tsv").write_text(f"step\t{name}\n1\t{first}\n5\t7.0\n10\t{last}\n")
    curves = {s: read_curves(tmp_path / s) for s in ("nll", "finetuned")}
    seconds = train_seconds([{"stage": "train", "train_s": 42.4}, {"stage": "generate-finetuned", "wall_s": 3.0}])
    assert seconds == {"finetuned": 42.4}
    table = training_section(read_summaries(["nll", "finetuned"], tmp_path), curves, {"nll": "NLL", "finetuned": "DTO-Score"},
                             seconds).splitlines()
    assert len(table) == 3  # no summary for nll here: no row
    # The validation loss of the starting weights → that of the exported checkpoint (not the last
    # validation's); diagnostics from validation where it has them (delta), else from training.
    assert table[2] == ("| DTO-Score | 10 | 42 s | 10 | 2.9 | 3.1 → 2.75 | "
                        "m_target -3.21 → -2.95; m_original (val) -2.5 → -2.6; delta (val) 0.2 → 0.25 |")
    # The part of it spent validating, where the record has it (an older record has none).
    validating = train_seconds([{"stage": "train", "train_s": 42.4, "validate_s": 17.6}], "validate_s")
    assert validating == {"finetuned": 17.6} and train_seconds([{"stage": "train", "train_s": 42.4}], "validate_s") == {}
    table = training_section(read_summaries(["finetuned"], tmp_path), curves, {"finetuned": "DTO-Score"}, seconds,
                             validating).splitlines()
    assert table[2].startswith("| DTO-Score | 10 | 42 s (18 s validating) | 10 |")
    # A run without validate_at_start: the start is n/a; without its stage record, so is the wall time.
    summary = json.loads((tmp_path / "finetuned" / "metrics.json").read_text())
    summary["start_val_loss"] = None
    (tmp_path / "finetuned" / "metrics.json").write_text(json.dumps(summary))
    table = training_section(read_summaries(["finetuned"], tmp_path), curves, {"finetuned": "DTO-Score"}, {}).splitlines()
    assert "| DTO-Score | 10 | n/a | 10 | 2.9 | n/a → 2.75 |" in table[2]


def test_a_renamed_field_fails_where_the_artifact_is_read_naming_file_and_field(tmp_path):
    import pytest

    from storyrewrite.io import InputError
    from storyrewrite.report.build import read_summaries

    (tmp_path / "nll").mkdir()
    summary = training_summary()
    summary["best_val_NLL"] = summary.pop("best_val_nll")  # renamed by some edit
    (tmp_path / "nll" / "metrics.json").write_text(json.dumps(summary))
    with pytest.raises(InputError, match=r"nll/metrics\.json: missing field `best_val_nll` \(TrainingSummary\)"):
        read_summaries(["nll"], tmp_path)


def test_the_notes_name_the_llm_rows_the_judge_wrote_itself():
    """The local backend runs the generator's pretrained weights: where the CF-PMI judge is that
    model, it scores endings it wrote after reading X_CE, and the notes say so for those rows."""
    from storyrewrite.report.build import coherence_notes, judge_wrote

    usages = {"m zero-shot (local)": {"backend": "local", "model": "m"},
              "m zero-shot (openai)": {"backend": "openai", "model": "m"},  # a server's model of that name: not the judge's weights
              "other RAG (local)": {"backend": "local", "model": "other"}}
    assert judge_wrote(usages, "m") == ["m zero-shot (local)"]
    assert judge_wrote(usages, None) == []
    metrics = {"coherence_metrics": "available",
               "evaluators": {"judge": "m", "embedder": None, "nli": None, "judge_is_scorer": False}}
    notes = coherence_notes(metrics, usages)
    assert ("The judge wrote the endings of m zero-shot (local) itself, after reading X_CE in the prompt, so its CF-PMI may "
            "favour those rows for that reason alone.") in notes
    assert not any("wrote the endings" in note for note in coherence_notes(metrics))
    no_judge = {**metrics, "evaluators": {**metrics["evaluators"], "judge": None}}
    assert not any("wrote the endings" in note for note in coherence_notes(no_judge, usages))
    # A task without a counterfactual event (ART): the section says why, as the validity section does.
    assert coherence_notes({"coherence_metrics": "not available: the task has no counterfactual event"}) == [
        "Not available: the task has no counterfactual event."]


def test_the_notes_name_the_systems_whose_predictions_mostly_echo_the_prompt():
    """Above a half of its predictions echoing the prompt, a system's row is named, with its share;
    at a half or below, not."""
    from storyrewrite.report.build import echo_notes

    labels = {"nll": "NLL", "llm_zero_shot": "zero-shot", "llm_rag": "RAG"}
    metrics = {"nll": {"prompt_echo": 0.5}, "llm_zero_shot": {"prompt_echo": 0.51}, "llm_rag": {"prompt_echo": 0.9}}
    [note] = echo_notes(labels, metrics)
    assert note.startswith("**Mostly not endings:** the predictions of zero-shot (51 %); RAG (90 %) echo the prompt")
    assert echo_notes(labels, {"nll": {"prompt_echo": 0.5}}) == []


def test_a_system_is_named_from_what_its_run_wrote():
    from storyrewrite.report.build import system_label
    from storyrewrite.systems import COPY_BASELINES

    assert system_label("nll", training_summary(global_step=300), None) == "NLL"
    assert system_label("finetuned", training_summary(global_step=40), None) == "NLL, continued (+40 steps)"
    dto = training_summary(objective="score", label="DTO-Score", global_step=40)
    assert system_label("finetuned", dto, None) == "DTO-Score (from NLL, +40 steps)"
    usage = {"model": "m", "mode_label": "zero-shot", "backend": "local"}
    assert system_label("llm_zero_shot", None, usage) == "m zero-shot (local)"
    assert system_label("copy_original", None, None) == COPY_BASELINES["copy_original"][1]
    assert system_label("mine", None, None) == "mine"
