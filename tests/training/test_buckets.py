"""Length buckets (`pad_to_multiple_of`) and the step's host reads: a compiled step's few shapes
must leave the losses as they were, and the monitor reads a step's values only once the next
step has been launched."""
import pytest
import torch

from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.objectives.registry import CPOConfig
from storyrewrite.training import monitor as monitor_module
from storyrewrite.training.module import RewriteModule
from storyrewrite.training.run import assemble, fit

from helpers import read_jsonl, tiny_run

SHAPED = ("input_ids", "attention_mask", "target_ids", "target_mask")


@pytest.mark.parametrize("kind", ["llama", "bart"])
@pytest.mark.parametrize("objective, settings", [("nll", None), ("cpo", CPOConfig(beta=0.5, lambda_=1.0))])
def test_buckets_pad_every_width_to_the_multiple_and_keep_the_loss(tiny_model_dirs, small_prepared, kind, objective, settings):
    rows = read_jsonl(small_prepared / "timetravel" / "train.jsonl")[:3]
    losses = {}
    for multiple in (None, 16):
        torch.manual_seed(0)
        module, data = assemble(tiny_run(tiny_model_dirs[kind], small_prepared, objective, settings, kind=kind,
                                         pad_to_multiple_of=multiple))
        batch = data.collate(rows)
        module.generator.eval()  # no dropout: the same function both ways
        for layout in [batch] + ([batch["pair"]] if "pair" in batch else []):
            widths = {name: layout[name].shape[1] for name in SHAPED}
            assert all(width % 16 == 0 for width in widths.values()) == (multiple is not None), widths
        with torch.no_grad():
            losses[multiple] = module.loss(module.generator, batch, 0).loss.item()
    assert losses[16] == pytest.approx(losses[None], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_a_bucketed_scorer_gives_the_soft_scores_of_the_unpadded_one(tiny_model_dirs, kind):
    """DTO's scorer: its targets padded to the multiple, and a soft source with padding positions
    beyond the real ones (masked), score as the unpadded scorer does."""
    plain = LMScorer.from_dir(tiny_model_dirs[kind], 96, 40)
    bucketed = LMScorer.from_dir(tiny_model_dirs[kind], 96, 40, pad_to_multiple_of=16)
    vocab = plain.model.get_input_embeddings().weight.shape[0]
    probs = torch.softmax(torch.randn(2, 5, vocab, generator=torch.Generator().manual_seed(0)), dim=-1)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    padded_probs = torch.cat([probs, torch.softmax(torch.randn(2, 11, vocab), dim=-1)], dim=1)  # 16 wide
    padded_mask = torch.cat([mask, torch.zeros(2, 11, dtype=torch.long)], dim=1)
    targets = [["he went home.", "the cat sat on the mat again."], ["yes", "no, not at all"]]
    with torch.no_grad():
        want = plain.score_soft_many(probs, mask, targets)
        got = bucketed.score_soft_many(padded_probs, padded_mask, targets)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_the_monitor_reads_a_step_only_after_the_next_step_is_launched(tmp_path, tiny_model_dirs, small_prepared, monkeypatch):
    """Reading a step's values waits for the device to finish it; they are read at the end of
    the next step's launches (the last step's before its checkpoint), so the host never waits
    inside a step. The curves still hold every step."""
    events = []
    step_loss, read_logs = RewriteModule.step_loss, monitor_module.read_logs

    def stepping(self, batch, batch_idx=0):
        events.append(f"step {self.global_step + 1}")
        return step_loss(self, batch, batch_idx)

    def reading(logs):
        events.append("read")
        return read_logs(logs)
    monkeypatch.setattr(RewriteModule, "step_loss", stepping)
    monkeypatch.setattr(monitor_module, "read_logs", reading)
    run = tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=4, val_check_interval=4,
                   checkpoint_every_n_steps=4, validate_at_start=False)
    fit(run, tmp_path / "out", tmp_path / "ckpt", tmp_path / "logs", ())
    assert events == ["step 1", "step 2", "read", "step 3", "read", "step 4", "read", "read"]
    rows = (tmp_path / "logs" / "plots" / "metrics" / "train_loss.tsv").read_text().splitlines()[1:]
    assert [int(row.split("\t")[0]) for row in rows] == [1, 2, 3, 4]


@pytest.mark.parametrize("kind", ["llama", "bart"])
@pytest.mark.parametrize("multiple", [None, 16])
def test_dto_takes_the_scorers_rows_from_the_data_loader_and_scores_as_from_the_texts(tiny_model_dirs, small_prepared,
                                                                                      kind, multiple):
    """The data loader tokenises a batch's endings for the scorer (Loss.prepare), so that a step
    does no per-instance host work: the loss and its terms are those of the texts tokenised in
    the step, with both target sets (DTO-Score+Delta) and length buckets."""
    from helpers import DTO

    rows = read_jsonl(small_prepared / "timetravel" / "train.jsonl")[:3]
    module, data = assemble(tiny_run(tiny_model_dirs[kind], small_prepared, "score_delta", DTO, tiny_model_dirs[kind],
                                     kind=kind, section="train", pad_to_multiple_of=multiple))
    batch = data.collate(rows)
    assert {"scorer_targets", "scorer_original_endings"} <= batch.keys()
    texts_only = {k: v for k, v in batch.items() if not k.startswith("scorer_")}
    module.generator.eval()
    with torch.no_grad():
        prepared, in_step = module.loss(module.generator, batch, 7), module.loss(module.generator, texts_only, 7)
    torch.testing.assert_close(prepared.loss, in_step.loss, rtol=0, atol=0)
    assert prepared.terms.keys() == in_step.terms.keys()
    for name in prepared.terms:
        torch.testing.assert_close(prepared.terms[name], in_step.terms[name], rtol=0, atol=0)
    # It travels to data-loading worker processes (pickled where they are spawned): no model in it.
    import pickle

    again = pickle.loads(pickle.dumps(module.loss.prepare))(texts_only)
    assert all(torch.equal(a, b) for a, b in zip(again["scorer_targets"], batch["scorer_targets"], strict=True))
