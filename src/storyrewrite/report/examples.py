"""Qualitative examples: each system's ending beside the story, with a word-level diff of the
prediction against the original ending (what the system changed)."""
from __future__ import annotations

import difflib


def word_diff(original: str, prediction: str) -> str:
    """Markdown: ~~removed words~~ and **added words** turn `original` into `prediction`."""
    before, after = original.split(), prediction.split()
    parts, opcodes = [], difflib.SequenceMatcher(a=before, b=after, autojunk=False).get_opcodes()
    for op, i1, i2, j1, j2 in opcodes:
        if op == "equal":
            parts.append(" ".join(before[i1:i2]))
            continue
        if op in ("delete", "replace"):
            parts.append("~~" + " ".join(before[i1:i2]) + "~~")
        if op in ("insert", "replace"):
            parts.append("**" + " ".join(after[j1:j2]) + "**")
    return " ".join(parts) if any(op != "equal" for op, *_ in opcodes) else "(no change)"


def example_block(instance: dict, predictions: dict[str, str], labels: dict[str, str]) -> str:
    lines = [f"#### {instance['id']}", ""]
    for field, name in (("premise", "Premise"), ("initial", "Initial event"), ("counterfactual", "Counterfactual event"),
                        ("hypothesis_1", "Hypothesis 1"), ("hypothesis_2", "Hypothesis 2"),
                        ("original_ending", "Original ending"), ("target", "Reference ending")):
        if field in instance:
            lines.append(f"- {name}: {instance[field]}")
    for system, prediction in predictions.items():
        shown = prediction if prediction.strip() else "(empty)"
        if "original_ending" in instance:
            lines.append(f"- {labels[system]}: {shown}  \n  diff against the original ending: {word_diff(instance['original_ending'], prediction)}")
        else:
            lines.append(f"- {labels[system]}: {shown}")
    return "\n".join(lines) + "\n"
