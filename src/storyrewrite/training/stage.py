"""The train_nll and train stages' work: read params, train with Lightning, export the best-on-val
weights, write the stage record. Each stage's script names the objectives it may build (their code
is what its dvc.yaml deps list): `stages/train_nll.py` NLL alone (objectives.base.NLL),
`stages/train.py` every one (the registry's entry that the params' `objective` names)."""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from storyrewrite.models.store import resolve_model_dir
from storyrewrite.objectives.base import Objective
from storyrewrite.params import Params, Section
from storyrewrite.records import StageRecord
from storyrewrite.training.run import Run, fit


def main(section: str, description: str, objective: Callable[[Params], Objective],
         settings: dict[str, type[Section]] | None = None) -> None:
    """Train `section`'s run with the objective `objective` finds in the params. `settings`: the
    objectives' params sections, where the stage knows them (storyrewrite.params.Params)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--init", type=Path, required=True, help="starting model dir (or the models stage's dir)")
    parser.add_argument("--data", type=Path, required=True, help="prepared data dir")
    parser.add_argument("--out", type=Path, required=True, help="best-on-val model, save_pretrained format")
    parser.add_argument("--checkpoints", type=Path, required=True, help="Lightning checkpoints, kept for resuming")
    parser.add_argument("--logs", type=Path, required=True, help="training curves (DVCLive) and summary")
    parser.add_argument("--scorer", type=Path, help="the models stage's dir (or a model dir): a frozen scorer")
    StageRecord.add_argument(parser)
    args = parser.parse_args()
    record = StageRecord.start(args.record)
    params = Params.load(settings=settings)
    run = Run.from_params(params, section, objective(params), resolve_model_dir(args.init), args.data,
                          resolve_model_dir(args.scorer, "scorer") if args.scorer else None)
    summary = fit(run, args.out, args.checkpoints, args.logs)
    print(json.dumps(summary, indent=2))
    if record:
        record.finish(summary["device"], summary["precision"], summary["global_step"], "steps",
                      train_s=summary["train_seconds"], validate_s=summary["validate_seconds"], objective=run.objective.name)
