"""Where a params error points: the line of the last layer that sets its key, or `-S:` where an
override sets it (storyrewrite.errors.locate), against line numbers counted in the YAML text."""
from pathlib import Path

import pytest

from storyrewrite.errors import InputError, line_setting, locate

BASE = """\
seed: 0
cpo:
  beta: 0.1
  lambda_: 1.0
llm:
  modes:
    - zero_shot
    - rag
  temperature: 0.0
"""
PROFILE = """\
llm:
  modes: [zero_shot, one_shot_fixed, rag]
train:
  precision: bf16-mixed
"""


@pytest.fixture
def layers(tmp_path) -> list[Path]:
    (tmp_path / "params.yaml").write_text(BASE)
    (tmp_path / "gpu.yaml").write_text(PROFILE)
    return [tmp_path / "params.yaml", tmp_path / "gpu.yaml"]


def _line(text: str, start: str) -> int:
    return next(number for number, line in enumerate(text.splitlines(), 1) if line.lstrip().startswith(start))


def test_the_line_that_sets_a_key_in_one_file(layers):
    base, profile = layers
    assert line_setting(base, "cpo.beta") == _line(BASE, "beta:")
    assert line_setting(base, "llm.modes[1]") == _line(BASE, "- rag")  # an item of a block list: its own line
    assert line_setting(base, "cpo.gamma") is None and line_setting(profile, "cpo.beta") is None  # left to another layer
    # A list or a scalar above the key sets it too: a profile's list replaces the list, item by item.
    assert line_setting(profile, "llm.modes[2]") == _line(PROFILE, "modes:")
    assert line_setting(base, "llm.modes[7]") == _line(BASE, "modes:")  # (an item the list lacks: the list's line)
    assert line_setting(base, "seed.value") == _line(BASE, "seed:")


def test_an_error_names_the_last_layer_that_sets_its_key(layers):
    base, profile = layers
    error = InputError("params: `llm.modes` has 'few_shot'", key="llm.modes[1]")
    assert str(locate(error, layers)) == f"{profile}:{_line(PROFILE, 'modes:')}: `llm.modes` has 'few_shot'"
    error = InputError("params: `cpo.beta` = -2: Input should be greater than 0", key="cpo.beta")
    assert str(locate(error, layers)) == f"{base}:{_line(BASE, 'beta:')}: `cpo.beta` = -2: Input should be greater than 0"
    assert locate(error, layers).key == "cpo.beta"


def test_an_error_whose_key_an_override_sets_names_the_override(layers):
    error = InputError("params: `llm.modes` has 'few_shot'", key="llm.modes[1]")
    assert str(locate(error, layers, ["llm.modes"])) == "-S: `llm.modes` has 'few_shot'"  # an item of the list set
    section = InputError("params: `cpo`: Extra inputs are not permitted", key="cpo")
    assert str(locate(section, layers, ["cpo.gamma"])) == "-S: `cpo`: Extra inputs are not permitted"  # a key inside it set
    beta = InputError("params: `cpo.beta` = -2", key="cpo.beta")
    assert str(locate(beta, layers, ["cpo.beta_max", "llm.modes"])) == f"{layers[0]}:{_line(BASE, 'beta:')}: `cpo.beta` = -2"


def test_an_error_is_left_as_it_is_where_no_line_can_be_named(layers, tmp_path):
    other = InputError("--predictions out: no such file", key="cpo.beta")  # not a params message
    assert locate(other, layers, ["cpo.beta"]) is other and locate(other, layers) is other
    keyless = InputError("params: a section is missing")
    assert locate(keyless, layers) is keyless
    beta = InputError("params: `cpo.beta` = -2", key="cpo.beta")
    # A later layer that cannot be read again (`--params /dev/stdin`): an earlier file's line could be the wrong one.
    assert locate(beta, [layers[0], tmp_path / "read-once.yaml"]) is beta
    task = InputError("params: `task` = 'ar'", key="task")
    assert locate(task, layers) is task  # set by no layer
