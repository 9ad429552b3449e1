# Two commands do everything from a fresh clone: `make run` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# The CPU build of torch, taken first where no CUDA driver is present; override for other setups.
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
# The oldest transformers the `hf` extra admits (pyproject.toml), with the tokenizers and huggingface-hub
# it requires, installed beside the venv: tests/test_transformers_floor.py reads the exports with it too.
TRANSFORMERS_FLOOR ?= transformers==4.51.3 tokenizers==0.21.4 huggingface-hub==0.36.2

.PHONY: setup run test lint clean gpu-dry-run

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || python3 -m venv $(VENV)
	@if ! command -v nvidia-smi >/dev/null 2>&1 && ! $(PY) -c 'import torch' 2>/dev/null; then \
		echo "installing the CPU build of torch ($(TORCH_SPEC))"; \
		$(PIP) install -q $(TORCH_PIP_ARGS) '$(TORCH_SPEC)'; \
	fi
	$(PIP) install -q -e '.[dev,hf,quant,team]'
	$(PIP) install -q --upgrade --no-deps --target $(VENV)/transformers-floor $(TRANSFORMERS_FLOOR)
	@touch $(STAMP)

run: setup
	$(VENV)/bin/gptpipe run

# Worker processes (pytest-xdist), each taking whole modules: the tests wait on servers and subprocesses
# much of the time, so one more worker than this machine's 2 cores keeps both busy.
TEST_WORKERS ?= 3
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The GPU check's imports, flags and paths on a venv shaped like the GPU machine's bare image (no GPU).
gpu-dry-run:
	bash bench/gpu_dry_run.sh

clean:
	rm -rf data checkpoints .prefect mlruns/mlflow.db mlruns/mlflow.db.lock mlruns/artifacts
