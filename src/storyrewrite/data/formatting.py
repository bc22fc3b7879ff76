"""Model input text, built by one function per model kind.

- seq2seq (BART, as in the paper): the task's input fields joined by the tokenizer's separator
  token (`</s>` for BART);
- causal LM: a plain-text prompt, one labelled line per field, ending with the label of the
  text to write; the target follows after a space.
"""
from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from storyrewrite.data.schema import TASK_INPUT_FIELDS

FIELD_LABELS = {
    "premise": "Premise",
    "initial": "Initial event",
    "original_ending": "Original ending",
    "counterfactual": "Counterfactual event",
    "hypothesis_1": "Hypothesis 1",
    "hypothesis_2": "Hypothesis 2",
}
TARGET_LABELS = {"timetravel": "Edited ending", "timetravel_ablated": "Edited ending", "art": "Ending"}


def seq2seq_source(instance: dict, task: str, separator: str) -> str:
    return separator.join(instance[field] for field in TASK_INPUT_FIELDS[task])


def causal_prompt(instance: dict, task: str) -> str:
    lines = [f"{FIELD_LABELS[field]}: {instance[field]}" for field in TASK_INPUT_FIELDS[task]]
    return "\n".join(lines) + f"\n{TARGET_LABELS[task]}:"


def causal_target(text: str) -> str:
    """The target as it continues the prompt (which ends with a colon)."""
    return " " + text


def model_source(instance: dict, task: str, tokenizer: PreTrainedTokenizerBase, seq2seq: bool) -> str:
    if seq2seq:
        separator = tokenizer.sep_token or tokenizer.eos_token
        return seq2seq_source(instance, task, separator)
    return causal_prompt(instance, task)


def model_target(text: str, seq2seq: bool) -> str:
    return text if seq2seq else causal_target(text)
