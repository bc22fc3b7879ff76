import json

import pytest
import torch

from storyrewrite.io import InputError

from storyrewrite.data.formatting import model_source
from storyrewrite.data.prepare import load_instances
from storyrewrite.generation.generate import generate_predictions
from storyrewrite.params import GenerateConfig

from helpers import read_jsonl, tiny_models_config


def _generate(model_dir, instances, out, batch_size=4, num_beams=1, kind="llama"):
    config = GenerateConfig(batch_size=batch_size, num_beams=num_beams, max_new_tokens=6, split="test")
    return generate_predictions(model_dir, instances, "timetravel", config, tiny_models_config(kind), out, seed=0)


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_predictions_keyed_by_id_in_table_order_and_batch_invariant(tmp_path, tiny_model_dirs, small_prepared, kind):
    instances = load_instances(small_prepared, "timetravel", "test")
    assert _generate(tiny_model_dirs[kind], instances, tmp_path / "a.jsonl", batch_size=4, kind=kind).predictions == len(instances)
    _generate(tiny_model_dirs[kind], instances, tmp_path / "b.jsonl", batch_size=1, kind=kind)
    a, b = read_jsonl(tmp_path / "a.jsonl"), read_jsonl(tmp_path / "b.jsonl")
    assert [row["id"] for row in a] == [row["id"] for row in instances]
    # Length-sorted batches with padding give what one-at-a-time greedy decoding gives.
    assert a == b
    assert all(isinstance(row["prediction"], str) for row in a)
    # The partial file of the finished run (a-<fingerprint>.jsonl) is gone.
    assert (tmp_path / ".partial").is_dir() and not list((tmp_path / ".partial").glob("a*.jsonl"))


def test_the_instances_of_one_input_are_decoded_once_and_share_its_prediction(tmp_path, tiny_model_dirs, small_prepared):
    instances = load_instances(small_prepared, "timetravel", "test")[:9]
    inputs = [(row["premise"], row["initial"], row["original_ending"], row["counterfactual"]) for row in instances]
    assert len(set(inputs)) < len(instances)  # stories with several human rewrites
    # (the tiny random Llama repeats the prompt's last token: every ending is cut at the limit)
    assert _generate(tiny_model_dirs["llama"], instances, tmp_path / "shared.jsonl") == (len(instances), len(set(inputs)), len(instances))
    shared = read_jsonl(tmp_path / "shared.jsonl")
    assert [row["id"] for row in shared] == [row["id"] for row in instances]
    # Each instance generated on its own gets what the shared decoding gave it.
    for row, prediction in zip(instances, shared, strict=True):
        assert _generate(tiny_model_dirs["llama"], [row], tmp_path / "alone.jsonl") == (1, 1, 1)
        assert read_jsonl(tmp_path / "alone.jsonl") == [prediction]


def _first_end(model_dir, instance, limit: int) -> int | None:
    """Where greedy decoding of `instance` alone, under a higher limit, first gives eos (None: never)."""
    from storyrewrite.data.formatting import model_source
    from storyrewrite.models.store import load_model, load_tokenizer

    tokenizer, model = load_tokenizer(model_dir), load_model(model_dir, "float32", torch.device("cpu")).eval()
    inputs = tokenizer(model_source(instance, "timetravel", tokenizer, True), return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=limit, do_sample=False)[0, 1:]  # after the decoder's start token
    ends = (output == tokenizer.eos_token_id).nonzero()
    return int(ends[0]) + 1 if len(ends) else None


@pytest.mark.parametrize("eos_bias", [0.0, -1.0])
def test_the_endings_cut_at_the_token_limit_are_counted(tmp_path, tiny_model_dirs, small_prepared, eos_bias):
    from storyrewrite.models.store import load_model, load_tokenizer

    # The tiny random BART ends every sequence at once (eos follows its decoder's start token, eos);
    # its output bias against eos keeps it from ever ending.
    model_dir = tmp_path / "model"
    model = load_model(tiny_model_dirs["bart"], "float32", torch.device("cpu"))
    tokenizer = load_tokenizer(tiny_model_dirs["bart"])
    model.final_logits_bias[0, tokenizer.eos_token_id] = eos_bias
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    instances = load_instances(small_prepared, "timetravel", "test")
    generated = _generate(model_dir, instances, tmp_path / "out.jsonl", kind="bart")
    # Counted another way: decoding each instance alone under a limit of 20, is eos among the first 6 tokens?
    ends = [_first_end(model_dir, row, 20) for row in instances]
    assert generated.cut == sum(end is None or end > 6 for end in ends) == (len(instances) if eos_bias else 0)
    # A resumed run counts the cut endings of its partial file's rows as well.
    rows = read_jsonl(tmp_path / "out.jsonl")
    (tmp_path / "out.jsonl").unlink()
    _partial(tmp_path, "out", model_dir, instances, "".join(json.dumps({**row, "cut": True}) + "\n" for row in rows[:2]))
    resumed = _generate(model_dir, instances, tmp_path / "out.jsonl", kind="bart")
    assert (resumed.predictions, resumed.cut) == (len(instances) - 2, generated.cut if eos_bias else 2)


