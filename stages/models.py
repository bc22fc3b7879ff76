"""models: materialise the generator and scorer once as save_pretrained directories."""
import argparse
from pathlib import Path

from storyrewrite.io import run_stage
from storyrewrite.models.loading import materialise
from storyrewrite.params import Params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    params = Params.load()
    for role, name in materialise(params.models, args.out, params.seed).items():
        print(f"{role:<10} {args.out / name}")


if __name__ == "__main__":
    run_stage(main)
