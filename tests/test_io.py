"""Every text input is read through storyrewrite.io, so a bad byte or bad JSON names file:line."""
import pytest

from storyrewrite.curves import parse_curve, read_curve
from storyrewrite.io import InputError, read_json, read_jsonl, read_text
from storyrewrite.llm.prompts import Template
from storyrewrite.metrics.evaluate import read_predictions
from storyrewrite.params import load_yaml


def test_an_undecodable_byte_names_its_line(tmp_path):
    path = tmp_path / "table.jsonl"
    path.write_bytes(b'{"id": "a"}\n{"id": "b"}\n{"id": "\xe9"}\n')  # latin-1, not UTF-8
    with pytest.raises(InputError, match=r"table\.jsonl:3: not valid UTF-8 \(byte b'\\xe9' at offset 32\)"):
        read_text(path)
    with pytest.raises(InputError, match=r"table\.jsonl:3: not valid UTF-8"):
        list(read_jsonl(path))


def test_a_byte_order_mark_is_read_as_no_text(tmp_path):
    rows, prompt = tmp_path / "mine.jsonl", tmp_path / "prompt.txt"
    rows.write_bytes('\ufeff{"id": "a"}\n{"id": "\ufeffb"}\n'.encode())  # a mark inside a string stays
    prompt.write_bytes("\ufeffRewrite the ending: {premise}\n".encode())
    assert list(read_jsonl(rows)) == [(1, {"id": "a"}), (2, {"id": "\ufeffb"})]
    assert read_text(prompt) == "Rewrite the ending: {premise}\n"


def test_line_separators_inside_json_strings_are_not_line_breaks(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "a\u2028b"}\n\n{"text": "c"}\n', encoding="utf-8")
    assert list(read_jsonl(path)) == [(1, {"text": "a\u2028b"}), (3, {"text": "c"})]


def test_malformed_json_names_its_line(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text('{\n  "a": 1,\n  "b": \n}\n')
    with pytest.raises(InputError, match=r"metrics\.json:4: malformed JSON"):
        read_json(path)


@pytest.mark.parametrize("reader, name", [
    (Template.read, "prompt.txt"),
    (load_yaml, "params.yaml"),
    (lambda path: read_predictions(path, [{"id": "a"}]), "predictions.jsonl"),
])
def test_prompts_params_and_predictions_name_the_bad_line(tmp_path, reader, name):
    path = tmp_path / name
    path.write_bytes(b"# first\n# second\n\xff\n")
    with pytest.raises(InputError, match=rf"{name.replace('.', '[.]')}:3: not valid UTF-8"):
        reader(path)


def test_a_curve_drops_a_last_line_cut_short_and_names_a_malformed_one(tmp_path):
    """DVCLive's TSV, from a file or from the text of a gathered run: a last line without its
    newline (a kill during the write) is dropped; a bad row before it names where and its line."""
    path = tmp_path / "loss.tsv"
    path.write_text("step\tloss\n0\t2.5\n1\t2.25\n2\t2.")
    assert read_curve(path) == [{"step": 0, "value": 2.5}, {"step": 1, "value": 2.25}]
    with pytest.raises(InputError, match=r"^run-a: loss.tsv:3: not a `step<TAB>loss` row$"):
        parse_curve("step\tloss\n0\t2.5\n1\tnan?\n2\t2.0\n", "loss", "run-a: loss.tsv")


def test_atomic_dir_swaps_a_directory_in_whole_or_leaves_the_old_one(tmp_path):
    from storyrewrite.io import atomic_dir

    target = tmp_path / "curves"
    with atomic_dir(target) as staging:
        assert staging.is_dir() and not target.exists()
        (staging / "a.csv").write_text("1")
    assert [p.name for p in target.iterdir()] == ["a.csv"]
    # A failure inside the block leaves the old directory as it was, and no staging behind.
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as staging:
            (staging / "b.csv").write_text("2")
            raise RuntimeError("interrupted")
    assert [p.name for p in target.iterdir()] == ["a.csv"]
    # A success replaces the old directory whole: nothing of it stays, nor any sibling.
    with atomic_dir(target) as staging:
        (staging / "b.csv").write_text("2")
    assert [p.name for p in target.iterdir()] == ["b.csv"]
    assert [p.name for p in tmp_path.iterdir()] == ["curves"]


def test_atomic_dir_refuses_a_file_before_the_work_and_clears_what_a_killed_swap_left(tmp_path):
    from storyrewrite.io import InputError, atomic_dir

    target = tmp_path / "tables"
    target.write_text("a user's file")
    ran = []
    with pytest.raises(InputError, match=f"^{target}: a file, where a folder goes"):
        with atomic_dir(target):
            ran.append(True)
    assert not ran and target.read_text() == "a user's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tables"]
    # A process killed mid-swap leaves `.tables.tmp` and `.tables.old`, folders or files (an older
    # version swapped a file at the path out as `.tables.old`), with the path there or not: none of
    # them stops the next swap, and all go.
    for present in (True, False):
        if present:
            target.unlink()
            target.mkdir()
            (tmp_path / ".tables.old").write_text("left behind")
            (tmp_path / ".tables.tmp").write_text("left behind")
        else:
            target.rename(tmp_path / ".tables.old")
            (tmp_path / ".tables.tmp").mkdir()
        with atomic_dir(target) as staging:
            (staging / "results.md").write_text(str(present))
        assert [p.name for p in target.iterdir()] == ["results.md"] and (target / "results.md").read_text() == str(present)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["tables"]


