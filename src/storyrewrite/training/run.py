"""Run one training: `assemble` wires the Lightning module and data module from the typed
configs; `fit` runs them (Trainer, resume, best/last checkpoints, curves, divergence, export)."""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.seed import isolate_rng

from storyrewrite import closure
from storyrewrite import artifacts
from storyrewrite.io import InputError, sha256_file, write_text_atomic
from storyrewrite.models.encoding import Encoder
from storyrewrite.models.store import is_seq2seq, load_model, load_tokenizer, save_model, weights_digest
from storyrewrite.objectives.base import Objective, ObjectiveContext
from storyrewrite.parallel import assigned_gpu, share_gpu_memory
from storyrewrite.params import ModelsConfig, Params, Section, TrainConfig
from storyrewrite.records import cpu_has_bf16
from storyrewrite.systems import TRAINING_PLAN
from storyrewrite.training.checkpointing import AtomicCheckpointIO, resume_point
from storyrewrite.training.compile import compile_body
from storyrewrite.training.data import RewriteDataModule
from storyrewrite.training.module import AUTOCAST_DTYPES, RewriteModule
from storyrewrite.curves import read_curves
from storyrewrite.training.monitor import TrainingMonitor, TrainingPlan

# Keys that only say how long to train: an interrupted run resumed with a larger budget continues
# (everything else changes the run and invalidates its checkpoints).
BUDGET_KEYS = ("max_steps", "max_epochs")

# torch.compile's backend for `compile: true` (tests use "aot_eager": the same tracing and
# autograd graphs, without generating kernels)
COMPILE_BACKEND: Any = "inductor"

# Both are expected here: the checkpoint directory holds the run's fingerprint and curves before
# Lightning writes to it, and mid-epoch resume is exact (ResumableRandomSampler) although the
# DataLoader itself has no state_dict.
warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch ended")
# Lightning 2.6.6's own use of a torch pytree API that torch 2.13 deprecates: nothing a user can act on.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
# The model summary counts sizes at 32 bits under bf16-mixed (Lightning 2.6) and says so at every
# bf16 run, the GPU profile's included: a note on its own estimate, nothing about training.
warnings.filterwarnings("ignore", message="Precision .* is not supported by the model summary")


