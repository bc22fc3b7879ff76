import json

import pytest

from storyrewrite.data.prepare import prepare
from storyrewrite.io import InputError
from storyrewrite.params import DataConfig

from helpers import write_raw

GOOD = {
    "story_id": "s1", "premise": "P.", "initial": "I.", "counterfactual": "C.",
    "original_ending": "O.", "edited_endings": [["E."]],
}


def _raw_with_bad_dev(tmp_path, bad_line: str):
    raw = write_raw(tmp_path / "raw")
    lines = (raw / "timetravel" / "dev.json").read_text().splitlines()
    lines[2] = bad_line  # line 3
    (raw / "timetravel" / "dev.json").write_text("\n".join(lines) + "\n")
    return raw


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"story_id": "s1", "premise": ', r"dev\.json:3: malformed JSON"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "initial"}), r"dev\.json:3: missing field `initial`"),
        (json.dumps(dict(GOOD, premise=7)), r"dev\.json:3: field `premise` must be a string, got int"),
        (json.dumps(dict(GOOD, edited_endings="E.")), r"dev\.json:3: field `edited_endings` must be a non-empty list"),
        ("[1, 2]", r"dev\.json:3: expected a JSON object, got list"),
        (json.dumps(dict(GOOD, counterfactual=" \t ")), r"dev\.json:3: field `counterfactual` is empty"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "original_ending"}), r"dev\.json:3: missing field `original_ending`"),
        (json.dumps(dict(GOOD, original_ending=["O.", 2])),
         r"dev\.json:3: field `original_ending` must be a string or a non-empty list of strings"),
        (json.dumps(dict(GOOD, edited_endings=[["E."], [" "]])), r"dev\.json:3: field `edited_endings\[1\]` is empty"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "edited_endings"}),
         r"dev\.json:3: missing field `edited_endings` \(or `edited_ending`\)"),
    ],
)
def test_bad_record_names_file_line_and_field(tmp_path, bad_line, message):
    raw = _raw_with_bad_dev(tmp_path, bad_line)
    out = tmp_path / "prepared"
    with pytest.raises(InputError, match=message):
        prepare(raw, out, DataConfig(val_fraction=0.1), seed=0)
    assert not out.exists() or not any(out.rglob("*.jsonl"))  # nothing half-written


def test_bad_art_row(tmp_path):
    raw = write_raw(tmp_path / "raw")
    with open(raw / "art" / "dev.jsonl", "a") as f:
        f.write(json.dumps({"story_id": "x", "obs1": "a", "obs2": "b", "hyp1": "c"}) + "\n")
    with pytest.raises(InputError, match=r"art/dev\.jsonl:1533: missing field `hyp2`"):
        prepare(raw, tmp_path / "prepared", DataConfig(val_fraction=0.1), seed=0)


def test_an_undecodable_byte_names_file_and_line(tmp_path):
    raw = write_raw(tmp_path / "raw")
    path = raw / "timetravel" / "test.json"
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2][:20] + b"\xff" + lines[2][20:]  # line 3
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(InputError, match=r"timetravel/test\.json:3: not valid UTF-8 \(byte b'\\xff' at offset \d+\)"):
        prepare(raw, tmp_path / "prepared", DataConfig(val_fraction=0.1), seed=0)
