"""download: raw TimeTravel and ART files into --out, each checked by sha256."""
import argparse
from pathlib import Path

from storyrewrite.data.sources import DownloadConfig, download
from storyrewrite.params import build, load_params
from storyrewrite.io import run_stage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bundled", type=Path, required=True, help="committed data (source: bundled)")
    parser.add_argument("--recorded-sums", type=Path, required=True, help="sums recorded on first url download")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config = build(DownloadConfig, load_params()["download"], "download")
    for path in download(config, args.out, args.bundled, args.recorded_sums):
        print(f"sha256 ok  {path}")


if __name__ == "__main__":
    run_stage(main)
