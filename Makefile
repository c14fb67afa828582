# Two commands for a fresh machine:  `make run` (serve the built-in model)  and  `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# One torch version everywhere. On a host without an NVIDIA GPU: the CPU wheel (on machines of this project's kind it
# lies on disk; elsewhere it comes from PyPI). With one: the CUDA build of the same version that the driver can run,
# chosen by scripts/torch_select.py from `nvidia-smi`'s CUDA version among TORCH_CUDA_VARIANTS, installed from
# PyTorch's index, and then verified to see the GPU. TORCH_VARIANT=cpu|cuXYZ overrides the choice.
TORCH_VERSION       ?= 2.13.0
TORCH_CUDA_VARIANTS ?= cu126,cu128,cu130
TORCH_INDEX         ?= https://download.pytorch.org/whl
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)
GLASSBOX_ARGS ?=

.PHONY: run test lint typecheck imports unit model system-deps clean help

help:
	@echo "make run   - set up .venv, build the default model if missing, serve it"
	@echo "make test  - set up .venv with dev tools, lint, type-check, import contracts, tests"

$(VENV)/.torch:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@variant=$$($(PYTHON) scripts/torch_select.py choose --variants "$(TORCH_CUDA_VARIANTS)") || exit 1; \
	if [ "$$variant" = cpu ]; then \
	  $(PIP) install -q "torch==$(TORCH_VERSION)" || exit 1; \
	else \
	  $(PIP) install -q "torch==$(TORCH_VERSION)" --index-url "$(TORCH_INDEX)/$$variant" || exit 1; \
	fi; \
	$(PY) scripts/torch_select.py verify --variant "$$variant" --version "$(TORCH_VERSION)" || exit 1; \
	echo "$$variant" > $(VENV)/.torch-variant
	touch $@

$(VENV)/.installed: $(VENV)/.torch pyproject.toml
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.torch pyproject.toml
	$(PIP) install -q -e '.[dev]'
	touch $@ $(VENV)/.installed

model: $(VENV)/.installed
	$(VENV)/bin/glassbox model build --if-missing

run: $(VENV)/.installed model
	$(VENV)/bin/glassbox serve $(GLASSBOX_ARGS)

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check service telemetry chaos tests benchmarks scripts examples

# mypy cannot follow the venv's editable mapping of glassbox.* onto the folders; .pythonpath/glassbox/ links them.
typecheck: $(VENV)/.installed-dev
	MYPYPATH=.pythonpath $(VENV)/bin/mypy -p glassbox.service -p glassbox.telemetry -p glassbox.chaos

imports: $(VENV)/.installed-dev
	$(VENV)/bin/lint-imports

# Debian tools the tests drive for real: prometheus + promtool, prometheus-alertmanager + amtool, docker-compose
# (config validation only), wrk, hey,
# and node + npm for the Grafana dashboard schema check (the machine image usually has them already).
# Installed when missing and apt is usable; under `make test` a test whose tool is missing fails instead of skipping.
SYSTEM_PACKAGES := prometheus prometheus-alertmanager docker-compose wrk hey
system-deps:
	@missing=""; packages="$(SYSTEM_PACKAGES)"; for tool in prometheus promtool prometheus-alertmanager amtool docker-compose wrk hey; do \
	  command -v $$tool >/dev/null 2>&1 || missing="$$missing $$tool"; done; \
	command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || { missing="$$missing node"; packages="$$packages nodejs npm"; }; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian packages for:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$packages >/dev/null; \
	  else echo "warning: missing$$missing (need root and apt-get); the tests that drive them will fail"; fi; \
	fi

# With a CUDA build of torch installed (a GPU host), GLASSBOX_REQUIRE_GPU=1 turns a skipped gpu test, or a server
# that would choose the CPU, into a failure (tests/gpu_gate.py): a GPU host never passes by quietly testing the CPU.
unit: $(VENV)/.installed-dev model system-deps
	@variant=$$(cat $(VENV)/.torch-variant 2>/dev/null || echo $(if $(HAS_CUDA),unknown-cuda,cpu)); \
	require_gpu=$$([ "$$variant" = cpu ] && echo 0 || echo 1); \
	echo "GLASSBOX_REQUIRE_GPU=$$require_gpu (torch variant: $$variant)"; \
	GLASSBOX_REQUIRE_GPU=$$require_gpu GLASSBOX_REQUIRE_DEFAULT_MODEL=1 GLASSBOX_REQUIRE_TOOLS=1 $(VENV)/bin/pytest -q

test: lint typecheck imports unit

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
