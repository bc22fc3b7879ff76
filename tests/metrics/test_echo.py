"""prompt_echo on made-up predictions: what counts as echoing the prompt, and what does not."""
import re

import pytest

from helpers import ROOT
from storyrewrite.metrics.echo import LABELS, echoes, prompt_echo

INSTANCE = {"premise": "Tom had a dog named Rex.", "initial": "Rex ran away.", "original_ending": "Tom was sad.",
            "target": "Tom was happy."}


@pytest.mark.parametrize("prediction, echo", [
    ("Tom was happy all day.", False),
    ("Premise: Tom had a dog named Rex. Initial event: Rex ran away.", True),  # the prompt's fields
    ("Rewritten ending: Tom was happy.", True),  # the template's answer label
    ("tom   had a dog named REX. Then he was happy.", True),  # the premise verbatim (case and spacing aside)
    ("The premise of the story is odd.", False),  # the word without its colon is not a label
    ("Tom had a dog. He was happy.", False),  # part of the premise is not the premise
    ("He kept bending: down, then up.", False),  # a label inside a word (`Ending:`) is no label
])
def test_what_echoes_the_prompt(prediction, echo):
    assert echoes(prediction, INSTANCE) is echo


def test_an_instance_without_a_premise_echoes_through_its_labels_alone():
    assert not echoes("Tom was happy.", {"premise": ""})
    assert echoes("Ending: Tom was happy.", {})


def test_the_share_and_the_copy_baselines():
    predictions = ["Tom was happy.", "Premise: Tom had a dog named Rex.", "Original ending: Tom was sad.", "He smiled."]
    assert prompt_echo(predictions, [INSTANCE] * 4) == 0.5
    # Copying the reference or the original ending never echoes the prompt.
    assert prompt_echo([INSTANCE["target"], INSTANCE["original_ending"]], [INSTANCE] * 2) == 0.0


def test_every_label_the_templates_write_is_known():
    written = {label for path in (ROOT / "prompts").glob("*.txt")
               for label in re.findall(r"^([A-Z][\w ]*?): \{", path.read_text(), re.M)}
    assert written and written <= set(LABELS), written - set(LABELS)
