"""Run one training: Trainer set-up, resume, best/last checkpoints, curves, export."""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import shutil
import time
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from storyrewrite import closure
from storyrewrite.data.schema import TASK_COLUMNS
from storyrewrite.io import InputError, atomic_path, sha256_file, write_json_atomic
from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.models.encoding import Encoder
from storyrewrite.models.loading import is_seq2seq, load_model, load_tokenizer, save_model, weights_digest
from storyrewrite.objectives import OBJECTIVES, ObjectiveContext, get_objective
from storyrewrite.params import CPOConfig, DTOConfig, ModelsConfig, TrainConfig
from storyrewrite.training.data import RewriteDataModule
from storyrewrite.training.module import RewriteModule

# Both are expected here: the checkpoint directory holds the run's fingerprint and curves before
# Lightning writes to it, and mid-epoch resume is exact (ResumableRandomSampler) although the
# DataLoader itself has no state_dict.
warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
# Keys that only say how long to train: an interrupted run resumed with a larger budget continues
# (everything else changes the run and invalidates its checkpoints).
BUDGET_KEYS = ("max_steps", "max_epochs")

warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch ended")

CURVES = {"train_loss.csv": ("step", "epoch", "train_loss"), "val_loss.csv": ("step", "epoch", "val_loss", "val_nll")}


class CurveLogger(Callback):
    """Appends tidy per-step CSV curves (one file per curve, so `dvc plots` reads them as they
    are). The files live beside the checkpoints; on resume, rows after the resumed step (written
    after the last checkpoint, before an interruption) are dropped."""

    def __init__(self, directory: Path):
        self.directory = directory

    def truncate_after(self, step: int) -> None:
        for name, header in CURVES.items():
            path = self.directory / name
            if path.exists():
                with open(path, newline="") as f:
                    rows = [row for row in csv.DictReader(f) if int(row["step"]) <= step]
                _write_csv(path, header, rows)

    def _append(self, name: str, row: dict) -> None:
        path = self.directory / name
        new = not path.exists()
        with open(path, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=CURVES[name])
            if new:
                writer.writeheader()
            writer.writerow(row)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.is_global_zero and outputs is not None:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            self._append("train_loss.csv", {"step": trainer.global_step, "epoch": trainer.current_epoch, "train_loss": f"{loss.item():.6f}"})

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            metrics = trainer.callback_metrics
            self._append("val_loss.csv", {
                "step": trainer.global_step, "epoch": trainer.current_epoch,
                "val_loss": f"{metrics['val_loss'].item():.6f}", "val_nll": f"{metrics['val_nll'].item():.6f}",
            })


def _write_csv(path: Path, header: tuple, rows: list[dict]) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)


def code_digest() -> str:
    """sha256 over the package code that training runs (the import closure of this module): a
    checkpoint made by other code is not resumed (a changed loss must retrain, not re-export the
    old weights), while an edit elsewhere (the report, say) keeps an interrupted run resumable."""
    return closure.digest(closure.closure(__file__))


