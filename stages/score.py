"""score: per-instance scores and corpus metrics for each predictions file given (a directory
means every .jsonl in it): the overlap metrics (storyrewrite.metrics.registry: BARTScore, ROUGE-L,
SacreBLEU, and BERTScore where `models.bertscore` names its encoder; predictive and
counterfactual) and, where the task has a counterfactual event, the coherence metrics (CF-PMI,
drift, EntScore)."""
import argparse
from pathlib import Path

from storyrewrite.data.prepare import load_instances
from storyrewrite.data.schema import TASK_COLUMNS
from storyrewrite import artifacts
from storyrewrite.metrics.artifacts import SystemMetrics
from storyrewrite.io import InputError, run_stage, write_jsonl_atomic
from storyrewrite.metrics.counterfactual import METRICS
from storyrewrite.metrics.evaluate import (COHERENCE_INPUTS, load_scoring_models, read_predictions, score_system,
                                          scoring_models, timed)
from storyrewrite.models.device import resolve_device, set_fp32_matmul
from storyrewrite.models.store import role_spec
from storyrewrite.params import Params
from storyrewrite.records import StageRecord


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--predictions", type=Path, required=True, help="a .jsonl file or a directory of them")
    parser.add_argument("--data", type=Path, required=True, help="prepared data dir")
    parser.add_argument("--scorer", type=Path, required=True, help="the models stage's dir (or a model dir)")
    parser.add_argument("--evaluators", type=Path, required=True, help="the eval_models stage's dir")
    parser.add_argument("--scores-dir", type=Path, required=True, help="per-instance scores, <system>.jsonl")
    parser.add_argument("--metrics-dir", type=Path, required=True, help="corpus metrics, <system>.json")
    StageRecord.add_argument(parser)
    args = parser.parse_args()
    record = StageRecord.start(args.record)
    files = sorted(args.predictions.glob("*.jsonl")) if args.predictions.is_dir() else [args.predictions]
    if not args.predictions.exists() or not files:
        raise InputError(f"--predictions {args.predictions}: " + ("no .jsonl file in it" if files == [] else "no such file"))
    params = Params.load()
    config, models = params.score, params.models
    instances = load_instances(args.data, params.task, params.generate.split)
    device = resolve_device(params.device)
    precision = set_fp32_matmul(device, config.dtype, config.fp32_matmul)
    seconds: dict[str, float] = {}  # loading the models, then each metric's, over all systems
    with timed(seconds, "load_models"):
        scorer, evaluators = load_scoring_models(args.scorer, args.evaluators, models, config, device,
                                                 coherence_models=set(COHERENCE_INPUTS) <= set(TASK_COLUMNS[params.task]))
    print(f"scorer on {device} ({precision})" + (f"; evaluators: {evaluators.specs}" if evaluators.specs else "")
          + (f"; BERTScore: {evaluators.bertscore.spec}, layer {evaluators.bertscore.layer}" if evaluators.bertscore else ""))
    models = scoring_models(role_spec(args.scorer, "scorer"), precision, evaluators)  # each score row's `scored_by`
    scored = 0
    for path in files:
        rows, metrics = score_system(read_predictions(path, instances), instances, scorer, config.batch_size, evaluators, seconds,
                                     models)
        write_jsonl_atomic(args.scores_dir / f"{path.stem}.jsonl", rows)
        artifacts.write(args.metrics_dir / f"{path.stem}.json", SystemMetrics.model_validate(metrics))
        scored += len(rows)
        print(path.stem, {k: v for k, v in metrics.items() if k in (*METRICS, "cf_pmi", "drift", "ents")})
    if record:
        record.finish(device, precision, scored, "predictions", systems=len(files),
                      seconds={name: round(value, 2) for name, value in seconds.items()})


if __name__ == "__main__":
    run_stage(main)
