import pytest
import torch

from storyrewrite.models.store import load_model
from storyrewrite.training.compile import compile_body


@pytest.mark.slow
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
            for got, want in zip(run(compiled, rows, width), run(eager, rows, width), strict=True):
                torch.testing.assert_close(got, want)
            if number == 0:
                graphs = counter.frame_count
    assert graphs > 0 and counter.frame_count == graphs


@pytest.mark.parametrize("kind", ["llama", "bart"])
@pytest.mark.parametrize("backend, mode, passed", [("inductor", "reduce-overhead", {"mode": "reduce-overhead"}),
                                                   ("inductor", None, {}), ("aot_eager", "reduce-overhead", {})])
def test_compile_modes_reach_inductor_alone(tiny_model_dirs, kind, monkeypatch, backend, mode, passed):
    """`compile: reduce-overhead` compiles every body `compile: true` does, with inductor's mode
    (CUDA graphs); another backend takes no mode (the tests' aot_eager would warn and drop it)."""
    calls = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kwargs: calls.append((type(self).__name__, kwargs)))
    model = load_model(tiny_model_dirs[kind])
    with torch._dynamo.config.patch(recompile_limit=8):  # torch's default
        compile_body(model, backend, mode)
        # Every body's graphs sit under one code object: a DTO-Score+Delta run with validation needs more than 8.
        assert torch._dynamo.config.recompile_limit == 64
    assert len(calls) == (2 if kind == "bart" else 1)
    assert all(kwargs == {"dynamic": True, "backend": backend, **passed} for _, kwargs in calls)