def run_fingerprint(config: TrainConfig, context: dict) -> str:
    """What makes two runs the same run (so one may resume the other): every setting but the
    training budget, the objective, the task, the seed, the data, the starting weights and the
    code."""
    settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in BUDGET_KEYS}
    blob = json.dumps({"settings": settings, "code": code_digest(), **context}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _trainer_kwargs(config: TrainConfig) -> dict:
    return dict(
        max_steps=config.max_steps, max_epochs=config.max_epochs if config.max_steps == -1 else None,
        accelerator=config.accelerator, devices=config.devices, strategy=config.strategy,
        precision=config.precision, num_nodes=config.num_nodes,
        accumulate_grad_batches=config.accumulate_grad_batches, gradient_clip_val=config.gradient_clip_val,
        limit_val_batches=config.limit_val_batches,
        # Validate every `val_check_interval` batches, counted across epochs.
        val_check_interval=config.val_check_interval, check_val_every_n_epoch=None,
        num_sanity_val_steps=0, logger=False, enable_progress_bar=True, log_every_n_steps=1,
        deterministic=True,
    )


def fit(
    config: TrainConfig,
    *,
    init_dir: str | Path,
    out_dir: str | Path,
    checkpoint_dir: str | Path,
    log_dir: str | Path,
    models: ModelsConfig,
    prepared_dir: str | Path,
    task: str,
    objective_name: str,
    seed: int,
    dto: DTOConfig | None = None,
    cpo: CPOConfig | None = None,
    scorer_dir: str | Path | None = None,
    callbacks: tuple[Callback, ...] = (),
) -> dict:
    """Train the generator in `init_dir` with `objective_name`; export the best-on-val weights
    to `out_dir`. `checkpoint_dir` keeps the best and last Lightning checkpoints and the CSV
    curves (it survives between runs, for resuming); `log_dir` receives the curves for `dvc
    plots` and `summary.json`. Returns the summary."""
    objective = get_objective(objective_name)
    if objective.needs_original_ending and "original_ending" not in TASK_COLUMNS[task]:
        usable = [name for name, o in OBJECTIVES.items() if not o.needs_original_ending]
        raise InputError(f"params: `objective` = {objective_name!r} needs the original ending, which task {task!r} "
                         f"does not have; objectives for this task: {', '.join(usable)}")
    if objective.needs_scorer and scorer_dir is None:
        raise InputError(f"objective {objective_name!r} needs a scorer model directory")
    init_dir, checkpoint_dir, log_dir = Path(init_dir), Path(checkpoint_dir), Path(log_dir)
    L.seed_everything(seed, workers=True, verbose=False)

    train_file = Path(prepared_dir) / task / "train.jsonl"
    fingerprint = run_fingerprint(config, {
        "objective": objective_name, "task": task, "seed": seed,
        # Only the settings the objective reads: NLL neither reads nor fingerprints `dto`/`cpo`.
        "objective_settings": [dataclasses.asdict(c) if c and used else None
                               for c, used in ((dto, objective.needs_scorer), (cpo, objective.pairs))],
        "scorer": weights_digest(Path(scorer_dir)) if objective.needs_scorer else None,
        "max_tokens": [models.max_input_tokens, models.max_output_tokens],
        "train_data": sha256_file(train_file), "val_data": sha256_file(train_file.with_name("val.jsonl")),
        "init_weights": weights_digest(init_dir),
    })
    fingerprint_file = checkpoint_dir / "fingerprint.txt"
    last = checkpoint_dir / "last.ckpt"
    same_run = fingerprint_file.exists() and fingerprint_file.read_text().strip() == fingerprint
    resume_from = last if config.resume and same_run and last.exists() else None
    if resume_from is None:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    fingerprint_file.write_text(fingerprint + "\n")

    tokenizer = load_tokenizer(init_dir)
    generator = load_model(init_dir)
    encoder = Encoder(tokenizer, is_seq2seq(init_dir), models.max_input_tokens, models.max_output_tokens)
    datamodule = RewriteDataModule(str(prepared_dir), task, encoder, config.batch_size, seed, config.num_workers,
                                   pairs=objective.pairs)
    scorer = None
    if objective.needs_scorer:
        scorer = LMScorer.from_dir(scorer_dir, models.max_input_tokens, models.max_output_tokens,
                                   dtype=dto.scorer_dtype)
    loss = objective.build(ObjectiveContext(dto=dto, cpo=cpo, scorer=scorer))
    module = RewriteModule(generator, loss, config.lr, config.weight_decay, config.warmup_steps, seed, scorer)

    curves = CurveLogger(checkpoint_dir)
    resumed_step = None
    if resume_from is not None:
        resumed_step = torch.load(resume_from, map_location="cpu", weights_only=False, mmap=True)["global_step"]
        curves.truncate_after(resumed_step)
    best = ModelCheckpoint(dirpath=checkpoint_dir, filename="best", monitor="val_loss", mode="min",
                           save_top_k=1, save_weights_only=True, enable_version_counter=False)
    latest = ModelCheckpoint(dirpath=checkpoint_dir, filename="last", save_top_k=1,
                             every_n_train_steps=config.checkpoint_every_n_steps, enable_version_counter=False)
    trainer = L.Trainer(callbacks=[best, latest, curves, *callbacks], default_root_dir=str(checkpoint_dir), **_trainer_kwargs(config))

    started = time.perf_counter()
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume_from) if resume_from else None)
    elapsed = time.perf_counter() - started
    # The final state is resumable too (a later run with a larger budget continues from it).
    trainer.save_checkpoint(last)
    summary = {
        "objective": objective_name, "label": objective.label, "task": task, "global_step": trainer.global_step, "world_size": trainer.world_size,
        "resumed_from_step": resumed_step, "train_seconds": round(elapsed, 1),
        "best_val_loss": round(float(best.best_model_score), 6) if best.best_model_score is not None else None,
        "best_val_nll": _val_nll_at_best(checkpoint_dir / "val_loss.csv"),
    }
    if trainer.is_global_zero:
        _export(module, tokenizer, best, Path(out_dir), checkpoint_dir, log_dir)
        write_json_atomic(log_dir / "summary.json", summary)
    return summary


def _val_nll_at_best(curve: Path) -> float | None:
    """Validation NLL at the best validation loss: comparable across objectives (model selection
    for a grid such as CPO's)."""
    if not curve.exists():
        return None
    with open(curve, newline="") as f:
        rows = list(csv.DictReader(f))
    return round(float(min(rows, key=lambda r: float(r["val_loss"]))["val_nll"]), 6) if rows else None


def _export(module: RewriteModule, tokenizer, best: ModelCheckpoint, out_dir: Path, checkpoint_dir: Path, log_dir: Path) -> None:
    best_path = Path(best.best_model_path) if best.best_model_path else None
    if best_path is not None and best_path.exists():
        state = torch.load(best_path, map_location="cpu", weights_only=False)["state_dict"]
        module.load_state_dict(state)
    else:
        # No validation ran (a budget shorter than val_check_interval): the final weights stand.
        print("warning: no validation ran; exporting the final weights, not the best-on-val ones")
    save_model(module.generator, tokenizer, out_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    for name, header in CURVES.items():
        source = checkpoint_dir / name
        rows = list(csv.DictReader(open(source, newline=""))) if source.exists() else []
        _write_csv(log_dir / name, header, rows)
