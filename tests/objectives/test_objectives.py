import math

import pytest
import torch
import torch.nn.functional as F

from storyrewrite.data.formatting import causal_prompt
from storyrewrite.io import InputError
from storyrewrite.models.encoding import Encoder, target_logits
from storyrewrite.models.store import load_model, load_tokenizer
from storyrewrite.objectives.registry import CPOConfig, DTOConfig, ObjectiveContext, get_objective
from storyrewrite.objectives.cpo import cpo_loss
from storyrewrite.objectives.dto import gumbel_softmax
from storyrewrite.objectives.nll import nll_loss
from storyrewrite.training.data import Collate

from helpers import host_reads, read_jsonl


def test_cpo_loss_hand_computed():
    chosen, rejected = torch.tensor([-10.0, -4.0]), torch.tensor([-12.0, -3.0])
    nll = torch.tensor(0.7)
    beta, lam = 0.5, 2.0
    # −mean log σ(β·Δ) + λ·NLL with Δ = (2, −1): log σ(1) and log σ(−0.5)
    preference = -(math.log(1 / (1 + math.exp(-1.0))) + math.log(1 / (1 + math.exp(0.5)))) / 2
    loss, terms = cpo_loss(chosen, rejected, nll, beta, lam)
    assert loss.item() == pytest.approx(preference + lam * 0.7, rel=1e-6)
    assert terms["preference"].item() == pytest.approx(preference, rel=1e-6) and terms["nll_term"].item() == pytest.approx(0.7)


def _cpo_setup(tiny_model_dirs, small_prepared, beta=0.5, lam=2.0):
    directory = tiny_model_dirs["llama"]
    model = load_model(directory).eval()
    encoder = Encoder(load_tokenizer(directory), False, 96, 40)
    rows = read_jsonl(small_prepared / "timetravel" / "train.jsonl")[:2]
    batch = Collate(encoder, "timetravel", pairs=True)(rows)
    loss = get_objective("cpo", "timetravel").build(ObjectiveContext(CPOConfig(beta=beta, lambda_=lam)))
    sources = [causal_prompt(row, "timetravel") for row in rows]

    def sequence_logps(targets):
        """Chosen or rejected alone, in a batch of their own: the independent computation."""
        b = encoder.batch(sources, targets)
        logp = torch.log_softmax(target_logits(model, b), -1).gather(2, b["target_ids"].unsqueeze(-1)).squeeze(-1)
        return (logp * b["target_mask"]).sum(1), b["target_mask"].sum()

    with torch.no_grad():
        chosen, n_chosen = sequence_logps([" " + r["target"] for r in rows])
        rejected, _ = sequence_logps([" " + r["original_ending"] for r in rows])
    return model, batch, loss, chosen, rejected, -chosen.sum() / n_chosen


def test_cpo_objective_uses_one_forward_for_chosen_and_rejected(tiny_model_dirs, small_prepared):
    model, batch, loss, chosen, rejected, chosen_nll = _cpo_setup(tiny_model_dirs, small_prepared)
    calls = []
    handle = model.base_model.register_forward_hook(lambda *args: calls.append(1))  # the transformer body
    with torch.no_grad():
        out = loss(model, batch, 0)
    handle.remove()
    assert len(calls) == 1
    assert out.loss.item() == pytest.approx(cpo_loss(chosen, rejected, chosen_nll, 0.5, 2.0)[0].item(), abs=1e-4)


def test_a_cpo_step_never_reads_the_device(tiny_model_dirs, small_prepared):
    model, batch, loss, *_ = _cpo_setup(tiny_model_dirs, small_prepared)
    assert host_reads(lambda: loss(model, batch, 0).loss.backward()) == []


def test_cpo_diagnostics_against_separate_forwards(tiny_model_dirs, small_prepared):
    beta = 0.5
    model, batch, loss, chosen, rejected, chosen_nll = _cpo_setup(tiny_model_dirs, small_prepared, beta=beta)
    with torch.no_grad():
        out = loss(model, batch, 0)
        logged = {**out.terms, **out.diagnostics()}
    value = {k: v.item() for k, v in logged.items()}
    assert value["logps/chosen"] == pytest.approx(chosen.mean().item(), abs=1e-4)
    assert value["logps/rejected"] == pytest.approx(rejected.mean().item(), abs=1e-4)
    assert value["rewards/chosen"] == pytest.approx(beta * chosen.mean().item(), abs=1e-4)
    assert value["rewards/rejected"] == pytest.approx(beta * rejected.mean().item(), abs=1e-4)
    assert value["rewards/margins"] == pytest.approx(value["rewards/chosen"] - value["rewards/rejected"], abs=1e-5)
    assert value["rewards/accuracies"] == pytest.approx((chosen > rejected).float().mean().item())
    assert value["nll_term"] == pytest.approx(chosen_nll.item(), abs=1e-4) and out.nll.item() == pytest.approx(chosen_nll.item(), abs=1e-4)


