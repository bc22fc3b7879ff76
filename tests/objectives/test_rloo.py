"""RLOO against computations made another way: per-sample forwards, hand-made advantages, the
exact gradient of an expected reward, a hand-written greedy decode."""
import json
import re

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from safetensors.torch import load_file
from transformers import CompileConfig

from helpers import RL, ROOT, read_jsonl, tiny_run
from storyrewrite.curves import read_curve
from storyrewrite.models.encoding import Encoder, target_logits
from storyrewrite.models.store import is_seq2seq, load_model, load_tokenizer, plain_decoding
from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.objectives import rloo
from storyrewrite.objectives.registry import SETTINGS, ObjectiveContext, RLConfig, get_objective
from storyrewrite.training.data import Collate
from storyrewrite.training.run import fit

MAX_NEW = RL.max_new_tokens


def _setup(directory, prepared, **settings):
    config = RLConfig(**{**RL.model_dump(), "kl_beta": 0.0, **settings})
    context = ObjectiveContext(config, directory, 96, 40, directory)
    loss = get_objective("rloo", "timetravel").build(context)
    tokenizer = load_tokenizer(directory)
    encoder = Encoder(tokenizer, is_seq2seq(directory), 96, 40)
    batch = Collate(encoder, "timetravel")(read_jsonl(prepared / "timetravel" / "train.jsonl")[:2])
    return config, loss, encoder, batch, load_model(directory).eval()


def _alone_logp(model, encoder, source, completion, temperature=1.0):
    """log π(ŷ | x) of one completion in a forward of its own (no padding), summed by hand."""
    batch = encoder.batch_ids([source], [completion])
    logits = target_logits(model, batch)[0] / temperature
    return sum(torch.log_softmax(logits[t].double(), -1)[token].item() for t, token in enumerate(completion))


def _rounding_slack(rewards, logps, rows: int) -> float:
    """How far the loss may lie from the hand sum when the two differ by float32 rounding alone.
    The scorer's rewards come in float32 (near -9: an ulp of 9.5e-7) and differ in their last bits
    batched (the loss) or a pair at a time (by hand), which one CPU's kernels show and another's
    do not; an advantage holds two of them (a reward and its baseline) and moves the loss by its
    error times |log π| / rows (log π near -72 for a tiny random model: 8 tokens of a large
    vocabulary). Two ulps of the largest reward for each: a wrong baseline or log π moves the
    loss by orders of magnitude more."""
    ulp = float(np.spacing(np.float32(max(abs(r) for r in rewards))))
    return 2 * 2 * ulp * sum(abs(lp) for lp in logps) / rows