def test_an_atomically_written_file_gets_the_mode_open_gives_a_new_file(tmp_path, monkeypatch):
    """mkstemp makes its temporary files 0600: outputs renamed from them would be readable by
    their owner only (reports on a shared machine). They get what `open` gives, under any umask."""
    import os
    import stat

    from storyrewrite import io

    current = os.umask(0o022)
    os.umask(current)
    assert io._UMASK == current  # read at import, and left as it was
    try:
        for umask in (0o022, 0o027, 0o077):
            os.umask(umask)
            monkeypatch.setattr(io, "_UMASK", umask)
            folder = tmp_path / oct(umask)
            folder.mkdir()
            (folder / "plain.txt").write_text("x")
            io.write_text_atomic(folder / "atomic.txt", "x")
            io.write_json_atomic(folder / "atomic.json", {"a": 1})
            expected = stat.S_IMODE((folder / "plain.txt").stat().st_mode)
            assert expected == 0o666 & ~umask
            assert [stat.S_IMODE((folder / name).stat().st_mode) for name in ("atomic.txt", "atomic.json")] == [expected] * 2
    finally:
        os.umask(current)


def test_a_command_freezes_its_objects_out_of_the_collector_at_exit_once():
    """run_cli (every stage's and command's entry) has gc.freeze run at the process's exit, after
    the handlers registered before it, and registers it once however many commands run."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import atexit, gc\n"
            "calls, freeze = [], gc.freeze\n"
            "gc.freeze = lambda: (calls.append(1), freeze())[1]  # counted, then the real one\n"
            "atexit.register(lambda: print('froze', len(calls), 'time(s), objects frozen:', gc.get_freeze_count() > 0))\n"
            "from storyrewrite.io import run_cli\n"
            "run_cli(lambda: None)\n"
            "run_cli(lambda: None)\n"
            "print('frozen before the exit:', gc.get_freeze_count() > 0)\n")
    src = Path(__file__).resolve().parents[1] / "src"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": str(src)})
    assert result.stdout.splitlines() == ["frozen before the exit: False", "froze 1 time(s), objects frozen: True"]


def test_a_command_whose_reader_stops_early_ends_quietly_not_in_a_traceback():
    """`python -m storyrewrite.queue | grep -q ...`: the reader gone, run_cli ends the command with
    status 1 and nothing on stderr, whether the output is written during the command (large) or
    flushed at its end (one short line)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src"
    for output in ("'line\\n' * 100_000", "'one line'"):
        read, write = os.pipe()
        os.close(read)  # a reader that stopped before the first byte: every write meets a closed pipe
        try:
            result = subprocess.run([sys.executable, "-c", f"from storyrewrite.io import run_cli\nrun_cli(lambda: print({output}))\n"],
                                    stdout=write, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(src)})
        finally:
            os.close(write)
        assert (result.returncode, result.stderr) == (1, ""), output
