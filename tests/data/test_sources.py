import hashlib
import json
import zipfile

import pytest

from storyrewrite.data.sources import download
from storyrewrite.io import InputError
from storyrewrite.params import DownloadConfig, build, load_yaml

from helpers import BUNDLED, ROOT


def _config(**changes) -> DownloadConfig:
    section = load_yaml(ROOT / "params.yaml")["download"]
    return build(DownloadConfig, {**section, **changes}, "download")


def test_bundled_files_copied_with_provenance(tmp_path):
    written = download(_config(), tmp_path / "raw", BUNDLED, tmp_path / "sums.json")
    assert {p.relative_to(tmp_path / "raw").as_posix() for p in written} == {
        "timetravel/dev.json", "timetravel/test.json", "art/dev.jsonl", "art/dev-labels.lst",
        "art/train.jsonl", "art/train-labels.lst",
    }
    assert (tmp_path / "raw" / "timetravel" / "PROVENANCE.md").exists()
    assert (tmp_path / "raw" / "art" / "PROVENANCE.md").exists()


def test_bundled_checksum_mismatch_is_an_error(tmp_path):
    bundled = tmp_path / "bundled"
    for source in BUNDLED.rglob("*"):
        if source.is_file():
            (bundled / source.relative_to(BUNDLED)).parent.mkdir(parents=True, exist_ok=True)
            (bundled / source.relative_to(BUNDLED)).write_bytes(source.read_bytes())
    with open(bundled / "art" / "dev.jsonl", "a") as f:
        f.write("\n")
    with pytest.raises(InputError, match=r"art/dev\.jsonl: sha256 mismatch: expected e8a7f2e5"):
        download(_config(), tmp_path / "raw", bundled, tmp_path / "sums.json")
    # Checked before anything is written: no file of the files before it in params, no staging folder.
    assert list(tmp_path.iterdir()) == [bundled]


def test_a_failed_checksum_leaves_the_previous_download_whole(tmp_path):
    download(_config(), tmp_path / "raw", BUNDLED, tmp_path / "sums.json")
    before = {p.relative_to(tmp_path / "raw"): p.read_bytes() for p in (tmp_path / "raw").rglob("*") if p.is_file()}
    bundled = tmp_path / "bundled"
    for source in BUNDLED.rglob("*"):
        if source.is_file():
            (bundled / source.relative_to(BUNDLED)).parent.mkdir(parents=True, exist_ok=True)
            (bundled / source.relative_to(BUNDLED)).write_bytes(source.read_bytes())
    (bundled / "timetravel" / "test_data.json").write_bytes(b"[]")  # corrupted, as is the last ART file
    (bundled / "art" / "subsets" / "isi-nlp-ai2-increment7" / "train-labels.lst").write_bytes(b"1\n")
    with pytest.raises(InputError) as failure:
        download(_config(), tmp_path / "raw", bundled, tmp_path / "sums.json")
    lines = str(failure.value).split("\nerror: ")
    assert len(lines) == 2 and "timetravel/test_data.json: sha256 mismatch" in lines[0] and "art/train-labels.lst" in lines[1]
    assert lines[0].endswith("(params `download.bundled.files.timetravel/test.json.sha256`)")
    after = {p.relative_to(tmp_path / "raw"): p.read_bytes() for p in (tmp_path / "raw").rglob("*") if p.is_file()}
    assert after == before and sorted(p.name for p in tmp_path.iterdir()) == ["bundled", "raw"]


def test_bundled_missing_file_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"bundled file missing \(params `download.bundled.files.timetravel/dev.json`\)"):
        download(_config(), tmp_path / "raw", tmp_path / "empty", tmp_path / "sums.json")


def _zip(path, members: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path.as_uri()


def test_url_source_records_sums_then_checks_them(tmp_path):
    train = b'{"story_id": "t"}\n'
    url = _zip(tmp_path / "tt.zip", {"release/train_supervised_small.json": train})
    archives = {"timetravel": {"url": url, "members": {"timetravel/train.json": "train_supervised_small.json"}}}
    config = _config(source="url", url={"archives": archives})
    sums = tmp_path / "sums.json"
    download(config, tmp_path / "raw", BUNDLED, sums)
    assert json.loads(sums.read_text()) == {"timetravel/train.json": hashlib.sha256(train).hexdigest()}
    assert (tmp_path / "raw" / "timetravel" / "train.json").read_bytes() == train

    _zip(tmp_path / "tt.zip", {"release/train_supervised_small.json": train + b"changed\n"})
    with pytest.raises(InputError, match="sha256 mismatch"):
        download(config, tmp_path / "raw", BUNDLED, sums)
    # The previous download stays whole, and no staging folder is left beside it.
    assert (tmp_path / "raw" / "timetravel" / "train.json").read_bytes() == train
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw", "sums.json", "tt.zip"]


def test_url_source_published_sum_and_missing_member(tmp_path):
    url = _zip(tmp_path / "art.zip", {"anli/dev.jsonl": b"x\n"})
    archive = {"url": url, "members": {"art/dev.jsonl": "dev.jsonl"}, "sha256": {"art/dev.jsonl": "0" * 64}}
    with pytest.raises(InputError, match=r"art\.zip:dev\.jsonl: sha256 mismatch"):
        download(_config(source="url", url={"archives": {"art": archive}}), tmp_path / "raw", BUNDLED, tmp_path / "s.json")
    archive["members"] = {"art/test.jsonl": "test.jsonl"}
    with pytest.raises(InputError, match=r"no `test\.jsonl` in the archive"):
        download(_config(source="url", url={"archives": {"art": archive}}), tmp_path / "raw", BUNDLED, tmp_path / "s.json")


def test_url_source_takes_a_local_path_and_names_the_key_of_a_bad_one(tmp_path, monkeypatch):
    train = b'{"story_id": "t"}\n'
    _zip(tmp_path / "tt.zip", {"release/train_supervised_small.json": train})
    monkeypatch.chdir(tmp_path)  # the stage runs in the repository root: a relative path is read from there
    archive = {"url": "tt.zip", "members": {"timetravel/train.json": "train_supervised_small.json"}}
    download(_config(source="url", url={"archives": {"timetravel": archive}}), tmp_path / "raw", BUNDLED, tmp_path / "s.json")
    assert (tmp_path / "raw" / "timetravel" / "train.json").read_bytes() == train
    for url, problem in (("missing.zip", "no such file"), ("s3://bucket/tt.zip", "unknown url type")):
        archive["url"] = url
        with pytest.raises(InputError, match=rf"params `download\.url\.archives\.timetravel\.url`: {url}: {problem}"):
            download(_config(source="url", url={"archives": {"timetravel": archive}}), tmp_path / "raw", BUNDLED, tmp_path / "s.json")


def test_a_failed_download_names_the_key_and_the_copy_on_disk(tmp_path):
    archive = {"url": (tmp_path / "gone.zip").as_uri(), "members": {"timetravel/train.json": "train_supervised_small.json"}}
    with pytest.raises(InputError, match=r"download of file://.*gone\.zip failed: .*No such file.* \(params "
                                         r"`download\.url\.archives\.timetravel\.url`; a copy downloaded by hand: its path\)"):
        download(_config(source="url", url={"archives": {"timetravel": archive}}), tmp_path / "raw", BUNDLED, tmp_path / "s.json")
