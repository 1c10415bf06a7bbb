# The two quick-start commands (README): `make run` and `make test`.
# Both create .venv with the interpreter below and install opsbot from this checkout.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned per extra: `cpu` takes the CPU build, `vllm` the CUDA build vLLM was made for.
# A visible NVIDIA GPU selects vllm; everything else (laptops, CI) gets the CPU engine.
ENGINE_EXTRA ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo vllm || echo cpu)

.PHONY: run test lint install install-dev clean

$(BIN)/python:
	$(PYTHON) -c 'import sys; sys.exit("opsbot needs Python >= 3.11, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --progress-bar on pip

$(VENV)/.installed-$(ENGINE_EXTRA): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --progress-bar on -e '.[$(ENGINE_EXTRA)]'
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --progress-bar on -e '.[cpu,dev]'
	touch $@

install: $(VENV)/.installed-$(ENGINE_EXTRA)

install-dev: $(VENV)/.installed-dev

## Start opsbot in the terminal on embedded defaults (SQLite, CPU engine, tiny offline model).
run: install
	$(BIN)/opsbot chat

## Lint, type-check and run the whole test suite (GPU tests skip without CUDA).
test: install-dev
	$(BIN)/python -m pytest

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy bot inference

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
