"""LightningModule: the generator, the objective's loss and the optimiser. Nothing else."""
from __future__ import annotations

import lightning as L
import torch
from transformers import PreTrainedModel

from storyrewrite.objectives.base import Loss

VALIDATION_NOISE_OFFSET = 10**9  # validation draws its own Gumbel noise, the same every time
# The dtype in which Lightning's mixed precisions run a step's matrix products (torch.autocast).
AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def cast_linear_weights(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Store the weights and biases of a frozen model's linear layers in `dtype`, as autocast to
    `dtype` casts them at every call: it keeps the casts of trainable weights for the rest of the
    step, never those of frozen ones, so a frozen scorer's ~200 float32 matrices were cast
    again, a kernel and a pass over the weights each, in every forward pass. The products get
    the same operands bit for bit; the model must then run under that autocast only (a float32
    input to a cast layer is an error, not a silent change). Everything else stays as it is:
    the input embedding (a lookup, which autocast does not cast: its float32 rows enter the
    residual stream) and the norms (which autocast runs in float32); an output layer tied to the
    input embedding gets a cast copy of its own."""
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        for name, parameter in list(module.named_parameters(recurse=False)):
            if parameter.dtype == torch.float32:
                setattr(module, name, torch.nn.Parameter(parameter.detach().to(dtype), requires_grad=False))


class RewriteModule(L.LightningModule):
    """The objective's frozen scorer (DTO) lives in `loss`, not as a submodule: it gets no
    optimiser state and is not saved in checkpoints (it is reloaded from its source). With an
    `autocast_dtype` (the training precision's, `AUTOCAST_DTYPES`), the frozen models' linear
    weights are stored in it once they are placed (`cast_linear_weights`).

    Each training step leaves what the curves log in `step_logs` (detached tensors, read once
    per step by storyrewrite.training.monitor): the loss, its terms and, with `diagnostics`, the
    gradient norm before clipping and the objective's diagnostics; `step_terms` names the ones
    that make up the loss. Validation logs the same quantities, averaged, prefixed `val_`. A
    training step reads nothing back to the host (no `self.log` of a tensor, which Lightning
    would turn into a number at once for the progress bar): the monitor reads `step_logs` a step
    later, while the GPU runs the next one.

    `cuda_graphs` (`compile: reduce-overhead`): each step and validation batch starts a new
    iteration of the compiled models' CUDA graphs (`torch.compiler.cudagraph_mark_step_begin`),
    whose outputs of the previous one it no longer reads.
    """

    def __init__(self, generator: PreTrainedModel, loss: Loss, lr: float, weight_decay: float,
                 warmup_steps: int, seed: int = 0, diagnostics: bool = True, autocast_dtype: torch.dtype | None = None,
                 cuda_graphs: bool = False, accumulate_grad_batches: int = 1):
        super().__init__()
        # from_pretrained returns a model in eval mode; Lightning keeps module modes as they
        # are, so switch dropout on for training here.
        self.generator = generator.train()
        self.loss = loss
        self.lr, self.weight_decay, self.warmup_steps = lr, weight_decay, warmup_steps
        self.noise_seed = seed * 1_000_003
        self.diagnostics = diagnostics
        self.autocast_dtype = autocast_dtype
        self.cuda_graphs = cuda_graphs
        self.accumulate_grad_batches = accumulate_grad_batches
        self.step_logs: dict[str, torch.Tensor] = {}
        self.step_terms: tuple[str, ...] = ()

    def _place_scorer(self) -> None:
        # Our Trainer validates under no_grad (run.trainer_kwargs), but Lightning's default, as a
        # Trainer built elsewhere has it, is inference mode, where a tensor moved to the GPU or
        # cast would be an inference tensor, which autograd refuses to save: a frozen model placed
        # by the validation of the starting weights would fail the first training step.
        with torch.inference_mode(False):
            for model in self.loss.frozen_models():
                model.to(self.device)
                if self.autocast_dtype is not None:
                    cast_linear_weights(model, self.autocast_dtype)

    # Fit, and the validation of the starting weights that comes before it (`Trainer.validate`).
    on_fit_start = on_validation_start = _place_scorer

    def step_loss(self, batch: dict, batch_idx: int = 0) -> torch.Tensor:
        """The loss of a training batch, leaving what the curves log in `step_logs`."""
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        # Each batch draws its own noise (DTO's Gumbel noise, RLOO's samples): with A batches an
        # optimiser step (accumulate_grad_batches, grouped as Lightning groups them, from each
        # epoch's first), the k-th batch of step g from seed g·A + k; with one a step, from g.
        accumulate = self.accumulate_grad_batches
        out = self.loss(self.generator, batch, self.noise_seed + self.global_step * accumulate + batch_idx % accumulate)
        self.step_terms = ("train_loss", *out.terms)
        self.step_logs = {"train_loss": out.loss.detach(), **out.terms}
        if self.diagnostics:
            with torch.no_grad():
                self.step_logs |= out.diagnostics()
        return out.loss

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self.step_loss(batch, batch_idx)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Lightning calls this after unscaling fp16 gradients and before clipping them.
        grads = [p.grad for p in self.generator.parameters() if p.grad is not None]
        if grads and self.diagnostics:
            self.step_logs["grad_norm"] = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        size = len(batch["ids"])
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        out = self.loss(self.generator, batch, self.noise_seed + VALIDATION_NOISE_OFFSET + batch_idx, validation=True)
        self.log("val_loss", out.loss, prog_bar=True, batch_size=size, sync_dist=True)
        # NLL on validation whatever the objective: comparable across objectives.
        self.log("val_nll", out.nll, batch_size=size, sync_dist=True)
        values = {**out.terms, **(out.diagnostics() if self.diagnostics else {})}
        for name, value in values.items():
            self.log(f"val_{name}", value, batch_size=size, sync_dist=True)

    def configure_optimizers(self):
        parameters = [p for p in self.generator.parameters() if p.requires_grad]
        # The fused kernel updates every parameter in one pass: on a GPU one launch (the per-tensor
        # loop launches a dozen kernels per tensor), on a CPU one vectorised loop over each tensor
        # (0.15 s a step for SmolLM2-135M on 2 cores, against 0.4-0.8 s). Its rounding differs
        # from the loop's in the last bit of a weight (measured: 2.4e-7 after 5 steps).
        fused = all(p.device.type in ("cuda", "cpu") for p in parameters)
        optimizer = torch.optim.AdamW(parameters, lr=self.lr, weight_decay=self.weight_decay, fused=fused or None)
        warmup = self.warmup_steps
        # Linear warm-up to lr, then constant (the paper trains at a constant lr).
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
