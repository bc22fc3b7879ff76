import json

import pytest
import torch

from storyrewrite.data.prepare import load_instances
from storyrewrite.generation.generate import generate_predictions
from storyrewrite.params import GenerateConfig

from conftest import read_jsonl, tiny_models_config


def _generate(model_dir, instances, out, batch_size=4, num_beams=1, kind="llama"):
    config = GenerateConfig(batch_size=batch_size, num_beams=num_beams, max_new_tokens=6, split="test")
    return generate_predictions(model_dir, instances, "timetravel", config, tiny_models_config(kind), out, seed=0)


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_predictions_keyed_by_id_in_table_order_and_batch_invariant(tmp_path, tiny_model_dirs, small_prepared, kind):
    instances = load_instances(small_prepared, "timetravel", "test")
    assert _generate(tiny_model_dirs[kind], instances, tmp_path / "a.jsonl", batch_size=4, kind=kind) == len(instances)
    _generate(tiny_model_dirs[kind], instances, tmp_path / "b.jsonl", batch_size=1, kind=kind)
    a, b = read_jsonl(tmp_path / "a.jsonl"), read_jsonl(tmp_path / "b.jsonl")
    assert [row["id"] for row in a] == [row["id"] for row in instances]
    # Length-sorted batches with padding give what one-at-a-time greedy decoding gives.
    assert a == b
    assert all(isinstance(row["prediction"], str) for row in a)
    assert not (tmp_path / ".partial" / "a.jsonl").exists()


def test_beam_search_runs(tmp_path, tiny_model_dirs, small_prepared):
    instances = load_instances(small_prepared, "timetravel", "test")[:3]
    _generate(tiny_model_dirs["bart"], instances, tmp_path / "beam.jsonl", num_beams=3, kind="bart")
    assert len(read_jsonl(tmp_path / "beam.jsonl")) == 3


def test_an_interrupted_run_resumes_without_regenerating(tmp_path, tiny_model_dirs, small_prepared):
    instances = load_instances(small_prepared, "timetravel", "test")
    _generate(tiny_model_dirs["llama"], instances, tmp_path / "full.jsonl")
    full = read_jsonl(tmp_path / "full.jsonl")

    # Simulate an interruption: the partial file holds the first two finished predictions,
    # one of them altered so that reuse (rather than regeneration) is visible.
    out = tmp_path / "resumed.jsonl"
    _generate(tiny_model_dirs["llama"], instances, out)
    out.unlink()
    partial_dir = tmp_path / ".partial"
    assert not list(partial_dir.glob("resumed-*.jsonl"))
    done = [dict(full[0], prediction="reused"), full[1]]
    fingerprinted = partial_dir / f"resumed-{_fingerprint_of(tiny_model_dirs['llama'], instances)}.jsonl"
    fingerprinted.write_text("".join(json.dumps(row) + "\n" for row in done))
    assert _generate(tiny_model_dirs["llama"], instances, out) == len(instances) - 2
    resumed = read_jsonl(out)
    assert resumed[0]["prediction"] == "reused" and resumed[1:] == full[1:]


def _fingerprint_of(model_dir, instances):
    from storyrewrite.generation.generate import _fingerprint
    config = GenerateConfig(batch_size=4, num_beams=1, max_new_tokens=6, split="test")
    return _fingerprint(model_dir, instances, config, tiny_models_config("llama"), torch.device("cpu"))


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_a_static_kv_cache_gives_the_same_predictions(tmp_path, tiny_model_dirs, small_prepared, kind):
    instances = load_instances(small_prepared, "timetravel", "test")
    for cache in ("dynamic", "static"):
        config = GenerateConfig(batch_size=4, num_beams=1, max_new_tokens=6, split="test", cache=cache)
        generate_predictions(tiny_model_dirs[kind], instances, "timetravel", config, tiny_models_config(kind),
                             tmp_path / f"{cache}.jsonl", seed=0)
    assert read_jsonl(tmp_path / "dynamic.jsonl") == read_jsonl(tmp_path / "static.jsonl")
