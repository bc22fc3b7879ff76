"""The systems one pipeline run compares, named explicitly (never "whatever files lie in a
folder", which would let results of systems no longer in the pipeline pass for current ones):

- trained systems: the `generate@<system>` stages (`nll`, `finetuned`), named by dvc.yaml;
- LLM baselines: `llm_<mode>` for each mode of `llm.modes`;
- copy baselines: the reference copied (an upper bound) and, where the task has one, the
  original ending copied unchanged (the classic trivial baseline).
"""
from __future__ import annotations

from storyrewrite.data.schema import TASK_COLUMNS

# trained system -> the stage that trains it (its record holds the training's wall time)
TRAIN_STAGES = {"nll": "train_nll", "finetuned": "train"}
# trained system -> where its training keeps its checkpoints (dvc.yaml's `--checkpoints`: kept for
# resuming, never a stage output), and the file there that a training writes as it starts, saying
# how many steps it takes (storyrewrite.training.monitor.TrainingPlan; read by storyrewrite.queue)
CHECKPOINTS = {"nll": "models/.checkpoints/nll", "finetuned": "models/.checkpoints/finetuned"}
TRAINING_PLAN = "plan.json"

# system -> (the instance column it copies, its label in reports)
COPY_BASELINES = {
    "copy_reference": ("target", "Copy of the reference (upper bound)"),
    "copy_original": ("original_ending", "Copy of the original ending"),
}


def copy_systems(task: str) -> list[str]:
    return [name for name, (column, _) in COPY_BASELINES.items() if column in TASK_COLUMNS[task]]


def copy_predictions(instances: list[dict], task: str) -> dict[str, list[dict]]:
    """system -> predictions [{id, prediction}] of each copy baseline the task has."""
    return {name: [{"id": row["id"], "prediction": row[COPY_BASELINES[name][0]]} for row in instances]
            for name in copy_systems(task)}


def llm_system(mode: str) -> str:
    return f"llm_{mode}"


def pipeline_systems(trained: list[str], llm_modes: list[str], task: str) -> list[str]:
    """Every system of the run: trained, then LLM, then copy baselines."""
    return [*trained, *(llm_system(mode) for mode in llm_modes), *copy_systems(task)]


def of_the_run(stage: str, systems: list[str]) -> bool:
    """Whether the stage record named `stage` (reports/stages/<stage>.json) is of a run of
    `systems`: the records of an LLM mode since dropped from `llm.modes` (`llm-<mode>`,
    `score_llm-<mode>`) stay in the folder, as outputs of a stage DVC no longer has."""
    kind, _, mode = stage.partition("-")
    return kind not in ("llm", "score_llm") or llm_system(mode) in systems
