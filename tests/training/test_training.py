import functools
import json
import logging
import math
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback
from safetensors.torch import load_file

from storyrewrite.errors import locate
from storyrewrite.data.formatting import model_source, model_target
from storyrewrite.io import InputError
from storyrewrite.models.encoding import Encoder
from storyrewrite.models.materialise import materialise
from storyrewrite.models.store import load_tokenizer
from storyrewrite.objectives.base import NLL
from storyrewrite.objectives.registry import CPOConfig
from storyrewrite.params import load_yaml
from storyrewrite.curves import curve_files, read_curve
from storyrewrite.systems import TRAINING_PLAN
from storyrewrite.training.data import Collate
from storyrewrite.training.monitor import TrainingDiverged, TrainingMonitor
from storyrewrite.training.run import NoCloudTips, assemble, bf16_emulation_warning, fit

from helpers import DTO, RL, ROOT, read_jsonl, tiny_models_config, tiny_run, tiny_train_config


@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_a_batch_counts_every_real_token_the_generator_reads(tiny_model_dirs, small_prepared, kind, pairs):
    """`num_tokens` (tokens/s in the logs and the benches): each row's source and target tokens,
    in a causal LM's one sequence or a seq2seq model's encoder and decoder; CPO's rejected rows too."""
    seq2seq = kind == "bart"
    tokenizer = load_tokenizer(tiny_model_dirs[kind])
    encoder = Encoder(tokenizer, seq2seq, 96, 40)
    rows = read_jsonl(small_prepared / "timetravel" / "train.jsonl")[:3]
    sources = encoder.source_ids([model_source(row, "timetravel", tokenizer, seq2seq) for row in rows])
    endings = [row["target"] for row in rows] + ([row["original_ending"] for row in rows] if pairs else [])
    targets = encoder.target_ids([model_target(text, seq2seq) for text in endings])
    expected = sum(map(len, sources)) * (2 if pairs else 1) + sum(map(len, targets))
    assert Collate(encoder, "timetravel", pairs=pairs)(rows)["num_tokens"] == expected


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_a_training_step_lowers_the_loss(tiny_model_dirs, small_prepared, kind):
    torch.manual_seed(0)
    module, data = assemble(tiny_run(tiny_model_dirs[kind], small_prepared, kind=kind, lr=1e-2))
    batch = data.collate(read_jsonl(small_prepared / "timetravel" / "train.jsonl")[:2])
    optimizer = module.configure_optimizers()["optimizer"]
    module.generator.eval()  # no dropout: the comparison is of the same function before and after
    before = module.loss(module.generator, batch, 0).loss
    before.backward()
    optimizer.step()
    with torch.no_grad():
        after = module.loss(module.generator, batch, 0).loss
    assert after.item() < before.item() - 1e-3


def test_the_optimiser_warms_up_linearly_to_lr_and_decays_the_weights(tiny_model_dirs, small_prepared):
    """AdamW with `weight_decay`; the lr rises linearly over `warmup_steps` (the first step at
    lr / warmup_steps, not 0) and stays at `lr` (the paper trains at a constant lr)."""
    for warmup, expected in ((4, [2.5e-3, 5e-3, 7.5e-3, 1e-2, 1e-2, 1e-2]), (0, [1e-2] * 6)):
        module, _ = assemble(tiny_run(tiny_model_dirs["llama"], small_prepared, lr=1e-2, weight_decay=0.1, warmup_steps=warmup))
        configured = module.configure_optimizers()
        optimizer, schedule = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
        assert isinstance(optimizer, torch.optim.AdamW) and optimizer.param_groups[0]["weight_decay"] == 0.1
        lrs = []
        for _ in expected:
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            schedule.step()
        assert lrs == pytest.approx(expected)


def test_the_logged_gradient_norm_is_the_norm_of_all_gradients_together(tiny_model_dirs, small_prepared):
    module, data = assemble(tiny_run(tiny_model_dirs["llama"], small_prepared))
    module.step_loss(data.collate(read_jsonl(small_prepared / "timetravel" / "train.jsonl")[:2])).backward()
    module.on_before_optimizer_step(None)
    total = torch.nn.utils.clip_grad_norm_(module.generator.parameters(), float("inf"))  # (inf: measures, clips nothing)
    assert module.step_logs["grad_norm"].item() == pytest.approx(total.item(), rel=1e-5)


def test_validation_logs_the_nll_whatever_the_objective(tiny_model_dirs, small_prepared, monkeypatch):
    """`val_nll` compares runs of different objectives (model selection, the collector's choice of
    a run per system): a DTO run logs the NLL of the validation batch there, as the NLL objective
    computes it, beside its own loss."""
    dto, dto_data = assemble(tiny_run(tiny_model_dirs["llama"], small_prepared, "score", DTO, tiny_model_dirs["llama"], section="train"))
    nll, nll_data = assemble(tiny_run(tiny_model_dirs["llama"], small_prepared))
    rows = read_jsonl(small_prepared / "timetravel" / "val.jsonl")[:2]
    logged = {}
    monkeypatch.setattr(dto, "log", lambda name, value, **_: logged.__setitem__(name, float(value)))
    with torch.no_grad():
        dto.generator.eval(), nll.generator.eval()
        dto.validation_step(dto_data.collate(rows), 0)
        expected = nll.loss(nll.generator, nll_data.collate(rows), 0).loss.item()
    assert logged["val_nll"] == pytest.approx(expected, rel=1e-5) and abs(logged["val_loss"] - logged["val_nll"]) > 1e-3


def _fit(tmp_path, run, callbacks=(), diagnostics=True):
    return fit(run, tmp_path / "out", tmp_path / "ckpt", tmp_path / "logs", callbacks, diagnostics=diagnostics)


def _curve(log_dir, name):
    """A DVCLive curve's rows ({"step", "value"}), read as a user's plot would."""
    return read_curve(log_dir / "plots" / "metrics" / f"{name}.tsv")


def _steps(log_dir, name):
    return [row["step"] for row in _curve(log_dir, name)]


