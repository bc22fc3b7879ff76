"""report: reports/results.md and the LaTeX table for the systems of this run, from their
metrics, the significance tests, their predictions and their training summaries."""
import argparse
from pathlib import Path

from storyrewrite.data.prepare import load_instances
from storyrewrite.io import run_stage, write_text_atomic
from storyrewrite.params import Params
from storyrewrite.report.build import build_report
from storyrewrite.systems import pipeline_systems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--systems", nargs="+", required=True, help="the trained systems (generate@<system>)")
    parser.add_argument("--metrics", type=Path, nargs="+", required=True, help="directories of <system>.json metrics")
    parser.add_argument("--significance", type=Path, required=True)
    parser.add_argument("--predictions", type=Path, nargs="+", required=True, help="directories of <system>.jsonl predictions")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--train-logs", type=Path, required=True)
    parser.add_argument("--llm-usage", type=Path, required=True, help="the llm stages' usage summaries")
    parser.add_argument("--stage-records", type=Path, required=True, help="the stages' records (device, wall time)")
    parser.add_argument("--validity", type=Path, required=True, help="the validity stage's figures")
    parser.add_argument("--scores", type=Path, nargs="+", required=True, help="directories of <system>.jsonl per-instance scores")
    parser.add_argument("--figure", type=Path, required=True, help="results .png (and <train-logs>/<system>.png: main curves)")
    parser.add_argument("--out", type=Path, required=True, help="results .md")
    parser.add_argument("--latex", type=Path, required=True, help="results .tex")
    args = parser.parse_args()
    params = Params.load()
    significance = params.significance
    markdown, latex = build_report(
        pipeline_systems(args.systems, params.llm.modes, params.task), args.metrics, args.significance, args.predictions,
        load_instances(args.data, params.task, params.generate.split), args.train_logs, args.llm_usage,
        args.stage_records, params.report, params.seed, params.task, significance.baseline, significance.alpha,
        args.validity, args.scores, args.figure,
    )
    write_text_atomic(args.out, markdown)
    write_text_atomic(args.latex, latex)
    print(markdown.split("## Examples")[0])


if __name__ == "__main__":
    run_stage(main)
