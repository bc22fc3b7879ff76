"""train_nll / train: train a generator with Lightning and export the best-on-val weights.

  --section train_nll   NLL from the pretrained generator (the NLL baseline)
  --section train       the params' `objective`, starting from the NLL model
"""
import argparse
import json
from pathlib import Path

from storyrewrite.io import run_stage
from storyrewrite.models.store import resolve_model_dir
from storyrewrite.params import Params
from storyrewrite.records import StageRecord
from storyrewrite.training.run import Run, fit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", choices=("train_nll", "train"), required=True)
    parser.add_argument("--init", type=Path, required=True, help="starting model dir (or the models stage's dir)")
    parser.add_argument("--data", type=Path, required=True, help="prepared data dir")
    parser.add_argument("--out", type=Path, required=True, help="best-on-val model, save_pretrained format")
    parser.add_argument("--checkpoints", type=Path, required=True, help="Lightning checkpoints, kept for resuming")
    parser.add_argument("--logs", type=Path, required=True, help="training curves and summary")
    parser.add_argument("--scorer", type=Path, help="the models stage's dir (or a model dir): DTO's frozen scorer")
    StageRecord.add_argument(parser)
    args = parser.parse_args()
    record = StageRecord.start(args.record)
    params = Params.load()
    # train_nll is NLL from the pretrained model; only `train` reads `objective`.
    objective = params.objective if args.section == "train" else "nll"
    run = Run.from_params(params, args.section, objective, resolve_model_dir(args.init), args.data,
                          resolve_model_dir(args.scorer, "scorer") if args.scorer else None)
    summary = fit(run, args.out, args.checkpoints, args.logs)
    print(json.dumps({k: v for k, v in summary.items() if k != "curves"}, indent=2))
    if record:
        record.finish(summary["device"], summary["precision"], summary["global_step"], "steps",
                      train_s=summary["train_seconds"], objective=objective)


if __name__ == "__main__":
    run_stage(main)
