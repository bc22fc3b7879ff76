"""python -m storyrewrite.rewrite: stories of one's own, rewritten as the generate stage would."""
import io
import json

import pytest
import torch

from storyrewrite.data.prepare import load_instances
from storyrewrite.generation.generate import generate_predictions
from storyrewrite.models.store import load_model, load_tokenizer, save_model
from storyrewrite.params import Params
from storyrewrite.rewrite import main

from helpers import ROOT, read_jsonl

# The repository's params with a tiny model's input limit and short endings, as -S gives them.
SETTINGS = ["--params", str(ROOT / "params.yaml"), "-S", "models.max_input_tokens=96", "-S", "generate.max_new_tokens=6",
            "-S", "device=cpu"]
FIELDS = ("premise", "initial", "original_ending", "counterfactual")


@pytest.fixture(scope="module")
def loud_llama(tiny_model_dirs, tmp_path_factory):
    """tiny:llama with every weight drawn at unit scale: its random init writes the same ending for
    every story, these weights one of its own for each, so that a story given another's ending shows."""
    model, tokenizer = load_model(tiny_model_dirs["llama"]), load_tokenizer(tiny_model_dirs["llama"])
    draw = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=draw))
    folder = tmp_path_factory.mktemp("loud") / "llama"
    save_model(model, tokenizer, folder)
    return folder


def _flags(story: dict) -> list[str]:
    """A story's fields as the command's flags, spelled here (not by the module's own `flag`)."""
    return [word for field, text in story.items() for word in (f"--{field.replace('_', '-')}", text)]


def _expected(model_dir, instances, tmp_path, task="timetravel", cut: list | None = None) -> list[str]:
    """The generate stage's function on the same instances, with the same settings (`cut`: gets
    the count of endings it cut at the token limit)."""
    params = Params.load(ROOT / "params.yaml")
    generate = params.generate.model_copy(update={"max_new_tokens": 6})
    models = params.models.model_copy(update={"max_input_tokens": 96})
    generated = generate_predictions(model_dir, instances, task, generate, models, tmp_path / "stage.jsonl", params.seed, "cpu")
    if cut is not None:
        cut.append(generated.cut)
    return [row["prediction"] for row in read_jsonl(tmp_path / "stage.jsonl")]


def _stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="latin-1"))  # (the command reads the bytes)


def test_a_file_of_stories_gets_the_generate_stages_endings_under_its_own_ids(tmp_path, loud_llama, small_prepared, capsys,
                                                                              monkeypatch):
    instances = load_instances(small_prepared, "timetravel", "train")[::3]  # (four stories)
    expected = _expected(loud_llama, instances, tmp_path, cut=(cut := []))
    assert len(set(expected)) == 4
    # Ids as given (a string, a number) or, where a line has none, its line number; other fields
    # (the reference) are left out of the input; an ending given as a list of sentences is one text.
    ids = ["mïne", 7, None, None]
    lines = []
    for story_id, row in zip(ids, instances, strict=True):
        story = {field: row[field] for field in FIELDS} | {"target": "not read"}
        if story_id is not None:
            story["id"] = story_id
        lines.append(json.dumps(story))
    split = {field: instances[3][field] for field in FIELDS}
    parts = split["original_ending"].split(". ")
    split["original_ending"] = [part + "." for part in parts[:-1]] + parts[-1:]
    assert len(parts) > 1 and " ".join(split["original_ending"]) == instances[3]["original_ending"]
    lines[3] = json.dumps(split)
    stories = tmp_path / "stories.jsonl"
    stories.write_text("\n".join(lines[:2]) + "\n\n" + "\n".join(lines[2:]) + "\n")  # (a blank line: skipped, counted)
    main([str(loud_llama), "--stories", str(stories), "--out", str(tmp_path / "out.jsonl"), *SETTINGS])
    rows = read_jsonl(tmp_path / "out.jsonl")
    assert rows == [{"id": i, "prediction": p} for i, p in zip(["mïne", 7, 4, 5], expected, strict=True)]
    out, err = capsys.readouterr()
    assert out == "" and f"rewrite: 4 timetravel stories with {loud_llama} (greedy, at most 6 new tokens, float32 on cpu)\n" in err
    assert cut[0] > 0 and f"rewrite: {cut[0]} of 4 ending(s) cut at 6 tokens (-S generate.max_new_tokens=N allows more)\n" in err
    main([str(loud_llama), "--stories", str(stories), *SETTINGS])  # no --out: standard output
    printed = capsys.readouterr().out
    assert [json.loads(line) for line in printed.splitlines()] == rows and printed.startswith('{"id": "mïne"')  # (UTF-8, as the file)
    _stdin(monkeypatch, stories.read_bytes())  # `--stories -`: from standard input
    main([str(loud_llama), "--stories", "-", *SETTINGS])
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == rows


