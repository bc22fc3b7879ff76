"""File helpers shared by every stage: atomic writes and JSON Lines reading with line numbers."""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from storyrewrite.errors import InputError, locate  # InputError re-exported: every stage imports it from here

# The process's umask, read once (reading it means setting it): mkstemp makes its files 0600,
# and an output should get the mode `open` would have given it (others may read reports/).
_UMASK = os.umask(0o022)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds.

    Readers never see a half-written file, and a failure leaves no partial output behind. The
    file gets the mode `open` gives a new one (0666 less the umask).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        tmp.chmod(0o666 & ~_UMASK)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty staging directory beside `path`; swap it in for `path` (a directory there
    is replaced whole) only if the block succeeds. The old directory stays in place until the
    swap, and a failure leaves it as it was, with no staging directory behind. A file at `path`
    is an error before the block runs: the work would otherwise end in a failed swap."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{path}: a file, where a folder goes (its contents are replaced whole)")
    staging, old = path.with_name(f".{path.name}.tmp"), path.with_name(f".{path.name}.old")
    _remove(staging)  # what a process killed mid-swap left, a folder or a file
    staging.mkdir(parents=True)
    try:
        yield staging
        _remove(old)
        if path.exists():
            path.rename(old)
        staging.rename(path)
        _remove(old)
    finally:
        _remove(staging)


def _remove(path: Path) -> None:
    """A directory tree, a file or a link at `path`, removed where there is one."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def write_jsonl_atomic(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def read_text(path: str | os.PathLike) -> str:
    """The file decoded as UTF-8 (a `.gz` one decompressed first); an undecodable byte is an error
    naming file:line."""
    data = Path(path).read_bytes()
    if str(path).endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise InputError(f"{path}: not a whole gzip file ({err})") from None
    return decode_utf8(data, path)


def decode_utf8(data: bytes, source) -> str:
    """`data` decoded as UTF-8, without the byte order mark some editors write first (Windows
    PowerShell's UTF-8, Excel's "UTF-8 CSV"): JSON refuses it, and a prompt would keep it as an
    invisible first character. An undecodable byte is an error naming `source` (a file, or where
    the bytes came from) and the line."""
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputError(f"{source}:{line}: not valid UTF-8 (byte {data[err.start:err.start + 1]!r} at offset {err.start})") from None


def read_json(path: str | os.PathLike) -> Any:
    """A JSON file; a decode or syntax error names file:line."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{err.lineno}: malformed JSON ({err.msg})") from None


def read_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """Yield (line number, object) for each non-blank line; a malformed line names file:line."""
    yield from parse_jsonl(read_text(path), path)


def read_jsonl_resumable(path: str | os.PathLike) -> tuple[list[dict], bool]:
    """The rows of an append-only JSON Lines file that a stage resumes from, and whether its
    last line was torn (no newline at its end: a write cut short by a kill or a full disk) and
    dropped. Every line is written with its newline in one call, so only the last can be torn;
    a malformed line before it is corruption, not a crash: an error naming file:line."""
    data = Path(path).read_bytes()
    complete = data[: data.rfind(b"\n") + 1]  # a torn line may end inside a UTF-8 character
    torn = bool(data[len(complete):].strip())
    return [row for _, row in parse_jsonl(decode_utf8(complete, path), path)], torn


def parse_jsonl(text: str, path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of JSON Lines `text`; a malformed line is an
    error naming `path` (a file, or where the text came from) and the line."""
    # split("\n"), not splitlines(): JSON strings may hold U+2028 and other line separators.
    for line_number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}:{line_number}: malformed JSON ({err.msg})") from None
        if not isinstance(obj, dict):
            raise InputError(f"{path}:{line_number}: expected a JSON object, got {type(obj).__name__}")
        yield line_number, obj


def find_file(system: str, directories: list[Path], suffix: str) -> Path:
    """`<dir>/<system><suffix>` in the first of `directories` that has it; none is an error."""
    for directory in directories:
        if (directory / f"{system}{suffix}").exists():
            return directory / f"{system}{suffix}"
    raise InputError(f"no {system}{suffix} in {', '.join(map(str, directories))} (is its stage in the pipeline?)")


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def run_stage(main) -> None:
    """Run a stage's `main` with its share of the machine (storyrewrite.parallel), said in one
    line where it shares it with other workers, then as `run_cli` does. A bad value of params.yaml
    (the stage's, in its working directory) is named by its line there: `params.yaml:57: ...`."""
    import sys

    from storyrewrite.parallel import share_machine

    def located() -> None:
        try:
            main()
        except InputError as error:
            try:
                found = locate(error, [Path("params.yaml")])
            except Exception:  # noqa: BLE001 - the error as it is, rather than one of reading the file again
                raise error from None
            raise found from None

    if (threads := share_machine()) is not None:
        print(f"{threads} CPU thread(s): this machine's share of one of several concurrent workers", file=sys.stderr)
    run_cli(located)


def run_cli(main) -> None:
    """Run a command's `main`: bad input or params end it with their message (which names the
    file and line, or the parameter and its valid values) and exit status 2, not a traceback.
    A reader that stops early (`... | head`, `... | grep -q`) ends it quietly with status 1, as
    Python's documentation of SIGPIPE advises, rather than in a BrokenPipeError traceback.
    At exit the objects made so far are frozen out of the garbage collector: the interpreter's
    teardown would otherwise collect every object torch, transformers and Lightning made at
    import, 0.7 to 2 s a stage on a 2-core CPU (generate, train) that DVC waits for."""
    import atexit
    import gc
    import sys

    atexit.unregister(gc.freeze)  # registered once, however many commands one process runs
    atexit.register(gc.freeze)
    try:
        main()
        sys.stdout.flush()  # here, not at exit, where a closed pipe would be reported as an ignored exception
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except BrokenPipeError:
        # Python flushes stdout again at exit, which would raise once more: /dev/null takes it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
