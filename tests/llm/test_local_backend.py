import pytest

from storyrewrite.data.prepare import load_instances
from storyrewrite.llm.backends import LocalBackend
from storyrewrite.llm.cache import ResponseCache
from storyrewrite.llm.modes import ExampleSource
from storyrewrite.llm.run import run_mode
from storyrewrite.params import LLMConfig, build, load_yaml

from helpers import ROOT


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_local_chat_model_runs_each_distinct_prompt_once_then_from_cache(kind, tiny_model_dirs, small_prepared, tmp_path):
    section = load_yaml(ROOT / "params.yaml")["llm"]
    section = {**section, "max_new_tokens": 5, "templates": {k: str(ROOT / v) for k, v in section["templates"].items()}}
    config = build(LLMConfig, section, "llm")
    test = load_instances(small_prepared, "timetravel", "test")  # 6 instances of 2 stories
    train = load_instances(small_prepared, "timetravel", "train")
    backend = LocalBackend(tiny_model_dirs[kind], "tiny")
    cache = ResponseCache(tmp_path)
    source = ExampleSource(train, "timetravel", config, 0)
    predictions, usage = run_mode("zero_shot", test, source, backend, cache)
    assert usage.requests == 2 and usage.cache_hits == 0 and usage.prompts == 2 and 0 < usage.completion_tokens <= 10
    assert [p["id"] for p in predictions] == [r["id"] for r in test]
    # Batched generation gives what one prompt at a time gives.
    single = [backend.complete(m, 5, 0.0).text for m in [backend_messages(config, r) for r in test[::3]]]
    assert [p["prediction"] for p in predictions[::3]] == [" ".join(s.split("\n\n")[0].split()) for s in single]
    again, cached = run_mode("zero_shot", test, source, backend, cache)
    assert again == predictions and cached.requests == 0 and cached.cache_hits == 2
    # What the predictions cost is counted the same from the cache as from the model.
    assert cached.metrics() == usage.metrics()
    assert usage.metrics()["instances"] == 6 and usage.prompt_tokens > 0


def backend_messages(config, row):
    from storyrewrite.llm.prompts import Template, messages
    return messages(Template.read(config.templates["timetravel"]), row, None)