def test_a_finished_run_is_never_resumed(tmp_path, tiny_model_dirs, small_prepared):
    run = tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=2)
    first = _fit(tmp_path, run)
    assert first["global_step"] == 2 and first["resumed_from_step"] is None
    # The same run again (what `dvc repro -f` asks for) trains every step again.
    again = _fit(tmp_path, run)
    assert again["resumed_from_step"] is None and again["global_step"] == 2
    # A larger budget after a finished run: a new run from step 0, not a continuation.
    longer = _fit(tmp_path, tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=4))
    assert longer["resumed_from_step"] is None and longer["global_step"] == 4
    assert _steps(tmp_path / "logs", "train_loss") == [1, 2, 3, 4]
    # Step 0: the starting weights, validated before training; never the exported checkpoint.
    assert _steps(tmp_path / "logs", "val_loss") == [0, 2, 4]
    assert (tmp_path / "out" / "config.json").exists()
    # Beside the weights, what they were trained for: the rewrite command checks the task against it.
    trained = json.loads((tmp_path / "out" / "storyrewrite.json").read_text())
    assert (trained["task"], trained["objective"]) == (run.task, "nll") and trained["label"]
    summary = json.loads((tmp_path / "logs" / "metrics.json").read_text())
    # The exported weights are those of the lowest validation loss after the start.
    losses = {row["step"]: row["value"] for row in _curve(tmp_path / "logs", "val_loss") if row["step"] > 0}
    assert len(set(losses.values())) == 2
    assert summary["global_step"] == 4 and summary["best_step"] == min(losses, key=losses.get)
    assert summary["best_val_loss"] == pytest.approx(min(losses.values()), abs=1e-6)


class Crash(Callback):
    def __init__(self, at: int):
        self.at = at

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.at:
            raise RuntimeError("simulated crash")


def _plan(checkpoint_dir) -> dict:
    """What the training wrote beside its checkpoints as it started (TrainingPlan)."""
    return json.loads((checkpoint_dir / TRAINING_PLAN).read_text())


def test_an_interrupted_run_resumes_from_the_last_checkpoint(tmp_path, tiny_model_dirs, small_prepared):
    run = tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=5, checkpoint_every_n_steps=2, val_check_interval=5)
    before = time.time()
    with pytest.raises(RuntimeError, match="simulated crash"):
        _fit(tmp_path, run, callbacks=(Crash(3),))
    assert not (tmp_path / "out").exists()
    first = _plan(tmp_path / "ckpt")
    assert (first["steps"], first["from_step"]) == (5, 0) and before <= first["started_at"] <= time.time()
    summary = _fit(tmp_path, run)
    assert summary["resumed_from_step"] == 2 and summary["global_step"] == 5
    # The resumed run's plan: the same total, from the checkpoint it resumed, started anew.
    resumed = _plan(tmp_path / "ckpt")
    assert (resumed["steps"], resumed["from_step"]) == (5, 2) and resumed["started_at"] > first["started_at"]
    # Step 3 was logged before the crash, after the last checkpoint: logged once, not twice; the
    # starting weights were validated once, by the interrupted run.
    assert _steps(tmp_path / "logs", "train_loss") == [1, 2, 3, 4, 5]
    assert _steps(tmp_path / "logs", "grad_norm") == [1, 2, 3, 4, 5]
    assert _steps(tmp_path / "logs", "val_loss") == [0, 5]
    assert summary["start_val_loss"] is not None


def test_an_epoch_bound_run_plans_the_steps_it_takes(tmp_path, tiny_model_dirs, small_prepared):
    """One epoch of batches of 5 with 2 batches a step: the training instances over 5, then over 2,
    each rounded up (a last short batch, and a last step of one batch, count), as the run's own
    global step ends."""
    instances = len(read_jsonl(small_prepared / "timetravel" / "train.jsonl"))
    run = tiny_run(tiny_model_dirs["llama"], small_prepared, batch_size=5, max_steps=-1, max_epochs=1, accumulate_grad_batches=2,
                   val_check_interval=2, validate_at_start=False)
    summary = _fit(tmp_path, run)
    assert instances % 5 and math.ceil(instances / 5) % 2  # both rounded up
    assert _plan(tmp_path / "ckpt")["steps"] == math.ceil(math.ceil(instances / 5) / 2) == summary["global_step"]


def test_a_refused_rerun_keeps_the_interrupted_runs_checkpoints(tmp_path, tiny_model_dirs, small_prepared, monkeypatch):
    # The rerun of an interrupted GPU run on a machine whose GPU is not visible, say: Lightning
    # refuses the same settings, and the checkpoints wait for a machine that can resume them.
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    import storyrewrite.training.run as run_module

    run = tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=5, checkpoint_every_n_steps=2, val_check_interval=5)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _fit(tmp_path, run, callbacks=(Crash(3),))
    kept = sorted(path.name for path in (tmp_path / "ckpt").iterdir())

    def refuse(*args, **kwargs):
        raise MisconfigurationException("No supported gpu backend found!")
    with monkeypatch.context() as patched:
        patched.setattr(run_module.L, "Trainer", refuse)
        with pytest.raises(InputError, match="which cannot run here: No supported gpu backend found!"):
            _fit(tmp_path, run)
    assert sorted(path.name for path in (tmp_path / "ckpt").iterdir()) == kept and "last.ckpt" in kept
    summary = _fit(tmp_path, run)
    assert summary["resumed_from_step"] == 2 and summary["global_step"] == 5


@pytest.mark.parametrize("objective", ["nll", "score_delta", "cpo", "rloo"])
def test_each_objectives_batches_travel_to_a_spawned_data_loader_worker(tiny_model_dirs, small_prepared, objective):
    """A data-loading worker started by spawn or forkserver (macOS's default; Linux's from Python
    3.14) gets the collate function pickled: it holds no model, and makes the same batch there."""
    import io
    import pickle

    settings = {"nll": None, "score_delta": DTO, "cpo": CPOConfig(beta=0.1, **{"lambda": 1.0}), "rloo": RL}[objective]
    _, data = assemble(tiny_run(tiny_model_dirs["llama"], small_prepared, objective, settings, tiny_model_dirs["llama"],
                                section="train"))
    models = []

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, torch.nn.Module):
                models.append(type(obj).__name__)
            return NotImplemented

    buffer = io.BytesIO()
    Pickler(buffer).dump(data.collate)
    assert models == []
    rows = read_jsonl(small_prepared / "timetravel" / "train.jsonl")[:3]

    def same(a, b) -> bool:  # tensors, their tuples and dicts (a pair's rows), and plain values
        if isinstance(a, torch.Tensor):
            return torch.equal(a, b)
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
        if isinstance(a, tuple):
            return len(a) == len(b) and all(map(same, a, b))
        return a == b

    here, there = data.collate(rows), pickle.loads(buffer.getvalue())(rows)
    assert here.keys() == there.keys() and all(same(here[key], there[key]) for key in here)


