"""models: materialise the generator and scorer once as save_pretrained directories."""
import argparse
from pathlib import Path

from storyrewrite.models.loading import ModelsConfig, materialise
from storyrewrite.params import build, experiment, load_params
from storyrewrite.io import run_stage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    params = load_params()
    index = materialise(build(ModelsConfig, params["models"], "models"), args.out, experiment(params).seed)
    for role, name in index.items():
        print(f"{role:<10} {args.out / name}")


if __name__ == "__main__":
    run_stage(main)
