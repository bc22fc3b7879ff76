import math

import pytest
import torch

from storyrewrite.data.formatting import causal_prompt
from storyrewrite.io import InputError
from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.models.encoding import Encoder, target_logits
from storyrewrite.models.loading import load_model, load_tokenizer
from storyrewrite.objectives import ObjectiveContext, get_objective
from storyrewrite.objectives.cpo import cpo_loss
from storyrewrite.objectives.dto import gumbel_softmax
from storyrewrite.params import CPOConfig, DTOConfig
from storyrewrite.training.data import Collate

from conftest import read_jsonl, tiny_models_config, tiny_train_config


def test_cpo_loss_hand_computed():
    chosen, rejected = torch.tensor([-10.0, -4.0]), torch.tensor([-12.0, -3.0])
    nll = torch.tensor(0.7)
    beta, lam = 0.5, 2.0
    # −mean log σ(β·Δ) + λ·NLL with Δ = (2, −1): log σ(1) and log σ(−0.5)
    expected = -(math.log(1 / (1 + math.exp(-1.0))) + math.log(1 / (1 + math.exp(0.5)))) / 2 + lam * 0.7
    assert cpo_loss(chosen, rejected, nll, beta, lam).item() == pytest.approx(expected, rel=1e-6)


def test_cpo_objective_uses_one_forward_for_chosen_and_rejected(tiny_model_dirs, small_prepared):
    directory = tiny_model_dirs["llama"]
    model = load_model(directory).eval()
    encoder = Encoder(load_tokenizer(directory), False, 96, 40)
    rows = read_jsonl(small_prepared / "timetravel" / "train.jsonl")[:2]
    batch = Collate(encoder, "timetravel", pairs=True)(rows)
    loss = get_objective("cpo").build(ObjectiveContext(dto=None, cpo=CPOConfig(beta=0.5, lambda_=2.0)))
    calls = []
    handle = model.base_model.register_forward_hook(lambda *args: calls.append(1))  # the transformer body
    with torch.no_grad():
        value = loss(model, batch, 0)
    handle.remove()
    assert len(calls) == 1
    # The same quantity from separate chosen and rejected batches.
    sources = [causal_prompt(row, "timetravel") for row in rows]

    def sequence_logps(targets):
        b = encoder.batch(sources, targets)
        logp = torch.log_softmax(target_logits(model, b), -1).gather(2, b["target_ids"].unsqueeze(-1)).squeeze(-1)
        return (logp * b["target_mask"]).sum(1), b["target_mask"].sum()

    with torch.no_grad():
        chosen, n_chosen = sequence_logps([" " + r["target"] for r in rows])
        rejected, _ = sequence_logps([" " + r["original_ending"] for r in rows])
    assert value.item() == pytest.approx(cpo_loss(chosen, rejected, -chosen.sum() / n_chosen, 0.5, 2.0).item(), abs=1e-4)


def test_gumbel_softmax_is_seeded_and_hard_is_one_hot():
    logits = torch.randn(2, 3, 7)
    a = gumbel_softmax(logits, 1.0, False, torch.Generator().manual_seed(3))
    b = gumbel_softmax(logits, 1.0, False, torch.Generator().manual_seed(3))
    torch.testing.assert_close(a, b)
    assert torch.allclose(a.sum(-1), torch.ones(2, 3))
    hard = gumbel_softmax(logits, 1.0, True, torch.Generator().manual_seed(3))
    assert torch.equal(hard.argmax(-1), a.argmax(-1)) and set(hard.unique().tolist()) <= {0.0, 1.0}


@pytest.fixture(params=["bart", "llama"])
def dto_setup(request, tiny_model_dirs, small_prepared):
    directory = tiny_model_dirs[request.param]
    seq2seq = request.param == "bart"
    generator = load_model(directory).eval()
    scorer = LMScorer.from_dir(directory, 96, 40)
    rows = read_jsonl(small_prepared / "timetravel" / "train.jsonl")[:3]
    batch = Collate(Encoder(load_tokenizer(directory), seq2seq, 96, 40), "timetravel")(rows)
    return generator, scorer, batch


@pytest.mark.parametrize("name, combine", [
    ("score", lambda e, o: -sum(e) / len(e)),
    ("delta", lambda e, o: -sum(x - y for x, y in zip(e, o)) / len(e)),
    ("score_delta", lambda e, o: -sum(2 * x - y for x, y in zip(e, o)) / len(e)),
])
def test_dto_losses_with_one_hot_samples_equal_the_scorer(dto_setup, name, combine):
    """hard=True: the relaxed Ŷ is one-hot, so each loss is the scorer's M on those tokens."""
    generator, scorer, batch = dto_setup
    loss = get_objective(name).build(ObjectiveContext(dto=DTOConfig(tau=1.0, hard=True), cpo=None, scorer=scorer))
    with torch.no_grad():
        value = loss(generator, batch, 11).item()
        logits = target_logits(generator, batch)
        tokens = gumbel_softmax(logits.float(), 1.0, True, torch.Generator().manual_seed(11)).argmax(-1)
    lengths = batch["target_mask"].sum(1).tolist()
    sampled = [tokens[i, :n].tolist() for i, n in enumerate(lengths)]
    edited = scorer.score_ids(sampled, batch["targets"])
    original = scorer.score_ids(sampled, batch["original_endings"])
    assert value == pytest.approx(combine(edited, original), abs=1e-4)


def test_delta_step_moves_the_right_way_and_only_the_generator_learns(dto_setup):
    generator, scorer, batch = dto_setup
    loss = get_objective("delta").build(ObjectiveContext(dto=DTOConfig(tau=1.0, hard=False), cpo=None, scorer=scorer))
    before = loss(generator, batch, 5)
    before.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in generator.parameters())
    assert all(p.grad is None for p in scorer.model.parameters())
    # A normalised gradient step: the random tiny models have small gradients, so a plain
    # learning rate would move the loss less than float32 resolution.
    grads = [p.grad for p in generator.parameters() if p.grad is not None]
    norm = torch.sqrt(sum((g ** 2).sum() for g in grads))
    with torch.no_grad():
        for p in generator.parameters():
            if p.grad is not None:
                p -= 0.05 * p.grad / norm
    with torch.no_grad():
        after = loss(generator, batch, 5)  # same noise: the same relaxed sample function
    # loss = −mean[M(Ŷ,Y_EE) − M(Ŷ,X_OE)]: lower loss = M(Ŷ,X_OE) fell relative to M(Ŷ,Y_EE).
    assert after.item() < before.item()


@pytest.mark.parametrize("name", ["delta", "score_delta", "cpo"])
def test_objectives_that_need_the_original_ending_refuse_art(tmp_path, tiny_model_dirs, small_prepared, name):
    from storyrewrite.training.run import fit

    with pytest.raises(InputError, match=rf"`objective` = '{name}' needs the original ending, which task 'art' does not have; "
                                         r"objectives for this task: nll, score"):
        fit(tiny_train_config(), init_dir=tiny_model_dirs["llama"], out_dir=tmp_path / "o", checkpoint_dir=tmp_path / "c",
            log_dir=tmp_path / "l", models=tiny_models_config("llama"), prepared_dir=small_prepared, task="art",
            objective_name=name, seed=0, scorer_dir=tiny_model_dirs["llama"])
