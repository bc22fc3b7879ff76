"""Metric validity on the whole test set: the validity stage's figures (does each metric score
the reference rewrite Y_EE above the original ending copied unchanged?) for every instance of
the task's test split, not the profile's subset, with the time each metric took.

    python bench/metric_validity.py [--device auto] [--profile P.yaml] [--max-eval N]
    python bench/metric_validity.py --render     # the page again, from the figures on file

Writes reports/bench/metric_validity.json (the figures, the timings, the machine) and
reports/metric_validity.md (the table, in words, rendered from them). The models are the
profile's (default: SmolLM2 as judge and BARTScore scorer, MiniLM as embedder, no NLI model).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from common import ROOT, clock, evaluators_dir, inputs, write_result

from storyrewrite.data.prepare import load_instances
from storyrewrite.io import read_json, run_cli, write_text_atomic
from storyrewrite.metrics.evaluate import load_scoring_models
from storyrewrite.metrics.validity import gold_and_copy
from storyrewrite.models.device import resolve_device
from storyrewrite.records import where_ran
from storyrewrite.significance.validity import markdown, validity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--profile", type=Path, action="append", default=[], help="params overlay(s)")
    parser.add_argument("--max-eval", type=int, default=None, help="at most this many test instances (default: all)")
    parser.add_argument("--render", action="store_true", help="only render the page from the figures on file")
    args = parser.parse_args()
    if args.render:
        return render()
    params, pretrained, prepared = inputs(args.profile, {"data": {"max_eval": args.max_eval}})
    device = resolve_device(args.device)
    models, config = params.models, params.score
    instances = load_instances(prepared, params.task, "test")
    started = clock(device)
    scorer, evaluators = load_scoring_models(pretrained, evaluators_dir(params), models, config, device)
    loading = clock(device) - started
    seconds: dict[str, float] = {}
    pairs, not_measured = gold_and_copy(instances, evaluators, scorer, config.batch_size, seconds)
    result = validity(pairs, not_measured, params.significance.n_resamples, params.seed)
    total = clock(device) - started
    write_result("metric_validity", device, {"validity": result, "seconds": {k: round(v, 1) for k, v in seconds.items()},
                                             "total_seconds": round(total, 1), "loading_seconds": round(loading, 1)},
                 {"task": params.task, "instances": len(instances), "judge": models.judge, "embedder": models.embedder,
                  "nli": models.nli, "bertscore": models.bertscore, "scorer": models.scorer, "batch_size": config.batch_size,
                  "dtype": config.dtype, "profiles": [str(p) for p in args.profile]})
    render()


def render() -> None:
    """reports/metric_validity.md from the latest run on file (of each device)."""
    runs = read_json(ROOT / "reports" / "bench" / "metric_validity.json")
    sections = ["# Metric validity on the whole test set",
                "Does each metric score the reference rewrite Y_EE above the original ending copied unchanged (X_OE)? "
                "Rendered from `reports/bench/metric_validity.json` (`python bench/metric_validity.py` measures, "
                "`--render` renders)."]
    for run in runs.values():
        settings, figures = run["settings"], run["figures"]
        machine = where_ran(run)  # with a CPU's vector features, where the record holds them
        timing = ", ".join(f"{name} {value:.0f} s" for name, value in figures["seconds"].items())
        sections += [f"## {machine}",
                     f"Task `{settings['task']}`, all {settings['instances']:,} test instances; judge `{settings['judge']}`, "
                     f"embedder `{settings['embedder']}`, NLI classifier `{settings['nli'] or 'none'}`, BARTScore scorer "
                     f"`{settings['scorer']}`; {machine}, torch {run['torch']}, commit {run['commit']}, "
                     f"{run['measured_at'][:10]}: {figures['total_seconds'] / 60:.1f} min in all ({timing}; loading the "
                     f"models {figures['loading_seconds']:.0f} s).",
                     markdown(figures["validity"])]
    write_text_atomic(ROOT / "reports" / "metric_validity.md", "\n\n".join(sections) + "\n")
    print((ROOT / "reports" / "metric_validity.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    run_cli(main)
