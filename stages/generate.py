"""generate: predictions of one trained system on `generate.split`."""
import argparse
from pathlib import Path

from storyrewrite.data.prepare import load_instances
from storyrewrite.generation.generate import GenerateConfig, generate_predictions
from storyrewrite.models.loading import ModelsConfig
from storyrewrite.params import build, experiment, load_params
from storyrewrite.io import run_stage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="prepared data dir")
    parser.add_argument("--out", type=Path, required=True, help="predictions .jsonl")
    args = parser.parse_args()
    params = load_params()
    run = experiment(params)
    config = build(GenerateConfig, params["generate"], "generate")
    instances = load_instances(args.data, run.task, config.split)
    n = generate_predictions(
        args.model, instances, run.task, config, build(ModelsConfig, params["models"], "models"), args.out, run.seed
    )
    print(f"{args.out}: {len(instances)} predictions ({n} generated now, {len(instances) - n} resumed)")


if __name__ == "__main__":
    run_stage(main)