def test_an_interrupted_run_continues_under_a_larger_budget(tmp_path, tiny_model_dirs, small_prepared):
    # With data-loading workers, as the GPU profile uses them.
    settings = dict(checkpoint_every_n_steps=2, val_check_interval=5, num_workers=2)
    with pytest.raises(RuntimeError):
        _fit(tmp_path, tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=5, **settings), callbacks=(Crash(3),))
    summary = _fit(tmp_path, tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=6, **settings))
    assert summary["resumed_from_step"] == 2 and summary["global_step"] == 6


class BatchRecorder(Callback):
    def __init__(self):
        self.ids = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.ids[trainer.global_step] = batch["ids"]


def test_a_resumed_run_sees_the_batches_the_interrupted_one_had_not_reached(tmp_path, tiny_model_dirs, small_prepared):
    # 12 training instances, batch 2: 6 batches an epoch; 8 steps cross into a second epoch.
    run = tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=8, checkpoint_every_n_steps=4, val_check_interval=8)
    straight = BatchRecorder()
    _fit(tmp_path / "straight", run, callbacks=(straight,))
    resumed = BatchRecorder()
    with pytest.raises(RuntimeError):
        _fit(tmp_path / "resumed", run, callbacks=(resumed, Crash(5)))
    _fit(tmp_path / "resumed", run, callbacks=(resumed,))
    assert sorted(straight.ids) == list(range(1, 9))
    assert resumed.ids == straight.ids
    epoch_one = [i for step in range(1, 7) for i in straight.ids[step]]
    assert len(set(epoch_one)) == 12  # a permutation: every instance once per epoch
    assert [i for step in (7, 8) for i in straight.ids[step]] != epoch_one[:4]  # a new order each epoch


def test_a_changed_setting_starts_afresh(tmp_path, tiny_model_dirs, small_prepared):
    run = tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=3, checkpoint_every_n_steps=1, val_check_interval=3)
    with pytest.raises(RuntimeError):
        _fit(tmp_path, run, callbacks=(Crash(2),))
    summary = _fit(tmp_path, tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=3, lr=5e-4, val_check_interval=3))
    assert summary["resumed_from_step"] is None and summary["global_step"] == 3


def test_a_checkpoint_is_resumed_only_by_a_run_of_the_same_weights_data_settings_and_seed(tmp_path, tiny_model_dirs, small_prepared):
    """The run fingerprint holds the starting weights, the training and validation data, the
    settings but the budget, the objective's settings and the seed: a longer budget resumes, a
    change to any of the others starts afresh."""
    import shutil
    from dataclasses import replace

    from storyrewrite.models.store import load_model
    from storyrewrite.training.run import run_fingerprint

    run = tiny_run(tiny_model_dirs["llama"], small_prepared)
    name = run_fingerprint(run)
    assert run_fingerprint(tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=7)) == name
    model = load_model(tiny_model_dirs["llama"])
    with torch.no_grad():
        model.get_input_embeddings().weight[0, 0] += 1.0
    model.save_pretrained(tmp_path / "weights")
    load_tokenizer(tiny_model_dirs["llama"]).save_pretrained(tmp_path / "weights")
    data = {}
    for split in ("train", "val"):
        data[split] = tmp_path / split
        shutil.copytree(small_prepared, data[split])
        path = data[split] / "timetravel" / f"{split}.jsonl"
        rows = read_jsonl(path)
        path.write_text("".join(json.dumps({**row, "target": row["target"] + " Then it rained."} if i == 0 else row) + "\n"
                                for i, row in enumerate(rows)))
    dto = tiny_run(tiny_model_dirs["llama"], small_prepared, "score", DTO, tiny_model_dirs["llama"], section="train")
    others = [run_fingerprint(tiny_run(tmp_path / "weights", small_prepared)),
              run_fingerprint(tiny_run(tiny_model_dirs["llama"], data["train"])),
              run_fingerprint(tiny_run(tiny_model_dirs["llama"], data["val"])),
              run_fingerprint(tiny_run(tiny_model_dirs["llama"], small_prepared, lr=5e-4)),
              run_fingerprint(replace(run, seed=1)),
              run_fingerprint(dto), run_fingerprint(replace(dto, settings=DTO.model_copy(update={"tau": 0.5})))]
    assert len({name, *others}) == 1 + len(others)


def test_an_objectives_checkpoints_depend_on_its_own_code_only():
    """The NLL run's fingerprint covers the NLL code, not DTO's or CPO's or the scorer's: an edit to
    a DTO loss keeps an interrupted NLL run resumable; a DTO run's covers its loss and the scorer."""
    from storyrewrite import closure
    from storyrewrite.objectives.registry import OBJECTIVES
    from storyrewrite.training import run as run_module

    def files(name):
        objective = OBJECTIVES[name]
        return {p.name for p in closure.closure(run_module.__file__) | closure.closure(closure.module_file(objective.module_name))}

    assert "nll.py" in files("nll") and not files("nll") & {"dto.py", "cpo.py", "lm_scorer.py"}
    assert {"dto.py", "lm_scorer.py", "nll.py"} <= files("score") and "cpo.py" not in files("score")
    assert run_module.code_digest(OBJECTIVES["nll"]) != run_module.code_digest(OBJECTIVES["score"])


def test_unknown_objective_lists_valid_ones(tmp_path, tiny_model_dirs, small_prepared, shipped_objectives):
    with pytest.raises(InputError, match=r"`objective` = 'dpo' is not valid; valid values: nll, cpo, score, delta, score_delta, rloo$"):
        _fit(tmp_path, tiny_run(tiny_model_dirs["llama"], small_prepared, objective="dpo"))


