"""llm_index: the retrieval index of the LLM baselines (MiniLM embeddings of the training split,
never val or test), built only when a mode in `llm.modes` retrieves (RAG); otherwise an empty
index that says why, and MiniLM is not needed."""
import argparse
from pathlib import Path

from storyrewrite.data.prepare import load_instances
from storyrewrite.io import run_stage
from storyrewrite.llm.indexing import build_index, extract_minilm, write_unbuilt
from storyrewrite.llm.modes import needs_index
from storyrewrite.params import Params
from storyrewrite.records import StageRecord


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    StageRecord.add_argument(parser)
    args = parser.parse_args()
    params = Params.load()
    if not needs_index(params.llm.modes):  # no model runs: neither torch nor transformers is imported
        record = StageRecord.start(args.record)
        write_unbuilt(args.out, f"no mode of `llm.modes` ({', '.join(params.llm.modes) or 'none'}) retrieves")
        print(f"{args.out}: not built (no retrieving mode in llm.modes)")
        if record:
            record.finish("cpu", None, 0, "training instances", built=False)
        return
    # Imported here, before the record's clock starts (its wall time excludes imports, as in
    # every stage): only a retrieving mode needs torch and transformers.
    import storyrewrite.models.specs  # noqa: F401  (extract_minilm's)
    from storyrewrite.models.device import resolve_device
    from storyrewrite.models.sentence import SentenceEncoder

    record = StageRecord.start(args.record)
    train = load_instances(args.data, params.task, "train")
    embedder = SentenceEncoder(extract_minilm(args.out / "embedder"), resolve_device(params.device))
    build_index(train, embedder, args.out, params.task)
    print(f"{args.out}: {len(train)} training instances of {params.task} indexed on {embedder.device}")
    if record:
        record.finish(embedder.device, None, len(train), "training instances", built=True)


if __name__ == "__main__":
    run_stage(main)