class NoCloudTips(logging.Filter):
    """Lightning 2.6 logs a tip at every Trainer that advertises its cloud logger and model
    registry, and has no setting that turns it off (Lightning-AI/pytorch-lightning#21294): a
    line a user of an offline pipeline cannot act on. Records of the loggers Lightning's
    rank-zero messages go through, whatever order the packages were imported in."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


for _name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
    logging.getLogger(_name).addFilter(NoCloudTips())


@dataclass(frozen=True)
class Run:
    """One training run: its settings and inputs. The train stage builds it from params.yaml
    (`section` is train_nll or train) and the paths dvc.yaml gives."""

    section: str
    config: TrainConfig
    models: ModelsConfig
    task: str
    seed: int
    # The objective's entry: the train stage looks it up in storyrewrite.objectives.registry,
    # train_nll runs objectives.base.NLL (this module never reads the registry: train_nll's code)
    objective: Objective
    settings: Section | None  # the objective's params section (Objective.settings: its type), or None
    init_dir: Path
    prepared_dir: Path
    scorer_dir: Path | None = None

    @classmethod
    def from_params(cls, params: Params, section: str, objective: Objective, init_dir: Path, prepared_dir: Path,
                    scorer_dir: Path | None = None) -> "Run":
        """The run of `section` with `objective`, reading only the params section that objective
        names (NLL reads neither `dto` nor `cpo`); the scorer only where the objective needs one."""
        return cls(section=section, config=params.section(section), models=params.models, task=params.task,
                   seed=training_seed(params, section), objective=objective,
                   settings=params.section(objective.settings) if objective.settings else None, init_dir=Path(init_dir),
                   prepared_dir=Path(prepared_dir), scorer_dir=Path(scorer_dir) if objective.needs_scorer else None)


def training_seed(params: Params, section: str) -> int:
    """The seed of training run `section`: its own `seed`, else the top-level one."""
    own = params.section(section).seed
    return params.seed if own is None else own


def assemble(run: Run, diagnostics: bool = True) -> tuple[RewriteModule, RewriteDataModule]:
    """The ready Lightning module (generator, the objective's loss, optimiser) and data module.
    `diagnostics: False` leaves out the objective's logged diagnostics (for measuring their cost)."""
    objective = run.objective
    if objective.needs_scorer and run.scorer_dir is None:
        raise InputError(f"objective {objective.name!r} needs a scorer model directory")
    tokenizer = load_tokenizer(run.init_dir)
    encoder = Encoder(tokenizer, is_seq2seq(run.init_dir), run.models.max_input_tokens, run.models.max_output_tokens,
                      run.config.pad_to_multiple_of)
    loss = objective.build(ObjectiveContext(run.settings, run.scorer_dir, run.models.max_input_tokens,
                                            run.models.max_output_tokens, run.init_dir, run.config.pad_to_multiple_of))
    datamodule = RewriteDataModule(str(run.prepared_dir), run.task, encoder, run.config.batch_size, run.seed,
                                   run.config.num_workers, pairs=objective.pairs, prepare=loss.prepare,
                                   val_batch_size=run.config.val_batch_size)
    graphs = run.config.compile == "reduce-overhead"
    module = RewriteModule(load_model(run.init_dir), loss, run.config.lr, run.config.weight_decay,
                           run.config.warmup_steps, run.seed, diagnostics, AUTOCAST_DTYPES.get(run.config.precision),
                           cuda_graphs=graphs, accumulate_grad_batches=run.config.accumulate_grad_batches)
    if run.config.compile:
        for model in (module.generator, *([loss.scorer.model] if loss.scorer is not None else [])):
            compile_body(model, COMPILE_BACKEND, "reduce-overhead" if graphs else None)
    return module, datamodule


def code_digest(objective: Objective) -> str:
    """sha256 over the package code that training with `objective` runs (the import closure of
    this module and of the objective's own module): a checkpoint made by other code is not
    resumed (a changed loss must retrain, not re-export the old weights), while an edit elsewhere
    (the report, another objective's loss) keeps an interrupted run resumable."""
    return closure.digest(closure.closure(__file__) | closure.closure(closure.module_file(objective.module_name)))


def run_fingerprint(run: Run) -> str:
    """What makes two runs the same run (so that one may resume the other): every setting but
    the training budget, the objective and its own settings (NLL reads neither `dto` nor `cpo`),
    the task, the seed, the data, the starting weights, the scorer and the code."""
    train_file = run.prepared_dir / run.task / "train.jsonl"
    blob = json.dumps({
        # The section's `seed` as the seed it resolves to (`run.seed`): null and the top-level value are one run.
        "settings": {k: v for k, v in run.config.model_dump().items() if k not in (*BUDGET_KEYS, "seed")},
        "objective": run.objective.name, "objective_settings": run.settings.model_dump(by_alias=True) if run.settings else None,
        "task": run.task, "seed": run.seed, "max_tokens": [run.models.max_input_tokens, run.models.max_output_tokens],
        "train_data": sha256_file(train_file), "val_data": sha256_file(train_file.with_name("val.jsonl")),
        "init_weights": weights_digest(run.init_dir),
        "scorer": weights_digest(run.scorer_dir) if run.objective.needs_scorer else None,
        "code": code_digest(run.objective),
    }, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def placement(config: TrainConfig) -> tuple[str, int | str | list[int]]:
    """Lightning's (accelerator, devices) for the section: as configured, except for `auto`, which
    means what the params' `device: auto` means (storyrewrite.models.device): a CUDA GPU if there
    is one, on a machine whose GPUs several concurrent workers share the one this process holds
    (storyrewrite.parallel), else the CPU. Lightning's own `auto` prefers a TPU, then Apple's MPS,
    then CUDA, and puts every worker on all the GPUs: on a Mac it would train on MPS while
    generation and scoring run on the CPU. `mps` (or `gpu` on a Mac) still asks Lightning for MPS."""
    accelerator = config.accelerator
    if accelerator == "auto":
        accelerator = "cuda" if torch.cuda.is_available() else "cpu"
    if accelerator in ("gpu", "cuda") and config.devices == "auto" and torch.cuda.is_available():
        index = assigned_gpu(torch.cuda.device_count())
        if index is not None:
            return "cuda", [index]
    return accelerator, config.devices


# Lightning's warning where a GPU is there and unused: it suggests `Trainer(accelerator='gpu')`,
# an argument a user of the pipeline does not write (unused_mps says what to set instead).
UNUSED_GPU_WARNING = "GPU available but not used"


def unused_mps(section: str, config: TrainConfig) -> str | None:
    """The line a training section prints where its `accelerator: auto` trains on the CPU with
    Apple's MPS there (placement), naming the setting that trains on MPS; None elsewhere."""
    from lightning.fabric.accelerators.mps import MPSAccelerator  # (Lightning's test: MPS on Apple silicon)

    # (placement last: with CUDA there it may take a GPU for this process; no machine has both)
    if config.accelerator != "auto" or not MPSAccelerator.is_available() or placement(config)[0] != "cpu":
        return None
    return (f"note: `{section}.accelerator` = auto trains on the CPU, as `device: auto` generates and scores there; "
            f"Apple's MPS is here: -S {section}.accelerator=mps trains on it")


def progress_bar(monitor: TrainingMonitor) -> Callback:
    """Lightning's own default progress bar (rich where installed, else tqdm), showing the loss
    `monitor` read (a step late: a loss logged to the bar would be read back at every step, the
    GPU waited for), and in which a run bounded by steps (Lightning's max_epochs -1) reads
    "Epoch 0", not "Epoch 0/-2". Lightning-AI/pytorch-lightning#21924 fixes the latter upstream
    after 2.6.6, the pinned release; that override goes when the pin moves past it."""
    from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
    from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

    class MonitoredLoss:
        def get_metrics(self, trainer, pl_module) -> dict:
            metrics = super().get_metrics(trainer, pl_module)
            return metrics | ({"train_loss": monitor.last_loss} if monitor.last_loss is not None else {})

    if not _RICH_AVAILABLE:
        return type("MonitoredTQDMProgressBar", (MonitoredLoss, TQDMProgressBar), {})()

    class StepBoundedRichProgressBar(MonitoredLoss, RichProgressBar):
        def _get_train_description(self, current_epoch: int) -> str:
            if self.trainer.max_epochs is not None and self.trainer.max_epochs >= 0:
                return super()._get_train_description(current_epoch)
            return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"

    return StepBoundedRichProgressBar()


def trainer_kwargs(config: TrainConfig) -> dict:
    """The Lightning Trainer's settings for a training section, as the train stages build it (the
    step benches take their torch flags from its `deterministic`, and `without_nan_fill` from fit)."""
    accelerator, devices = placement(config)
    return dict(
        max_steps=config.max_steps, max_epochs=config.max_epochs if config.max_steps == -1 else None,
        accelerator=accelerator, devices=devices, strategy=config.strategy,
        precision=config.precision, num_nodes=config.num_nodes,
        accumulate_grad_batches=config.accumulate_grad_batches, gradient_clip_val=config.gradient_clip_val,
        limit_val_batches=config.limit_val_batches,
        # Validate every `val_check_interval` batches, counted across epochs.
        val_check_interval=config.val_check_interval, check_val_every_n_epoch=None,
        num_sanity_val_steps=0, logger=False, enable_progress_bar=True, log_every_n_steps=1,
        deterministic=True,
        # `Trainer.validate` (the starting weights' validation) under no_grad, as Lightning runs the
        # validations inside fit, rather than in inference mode: a compiled body would otherwise
        # compile its validation graphs twice (inference tensors are guarded apart).
        inference_mode=False,
    )


def refused_here(section: str, config: TrainConfig, error: Exception) -> InputError:
    """Lightning's refusal of a section's Trainer settings on this machine (a GPU it lacks, a
    strategy or precision whose package is not installed, FSDP on a CPU) as one line that names
    them, with Lightning's reason, keyed to the section (a stage's line starts with the section's
    line of params.yaml: the settings are its keys). The values themselves are checked with the
    params (storyrewrite.params); whether this machine can run them, only here."""
    asked = ", ".join(f"{name} {getattr(config, name)!r}" for name in ("accelerator", "devices", "strategy", "precision", "num_nodes"))
    return InputError(f"params: `{section}` asks the Lightning Trainer for {asked}, which cannot run here: "
                      f"{' '.join(str(error).split())}", key=section)


def without_nan_fill() -> None:
    """Keep torch from filling the memory of every tensor it allocates (torch.empty and kin) with
    NaN, which it does under deterministic algorithms (the Trainer's `deterministic`, above) unless
    `torch.utils.deterministic.fill_uninitialized_memory` is off. The fill guards a program that
    reads memory it never wrote; torch's documentation names turning it off as the way to keep
    deterministic algorithms without its cost, for a program that reads no such memory (the same
    run either way: tests/training/test_training.py). The cost: one more kernel launch for every
    allocation, 2,289 in an NLL step of the GPU profile on an H200, whose steps wait on their
    launches (docs/gpu.md). Process-wide, as the Trainer's own flags are."""
    torch.utils.deterministic.fill_uninitialized_memory = False


def bf16_emulation_warning(section: str, precision: str, device: torch.device, has_bf16: bool | None) -> str | None:
    """The line a bf16 run prints on a CPU without bf16 instructions (`has_bf16`: records.cpu_has_bf16),
    where torch computes bf16 in emulation; None elsewhere. The GPU profile's settings on such a CPU
    (a rehearsal, or `device: auto` finding no GPU) would otherwise just seem to hang."""
    if device.type != "cpu" or not str(precision).startswith("bf16") or has_bf16 is not False:
        return None
    return (f"warning: `{section}.precision` = {precision} on a CPU without bf16 instructions (AVX512-BF16, AMX or "
            f"Arm BF16): torch emulates bf16 here, and a step can take several times as long as in 32-true "
            f"(docs/benchmarks.md, bench/objective_step_time.py --precision bf16-mixed)")


class ResumePoint(ModelCheckpoint):
    """`last.ckpt`, the full state an interrupted run resumes from, every N steps but the run's
    last (`max_steps`): a finished run is never resumed (`fit`), so that save would only cost
    time (weights and optimiser state, 1.6 GB for SmolLM2-135M: 6 s of a 3-minute CPU run). A run
    killed after its last step but before it is marked finished resumes from the save before.

    At a step that a validation follows, the save waits for the validation's end. Saved before
    it, a run killed during that validation would resume past it: Lightning does not validate
    again at the step it resumes from, so that validation would be missing from the curves and
    never a candidate for best.ckpt. Saved after it, the kill costs the steps since the save
    before, and the resumed run validates there as the uninterrupted one did."""

    def on_train_batch_end(self, trainer: L.Trainer, *args, **kwargs) -> None:
        if 0 < trainer.max_steps <= trainer.global_step:
            return
        # A save this batch end would make, by ModelCheckpoint's own tests (a step already saved is
        # skipped: with gradient accumulation, the batches after the save share its step).
        due = (self._every_n_train_steps > 0 and trainer.global_step % self._every_n_train_steps == 0
               and not self._should_skip_saving_checkpoint(trainer))
        # Lightning's own test for a validation after this batch, and its own deferral: a
        # ModelCheckpoint saves in on_validation_end what it deferred (Lightning 2.6 defers only
        # for a monitored metric, and has no setting for this).
        epoch_loop = trainer.fit_loop.epoch_loop
        if due and epoch_loop._should_check_val_fx(trainer.fit_loop._data_fetcher):
            self._defer_save_until_validation = True
            return
        super().on_train_batch_end(trainer, *args, **kwargs)


class FreshBest(ModelCheckpoint):
    """The best-on-validation checkpoint of a resumed run whose best.ckpt did not load (set
    aside): last.ckpt's record of the best points at that file, so the best is tracked afresh from
    the resumed step, and the next validation writes best.ckpt again. Its state goes under the
    key of the ModelCheckpoint it stands in for: a later resume restores the new best's score
    (under a key of its own, that resume would track the best afresh again and replace best.ckpt
    at its next validation, however worse)."""

    @property
    def state_key(self) -> str:
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def load_state_dict(self, state_dict: dict) -> None:
        pass  # last.ckpt's record of the best names the set-aside file: not restored


def fit(run: Run, out_dir: Path, checkpoint_dir: Path, log_dir: Path, callbacks: tuple[Callback, ...] = (),
        diagnostics: bool = True) -> dict:
    """Train; export the best-on-val weights to `out_dir`. `checkpoint_dir` keeps the best and
    last Lightning checkpoints and the curves while a run is under way: an interrupted run with
    the same fingerprint resumes from last.ckpt, a finished one is never resumed (a rerun, e.g.
    `dvc repro -f`, trains again). `log_dir` receives the curves (DVCLive: `dvc plots`) and, at
    the end, the run's summary (`metrics.json`, storyrewrite.artifacts.TrainingSummary).
    `diagnostics: False` logs only the loss, its terms, lr and tokens/s. Returns the summary with
    the training's wall time, `train_seconds` (a stage record's fact: never in the DVC metrics)."""
    objective = run.objective
    out_dir, checkpoint_dir, log_dir = Path(out_dir), Path(checkpoint_dir), Path(log_dir)
    L.seed_everything(run.seed, workers=True, verbose=False)

    fingerprint = run_fingerprint(run)
    fingerprint_file, finished, last = checkpoint_dir / "fingerprint.txt", checkpoint_dir / "finished", checkpoint_dir / "last.ckpt"
    interrupted = (fingerprint_file.exists() and fingerprint_file.read_text().strip() == fingerprint
                   and not finished.exists() and last.exists())
    resume_from = last if run.config.resume and interrupted else None
    resumed_step, fresh_best = None, False
    if resume_from is None:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    else:
        # What a save killed midway left behind (never a checkpoint: see AtomicCheckpointIO).
        for stale in checkpoint_dir.glob(".*.ckpt.*.tmp"):
            stale.unlink()
        # A checkpoint that does not load is set aside with a warning; an unreadable last.ckpt
        # stops the stage with one line, before anything is loaded: starting afresh silently
        # would throw the interrupted run's steps away unannounced.
        resumed_step, set_aside = resume_point(checkpoint_dir, run.section)
        fresh_best = "best.ckpt" in set_aside
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(fingerprint_file, fingerprint + "\n")

    monitor = TrainingMonitor(log_dir, checkpoint_dir / "curves", run.section, objective.name, resumed_step)
    best = (FreshBest if fresh_best else ModelCheckpoint)(dirpath=checkpoint_dir, filename="best", monitor="val_loss", mode="min",
                                                          save_top_k=1, save_weights_only=True, enable_version_counter=False)
    latest = ResumePoint(dirpath=checkpoint_dir, filename="last", save_top_k=1,
                         every_n_train_steps=run.config.checkpoint_every_n_steps, enable_version_counter=False)
    without_nan_fill()
    every_callback = [best, latest, monitor, TrainingPlan(checkpoint_dir / TRAINING_PLAN), progress_bar(monitor), *callbacks]
    settings = trainer_kwargs(run.config)
    note = unused_mps(run.section, run.config)
    try:
        with warnings.catch_warnings():
            if note:
                warnings.filterwarnings("ignore", message=UNUSED_GPU_WARNING)
            trainer = L.Trainer(callbacks=every_callback, default_root_dir=str(checkpoint_dir), plugins=[AtomicCheckpointIO()],
                                **settings)
    except (MisconfigurationException, ModuleNotFoundError, ValueError) as error:
        # Refused before any model is loaded; a fresh run's directory goes (an interrupted run's stays).
        if resume_from is None:
            shutil.rmtree(checkpoint_dir, ignore_errors=True)
        raise refused_here(run.section, run.config, error) from None
    device = trainer.strategy.root_device
    share_gpu_memory(device)  # before the models take any of it
    module, datamodule = assemble(run, diagnostics)
    warning = bf16_emulation_warning(run.section, run.config.precision, device,
                                     cpu_has_bf16() if device.type == "cpu" else None)  # (/proc/cpuinfo read on a CPU only)
    for line in (note, warning):
        if line and trainer.is_global_zero:
            print(line, flush=True)

    started = time.perf_counter()
    if run.config.validate_at_start and resume_from is None:
        # The starting weights' validation values: the val curves' step 0, the baseline that shows
        # whether training improves its own objective. Not a checkpoint candidate (ModelCheckpoint
        # saves only while fitting); RNG state isolated, so training is the same with or without.
        with isolate_rng():
            trainer.validate(module, datamodule=datamodule, verbose=False)
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume_from) if resume_from else None)
    elapsed = time.perf_counter() - started
    best_checkpoint = _load_best(best)
    summary = artifacts.TrainingSummary(
        **monitor.latest(), objective=objective.name, label=objective.system_label(run.settings),
        counterpart=objective.counterpart_label(run.settings),
        settings=run.settings.model_dump(by_alias=True) if run.settings else None,
        task=run.task, global_step=trainer.global_step, world_size=trainer.world_size,
        device=str(device), precision=str(run.config.precision), resumed_from_step=resumed_step,
        best_val_loss=round(float(best.best_model_score), 6) if best.best_model_score is not None else None,
        **_best_step(best_checkpoint, read_curves(log_dir)), main_diagnostics=list(objective.main_diagnostics),
    )
    if trainer.is_global_zero:
        _export(module, datamodule.encoder.tokenizer, best_checkpoint, out_dir,
                {"task": run.task, "objective": objective.name, "label": summary.label})
        artifacts.write(log_dir / "metrics.json", summary)
        write_text_atomic(finished, f"{trainer.global_step}\n")
    return {**summary.model_dump(), "train_seconds": round(elapsed, 1), "validate_seconds": round(monitor.validate_seconds, 1)}