@pytest.mark.parametrize("changes, reason", [
    ({"accelerator": "mps"}, "`MPSAccelerator` can not run on your system"),  # Apple's GPU, never on Linux
    ({"strategy": "deepspeed"}, "you must have DeepSpeed installed"),  # not one of the project's packages
])
def test_settings_this_machine_cannot_run_end_in_one_line_naming_them(tmp_path, tiny_model_dirs, small_prepared, changes, reason):
    run = tiny_run(tiny_model_dirs["llama"], small_prepared, **changes)
    with pytest.raises(InputError) as caught:
        _fit(tmp_path, run)
    message = str(caught.value)
    config = run.config
    assert message.startswith(f"params: `train_nll` asks the Lightning Trainer for accelerator '{config.accelerator}', devices "
                              f"{config.devices!r}, strategy '{config.strategy}', precision '32-true', num_nodes 1, which cannot run here: ")
    assert reason in message and "\n" not in message
    assert not (tmp_path / "out").exists() and not (tmp_path / "ckpt").exists()  # nothing left behind
    # As the stage prints it: from the line of params.yaml where the section starts.
    line = next(number for number, text in enumerate((ROOT / "params.yaml").read_text().splitlines(), 1) if text.startswith("train_nll:"))
    assert str(locate(caught.value, [ROOT / "params.yaml"])) == f"{ROOT / 'params.yaml'}:{line}: {message.removeprefix('params: ')}"


def test_divergence_stops_at_once_and_exports_nothing(tmp_path, tiny_model_dirs, small_prepared):
    run = tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=6, lr=1e9, checkpoint_every_n_steps=1, val_check_interval=6)
    with pytest.raises(TrainingDiverged) as caught:
        _fit(tmp_path, run)
    message = str(caught.value)
    assert message.startswith("training diverged at step ") and "(train_nll, objective nll): train_loss = " in message
    assert "lr = 1e+09. Lower `train_nll.lr` or change `train_nll.precision` (now 32-true)" in message
    assert message.endswith("last.ckpt keeps the last finite checkpoint")
    summary = tmp_path / "logs" / "metrics.json"  # DVCLive's latest values, never the run's summary
    assert not (tmp_path / "out").exists() and (not summary.exists() or "global_step" not in json.loads(summary.read_text()))
    step = int(message.split("step ")[1].split(" ")[0])
    # The last checkpoint is the one before the diverged step, and finite.
    state = torch.load(tmp_path / "ckpt" / "last.ckpt", map_location="cpu", weights_only=False)
    assert state["global_step"] == step - 1
    assert all(torch.isfinite(v).all() for v in state["state_dict"].values())


def test_a_non_finite_gradient_stops_unless_fp16_loss_scaling_is_at_work():
    monitor = TrainingMonitor.__new__(TrainingMonitor)
    monitor.section, monitor.objective = "train", "score"
    trainer = SimpleNamespace(global_step=7, precision="32-true", default_root_dir="no-such-dir",
                              precision_plugin=SimpleNamespace(scaler=None))
    with pytest.raises(TrainingDiverged, match=r"at step 7 \(train, objective score\): train_loss = 1\.5, grad_norm = inf; lr = 1e-05\. "
                                               r".*no model was exported, and no checkpoint had been written yet$"):
        monitor._check(trainer, {"train_loss": 1.5}, math.inf, 1e-5)
    trainer.precision_plugin.scaler = object()  # a GradScaler skips that step and lowers its scale
    monitor._check(trainer, {"train_loss": 1.5}, math.inf, 1e-5)
    with pytest.raises(TrainingDiverged, match=r"m_original = nan"):
        monitor._check(trainer, {"train_loss": 1.5, "m_original": math.nan}, 2.0, 1e-5)
    # The validation of the starting weights (no optimiser, no lr yet): the model, not the lr, is at fault.
    trainer.global_step = 0
    with pytest.raises(TrainingDiverged, match=r"^the starting weights give non-finite values before training \(train, objective "
                                               r"score, validation\): val_loss = nan\. .*nothing was trained or exported$"):
        monitor._check(trainer, {"val_loss": math.nan}, None, None)


def _train_nll_stage(tmp_path, small_prepared, changes: dict, dto: dict | None = None) -> subprocess.CompletedProcess:
    """The train_nll stage's script run as DVC runs it, on a tiny Llama."""
    params = load_yaml(ROOT / "params.yaml")
    params["models"] = {"generator": "tiny:llama", "scorer": "tiny:llama", "max_input_tokens": 96, "max_output_tokens": 40}
    params["train_nll"] |= {"accelerator": "cpu", **changes}
    params["dto"] |= dto or {}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    materialise(tiny_models_config("llama"), tmp_path / "pretrained", seed=0)
    return subprocess.run(
        [sys.executable, str(ROOT / "stages" / "train_nll.py"), "--init", "pretrained",
         "--data", str(small_prepared), "--out", "nll", "--checkpoints", "ckpt", "--logs", "logs"],
        cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
    )


@pytest.mark.slow
def test_the_stage_exits_2_with_one_message_on_divergence(tmp_path, small_prepared):
    result = _train_nll_stage(tmp_path, small_prepared, {"lr": 1e9, "max_steps": 4, "val_check_interval": 4,
                                                         "checkpoint_every_n_steps": 1})
    assert result.returncode == 2, result.stderr[-3000:]
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("error: training diverged at step ") and "Lower `train_nll.lr`" in message  # the key to change
    assert not (tmp_path / "nll").exists()


@pytest.mark.slow
def test_ddp_with_two_cpu_processes(tmp_path, small_prepared):
    """The train stage run as DVC runs it, with `devices: 2, strategy: ddp` (gloo on CPU)."""
    # An invalid `dto` section is no concern of NLL training, which never reads it.
    result = _train_nll_stage(tmp_path, small_prepared, {"devices": 2, "strategy": "ddp", "max_steps": 2,
                                                         "val_check_interval": 2, "checkpoint_every_n_steps": 2},
                              dto={"tau": -1.0})
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "logs" / "metrics.json").read_text())
    assert summary["world_size"] == 2 and summary["global_step"] == 2
    assert _steps(tmp_path / "logs", "train_loss") == [1, 2]  # one process wrote the curves
    assert (tmp_path / "nll" / "model.safetensors").exists()


def test_dto_trains_and_its_checkpoints_hold_the_generator_only(tmp_path, tiny_model_dirs, small_prepared):
    fit(tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=2), tmp_path / "nll", tmp_path / "c_nll", tmp_path / "l_nll")
    summary = fit(tiny_run(tmp_path / "nll", small_prepared, "score_delta", DTO, tiny_model_dirs["llama"], section="train", max_steps=2),
                  tmp_path / "dto", tmp_path / "c_dto", tmp_path / "l_dto")
    assert summary["objective"] == "score_delta" and summary["label"] == "DTO-Score+Delta" and summary["global_step"] == 2
    assert summary["best_val_nll"] is not None and summary["settings"] == {"tau": 1.0, "hard": False, "scorer_dtype": "float32"}
    nll_size, dto_size = (tmp_path / "c_nll" / "best.ckpt").stat().st_size, (tmp_path / "c_dto" / "best.ckpt").stat().st_size
    assert dto_size <= nll_size * 1.01
    state = torch.load(tmp_path / "c_dto" / "best.ckpt", map_location="cpu", weights_only=False)
    assert all(key.startswith("generator.") for key in state["state_dict"])


