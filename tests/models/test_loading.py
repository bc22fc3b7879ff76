import json

import pytest
import torch

from storyrewrite.io import InputError
from storyrewrite.params import ModelsConfig
from storyrewrite.models.loading import (
    compile_body, is_seq2seq, load_from_source, load_model, load_tokenizer, materialise, resolve_model_dir,
)


def test_materialised_tiny_models(tiny_model_dirs):
    assert is_seq2seq(tiny_model_dirs["bart"]) and not is_seq2seq(tiny_model_dirs["llama"])
    bart_tok = load_tokenizer(tiny_model_dirs["bart"])
    assert bart_tok.sep_token == "</s>"
    llama_tok = load_tokenizer(tiny_model_dirs["llama"])
    assert llama_tok.pad_token == llama_tok.eos_token  # causal LMs get eos as pad


def test_materialise_round_trip_is_exact(tmp_path):
    model, tokenizer = load_from_source("tiny:llama", seed=0)
    materialise(ModelsConfig("tiny:llama", "tiny:llama", 32, 16), tmp_path, seed=0)
    assert json.loads((tmp_path / "index.json").read_text()) == {"generator": "tiny--llama", "scorer": "tiny--llama"}
    reloaded = load_model(resolve_model_dir(tmp_path, "scorer"))
    ids = torch.tensor([tokenizer("Once upon a time")["input_ids"]])
    torch.testing.assert_close(model(input_ids=ids).logits, reloaded(input_ids=ids).logits, atol=0, rtol=0)


def test_generator_and_scorer_must_share_a_vocabulary(tmp_path):
    with pytest.raises(InputError, match=r"`models.generator` \(tiny:bart, 50262 tokens\) and `models.scorer` \(tiny:llama, 50257 tokens\) do not share a vocabulary"):
        materialise(ModelsConfig("tiny:bart", "tiny:llama", 32, 16), tmp_path, seed=0)


def test_unknown_specs_list_valid_ones():
    with pytest.raises(InputError, match=r"unknown tiny model `tiny:t5`; valid: tiny:bart, tiny:llama"):
        load_from_source("tiny:t5")
    with pytest.raises(InputError, match=r"unknown bundled model `bundled:gpt5`; valid: bundled:smollm2-135m-instruct"):
        load_from_source("bundled:gpt5")


def test_resolve_model_dir_rejects_a_non_model(tmp_path):
    with pytest.raises(InputError, match="not a model directory"):
        resolve_model_dir(tmp_path)


@pytest.mark.slow
def test_bundled_smollm2_materialises_exactly(tmp_path):
    """The GGUF model is de-quantised once; the saved copy gives the same logits."""
    model, tokenizer = load_from_source("bundled:smollm2-135m-instruct")
    assert type(model).__name__ == "LlamaForCausalLM" and len(tokenizer) == 49152
    from storyrewrite.models.loading import save_model
    save_model(model, tokenizer, tmp_path / "smol")
    assert "quantization_config" not in json.loads((tmp_path / "smol" / "config.json").read_text())
    reloaded = load_model(tmp_path / "smol")
    ids = torch.tensor([tokenizer("Premise: Ann baked a cake.\nEdited ending:")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, reloaded(input_ids=ids).logits, atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_a_compiled_body_gives_the_eager_values_and_compiles_once_for_every_batch_shape(tiny_model_dirs, kind):
    """What `compile: true` compiles (a causal LM's body; a seq2seq LM and its encoder) returns
    the eager hidden states, and batches of other sizes and lengths reuse the first graphs."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    eager, compiled = load_model(tiny_model_dirs[kind]), load_model(tiny_model_dirs[kind])
    counter = CompileCounterWithBackend("eager")
    compile_body(compiled, counter)

    def run(model, rows, width):
        ids = torch.randint(5, 200, (rows, width), generator=torch.Generator().manual_seed(rows * width))
        mask = torch.ones_like(ids)
        mask[0, : width // 3] = 0  # padding in the first row
        if kind == "llama":
            return [model.base_model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state]
        encoded = model.get_encoder()(input_ids=ids, attention_mask=mask)
        decoded = model(encoder_outputs=encoded, attention_mask=mask, decoder_input_ids=ids[:, :5], use_cache=False)
        return [encoded.last_hidden_state, decoded.logits]

    with torch.no_grad():
        for number, (rows, width) in enumerate([(2, 9), (3, 14), (4, 6)]):
            for got, want in zip(run(compiled, rows, width), run(eager, rows, width)):
                torch.testing.assert_close(got, want)
            if number == 0:
                graphs = counter.frame_count
    assert graphs > 0 and counter.frame_count == graphs
