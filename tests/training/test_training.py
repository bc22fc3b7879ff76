import csv
import json
import os
import subprocess
import sys

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback

from storyrewrite.io import InputError
from storyrewrite.models.encoding import Encoder
from storyrewrite.models.loading import load_model, load_tokenizer, materialise
from storyrewrite.objectives import get_objective
from storyrewrite.params import load_yaml
from storyrewrite.training.data import Collate
from storyrewrite.training.module import RewriteModule
from storyrewrite.training.run import fit

from conftest import ROOT, read_jsonl, tiny_models_config, tiny_train_config


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_a_training_step_lowers_the_loss(tiny_model_dirs, small_prepared, kind):
    directory = tiny_model_dirs[kind]
    torch.manual_seed(0)
    loss = get_objective("nll").build(None)
    module = RewriteModule(load_model(directory), loss, lr=1e-2, weight_decay=0.0, warmup_steps=0)
    collate = Collate(Encoder(load_tokenizer(directory), kind == "bart", 96, 40), "timetravel")
    batch = collate(read_jsonl(small_prepared / "timetravel" / "train.jsonl")[:2])
    optimizer = module.configure_optimizers()["optimizer"]
    module.generator.eval()  # no dropout: the comparison is of the same function before and after
    before = module.loss(module.generator, batch, 0)
    before.backward()
    optimizer.step()
    with torch.no_grad():
        after = module.loss(module.generator, batch, 0)
    assert after.item() < before.item() - 1e-3


def _fit(tmp_path, model_dir, prepared, config, callbacks=()):
    return fit(
        config, init_dir=model_dir, out_dir=tmp_path / "out", checkpoint_dir=tmp_path / "ckpt",
        log_dir=tmp_path / "logs", models=tiny_models_config("llama"), prepared_dir=prepared,
        task="timetravel", objective_name="nll", seed=0, callbacks=callbacks,
    )


def _steps(path):
    with open(path, newline="") as f:
        return [int(row["step"]) for row in csv.DictReader(f)]


def test_a_larger_budget_resumes_and_continues_the_step_count(tmp_path, tiny_model_dirs, small_prepared):
    first = _fit(tmp_path, tiny_model_dirs["llama"], small_prepared, tiny_train_config(max_steps=2))
    assert first["global_step"] == 2 and first["resumed_from_step"] is None
    second = _fit(tmp_path, tiny_model_dirs["llama"], small_prepared, tiny_train_config(max_steps=4))
    assert second["resumed_from_step"] == 2 and second["global_step"] == 4
    assert _steps(tmp_path / "logs" / "train_loss.csv") == [1, 2, 3, 4]
    assert _steps(tmp_path / "logs" / "val_loss.csv") == [2, 4]
    assert (tmp_path / "out" / "config.json").exists()
    assert json.loads((tmp_path / "logs" / "summary.json").read_text())["global_step"] == 4


class Crash(Callback):
    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == 3:
            raise RuntimeError("simulated crash")


def test_an_interrupted_run_resumes_from_the_last_checkpoint(tmp_path, tiny_model_dirs, small_prepared):
    config = tiny_train_config(max_steps=5, checkpoint_every_n_steps=2, val_check_interval=5)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _fit(tmp_path, tiny_model_dirs["llama"], small_prepared, config, callbacks=(Crash(),))
    assert not (tmp_path / "out").exists()
    summary = _fit(tmp_path, tiny_model_dirs["llama"], small_prepared, config)
    assert summary["resumed_from_step"] == 2 and summary["global_step"] == 5
    # Step 3 was logged before the crash, after the last checkpoint: logged once, not twice.
    assert _steps(tmp_path / "logs" / "train_loss.csv") == [1, 2, 3, 4, 5]


class BatchRecorder(Callback):
    def __init__(self):
        self.ids = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.ids[trainer.global_step] = batch["ids"]


def test_a_resumed_run_sees_the_batches_the_interrupted_one_had_not_reached(tmp_path, tiny_model_dirs, small_prepared):
    # 12 training instances, batch 2: 6 batches an epoch; 8 steps cross into a second epoch.
    config = tiny_train_config(max_steps=8, checkpoint_every_n_steps=4, val_check_interval=8)
    straight = BatchRecorder()
    _fit(tmp_path / "straight", tiny_model_dirs["llama"], small_prepared, config, callbacks=(straight,))
    resumed = BatchRecorder()

    class CrashAt5(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 5:
                raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError):
        _fit(tmp_path / "resumed", tiny_model_dirs["llama"], small_prepared, config, callbacks=(resumed, CrashAt5()))
    _fit(tmp_path / "resumed", tiny_model_dirs["llama"], small_prepared, config, callbacks=(resumed,))
    assert sorted(straight.ids) == list(range(1, 9))
    assert resumed.ids == straight.ids
    epoch_one = [i for step in range(1, 7) for i in straight.ids[step]]
    assert len(set(epoch_one)) == 12  # a permutation: every instance once per epoch
    assert [i for step in (7, 8) for i in straight.ids[step]] != epoch_one[:4]  # a new order each epoch


