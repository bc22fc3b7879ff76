"""llm_index: the RAG index: MiniLM embeddings of the training split (never val or test)."""
import argparse
from pathlib import Path

from storyrewrite.data.prepare import load_instances
from storyrewrite.llm.retrieval import Embedder, build_index, extract_minilm
from storyrewrite.params import experiment, load_params
from storyrewrite.io import run_stage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    task = experiment(load_params()).task
    train = load_instances(args.data, task, "train")
    embedder = Embedder(extract_minilm(args.out / "embedder"))
    build_index(train, embedder, args.out, task)
    print(f"{args.out}: {len(train)} training instances of {task} indexed")


if __name__ == "__main__":
    run_stage(main)