def _reward(scorer, completion, target, original, reward):
    m_target = scorer.score_ids([completion], [target])[0]
    m_original = scorer.score_ids([completion], [original])[0]
    return {"score": m_target, "delta": m_target - m_original, "score_delta": 2 * m_target - m_original}[reward]


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_the_loss_is_a_hand_reinforce_leave_one_out(tiny_model_dirs, small_prepared, kind):
    directory = tiny_model_dirs[kind]
    config, loss, encoder, batch, model = _setup(directory, small_prepared, temperature=0.7)
    seed, count = 11, config.samples
    with torch.no_grad():
        out = loss(model, batch, seed)
    completions, ended, sources = rloo.sample(model, batch, count, seed, MAX_NEW, 0.7, encoder.tokenizer.eos_token_id,
                                              encoder.tokenizer.pad_token_id)
    assert len({tuple(c) for c in completions}) > 1 and len({len(c) for c in completions}) >= 1
    assert out.diagnostics()["completions/clipped_ratio"].item() == pytest.approx(ended.count(False) / len(ended))
    scorer = LMScorer.from_dir(directory, 96, 40)
    total, all_rewards, logps = 0.0, [], []
    for b in range(len(batch["ids"])):
        rows = range(b * count, (b + 1) * count)
        rewards = [_reward(scorer, completions[i], batch["targets"][b], batch["original_endings"][b], config.reward)
                   for i in rows]
        for k, i in enumerate(rows):
            others = [r for j, r in enumerate(rewards) if j != k]
            advantage = rewards[k] - sum(others) / len(others)
            logps.append(_alone_logp(model, encoder, sources[i], completions[i], 0.7))
            total += advantage * logps[-1]
        all_rewards += rewards
    rows = len(batch["ids"]) * count
    assert out.loss.item() == pytest.approx(-total / rows, abs=_rounding_slack(all_rewards, logps, rows))
    assert out.terms["reward"].item() == pytest.approx(
        sum(_reward(scorer, c, batch["targets"][i // count], batch["original_endings"][i // count], config.reward)
            for i, c in enumerate(completions)) / len(completions), abs=1e-5)


def test_the_mean_rloo_gradient_is_the_gradient_of_the_expected_reward():
    """A categorical policy over 5 outcomes with fixed rewards: E[r] = Σ p_v r_v, whose exact
    gradient in the logits is p ⊙ (r − E[r]). The RLOO gradient averaged over 40,000 instances
    of 4 seeded draws each is within 4 standard errors of it (per coordinate), while the baseline
    that includes the sample's own reward (biased: it scales the gradient by (K−1)/K) is not."""
    torch.manual_seed(0)
    logits = torch.tensor([0.5, -1.0, 0.0, 1.2, -0.3], requires_grad=True)
    reward_of = torch.tensor([1.0, -2.0, 0.5, 3.0, 0.0])
    probs = torch.softmax(logits, 0).detach()
    exact = probs * (reward_of - (probs * reward_of).sum())
    instances, count = 40_000, 4
    draws = torch.multinomial(probs, instances * count, replacement=True).view(instances, count)
    rewards = reward_of[draws]

    def gradient(advantages):
        logits.grad = None
        logps = torch.log_softmax(logits, 0)[draws]
        (-rloo.rloo_loss(logps, advantages)).backward()  # the loss is −E[r]: its negative estimates ∇E[r]
        return logits.grad.clone()

    # Standard error from the per-instance gradient estimates (each the mean over its K draws).
    advantages = rloo.leave_one_out_advantages(rewards)
    one_hot = torch.nn.functional.one_hot(draws, 5).float()
    per_instance = (advantages.unsqueeze(-1) * (one_hot - probs)).mean(dim=1)  # instances × 5
    stderr = per_instance.std(dim=0) / instances**0.5
    assert torch.all((gradient(advantages) - exact).abs() < 4 * stderr)
    biased = rewards - rewards.mean(dim=1, keepdim=True)
    assert torch.any((gradient(biased) - exact).abs() > 4 * stderr)


def test_leave_one_out_advantages_by_hand():
    rewards = torch.tensor([[1.0, 2.0, 6.0], [0.0, 0.0, 3.0]])
    assert torch.allclose(rloo.leave_one_out_advantages(rewards),
                          torch.tensor([[1 - 4, 2 - 3.5, 6 - 1.5], [0 - 1.5, 0 - 1.5, 3 - 0.0]]))


def _greedy_by_hand(model, source, eos, max_new):
    """Argmax decoding of a causal LM, one full forward per token."""
    tokens = []
    for _ in range(max_new):
        logits = model(input_ids=torch.tensor([source + tokens])).logits[0, -1]
        tokens.append(int(logits.argmax()))
        if tokens[-1] == eos:
            break
    return tokens


def test_the_greedy_baseline_is_the_reward_of_a_hand_greedy_decode(tiny_model_dirs, small_prepared):
    directory = tiny_model_dirs["llama"]
    config, loss, encoder, batch, model = _setup(directory, small_prepared, baseline="greedy", reward="score")
    seed, count, eos = 5, config.samples, encoder.tokenizer.eos_token_id
    with torch.no_grad():
        out = loss(model, batch, seed)
        completions, _, sources = rloo.sample(model, batch, count, seed, MAX_NEW, 1.0, eos, encoder.tokenizer.pad_token_id)
        scorer = LMScorer.from_dir(directory, 96, 40)
        total, rewards, logps = 0.0, [], []
        for b in range(len(batch["ids"])):
            greedy = _greedy_by_hand(model, sources[b * count], eos, MAX_NEW)
            baseline = scorer.score_ids([greedy], [batch["targets"][b]])[0]
            for i in range(b * count, (b + 1) * count):
                rewards.append(scorer.score_ids([completions[i]], [batch["targets"][b]])[0])
                logps.append(_alone_logp(model, encoder, sources[i], completions[i]))
                total += (rewards[-1] - baseline) * logps[-1]
    rows = len(batch["ids"]) * count
    assert out.loss.item() == pytest.approx(-total / rows, abs=_rounding_slack(rewards, logps, rows))


@pytest.mark.slow
def test_kl_zero_loads_no_reference_model_and_the_kl_term_is_the_log_ratio(tiny_model_dirs, small_prepared, monkeypatch):
    directory = tiny_model_dirs["llama"]
    config, loss, encoder, batch, model = _setup(directory, small_prepared, reward="score")
    assert loss.frozen == () and loss.frozen_models() == (loss.scorer.model,)
    with monkeypatch.context() as patch:
        patch.setattr(rloo, "load_model", lambda *a, **k: pytest.fail("kl_beta 0 loaded a reference model"))
        _setup(directory, small_prepared, reward="score")
    config, loss, encoder, batch, model = _setup(directory, small_prepared, reward="score", kl_beta=0.5)
    assert len(loss.frozen) == 1
    with torch.no_grad():
        assert loss(model, batch, 3).diagnostics()["kl"].item() == 0.0  # the generator is still the reference
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
        out = loss(model, batch, 3)
        completions, _, sources = rloo.sample(model, batch, config.samples, 3, MAX_NEW, 1.0, encoder.tokenizer.eos_token_id,
                                              encoder.tokenizer.pad_token_id)
    reference = load_model(directory).eval()
    kls = [_alone_logp(model, encoder, s, c) - _alone_logp(reference, encoder, s, c) for s, c in zip(sources, completions, strict=True)]
    assert out.diagnostics()["kl"].item() == pytest.approx(sum(kls) / len(kls), abs=1e-4)
    # The reward the loss follows is the metric's less kl_beta times the KL (validation: its mean, negated).
    with torch.no_grad():
        checked = loss(model, batch, 3, validation=True)
    kl = checked.diagnostics()["kl"].item()
    assert abs(kl) > 1e-3
    assert checked.loss.item() == pytest.approx(-(checked.terms["reward"].item() - 0.5 * kl), abs=1e-5)


def test_validation_runs_the_generator_over_its_samples_only_for_a_kl_term(tiny_model_dirs, small_prepared, monkeypatch):
    """The samples' log π under the generator (a forward of every sample) is the training loss's;
    in validation (loss: −mean reward) only the KL term reads it. Without a reference model
    validation skips that forward and gives the same loss and reward; training and the KL's
    validation still run it (with the reference model's beside it)."""
    directory = tiny_model_dirs["llama"]
    forwards = []
    sequence_log_probs = rloo.sequence_log_probs
    monkeypatch.setattr(rloo, "sequence_log_probs", lambda model, *args: forwards.append(model) or sequence_log_probs(model, *args))
    config, loss, encoder, batch, model = _setup(directory, small_prepared)
    with torch.no_grad():
        out = loss(model, batch, 3, validation=True)
        assert forwards == []
        completions, _, sources = rloo.sample(model, batch, config.samples, 3, MAX_NEW, 1.0, encoder.tokenizer.eos_token_id,
                                              encoder.tokenizer.pad_token_id)
    rewards = loss.scorer.score_ids(completions * 2, [t for t in batch["targets"] for _ in range(config.samples)]
                                    + [o for o in batch["original_endings"] for _ in range(config.samples)], 2 * len(completions))
    metric = rloo.combine_rewards(torch.tensor(rewards[:len(completions)], dtype=torch.float64),
                                  torch.tensor(rewards[len(completions):], dtype=torch.float64), config.reward)
    assert out.loss.item() == pytest.approx(-metric.mean().item(), rel=1e-6) and out.terms["reward"].item() == pytest.approx(metric.mean().item(), rel=1e-6)
    loss(model, batch, 3)
    assert forwards == [model]
    forwards.clear()
    config, loss, encoder, batch, model = _setup(directory, small_prepared, kl_beta=0.5)
    with torch.no_grad():
        loss(model, batch, 3, validation=True)
    assert len(forwards) == 2 and forwards[0] is model and forwards[1] is loss.frozen[0]


def test_the_end_token_ends_a_completion_and_padding_gets_no_gradient(tiny_model_dirs):
    eos = 2
    rows, ended = rloo.completion_ids(torch.tensor([[5, 6, eos, 7, 1], [5, 6, 7, 8, 9]]), eos)
    assert rows == [[5, 6, eos], [5, 6, 7, 8, 9]] and ended == [True, False]

    directory = tiny_model_dirs["llama"]
    model = load_model(directory).eval()
    encoder = Encoder(load_tokenizer(directory), False, 96, 40)
    eos = encoder.tokenizer.eos_token_id
    sources, completions = [[10, 11, 12], [13, 14]], [[20, eos], [21, 22, 23, 24, eos]]
    captured = []

    def keep(module, inputs, output):
        output.retain_grad()
        captured.append(output)
    handle = model.get_output_embeddings().register_forward_hook(keep)
    logps = rloo.sequence_log_probs(model, encoder, sources, completions)
    handle.remove()
    logps[0].backward()
    grad = captured[0].grad  # B×T×V logits of the target positions
    assert grad[0, :2].abs().sum() > 0 and grad[0, 2:].abs().sum() == 0 and grad[1].abs().sum() == 0
    for i in range(2):
        assert logps[i].item() == pytest.approx(_alone_logp(model, encoder, sources[i], completions[i]), abs=1e-5)
    # At the sampling temperature: log softmax of the logits over it.
    with torch.no_grad():
        cooled = rloo.sequence_log_probs(model, encoder, sources, completions, 0.5)
    for i in range(2):
        assert cooled[i].item() == pytest.approx(_alone_logp(model, encoder, sources[i], completions[i], 0.5), abs=1e-5)
        assert abs(cooled[i].item() - logps[i].item()) > 1e-3


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_each_source_is_read_once_for_its_samples_with_the_values_and_gradients_of_one_forward(tiny_model_dirs, kind):
    """Completions whose sources repeat (K samples of each) get log π and parameter gradients of
    the one forward over every (source, completion) row, while the model reads each distinct
    source once: its input embeddings (a causal LM's body, a seq2seq model's encoder) see two
    source rows where there are six completions."""
    directory = tiny_model_dirs[kind]
    model = load_model(directory).eval()
    encoder = Encoder(load_tokenizer(directory), is_seq2seq(directory), 96, 40)
    eos = encoder.tokenizer.eos_token_id
    sources = [[10, 11, 12, 13]] * 3 + [[14, 15]] * 3
    completions = [[20, eos], [21, 22, 23, eos], [24, 25, 26, 27, 28], [29, eos], [30], [31, 32, eos]]

    def logps_and_grads(shared: bool):
        model.zero_grad()
        rows = []
        reader = model.get_encoder() if encoder.seq2seq else model  # what reads the sources first
        handle = reader.get_input_embeddings().register_forward_hook(lambda module, inputs, output: rows.append(inputs[0].shape[0]))
        if shared:
            logps = rloo.sequence_log_probs(model, encoder, sources, completions, 0.7)
        else:
            batch = encoder.batch_ids(sources, completions)
            logits = target_logits(model, batch) / 0.7
            logps = (torch.log_softmax(logits, -1).gather(2, batch["target_ids"].unsqueeze(-1)).squeeze(-1)
                     * batch["target_mask"]).sum(dim=1)
        handle.remove()
        (logps * torch.linspace(-1.0, 1.0, len(completions))).sum().backward()  # each row's gradient weighs apart
        return logps.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, rows
    shared, shared_grads, shared_rows = logps_and_grads(True)
    alone, alone_grads, alone_rows = logps_and_grads(False)
    assert shared_rows[0] == 2 and alone_rows[0] == 6
    assert torch.allclose(shared, alone, atol=1e-5)
    for i, (source, completion) in enumerate(zip(sources, completions, strict=True)):
        assert shared[i].item() == pytest.approx(_alone_logp(model, encoder, source, completion, 0.7), abs=1e-5)
    assert shared_grads.keys() == alone_grads.keys() and len(shared_grads) > 5
    for name, grad in alone_grads.items():
        assert torch.allclose(shared_grads[name], grad, rtol=1e-4, atol=1e-6), name


def test_a_causal_models_sources_fill_the_dynamic_cache_once_for_the_samples_generate_draws(tiny_model_dirs, small_prepared):
    """With the dynamic cache a causal model reads each source once, B rows for B·K samples,
    where transformers' `num_return_sequences` reads it K times; the samples are those that
    `generate` draws with that option from the same seed, left padding included."""
    directory = tiny_model_dirs["llama"]
    model, encoder = load_model(directory).eval(), Encoder(load_tokenizer(directory), False, 512, 40)  # (no source cut)
    eos, pad = encoder.tokenizer.eos_token_id, encoder.tokenizer.pad_token_id
    rows = sorted(read_jsonl(small_prepared / "timetravel" / "train.jsonl"), key=lambda row: len(json.dumps(row)))
    batch = Collate(encoder, "timetravel")([rows[0], rows[-1]])
    ids, mask, _ = rloo.source_rows(batch, False)
    assert ids.shape[1] > 1 and (mask == 0).any()  # two sources of different lengths, left-padded
    reads = []  # (rows, positions) of each forward of the model's body
    handle = model.get_input_embeddings().register_forward_hook(lambda module, inputs, output: reads.append(tuple(inputs[0].shape)))
    try:
        new, _ = rloo.sample_tokens(model, batch, 3, 5, MAX_NEW, 1.0, eos, pad)
    finally:
        handle.remove()
    assert reads[0] == (2, ids.shape[1] - 1) and reads[1] == (6, 1)  # the sources but their last token, once; then 6 rows
    assert all(length == 1 for _, length in reads[1:])
    with torch.inference_mode(), plain_decoding(model):
        torch.manual_seed(5)
        drawn = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, num_return_sequences=3, top_k=0, top_p=1.0,
                               temperature=1.0, max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=pad)
    assert torch.equal(new, drawn[:, ids.shape[1]:])
    greedy, _ = rloo.sample_tokens(model, batch, 1, 5, MAX_NEW, 1.0, eos, pad, greedy=True)  # one row a source: as it is
    assert greedy.shape[0] == 2
    # The next token's logits of each sample's row, read through the shared keys and values,
    # are those of its source alone, unpadded, in one forward.
    with torch.no_grad():
        prefix = rloo.shared_prefix(model, ids, mask, 3)
        sample_mask = mask.repeat_interleave(3, dim=0)
        logits = model(input_ids=ids.repeat_interleave(3, dim=0)[:, -1:], attention_mask=sample_mask, past_key_values=prefix,
                       position_ids=sample_mask.sum(dim=1, keepdim=True) - 1).logits[:, -1]
        for b in range(2):
            alone = model(input_ids=ids[b][mask[b].bool()][None]).logits[0, -1]
            for row in range(3 * b, 3 * b + 3):
                assert torch.allclose(logits[row], alone, atol=1e-5), (b, row)


def test_samples_come_from_the_model_not_from_its_checkpoints_decoding_defaults(tiny_model_dirs, small_prepared):
    """A checkpoint's generation config (bart-large-cnn's beams, n-gram blocking, forced first
    token) would make the samples something other than draws from π: with top-k 2 and a forced
    first token in the model's defaults, the first sampled tokens of a random tiny model still
    spread over many tokens, and the config is restored afterwards."""
    directory = tiny_model_dirs["bart"]
    config, loss, encoder, batch, model = _setup(directory, small_prepared)
    model.generation_config.top_k, model.generation_config.forced_bos_token_id = 2, 7
    model.generation_config.num_beams = 4
    completions, _, _ = rloo.sample(model, batch, 200, 0, 1, 1.0, encoder.tokenizer.eos_token_id, encoder.tokenizer.pad_token_id)
    assert len({c[0] for c in completions}) > 20
    assert model.generation_config.top_k == 2 and model.generation_config.num_beams == 4


def test_sampling_is_seeded_and_leaves_the_random_state_alone(tiny_model_dirs, small_prepared):
    directory = tiny_model_dirs["llama"]
    config, loss, encoder, batch, model = _setup(directory, small_prepared)
    tokens = encoder.tokenizer.eos_token_id, encoder.tokenizer.pad_token_id
    torch.manual_seed(123)
    first = rloo.sample(model, batch, 3, 9, MAX_NEW, 1.0, *tokens)[0]
    after = torch.rand(3)
    torch.manual_seed(123)
    assert rloo.sample(model, batch, 3, 9, MAX_NEW, 1.0, *tokens)[0] == first
    assert torch.equal(torch.rand(3), after)
    assert rloo.sample(model, batch, 3, 10, MAX_NEW, 1.0, *tokens)[0] != first


class Crash(Callback):
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == 3:  # after the step-2 checkpoint (Lightning saves after other callbacks)
            raise RuntimeError("simulated crash")


@pytest.mark.slow
def test_an_interrupted_rloo_run_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path, tiny_model_dirs, small_prepared):
    """With the KL term (a reference model beside the generator) and the samples seeded by the step."""
    directory = tiny_model_dirs["llama"]
    run = tiny_run(directory, small_prepared, "rloo", RL, directory, section="train", max_steps=4,
                   checkpoint_every_n_steps=1, val_check_interval=4)
    whole = fit(run, tmp_path / "whole", tmp_path / "whole_ckpt", tmp_path / "whole_logs")
    with pytest.raises(RuntimeError, match="simulated crash"):
        fit(run, tmp_path / "resumed", tmp_path / "ckpt", tmp_path / "logs", callbacks=(Crash(),))
    resumed = fit(run, tmp_path / "resumed", tmp_path / "ckpt", tmp_path / "logs")
    assert resumed["resumed_from_step"] == 2 and resumed["global_step"] == whole["global_step"] == 4
    assert read_curve(tmp_path / "logs" / "plots" / "metrics" / "reward.tsv") == \
        read_curve(tmp_path / "whole_logs" / "plots" / "metrics" / "reward.tsv")
    first, second = (load_file(tmp_path / name / "model.safetensors") for name in ("whole", "resumed"))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.parametrize("objective, read", [
    ("rloo", {"task", "train", "models", "seed", "rl"}),
    ("score", {"task", "train", "models", "seed", "dto"}),
    ("nll", {"task", "train", "models", "seed"}),
])
def test_a_run_reads_only_its_objectives_sections(tmp_path, objective, read):
    """An invalid section that the objective does not read cannot stop it (and the sections it
    does read are what the train stage's dvc.yaml params name for it)."""
    from storyrewrite.params import Params, load_yaml
    from storyrewrite.training.run import Run

    raw = load_yaml(ROOT / "params.yaml")
    for name in {"dto", "cpo", "rl", "generate"} - read:
        raw[name] = {"not_a_key": 1}
    params = Params(raw, settings=SETTINGS)
    Run.from_params(params, "train", get_objective(objective, params.task), tmp_path, tmp_path, tmp_path)
    assert set(params.built) == read


