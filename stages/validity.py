"""validity: does each metric tell the reference rewrite from a copy of the original ending?
Per metric, the share of test instances where Y_EE beats the copy of X_OE, with bootstrap
intervals (storyrewrite.metrics.validity). `--copy-scores`: the score stage's per-instance scores
of the copy baselines, whose values are read rather than computed again."""
import argparse
from pathlib import Path

from storyrewrite.data.prepare import load_instances
from storyrewrite.data.schema import TASK_COLUMNS
from storyrewrite import artifacts
from storyrewrite.metrics.artifacts import Validity
from storyrewrite.io import run_stage
from storyrewrite.metrics.evaluate import COHERENCE_INPUTS, load_scoring_models, timed
from storyrewrite.metrics.validity import gold_and_copy, read_copy_scores
from storyrewrite.models.device import resolve_device, set_fp32_matmul
from storyrewrite.params import Params
from storyrewrite.records import StageRecord
from storyrewrite.significance.validity import markdown, validity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True, help="prepared data dir")
    parser.add_argument("--scorer", type=Path, required=True, help="the models stage's dir")
    parser.add_argument("--evaluators", type=Path, required=True, help="the eval_models stage's dir")
    parser.add_argument("--out", type=Path, required=True, help="the figures, .json (DVC metrics)")
    parser.add_argument("--copy-scores", type=Path, help="the copy baselines' per-instance scores (score_sanity's scores dir)")
    StageRecord.add_argument(parser)
    args = parser.parse_args()
    record = StageRecord.start(args.record)
    params = Params.load()
    config, models = params.score, params.models
    if not set(COHERENCE_INPUTS) <= set(TASK_COLUMNS[params.task]):
        artifacts.write(args.out, Validity(not_available=f"task {params.task} has no original ending to copy"))
        print(f"{args.out}: not available for task {params.task}")
        if record:
            record.finish("cpu", None, 0, "instances")
        return
    instances = load_instances(args.data, params.task, params.generate.split)
    device = resolve_device(params.device)
    precision = set_fp32_matmul(device, config.dtype, config.fp32_matmul)
    seconds: dict[str, float] = {}  # loading the models, then each metric's
    with timed(seconds, "load_models"):
        scorer, evaluators = load_scoring_models(args.scorer, args.evaluators, models, config, device)
    copy_scores = read_copy_scores(args.copy_scores, instances) if args.copy_scores else None
    pairs, not_measured = gold_and_copy(instances, evaluators, scorer, config.batch_size, seconds, copy_scores)
    result = validity(pairs, not_measured, params.significance.n_resamples, params.seed)
    artifacts.write(args.out, Validity.model_validate(result))
    print(markdown(result))
    if record:
        record.finish(device, precision, len(instances), "instances",
                      seconds={name: round(value, 2) for name, value in seconds.items()})


if __name__ == "__main__":
    run_stage(main)