def test_decoding_follows_generate_s_settings_not_the_checkpoint_s_defaults(tmp_path, tiny_model_dirs, small_prepared):
    """bart-large-cnn ships decoding defaults for news summaries (4 beams, a minimum length, n-gram
    blocking, a forced first token), and transformers fills every setting a call leaves unset from
    them. The generate stage decodes as `generate.*` say: a tiny BART that carries such defaults
    writes what the same weights write without them (the random BART ends at once; under its
    defaults it writes at least four tokens)."""
    from storyrewrite.models.store import load_model, load_tokenizer

    model = load_model(tiny_model_dirs["bart"], "float32", torch.device("cpu")).eval()
    tokenizer = load_tokenizer(tiny_model_dirs["bart"])
    model.save_pretrained(tmp_path / "plain")
    model.generation_config.update(num_beams=4, early_stopping=True, length_penalty=2.0, min_length=5, no_repeat_ngram_size=3,
                                   forced_bos_token_id=7)
    model.save_pretrained(tmp_path / "news")
    for directory in ("plain", "news"):
        tokenizer.save_pretrained(tmp_path / directory)
    instances = load_instances(small_prepared, "timetravel", "test")[:3]
    inputs = tokenizer(model_source(instances[0], "timetravel", tokenizer, True), return_tensors="pt")
    assert len(load_model(tmp_path / "news").generate(**inputs, max_new_tokens=6)[0]) >= 5  # (what its defaults do)
    for directory in ("plain", "news"):
        _generate(tmp_path / directory, instances, tmp_path / f"{directory}.jsonl", kind="bart")
    assert read_jsonl(tmp_path / "news.jsonl") == read_jsonl(tmp_path / "plain.jsonl")
    assert all(row["prediction"] == "" for row in read_jsonl(tmp_path / "plain.jsonl"))


def test_a_causal_ending_is_cut_unless_it_ended_or_its_line_did():
    from storyrewrite.generation.generate import _cut

    assert _cut(False, "a b c", seq2seq=False)
    assert not _cut(True, "a", seq2seq=False)  # ended (an eos among its tokens)
    assert not _cut(False, "a\nPremise:", seq2seq=False)  # the ending's line ended
    assert _cut(False, "a\nb", seq2seq=True)  # a seq2seq ending keeps its lines


def test_a_causal_ending_is_its_first_line_and_a_seq2seq_ending_all_of_its_lines():
    from storyrewrite.generation.generate import _clean

    assert _clean(" It rained.\nPremise: The next story", seq2seq=False) == "It rained."
    assert _clean("\n It rained. \n", seq2seq=False) == "It rained."
    assert _clean(" It rained.\nThen it stopped. ", seq2seq=True) == "It rained.\nThen it stopped."


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
    assert _generate(tiny_model_dirs["llama"], instances, out).predictions == len(instances) - 2
    resumed = read_jsonl(out)
    assert resumed[0]["prediction"] == "reused" and resumed[1:] == full[1:]
    # A partial file of other settings (another model, say) is of no use: it goes, and all is generated.
    stale = partial_dir / "resumed-0123456789abcdef.jsonl"
    stale.write_text("".join(json.dumps(row) + "\n" for row in done))
    out.unlink()
    assert _generate(tiny_model_dirs["llama"], instances, out).predictions == len(instances)
    assert read_jsonl(out) == full and not list(partial_dir.glob("resumed-*.jsonl"))