def test_frozen_models_placed_by_a_validation_hook_can_be_trained_through(tiny_model_dirs, small_prepared):
    """A Trainer at Lightning's default validates in inference mode (ours does not: a compiled
    body would compile twice), and the validation of the starting weights places the scorer
    first: a scorer moved there to another device must not become inference tensors, which the
    training steps' autograd would refuse. The meta device stands in for a GPU."""
    module, _ = assemble(tiny_run(tiny_model_dirs["llama"], small_prepared, "score", DTO, tiny_model_dirs["llama"], section="train"))
    module._device = torch.device("meta")  # LightningModule.device's own attribute, which Lightning sets
    with torch.inference_mode():
        module.on_validation_start()
    parameters = list(module.loss.scorer.model.parameters())
    assert all(p.device.type == "meta" and not p.is_inference() for p in parameters)


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_under_bf16_mixed_the_frozen_scorer_holds_its_linear_weights_in_bf16_and_the_step_is_the_same(
        tiny_model_dirs, small_prepared, kind):
    """A DTO step under the autocast of bf16-mixed: with the scorer's linear weights stored in
    bf16 (what autocast casts them to at every call) the loss and every gradient are those of
    the float32 scorer bit for bit, with as many fewer casts as the scorer's forward has linear
    calls; the input embedding stays float32 and a tied output layer gets its own copy. The casts
    are counted by the step bench's operator counter."""
    sys.path.insert(0, str(ROOT / "bench"))  # bench/ is a folder of scripts, not a package
    from objective_step_time import OpCounter

    model_dir = tiny_model_dirs[kind]
    batch = None
    results = {}
    for precision in ("bf16-mixed", "32-true"):
        run = tiny_run(model_dir, small_prepared, "score_delta", DTO, model_dir, section="train", kind=kind, precision=precision)
        module, data = assemble(run)
        batch = batch or data.collate(read_jsonl(small_prepared / "timetravel" / "train.jsonl")[:2])
        module.generator.eval()  # no dropout: both steps compute one function
        module.on_fit_start()
        scorer = module.loss.scorer.model
        linear = [m for m in scorer.modules() if isinstance(m, torch.nn.Linear)]
        with OpCounter() as counter, torch.autocast("cpu", dtype=torch.bfloat16):
            loss = module.step_loss(batch)
        loss.backward()
        grads = {name: p.grad for name, p in module.generator.named_parameters()}
        results[precision] = (loss.detach(), grads, counter.counts["aten._to_copy"], {m.weight.dtype for m in linear})
        assert scorer.get_input_embeddings().weight.dtype == torch.float32
        if precision == "bf16-mixed":
            assert scorer.get_output_embeddings().weight is not scorer.get_input_embeddings().weight
            assert torch.equal(scorer.get_output_embeddings().weight, scorer.get_input_embeddings().weight.to(torch.bfloat16))
    (loss, grads, casts, dtypes), (loss_ref, grads_ref, casts_ref, dtypes_ref) = results["bf16-mixed"], results["32-true"]
    assert dtypes == {torch.bfloat16} and dtypes_ref == {torch.float32}
    assert torch.equal(loss, loss_ref) and loss.dtype == torch.float32
    assert grads.keys() == grads_ref.keys() and all(torch.equal(grads[k], grads_ref[k]) for k in grads)
    assert casts_ref - casts >= len(linear)  # each linear layer runs at least once per forward


@pytest.mark.parametrize("task", ["timetravel_ablated", "art"])
def test_dto_score_and_nll_train_on_the_ablated_tasks(tmp_path, tiny_model_dirs, small_prepared, task):
    for objective in ("nll", "score"):
        run = tiny_run(tiny_model_dirs["llama"], small_prepared, objective, DTO if objective == "score" else None,
                       tiny_model_dirs["llama"], task=task, section="train", max_steps=1, val_check_interval=1)
        summary = fit(run, tmp_path / objective, tmp_path / f"c_{objective}", tmp_path / f"l_{objective}")
        assert summary["task"] == task and summary["global_step"] == 1 and summary["best_val_loss"] is not None


CLOCK = {"tokens_per_s", "cpu_time_share", "cpu_wait_time_share"}  # wall-time curves: not in the summary
COMMON = {"train_loss", "lr", "grad_norm", "val_loss", "val_nll"} | CLOCK
DTO_TRAIN = {"m_target", "gumbel_entropy", "gumbel_max_prob", "nll_target"}
DTO_VAL = {"val_m_target", "val_m_original", "val_delta", "val_gumbel_entropy", "val_gumbel_max_prob", "val_nll_target"}
RLOO = {"reward", "reward_std", "kl", "advantage_abs", "completions/mean_length", "completions/clipped_ratio"}
CPO = {"rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen", "logps/rejected", "nll_term"}


