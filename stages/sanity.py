"""sanity: the copy baselines as predictions: the reference itself (an upper bound) and, where
the task has one, the original ending copied unchanged (this task's classic trivial baseline)."""
import argparse
from pathlib import Path

from storyrewrite.data.prepare import load_instances
from storyrewrite.io import run_stage, write_jsonl_atomic
from storyrewrite.params import experiment, load_params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    params = load_params()
    instances = load_instances(args.data, experiment(params).task, params["generate"]["split"])
    write_jsonl_atomic(args.out / "copy_reference.jsonl", ({"id": r["id"], "prediction": r["target"]} for r in instances))
    if all("original_ending" in r for r in instances):
        write_jsonl_atomic(args.out / "copy_original.jsonl", ({"id": r["id"], "prediction": r["original_ending"]} for r in instances))


if __name__ == "__main__":
    run_stage(main)
