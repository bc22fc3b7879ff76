"""score: per-instance scores and corpus metrics (BARTScore, ROUGE-L, SacreBLEU; predictive and
counterfactual) for each predictions file given (a directory means every .jsonl in it)."""
import argparse
from pathlib import Path

from storyrewrite.data.prepare import load_instances
from storyrewrite.io import run_stage, write_json_atomic, write_jsonl_atomic
from storyrewrite.metrics.evaluate import read_predictions, score_system
from storyrewrite.metrics.lm_scorer import LMScorer
from storyrewrite.models.loading import resolve_device, resolve_model_dir
from storyrewrite.params import Params
from storyrewrite.records import StageRecord


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--predictions", type=Path, required=True, help="a .jsonl file or a directory of them")
    parser.add_argument("--data", type=Path, required=True, help="prepared data dir")
    parser.add_argument("--scorer", type=Path, required=True, help="the models stage's dir (or a model dir)")
    parser.add_argument("--scores-dir", type=Path, required=True, help="per-instance scores, <system>.jsonl")
    parser.add_argument("--metrics-dir", type=Path, required=True, help="corpus metrics, <system>.json")
    StageRecord.add_argument(parser)
    args = parser.parse_args()
    record = StageRecord.start(args.record)
    params = Params.load()
    config, models = params.score, params.models
    instances = load_instances(args.data, params.task, params.generate.split)
    device = resolve_device(params.device)
    scorer = LMScorer.from_dir(resolve_model_dir(args.scorer, "scorer"), models.max_input_tokens, models.max_output_tokens,
                               dtype=config.dtype, device=device)
    print(f"scorer on {device} ({config.dtype})")
    files = sorted(args.predictions.glob("*.jsonl")) if args.predictions.is_dir() else [args.predictions]
    scored = 0
    for path in files:
        rows, metrics = score_system(read_predictions(path, instances), instances, scorer, config.batch_size)
        write_jsonl_atomic(args.scores_dir / f"{path.stem}.jsonl", rows)
        write_json_atomic(args.metrics_dir / f"{path.stem}.json", metrics)
        scored += len(rows)
        print(path.stem, {k: v for k, v in metrics.items() if k in ("bartscore", "rougeL", "sacrebleu")})
    if record:
        record.finish(device, config.dtype, scored, "predictions", systems=len(files))


if __name__ == "__main__":
    run_stage(main)