@pytest.mark.parametrize("objective, settings, columns", [
    ("nll", None, COMMON | {"token_accuracy", "val_token_accuracy"}),
    ("score", DTO, COMMON | DTO_TRAIN | DTO_VAL),  # m_original needs an extra pass: validation only
    ("score_delta", DTO, COMMON | DTO_TRAIN | {"m_original", "delta"} | DTO_VAL),
    ("cpo", CPOConfig(beta=0.5, lambda_=1.0), COMMON | CPO | {"preference"} | {f"val_{c}" for c in CPO | {"preference"}}),
    ("rloo", RL, COMMON | RLOO | {"sample_time_share", "sample_read_time_share"} | {f"val_{c}" for c in RLOO}),
])
def test_each_objective_writes_its_named_curves(tmp_path, tiny_model_dirs, small_prepared, objective, settings, columns):
    kind = "bart" if objective == "cpo" else "llama"  # CPO on the seq2seq path (the paper's generator), the rest causal
    run = tiny_run(tiny_model_dirs[kind], small_prepared, objective, settings, tiny_model_dirs[kind], section="train",
                   max_steps=2, val_check_interval=2)
    summary = _fit(tmp_path, run)
    written = curve_files(tmp_path / "logs")
    for name, path in written.items():
        assert path.read_text().splitlines()[0] == f"step\t{name.split('/')[-1]}", path
    assert set(written) == columns
    # Every curve is documented in the registry (docs/training.md's table is made from it).
    from storyrewrite.objectives.registry import COMMON_CURVES, CURVES
    documented = set(COMMON_CURVES) | set(CURVES[objective])
    assert all(name in documented or name.removeprefix("val_") in documented for name in written), set(written) - documented
    # The summary (DVC metrics) holds DVCLive's latest value of every curve but the wall-time ones
    # (`rewards/chosen` nested), the last row of its file, and no wall time; the curves stay in their files.
    metrics = json.loads((tmp_path / "logs" / "metrics.json").read_text())
    for name, path in written.items():
        *parents, leaf = name.split("/")
        latest = functools.reduce(lambda found, key: found.get(key, {}), parents, metrics).get(leaf)
        if name in CLOCK | {"sample_time_share", "sample_read_time_share"}:
            assert latest is None, name
        else:
            assert latest == pytest.approx(read_curve(path)[-1]["value"]) and math.isfinite(latest), name
    assert "curves" not in metrics and not CLOCK & set(metrics)
    assert "train_seconds" not in metrics and summary["train_seconds"] > 0
    # What the report's training section shows: logged in training, or (DTO-Score's m_original) in validation.
    assert all(name in columns or f"val_{name}" in columns for name in summary["main_diagnostics"])


def test_with_gradient_accumulation_the_curves_hold_a_row_per_optimiser_step_its_batches_mean(tmp_path, tiny_model_dirs,
                                                                                               small_prepared, monkeypatch):
    """Two batches an optimiser step: each step's row is the mean of its batches' values, read
    here from the module batch by batch, at the step Lightning counts; the gradient norm, taken
    before the optimiser steps, is the second batch's. Each batch draws its own noise."""
    from storyrewrite.objectives.base import Loss

    seeds, call = [], Loss.__call__

    def seeded(self, generator, batch, noise_seed, validation=False):
        if not validation:
            seeds.append(noise_seed)
        return call(self, generator, batch, noise_seed, validation)
    monkeypatch.setattr(Loss, "__call__", seeded)

    class Batches(Callback):
        def __init__(self):
            self.logged = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.logged.append({name: value.item() for name, value in pl_module.step_logs.items()})

    spy = Batches()
    run = tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=3, accumulate_grad_batches=2, val_check_interval=100)
    summary = _fit(tmp_path, run, [spy])
    assert summary["global_step"] == 3 and len(spy.logged) == 6
    assert "grad_norm" not in spy.logged[0] and "grad_norm" in spy.logged[1]
    for name in ("train_loss", "token_accuracy"):
        rows = _curve(tmp_path / "logs", name)
        assert [row["step"] for row in rows] == [1, 2, 3]
        expected = [(spy.logged[i][name] + spy.logged[i + 1][name]) / 2 for i in (0, 2, 4)]
        assert [row["value"] for row in rows] == pytest.approx(expected, rel=1e-6)
    assert [row["value"] for row in _curve(tmp_path / "logs", "grad_norm")] == pytest.approx(
        [spy.logged[i]["grad_norm"] for i in (1, 3, 5)], rel=1e-6)
    assert _steps(tmp_path / "logs", "tokens_per_s") == [1, 2, 3]
    assert seeds == [0, 1, 2, 3, 4, 5]  # (seed 0: the k-th batch of step g draws from 2·g + k)
    seeds.clear()
    _fit(tmp_path / "one", tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=3, val_check_interval=100))
    assert seeds == [0, 1, 2]  # one batch a step: the step's seed, as before


@pytest.mark.slow
def test_the_starting_weights_are_validated_at_step_0_and_training_is_the_same_without(tmp_path, tiny_model_dirs, small_prepared):
    """DTO (its scorer must be on the generator's device in `Trainer.validate` as in fit): the
    step-0 validation loss is the starting weights' loss averaged over the validation batches,
    computed here by hand; with or without it, training logs the same losses and exports the
    same weights."""
    from storyrewrite.training.module import VALIDATION_NOISE_OFFSET

    runs, weights, losses = {}, [], []
    for at_start in (True, False):
        run = tiny_run(tiny_model_dirs["llama"], small_prepared, "score_delta", DTO, tiny_model_dirs["llama"],
                       section="train", max_steps=3, val_check_interval=3, validate_at_start=at_start)
        runs[at_start] = _fit(tmp_path / str(at_start), run)
        weights.append(load_file(tmp_path / str(at_start) / "out" / "model.safetensors"))
        losses.append(_curve(tmp_path / str(at_start) / "logs", "train_loss"))
    assert losses[0] == losses[1]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert _steps(tmp_path / "False" / "logs", "val_loss") == [3]
    assert runs[False]["start_val_loss"] is None and runs[True]["best_step"] == 3

    module, data = assemble(run)
    data.setup()
    module.generator.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for index, batch in enumerate(data.val_dataloader()):
            out = module.loss(module.generator, batch, module.noise_seed + VALIDATION_NOISE_OFFSET + index, validation=True)
            total, count = total + out.loss.item() * len(batch["ids"]), count + len(batch["ids"])
    assert runs[True]["start_val_loss"] == pytest.approx(total / count, rel=1e-5)
    assert _steps(tmp_path / "True" / "logs", "val_loss")[0] == 0


@pytest.mark.slow
def test_diagnostics_leave_the_loss_and_the_trained_weights_unchanged(tmp_path, tiny_model_dirs, small_prepared):
    for objective, settings in (("score_delta", DTO), ("cpo", CPOConfig(beta=0.5, lambda_=1.0))):
        weights, losses = [], []
        for diagnostics in (True, False):
            directory = tmp_path / f"{objective}-{diagnostics}"
            run = tiny_run(tiny_model_dirs["llama"], small_prepared, objective, settings, tiny_model_dirs["llama"],
                           section="train", max_steps=3, val_check_interval=3)
            _fit(directory, run, diagnostics=diagnostics)
            weights.append(load_file(directory / "out" / "model.safetensors"))
            losses.append(_curve(directory / "logs", "train_loss"))
        assert losses[0] == losses[1]
        assert weights[0].keys() == weights[1].keys() and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


