import pytest

from storyrewrite.data.prepare import load_instances
from storyrewrite.llm.backends import LocalBackend, Reply
from storyrewrite.llm.cache import ResponseCache
from storyrewrite.llm.modes import ExampleSource
from storyrewrite.llm.run import prompt_chars, run_mode
from storyrewrite.params import LLMConfig, build, load_yaml

from helpers import ROOT, redrawn


def _config(**changes) -> LLMConfig:
    """params.yaml's `llm` section, its templates found from any working directory, with `changes`."""
    section = load_yaml(ROOT / "params.yaml")["llm"]
    return build(LLMConfig, {**section, "templates": {k: str(ROOT / v) for k, v in section["templates"].items()}, **changes}, "llm")


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_local_chat_model_runs_each_distinct_prompt_once_then_from_cache(kind, tiny_model_dirs, small_prepared, tmp_path):
    config = _config(max_new_tokens=5)
    test = load_instances(small_prepared, "timetravel", "test")  # 6 instances of 2 stories
    train = load_instances(small_prepared, "timetravel", "train")
    backend = LocalBackend(tiny_model_dirs[kind], "tiny")
    cache = ResponseCache(tmp_path)
    source = ExampleSource(train, "timetravel", config, 0)
    predictions, usage = run_mode("zero_shot", test, source, backend, cache)
    # The random Llama repeats one token to the limit; the random BART ends at once (its end token
    # alone, which the count leaves out with the decoder-start token it did not generate).
    assert usage.requests == 2 and usage.cache_hits == 0 and usage.prompts == 2
    assert usage.completion_tokens == {"llama": 10, "bart": 0}[kind]
    assert [p["id"] for p in predictions] == [r["id"] for r in test]
    # Batched generation gives what one prompt at a time gives.
    single = [backend.complete(m, 5, 0.0).text for m in [backend_messages(config, r) for r in test[::3]]]
    assert [p["prediction"] for p in predictions[::3]] == [" ".join(s.split("\n\n")[0].split()) for s in single]
    # A reply is cut at the limit when a higher one gives it more tokens (the random Llama repeats a
    # token; the random BART ends at once): each story's count stands for its three instances.
    tokens = [[backend.complete(backend_messages(config, r), limit, 0.0).completion_tokens for limit in (5, 20)] for r in test[::3]]
    assert usage.cut_at_limit == 3 * sum(short < long for short, long in tokens) == {"llama": 6, "bart": 0}[kind]
    # A rerun finds every reply cached: the same predictions, and no weights loaded.
    rerun = LocalBackend(tiny_model_dirs[kind], "tiny")
    again, cached = run_mode("zero_shot", test, source, rerun, cache)
    assert again == predictions and cached.requests == 0 and cached.cache_hits == 2
    assert not rerun.loaded and backend.loaded
    # In instance order instead of longest first: the same predictions.
    unsorted, _ = run_mode("zero_shot", test, source, backend, ResponseCache(tmp_path / "unsorted"), length_sorted=False)
    assert unsorted == predictions
    # What the predictions cost is counted the same from the cache as from the model.
    assert cached.metrics() == usage.metrics()
    assert usage.metrics()["instances"] == 6 and usage.prompt_tokens > 0


def test_a_temperature_above_zero_samples_and_zero_decodes_greedily(tiny_model_dirs, small_prepared):
    import torch

    config = _config()
    backend = LocalBackend(tiny_model_dirs["llama"], "tiny")
    prompt = backend_messages(config, load_instances(small_prepared, "timetravel", "test")[0])
    greedy = [backend.complete(prompt, 8, 0.0).text for _ in range(2)]
    with torch.random.fork_rng():  # (the draws seeded here, the global random state left as it was)
        torch.manual_seed(0)
        sampled = [backend.complete(prompt, 8, 1.0).text for _ in range(2)]
    assert greedy[0] == greedy[1] and sampled[0] != sampled[1] and greedy[0] not in sampled


def test_a_reply_that_used_every_token_is_cut_unless_its_ending_came_first():
    from storyrewrite.llm.run import cut_at_limit

    assert cut_at_limit({"text": "She went home and", "completion_tokens": 5}, 5)
    assert not cut_at_limit({"text": "She went home.", "completion_tokens": 4}, 5)
    # clean_reply keeps the first paragraph: the ending was finished before the limit.
    assert not cut_at_limit({"text": "She went home.\n\nRewritten because", "completion_tokens": 5}, 5)
    assert not cut_at_limit({"text": "She went home.\n\n", "completion_tokens": 5}, 5)  # (a server's reply is not stripped)
    assert cut_at_limit({"text": "\n\nShe went home and", "completion_tokens": 5}, 5)  # a break before the ending tells nothing


PROMPTS = [[{"role": "user", "content": text}] for text in (
    "Tom went fishing.", "Ann baked a cake for the fair and it burnt badly.", "She sang.",
    "The dog barked at the mailman all day.")]


