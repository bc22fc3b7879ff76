"""The one place that defines the data schema: raw source records and prepared instances.

Prepared tables are JSON Lines, one instance per line, with these columns:

| column            | tasks                          | meaning                                          |
|-------------------|--------------------------------|--------------------------------------------------|
| `id`              | all                            | instance id, `<story_id>:<k>`, unique per task   |
| `story_id`        | all                            | the source story; splits never share one         |
| `premise`         | all                            | X_P (ART: obs1)                                  |
| `initial`         | timetravel, timetravel_ablated | X_IE, the initial event                          |
| `counterfactual`  | timetravel, timetravel_ablated | X_CE, the counterfactual event                   |
| `original_ending` | timetravel, timetravel_ablated | X_OE as one string (ablated: not in the input)   |
| `hypothesis_1/_2` | art                            | the two ART hypotheses                           |
| `target`          | all                            | Y_EE, the edited ending (ART: obs2)              |
"""
from __future__ import annotations

from dataclasses import dataclass

from storyrewrite.io import InputError

# The model input, in this order, for each task. `original_ending` is kept as a column of the
# ablated task (counterfactual metrics need it) but is not part of its input.
TASK_INPUT_FIELDS: dict[str, tuple[str, ...]] = {
    "timetravel": ("premise", "initial", "original_ending", "counterfactual"),
    "timetravel_ablated": ("premise", "initial", "counterfactual"),
    "art": ("premise", "hypothesis_1", "hypothesis_2"),
}
TASK_COLUMNS: dict[str, tuple[str, ...]] = {
    "timetravel": ("id", "story_id", "premise", "initial", "counterfactual", "original_ending", "target"),
    "timetravel_ablated": ("id", "story_id", "premise", "initial", "counterfactual", "original_ending", "target"),
    "art": ("id", "story_id", "premise", "hypothesis_1", "hypothesis_2", "target"),
}
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Story:
    """One TimeTravel story with its human rewrites (1 in the train release, 3 in dev/test)."""

    story_id: str
    premise: str
    initial: str
    counterfactual: str
    original_ending: str
    edited_endings: tuple[str, ...]


@dataclass(frozen=True)
class ArtRow:
    story_id: str
    obs1: str
    obs2: str
    hyp1: str
    hyp2: str


def _text(record: dict, field: str, where: str) -> str:
    if field not in record:
        raise InputError(f"{where}: missing field `{field}`")
    value = record[field]
    if not isinstance(value, str):
        raise InputError(f"{where}: field `{field}` must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InputError(f"{where}: field `{field}` is empty")
    return " ".join(value.split())


def _sentences(value: object, field: str, where: str) -> str:
    """A text given either as one string or as a list of sentence strings, as one string."""
    if isinstance(value, str):
        sentences = [value]
    elif isinstance(value, list) and value and all(isinstance(s, str) for s in value):
        sentences = value
    else:
        raise InputError(f"{where}: field `{field}` must be a string or a non-empty list of strings")
    text = " ".join(" ".join(s.split()) for s in sentences)
    if not text:
        raise InputError(f"{where}: field `{field}` is empty")
    return text


def parse_story(record: dict, where: str) -> Story:
    """Validate one TimeTravel record. Both release formats are accepted: `original_ending` as
    a string (original release) or a list of sentences (EDUCAT's test copy), and the rewrites
    as `edited_endings` (dev/test: a list of sentence lists) or `edited_ending` (train)."""
    if "original_ending" not in record:
        raise InputError(f"{where}: missing field `original_ending`")
    original_ending = _sentences(record["original_ending"], "original_ending", where)
    if "edited_endings" in record:
        endings = record["edited_endings"]
        if not isinstance(endings, list) or not endings:
            raise InputError(f"{where}: field `edited_endings` must be a non-empty list")
        edited = tuple(_sentences(e, f"edited_endings[{i}]", where) for i, e in enumerate(endings))
    elif "edited_ending" in record:
        edited = (_sentences(record["edited_ending"], "edited_ending", where),)
    else:
        raise InputError(f"{where}: missing field `edited_endings` (or `edited_ending`)")
    return Story(
        story_id=_text(record, "story_id", where),
        premise=_text(record, "premise", where),
        initial=_text(record, "initial", where),
        counterfactual=_text(record, "counterfactual", where),
        original_ending=original_ending,
        edited_endings=edited,
    )


def story_input(record: dict, task: str, where: str) -> dict[str, str]:
    """The model input fields of `task` in a story of one's own (storyrewrite.rewrite), each a
    string or a list of sentences, as one string each; other fields are left out."""
    fields = TASK_INPUT_FIELDS[task]
    if missing := [field for field in fields if field not in record]:
        raise InputError(f"{where}: missing field(s) {', '.join(f'`{f}`' for f in missing)}; a `{task}` story has "
                         f"{', '.join(f'`{f}`' for f in fields)}")
    return {field: _sentences(record[field], field, where) for field in fields}


def parse_art_row(record: dict, where: str) -> ArtRow:
    return ArtRow(**{field: _text(record, field, where) for field in ("story_id", "obs1", "obs2", "hyp1", "hyp2")})


def check_instance(row: dict, task: str, where: str) -> dict:
    """Validate one prepared instance (as read back by training, generation and scoring)."""
    for column in TASK_COLUMNS[task]:
        if column not in row:
            raise InputError(f"{where}: missing field `{column}`")
        if not isinstance(row[column], str):
            raise InputError(f"{where}: field `{column}` must be a string, got {type(row[column]).__name__}")
    return row
