import math

import pytest
import torch

from storyrewrite.models.encoding import Encoder, causal_mask, pad_rows, target_logits
from storyrewrite.models.store import load_model, load_tokenizer
from storyrewrite.objectives.nll import nll_loss

from helpers import host_reads

SOURCES = ["Premise: A short one.\nEdited ending:", "Premise: A much longer prompt with many more words in it.\nEdited ending:"]
TARGETS = [" It ended well, after all.", " No."]


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_target_logits_match_unpadded_forward(tiny_model_dirs, kind):
    """Padding and the shared layout must not change any logit at a target position."""
    directory = tiny_model_dirs[kind]
    tokenizer, model = load_tokenizer(directory), load_model(directory).eval()
    encoder = Encoder(tokenizer, kind == "bart", max_input_tokens=64, max_output_tokens=32)
    batch = encoder.batch(SOURCES, TARGETS)
    logits = target_logits(model, batch)
    assert logits.shape[:2] == batch["target_ids"].shape
    for i in range(2):
        source, target = encoder.source_ids([SOURCES[i]])[0], encoder.target_ids([TARGETS[i]])[0]
        n = len(target)
        assert batch["target_ids"][i, :n].tolist() == target
        assert batch["target_mask"][i].sum().item() == n
        with torch.no_grad():
            if kind == "bart":
                decoder_in = [model.config.decoder_start_token_id] + target[:-1]
                alone = model(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([decoder_in])).logits[0]
            else:
                alone = model(input_ids=torch.tensor([source + target])).logits[0, len(source) - 1 : -1]
        torch.testing.assert_close(logits[i, :n].detach(), alone, atol=1e-5, rtol=1e-4)


def test_targets_end_with_eos_and_truncate_keeping_it(tiny_model_dirs):
    tokenizer = load_tokenizer(tiny_model_dirs["llama"])
    encoder = Encoder(tokenizer, False, max_input_tokens=4, max_output_tokens=3)
    assert encoder.target_ids([" one two three four five"])[0][-1] == tokenizer.eos_token_id
    assert len(encoder.target_ids([" one two three four five"])[0]) == 3
    # Causal prompts keep their end (the label to continue after).
    assert encoder.source_ids(["a b c d e f g h"])[0] == tokenizer("a b c d e f g h")["input_ids"][-4:]


def test_seq2seq_sources_truncate_as_the_tokenizer_does(tiny_model_dirs):
    """A seq2seq source keeps its start and its end token, as the tokenizer's own truncation
    would; one that fits stays whole."""
    tokenizer = load_tokenizer(tiny_model_dirs["bart"])
    encoder = Encoder(tokenizer, True, max_input_tokens=4, max_output_tokens=3)
    long, short = "a b c d e f g h", "a b"
    truncated = tokenizer(long, truncation=True, max_length=4)["input_ids"]
    assert encoder.source_ids([long, short]) == [truncated, tokenizer(short)["input_ids"]]
    assert truncated[0] == tokenizer.bos_token_id and truncated[-1] == tokenizer.eos_token_id
    assert truncated[1:3] == tokenizer(long)["input_ids"][1:3]


def test_rows_pad_to_the_next_multiple_of_the_bucket_and_no_further():
    ids, mask = pad_rows([[7, 8, 9, 10], [11]], 0, left=True, multiple=4)
    assert ids.tolist() == [[7, 8, 9, 10], [0, 0, 0, 11]] and mask.tolist() == [[1, 1, 1, 1], [0, 0, 0, 1]]
    ids, mask = pad_rows([[7, 8, 9, 10, 12], [11]], 0, left=False, multiple=4)
    assert ids.shape == (2, 8) and mask.sum(dim=1).tolist() == [5, 1] and ids[1].tolist() == [11] + [0] * 7
    assert pad_rows([[7, 8, 9]], 0, left=False)[0].tolist() == [[7, 8, 9]]  # no buckets: the longest row


