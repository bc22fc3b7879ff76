"""Rewrite stories of your own with a trained model: the edited ending of each.

    python -m storyrewrite.rewrite models/finetuned --premise "..." --initial "..." \\
        --original-ending "..." --counterfactual "..."
    python -m storyrewrite.rewrite models/finetuned --stories mine.jsonl --out rewrites.jsonl
    jq -c '...' stories.json | python -m storyrewrite.rewrite models/finetuned --stories -

MODEL is a trained model's folder: `models/nll`, `models/finetuned` (an experiment's after `dvc
exp apply`), or any seq2seq or causal LM in `save_pretrained` form. A story gives the input
fields of params.yaml's `task`, the task the model was trained on (timetravel: premise, initial,
original_ending, counterfactual; art: premise, hypothesis_1, hypothesis_2), each a string or a
list of sentences as in TimeTravel's release. A model this project trained names its task in its
`storyrewrite.json`, and a `task` other than that one is refused. A line of --stories is one
story, a JSON object, with an optional `id` (default: its line number); `--stories -` reads them
from standard input.
The model decodes as the `generate` stage does, with params.yaml's `generate` settings (greedy
or beam search, batch size, dtype, cache), `models.max_input_tokens`, `device` and `seed`; `-S
key=value` overrides any of them, as `dvc exp run -S` does. A story given by its fields prints
its ending; --stories writes a line {"id": ..., "prediction": ...} a story, in the file's order,
to --out (standard output without it).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from storyrewrite.data.schema import TASK_INPUT_FIELDS, story_input
from storyrewrite.io import InputError, decode_utf8, parse_jsonl, read_jsonl, run_cli, write_jsonl_atomic
from storyrewrite.params import Params, load_yaml, with_overrides

# Every task's input fields, each once: a flag each (--original-ending, --hypothesis-1, ...).
FIELDS = tuple(dict.fromkeys(field for fields in TASK_INPUT_FIELDS.values() for field in fields))


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def stories_from(path: Path, task: str) -> list[tuple[object, dict]]:
    """(id as given, the story's input fields) of each line of a JSON Lines file (`-`: standard
    input); a line with no `id` is named by its line number."""
    if str(path) == "-":
        source = "standard input"
        records = parse_jsonl(decode_utf8(sys.stdin.buffer.read(), source), source)
    elif not path.is_file():
        raise InputError(f"--stories {path}: no such file")
    else:
        source, records = str(path), read_jsonl(path)
    stories, lines = [], {}
    for line, record in records:
        where, story_id = f"{source}:{line}", record.get("id", line)
        if isinstance(story_id, bool) or not isinstance(story_id, str | int):
            raise InputError(f"{where}: field `id` must be a string or a whole number, got {json.dumps(story_id)}")
        if str(story_id) in lines:
            raise InputError(f"{where}: id {json.dumps(story_id)} is that of line {lines[str(story_id)]} too (a line "
                             "without an `id` is named by its line number); each story needs its own")
        lines[str(story_id)] = line
        stories.append((story_id, story_input(record, task, where)))
    if not stories:
        raise InputError(f"{source}: no story in it (one JSON object a line)")
    return stories


def story_from_flags(given: dict[str, str], task: str) -> dict:
    """The story of the command line's field flags (`given`: field -> text)."""
    fields = TASK_INPUT_FIELDS[task]
    wanted = " ".join(flag(field) for field in fields)
    if other := [field for field in given if field not in fields]:
        raise InputError(f"{', '.join(map(flag, other))}: not a field of a `{task}` story (params `task`); its fields: {wanted}")
    if missing := [field for field in fields if field not in given]:
        raise InputError(f"missing {', '.join(map(flag, missing))}: a `{task}` story (params `task`) has {wanted}")
    return story_input(given, task, "the command line")