def _batches(encoder, prepared, sizes=(2, 2)):
    """Batches of training instances, `sizes` instances each, from the shortest sources to the longest."""
    rows = sorted(read_jsonl(prepared / "timetravel" / "train.jsonl"),
                  key=lambda row: len(row["premise"] + row["initial"] + row["counterfactual"] + row["original_ending"]))
    collate, start, out = Collate(encoder, "timetravel"), 0, []
    for size in sizes:
        out.append(collate(rows[start : start + size]))
        start += len(rows) // len(sizes)
    return out


def test_samples_are_drawn_outside_autocast_in_either_cache(tiny_model_dirs, small_prepared):
    """Under bf16-mixed the step runs in autocast; the samples come from the weights as they are
    (a static cache sized by the first keys, float32 after the rotary embedding, cannot take the
    bfloat16 values autocast makes): those of a step without autocast, with either cache."""
    config, loss, encoder, batch, model = _setup(tiny_model_dirs["llama"], small_prepared)
    tokens = encoder.tokenizer.eos_token_id, encoder.tokenizer.pad_token_id
    plain = rloo.sample(model, batch, 3, 5, MAX_NEW, 1.0, *tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for caches in (None, rloo.StaticCaches(rloo.static_cache_length(False, 96, MAX_NEW))):
            assert rloo.sample(model, batch, 3, 5, MAX_NEW, 1.0, *tokens, caches=caches) == plain


def test_a_sampling_runs_without_deterministic_algorithms_and_leaves_them_as_they_were(tiny_model_dirs, small_prepared,
                                                                                      monkeypatch):
    """Under the Trainer's deterministic algorithms a static cache samples what it samples without
    them, with them off while it decodes (its index_copy_ the plain kernel), and on again after."""
    config, loss, encoder, batch, model = _setup(tiny_model_dirs["llama"], small_prepared)
    tokens = encoder.tokenizer.eos_token_id, encoder.tokenizer.pad_token_id
    caches = rloo.StaticCaches(rloo.static_cache_length(False, 96, MAX_NEW))
    free = rloo.sample(model, batch, 3, 5, MAX_NEW, 1.0, *tokens, caches=caches)
    seen, generate = [], type(model).generate

    def watched(self, *args, **kwargs):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return generate(self, *args, **kwargs)
    monkeypatch.setattr(type(model), "generate", watched)
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        assert rloo.sample(model, batch, 3, 5, MAX_NEW, 1.0, *tokens, caches=caches) == free
        assert (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) == (True, True)
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    assert seen == [False]


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_a_sample_dtype_samples_from_the_trained_weights_in_that_dtype(tmp_path, tiny_model_dirs, small_prepared, kind):
    """`rl.sample_dtype: bfloat16`: the samples of the model as transformers loads it in bfloat16
    (another route to the same weights), and after the optimiser updates the weights in place,
    those of the updated model loaded so; the generator itself stays float32. In its own dtype,
    the generator samples, as without the setting."""
    directory = tiny_model_dirs[kind]
    config, loss, encoder, batch, model = _setup(directory, small_prepared)
    tokens = encoder.tokenizer.eos_token_id, encoder.tokenizer.pad_token_id
    loaded = lambda folder: rloo.sample_tokens(load_model(folder, "bfloat16").eval(), batch, 3, 5, MAX_NEW, 1.0, *tokens)[0]  # noqa: E731
    sampling = rloo.Sampling(None, early_stop=True, dtype=torch.bfloat16)
    drawn = sampling.tokens(model, batch, 3, 5, MAX_NEW, 1.0, *tokens)[0]
    assert torch.equal(drawn, loaded(directory))
    # Samples at temperature 1 seldom tell the two dtypes apart; the logits they come from do.
    first = sampling.copy
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")} | (
        {"decoder_input_ids": batch["input_ids"][:, :3]} if kind == "bart" else {})
    with torch.no_grad():
        logits = [m(**inputs).logits for m in (first, load_model(directory, "bfloat16").eval(), model)]
    assert torch.equal(logits[0], logits[1]) and not torch.equal(logits[0].float(), logits[2])
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter), alpha=0.5)
    model.save_pretrained(tmp_path / "updated")
    redrawn = sampling.tokens(model, batch, 3, 5, MAX_NEW, 1.0, *tokens)[0]
    assert torch.equal(redrawn, loaded(tmp_path / "updated")) and not torch.equal(redrawn, drawn)
    assert sampling.copy is first and {p.dtype for p in first.parameters()} == {torch.bfloat16}
    assert not any(p.requires_grad for p in first.parameters()) and {p.dtype for p in model.parameters()} == {torch.float32}
    own = rloo.Sampling(None, early_stop=True, dtype=torch.float32)
    assert torch.equal(own.tokens(model, batch, 3, 5, MAX_NEW, 1.0, *tokens)[0],
                       rloo.sample_tokens(model, batch, 3, 5, MAX_NEW, 1.0, *tokens)[0]) and own.copy is None


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_a_static_cache_samples_what_the_dynamic_cache_does(tiny_model_dirs, small_prepared, kind):
    directory = tiny_model_dirs[kind]
    config, loss, encoder, batch, model = _setup(directory, small_prepared)
    tokens = encoder.tokenizer.eos_token_id, encoder.tokenizer.pad_token_id
    length = rloo.static_cache_length(kind == "bart", 96, MAX_NEW)
    static_loss = _setup(directory, small_prepared, cache="static")[1]  # `rl.cache: static`, through the objective
    with torch.no_grad():
        assert static_loss(model, batch, 7).loss.item() == loss(model, batch, 7).loss.item()
    batches = _batches(encoder, small_prepared)
    assert len({batch["input_ids"].shape[1] for batch in batches}) == len(batches)  # sources of other lengths
    caches = rloo.StaticCaches(length)
    for batch in batches + batches[::-1]:  # each cache reused, after a call with longer or shorter sources
        dynamic = rloo.sample(model, batch, 3, 5, MAX_NEW, 1.0, *tokens)
        assert rloo.sample(model, batch, 3, 5, MAX_NEW, 1.0, *tokens, caches=caches) == dynamic
    assert len(caches.caches) == (2 if kind == "bart" else 1)  # (a seq2seq model's: one per encoder length)


