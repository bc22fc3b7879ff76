import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForSeq2SeqLM

from storyrewrite.io import InputError
from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.models.store import load_model, load_tokenizer

from helpers import host_reads, redrawn

SOURCES = ["Tom lost his keys. He found them.", "A short one.", "", "The cat sat on the mat and then it slept all day long."]
TARGETS = ["He was happy.", "Then it rained all afternoon in the town.", "Nothing.", "It woke up."]


def step_by_step(model, tokenizer, source: str, target: str, seq2seq: bool) -> float:
    """M(a, b) one target token at a time, from the tokenizer and the model alone."""
    if seq2seq:
        source_ids = tokenizer(source)["input_ids"]
        target_ids = tokenizer(text_target=target)["input_ids"]  # <s> … </s>: the end token counts
    else:
        source_ids = tokenizer(source)["input_ids"] or [tokenizer.bos_token_id]  # empty: start-of-text
        target_ids = tokenizer(" " + target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    total = 0.0
    with torch.no_grad():
        for t, token in enumerate(target_ids):
            if seq2seq:
                decoder = [model.config.decoder_start_token_id] + target_ids[:t]
                logits = model(input_ids=torch.tensor([source_ids]), decoder_input_ids=torch.tensor([decoder])).logits
            else:
                logits = model(input_ids=torch.tensor([source_ids + target_ids[:t]])).logits
            total += F.log_softmax(logits[0, -1].double(), dim=-1)[token].item()
    return total / len(target_ids)


@pytest.fixture(scope="module", params=["bart", "llama"])
def scorer_and_parts(request, tiny_model_dirs):
    directory = tiny_model_dirs[request.param]
    return LMScorer.from_dir(directory), load_model(directory).eval(), load_tokenizer(directory), request.param == "bart"


def test_score_equals_step_by_step_formula(scorer_and_parts):
    scorer, model, tokenizer, seq2seq = scorer_and_parts
    sources = SOURCES  # one of them empty, as an empty prediction would be
    scores = scorer.score(sources, TARGETS, batch_size=3)
    expected = [step_by_step(model, tokenizer, s, t, seq2seq) for s, t in zip(sources, TARGETS, strict=True)]
    assert scores == pytest.approx(expected, abs=1e-4)
    assert scorer.score(sources[::-1], TARGETS[::-1], batch_size=1) == pytest.approx(scores[::-1], abs=1e-5)


def test_scoring_reads_the_device_once(scorer_and_parts):
    """Every batch is queued before the values come back in one copy (`.tolist()`, not an
    operator): no read per batch."""
    scorer = scorer_and_parts[0]
    assert host_reads(lambda: scorer.score(SOURCES, TARGETS, batch_size=1)) == []


def _one_hot_sources(scorer, sources):
    ids = scorer.encoder.source_ids(sources)
    width, vocab = max(map(len, ids)), scorer.model.get_input_embeddings().weight.shape[0]
    probs = torch.zeros(len(ids), width, vocab)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for i, row in enumerate(ids):
        probs[i, torch.arange(len(row)), torch.tensor(row)] = 1.0
        mask[i, : len(row)] = 1
    return probs, mask


def test_score_soft_with_one_hot_sources_equals_score(scorer_and_parts):
    scorer = scorer_and_parts[0]
    sources = SOURCES
    probs, mask = _one_hot_sources(scorer, sources)
    soft = scorer.score_soft(probs, mask, TARGETS)
    assert soft.tolist() == pytest.approx(scorer.score(sources, TARGETS), abs=1e-4)
    many = scorer.score_soft_many(probs, mask, [TARGETS, TARGETS[::-1]])
    torch.testing.assert_close(many[0], soft)
    assert many[1].tolist() == pytest.approx(scorer.score(sources, TARGETS[::-1]), abs=1e-4)


def test_soft_sources_are_scaled_as_the_scorer_scales_its_token_embeddings(tiny_model_dirs, tmp_path):
    """A scorer that scales its token embeddings (BART with `scale_embedding`: × √d_model) reads
    soft sources as `inputs_embeds`, which it does not scale itself: one-hot sources must still
    score as their tokens do."""
    # (weights of the default spread 0.02 leave the scores nearly blind to the source)
    scorer = LMScorer.from_dir(redrawn(tiny_model_dirs["bart"], tmp_path, AutoModelForSeq2SeqLM, scale_embedding=True))
    assert scorer.model.get_input_embeddings().embed_scale == pytest.approx(math.sqrt(scorer.model.config.d_model))
    probs, mask = _one_hot_sources(scorer, SOURCES)
    assert scorer.score_soft(probs, mask, TARGETS).tolist() == pytest.approx(scorer.score(SOURCES, TARGETS), abs=1e-4)


def test_gradients_reach_source_probs_and_not_the_scorer(scorer_and_parts):
    scorer = scorer_and_parts[0]
    probs, mask = _one_hot_sources(scorer, SOURCES[:2])
    logits = torch.log(probs + 1e-3).requires_grad_(True)
    value = scorer.score_soft(torch.softmax(logits, dim=-1), mask, TARGETS[:2]).sum()
    value.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    assert all(p.grad is None and not p.requires_grad for p in scorer.model.parameters())


def test_identical_pairs_are_scored_once(scorer_and_parts):
    scorer, seq2seq = scorer_and_parts[0], scorer_and_parts[3]
    rows = []  # rows run through the source-reading module (the encoder, or the causal body)
    body = scorer.model.get_encoder() if seq2seq else scorer.model.base_model
    handle = body.register_forward_hook(lambda module, inputs, output: rows.append(output[0].shape[0]))
    scores = scorer.score(SOURCES[:2] * 3, TARGETS[:2] * 3, batch_size=16)
    handle.remove()
    assert scores == scorer.score(SOURCES[:2], TARGETS[:2]) * 3
    assert sum(rows) == 2  # two distinct pairs, not six


def test_a_repeated_source_is_read_once_for_all_its_targets(tiny_model_dirs):
    """Causal scorer: pairs whose sources repeat (a prediction against a story's three reference
    endings) get each pair's own value, as scored alone and step by step, with SDPA, eager
    attention (an additive mask) and the 2D mask (models whose masks transformers builds);
    one-token targets (empty endings) and a source whose targets fill more than a batch
    included. The body reads each distinct source of a batch once, and nothing is read back
    from the device before the end."""
    sources = [SOURCES[0]] * 3 + [SOURCES[1]] * 2 + [SOURCES[2]] + [SOURCES[3]] * 5
    targets = [*TARGETS[:3], "", TARGETS[3], TARGETS[0], TARGETS[1], TARGETS[2], "", TARGETS[3] + " Then more.", TARGETS[0]]
    directory = tiny_model_dirs["llama"]
    model, tokenizer = load_model(directory).eval(), load_tokenizer(directory)
    expected = [step_by_step(model, tokenizer, s, t, seq2seq=False) for s, t in zip(sources, targets, strict=True)]
    for implementation, window in (("eager", None), ("sdpa", 4096), ("sdpa", None)):
        scorer = LMScorer.from_dir(directory)
        scorer.model.config._attn_implementation = implementation
        # A sliding window (longer than any row: the same values) makes the mask 2D (takes_4d_masks).
        scorer.model.config.sliding_window = window
        alone = [scorer.score([s], [t], batch_size=1)[0] for s, t in zip(sources, targets, strict=True)]
        assert alone == pytest.approx(expected, abs=1e-4)
        for batch_size in (4, 16):
            assert scorer.score(sources, targets, batch_size=batch_size) == pytest.approx(alone, abs=1e-5)
    reads = []  # (of the last scorer: SDPA, 4D masks)
    handle = scorer.model.base_model.register_forward_hook(
        lambda module, args, kwargs, output: reads.append((kwargs["input_ids"].shape[0], kwargs.get("past_key_values") is None)),
        with_kwargs=True)
    scorer.score(sources, targets, batch_size=16)
    handle.remove()
    assert reads == [(4, True), (len(sources), False)]  # the 4 distinct sources, then every target
    assert host_reads(lambda: scorer.score(sources, targets, batch_size=4)) == []


def test_a_repeated_source_is_encoded_once_for_all_its_targets(tiny_model_dirs):
    """Seq2seq scorer: pairs whose sources repeat get each pair's own value, as scored alone and
    step by step, with SDPA and eager attention (an additive mask), in batches that split a
    source's targets. The encoder reads each distinct source of a batch once; the decoder reads
    every target; nothing is read back from the device before the end."""
    sources = [SOURCES[0]] * 3 + [SOURCES[1]] * 2 + [SOURCES[2]] + [SOURCES[3]] * 5
    targets = [*TARGETS[:3], "", TARGETS[3], TARGETS[0], TARGETS[1], TARGETS[2], "", TARGETS[3] + " Then more.", TARGETS[0]]
    directory = tiny_model_dirs["bart"]
    model, tokenizer = load_model(directory).eval(), load_tokenizer(directory)
    expected = [step_by_step(model, tokenizer, s, t, seq2seq=True) for s, t in zip(sources, targets, strict=True)]
    for implementation in ("eager", "sdpa"):
        scorer = LMScorer.from_dir(directory)
        scorer.model.config._attn_implementation = implementation
        alone = [scorer.score([s], [t], batch_size=1)[0] for s, t in zip(sources, targets, strict=True)]
        assert alone == pytest.approx(expected, abs=1e-4)
        for batch_size in (4, 16):
            assert scorer.score(sources, targets, batch_size=batch_size) == pytest.approx(alone, abs=1e-5)
    encoded, decoded = [], []  # rows through the encoder and the decoder (of the last scorer: SDPA)
    hooks = [scorer.model.get_encoder().register_forward_hook(lambda module, inputs, output: encoded.append(output[0].shape[0])),
             scorer.model.get_decoder().register_forward_hook(lambda module, inputs, output: decoded.append(output[0].shape[0]))]
    scorer.score(sources, targets, batch_size=16)
    for hook in hooks:
        hook.remove()
    assert (encoded, decoded) == ([4], [len(sources)])  # the 4 distinct sources, then every target
    assert host_reads(lambda: scorer.score(sources, targets, batch_size=4)) == []


def test_soft_sources_run_once_whatever_the_number_of_target_sets(scorer_and_parts):
    """The scorer's source-reading module (a seq2seq encoder, a causal LM's body) runs once
    whatever the number of target sets: the causal body reads each source followed by all its
    sets in one pass. Targets of one token (empty endings: the end token alone) included."""
    scorer, seq2seq = scorer_and_parts[0], scorer_and_parts[3]
    body = scorer.model.get_encoder() if seq2seq else scorer.model.base_model
    calls = []
    handle = body.register_forward_hook(lambda module, inputs, output: calls.append(1))
    probs, mask = _one_hot_sources(scorer, SOURCES)
    one = scorer.score_soft(probs, mask, TARGETS)
    one_pass_calls, calls[:] = len(calls), []
    three = scorer.score_soft_many(probs, mask, [TARGETS, TARGETS[::-1], TARGETS[1:] + TARGETS[:1]])
    three_sets_calls = len(calls)
    empty = scorer.score_soft_many(probs, mask, [[""] * 4])[0], scorer.score_soft_many(probs, mask, [[""] * 4, TARGETS])
    handle.remove()
    assert one_pass_calls == 1 and three_sets_calls == 1
    torch.testing.assert_close(three[0], one, atol=1e-5, rtol=1e-5)
    for scores, targets in zip(three[1:], (TARGETS[::-1], TARGETS[1:] + TARGETS[:1]), strict=True):
        assert scores.tolist() == pytest.approx(scorer.score(SOURCES, targets), abs=1e-4)
    assert empty[0].tolist() == pytest.approx(scorer.score(SOURCES, [""] * 4), abs=1e-4)
    torch.testing.assert_close(empty[1][0], empty[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(empty[1][1], one, atol=1e-5, rtol=1e-5)


def test_target_sets_in_one_pass_give_each_set_its_own_values_and_gradients(tiny_model_dirs):
    """Causal scorer, two target sets of different lengths in one pass under the block mask:
    scores and gradients with respect to the soft sources equal those of each set scored alone,
    with SDPA and with eager attention (whose mask is additive). An implementation that takes
    no custom mask is refused, naming the valid ones."""
    sets = [TARGETS, [t + " And more words here." for t in TARGETS[::-1]]]

    def scorer_and_sources(implementation):
        scorer = LMScorer.from_dir(tiny_model_dirs["llama"])
        scorer.model.config._attn_implementation = implementation
        probs, mask = _one_hot_sources(scorer, SOURCES)
        return scorer, torch.log(probs + 0.05), mask

    def value_and_grad(fn, logits):
        source = logits.clone().requires_grad_(True)
        values = fn(torch.softmax(source, dim=-1))
        (values[0] * 2 - values[1]).sum().backward()  # Score+Delta's combination
        return [v.detach() for v in values], source.grad

    def together_and_alone(implementation):
        scorer, logits, mask = scorer_and_sources(implementation)
        return (value_and_grad(lambda p: scorer.score_soft_many(p, mask, sets), logits),
                value_and_grad(lambda p: [scorer.score_soft(p, mask, s) for s in sets], logits))

    results = {}
    for implementation in ("sdpa", "eager"):
        together, alone = together_and_alone(implementation)
        for a, b in zip(together[0], alone[0], strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(together[1], alone[1], atol=1e-6, rtol=1e-4)
        results[implementation] = together
    torch.testing.assert_close(results["eager"][0], results["sdpa"][0], atol=1e-5, rtol=1e-5)
    scorer, logits, mask = scorer_and_sources("flash_attention_2")
    with pytest.raises(InputError, match="'flash_attention_2'.*valid implementations: sdpa .*eager"):
        scorer.score_soft_many(torch.softmax(logits, dim=-1), mask, sets)
