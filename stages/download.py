"""download: raw TimeTravel and ART files into --out, each checked by sha256."""
import argparse
from pathlib import Path

from storyrewrite.data.sources import download
from storyrewrite.io import run_stage
from storyrewrite.params import Params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bundled", type=Path, required=True, help="committed data (source: bundled)")
    parser.add_argument("--recorded-sums", type=Path, required=True, help="sums recorded on first url download")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    for path in download(Params.load().download, args.out, args.bundled, args.recorded_sums):
        print(f"sha256 ok  {path}")


if __name__ == "__main__":
    run_stage(main)