def check_out(path: Path, stories: Path) -> None:
    """Stop before any model loads where --out cannot become the rewrites' file: a folder, a place
    where no file can be written (the write comes after the whole decoding), or the stories' own
    file, which the rewrites would replace."""
    if path.exists() and str(stories) != "-" and path.resolve() == stories.resolve():
        raise InputError(f"--out {path}: the --stories file itself, which the rewrites would replace; give another file")
    if path.is_dir():
        raise InputError(f"--out {path}: a folder; give the rewrites' file, e.g. {path / 'rewrites.jsonl'}")
    ancestor = path.parent  # the folders that are missing are made at the write
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InputError(f"--out {path}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InputError(f"--out {path}: {ancestor} cannot be written to")


def check_task(model: Path, params: Params) -> None:
    """A model trained by this project names its task beside its weights: the stories must be of it.
    (A folder that is no model is left to the loading, after the stories are read.)"""
    from storyrewrite.models.store import TRAINED_FILE, trained_task

    if (task := trained_task(model)) is not None and task != params.task:
        raise InputError(f"{model} was trained on task `{task}` (its {TRAINED_FILE}), not `{params.task}` (`task` in "
                         f"{params.source}): use -S task={task}")


def rewrite(model: Path, stories: list[dict], params: Params) -> list[str]:
    """The ending the model at `model` writes for each of `stories` (each its `task` input fields),
    decoded by the `generate` stage's own function with `params`' settings."""
    from storyrewrite.generation.generate import generate_predictions
    from storyrewrite.models.device import resolve_device
    from storyrewrite.models.store import resolve_model_dir

    model_dir, device, config = resolve_model_dir(model), resolve_device(params.device), params.generate
    instances = [{"id": str(number), **story} for number, story in enumerate(stories)]
    decoding = "greedy" if config.num_beams == 1 else f"beam search of {config.num_beams}"
    print(f"rewrite: {len(stories)} {params.task} stor{'y' if len(stories) == 1 else 'ies'} with {model_dir} ({decoding}, at "
          f"most {config.max_new_tokens} new tokens, {config.dtype} on {device})", file=sys.stderr)
    with tempfile.TemporaryDirectory() as folder:  # (its partial file, for resuming, is of no use here)
        out = Path(folder) / "rewrites.jsonl"
        generated = generate_predictions(model_dir, instances, params.task, config, params.models, out, params.seed, device)
        if generated.cut:
            print(f"rewrite: {generated.cut} of {len(stories)} ending(s) cut at {config.max_new_tokens} tokens "
                  f"(-S generate.max_new_tokens=N allows more)", file=sys.stderr)
        return [row["prediction"] for _, row in read_jsonl(out)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m storyrewrite.rewrite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, metavar="MODEL", help="a trained model's folder (models/finetuned, models/nll)")
    parser.add_argument("--stories", type=Path, help="a JSON Lines file of stories, one a line (-: standard input)")
    parser.add_argument("--out", type=Path, help="with --stories: the rewrites' JSON Lines file (default: standard output)")
    for field in FIELDS:
        parser.add_argument(flag(field), dest=field, metavar="TEXT", help=f"one story's `{field}`")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"),
                        help="the settings (default: params.yaml, in the folder it runs in: the repository's root)")
    parser.add_argument("-S", "--set-param", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a params override, as `dvc exp run -S` takes it (repeatable)")
    args = parser.parse_args(argv)

    def run() -> None:
        if not args.params.is_file():
            where = " (run it from the repository's root, or give --params)" if args.params == Path("params.yaml") else ""
            raise InputError(f"--params {args.params}: no such file{where}")
        experiments = with_overrides(load_yaml(args.params), args.overrides)
        if len(experiments) > 1:
            raise InputError(f"-S: a sweep gives {len(experiments)} settings; a rewrite takes one")
        params = Params(experiments[0][1], " ".join([str(args.params), *(f"-S {o}" for o in args.overrides)]))
        check_task(args.model, params)
        given = {field: getattr(args, field) for field in FIELDS if getattr(args, field) is not None}
        if args.stories is None:
            if args.out is not None:
                raise InputError("--out goes with --stories; a story given by its fields prints its ending")
            if not given:
                wanted = " ".join(flag(field) for field in TASK_INPUT_FIELDS[params.task])
                raise InputError(f"no story: give --stories FILE, or a `{params.task}` story's fields {wanted}")
            print(rewrite(args.model, [story_from_flags(given, params.task)], params)[0])
            return
        if given:
            raise InputError(f"give --stories or a story's fields ({', '.join(map(flag, given))}), not both")
        stories = stories_from(args.stories, params.task)
        if args.out is not None:
            check_out(args.out, args.stories)
        rows = [{"id": story_id, "prediction": ending}
                for (story_id, _), ending in zip(stories, rewrite(args.model, [s for _, s in stories], params), strict=True)]
        if args.out is not None:
            write_jsonl_atomic(args.out, rows)
        else:
            for row in rows:
                print(json.dumps(row, ensure_ascii=False))

    run_cli(run)


if __name__ == "__main__":
    main()
