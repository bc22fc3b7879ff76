"""prompt_echo: the share of predictions that are not endings but echo the prompt. A small chat
model (the local LLM baselines' SmolLM2-135M-Instruct) often answers with the prompt's fields
(`Premise: … Initial event: …`) instead of an ending; the overlap metrics score such a text as
if it were a rewrite. A prediction echoes the prompt when it holds a field label of the prompt
(those the trained systems' inputs and the LLM templates write) or repeats the premise verbatim.
Torch-free."""
from __future__ import annotations

import re

from storyrewrite.data.formatting import FIELD_LABELS, TARGET_LABELS

# The labels the LLM templates (prompts/*.txt) write beside those of the model input; a test
# checks that every `Label: {column}` line of the templates is here.
TEMPLATE_LABELS = ("Rewritten ending", "Beginning", "Middle 1", "Middle 2", "Ending")
LABELS = tuple(dict.fromkeys([*FIELD_LABELS.values(), *TARGET_LABELS.values(), *TEMPLATE_LABELS]))
_LABEL = re.compile(r"(?:^|\s)(?:" + "|".join(re.escape(label) for label in LABELS) + r"):", re.IGNORECASE)


def echoes(prediction: str, instance: dict) -> bool:
    """Whether `prediction` holds a prompt field label (at a word start, with its colon) or the
    instance's premise word for word."""
    premise = " ".join(instance.get("premise", "").split()).lower()
    return bool(_LABEL.search(prediction)) or (len(premise) > 0 and premise in " ".join(prediction.split()).lower())


def prompt_echo(predictions: list[str], instances: list[dict]) -> float:
    """The share of predictions that echo the prompt."""
    return sum(echoes(p, row) for p, row in zip(predictions, instances, strict=True)) / len(instances)
