"""sanity: the copy baselines as predictions: the reference itself (an upper bound) and, where
the task has one, the original ending copied unchanged (this task's classic trivial baseline)."""
import argparse
from pathlib import Path

from storyrewrite.data.prepare import load_instances
from storyrewrite.io import run_stage, write_jsonl_atomic
from storyrewrite.params import Params
from storyrewrite.systems import copy_predictions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    params = Params.load()
    instances = load_instances(args.data, params.task, params.generate.split)
    for system, rows in copy_predictions(instances, params.task).items():
        write_jsonl_atomic(args.out / f"{system}.jsonl", rows)


if __name__ == "__main__":
    run_stage(main)