def _partial(tmp_path, name, model_dir, instances, text: str):
    path = tmp_path / ".partial" / f"{name}-{_fingerprint_of(model_dir, instances)}.jsonl"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_a_torn_last_line_is_dropped_and_the_rest_resumed(tmp_path, tiny_model_dirs, small_prepared, capsys):
    instances = load_instances(small_prepared, "timetravel", "test")
    _generate(tiny_model_dirs["llama"], instances, tmp_path / "full.jsonl")
    full = read_jsonl(tmp_path / "full.jsonl")
    lines = [json.dumps(row, ensure_ascii=False) + "\n" for row in full[:3]]
    # A kill in the middle of the third line's write: half of it, no newline.
    _partial(tmp_path, "resumed", tiny_model_dirs["llama"], instances, lines[0] + lines[1] + lines[2][: len(lines[2]) // 2])
    assert _generate(tiny_model_dirs["llama"], instances, tmp_path / "resumed.jsonl").predictions == len(instances) - 2
    assert read_jsonl(tmp_path / "resumed.jsonl") == full
    assert (f"its last line was cut short (an interrupted write) and is dropped; 2 prediction(s) kept, "
            f"{len(instances) - 2} to generate") in capsys.readouterr().err


def test_a_malformed_line_before_the_last_is_corruption_named_by_line(tmp_path, tiny_model_dirs, small_prepared):
    instances = load_instances(small_prepared, "timetravel", "test")
    path = _partial(tmp_path, "broken", tiny_model_dirs["llama"], instances,
                    '{"id": "x", "prediction": "a"}\n{"id": oops}\n{"id": "y", "prediction": "b"}\n')
    with pytest.raises(InputError, match=rf"{path}:2: malformed JSON"):
        _generate(tiny_model_dirs["llama"], instances, tmp_path / "broken.jsonl")


def _fingerprint_of(model_dir, instances):
    from storyrewrite.generation.generate import _fingerprint
    config = GenerateConfig(batch_size=4, num_beams=1, max_new_tokens=6, split="test")
    return _fingerprint(model_dir, instances, config, tiny_models_config("llama"), torch.device("cpu"))


def test_inputs_go_to_the_model_longest_first(tmp_path, tiny_model_dirs, small_prepared, monkeypatch):
    """Similar lengths share a batch, and the longest batch, the memory peak, comes first."""
    from storyrewrite.models.encoding import Encoder

    widths, prompts = [], Encoder.prompts
    monkeypatch.setattr(Encoder, "prompts", lambda self, sources: widths.append(prompts(self, sources)["input_ids"].shape[1])
                        or prompts(self, sources))
    instances = load_instances(small_prepared, "timetravel", "test") + load_instances(small_prepared, "timetravel", "val")
    _generate(tiny_model_dirs["llama"], instances, tmp_path / "out.jsonl", batch_size=1)
    assert len(widths) > 2 and widths == sorted(widths, reverse=True) and widths[0] > widths[-1]


def test_a_partial_file_is_named_by_everything_its_predictions_depend_on(tiny_model_dirs, small_prepared):
    """A run resumes only a partial file of the same weights, instances, generation settings,
    input limit and device type: a change to any of them names another file."""
    from storyrewrite.generation.generate import _fingerprint

    instances = load_instances(small_prepared, "timetravel", "test")
    config, models, cpu = GenerateConfig(batch_size=4, num_beams=1, max_new_tokens=6, split="test"), tiny_models_config("llama"), torch.device("cpu")
    name = _fingerprint(tiny_model_dirs["llama"], instances, config, models, cpu)
    assert _fingerprint(tiny_model_dirs["llama"], [dict(row) for row in instances], config, models, cpu) == name
    edited = [{**instances[0], "counterfactual": instances[0]["counterfactual"] + " Then it rained."}, *instances[1:]]
    others = [_fingerprint(tiny_model_dirs["bart"], instances, config, models, cpu),
              _fingerprint(tiny_model_dirs["llama"], edited, config, models, cpu),
              _fingerprint(tiny_model_dirs["llama"], instances, config.model_copy(update={"num_beams": 2}), models, cpu),
              _fingerprint(tiny_model_dirs["llama"], instances, config, models.model_copy(update={"max_input_tokens": 32}), cpu),
              _fingerprint(tiny_model_dirs["llama"], instances, config, models, torch.device("cuda"))]
    assert len({name, *others}) == 6


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_a_static_kv_cache_gives_the_same_predictions(tmp_path, tiny_model_dirs, small_prepared, kind):
    instances = load_instances(small_prepared, "timetravel", "test")
    for cache in ("dynamic", "static"):
        config = GenerateConfig(batch_size=4, num_beams=1, max_new_tokens=6, split="test", cache=cache)
        generate_predictions(tiny_model_dirs[kind], instances, "timetravel", config, tiny_models_config(kind),
                             tmp_path / f"{cache}.jsonl", seed=0)
    assert read_jsonl(tmp_path / "dynamic.jsonl") == read_jsonl(tmp_path / "static.jsonl")
