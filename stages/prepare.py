"""prepare: one instance table per task and split, plus their counts (a DVC metrics file)."""
import argparse
from pathlib import Path

from storyrewrite.data.prepare import format_counts, prepare
from storyrewrite.io import run_stage, write_json_atomic
from storyrewrite.params import Params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--raw", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--counts", type=Path, required=True)
    args = parser.parse_args()
    params = Params.load()
    counts = prepare(args.raw, args.out, params.data, params.seed)
    write_json_atomic(args.counts, counts)
    print(format_counts(counts))


if __name__ == "__main__":
    run_stage(main)
