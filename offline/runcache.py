"""DVC's run cache of the stages another machine can reuse, carried in one small archive.

A comparison's first experiment builds every stage the others share; on a machine reached only
by copying files, a run stopped inside it brings none of its outputs home. The stages that use no
model trained there (the LLM baselines and their scores, the copy baselines, the metric-validity
check) compute the same outputs from the same inputs on the next machine. DVC writes each
stage's entry in its run cache (`.dvc/cache/runs/`) as the stage finishes, beside the cached
files it names; carried to the next machine and imported into its cache, they let DVC restore those
stages there ("Stage ... is cached - skipping run, checking out outputs") instead of running them.

    python offline/runcache.py export OUT.tar.gz --trained models/nll models/finetuned
    python offline/runcache.py import runs/gpu.1/run-cache.tar.gz

`export` takes the entries whose outputs are small (`--max-entry-mb`) and that neither produce
nor depend on what `--trained` names, directly or through another stage's outputs (a run cache
entry is found by the hashes of its dependencies, which a model trained elsewhere never
matches), nor make what `--rebuilt` names (the data, rebuilt in seconds), nor were imported (they
are at home already); then the largest are left out until the archive fits `--max-mb`. Our own code, because DVC's
`dvc push --run-cache` sends every entry with every output it names, the trained models among
them (gigabytes), to a configured remote; this archive fits the transfer limit given
(`--max-mb`). Where a DVC remote can be reached, use it instead (docs/pipeline.md).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from storyrewrite.errors import InputError
from storyrewrite.io import atomic_path

# Where `import` lists the entries it added, so that `export` leaves them out.
IMPORTED = Path("..") / "tmp" / "storyrewrite-run-cache-imported.txt"  # relative to the cache: .dvc/tmp/


@dataclass
class Entry:
    name: str  # runs/<key[:2]>/<key>/<value>, relative to the cache
    deps: list[str]
    outs: list[str]
    objects: list[str]  # the cached files its outputs need, relative to the cache
    size: int  # their bytes
    missing: bool  # an object not in this cache


def _object(md5: str) -> str:
    return f"files/md5/{md5[:2]}/{md5[2:]}"


def read_entry(cache: Path, name: str) -> Entry:
    # Every scalar a string: a hash of digits alone is no number.
    data = yaml.load((cache / name).read_text(), Loader=yaml.BaseLoader)
    outs = data.get("outs") or []
    objects = []
    for out in outs:
        objects.append(_object(out["md5"]))
        listing = cache / objects[-1]
        if out["md5"].endswith(".dir") and listing.exists():  # a folder: its listing, then each file in it
            objects += [_object(member["md5"]) for member in json.loads(listing.read_text())]
    present = [cache / o for o in objects if (cache / o).exists()]
    return Entry(name, [d["path"] for d in data.get("deps") or []], [o["path"] for o in outs], objects,
                 sum(path.stat().st_size for path in present), len(present) < len(objects))


def _is_entry(path: Path) -> bool:
    """runs/<key[:2]>/<key>/<value>, the value a SHA-256: not the temporary file DVC writes an
    entry to before it renames it (an export may run while a stage finishes)."""
    return path.is_file() and len(path.name) == 64 and all(c in "0123456789abcdef" for c in path.name)


def entries(cache: Path) -> list[Entry]:
    return [read_entry(cache, path.relative_to(cache).as_posix()) for path in sorted((cache / "runs").glob("*/*/*"))
            if _is_entry(path)]


def _related(a: str, b: str) -> bool:
    """One path is the other or holds it (a folder dependency and a file output inside it)."""
    a, b = a.rstrip("/"), b.rstrip("/")
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def select(found: list[Entry], trained: list[str], max_entry_bytes: int, imported: set[str],
           rebuilt: list[str] = ()) -> tuple[list[Entry], dict[str, str]]:
    """The entries worth carrying, and why each other one is left out."""
    left_out: dict[str, str] = {}
    bound = list(trained)  # paths whose contents exist only on this machine
    changed = True
    while changed:  # through the outputs of every stage that reads a bound path
        changed = False
        for entry in found:
            if entry.name not in left_out and any(_related(p, b) for p in entry.deps + entry.outs for b in bound):
                left_out[entry.name] = "needs or makes what was trained here"
                bound += entry.outs
                changed = True
    for entry in found:
        if entry.name in left_out:
            continue
        if entry.name in imported:
            left_out[entry.name] = "imported"
        elif any(_related(o, r) for o in entry.outs for r in rebuilt):
            left_out[entry.name] = "rebuilt there in seconds"
        elif entry.missing:
            left_out[entry.name] = "an output not in the cache"
        elif entry.size > max_entry_bytes:
            left_out[entry.name] = f"outputs of {entry.size / 2**20:.1f} MiB"
    return [e for e in found if e.name not in left_out], left_out


def imported_entries(cache: Path) -> set[str]:
    path = cache / IMPORTED
    return set(path.read_text().split()) if path.exists() else set()


def export(cache: Path, out: Path, trained: list[str], max_entry_mb: float, rebuilt: list[str] = (),
           max_mb: float = 15.0) -> tuple[list[Entry], list[Entry]]:
    """Write `out` (tar.gz, atomically): the selected entries and their objects, paths relative
    to the cache, the largest entries left out until the archive is at most `max_mb` MiB (the
    largest file the transfer takes). Returns the entries written and those left
    out for the archive's size."""
    if not (cache / "runs").is_dir():
        raise InputError(f"{cache}: no DVC run cache here (no runs/ folder); give the cache with --cache")
    kept, _ = select(entries(cache), trained, int(max_entry_mb * 2**20), imported_entries(cache), rebuilt)
    dropped: list[Entry] = []
    while True:
        names = sorted({name for e in kept for name in [e.name, *e.objects]})
        with atomic_path(out) as tmp, tarfile.open(tmp, "w:gz") as archive:
            for name in names:
                archive.add(cache / name, arcname=name)
        if out.stat().st_size <= max_mb * 2**20 or not kept:
            return kept, dropped
        largest = max(kept, key=lambda e: (e.size, e.name))
        kept.remove(largest)
        dropped.append(largest)


