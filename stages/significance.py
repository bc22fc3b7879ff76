"""significance: one-tailed paired bootstrap of every system of the run against the baseline,
per metric and form."""
import argparse
from pathlib import Path

from storyrewrite import artifacts
from storyrewrite.metrics.artifacts import Significance
from storyrewrite.io import run_stage
from storyrewrite.params import Params
from storyrewrite.records import StageRecord
from storyrewrite.significance.compare import compare, read_scores
from storyrewrite.systems import pipeline_systems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--systems", nargs="+", required=True, help="the trained systems (generate@<system>)")
    parser.add_argument("--scores", type=Path, nargs="+", required=True, help="directories of <system>.jsonl scores")
    parser.add_argument("--out", type=Path, required=True)
    StageRecord.add_argument(parser)
    args = parser.parse_args()
    record = StageRecord.start(args.record)
    params = Params.load()
    config = params.significance
    systems = pipeline_systems(args.systems, params.llm.modes, params.task)
    scores = read_scores(systems, args.scores)
    results = compare(scores, config.baseline, config.n_resamples, params.seed, by_story=config.unit == "story")
    artifacts.write(args.out, Significance(baseline=config.baseline, n_resamples=config.n_resamples, unit=config.unit,
                                           p_values=results))
    for system, p_values in results.items():
        print(system, p_values)
    if record:
        record.finish("cpu", None, len(results) * config.n_resamples, "resamples", unit_of_resampling=config.unit)


if __name__ == "__main__":
    run_stage(main)