def _counted_compiles(dynamic: bool | None = True) -> tuple[list, CompileConfig]:
    """(the graphs dynamo compiles, a compile config for transformers' auto-compile that appends
    each and runs it as traced), on any device, with no graph another test compiled. The run's
    own config (`Sampling.compile_config`) with that backend; `dynamic` None: torch's automatic
    dynamic shapes instead (transformers' default)."""
    graphs = []

    def backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    torch._dynamo.reset()  # (dynamo keeps its graphs by code object, across models and tests)
    # (mode: inductor's; reduce-overhead on a GPU)
    compile_config = CompileConfig(**{**rloo.Sampling.compile_config.to_dict(), "backend": backend, "mode": None,
                                      **({"dynamic": None} if dynamic is None else {})})
    compile_config._compile_all_devices = True  # (transformers compiles on a GPU only otherwise)
    return graphs, compile_config


def test_a_compiled_static_cache_step_compiles_once_for_sources_of_any_length(tiny_model_dirs, small_prepared):
    """The decoding step compiled (as transformers does on a GPU) sees one shape per row count:
    batches whose sources differ in length compile nothing new, and sample what the eager
    dynamic cache samples."""
    config, loss, encoder, batch, model = _setup(tiny_model_dirs["llama"], small_prepared)
    tokens = encoder.tokenizer.eos_token_id, encoder.tokenizer.pad_token_id
    graphs, compile_config = _counted_compiles()
    first, *others = batches = _batches(encoder, small_prepared, sizes=(2, 2, 2))
    assert len({batch["input_ids"].shape[1] for batch in batches}) == len(batches)
    length = rloo.static_cache_length(False, 96, MAX_NEW)
    settings = {"caches": rloo.StaticCaches(length), "compile_config": compile_config}
    assert rloo.sample(model, first, 3, 5, MAX_NEW, 1.0, *tokens, **settings) == rloo.sample(model, first, 3, 5, MAX_NEW, 1.0, *tokens)
    compiled = len(graphs)
    assert compiled > 0
    for batch in others:
        assert rloo.sample(model, batch, 3, 5, MAX_NEW, 1.0, *tokens, **settings) == rloo.sample(model, batch, 3, 5, MAX_NEW, 1.0, *tokens)
    assert len(graphs) == compiled


