"""Reshape raw TimeTravel and ART files into one instance table per task and split."""
from __future__ import annotations

import random
from collections import Counter, defaultdict
from pathlib import Path

from storyrewrite.data.schema import SPLITS, TASK_COLUMNS, check_instance, parse_art_row, parse_story, Story
from storyrewrite.io import InputError, read_jsonl, write_jsonl_atomic
from storyrewrite.params import DataConfig


def read_stories(path: Path) -> list[Story]:
    stories = [parse_story(record, f"{path}:{line}") for line, record in read_jsonl(path)]
    _check_unique((s.story_id for s in stories), path)
    return stories


def read_art(path: Path) -> list:
    return [parse_art_row(record, f"{path}:{line}") for line, record in read_jsonl(path)]


def _check_unique(ids, path: Path) -> None:
    repeated = [i for i, n in Counter(ids).items() if n > 1]
    if repeated:
        raise InputError(f"{path}: story_id {repeated[0]!r} appears more than once")


def timetravel_instances(stories: list[Story]) -> list[dict]:
    """One instance per edited ending; the same rows serve `timetravel` and `timetravel_ablated`
    (they differ only in which columns form the model input)."""
    return [
        {
            "id": f"{s.story_id}:{k}",
            "story_id": s.story_id,
            "premise": s.premise,
            "initial": s.initial,
            "counterfactual": s.counterfactual,
            "original_ending": s.original_ending,
            "target": ending,
        }
        for s in stories
        for k, ending in enumerate(s.edited_endings)
    ]


def art_instances(rows: list) -> list[dict]:
    """ART: premise (obs1) + both hypotheses -> ending (obs2). A story appears in several rows
    (different hypothesis pairs), numbered in file order."""
    seen: Counter = Counter()
    instances = []
    for row in rows:
        k = seen[row.story_id]
        seen[row.story_id] += 1
        instances.append(
            {
                "id": f"{row.story_id}:{k}",
                "story_id": row.story_id,
                "premise": row.obs1,
                "hypothesis_1": row.hyp1,
                "hypothesis_2": row.hyp2,
                "target": row.obs2,
            }
        )
    return instances


def split_by_story(instances: list[dict], val_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Seeded story-level split into (train, val): all instances of a story go to one side."""
    story_ids = sorted({row["story_id"] for row in instances})
    random.Random(seed).shuffle(story_ids)
    n_val = max(1, round(len(story_ids) * val_fraction))
    val_ids = set(story_ids[:n_val])
    return (
        [row for row in instances if row["story_id"] not in val_ids],
        [row for row in instances if row["story_id"] in val_ids],
    )


def subsample_stories(instances: list[dict], max_instances: int | None, seed: int) -> list[dict]:
    """At most `max_instances` instances made of whole stories drawn at random (seeded), kept in
    their original order. At least one story is kept."""
    if max_instances is None or len(instances) <= max_instances:
        return instances
    by_story: dict[str, int] = defaultdict(int)
    for row in instances:
        by_story[row["story_id"]] += 1
    order = sorted(by_story)
    random.Random(seed).shuffle(order)
    chosen, total = set(), 0
    for story_id in order:
        if chosen and total + by_story[story_id] > max_instances:
            break
        chosen.add(story_id)
        total += by_story[story_id]
    return [row for row in instances if row["story_id"] in chosen]


def check_disjoint(splits: dict[str, list[dict]], task: str) -> None:
    """No story may be in two splits: checked on the data, not assumed from how it was made."""
    owner: dict[str, str] = {}
    for split, rows in splits.items():
        for row in rows:
            other = owner.setdefault(row["story_id"], split)
            if other != split:
                raise InputError(f"{task}: story_id {row['story_id']!r} is in both `{other}` and `{split}`")


def build_splits(raw_dir: Path, config: DataConfig, seed: int) -> dict[str, dict[str, list[dict]]]:
    """All tasks' full splits (before subsampling), from whatever raw files are present.

    With the official TimeTravel train file (`url` source) the splits are the official ones;
    with the bundled data, train/val are a story-level split of TimeTravel dev and test is the
    official test. ART: train/val from the (sub)set of ART train, test = ART dev.
    """
    tt = raw_dir / "timetravel"
    if (tt / "train.json").exists():
        tt_splits = {
            "train": timetravel_instances(read_stories(tt / "train.json")),
            "val": timetravel_instances(read_stories(tt / "dev.json")),
        }
    else:
        tt_splits = dict(zip(("train", "val"), split_by_story(
            timetravel_instances(read_stories(tt / "dev.json")), config.val_fraction, seed), strict=True))
    tt_splits["test"] = timetravel_instances(read_stories(tt / "test.json"))

    art = raw_dir / "art"
    art_train, art_val = split_by_story(art_instances(read_art(art / "train.jsonl")), config.val_fraction, seed)
    art_splits = {"train": art_train, "val": art_val, "test": art_instances(read_art(art / "dev.jsonl"))}

    tasks = {"timetravel": tt_splits, "timetravel_ablated": tt_splits, "art": art_splits}
    for task, splits in tasks.items():
        check_disjoint(splits, task)
    return tasks


def prepare(raw_dir: Path, out_dir: Path, config: DataConfig, seed: int) -> dict:
    """Write `<out_dir>/<task>/<split>.jsonl` for every task and split; return the counts."""
    counts: dict = {}
    for task, splits in build_splits(raw_dir, config, seed).items():
        counts[task] = {}
        for split in SPLITS:
            full = splits[split]
            limit = config.max_train if split == "train" else config.max_eval
            rows = subsample_stories(full, limit, seed)
            columns = TASK_COLUMNS[task]
            write_jsonl_atomic(out_dir / task / f"{split}.jsonl", ({c: row[c] for c in columns} for row in rows))
            counts[task][split] = {
                "instances": len(rows),
                "stories": len({row["story_id"] for row in rows}),
                "instances_full": len(full),
                "stories_full": len({row["story_id"] for row in full}),
            }
    return counts


def format_counts(counts: dict) -> str:
    lines = [f"{'task':<20}{'split':<7}{'instances':>10}{'stories':>9}{'full inst.':>12}{'full stories':>14}"]
    for task, splits in counts.items():
        for split, c in splits.items():
            lines.append(
                f"{task:<20}{split:<7}{c['instances']:>10,}{c['stories']:>9,}"
                f"{c['instances_full']:>12,}{c['stories_full']:>14,}"
            )
    return "\n".join(lines)


def load_instances(prepared_dir: str | Path, task: str, split: str) -> list[dict]:
    """Read one prepared table back, checking every row against the schema."""
    path = Path(prepared_dir) / task / f"{split}.jsonl"
    if not path.exists():
        raise InputError(f"{path}: prepared table not found (run `dvc repro prepare`)")
    rows = [check_instance(row, task, f"{path}:{line}") for line, row in read_jsonl(path)]
    if not rows:
        raise InputError(f"{path}: no instances")
    return rows