def test_a_changed_setting_starts_afresh(tmp_path, tiny_model_dirs, small_prepared):
    _fit(tmp_path, tiny_model_dirs["llama"], small_prepared, tiny_train_config(max_steps=2))
    summary = _fit(tmp_path, tiny_model_dirs["llama"], small_prepared, tiny_train_config(max_steps=2, lr=5e-4))
    assert summary["resumed_from_step"] is None and summary["global_step"] == 2


def test_unknown_objective_lists_valid_ones(tmp_path, tiny_model_dirs, small_prepared):
    with pytest.raises(InputError, match=r"`objective` = 'dpo' is not valid; valid values: nll, cpo, score, delta, score_delta"):
        fit(tiny_train_config(), init_dir=tiny_model_dirs["llama"], out_dir=tmp_path / "o", checkpoint_dir=tmp_path / "c",
            log_dir=tmp_path / "l", models=tiny_models_config("llama"), prepared_dir=small_prepared,
            task="timetravel", objective_name="dpo", seed=0)


def test_ddp_with_two_cpu_processes(tmp_path, small_prepared):
    """The train stage run as DVC runs it, with `devices: 2, strategy: ddp` (gloo on CPU)."""
    params = load_yaml(ROOT / "params.yaml")
    params["models"] = {"generator": "tiny:llama", "scorer": "tiny:llama", "max_input_tokens": 96, "max_output_tokens": 40}
    params["train_nll"] |= {"accelerator": "cpu", "devices": 2, "strategy": "ddp", "max_steps": 2,
                            "val_check_interval": 2, "checkpoint_every_n_steps": 2}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    materialise(tiny_models_config("llama"), tmp_path / "pretrained", seed=0)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "stages" / "train.py"), "--section", "train_nll", "--init", "pretrained",
         "--data", str(small_prepared), "--out", "nll", "--checkpoints", "ckpt", "--logs", "logs"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "logs" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_step"] == 2
    assert (tmp_path / "nll" / "model.safetensors").exists()


def test_dto_trains_and_its_checkpoints_hold_the_generator_only(tmp_path, tiny_model_dirs, small_prepared):
    from storyrewrite.params import DTOConfig

    config = tiny_train_config(max_steps=2)
    fit(config, init_dir=tiny_model_dirs["llama"], out_dir=tmp_path / "nll", checkpoint_dir=tmp_path / "c_nll",
        log_dir=tmp_path / "l_nll", models=tiny_models_config("llama"), prepared_dir=small_prepared,
        task="timetravel", objective_name="nll", seed=0)
    summary = fit(config, init_dir=tmp_path / "nll", out_dir=tmp_path / "dto", checkpoint_dir=tmp_path / "c_dto",
                  log_dir=tmp_path / "l_dto", models=tiny_models_config("llama"), prepared_dir=small_prepared,
                  task="timetravel", objective_name="score_delta", seed=0, dto=DTOConfig(tau=1.0, hard=False),
                  scorer_dir=tiny_model_dirs["llama"])
    assert summary["objective"] == "score_delta" and summary["global_step"] == 2
    assert summary["best_val_nll"] is not None
    for name in ("best.ckpt", "last.ckpt"):
        nll_size, dto_size = (tmp_path / "c_nll" / name).stat().st_size, (tmp_path / "c_dto" / name).stat().st_size
        assert dto_size <= nll_size * 1.01, name
    state = torch.load(tmp_path / "c_dto" / "last.ckpt", map_location="cpu", weights_only=False)
    assert all(key.startswith("generator.") for key in state["state_dict"])


@pytest.mark.parametrize("task", ["timetravel_ablated", "art"])
def test_dto_score_and_nll_train_on_the_ablated_tasks(tmp_path, tiny_model_dirs, small_prepared, task):
    from storyrewrite.params import DTOConfig

    for objective in ("nll", "score"):
        summary = fit(tiny_train_config(max_steps=1, val_check_interval=1), init_dir=tiny_model_dirs["llama"],
                      out_dir=tmp_path / objective, checkpoint_dir=tmp_path / f"c_{objective}", log_dir=tmp_path / f"l_{objective}",
                      models=tiny_models_config("llama"), prepared_dir=small_prepared, task=task, objective_name=objective,
                      seed=0, dto=DTOConfig(tau=1.0, hard=False), scorer_dir=tiny_model_dirs["llama"])
        assert summary["task"] == task and summary["global_step"] == 1 and summary["best_val_loss"] is not None
