"""A file one stage writes and another reads (storyrewrite.artifacts): its errors name the file
and the first field that is wrong, before any work is spent on it."""
import json

import pytest

from storyrewrite import artifacts
from storyrewrite.io import InputError

USAGE = {"mode": "rag", "mode_label": "RAG", "backend": "local", "model": "m", "instances": 3, "prompts": 3,
         "prompt_tokens": 300, "completion_tokens": 60, "cut_at_limit": 0}


def _read(tmp_path, data, model=artifacts.LLMUsage):
    path = tmp_path / "rag.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data, indent=1))
    return artifacts.read(path, model), path


def test_a_written_artifact_reads_back_as_it_was(tmp_path):
    artifacts.write(tmp_path / "rag.json", artifacts.LLMUsage(**USAGE))
    assert _read(tmp_path, (tmp_path / "rag.json").read_text())[0] == artifacts.LLMUsage(**USAGE)


@pytest.mark.parametrize("data, message", [
    ({**USAGE, "colour": "red"}, "field `colour`: not a field of LLMUsage"),  # a renamed field's new name
    ({key: value for key, value in USAGE.items() if key != "prompts"}, "missing field `prompts` (LLMUsage)"),
    ({**USAGE, "prompts": "three"}, "field `prompts`: Input should be a valid integer, unable to parse string as an integer"),
    ([USAGE], "Input should be a valid dictionary or instance of LLMUsage"),
    ('{\n "mode": "rag",\n "prompts": 3,,\n}', "3: malformed JSON (Expecting property name enclosed in double quotes)"),
])
def test_a_wrong_artifact_names_its_file_and_first_wrong_field(tmp_path, data, message):
    with pytest.raises(InputError) as caught:
        _read(tmp_path, data)
    path = tmp_path / "rag.json"
    assert str(caught.value) == (f"{path}:{message}" if message[0].isdigit() else f"{path}: {message}")


def test_an_open_artifact_keeps_values_beside_its_fields(tmp_path):
    record = {"stage": "score-nll", "device": "cpu", "device_name": "CPU", "dtype": "float32", "wall_s": 1.5, "items": 3,
              "unit": "predictions", "items_per_s": 2.0, "systems": 2}
    read, _ = _read(tmp_path, record, artifacts.Record)
    assert read.model_extra == {"systems": 2} and read.wall_s == 1.5
