"""offline/runcache.py with real DVC: what one machine exports, another imports and DVC restores
instead of running; what depends on a model trained there, or is too large, stays behind."""
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "offline"))
import runcache  # noqa: E402  (offline/ is a folder of scripts, not a package)

# A pipeline of the comparison's shape: a model trained here (`train`), a stage that reads it
# (`generate`) and one that reads that stage's output (`score`); an LLM baseline that needs no
# trained model, writing a folder; a copy baseline whose output is too large to carry.
PIPELINE = """stages:
  prepare:
    cmd: cat in.txt in.txt > prepared.txt
    deps: [in.txt]
    outs: [prepared.txt]
  train:
    cmd: cat prepared.txt > model.bin && date +%s%N >> model.bin
    deps: [prepared.txt]
    outs: [model.bin]
  generate:
    cmd: cat model.bin prepared.txt > predictions.txt
    deps: [model.bin, prepared.txt]
    outs: [predictions.txt]
  score:
    cmd: mkdir -p scores && wc -c predictions.txt > scores/trained.txt
    deps: [predictions.txt]
    outs: [scores/trained.txt]
  llm:
    cmd: mkdir -p llm && sed s/story/ending/ prepared.txt > llm/a.txt && cat in.txt > llm/b.txt && echo ran >> llm.log
    deps: [prepared.txt]
    outs: [llm]
  sanity:
    cmd: head -c 3000000 /dev/zero > sanity.bin
    deps: [in.txt]
    outs: [sanity.bin]
"""


def _dvc(cwd: Path, *args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def machine(tmp_path):
    """A repository whose pipeline has run on one machine."""
    repo = tmp_path / "first"
    repo.mkdir()
    _git(repo, "init", "-q")
    _dvc(repo, "init", "-q")
    (repo / "in.txt").write_text("story\n")
    (repo / "dvc.yaml").write_text(PIPELINE)
    (repo / ".gitignore").write_text("llm.log\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "pipeline")
    _dvc(repo, "repro")
    return repo


def test_what_a_machine_exports_another_restores_and_the_rest_it_runs(machine, tmp_path):
    cache = machine / ".dvc" / "cache"
    out = tmp_path / "home" / "run-cache.tar.gz"
    kept, dropped = runcache.export(cache, out, ["model.bin"], max_entry_mb=1)
    assert sorted(o for e in kept for o in e.outs) == ["llm", "prepared.txt"] and dropped == []
    _, left_out = runcache.select(runcache.entries(cache), ["model.bin"], 2**20, set())
    reasons = {tuple(e.outs): left_out[e.name] for e in runcache.entries(cache) if e.name in left_out}
    assert reasons == {("model.bin",): "needs or makes what was trained here",
                       ("predictions.txt",): "needs or makes what was trained here",
                       ("scores/trained.txt",): "needs or makes what was trained here",  # through generate's output
                       ("sanity.bin",): "outputs of 2.9 MiB"}
    # An entry DVC is still writing (its temporary name) is no entry yet.
    next((cache / "runs").glob("*/*")).joinpath("1f2e.tmp").write_text("cmd: half")
    assert len(runcache.entries(cache)) == 6
    with tarfile.open(out) as archive:
        names = archive.getnames()
    # Each entry with its objects: the folder's listing and both of its files.
    assert sum(n.startswith("runs/") for n in names) == 2 and sum(n.startswith("files/md5/") for n in names) == 4

    other = tmp_path / "second"
    _git(tmp_path, "clone", "-q", str(machine), str(other))
    added = runcache.import_(other / ".dvc" / "cache", out)
    assert len(added) == 2 and runcache.import_(other / ".dvc" / "cache", out) == []  # never twice
    log = _dvc(other, "repro")
    assert "Stage 'prepare' is cached - skipping run" in log and "Stage 'llm' is cached - skipping run" in log
    assert "Running stage 'train'" in log and "Running stage 'sanity'" in log
    assert not (other / "llm.log").exists()  # the LLM baseline's command never ran here
    assert (other / "llm" / "a.txt").read_text() == (machine / "llm" / "a.txt").read_text()
    # This machine's export leaves out what it imported: at home already.
    assert runcache.export(other / ".dvc" / "cache", tmp_path / "again.tar.gz", ["model.bin"], max_entry_mb=1) == ([], [])


def test_what_is_rebuilt_in_seconds_stays_and_the_largest_entries_give_way_to_the_archives_size(machine, tmp_path):
    cache = machine / ".dvc" / "cache"
    kept, _ = runcache.export(cache, tmp_path / "a.tar.gz", ["model.bin"], 1, rebuilt=["prepared.txt"])
    assert [e.outs for e in kept] == [["llm"]]
    # No room at all: the LLM's folder (its listing and two files) leaves first, then the prepared data.
    kept, dropped = runcache.export(cache, tmp_path / "b.tar.gz", ["model.bin"], 1, max_mb=1e-9)
    assert kept == [] and [e.outs for e in dropped] == [["llm"], ["prepared.txt"]]
    with tarfile.open(tmp_path / "b.tar.gz") as archive:
        assert archive.getnames() == []


def test_a_bad_archive_or_cache_is_named(machine, tmp_path):
    with pytest.raises(runcache.InputError, match=r"nothing\.tar\.gz: no such file"):
        runcache.import_(machine / ".dvc" / "cache", tmp_path / "nothing.tar.gz")
    bad = tmp_path / "bad.tar.gz"
    (tmp_path / "evil").write_text("x")
    with tarfile.open(bad, "w:gz") as archive:
        archive.add(tmp_path / "evil", arcname="../evil")
    with pytest.raises(runcache.InputError, match=r"'\.\./evil' is not a run-cache entry"):
        runcache.import_(machine / ".dvc" / "cache", bad)
    with pytest.raises(runcache.InputError, match="no DVC run cache here"):
        runcache.export(tmp_path, tmp_path / "out.tar.gz", ["model.bin"], 1)


def test_the_command_line_names_what_is_wrong(tmp_path, capsys):
    with pytest.raises(SystemExit):
        runcache.main(["export", str(tmp_path / "out.tar.gz"), "--trained", "models/nll", "--max-entry-mb", "0"])
    assert "--max-entry-mb must be a positive number of MiB, not 0.0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        runcache.main(["export", str(tmp_path / "out.tar.gz"), "--trained", "models/nll", "--max-mb", "-1"])
    assert "--max-mb must be a positive number of MiB, not -1.0" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"error: .*nothing\.tar\.gz: no such file"):
        runcache.main(["import", str(tmp_path / "nothing.tar.gz")])
