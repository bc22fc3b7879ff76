"""NLL training throughput (instances/s), generation throughput (predictions/s and new tokens/s,
through the `generate` stage's own function) and peak memory, measured in one run.

    python bench/nll_throughput.py [--device auto] [--precision 32-true] [--steps 6]
        [--generate 16] [--profile params/gpu.yaml] [--batch-size N] [--dtype bfloat16] [--cache static]
        [--compare-batch-sizes N ...] [--cudnn-attention]

Defaults are the params' (with the profiles overlaid); --batch-size/--dtype/--cache override the
`generate` section. Target on an H100 with SmolLM2-135M, 48 new tokens: >= 200 predictions/s.
The instances generated for have distinct inputs, one per story, so every prediction is a
decoding: the stage decodes a TimeTravel test story once for its three rewrites.
--compare-batch-sizes generates for the same instances again at other batch sizes, each after its
own warm-up, and reports each rate against the run's: the data for choosing `generate.batch_size`
(a decoding step of a small model costs about the same at any batch size while the GPU waits for
kernel launches, so the rate then grows with the batch until memory or arithmetic limits it).
Training runs as the train stage's Trainer does (torch's deterministic algorithms, which on CUDA
never choose cuDNN's attention, without NaN in every new tensor: training.run.without_nan_fill),
generation as the generate stage does (without them). On CUDA the project keeps attention off
cuDNN's kernels (storyrewrite.models.device.attention_off_cudnn: cuDNN builds an execution plan
for each new shape, and decoding steps change shape at every step); --cudnn-attention lets torch
choose them again for generation, to measure the difference.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import lightning as L
import torch
from common import clock, describe, inputs, nan_fill, peak_memory_gb, write_result
from torch.utils.data import DataLoader

from storyrewrite.data.prepare import load_instances
from storyrewrite.data.schema import TASK_INPUT_FIELDS
from storyrewrite.generation.generate import generate_predictions
from storyrewrite.io import read_jsonl, run_cli
from storyrewrite.models.device import resolve_device
from storyrewrite.models.store import resolve_model_dir
from storyrewrite.objectives.base import NLL
from storyrewrite.training.run import Run, assemble, trainer_kwargs, without_nan_fill


class Timer(L.Callback):
    def __init__(self, device):
        self.device, self.seconds = device, []

    def on_train_batch_start(self, trainer, *args) -> None:
        self._started = clock(self.device)

    def on_train_batch_end(self, trainer, *args) -> None:
        self.seconds.append(clock(self.device) - self._started)


def arguments() -> argparse.ArgumentParser:
    """The command line (scripts/gpu_bench.sh's calls are parsed by it in the tests)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--precision", default=None, help="Lightning precision (default: the params' train_nll.precision)")
    parser.add_argument("--steps", type=int, default=6, help="timed NLL training steps (after one warm-up step)")
    parser.add_argument("--generate", type=int, default=16, help="test instances of distinct inputs to generate for")
    parser.add_argument("--profile", type=Path, action="append", default=[], help="params overlay(s), e.g. params/gpu.yaml")
    parser.add_argument("--batch-size", type=int, help="generation batch size (default: generate.batch_size)")
    parser.add_argument("--dtype", help="generation weights (default: generate.dtype)")
    parser.add_argument("--cache", help="dynamic | static KV cache (default: generate.cache)")
    parser.add_argument("--compare-batch-sizes", type=int, nargs="+", default=[], metavar="N",
                        help="generation batch sizes to measure as well, each against the run's")
    parser.add_argument("--cudnn-attention", action="store_true",
                        help="let torch run attention on cuDNN's kernels again (CUDA), as before the project kept it off them")
    return parser


