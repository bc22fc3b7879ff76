"""report: reports/results.md and the LaTeX table, from metrics, significance and predictions."""
import argparse
from pathlib import Path

from storyrewrite.data.prepare import load_instances
from storyrewrite.io import run_stage, write_text_atomic
from storyrewrite.metrics.config import SignificanceConfig
from storyrewrite.params import build, experiment, load_params
from storyrewrite.report.build import ReportConfig, build_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--metrics", type=Path, nargs="+", required=True)
    parser.add_argument("--significance", type=Path, required=True)
    parser.add_argument("--predictions", type=Path, nargs="+", required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--train-logs", type=Path, required=True)
    parser.add_argument("--llm-usage", type=Path, required=True, help="the llm stages' usage summaries")
    parser.add_argument("--out", type=Path, required=True, help="results .md")
    parser.add_argument("--latex", type=Path, required=True, help="results .tex")
    args = parser.parse_args()
    params = load_params()
    run = experiment(params)
    significance = build(SignificanceConfig, params["significance"], "significance")
    markdown, latex = build_report(
        args.metrics, args.significance, args.predictions,
        load_instances(args.data, run.task, params["generate"]["split"]), args.train_logs, args.llm_usage,
        build(ReportConfig, params["report"], "report"), run.seed, run.task, significance.baseline, significance.alpha,
    )
    write_text_atomic(args.out, markdown)
    write_text_atomic(args.latex, latex)
    print(markdown.split("## Examples")[0])


if __name__ == "__main__":
    run_stage(main)
