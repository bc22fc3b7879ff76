"""The installation: the Python it needs."""
from __future__ import annotations

import re
import subprocess
import sys

from helpers import ROOT, installed_dependencies


def test_every_installed_dependency_installs_on_the_oldest_python_the_project_declares(tmp_path):
    """pyproject.toml's requires-python is one on which every pin (and what they need) installs,
    the README says it, and the Makefile refuses an older Python at once, before installing
    anything (pip would refuse `transformers==5.23.0` minutes later, with its whole version list)."""
    import tomllib

    from packaging.specifiers import SpecifierSet

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    oldest = re.fullmatch(r">=(\d+\.\d+)", declared).group(1)
    refused = sorted(f"{name} {distribution.version}: Requires-Python {distribution.metadata['Requires-Python']}"
                     for name, distribution in installed_dependencies(("test",)).items()
                     if not SpecifierSet(distribution.metadata["Requires-Python"] or "").contains(oldest))
    assert not refused, f"pyproject.toml declares {declared}, but these need a newer Python: {refused}"
    assert f"Python ≥ {oldest}" in (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^MIN_PYTHON := (.*)$", makefile, re.M).group(1) == oldest

    venv = tmp_path / "venv"
    result = subprocess.run(["make", "-C", str(ROOT), "setup", f"VENV={venv}", "MIN_PYTHON=99.0", f"PYTHON={sys.executable}"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and not venv.exists()
    major, minor = sys.version_info[:2]
    assert f"Python >= 99.0 needed (pyproject.toml, requires-python); PYTHON={sys.executable} is {major}.{minor}" in result.stderr
    dry_run = subprocess.run(["make", "-C", str(ROOT), "-n", "setup", f"VENV={venv}", f"PYTHON={sys.executable}"],
                             capture_output=True, text=True, timeout=60).stdout.splitlines()
    guard = dry_run.index(f"{sys.executable} -m venv {venv}") - 1  # the check comes first, then the venv
    assert "needed (pyproject.toml, requires-python)" in dry_run[guard]
    assert subprocess.run(["bash", "-c", dry_run[guard]], timeout=60).returncode == 0  # this Python passes it

