"""The download stage: bring the raw files into `data/raw`, every one checked by sha256.

Sources (params `download.source`):
- `bundled`: the TimeTravel dev/test and ART dev + 7 % train subset committed under
  `data/bundled` (see the PROVENANCE.md files there), checked against the sums in params.
- `url`: the original releases (TimeTravel zip with train_supervised_small.json; ART zip),
  for users with internet, or copies of them on disk (a file:// URL or a path). Files with a
  sum in params are checked against it; the others (no published sum exists for the TimeTravel
  files) are recorded on first download in the `download.url.recorded_sums` file and checked
  against it on every later run.
"""
from __future__ import annotations

import shutil
import tempfile
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

from storyrewrite.io import InputError, atomic_dir, read_json, sha256_file, write_json_atomic
from storyrewrite.params import BundledSource, DownloadConfig, UrlSource


def _check_sum(path: Path, expected: str, what: str) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise InputError(f"{what}: sha256 mismatch: expected {expected}, got {actual}")


def download_bundled(config: BundledSource, root: Path, out_dir: Path) -> list[Path]:
    """Every bundled file checked against its sum first; only then are they copied, into a
    folder that replaces `out_dir` whole (a mismatch leaves `out_dir` as it was)."""
    problems = []
    for raw_name, entry in config.files.items():
        src = root / entry.path
        if not src.exists():
            problems.append(f"{src}: bundled file missing (params `download.bundled.files.{raw_name}`)")
            continue
        try:
            _check_sum(src, entry.sha256, str(src))
        except InputError as error:
            problems.append(f"{error} (params `download.bundled.files.{raw_name}.sha256`)")
    if problems:
        raise InputError("\nerror: ".join(problems))
    with atomic_dir(out_dir) as staging:
        for raw_name, entry in config.files.items():
            (staging / raw_name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / entry.path, staging / raw_name)
        # Provenance travels with the data it describes.
        for provenance in sorted(root.glob("*/PROVENANCE.md")):
            (staging / provenance.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(provenance, staging / provenance.parent.name / "PROVENANCE.md")
    return [out_dir / raw_name for raw_name in config.files]


def _fetch(url: str, dest: Path, key: str) -> None:
    """The archive at `url` (params `key`) into `dest`: an http(s) or file URL, or a local path (a
    copy downloaded by hand, relative to the repository root)."""
    scheme = urllib.parse.urlsplit(url).scheme
    if not scheme:
        local = Path(url).expanduser()
        if not local.is_file():
            raise InputError(f"params `{key}`: {url}: no such file (an http(s) or file:// URL, or a local zip file)")
        url = local.resolve().as_uri()
    elif scheme not in ("http", "https", "ftp", "file"):  # what urllib opens
        raise InputError(f"params `{key}`: {url}: unknown url type {scheme!r} (an http(s) or file:// URL, or a local zip file)")
    request = urllib.request.Request(url, headers={"User-Agent": "storyrewrite"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response, open(dest, "wb") as f:
            shutil.copyfileobj(response, f)
    except OSError as err:
        raise InputError(f"download of {url} failed: {err} (params `{key}`; a copy downloaded by hand: its path)") from None
    if not zipfile.is_zipfile(dest):
        raise InputError(f"download of {url} did not give a zip file (a login or confirmation page?)")


def download_urls(config: UrlSource, out_dir: Path, recorded_path: Path) -> list[Path]:
    """`recorded_path`: a JSON file (tracked by git) of the sums recorded on first download."""
    recorded = read_json(recorded_path) if recorded_path.exists() else {}
    written = []
    # Every member into a folder that replaces `out_dir` whole once all of them passed their sums.
    with tempfile.TemporaryDirectory() as tmp_dir, atomic_dir(out_dir) as staging:
        for name, archive in config.archives.items():
            zip_path = Path(tmp_dir) / f"{name}.zip"
            _fetch(archive.url, zip_path, f"download.url.archives.{name}.url")
            with zipfile.ZipFile(zip_path) as zf:
                by_basename = {Path(m).name: m for m in zf.namelist() if not m.endswith("/")}
                for raw_name, member in archive.members.items():
                    if member not in by_basename:
                        raise InputError(f"{archive.url}: no `{member}` in the archive (params `download.url.archives.{name}`)")
                    dest = staging / raw_name
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(by_basename[member]) as src, open(dest, "wb") as f:
                        shutil.copyfileobj(src, f)
                    expected = archive.sha256.get(raw_name) or recorded.get(raw_name)
                    if expected:
                        _check_sum(dest, expected, f"{archive.url}:{member}")
                    else:
                        recorded[raw_name] = sha256_file(dest)
                    written.append(out_dir / raw_name)
    write_json_atomic(recorded_path, dict(sorted(recorded.items())))
    return written


def download(config: DownloadConfig, out_dir: Path, bundled_dir: Path, recorded_sums: Path) -> list[Path]:
    if config.source == "bundled":
        return download_bundled(config.bundled, bundled_dir, out_dir)
    return download_urls(config.url, out_dir, recorded_sums)