def test_nll_loss_hand_computed():
    # Two rows, vocabulary of 3; row 2's second position is padding and must not count.
    logits = torch.tensor([[[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]], [[2.0, 0.0, 0.0], [9.0, 9.0, 9.0]]])
    target = torch.tensor([[0, 2], [0, 1]])
    mask = torch.tensor([[1, 1], [1, 0]])
    log_p = [
        -math.log(3),
        3 - math.log(math.exp(1) + math.exp(2) + math.exp(3)),
        2 - math.log(math.exp(2) + 2),
    ]
    assert nll_loss(logits, target, mask).item() == pytest.approx(-sum(log_p) / 3, rel=1e-6)


def test_tail_logits_of_a_soft_capped_model_match_its_own_forward():
    """output_logits soft-caps as the model's forward does (Gemma-2's final_logit_softcapping),
    so causal_tail_logits and the scorer's prefix path agree with the plain forward."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from storyrewrite.models.encoding import causal_tail_logits

    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16, final_logit_softcapping=0.5)
    model = Gemma2ForCausalLM(config).eval()
    input_ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        full = model(input_ids=input_ids).logits
        tail = causal_tail_logits(model, 3, input_ids=input_ids)
        uncapped = model.get_output_embeddings()(model.base_model(input_ids=input_ids).last_hidden_state)
    assert not torch.allclose(uncapped[:, -3:], full[:, -3:], atol=1e-3)  # the cap changes these logits
    torch.testing.assert_close(tail, full[:, -3:], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("sources", [SOURCES, [SOURCES[1], SOURCES[1]]], ids=["padded", "no padding"])
def test_causal_mask_gives_the_logits_of_transformers_own_mask(tiny_model_dirs, implementation, sources):
    """causal_tail_logits passes a 4D mask (causal_mask): at every real position, the hidden
    states transformers computes from the 2D mask, bit for bit where the batch holds padding (the
    same masked attention), within rounding where it does not (transformers then asks SDPA for its
    causal kernel)."""
    directory = tiny_model_dirs["llama"]
    model = load_model(directory).eval()
    model.config._attn_implementation = implementation
    batch = Encoder(load_tokenizer(directory), False, 64, 32).batch(sources, [TARGETS[0], TARGETS[0]])
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    with torch.no_grad():
        ours = model.base_model(**inputs | {"attention_mask": causal_mask(model, batch["attention_mask"])}).last_hidden_state
        theirs = model.base_model(**inputs).last_hidden_state
    real = batch["attention_mask"].bool()
    if real.all():
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)
    else:
        assert torch.equal(ours[real], theirs[real])


def test_causal_mask_leaves_sliding_window_models_their_2d_mask(tiny_model_dirs):
    model = load_model(tiny_model_dirs["llama"])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    assert causal_mask(model, mask).shape == (2, 1, 3, 3)
    model.config.sliding_window = 2  # transformers masks such layers itself, per layer
    assert causal_mask(model, mask) is mask


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_a_forward_never_reads_the_device(tiny_model_dirs, kind):
    """The generator and scorer forwards of training and scoring run without a host read (on a GPU,
    the host would wait for the GPU there); transformers' 2D-mask path reads once or more."""
    directory = tiny_model_dirs[kind]
    model = load_model(directory).eval()
    batch = Encoder(load_tokenizer(directory), kind == "bart", 64, 32).batch(SOURCES, TARGETS)
    inputs = ({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
               "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels=batch["target_ids"])} if kind == "bart"
              else {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")})
    with torch.no_grad():
        assert host_reads(lambda: target_logits(model, batch)) == []
        assert host_reads(lambda: model(**inputs))


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_seq2seq_masks_give_the_logits_of_transformers_own(tiny_model_dirs, implementation):
    """key_mask and decoder_mask (BART): the logits transformers computes from the 2D source mask
    and no decoder mask, at every position."""
    directory = tiny_model_dirs["bart"]
    model = load_model(directory).eval()
    model.config._attn_implementation = implementation
    batch = Encoder(load_tokenizer(directory), True, 64, 32).batch(SOURCES, TARGETS)
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels=batch["target_ids"])
    with torch.no_grad():
        ours = target_logits(model, batch)
        theirs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_input_ids).logits
    assert batch["attention_mask"].min() == 0  # the sources are padded
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)
