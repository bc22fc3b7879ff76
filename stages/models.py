"""models / eval_models: materialise the models of the given roles once as save_pretrained
directories (models: generator and scorer; eval_models: judge, embedder, NLI classifier and
BERTScore's encoder)."""
import argparse
from pathlib import Path

from storyrewrite.io import run_stage
from storyrewrite.models.catalogue import ROLES
from storyrewrite.models.materialise import materialise
from storyrewrite.params import Params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--roles", nargs="+", choices=tuple(ROLES), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reuse", type=Path, help="another models stage's output: copy the models it holds of the same specs")
    args = parser.parse_args()
    params = Params.load()
    index = materialise(params.models, args.out, params.seed, tuple(args.roles), args.reuse)
    for role in args.roles:
        where = args.out / index[role] if index[role] else "not materialised (its spec is null)"
        copied = index[role] and args.reuse is not None and (args.reuse / index[role]).is_dir()
        print(f"{role:<10} {where}" + (f" (copied from {args.reuse})" if copied else ""))


if __name__ == "__main__":
    run_stage(main)
