"""llm: one prompting mode of the LLM baseline over the evaluated split, through the configured
backend, every response cached; prints the cost/latency summary."""
import argparse
import json
from pathlib import Path

from storyrewrite.data.prepare import load_instances
from storyrewrite import artifacts
from storyrewrite.io import run_stage, write_jsonl_atomic
from storyrewrite.llm.backends import make_backend
from storyrewrite.llm.cache import ResponseCache
from storyrewrite.llm.retrieval import Index, query_text
from storyrewrite.llm.modes import ExampleSource, get_mode
from storyrewrite.llm.run import run_mode
from storyrewrite.params import Params
from storyrewrite.records import StageRecord, describe_device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", required=True, help="a prompting mode (storyrewrite.llm.run.MODES)")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--index", type=Path, required=True, help="the llm_index stage's dir (modes that retrieve)")
    parser.add_argument("--local-model", type=Path, required=True, help="the models stage's dir (local backend)")
    parser.add_argument("--cache", type=Path, required=True, help="response cache dir (kept between runs)")
    parser.add_argument("--out", type=Path, required=True, help="predictions .jsonl")
    parser.add_argument("--usage", type=Path, required=True, help="usage .json (DVC metrics): prompts and tokens")
    StageRecord.add_argument(parser)
    args = parser.parse_args()
    params = Params.load()
    config, task, mode = params.llm, params.task, get_mode(args.mode)
    if config.backend == "local" or mode.needs_index:
        # A model runs here: torch and transformers are imported before the record's clock starts
        # (its wall time excludes imports, as in every stage). A remote backend's mode that does
        # not retrieve needs neither.
        import storyrewrite.models.sentence  # noqa: F401
        import storyrewrite.models.store  # noqa: F401
    record = StageRecord.start(args.record)
    instances = load_instances(args.data, task, params.generate.split)
    train = load_instances(args.data, task, "train")
    backend = make_backend(config, args.local_model, params.models.generator, params.device)
    # A remote backend's model runs on its server (its device names the host): no dtype here.
    local = config.backend == "local"
    device, dtype = backend.device, config.local_dtype if local else None
    print(f"llm {mode.name}: backend {config.backend}, model {backend.label}" + (f" on {device} ({dtype})" if local else ""))
    retrieve, retrieval = None, {}
    if mode.needs_index:
        from storyrewrite.models.device import resolve_device
        from storyrewrite.models.sentence import SentenceEncoder

        index, embedder = Index(args.index), SentenceEncoder(args.index / "embedder", resolve_device(params.device))
        retrieve = lambda rows: index.nearest(embedder.embed([query_text(r, task) for r in rows]))  # noqa: E731
        # The retrieval's embedder runs whatever the response cache holds (its examples are part
        # of each prompt): the record names its device beside the LLM's.
        where = describe_device(embedder.device)
        retrieval = {"embedder_device": where["device"], "embedder_device_name": where["device_name"]}
    source = ExampleSource(train, task, config, params.seed, retrieve)
    predictions, usage = run_mode(mode.name, instances, source, backend, ResponseCache(args.cache))
    write_jsonl_atomic(args.out, predictions)
    # The metrics hold what the predictions cost, the same whatever the response cache held;
    # what this run did (requests, cache hits, time) goes to the stage record.
    cost = artifacts.LLMUsage(mode=mode.name, mode_label=mode.label, backend=config.backend, model=backend.label, **usage.metrics())
    artifacts.write(args.usage, cost)
    summary = cost.model_dump()
    facts = usage.run_facts()
    print(json.dumps({**summary, "this_run": facts}, indent=2))
    if record:  # replies from the response cache cost nothing: the rate counts the requests made
        if local and not backend.loaded:  # every reply was cached: no weights loaded, no model ran
            device, dtype = "cpu", None
        record.finish(device, dtype, facts.pop("requests"), "requests", **facts,
                      predictions=len(predictions), backend=config.backend, model=backend.label, **retrieval)


if __name__ == "__main__":
    run_stage(main)
