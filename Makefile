# The two quick-start commands (README): `make run` and `make test`.
# Both create .venv with the interpreter below and install opsbot from this checkout.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned per extra: `cpu` takes the CPU build, `vllm` the CUDA build vLLM was made for.
# A visible NVIDIA GPU selects vllm; everything else (laptops, CI) gets the CPU engine.
ENGINE_EXTRA ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo vllm || echo cpu)
# llama-cpp-python is published as source only: installing it compiles llama.cpp (minutes on 2
# cores, see bench/README.md). `make` builds the wheel once into WHEEL_CACHE, keyed by version (it is
# tagged py3-none-linux: ctypes bindings, any Python 3), and every later install (a new .venv, `make clean`, CI on the same machine) takes it from
# there. Keep the version equal to pyproject's `llamacpp` extra. The build targets this machine's CPU
# (llama.cpp's GGML_NATIVE), which is why the cache is per machine, not committed.
LLAMA_CPP_VERSION := 0.3.36
WHEEL_CACHE ?= $(HOME)/.cache/opsbot/wheels
LLAMA_WHEEL := $(WHEEL_CACHE)/.llama-cpp-python-$(LLAMA_CPP_VERSION).built

.PHONY: run chat test lint install install-dev clean llama-wheel

$(BIN)/python:
	$(PYTHON) -c 'import sys; sys.exit("opsbot needs Python >= 3.11, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --progress-bar on pip

$(LLAMA_WHEEL): | $(BIN)/python
	@mkdir -p $(WHEEL_CACHE)
	@if ls $(WHEEL_CACHE)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1; then \
	  echo "llama-cpp-python $(LLAMA_CPP_VERSION): reusing the wheel in $(WHEEL_CACHE)"; \
	else \
	  echo "llama-cpp-python $(LLAMA_CPP_VERSION): compiling llama.cpp into a wheel in $(WHEEL_CACHE) (first time only; 3-10 min on 2 cores)"; \
	  start=$$(date +%s); \
	  $(BIN)/python -m pip wheel --no-deps --progress-bar on -w $(WHEEL_CACHE) 'llama-cpp-python==$(LLAMA_CPP_VERSION)' || exit 1; \
	  echo "llama-cpp-python $(LLAMA_CPP_VERSION): wheel built in $$(( $$(date +%s) - start )) s"; \
	fi
	touch $@

## Build (or find) the llama-cpp-python wheel in WHEEL_CACHE.
llama-wheel: $(LLAMA_WHEEL)

$(VENV)/.installed-$(ENGINE_EXTRA): pyproject.toml | $(BIN)/python
	@# `make run` on a CPU machine answers through llama.cpp when its wheel builds; without a compiler
	@# it still runs, on the transformers CPU engine. A GPU machine (vllm) skips llama.cpp.
	@if [ "$(ENGINE_EXTRA)" = cpu ]; then $(MAKE) --no-print-directory llama-wheel || \
	  echo "llama-cpp-python did not build: installing without the llamacpp extra"; fi
	$(BIN)/python -m pip install --progress-bar on --find-links $(WHEEL_CACHE) \
	  -e ".[$(ENGINE_EXTRA)$$(test "$(ENGINE_EXTRA)" = cpu && test -f $(LLAMA_WHEEL) && echo ,llamacpp)]"
	touch $@

# Tests need llama.cpp (engine contract tests on SmolLM2): here a failed build is an error.
$(VENV)/.installed-dev: pyproject.toml $(LLAMA_WHEEL) | $(BIN)/python
	$(BIN)/python -m pip install --progress-bar on --find-links $(WHEEL_CACHE) -e '.[cpu,dev,llamacpp]'
	touch $@

install: $(VENV)/.installed-$(ENGINE_EXTRA)

install-dev: $(VENV)/.installed-dev

## Start opsbot in the terminal on embedded defaults (SQLite, llama.cpp or CPU engine, SmolLM2-135M),
## on a built-in demo incident (in-process Kubernetes and Prometheus APIs: no cluster needed).
run: install
	@echo "opsbot: a built-in demo incident (opsbot chat --demo [CASE]; CASE: any id in bot/eval/cases)."
	@echo "        Your own cluster: enable [kubernetes] / [prometheus] in opsbot.toml, then make chat."
	$(BIN)/opsbot chat --demo

## The same terminal chat on your own configuration (opsbot.toml, OPSBOT_* variables).
chat: install
	$(BIN)/opsbot chat

## Lint, type-check and run the whole test suite (GPU tests skip without CUDA).
test: install-dev
	$(BIN)/python -m pytest

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy bot inference

# The wheel cache outlives `make clean` on purpose (a rebuild costs minutes): rm -rf $(WHEEL_CACHE).
clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
