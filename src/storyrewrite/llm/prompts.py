"""Chat messages for one query, from the template file (see prompts/rewrite.txt)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from storyrewrite.io import InputError, read_text

SECTIONS = ("system", "example", "query")


@dataclass(frozen=True)
class Template:
    system: str
    example: str
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
        return cls(system, "\n".join(sections["example"]).strip(), "\n".join(sections["query"]).strip())


def _fill(text: str, instance: dict, with_target: bool) -> str:
    """Placeholders are the prepared table's columns ({premise}, {counterfactual}, …); {target}
    only in the example section."""
    values = {k: v for k, v in instance.items() if k != "target" or with_target}
    try:
        return text.format(**values)
    except KeyError as err:
        raise InputError(f"prompt template: unknown placeholder {{{err.args[0]}}}; valid: "
                         f"{', '.join('{' + k + '}' for k in values)}") from None


def messages(template: Template, query: dict, example: dict | None) -> list[dict]:
    """[system, user] chat messages; the user turn shows the solved example first, if any."""
    user = _fill(template.query, query, with_target=False)
    if example is not None:
        user = _fill(template.example, example, with_target=True) + "\n\n" + user
    return [{"role": "system", "content": template.system}, {"role": "user", "content": user}]
