"""train: the params' `objective`, fine-tuning the NLL model."""
# Every objective this stage may build (storyrewrite.objectives.registry imports the one it
# builds): their code is what its dvc.yaml deps list.
import storyrewrite.objectives.cpo  # noqa: F401
import storyrewrite.objectives.dto  # noqa: F401
import storyrewrite.objectives.nll  # noqa: F401
import storyrewrite.objectives.rloo  # noqa: F401
from storyrewrite.io import run_stage
from storyrewrite.objectives.registry import SETTINGS, get_objective
from storyrewrite.training.stage import main

if __name__ == "__main__":
    run_stage(lambda: main("train", __doc__, lambda params: get_objective(params.objective, params.task, params.section), SETTINGS))