def test_every_compiled_decoding_step_gets_the_same_cache_tensors(tiny_model_dirs, small_prepared):
    """Between two samplings a training step takes the memory that is free. A static cache made anew
    for each sampling would then lie elsewhere, and CUDA graph trees, which read a static cache's
    tensors at the addresses they recorded, would record the step again at each sampling. The
    run's caches stay where they are: every decoding step of every sampling gets the same tensors."""
    config, loss, encoder, batch, model = _setup(tiny_model_dirs["llama"], small_prepared)
    tokens = encoder.tokenizer.eos_token_id, encoder.tokenizer.pad_token_id
    length = rloo.static_cache_length(False, 96, MAX_NEW)
    _, compile_config = _counted_compiles()
    addresses = []  # per decoding step: the addresses of its inputs shaped as the KV cache's tensors

    def backend(graph, example_inputs):
        def step(*inputs):
            addresses.append(frozenset(t.data_ptr() for t in inputs if isinstance(t, torch.Tensor) and t.dim() == 4
                                       and t.shape[2] == length))
            return graph.forward(*inputs)
        return step
    compile_config.backend = backend
    caches, taken = rloo.StaticCaches(length), []
    for seed in (5, 6, 7):
        rloo.sample(model, batch, 3, seed, MAX_NEW, 1.0, *tokens, caches=caches, compile_config=compile_config)
        taken += [torch.ones(len(batch["ids"]) * 3, 4096) for _ in range(2 * model.config.num_hidden_layers)]
    assert len(addresses) >= 3 * 2 and len(addresses[0]) == 2 * model.config.num_hidden_layers
    assert set(addresses) == {addresses[0]}


