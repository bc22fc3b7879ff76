"""models / eval_models: materialise the models of the given roles once as save_pretrained
directories (models: generator and scorer; eval_models: judge, embedder, NLI classifier and
BERTScore's encoder)."""
import argparse
from pathlib import Path

from storyrewrite.io import run_stage
from storyrewrite.models.roles import ROLES
from storyrewrite.models.materialise import materialise
from storyrewrite.params import Params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--roles", nargs="+", choices=tuple(ROLES), required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    params = Params.load()
    index = materialise(params.models, args.out, params.seed, tuple(args.roles))
    for role in args.roles:
        where = args.out / index[role] if index[role] else "not materialised (its spec is null)"
        print(f"{role:<10} {where}")


if __name__ == "__main__":
    run_stage(main)
