# Two commands do everything from a fresh clone: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
UV := $(VENV)/bin/uv
# The venv is made without pip where uv can be had (pip's own install, ensurepip, took 6-8 s of a fresh
# clone's `make run`); pip is put in it only where something falls back to it.
ENSURE_PIP := $(PIP) --version >/dev/null 2>&1 || $(PY) -m ensurepip >/dev/null
BASE_STAMP := $(VENV)/.base
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed
# The CPU build of torch, taken first where no CUDA driver is present; override for other setups.
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
# What `make run` installs: the pipeline's own needs (torchao: the quantize stage's int8 rows). Half the
# packages' install time of everything (21 s against 43 with an empty uv cache): a newcomer's first
# command waits on no test runner, benchmark harness or database driver.
RUN_EXTRAS ?= quant
# What `make setup` and `make test` install: everything (the tests, `gptpipe benchmark`'s lm-eval, the
# Hugging Face readers the tests check exports with, `gptpipe servers`' PostgreSQL driver).
EXTRAS ?= dev,hf,quant,team
# The oldest transformers the `hf` extra admits (pyproject.toml), with the tokenizers and huggingface-hub
# it requires, installed beside the venv for `make test` alone: tests/test_transformers_floor.py reads the
# exports with it too.
TRANSFORMERS_FLOOR ?= transformers==4.51.3 tokenizers==0.21.4 huggingface-hub==0.36.2
FLOOR := $(VENV)/transformers-floor
FLOOR_STAMP := $(FLOOR)/.installed

.PHONY: setup run test lint clean gpu-dry-run

setup: $(STAMP)

# uv installs the same wheels several times faster than pip (it downloads and unpacks in parallel, and
# leaves the bytecode to be written as it is first imported); this Python's pip puts it in the venv
# (`pip --python`), else the venv's own pip does; where uv cannot be had, pip does it all.
# torch's CPU wheel, where pip's find-links (PIP_FIND_LINKS or its configuration) hold it on this
# machine's disk, is installed from there by uv alone (--no-index: never the index's multi-GB CUDA
# build; 4 s here against pip's 25); its dependencies come with the project's. Else, or where that wheel
# does not fit this Python (uv refuses it), pip installs it.
TORCH_VERSION := $(patsubst torch==%,%,$(TORCH_SPEC))
$(BASE_STAMP): Makefile
	@test -x $(PY) || python3 -m venv --without-pip $(VENV)
	@test -x $(UV) || python3 -m pip --python $(PY) install -q uv 2>/dev/null \
		|| { $(ENSURE_PIP) && $(PIP) install -q uv; } || echo "uv could not be installed: installing with pip (slower)"
	@if ! command -v nvidia-smi >/dev/null 2>&1 && ! $(PY) -c 'import torch' 2>/dev/null; then \
		echo "installing the CPU build of torch ($(TORCH_SPEC))"; \
		links=$$(for dir in $${PIP_FIND_LINKS:-$$(python3 -m pip config get global.find-links 2>/dev/null)}; do \
			ls "$$dir"/torch-$(TORCH_VERSION)+cpu-*.whl >/dev/null 2>&1 && echo "--find-links $$dir"; done); \
		test -x $(UV) && test -n "$$links" && test -z "$(TORCH_PIP_ARGS)" \
			&& $(UV) pip install -q --python $(PY) --no-index --no-deps $$links '$(TORCH_SPEC)' \
			|| { $(ENSURE_PIP) && $(PIP) install -q $(TORCH_PIP_ARGS) '$(TORCH_SPEC)'; }; \
	fi
	@touch $@

# The project with `extras` ($(1)), by uv where it is in the venv, else by pip.
define install_project
	@if test -x $(UV); then $(UV) pip install -q --python $(PY) -e '.[$(1)]'; \
		else { $(ENSURE_PIP); } && $(PIP) install -q -e '.[$(1)]'; fi
endef

$(RUN_STAMP): pyproject.toml $(BASE_STAMP)
	$(call install_project,$(RUN_EXTRAS))
	@touch $@

$(STAMP): pyproject.toml $(BASE_STAMP)
	$(call install_project,$(EXTRAS))
	@touch $@ $(RUN_STAMP)

$(FLOOR_STAMP): $(STAMP)
	@if test -x $(UV); then $(UV) pip install -q --no-deps --target $(FLOOR) $(TRANSFORMERS_FLOOR); \
		else { $(ENSURE_PIP); } && $(PIP) install -q --upgrade --no-deps --target $(FLOOR) $(TRANSFORMERS_FLOOR); fi
	@touch $(FLOOR_STAMP)

# Python writes each module's bytecode the first time a process imports it, even where
# PYTHONDONTWRITEBYTECODE is set (as in many CI images): otherwise every process of the suite (about 200,
# each importing torch, Prefect and MLflow) and every `make run` would compile its imports from source
# again (measured: half of a `gptpipe` process's start). Written as it is first needed, not ahead for the
# whole venv (`compileall` of it took 40 s of a fresh clone's `make test`, most of it for modules nothing
# imports); writes are atomic, so processes that import a module at once are safe.
WITH_BYTECODE := env -u PYTHONDONTWRITEBYTECODE

run: $(RUN_STAMP)
	$(WITH_BYTECODE) $(VENV)/bin/gptpipe run

# Worker processes (pytest-xdist), each taking whole modules: the tests wait on servers and subprocesses
# much of the time, so one more worker than this machine's 2 cores keeps both busy.
TEST_WORKERS ?= 3
test: $(STAMP) $(FLOOR_STAMP)
	$(WITH_BYTECODE) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The GPU check's imports, flags and paths on a venv shaped like the GPU machine's bare image (no GPU).
gpu-dry-run:
	bash bench/gpu_dry_run.sh

clean:
	rm -rf data checkpoints .prefect mlruns/mlflow.db mlruns/mlflow.db.lock mlruns/artifacts
