import pytest
import torch
import torch.nn.functional as F

from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.models.loading import load_model, load_tokenizer

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
    expected = [step_by_step(model, tokenizer, s, t, seq2seq) for s, t in zip(sources, TARGETS)]
    assert scores == pytest.approx(expected, abs=1e-4)
    assert scorer.score(sources[::-1], TARGETS[::-1], batch_size=1) == pytest.approx(scores[::-1], abs=1e-5)


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


def test_soft_sources_run_once_whatever_the_number_of_target_sets(scorer_and_parts):
    """DTO-Score (one target set) runs the scorer's source-reading module once over source and
    target together; the delta variants (two sets) run the sources once and continue them per set.
    Targets of one token (empty endings: the end token alone) go through both paths."""
    scorer, seq2seq = scorer_and_parts[0], scorer_and_parts[3]
    body = scorer.model.get_encoder() if seq2seq else scorer.model.base_model
    calls = []
    handle = body.register_forward_hook(lambda module, inputs, output: calls.append(1))
    probs, mask = _one_hot_sources(scorer, SOURCES)
    one = scorer.score_soft(probs, mask, TARGETS)
    one_pass_calls, calls[:] = len(calls), []
    two = scorer.score_soft_many(probs, mask, [TARGETS, TARGETS[::-1]])
    two_sets_calls = len(calls)
    empty = scorer.score_soft_many(probs, mask, [[""] * 4])[0], scorer.score_soft_many(probs, mask, [[""] * 4, TARGETS])
    handle.remove()
    assert one_pass_calls == 1
    assert two_sets_calls == (1 if seq2seq else 2)  # causal: the sources once, then both sets from their cache
    torch.testing.assert_close(two[0], one, atol=1e-5, rtol=1e-5)
    assert empty[0].tolist() == pytest.approx(scorer.score(SOURCES, [""] * 4), abs=1e-4)
    torch.testing.assert_close(empty[1][0], empty[0], atol=1e-5, rtol=1e-5)
