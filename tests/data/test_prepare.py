import json

import pytest

from storyrewrite.data.prepare import (
    build_splits, check_disjoint, load_instances, prepare, read_stories, split_by_story, subsample_stories,
)
from storyrewrite.io import InputError
from storyrewrite.params import DataConfig

from helpers import read_jsonl


@pytest.fixture(scope="module")
def full_splits(raw_dir):
    return build_splits(raw_dir, DataConfig(val_fraction=0.1), seed=0)


def test_official_test_counts(full_splits):
    test = full_splits["timetravel"]["test"]
    assert len(test) == 5613
    assert len({row["story_id"] for row in test}) == 1871
    assert len(full_splits["art"]["test"]) == 1532


def test_bundled_train_val_is_a_story_split_of_dev(full_splits):
    train, val = full_splits["timetravel"]["train"], full_splits["timetravel"]["val"]
    assert len(train) + len(val) == 5613  # dev: 1,871 stories x 3 endings
    assert len({r["story_id"] for r in val}) == round(1871 * 0.1)


def test_the_story_split_is_seeded_and_holds_out_at_least_one_story():
    rows = [{"story_id": f"s{i // 3}", "id": f"s{i // 3}:{i % 3}"} for i in range(60)]  # 20 stories of 3
    train, val = split_by_story(rows, 0.25, seed=1)
    assert len({r["story_id"] for r in val}) == 5 and len(train) + len(val) == 60
    assert (train, val) == split_by_story(rows, 0.25, seed=1)
    assert {r["story_id"] for r in val} != {r["story_id"] for r in split_by_story(rows, 0.25, seed=2)[1]}
    # A share that rounds to no story still holds one out: the validation split is never empty.
    assert len(split_by_story(rows, 0.01, seed=1)[1]) == 3


@pytest.mark.parametrize("task", ["timetravel", "timetravel_ablated", "art"])
def test_no_story_in_two_splits(full_splits, task):
    owners = {}
    for split, rows in full_splits[task].items():
        for row in rows:
            assert owners.setdefault(row["story_id"], split) == split


def test_check_disjoint_reports_the_shared_story():
    splits = {"train": [{"story_id": "s1"}, {"story_id": "s2"}], "test": [{"story_id": "s2"}]}
    with pytest.raises(InputError, match=r"story_id 's2' is in both `train` and `test`"):
        check_disjoint(splits, "timetravel")


def test_original_ending_normalised_from_both_formats(tmp_path):
    sentences = ["He ran.", "He fell.", "He  got up."]
    ending = [["A."], ["B."], ["C."]]
    base = {"premise": "P.", "initial": "I.", "counterfactual": "C.", "edited_endings": ending}
    path = tmp_path / "two_formats.json"
    path.write_text(
        json.dumps(dict(base, story_id="as-list", original_ending=sentences)) + "\n"
        + json.dumps(dict(base, story_id="as-string", original_ending="He ran. He fell. He got up.")) + "\n"
    )
    stories = read_stories(path)
    assert stories[0].original_ending == stories[1].original_ending == "He ran. He fell. He got up."


def test_subsample_keeps_whole_stories_seeded(full_splits):
    rows = full_splits["timetravel"]["test"]
    sample = subsample_stories(rows, 10, seed=3)
    assert len(sample) == 9  # 3 whole stories; a 4th would exceed 10
    assert sample == subsample_stories(rows, 10, seed=3)
    assert sample != subsample_stories(rows, 10, seed=4)
    for story in {r["story_id"] for r in sample}:
        assert sum(r["story_id"] == story for r in sample) == 3
    # A limit below one story's size keeps one whole story.
    one = subsample_stories(rows, 2, seed=3)
    assert len(one) == 3 and len({r["story_id"] for r in one}) == 1


def test_prepare_writes_tables_and_counts(tmp_path, raw_dir):
    counts = prepare(raw_dir, tmp_path, DataConfig(val_fraction=0.1, max_train=30, max_eval=9), seed=0)
    assert counts["timetravel"]["test"] == {"instances": 9, "stories": 3, "instances_full": 5613, "stories_full": 1871}
    assert counts["art"]["test"]["instances_full"] == 1532
    ablated = read_jsonl(tmp_path / "timetravel_ablated" / "test.jsonl")
    full = read_jsonl(tmp_path / "timetravel" / "test.jsonl")
    assert ablated == full  # same rows; the ablation is in which columns form the input
    art = load_instances(tmp_path, "art", "test")
    assert set(art[0]) == {"id", "story_id", "premise", "hypothesis_1", "hypothesis_2", "target"}
