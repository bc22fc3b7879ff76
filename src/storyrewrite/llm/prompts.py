"""Chat messages for one query, from the template file (see prompts/rewrite.txt).

A one-shot mode's solved example is an earlier exchange of the conversation: the [query]
section filled with the example as a user turn, its edited ending as the assistant's reply,
then the query itself (the usual few-shot form for chat models). Shown inline in the user turn
instead, the bundled 135M chat model echoed the prompt's fields in every reply."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from storyrewrite.io import InputError, read_text

SECTIONS = ("system", "query")


@dataclass(frozen=True)
class Template:
    system: str
    query: str

    @classmethod
    def read(cls, path: str | Path) -> "Template":
        sections: dict[str, list[str]] = {}
        current = None
        for number, line in enumerate(read_text(path).splitlines(), start=1):
            if line.startswith("#"):
                continue
            header = re.fullmatch(r"\[(\w+)\]", line.strip())
            if header:
                current = header.group(1)
                if current == "example":
                    raise InputError(f"{path}:{number}: no [example] section: a one-shot mode shows its example as an "
                                     f"earlier user turn ([query] filled with the example) answered by the example's "
                                     f"target; valid sections: {', '.join(SECTIONS)}")
                if current not in SECTIONS:
                    raise InputError(f"{path}:{number}: unknown section [{current}]; valid: {', '.join(SECTIONS)}")
                sections[current] = []
            elif current is None:
                if line.strip():
                    raise InputError(f"{path}:{number}: text before the first section")
            else:
                sections[current].append(line)
        missing = [s for s in SECTIONS if s not in sections]
        if missing:
            raise InputError(f"{path}: missing section(s) {', '.join(f'[{s}]' for s in missing)}")
        # A paragraph's line breaks are for the file's readers: join wrapped lines of the system text.
        system = " ".join(" ".join(sections["system"]).split())
        return cls(system, "\n".join(sections["query"]).strip())


def _fill(text: str, instance: dict) -> str:
    """Placeholders are the prepared table's columns ({premise}, {counterfactual}, …) but the
    answer ({target}), which is never part of a query."""
    values = {k: v for k, v in instance.items() if k != "target"}
    try:
        return text.format(**values)
    except KeyError as err:
        raise InputError(f"prompt template: unknown placeholder {{{err.args[0]}}}; valid: "
                         f"{', '.join('{' + k + '}' for k in values)}") from None


def messages(template: Template, query: dict, example: dict | None) -> list[dict]:
    """[system, user] chat messages; with a solved example, [system, user, assistant, user]: the
    example asked and answered, then the query."""
    turns = [{"role": "system", "content": template.system}]
    if example is not None:
        turns += [{"role": "user", "content": _fill(template.query, example)},
                  {"role": "assistant", "content": example["target"]}]
    return turns + [{"role": "user", "content": _fill(template.query, query)}]