def main() -> None:
    args = arguments().parse_args()

    params, pretrained, prepared = inputs(args.profile)
    device = resolve_device(args.device)  # on CUDA: attention off cuDNN's kernels, unless --cudnn-attention
    if args.cudnn_attention:
        torch.backends.cuda.enable_cudnn_sdp(True)
    config = params.train_nll
    model_dir = resolve_model_dir(pretrained)
    module, datamodule = assemble(Run.from_params(params, "train_nll", NLL, model_dir, prepared))
    datamodule.setup()
    # Training batches as the stage draws them (seeded order), the first few.
    order = [datamodule.train_rows[i] for i in range((args.steps + 1) * config.batch_size)]
    batches = [order[i : i + config.batch_size] for i in range(0, len(order), config.batch_size)]
    datamodule.train_dataloader = lambda: DataLoader(batches, batch_size=None, collate_fn=datamodule.collate)
    timer = Timer(device)
    precision = args.precision or config.precision
    # The stage's `deterministic` (training.run.trainer_kwargs): torch's deterministic algorithms, as the stage trains.
    deterministic = trainer_kwargs(config)["deterministic"]
    without_nan_fill()  # as the stage's fit
    trainer = L.Trainer(max_steps=len(batches), accelerator="gpu" if device.type == "cuda" else "cpu",
                        devices=[device.index or 0] if device.type == "cuda" else 1, precision=precision, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0, callbacks=[timer], deterministic=deterministic)
    trainer.fit(module, datamodule=datamodule)
    trained_with_nan_fill = nan_fill()  # (read before the flags are reset for generation)
    step_seconds = sum(timer.seconds[1:]) / len(timer.seconds[1:])  # the first step allocates optimiser state
    train_memory = peak_memory_gb(device)
    del module, trainer
    torch.use_deterministic_algorithms(False)  # the generate stage runs without them (cuDNN's attention allowed)

    generate = params.generate.model_copy(update={k: v for k, v in (("batch_size", args.batch_size), ("dtype", args.dtype),
                                                                    ("cache", args.cache)) if v is not None})
    # Test instances of distinct inputs: instances that share one (a TimeTravel test story's three
    # rewrites) are decoded once (storyrewrite.generation.generate), and the rate is of decoding.
    fields = TASK_INPUT_FIELDS[params.task]
    distinct: dict[tuple, dict] = {}
    for row in load_instances(prepared, params.task, "test"):
        distinct.setdefault(tuple(row[f] for f in fields), row)
    rows = list(distinct.values())[: args.generate]

    def measure(batch_size: int, scratch: Path) -> dict:
        """Generation for `rows` in batches of `batch_size`, as the stage generates, its predictions
        written in `scratch`: predictions/s, the warm-up's seconds, words per prediction and (CUDA)
        the peak memory of generation alone."""
        config = generate.model_copy(update={"batch_size": batch_size})
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        # A first call of two batches loads the kernels and, with a static cache, compiles, timed apart:
        # torch.compile compiles again for a second shape (after which it treats the lengths as
        # dynamic), and with a single warm-up batch the timed run's first batch was still compiling.
        warmup = rows[: 2 * batch_size]
        started = clock(device)
        generate_predictions(model_dir, warmup, params.task, config, params.models, scratch / f"warmup-{batch_size}.jsonl",
                             params.seed, device)
        warmup_seconds = clock(device) - started
        out = scratch / f"predictions-{batch_size}.jsonl"
        started = clock(device)
        generate_predictions(model_dir, rows, params.task, config, params.models, out, params.seed, device)
        seconds = clock(device) - started
        return {"predictions_per_s": round(len(rows) / seconds, 3), "warmup_s": round(warmup_seconds, 2),
                "warmup_instances": len(warmup),
                "words_per_prediction": round(sum(len(row["prediction"].split()) for _, row in read_jsonl(out)) / len(rows), 1),
                "peak_memory_gb": round(peak_memory_gb(device), 2) if device.type == "cuda" else None}

    with tempfile.TemporaryDirectory() as folder:  # the predictions, removed once counted
        scratch = Path(folder)
        run = measure(generate.batch_size, scratch)
        # Each other batch size, as the record holds it: its rate, its ratio to the run's and (CUDA) the
        # peak memory of its generation, or why it has none.
        compared: dict[str, dict] = {}
        for size in (s for s in args.compare_batch_sizes if s != generate.batch_size):
            try:
                other = measure(size, scratch)
            except torch.OutOfMemoryError:  # a size too large for the device is a finding; the run's figures stand
                compared[str(size)] = {"error": "out of memory"}
                torch.cuda.empty_cache()
                continue
            compared[str(size)] = {"predictions_per_s": other["predictions_per_s"],
                                   "ratio": round(other["predictions_per_s"] / run["predictions_per_s"], 3),
                                   **({"peak_memory_gb": other["peak_memory_gb"]} if other["peak_memory_gb"] is not None else {})}
    # On CUDA the peak since training's, each generation's apart; on a CPU the process's peak RSS.
    peak = max([train_memory, run["peak_memory_gb"], *(c["peak_memory_gb"] for c in compared.values() if "peak_memory_gb" in c)]) \
        if device.type == "cuda" else peak_memory_gb(device)

    print(f"{describe(device)}; model {params.models.generator}")
    print(f"NLL training:  {step_seconds:.3f} s/step = {config.batch_size / step_seconds:.1f} instances/s "
          f"(batch {config.batch_size}, {precision}; mean of {len(timer.seconds) - 1} steps after a warm-up step)")
    print(f"generation:    {run['predictions_per_s']:.1f} predictions/s ({len(rows)} test instances of distinct inputs, batch "
          f"{generate.batch_size}, {generate.dtype}, {generate.cache} cache, <= {generate.max_new_tokens} new tokens, "
          f"{'greedy' if generate.num_beams == 1 else str(generate.num_beams) + ' beams'}; {run['words_per_prediction']:.1f} words each)")
    print(f"warm-up:       {run['warmup_s']:.1f} s for the {run['warmup_instances']} instances generated first (kernels loaded"
          f"{', the static cache compiled' if generate.cache == 'static' else ''}; not in the rate above)")
    for size, other in compared.items():
        print(f"  batch {size}: " + (other["error"] if "error" in other else
              f"{other['predictions_per_s']:.1f} predictions/s = {other['ratio']}x batch {generate.batch_size}"
              + (f", generation's peak {other['peak_memory_gb']:.2f} GB" if "peak_memory_gb" in other else "")))
    print(f"peak memory:   {train_memory:.2f} GB after training steps, {peak:.2f} GB in all"
          + (f", generation alone {run['peak_memory_gb']:.2f} GB (batch {generate.batch_size})" if run["peak_memory_gb"] is not None else "")
          + f" ({'GPU, allocated by torch' if device.type == 'cuda' else 'RSS'})")
    # Named per generation setting: a static-cache or bf16 run is a run of its own in the figures file.
    variant = "".join(f"-{v}" for v in (args.dtype, args.cache, args.precision) if v) + ("-cudnn-attention" if args.cudnn_attention else "")
    write_result("nll_throughput" + variant, device, {
        "train_s_per_step": round(step_seconds, 4), "train_instances_per_s": round(config.batch_size / step_seconds, 3),
        "generate_predictions_per_s": run["predictions_per_s"], "words_per_prediction": run["words_per_prediction"],
        "warmup_s": run["warmup_s"],
        "peak_memory_after_training_gb": round(train_memory, 2), "peak_memory_gb": round(peak, 2),
        **({"generate_peak_memory_gb": run["peak_memory_gb"]} if run["peak_memory_gb"] is not None else {}),
        **({"other_batch_sizes": compared} if compared else {}),  # measured in this process
    }, {"model": params.models.generator, "train_batch_size": config.batch_size, "precision": precision, "deterministic": deterministic,
        "nan_fill": trained_with_nan_fill,
        "generate_instances": len(rows), "warmup_instances": run["warmup_instances"], "generate_batch_size": generate.batch_size, "generate_dtype": generate.dtype,
        "cache": generate.cache, "max_new_tokens": generate.max_new_tokens, "num_beams": generate.num_beams,
        "cudnn_attention": torch.backends.cuda.cudnn_sdp_enabled() if device.type == "cuda" else None,
        "profiles": [str(p) for p in args.profile]},
        {"generate_predictions_per_s": {"min": 200}} if device.type == "cuda" else None)


if __name__ == "__main__":
    run_cli(main)