def test_one_story_given_by_its_fields_prints_its_ending(tmp_path, loud_llama, small_prepared, capsys):
    instance = load_instances(small_prepared, "timetravel", "test")[3]
    expected = _expected(loud_llama, [instance], tmp_path)
    main([str(loud_llama), *_flags({field: instance[field] for field in FIELDS}), *SETTINGS])
    assert capsys.readouterr().out == expected[0] + "\n"
    # Another task's story: its own fields, in its own prompt.
    art = load_instances(small_prepared, "art", "test")[0]
    expected = _expected(loud_llama, [art], tmp_path, task="art")
    art_story = {field: art[field] for field in ("premise", "hypothesis_1", "hypothesis_2")}
    main([str(loud_llama), *_flags(art_story), *SETTINGS, "-S", "task=art"])
    assert capsys.readouterr().out == expected[0] + "\n"


def _error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    assert exit_.value.code == 2
    return capsys.readouterr().err.strip()


def test_a_bad_story_or_command_line_is_named_before_any_model_loads(tmp_path, capsys, monkeypatch):
    settings = ["--params", str(ROOT / "params.yaml")]
    model = str(tmp_path / "no-model")  # never read: each error comes first
    stories = tmp_path / "stories.jsonl"
    story = {"premise": "P.", "initial": "I.", "original_ending": "O.", "counterfactual": "C."}
    stories.write_text(json.dumps(story) + "\n" + json.dumps({k: v for k, v in story.items() if k != "counterfactual"}) + "\n")
    assert _error(capsys, model, "--stories", str(stories), *settings) == (
        f"error: {stories}:2: missing field(s) `counterfactual`; a `timetravel` story has `premise`, `initial`, "
        "`original_ending`, `counterfactual`")
    stories.write_text(json.dumps(story | {"id": 2}) + "\n" + json.dumps(story) + "\n")
    assert _error(capsys, model, "--stories", str(stories), *settings) == (
        f"error: {stories}:2: id 2 is that of line 1 too (a line without an `id` is named by its line number); each "
        "story needs its own")
    stories.write_text(json.dumps(story | {"id": [1]}) + "\n")
    assert _error(capsys, model, "--stories", str(stories), *settings) == (
        f"error: {stories}:1: field `id` must be a string or a whole number, got [1]")
    stories.write_text(json.dumps(story | {"id": True}) + "\n")  # (a bool is an int to Python)
    assert _error(capsys, model, "--stories", str(stories), *settings) == (
        f"error: {stories}:1: field `id` must be a string or a whole number, got true")
    stories.write_text(json.dumps(story | {"premise": ""}) + "\n{\n")
    assert _error(capsys, model, "--stories", str(stories), *settings) == f"error: {stories}:1: field `premise` is empty"
    assert _error(capsys, model, "--stories", str(tmp_path / "none.jsonl"), *settings) == (
        f"error: --stories {tmp_path / 'none.jsonl'}: no such file")
    monkeypatch.chdir(tmp_path)  # (outside the repository: no params.yaml here)
    assert _error(capsys, model, "--stories", str(stories)) == (
        "error: --params params.yaml: no such file (run it from the repository's root, or give --params)")
    assert _error(capsys, model, "--stories", str(stories), "--params", "mine.yaml") == "error: --params mine.yaml: no such file"
    # A model this project trained on another task (its storyrewrite.json names it).
    trained = tmp_path / "art-model"
    trained.mkdir()
    (trained / "storyrewrite.json").write_text(json.dumps({"task": "art", "objective": "nll", "label": "NLL"}))
    assert _error(capsys, str(trained), *_flags(story), *settings) == (
        f"error: {trained} was trained on task `art` (its storyrewrite.json), not `timetravel` (`task` in "
        f"{ROOT / 'params.yaml'}): use -S task=art")
    stories.write_text("\n")
    assert _error(capsys, model, "--stories", str(stories), *settings) == f"error: {stories}: no story in it (one JSON object a line)"
    # Standard input's lines: named as its own.
    _stdin(monkeypatch, json.dumps(story).encode() + b"\n[1]\n")
    assert _error(capsys, model, "--stories", "-", *settings) == "error: standard input:2: expected a JSON object, got list"
    _stdin(monkeypatch, json.dumps(story | {"premise": "Caf\u00e9."}, ensure_ascii=False).encode("latin-1") + b"\n")
    assert _error(capsys, model, "--stories", "-", *settings).startswith("error: standard input:1: not valid UTF-8 (byte b'\\xe9'")
    _stdin(monkeypatch, b"")
    assert _error(capsys, model, "--stories", "-", *settings) == "error: standard input: no story in it (one JSON object a line)"
    # The command line's story: named by its flags, for params' task.
    assert _error(capsys, model, "--premise", "P.", "--initial", "I.", *settings) == (
        "error: missing --original-ending, --counterfactual: a `timetravel` story (params `task`) has --premise --initial "
        "--original-ending --counterfactual")
    assert _error(capsys, model, "--premise", "P.", "--hypothesis-1", "H.", *settings) == (
        "error: --hypothesis-1: not a field of a `timetravel` story (params `task`); its fields: --premise --initial "
        "--original-ending --counterfactual")
    assert _error(capsys, model, *settings) == (
        "error: no story: give --stories FILE, or a `timetravel` story's fields --premise --initial --original-ending "
        "--counterfactual")
    assert _error(capsys, model, "--stories", str(stories), "--premise", "P.", *settings) == (
        "error: give --stories or a story's fields (--premise), not both")
    assert _error(capsys, model, "--premise", "P.", "--out", "x.jsonl", *settings) == (
        "error: --out goes with --stories; a story given by its fields prints its ending")
    assert _error(capsys, model, "--premise", "P.", *settings, "-S", "generate.num_beams=1,4") == (
        "error: -S: a sweep gives 2 settings; a rewrite takes one")
    assert _error(capsys, model, "--premise", "P.", *settings, "-S", "generate.num_beam=4").startswith(
        "error: -S generate.num_beam=4: unknown key `generate.num_beam`; valid keys in `generate`: split, batch_size, num_beams")
    assert _error(capsys, model, "--premise", "P.", *settings, "-S", "task=story").startswith("error: params: `task` = 'story'")
    # --out: a folder, under a file, or the stories' own file (through a link to it too).
    stories.write_text(json.dumps(story) + "\n")
    (tmp_path / "link.jsonl").symlink_to(stories)
    for out in (stories, tmp_path / "link.jsonl"):
        assert _error(capsys, model, "--stories", str(stories), "--out", str(out), *settings) == (
            f"error: --out {out}: the --stories file itself, which the rewrites would replace; give another file")
    assert _error(capsys, model, "--stories", str(stories), "--out", str(tmp_path), *settings) == (
        f"error: --out {tmp_path}: a folder; give the rewrites' file, e.g. {tmp_path / 'rewrites.jsonl'}")
    assert _error(capsys, model, "--stories", str(stories), "--out", str(stories / "new" / "out.jsonl"), *settings) == (
        f"error: --out {stories / 'new' / 'out.jsonl'}: {stories} is a file, not a folder")
    # The model comes last: a folder without a model's config.
    assert _error(capsys, model, *_flags(dict.fromkeys(FIELDS, "Text.")), *settings) == f"error: {model}: not a model directory (no config.json); run `dvc repro` first"