def _load_best(best: ModelCheckpoint) -> dict | None:
    """The exported best-on-validation checkpoint (memory-mapped: its step for the summary, its
    weights for the export), or None where no validation ran."""
    path = Path(best.best_model_path) if best.best_model_path else None
    if path is None or not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=False, mmap=True)


def _best_step(checkpoint: dict | None, curves: dict[str, list[dict]]) -> dict:
    """The step of the exported best-on-validation checkpoint (read from it: the step-0 validation
    of the starting weights is in the curves but is never a candidate), the validation NLL there
    (comparable across objectives: model selection for a grid such as CPO's) and the validation
    loss at step 0 (null without `validate_at_start`, or on a resumed run's summary if the
    interrupted run had none)."""
    start = next((row["value"] for row in curves.get("val_loss", []) if row["step"] == 0), None)
    if checkpoint is None:
        return {"best_step": None, "best_val_nll": None, "start_val_loss": start}
    step = int(checkpoint["global_step"])
    # The last row at that step: with gradient accumulation a validation can share step 0 with the start.
    nll = [row["value"] for row in curves["val_nll"] if row["step"] == step][-1]
    return {"best_step": step, "best_val_nll": round(nll, 6), "start_val_loss": start}


def _export(module: RewriteModule, tokenizer, checkpoint: dict | None, out_dir: Path, trained: dict) -> None:
    if checkpoint is not None:
        module.load_state_dict(checkpoint["state_dict"])
    else:
        # No validation ran (a budget shorter than val_check_interval): the final weights stand.
        print("warning: no validation ran; exporting the final weights, not the best-on-val ones")
    save_model(module.generator, tokenizer, out_dir, trained)
