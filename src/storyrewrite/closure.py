"""The package code a script or module runs: its import closure inside `storyrewrite`.

Two things must cover exactly that code: each stage's `deps` in dvc.yaml (so that `dvc repro`
reruns a stage whenever code it runs has changed, and only then), and the training checkpoint's
fingerprint (so that an interrupted run is resumed only by the same code). Both are computed
from the source with `ast`, following every `storyrewrite.*` import, module-level or not (an
import inside a function runs too), without importing anything.

    python -m storyrewrite.closure stages/score.py   # the files, as dvc.yaml lists them
    python -m storyrewrite.closure --update dvc.yaml # write them into every stage's deps
"""
from __future__ import annotations

import ast
import hashlib
import re
from pathlib import Path

from storyrewrite.io import InputError, write_text_atomic

PACKAGE = "storyrewrite"
PACKAGE_DIR = Path(__file__).resolve().parent


def module_file(name: str) -> Path | None:
    """The source file of module `name` (`storyrewrite.a.b`), or None if it is not one."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    base = PACKAGE_DIR.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: Path) -> str | None:
    try:
        relative = path.resolve().relative_to(PACKAGE_DIR.parent)
    except ValueError:
        return None  # a script outside the package (stages/*.py)
    parts = list(relative.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Names of the modules an import statement in `path` may load (a `from m import x` loads
    `m`, and `m.x` when x is a submodule), relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    own = _module_name(path)
    package = own if own is not None and path.name == "__init__.py" else (own.rpartition(".")[0] if own else "")
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base = ".".join(base_parts[: len(base_parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def closure(entry: str | Path) -> set[Path]:
    """Every package file that running `entry` (a script or a package module file) executes
    through imports, with the `__init__.py` of each package on the way; `entry` itself included
    when it is a package file."""
    entry = Path(entry).resolve()
    seen: set[Path] = set()
    todo = [entry]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path):
            parts = name.split(".")
            # Importing a.b.c runs a/__init__.py and a/b/__init__.py first.
            for depth in range(1, len(parts) + 1):
                found = module_file(".".join(parts[:depth]))
                if found is not None and found not in seen:
                    todo.append(found)
    return {path for path in seen if path.is_relative_to(PACKAGE_DIR)}


def digest(files: set[Path]) -> str:
    """sha256 over the files' package-relative names and contents."""
    sha = hashlib.sha256()
    for path in sorted(files):
        sha.update(path.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()


def update_dvc_yaml(path: Path) -> list[str]:
    """Rewrite (atomically, keeping every comment) each stage's `src/` deps of dvc.yaml as the
    import closure of the stage's script (listed right after the script, in path order);
    returns the names of the stages whose lists changed."""
    root = PACKAGE_DIR.parents[1]
    lines = path.read_text(encoding="utf-8").split("\n")
    out, changed, i = [], [], 0
    stage = None
    while i < len(lines):
        line = lines[i]
        if re.fullmatch(r"  [A-Za-z_][\w-]*:.*", line):
            stage = line.strip().split(":")[0]
        script = re.fullmatch(r"(\s+)- (stages/\w+\.py)", line)
        out.append(line)
        i += 1
        if script is None:
            continue
        indent, script_file, number = script.group(1), script.group(2), i  # i: the script's line (1-based)
        old = []
        while i < len(lines) and re.fullmatch(rf"{indent}- src/\S+", lines[i]):
            old.append(lines[i])
            i += 1
        if not (root / script_file).is_file():
            raise InputError(f"{path}:{number}: {script_file}: no such file")
        new = [f"{indent}- {p.relative_to(root).as_posix()}" for p in sorted(closure(root / script_file))]
        if new != old:
            changed.append(stage)
        out.extend(new)
    write_text_atomic(path, "\n".join(out))
    return changed


def main(argv: list[str] | None = None) -> None:
    """`python -m storyrewrite.closure SCRIPT ...` prints each script's closure;
    `python -m storyrewrite.closure --update dvc.yaml` writes every stage's code deps."""
    import argparse

    from storyrewrite.io import run_cli

    parser = argparse.ArgumentParser(prog="python -m storyrewrite.closure", description=main.__doc__)
    parser.add_argument("scripts", type=Path, nargs="*", metavar="SCRIPT", help="a stage's script or a package module")
    parser.add_argument("--update", type=Path, nargs="?", const=Path("dvc.yaml"), metavar="DVC_YAML",
                        help="rewrite the code deps of every stage there (default: dvc.yaml)")
    args = parser.parse_args(argv)
    if args.update is None and not args.scripts:
        parser.error("name a script, or --update dvc.yaml")
    root = PACKAGE_DIR.parents[1]

    def run() -> None:
        for path in [*args.scripts, *([args.update] if args.update else [])]:
            if not path.is_file():
                raise InputError(f"{path}: no such file")
        if args.update:
            for name in update_dvc_yaml(args.update):
                print(f"{name}: code deps updated")
        for entry in args.scripts:
            print(f"{entry}:")
            for path in sorted(closure(entry)):
                print(f"  - {path.relative_to(root).as_posix()}")

    run_cli(run)


if __name__ == "__main__":
    main()
