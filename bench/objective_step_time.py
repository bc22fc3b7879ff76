"""Training step time and peak memory of each objective against NLL: same model, same batch,
one run of this script (each objective in its own process, so that each peak RSS is its own).

    python bench/objective_step_time.py [--steps 5] [--objectives nll score score_delta delta cpo]

Targets (issue 5): DTO-Score / NLL <= 1.5x, DTO-Score+Delta / NLL <= 1.8x.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch


def measure(objective: str, steps: int) -> dict:
    from common import default_inputs

    from storyrewrite.metrics import LMScorer
    from storyrewrite.models.encoding import Encoder
    from storyrewrite.models.loading import ModelsConfig, is_seq2seq, load_model, load_tokenizer, resolve_model_dir
    from storyrewrite.objectives import ObjectiveContext, get_objective
    from storyrewrite.objectives.cpo import CPOConfig
    from storyrewrite.objectives.dto import DTOConfig
    from storyrewrite.params import build, experiment
    from storyrewrite.training.config import TrainConfig
    from storyrewrite.training.data import Collate
    from storyrewrite.training.module import RewriteModule

    params, pretrained, splits = default_inputs()
    run = experiment(params)
    models = build(ModelsConfig, params["models"], "models")
    train = build(TrainConfig, params["train"], "train")
    dto = build(DTOConfig, params["dto"], "dto")
    rows = splits["train"]

    model_dir = resolve_model_dir(pretrained)
    baseline_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    objective = get_objective(objective)
    scorer = LMScorer.from_dir(resolve_model_dir(pretrained, "scorer"), models.max_input_tokens, models.max_output_tokens,
                               dtype=getattr(torch, dto.scorer_dtype)) if objective.needs_scorer else None
    loss = objective.build(ObjectiveContext(dto=dto, cpo=build(CPOConfig, params["cpo"], "cpo"), scorer=scorer))
    module = RewriteModule(load_model(model_dir), loss, train.lr, train.weight_decay, 0, run.seed, scorer)
    collate = Collate(Encoder(load_tokenizer(model_dir), is_seq2seq(model_dir), models.max_input_tokens,
                              models.max_output_tokens), "timetravel", pairs=objective.pairs)
    optimizer = module.configure_optimizers()["optimizer"]
    # The same batch every step, for every objective: only the objective differs.
    batch = collate(rows[: train.batch_size])
    timings = []
    for step in range(steps + 1):
        started = time.perf_counter()
        value = module.loss(module.generator, batch, step)
        value.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        timings.append(time.perf_counter() - started)
    return {"seconds_per_step": sum(timings[1:]) / steps,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
            "rss_before_models_gb": baseline_rss / 1024**2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="timed steps after one warm-up step")
    parser.add_argument("--objectives", nargs="+", default=["nll", "score", "score_delta"])
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure one objective, print JSON
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.steps)))
        return
    results = {}
    for objective in args.objectives:
        output = subprocess.run([sys.executable, __file__, "--one", objective, "--steps", str(args.steps)],
                                capture_output=True, text=True, check=True).stdout
        results[objective] = json.loads(output.strip().splitlines()[-1])
    base = results[args.objectives[0]]["seconds_per_step"]
    print(f"{torch.get_num_threads()} torch threads; same model, batch and {args.steps} timed steps per objective")
    print(f"{'objective':<12}{'s/step':>8}{'ratio':>8}{'peak RSS GB':>13}")
    for objective, r in results.items():
        print(f"{objective:<12}{r['seconds_per_step']:>8.2f}{r['seconds_per_step'] / base:>7.2f}x{r['peak_rss_gb']:>13.2f}")


if __name__ == "__main__":
    main()