def import_(cache: Path, archive_path: Path) -> list[str]:
    """Add the entries and objects of an exported archive to `cache`, never replacing a file;
    returns the entries added (listed for `export` to leave out)."""
    if not archive_path.is_file():
        raise InputError(f"{archive_path}: no such file (an archive `python offline/runcache.py export` wrote)")
    added = []
    with tarfile.open(archive_path, "r:gz") as archive:
        for member in archive.getmembers():
            if not member.isfile() or not member.name.startswith(("runs/", "files/md5/")) or ".." in Path(member.name).parts:
                raise InputError(f"{archive_path}: {member.name!r} is not a run-cache entry or cached file")
            target = cache / member.name
            if target.exists():
                continue
            with atomic_path(target) as tmp:  # (its folder made)
                tmp.write_bytes(archive.extractfile(member).read())
            os.chmod(target, 0o444)  # as DVC keeps its cached files
            if member.name.startswith("runs/"):
                added.append(member.name)
    with atomic_path(cache / IMPORTED) as tmp:
        tmp.write_text("".join(f"{name}\n" for name in sorted(imported_entries(cache) | set(added))))
    return added


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path(".dvc/cache"), help="DVC's cache (default: .dvc/cache)")
    verbs = parser.add_subparsers(dest="verb", required=True)
    out = verbs.add_parser("export", help="write the entries another machine can reuse")
    out.add_argument("out", type=Path)
    out.add_argument("--trained", nargs="+", required=True, metavar="PATH",
                     help="outputs trained on this machine (e.g. models/nll models/finetuned)")
    out.add_argument("--max-entry-mb", type=float, default=32.0, help="leave out an entry whose outputs are larger")
    out.add_argument("--max-mb", type=float, default=15.0,
                     help="the archive's size at most: the largest entries are left out until it fits")
    out.add_argument("--rebuilt", nargs="*", default=[], metavar="PATH",
                     help="outputs the next machine rebuilds in seconds (e.g. data): not carried")
    into = verbs.add_parser("import", help="add exported entries to this machine's cache")
    into.add_argument("archives", type=Path, nargs="+")
    args = parser.parse_args(argv)
    for option in ("max_entry_mb", "max_mb"):
        if args.verb == "export" and not getattr(args, option) > 0:
            parser.error(f"--{option.replace('_', '-')} must be a positive number of MiB, not {getattr(args, option)}")
    try:
        if args.verb == "export":
            kept, dropped = export(args.cache, args.out, args.trained, args.max_entry_mb, args.rebuilt, args.max_mb)
            print(f"run cache: {len(kept)} entries to {args.out} ({args.out.stat().st_size / 2**20:.1f} MiB): "
                  + (", ".join(sorted({o for e in kept for o in e.outs})) or "none")
                  + (f"; left out for the archive's size: {', '.join(sorted({o for e in dropped for o in e.outs}))}" if dropped else ""))
        else:
            for archive in args.archives:
                print(f"run cache: {len(import_(args.cache, archive))} entries added from {archive}")
    except InputError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
