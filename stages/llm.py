"""llm: one prompting mode of the LLM baseline over the evaluated split, through the configured
backend, every response cached; prints the cost/latency summary."""
import argparse
import json
from pathlib import Path

from storyrewrite.data.prepare import load_instances
from storyrewrite.io import run_stage, write_json_atomic, write_jsonl_atomic
from storyrewrite.llm.backends import LocalBackend, OpenAIBackend, RetryPolicy
from storyrewrite.llm.cache import ResponseCache
from storyrewrite.llm.retrieval import Embedder, Index, query_text
from storyrewrite.llm.run import MODES, LLMConfig, run_mode
from storyrewrite.models.loading import resolve_model_dir, weights_digest
from storyrewrite.params import build, experiment, load_params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--index", type=Path, required=True, help="the llm_index stage's dir (rag)")
    parser.add_argument("--local-model", type=Path, required=True, help="the models stage's dir (local backend)")
    parser.add_argument("--cache", type=Path, required=True, help="response cache dir (kept between runs)")
    parser.add_argument("--out", type=Path, required=True, help="predictions .jsonl")
    parser.add_argument("--usage", type=Path, required=True, help="usage summary .json")
    args = parser.parse_args()
    params = load_params()
    run = experiment(params)
    config = build(LLMConfig, params["llm"], "llm")
    instances = load_instances(args.data, run.task, params["generate"]["split"])
    train = load_instances(args.data, run.task, "train")
    if config.backend == "openai":
        o = config.openai
        backend = OpenAIBackend(o.base_url, o.model, o.api_key_env, o.timeout, RetryPolicy(o.max_retries, o.initial_delay, o.max_delay))
        model_id, label = f"{o.base_url} {o.model}", o.model
    else:
        model_dir = resolve_model_dir(args.local_model, "generator")
        backend = LocalBackend(model_dir)
        model_id, label = f"local {weights_digest(model_dir)}", params["models"]["generator"]
    retrieve = None
    if args.mode == "rag":
        index, embedder = Index(args.index), Embedder(args.index / "embedder")
        retrieve = lambda rows: index.nearest(embedder.embed([query_text(r, run.task) for r in rows]))  # noqa: E731
    predictions, usage = run_mode(args.mode, instances, train, run.task, config, backend, model_id,
                                  ResponseCache(args.cache), run.seed, retrieve)
    write_jsonl_atomic(args.out, predictions)
    summary = {"mode": args.mode, "backend": config.backend, "model": label, **usage.summary()}
    write_json_atomic(args.usage, summary)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    run_stage(main)
