"""significance: one-tailed paired bootstrap of every system against the baseline, per metric."""
import argparse
from pathlib import Path

from storyrewrite.io import read_jsonl, run_stage, write_json_atomic
from storyrewrite.metrics.config import SignificanceConfig
from storyrewrite.params import build, experiment, load_params
from storyrewrite.significance.compare import compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scores", type=Path, nargs="+", required=True, help="directories of <system>.jsonl scores")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    params = load_params()
    config = build(SignificanceConfig, params["significance"], "significance")
    scores = {path.stem: [row for _, row in read_jsonl(path)] for directory in args.scores for path in sorted(directory.glob("*.jsonl"))}
    results = compare(scores, config.baseline, config.n_resamples, experiment(params).seed, by_story=config.unit == "story")
    write_json_atomic(args.out, {**results, "_baseline": config.baseline, "_n_resamples": config.n_resamples, "_unit": config.unit})
    for system, p_values in results.items():
        print(system, p_values)


if __name__ == "__main__":
    run_stage(main)
