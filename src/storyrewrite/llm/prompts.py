"""Chat messages for one query, from the template file (see prompts/rewrite.txt).

A one-shot mode's solved example is an earlier exchange of the conversation: the [query]
section filled with the example as a user turn, its edited ending as the assistant's reply,
then the query itself (the usual few-shot form for chat models). Shown inline in the user turn
instead, the bundled 135M chat model echoed the prompt's fields in every reply."""
from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from pathlib import Path

from storyrewrite.io import InputError, read_text

SECTIONS = ("system", "query")


def template_path(templates: dict[str, str], task: str) -> Path:
    """The prompt template of `task` that `llm.templates` names; a task without one, or a file
    that is not there, is named by its params key."""
    if task not in templates:
        raise InputError(f"params: `llm.templates` names no template for task `{task}` (it has: "
                         f"{', '.join(templates) or 'none'})", key="llm.templates")
    path = Path(templates[task])
    if not path.is_file():
        raise InputError(f"params: `llm.templates.{task}` = {path}: no such file", key=f"llm.templates.{task}")
    return path


@dataclass(frozen=True)
class Template:
    system: str
    query: str
    source: str = "prompt template"  # the file, for errors
    # Each placeholder of the query -> the line of the file it is first on
    placeholders: dict[str, int] = field(default_factory=dict, compare=False)

    @classmethod
    def read(cls, path: str | Path) -> "Template":
        sections: dict[str, list[tuple[int, str]]] = {}
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
                sections[current].append((number, line))
        missing = [s for s in SECTIONS if s not in sections]
        if missing:
            raise InputError(f"{path}: missing section(s) {', '.join(f'[{s}]' for s in missing)}")
        # A paragraph's line breaks are for the file's readers: join wrapped lines of the system text.
        system = " ".join(" ".join(line for _, line in sections["system"]).split())
        query = "\n".join(line for _, line in sections["query"]).strip()
        return cls(system, query, str(path), _placeholders(sections["query"], path))


def _placeholders(lines: list[tuple[int, str]], path: str | Path) -> dict[str, int]:
    """The query's placeholders, each with its first line; a stray brace or a placeholder that is
    no column name ({0}, {premise.upper}) is refused here, with its line."""
    found: dict[str, int] = {}
    for number, line in lines:
        try:
            parsed = list(string.Formatter().parse(line))
        except ValueError as err:
            raise InputError(f"{path}:{number}: {err}; a brace of the text itself is written twice ({{{{ or }}}})") from None
        for _, name, _, _ in parsed:
            if name is not None and not name.isidentifier():
                raise InputError(f"{path}:{number}: placeholder {{{name}}} is not a column name such as {{premise}}")
            if name is not None:
                found.setdefault(name, number)
    return found


def _fill(template: Template, instance: dict) -> str:
    """Placeholders are the prepared table's columns ({premise}, {counterfactual}, …) but the
    answer ({target}), which is never part of a query."""
    values = {k: v for k, v in instance.items() if k != "target"}
    if unknown := [name for name in template.placeholders if name not in values]:
        where = f"{template.source}:{template.placeholders[unknown[0]]}"
        raise InputError(f"{where}: unknown placeholder {{{unknown[0]}}}; valid: {', '.join('{' + k + '}' for k in values)}")
    try:
        return template.query.format(**values)
    except ValueError as err:  # a format spec the text cannot take ({premise:d})
        raise InputError(f"{template.source}: {err}") from None


def messages(template: Template, query: dict, example: dict | None) -> list[dict]:
    """[system, user] chat messages; with a solved example, [system, user, assistant, user]: the
    example asked and answered, then the query."""
    turns = [{"role": "system", "content": template.system}]
    if example is not None:
        turns += [{"role": "user", "content": _fill(template, example)},
                  {"role": "assistant", "content": example["target"]}]
    return turns + [{"role": "user", "content": _fill(template, query)}]