def test_token_accuracy_against_a_count(tiny_model_dirs, small_prepared):
    directory = tiny_model_dirs["bart"]
    model = load_model(directory).eval()
    batch = Collate(Encoder(load_tokenizer(directory), True, 96, 40), "timetravel")(read_jsonl(small_prepared / "timetravel" / "train.jsonl")[:3])
    with torch.no_grad():
        out = get_objective("nll", "timetravel").build(ObjectiveContext())(model, batch, 0)
        logits = target_logits(model, batch)
    hits = total = 0
    for row in range(logits.shape[0]):
        for t in range(int(batch["target_mask"][row].sum())):
            hits += int(logits[row, t].argmax() == batch["target_ids"][row, t])
            total += 1
    assert out.diagnostics()["token_accuracy"].item() == pytest.approx(hits / total)
    assert out.nll.item() == pytest.approx(out.loss.item())


def test_gumbel_softmax_is_seeded_and_hard_is_one_hot():
    logits = torch.randn(2, 3, 7)
    a = gumbel_softmax(logits, 1.0, False, 3)
    torch.testing.assert_close(a, gumbel_softmax(logits, 1.0, False, 3))
    assert not torch.equal(a, gumbel_softmax(logits, 1.0, False, 4))
    assert torch.allclose(a.sum(-1), torch.ones(2, 3))
    hard = gumbel_softmax(logits, 1.0, True, 3)
    assert torch.equal(hard.argmax(-1), a.argmax(-1)) and set(hard.unique().tolist()) <= {0.0, 1.0}


@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_hard_gumbel_softmax_passes_the_soft_gradient_straight_through(tau):
    """hard=True: the value is the one-hot argmax of the soft sample, and the gradient that of
    the soft sample (straight-through), written out here from the soft one."""
    draw = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 7, generator=draw).requires_grad_()
    weights = torch.randn(2, 3, 7, generator=draw)
    soft = gumbel_softmax(logits, tau, False, 3)
    hard = gumbel_softmax(logits, tau, True, 3)
    torch.testing.assert_close(hard, F.one_hot(soft.argmax(-1), 7).float(), rtol=0, atol=1e-6)
    grad_hard, = torch.autograd.grad((hard * weights).sum(), logits)
    grad_soft, = torch.autograd.grad((soft * weights).sum(), logits)
    assert grad_soft.abs().sum() > 0
    torch.testing.assert_close(grad_hard, grad_soft)


@pytest.mark.parametrize("tau, dtype", [(1.0, torch.float32), (0.5, torch.float32), (1.0, torch.bfloat16)])
def test_gumbel_softmax_is_the_written_out_formula(tau, dtype):
    """The in-place computation gives softmax((logits + g) / tau), g = −log(−log u) from the
    seeded draw, written out here: the same values and the same gradient, the logits untouched."""
    logits = torch.randn(2, 5, 11).to(dtype).requires_grad_()
    before = logits.detach().clone()
    uniform = torch.rand(logits.shape, generator=torch.Generator().manual_seed(3)).clamp(1e-10, 1.0 - 1e-7)
    expected = torch.softmax((logits.float() - torch.log(-torch.log(uniform))) / tau, dim=-1)
    weights = torch.randn(2, 5, 11)
    actual = gumbel_softmax(logits, tau, False, 3)
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-7)
    grad_actual, = torch.autograd.grad((actual * weights).sum(), logits)
    grad_expected, = torch.autograd.grad((expected * weights).sum(), logits)
    torch.testing.assert_close(grad_actual, grad_expected)
    assert torch.equal(logits.detach(), before)


@pytest.fixture(params=["bart", "llama"])
def dto_setup(request, tiny_model_dirs, small_prepared):
    directory = tiny_model_dirs[request.param]
    seq2seq = request.param == "bart"
    generator = load_model(directory).eval()
    rows = read_jsonl(small_prepared / "timetravel" / "train.jsonl")[:3]
    batch = Collate(Encoder(load_tokenizer(directory), seq2seq, 96, 40), "timetravel")(rows)
    return generator, directory, batch


def _dto(name, directory, hard=False):
    return get_objective(name, "timetravel").build(ObjectiveContext(DTOConfig(tau=1.0, hard=hard), directory, 96, 40))


@pytest.mark.parametrize("name, combine", [
    ("score", lambda e, o: -sum(e) / len(e)),
    ("delta", lambda e, o: -sum(x - y for x, y in zip(e, o, strict=True)) / len(e)),
    ("score_delta", lambda e, o: -sum(2 * x - y for x, y in zip(e, o, strict=True)) / len(e)),
])
def test_dto_losses_with_one_hot_samples_equal_the_scorer(dto_setup, name, combine):
    """hard=True: the relaxed Ŷ is one-hot, so each loss is the scorer's M on those tokens."""
    generator, directory, batch = dto_setup
    loss = _dto(name, directory, hard=True)
    with torch.no_grad():
        value = loss(generator, batch, 11).loss.item()
        tokens = gumbel_softmax(target_logits(generator, batch), 1.0, True, 11).argmax(-1)
    lengths = batch["target_mask"].sum(1).tolist()
    sampled = [tokens[i, :n].tolist() for i, n in enumerate(lengths)]
    edited = loss.scorer.score_ids(sampled, batch["targets"])
    original = loss.scorer.score_ids(sampled, batch["original_endings"])
    assert value == pytest.approx(combine(edited, original), abs=1e-4)