def test_a_compiled_static_cache_step_compiles_once_for_any_rows_in_validation_and_training(tiny_model_dirs, small_prepared):
    """Lightning validates in inference mode and trains with gradients on; batches of other sizes
    give other row counts. With the run's compile config the decoding step compiles once, the row
    count symbolic, and samples what the eager dynamic cache samples; left to torch's automatic
    dynamic shapes it compiles for the first rows, then once more at the next."""
    config, loss, encoder, batch, model = _setup(tiny_model_dirs["llama"], small_prepared)
    tokens = encoder.tokenizer.eos_token_id, encoder.tokenizer.pad_token_id
    validation, training, last = _batches(encoder, small_prepared, sizes=(4, 2, 1))
    eager = {}
    for dynamic, compiles in ((True, 1), (None, 2)):
        graphs, compile_config = _counted_compiles(dynamic)
        settings = {"caches": rloo.StaticCaches(rloo.static_cache_length(False, 96, MAX_NEW)), "compile_config": compile_config}
        samples = []
        with torch.inference_mode():
            samples.append(rloo.sample(model, validation, 3, 5, MAX_NEW, 1.0, *tokens, **settings))
        for seed in (5, 6):
            samples.append(rloo.sample(model, training, 3, seed, MAX_NEW, 1.0, *tokens, **settings))
        with torch.inference_mode():
            samples.append(rloo.sample(model, last, 3, 5, MAX_NEW, 1.0, *tokens, **settings))
            samples.append(rloo.sample(model, validation, 3, 5, MAX_NEW, 1.0, *tokens, **settings))
        assert len(graphs) == compiles, dynamic
        eager = eager or {"samples": [rloo.sample(model, b, 3, s, MAX_NEW, 1.0, *tokens)
                                      for b, s in ((validation, 5), (training, 5), (training, 6), (last, 5), (validation, 5))]}
        assert samples == eager["samples"]
    torch._dynamo.reset()


