"""The one error a user sees as a line, not a traceback (storyrewrite.io.run_stage: exit 2), and
the line of a params file that set the key it names. No import of the package's own: every
module may import it."""
from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import yaml


class InputError(ValueError):
    """Bad input data or parameters; the message names the file and line, or the parameter.
    `key`: the dotted params key a `params: ...` message names (`cpo.beta`, `llm.modes`), so that
    a caller that knows the params file can name the line that sets it (locate)."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


def line_setting(path: Path, key: str) -> int | None:
    """The line of the YAML file `path` that sets `key` (dotted, `llm.modes[1]`), or None where
    the file leaves it to an earlier layer. A file that replaces a list or a scalar above `key`
    sets it too: a profile's list replaces the list, item by item."""
    node = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    line = None
    for part in re.findall(r"[^.\[\]]+", key):
        if isinstance(node, yaml.MappingNode):
            found = next(((name, value) for name, value in node.value if name.value == part), None)
            if found is None:
                return None
            line, node = found[0].start_mark.line + 1, found[1]
        elif isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
            node = node.value[int(part)]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def locate(error: InputError, layers: Sequence[Path], overridden: Sequence[str] = ()) -> InputError:
    """`error` (`params: ...`, naming its `key`) with `params:` replaced by the file and line that
    set the key: the last of `layers` (params.yaml, then the profiles) that sets it; by `-S:` where
    an override sets the key (`overridden`: dotted keys; the value is in the message). As it is
    where it names no key or no file sets it, or where a layer cannot be read again (`--params
    /dev/stdin`)."""
    message, key = str(error), error.key
    if key is None or not message.startswith("params: "):
        return error
    for name in overridden:
        if any(long == short or long.startswith((short + ".", short + "[")) for long, short in ((key, name), (name, key))):
            return InputError(f"-S: {message.removeprefix('params: ')}", key=key)
    for layer in reversed(layers):
        if not layer.is_file():
            return error
        if line := line_setting(layer, key):
            return InputError(f"{layer}:{line}: {message.removeprefix('params: ')}", key=key)
    return error