def test_dto_diagnostics_against_the_scorer_and_the_samples(dto_setup):
    generator, directory, batch = dto_setup
    loss = _dto("score_delta", directory)
    with torch.no_grad():
        out = loss(generator, batch, 5)
        logged = {k: v.item() for k, v in {**out.terms, **out.diagnostics()}.items()}
        logits = target_logits(generator, batch)
        probs = gumbel_softmax(logits, 1.0, False, 5)  # the same noise: the same soft Ŷ
        mask = batch["target_mask"]
        m_target = loss.scorer.score_soft(probs, mask, batch["targets"]).mean().item()
        m_original = loss.scorer.score_soft(probs, mask, batch["original_endings"]).mean().item()
        nll = nll_loss(logits, batch["target_ids"], mask).item()
    assert logged["m_target"] == pytest.approx(m_target, abs=1e-5) and logged["m_original"] == pytest.approx(m_original, abs=1e-5)
    assert logged["delta"] == pytest.approx(m_target - m_original, abs=1e-5)
    assert out.loss.item() == pytest.approx(-(2 * m_target - m_original), abs=1e-5)
    assert logged["nll_target"] == pytest.approx(nll, abs=1e-5)
    # Entropy and largest probability, position by position, in float64.
    entropies, maxima = [], []
    for row in range(probs.shape[0]):
        for t in range(int(mask[row].sum())):
            p = probs[row, t].double()
            entropies.append(float(-(p[p > 0] * p[p > 0].log()).sum()))
            maxima.append(float(p.max()))
    assert logged["gumbel_entropy"] == pytest.approx(sum(entropies) / len(entropies), rel=1e-4)
    assert logged["gumbel_max_prob"] == pytest.approx(sum(maxima) / len(maxima), rel=1e-5)


@pytest.mark.parametrize("name", ["nll", "score", "score_delta"])
def test_a_training_step_never_reads_the_device(dto_setup, name):
    """Loss and backward of a step (its logged values left on the device, as the monitor reads
    them a step later) without a host read: on a GPU none makes the host wait mid-step."""
    generator, directory, batch = dto_setup
    loss = get_objective("nll", "timetravel").build(ObjectiveContext()) if name == "nll" else _dto(name, directory)
    assert host_reads(lambda: loss(generator, batch, 5).loss.backward()) == []


def test_dto_score_scores_the_original_ending_in_validation_only(dto_setup):
    generator, directory, batch = dto_setup
    loss = _dto("score", directory)
    with torch.no_grad():
        train, val = loss(generator, batch, 5), loss(generator, batch, 5, validation=True)
    assert "m_original" not in train.diagnostics() and train.nll is None
    assert {"m_original", "delta"} <= set(val.diagnostics()) and val.nll is not None
    assert train.loss.item() == pytest.approx(val.loss.item())  # the loss itself is the same


def test_delta_step_moves_the_right_way_and_only_the_generator_learns(dto_setup):
    generator, directory, batch = dto_setup
    loss = _dto("delta", directory)
    before = loss(generator, batch, 5).loss
    before.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in generator.parameters())
    assert all(p.grad is None for p in loss.scorer.model.parameters())
    # A normalised gradient step: the random tiny models have small gradients, so a plain
    # learning rate would move the loss less than float32 resolution.
    grads = [p.grad for p in generator.parameters() if p.grad is not None]
    norm = torch.sqrt(sum((g ** 2).sum() for g in grads))
    with torch.no_grad():
        for p in generator.parameters():
            if p.grad is not None:
                p -= 0.05 * p.grad / norm
    with torch.no_grad():
        after = loss(generator, batch, 5).loss  # same noise: the same relaxed sample function
    # loss = −mean[M(Ŷ,Y_EE) − M(Ŷ,X_OE)]: lower loss = M(Ŷ,X_OE) fell relative to M(Ŷ,Y_EE).
    assert after.item() < before.item()


@pytest.mark.parametrize("name", ["delta", "score_delta", "cpo"])
def test_objectives_that_need_the_original_ending_refuse_art(name, shipped_objectives):
    with pytest.raises(InputError, match=rf"`objective` = '{name}' needs the original ending, which task 'art' does not have; "
                                         r"objectives for this task: nll, score, rloo$"):
        get_objective(name, "art")


def test_an_objective_built_with_another_objectives_settings_says_so():
    """A builder reads its own section's fields: DTO given CPO's settings fails at once, naming both
    types, not at the first attribute it misses."""
    with pytest.raises(TypeError, match=r"^objective 'score' takes DTOConfig settings, got CPOConfig$"):
        get_objective("score", "timetravel").build(ObjectiveContext(CPOConfig.model_validate({"beta": 0.1, "lambda": 1.0})))