def test_a_static_cache_run_trains_to_the_weights_of_a_dynamic_cache_run(tmp_path, tiny_model_dirs, small_prepared):
    """Through Lightning's fit in the GPU profile's bf16-mixed, sampling from a bf16 copy of the
    weights (the KL term's reference model beside the generator, validation in batches of another
    size): the same reward curve and the same trained weights."""
    directory, weights = tiny_model_dirs["llama"], {}
    for cache in ("dynamic", "static"):
        settings = RL.model_copy(update={"cache": cache, "sample_dtype": "bfloat16"})
        run = tiny_run(directory, small_prepared, "rloo", settings, directory, section="train",
                       max_steps=2, val_check_interval=2, val_batch_size=4, precision="bf16-mixed")
        fit(run, tmp_path / cache, tmp_path / f"{cache}_ckpt", tmp_path / f"{cache}_logs")
        weights[cache] = load_file(tmp_path / cache / "model.safetensors")
    assert read_curve(tmp_path / "static_logs" / "plots" / "metrics" / "reward.tsv") == \
        read_curve(tmp_path / "dynamic_logs" / "plots" / "metrics" / "reward.tsv")
    assert all(torch.equal(weights["static"][k], weights["dynamic"][k]) for k in weights["dynamic"])
    # The static caches sampled every step (a CPU compiles nothing: nothing to fall back from); a dynamic run logs no such curve.
    assert [row["value"] for row in read_curve(tmp_path / "static_logs" / "plots" / "metrics" / "static_cache.tsv")] == [1.0, 1.0]
    assert not (tmp_path / "dynamic_logs" / "plots" / "metrics" / "static_cache.tsv").exists()


def _host_reads(call) -> int:
    """How many times `call` reads a tensor's value on the host (bool, item, tolist): on a GPU,
    each such read waits for the device."""
    reads = []
    originals = {name: getattr(torch.Tensor, name) for name in ("__bool__", "item", "tolist")}

    def counting(name):
        def read(self, *args, **kwargs):
            reads.append(name)
            return originals[name](self, *args, **kwargs)
        return read

    try:
        for name in originals:
            setattr(torch.Tensor, name, counting(name))
        call()
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    return len(reads)


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_sampling_without_early_stop_samples_the_same_without_a_read_per_token(tiny_model_dirs, small_prepared,
                                                                                         kind):
    """`rl.early_stop: false`: transformers' loop no longer reads the device after each token to
    see whether every sample ended. The same samples, with either cache; one host read a token
    fewer, none left that grows with the tokens for a decoder-only model (the GPU profile's)."""
    directory = tiny_model_dirs[kind]
    config, loss, encoder, batch, model = _setup(directory, small_prepared)
    tokens = encoder.tokenizer.eos_token_id, encoder.tokenizer.pad_token_id
    caches = rloo.StaticCaches(rloo.static_cache_length(kind == "bart", 96, MAX_NEW))
    for cache in (None, caches):
        for seed in (5, 6):
            early = rloo.sample(model, batch, 3, seed, MAX_NEW, 1.0, *tokens, caches=cache)
            assert rloo.sample(model, batch, 3, seed, MAX_NEW, 1.0, *tokens, caches=cache, early_stop=False) == early
    reads = {(early_stop, steps): _host_reads(lambda s=steps, e=early_stop: rloo.sample(model, batch, 3, 5, s, 1.0, *tokens, early_stop=e))
             for early_stop in (True, False) for steps in (4, 12)}
    per_8_tokens = {early_stop: reads[early_stop, 12] - reads[early_stop, 4] for early_stop in (True, False)}
    assert per_8_tokens[True] - per_8_tokens[False] == 8  # the loop's own read, one a token, gone
    if kind == "llama":  # (eager BART's attention masks read two values a token: transformers' masking_utils)
        assert per_8_tokens[False] == 0
    static = _setup(directory, small_prepared, cache="static", early_stop=False)[1]  # `rl.early_stop`, through the objective
    with torch.no_grad():
        assert static(model, batch, 7).loss.item() == loss(model, batch, 7).loss.item()


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_the_sources_are_read_in_one_host_read_as_the_mask_keeps_them(tiny_model_dirs, small_prepared, kind):
    """Each host read waits for the device; the batch's sources take one. Their rows are the
    tokens the mask keeps, position by position."""
    batch = _setup(tiny_model_dirs[kind], small_prepared)[3]
    rows = []
    assert _host_reads(lambda: rows.extend(rloo.source_rows(batch, kind == "bart")[2])) == 1
    ids, mask = rloo.source_rows(batch, kind == "bart")[:2]
    assert rows == [[int(ids[r, c]) for c in range(ids.shape[1]) if mask[r, c] == 1] for r in range(ids.shape[0])]
    assert all(len(row) == int(mask[r].sum()) > 0 for r, row in enumerate(rows))


def test_a_failed_compile_of_the_decoding_step_falls_back_to_the_dynamic_cache_with_the_same_samples(
        tiny_model_dirs, small_prepared, monkeypatch, capsys):
    """The compiler raises at the first compiled decoding step (as inductor can on a GPU it cannot
    compile for): the sampling is drawn again with the dynamic cache, the same samples as a run
    that never had the static one, and later samplings compile nothing. Said once on stderr; the
    `static_cache` curve falls from 1 to 0 (a dynamic-cache run logs none)."""
    config, loss, encoder, batch, model = _setup(tiny_model_dirs["llama"], small_prepared)
    tokens = encoder.tokenizer.eos_token_id, encoder.tokenizer.pad_token_id
    attempts = []

    def failing(graph, example_inputs):
        attempts.append(graph)
        raise RuntimeError("no compiler for this device")
    torch._dynamo.reset()
    compile_config = CompileConfig(backend=failing, mode=None)
    compile_config._compile_all_devices = True  # (transformers compiles on a GPU only otherwise)
    monkeypatch.setattr(rloo.Sampling, "compile_config", compile_config)
    sampling = rloo.Sampling(rloo.StaticCaches(rloo.static_cache_length(False, 96, MAX_NEW)), early_stop=True)
    assert sampling.curves() == {"static_cache": torch.tensor(1.0), "decoding_graphs": torch.tensor(0.0)}
    for seed in (5, 6):
        new, sources = sampling.tokens(model, batch, 3, seed, MAX_NEW, 1.0, *tokens)
        assert (rloo.completion_ids(new, tokens[0])[0], sources) == (lambda c, _, s: (c, s))(*rloo.sample(model, batch, 3, seed, MAX_NEW, 1.0, *tokens))
    assert len(attempts) == 1 and sampling.caches is None
    assert sampling.curves() == {"static_cache": torch.tensor(0.0), "decoding_graphs": torch.tensor(0.0)}
    warned = capsys.readouterr().err
    assert warned.count("warning: rl.cache static: compiling the decoding step failed (RuntimeError: no compiler for this device)") == 1
    assert rloo.Sampling(None, early_stop=True).curves() == {}
    # Through the objective: the loss of a run with the dynamic cache, and the curve at 0.
    static_loss = _setup(tiny_model_dirs["llama"], small_prepared, cache="static")[1]
    with torch.no_grad():
        static, dynamic = static_loss(model, batch, 7), loss(model, batch, 7)
    assert static.loss.item() == dynamic.loss.item()
    assert static.diagnostics()["static_cache"].item() == 0.0 and "static_cache" not in dynamic.diagnostics()


