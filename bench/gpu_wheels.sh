#!/usr/bin/env bash
# Downloads, here, the wheels bench/gpu_check.sh needs on the GPU machine, whose image has no network:
# the packages of bench/gpu_wheels.txt, for that machine's Python (3.12, x86-64 manylinux), into a
# git-ignored folder that travels with the check (name it in the device call's `carry`).
#
#   bash bench/gpu_wheels.sh                               # -> .gpu_wheels/, for Python 3.12
#   bash bench/gpu_wheels.sh --python-version 3.11 DIR     # the same set for this machine's Python
#
# gpu_check.sh installs them there with `pip install --no-index --no-deps --target` and PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_VERSION=3.12
if [[ ${1:-} == --python-version ]]; then
  PYTHON_VERSION=${2:?--python-version needs a value, for example 3.12}
  shift 2
fi
DIR=${1:-.gpu_wheels}
PY=${PY:-python3}
mkdir -p "$DIR"
rm -f "$DIR"/*.whl  # one version of each: two of one package stop the install there
mapfile -t requirements < <(grep -v '^\s*\(#\|$\)' bench/gpu_wheels.txt)
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$PYTHON_VERSION" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DIR" "${requirements[@]}"
count=$(find "$DIR" -name '*.whl' | wc -l)
if [[ $count -ne ${#requirements[@]} ]]; then
  echo "error: $DIR holds $count wheels for ${#requirements[@]} requirements of bench/gpu_wheels.txt" >&2
  exit 1
fi
echo "$count wheels for Python $PYTHON_VERSION in $DIR ($(du -sh "$DIR" | cut -f1))"
