#!/usr/bin/env bash
# Proves, on a machine without a GPU, that bench/gpu_check.sh meets no missing module, flag or path on
# the GPU machine's bare image: a venv holding only what that image holds that matters here (torch's
# CPU build in place of its CUDA one, numpy, typer, rich, pyyaml, tokenizers, tiktoken, psutil, pyarrow,
# safetensors; no pydantic, MLflow, Prefect or datasets) plus the carried wheels, built for this
# Python, runs the check's --cpu-dry-run. About 8 minutes on 2 cores (it compiles two models); the venv
# is kept for the next time.
#
#   bash bench/gpu_dry_run.sh        # or: make gpu-dry-run
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GPU_DRY_VENV:-.gpu_dry_venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
if [[ ! -f $VENV/.ready ]]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "$TORCH_SPEC"
  "$VENV/bin/pip" install -q --disable-pip-version-check numpy typer rich pyyaml tokenizers tiktoken \
    psutil pyarrow safetensors
  # typer brings pydantic along; the image's typer does not: take it out again, as the image has it.
  "$VENV/bin/pip" uninstall -q -y pydantic pydantic-core annotated-types typing-inspection
  touch "$VENV/.ready"
fi
for missing in pydantic mlflow prefect datasets; do
  if "$VENV/bin/python" -c "import $missing" 2>/dev/null; then
    echo "error: $VENV holds $missing, which the GPU image lacks: remove $VENV and run again" >&2
    exit 1
  fi
done
version=$("$VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
PY=python3 bash bench/gpu_wheels.sh --python-version "$version" "$VENV/wheels"
PY="$VENV/bin/python" WHEELS="$VENV/wheels" OUT=${OUT:-gpu_check_out} bash bench/gpu_check.sh --cpu-dry-run
