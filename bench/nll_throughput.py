"""NLL training throughput (instances/s), generation throughput (tokens/s) and peak memory (RSS)
of the default profile's generator, measured in one run on this machine.

    python bench/nll_throughput.py [--steps 6] [--generate 16]

Uses the materialised model of `dvc repro models` when present, else builds it from its source.
"""
from __future__ import annotations

import argparse
import platform
import resource
import time

import torch
from common import default_inputs

from storyrewrite.data.formatting import model_source
from storyrewrite.models.encoding import Encoder
from storyrewrite.models.loading import ModelsConfig, is_seq2seq, load_model, load_tokenizer, resolve_model_dir
from storyrewrite.objectives import get_objective
from storyrewrite.params import build, experiment
from storyrewrite.training.config import TrainConfig
from storyrewrite.training.data import Collate
from storyrewrite.training.module import RewriteModule

def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # Linux: KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="timed training steps (after one warm-up step)")
    parser.add_argument("--generate", type=int, default=16, help="test instances to generate for")
    args = parser.parse_args()

    params, pretrained, splits = default_inputs()
    run = experiment(params)
    models = build(ModelsConfig, params["models"], "models")
    train = build(TrainConfig, params["train_nll"], "train_nll")
    generate = params["generate"]
    model_dir = resolve_model_dir(pretrained)
    tokenizer, seq2seq = load_tokenizer(model_dir), is_seq2seq(model_dir)
    encoder = Encoder(tokenizer, seq2seq, models.max_input_tokens, models.max_output_tokens)
    collate = Collate(encoder, run.task)

    torch.manual_seed(run.seed)
    module = RewriteModule(load_model(model_dir), get_objective("nll").build(None), train.lr, train.weight_decay, 0)
    optimizer = module.configure_optimizers()["optimizer"]
    batches = [collate(splits["train"][i : i + train.batch_size]) for i in range(0, (args.steps + 1) * train.batch_size, train.batch_size)]
    timings = []
    for batch in batches:
        started = time.perf_counter()
        loss = module.loss(module.generator, batch, 0)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        timings.append(time.perf_counter() - started)
    step_seconds = sum(timings[1:]) / len(timings[1:])  # the first step allocates optimiser state
    train_rss = peak_rss_gb()

    model = module.generator.eval()
    rows = splits["test"][: args.generate]
    sources = [model_source(row, run.task, tokenizer, seq2seq) for row in rows]
    new_tokens, started = 0, time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(sources), generate["batch_size"]):
            inputs = encoder.prompts(sources[i : i + generate["batch_size"]])
            output = model.generate(**inputs, max_new_tokens=generate["max_new_tokens"], do_sample=False,
                                    num_beams=generate["num_beams"], pad_token_id=tokenizer.pad_token_id)
            generated = output if seq2seq else output[:, inputs["input_ids"].shape[1] :]
            new_tokens += int((generated != tokenizer.pad_token_id).sum())
    generate_seconds = time.perf_counter() - started

    print(f"machine: {platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
          f"model {models.generator}, batch {train.batch_size}")
    print(f"NLL training: {step_seconds:.2f} s/step = {train.batch_size / step_seconds:.2f} instances/s "
          f"(mean of {len(timings) - 1} steps after a warm-up step)")
    print(f"generation:   {new_tokens / generate_seconds:.1f} new tokens/s "
          f"({new_tokens} tokens for {len(rows)} instances, batch {generate['batch_size']}, "
          f"{'greedy' if generate['num_beams'] == 1 else str(generate['num_beams']) + ' beams'})")
    print(f"peak RSS:     {train_rss:.2f} GB after training steps, {peak_rss_gb():.2f} GB at the end")


if __name__ == "__main__":
    main()