def test_the_decoding_graphs_curve_counts_the_sampling_compiles_and_a_first_sampling_without_one_is_named(
        tiny_model_dirs, small_prepared, monkeypatch, capsys):
    """Compiled as planned: one graph for three samplings of one row count, counted by the
    compiler itself; nothing said. Where transformers would compile but torch compiles nothing (its
    dynamo disabled, as a frame past its recompile limit runs eagerly): the curve stays 0 and the
    first sampling says so once, and that torch.compile was not entered; where dynamo saw the frame
    but ran it eagerly (its recompile limit), it says that instead. Where transformers compiles
    nothing (a CPU): neither."""
    config, loss, encoder, batch, model = _setup(tiny_model_dirs["llama"], small_prepared)
    tokens = encoder.tokenizer.eos_token_id, encoder.tokenizer.pad_token_id
    graphs, compile_config = _counted_compiles()
    monkeypatch.setattr(rloo.Sampling, "compile_config", compile_config)
    length = rloo.static_cache_length(False, 96, MAX_NEW)
    sampling = rloo.Sampling(rloo.StaticCaches(length), early_stop=False)
    for seed in (5, 6, 7):
        sampling.tokens(model, batch, 3, seed, MAX_NEW, 1.0, *tokens)
    assert len(graphs) == 1 and sampling.curves()["decoding_graphs"].item() == 1.0
    assert "compiled no decoding step" not in capsys.readouterr().err
    torch._dynamo.reset()
    eager = rloo.Sampling(rloo.StaticCaches(length), early_stop=False)
    with torch._dynamo.config.patch(disable=True):
        for seed in (5, 6):
            eager.tokens(model, batch, 3, seed, MAX_NEW, 1.0, *tokens)
    assert len(graphs) == 1 and eager.curves() == {"static_cache": torch.tensor(1.0), "decoding_graphs": torch.tensor(0.0)}
    assert capsys.readouterr().err.count("warning: rl.cache static: the first sampling compiled no decoding step (torch.compile "
                                         "was not entered: transformers did not compile it, or dynamo is disabled)") == 1
    # Entered, but every frame runs eagerly (its recompile limit reached at once): said apart.
    torch._dynamo.reset()
    limited = rloo.Sampling(rloo.StaticCaches(length), early_stop=False)
    with torch._dynamo.config.patch(recompile_limit=0):
        limited.tokens(model, batch, 3, 5, MAX_NEW, 1.0, *tokens)
    torch._dynamo.reset()
    assert len(graphs) == 1 and limited.curves()["decoding_graphs"].item() == 0.0
    assert re.search(r"compiled no decoding step \(dynamo saw [1-9]\d* frame\(s\) and compiled none; "
                     r"TORCH_LOGS=recompiles,graph_breaks says why\)", capsys.readouterr().err)
    monkeypatch.setattr(rloo.Sampling, "compile_config", CompileConfig(backend=compile_config.backend, mode=None))
    cpu = rloo.Sampling(rloo.StaticCaches(length), early_stop=False)
    cpu.tokens(model, batch, 3, 5, MAX_NEW, 1.0, *tokens)
    assert cpu.curves()["decoding_graphs"].item() == 0.0 and "compiled no decoding step" not in capsys.readouterr().err


def test_a_compiled_decoding_step_sampled_once_under_a_dispatch_mode_decodes_eagerly_from_then_on(
        tiny_model_dirs, small_prepared):
    """Why bench/objective_step_time.py profiles before it counts operators: the compiled decoding
    step replays its graph at every sampling, until one sampling runs under a torch dispatch mode
    (the bench's operator counter). From then on dynamo skips that code, with no mode active and
    no new graph: each token runs eagerly for the rest of the process."""
    import sys

    sys.path.insert(0, str(ROOT / "bench"))  # bench/ is a folder of scripts, not a package
    from objective_step_time import OpCounter

    config, loss, encoder, batch, model = _setup(tiny_model_dirs["llama"], small_prepared)
    tokens = encoder.tokenizer.eos_token_id, encoder.tokenizer.pad_token_id
    graphs, calls = [], []

    def backend(graph, example_inputs):
        graphs.append(graph)
        return lambda *inputs: calls.append(1) or graph.forward(*inputs)

    torch._dynamo.reset()
    compile_config = CompileConfig(backend=backend, mode=None)
    compile_config._compile_all_devices = True
    settings = {"caches": rloo.StaticCaches(rloo.static_cache_length(False, 96, MAX_NEW)), "compile_config": compile_config,
                "early_stop": False}

    def replays() -> int:
        before = len(calls)
        rloo.sample_tokens(model, batch, 3, 5, MAX_NEW, 1.0, *tokens, **settings)
        return len(calls) - before
    try:
        assert replays() == replays() == MAX_NEW - 1  # every token after the prompt's, compiled
        with OpCounter() as counter:
            assert replays() == 0
        assert counter.ops > 0 and replays() == 0 and len(graphs) == 1
    finally:
        torch._dynamo.reset()