@pytest.mark.slow
def test_compiled_training_is_the_same_run(tmp_path, tiny_model_dirs, small_prepared,
                                                                                monkeypatch):
    """`compile: reduce-overhead` (DTO-Score+Delta: the generator's and the scorer's bodies
    compiled, in training and in validation, each step a new iteration of their CUDA graphs where
    there is a GPU) logs the losses and exports the weights of the eager run."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from storyrewrite.training import run as run_module

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")  # dynamo's graphs and AOT autograd, no generated kernels
    monkeypatch.setattr(run_module, "COMPILE_BACKEND", counter)
    weights, losses = [], []
    for compiled in (False, "reduce-overhead"):
        run = tiny_run(tiny_model_dirs["llama"], small_prepared, "score_delta", DTO, tiny_model_dirs["llama"],
                       section="train", max_steps=3, val_check_interval=3, compile=compiled)
        _fit(tmp_path / str(compiled), run)
        weights.append(load_file(tmp_path / str(compiled) / "out" / "model.safetensors"))
        losses.append([row["value"] for row in _curve(tmp_path / str(compiled) / "logs", "train_loss")])
        # The bodies' graphs for training and for validation, each compiled once: the starting
        # weights' validation (Trainer.validate) runs under no_grad as the in-fit ones do (in
        # inference mode it compiled two more, 8 frames).
        assert counter.frame_count == (6 if compiled else 0)
    assert len(losses[0]) == 3 and losses[1] == pytest.approx(losses[0], rel=1e-6)
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.allclose(weights[0][k], weights[1][k], atol=1e-6) for k in weights[0])


def test_a_training_sections_own_seed_changes_its_randomness_and_nothing_else(tmp_path, tiny_model_dirs, small_prepared):
    """`train.seed` (null: the top-level seed) seeds the fine-tuning run alone: the NLL run keeps
    the top-level seed; two DTO runs that differ only in it draw other Gumbel noise and batch
    order, so their losses differ, and a resolved seed equal to the top-level one is the same run."""
    import dataclasses

    from storyrewrite.params import Params, overlay
    from storyrewrite.training.run import Run, training_seed

    raw = load_yaml(ROOT / "params.yaml")
    assert raw["train"]["seed"] is None and raw["train_nll"]["seed"] is None
    default = Params(raw)
    assert training_seed(default, "train") == training_seed(default, "train_nll") == raw["seed"]
    seeded = Params(overlay(raw, {"train": {"seed": raw["seed"] + 7}}))
    assert training_seed(seeded, "train") == raw["seed"] + 7 and training_seed(seeded, "train_nll") == raw["seed"]
    run = Run.from_params(seeded, "train", NLL, tmp_path, tmp_path)
    assert run.seed == raw["seed"] + 7
    with pytest.raises(InputError, match=r"train\.seed"):
        Params(overlay(raw, {"train": {"seed": "one"}})).section("train")

    losses = []
    for seed in (0, 1, 0):
        run = dataclasses.replace(tiny_run(tiny_model_dirs["llama"], small_prepared, "score", DTO, tiny_model_dirs["llama"],
                                           section="train", max_steps=2, val_check_interval=2, validate_at_start=False), seed=seed)
        _fit(tmp_path / f"seed{seed}-{len(losses)}", run)
        losses.append([row["value"] for row in _curve(tmp_path / f"seed{seed}-{len(losses)}" / "logs", "train_loss")])
    assert losses[0] == losses[2] and losses[0] != losses[1]


@pytest.mark.parametrize("budget, description", [(dict(max_steps=2, max_epochs=None), "Epoch 0"),
                                                 (dict(max_steps=-1, max_epochs=1), "Epoch 0/0")])
def test_the_progress_bar_names_the_epoch_total_only_where_there_is_one(budget, description):
    """A run bounded by steps (Lightning's max_epochs -1 once fitting) reads "Epoch 0", not
    Lightning 2.6's "Epoch 0/-2"; a run bounded by epochs keeps its total."""
    import lightning as L
    from lightning.pytorch.demos.boring_classes import BoringModel

    from storyrewrite.training.run import progress_bar

    seen = []
    shown = []

    class Read(Callback):
        def on_train_batch_end(self, trainer, *args):
            seen.append(trainer.progress_bar_callback._get_train_description(trainer.current_epoch).strip())
            shown.append(trainer.progress_bar_callback.get_metrics(trainer, args[0]).get("train_loss"))

    monitor = SimpleNamespace(last_loss=None)
    trainer = L.Trainer(callbacks=[progress_bar(monitor), Read()], logger=False, enable_checkpointing=False, accelerator="cpu",
                        limit_train_batches=2, limit_val_batches=0, enable_model_summary=False, **budget)
    monitor.last_loss = 0.25  # the loss the monitor read last is the one the bar shows
    trainer.fit(BoringModel())
    assert seen and set(seen) == {description} and set(shown) == {0.25}


def test_bf16_on_a_cpu_without_bf16_instructions_is_announced_and_nowhere_else():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    warning = bf16_emulation_warning("train", "bf16-mixed", cpu, False)
    assert warning.startswith("warning: `train.precision` = bf16-mixed on a CPU without bf16 instructions")
    assert bf16_emulation_warning("train_nll", "bf16-true", cpu, False).startswith("warning: `train_nll.precision` = bf16-true")
    assert bf16_emulation_warning("train", "bf16-mixed", cpu, True) is None  # bf16 in hardware
    assert bf16_emulation_warning("train", "bf16-mixed", cpu, None) is None  # unknown: no claim
    assert bf16_emulation_warning("train", "32-true", cpu, False) is None
    assert bf16_emulation_warning("train", "bf16-mixed", cuda, False) is None


def test_a_bf16_run_on_such_a_cpu_prints_the_warning_once(tmp_path, tiny_model_dirs, small_prepared, monkeypatch, capsys):
    """A DTO run: its frozen scorer, its linear weights in bf16, validated at the start, trained
    and validated again under Lightning's bf16-mixed autocast."""
    monkeypatch.setattr("storyrewrite.training.run.cpu_has_bf16", lambda: False)
    summary = _fit(tmp_path, tiny_run(tiny_model_dirs["llama"], small_prepared, "score", DTO, tiny_model_dirs["llama"],
                                      section="train", max_steps=1, val_check_interval=1, precision="bf16-mixed",
                                      validate_at_start=True), diagnostics=False)
    assert capsys.readouterr().out.count("on a CPU without bf16 instructions") == 1
    assert math.isfinite(summary["start_val_loss"]) and math.isfinite(summary["best_val_loss"])


def test_auto_beside_apples_mps_trains_on_the_cpu_and_says_which_setting_takes_mps(tmp_path, tiny_model_dirs, small_prepared,
                                                                                     monkeypatch, capsys):
    """A Mac (Lightning sees MPS, torch no CUDA): `accelerator: auto` trains on the CPU, and one
    line names the -S that trains on MPS, in place of Lightning's warning, which suggests a
    Trainer argument (`accelerator='gpu'`) no params key is written as."""
    import warnings

    from lightning.fabric.accelerators.mps import MPSAccelerator

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(MPSAccelerator, "is_available", staticmethod(lambda: True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = _fit(tmp_path, tiny_run(tiny_model_dirs["llama"], small_prepared, max_steps=1, val_check_interval=1,
                                          accelerator="auto", devices="auto"), diagnostics=False)
    assert summary["global_step"] == 1
    assert not [w for w in caught if "GPU available but not used" in str(w.message)]
    assert capsys.readouterr().out.count("note: `train_nll.accelerator` = auto trains on the CPU, as `device: auto` "
                                         "generates and scores there; Apple's MPS is here: "
                                         "-S train_nll.accelerator=mps trains on it\n") == 1
    # (where training was asked for by name, or there is no MPS, no line)
    from storyrewrite.training.run import unused_mps

    assert unused_mps("train", tiny_train_config(accelerator="cpu")) is None
    monkeypatch.setattr(MPSAccelerator, "is_available", staticmethod(lambda: False))
    assert unused_mps("train", tiny_train_config(accelerator="auto")) is None


@pytest.mark.slow
@pytest.mark.parametrize("objective, settings", [("score_delta", DTO), ("rloo", RL)])
def test_training_without_nan_filled_allocations_is_the_same_run(tmp_path, tiny_model_dirs, small_prepared, monkeypatch,
                                                                 objective, settings):
    """fit keeps torch's deterministic algorithms but not their NaN in every new tensor
    (training.run.without_nan_fill): a step that read memory it never wrote would read NaN with the
    fill and something else without it, so the two runs' losses and weights would part. The
    objectives whose steps allocate most (the scorer through soft embeddings; RLOO's sampling)."""
    import storyrewrite.training.run as training_run

    fill = torch.utils.deterministic.fill_uninitialized_memory
    weights, losses = [], []
    try:
        for nan_fill in (True, False):
            if nan_fill:  # fit as before it kept new tensors unfilled
                monkeypatch.setattr(training_run, "without_nan_fill", lambda: None)
                torch.utils.deterministic.fill_uninitialized_memory = True
            else:
                monkeypatch.undo()
            directory = tmp_path / str(nan_fill)
            run = tiny_run(tiny_model_dirs["llama"], small_prepared, objective, settings, tiny_model_dirs["llama"],
                           section="train", max_steps=3, val_check_interval=3)
            _fit(directory, run)
            assert torch.are_deterministic_algorithms_enabled()
            assert torch.utils.deterministic.fill_uninitialized_memory is nan_fill
            weights.append(load_file(directory / "out" / "model.safetensors"))
            losses.append(_curve(directory / "logs", "train_loss"))
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill
    assert losses[0] == losses[1] and len(losses[0]) == 3
    assert weights[0].keys() == weights[1].keys() and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_validation_batches_hold_val_batch_size_instances(tiny_model_dirs, small_prepared):
    """`val_batch_size` sizes the validation batches (the training ones keep `batch_size`); unset,
    validation batches as training does."""
    sizes = {}
    for val_batch_size in (None, 4):
        run = tiny_run(tiny_model_dirs["llama"], small_prepared, val_batch_size=val_batch_size)
        data = assemble(run)[1]
        data.setup()
        assert len(data.val_rows) == 6 and len(next(iter(data.train_dataloader()))["ids"]) == 2
        sizes[val_batch_size] = [len(batch["ids"]) for batch in data.val_dataloader()]
    assert sizes == {None: [2, 2, 2], 4: [4, 2]}


def test_the_trainer_prints_no_cloud_advert():
    # Lightning logs a tip for its cloud logger at every Trainer; the training code drops it, and
    # Lightning's other lines stay. Without the filter the tip is there: a Lightning that stops
    # logging it fails this test, and the filter can go.
    import lightning as L

    source = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    ours = [f for f in source.filters if isinstance(f, NoCloudTips)]
    messages: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger("lightning.pytorch").addHandler(handler)

    def trainer_lines() -> list[str]:
        messages.clear()
        L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False)
        return list(messages)

    try:
        filtered = trainer_lines()
        for f in ours:
            source.removeFilter(f)
        bare = trainer_lines()
    finally:
        logging.getLogger("lightning.pytorch").removeHandler(handler)
        for f in ours:
            source.addFilter(f)
    assert ours and any(line.startswith("💡 Tip: For seamless cloud logging") for line in bare)
    assert not any("Tip:" in line for line in filtered) and any(line.startswith("GPU available") for line in filtered)


def test_a_resumed_epoch_starts_after_the_instances_every_process_consumed():
    """The training order is a permutation seeded by seed + epoch; a run resumed part-way through an
    epoch starts after what was consumed: the batches completed times the batch size times the
    processes (each took its own batch of every step)."""
    from types import SimpleNamespace

    from storyrewrite.training.data import ResumableRandomSampler, RewriteDataModule

    full = list(ResumableRandomSampler(10, 3, lambda: (0, 0)))
    assert full == torch.randperm(10, generator=torch.Generator().manual_seed(3)).tolist()
    assert list(ResumableRandomSampler(10, 3, lambda: (0, 4))) == full[4:]
    assert list(ResumableRandomSampler(10, 2, lambda: (1, 0))) == full  # epoch 1 of seed 2: seed 3's order
    module = RewriteDataModule("unused", "timetravel", None, batch_size=4, seed=0)
    assert module._position() == (0, 0)  # not attached to a trainer
    progress = SimpleNamespace(current=SimpleNamespace(completed=3))
    module.trainer = SimpleNamespace(current_epoch=2, world_size=2, fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)))
    assert module._position() == (2, 24)