def _sharper(directory, out):
    """The tiny model of `directory` drawn again with weights of spread 0.2: its greedy replies
    then depend on the prompt (the default 0.02 gives every prompt one token repeated)."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    from storyrewrite.models.store import is_seq2seq

    return LocalBackend(redrawn(directory, out, AutoModelForSeq2SeqLM if is_seq2seq(directory) else AutoModelForCausalLM), "tiny")


def test_each_reply_in_a_batch_counts_its_tokens_before_its_end_token(tiny_model_dirs, tmp_path):
    """Rows of one batch that end at different lengths (a row that ends sooner is padded after
    its end token): each counts the tokens before its end, as it does alone, unpadded."""
    backend = _sharper(tiny_model_dirs["llama"], tmp_path)
    runs = []  # each prompt's greedy reply to the limit, one prompt at a time
    for prompt in PROMPTS:
        inputs = backend.encode([prompt])
        output = backend.model.generate(**inputs, max_new_tokens=8, do_sample=False, pad_token_id=backend.tokenizer.pad_token_id)
        runs.append(output[0, inputs["input_ids"].shape[1]:].tolist())
    end = runs[1][0]  # a second end token: the second reply ends at once, others later or never
    backend.model.generation_config.eos_token_id = [backend.tokenizer.eos_token_id, end]
    expected = [run.index(end) if end in run else 8 for run in runs]
    assert len(set(expected)) >= 3 and 0 in expected and 8 in expected
    assert [reply.completion_tokens for _, reply in sorted(backend.complete_many(PROMPTS, 8, 0.0))] == expected
    assert [backend.complete(prompt, 8, 0.0).completion_tokens for prompt in PROMPTS] == expected


def test_a_seq2seq_reply_whose_end_was_forced_at_the_limit_used_every_token(tiny_model_dirs, tmp_path):
    """BART forces its end token into the last place (`forced_eos_token_id`): a reply cut there
    counts every token, so that the LLM stage counts it as cut at the limit."""
    from storyrewrite.llm.run import cut_at_limit

    backend = _sharper(tiny_model_dirs["bart"], tmp_path)
    backend.model.generation_config.forced_eos_token_id = backend.tokenizer.eos_token_id
    replies = [reply for _, reply in sorted(backend.complete_many(PROMPTS, 8, 0.0))]
    inputs = backend.encode(PROMPTS)
    output = backend.model.generate(**inputs, max_new_tokens=8, do_sample=False, pad_token_id=backend.tokenizer.pad_token_id)
    assert (output[:, -1] == backend.tokenizer.eos_token_id).all() and output.shape[1] == 1 + 8  # decoder start + 8
    assert [reply.completion_tokens for reply in replies] == [8] * len(PROMPTS)
    assert all(cut_at_limit({"text": reply.text, "completion_tokens": reply.completion_tokens}, 8) for reply in replies)


def backend_messages(config, row):
    from storyrewrite.llm.prompts import Template, messages
    return messages(Template.read(config.templates["timetravel"]), row, None)


class Recorder:
    """A backend that answers each prompt with its length and records the batches it was sent."""
    name, model_id, label, batch_size, retries = "recorder", "recorder", "recorder", 5, 0

    def __init__(self):
        self.batches = []

    def complete_many(self, prompts, max_new_tokens, temperature):
        self.batches.append([prompt_chars(p) for p in prompts])
        for position in reversed(range(len(prompts))):  # out of order, as a server's threads answer
            yield position, Reply(f"{prompt_chars(prompts[position])} characters", 1, 1, 0.0)


@pytest.mark.parametrize("length_sorted", [True, False])
def test_prompts_go_to_the_backend_longest_first_and_come_back_in_instance_order(length_sorted, small_prepared, tmp_path):
    config = _config()
    base = load_instances(small_prepared, "timetravel", "test")[0]
    # 12 stories of different lengths in no order, and the first asked again (answered once).
    extra = [5, 0, 9, 2, 11, 7, 1, 10, 3, 8, 4, 6, 5]
    instances = [{**base, "id": f"s{k}:{i}", "story_id": f"s{k}", "premise": base["premise"] + " And then" * k}
                 for i, k in enumerate(extra)]
    source = ExampleSource(instances, "timetravel", config, 0)
    backend = Recorder()
    predictions, usage = run_mode("zero_shot", instances, source, backend, ResponseCache(tmp_path), length_sorted)
    lengths = [prompt_chars(backend_messages(config, row)) for row in instances]
    assert [len(b) for b in backend.batches] == [5, 5, 2] and usage.requests == 12
    sent = [n for batch in backend.batches for n in batch]
    assert sent == (sorted(set(lengths), reverse=True) if length_sorted else lengths[:12])
    # Each instance gets its own prompt's reply, whatever the order of sending and answering.
    assert [p["id"] for p in predictions] == [r["id"] for r in instances]
    assert [p["prediction"] for p in predictions] == [f"{n} characters" for n in lengths]
