#!/usr/bin/env bash
# The GPU check, for a lent H200 (or any CUDA GPU) running its bare image: one call of at most 8 minutes,
# each part under its own timeout (their sum is 465 s). Parts: the device report; gpt_100m bf16 at the
# profile's GPU batch compiled (runtime.compile auto: on for CUDA) and eager (tokens/s, MFU against the
# H200's 989 TFLOP/s dense bf16 peak, compile seconds, recompilations, the attention kernel, peak memory
# against the estimate, checkpoint save seconds); a longer compiled gpt_100m run with evaluations and
# checkpoints, whose time the first part's figures estimate as the smoke stage does; gpt_100m fp16 with
# the grad scaler and fp32 with TF32 (eager, against the eager bf16 part); gpt_42m bf16 compiled;
# gpt_100m bf16 with `--batch-size auto` (the probe: doubling, bisection, 10% margin) and with activation
# checkpointing (its training peak against the eager bf16 part's); iteration 1's bounded CPU-versus-CUDA
# comparison (`gptpipe compare --no-track`, same controls); a deliberately too-large batch showing the
# out-of-memory response (exit 1, one line, no traceback). Every training is the real `gptpipe train` on
# a synthetic stream. The summary ends with the targets (gpt_100m bf16 compiled: MFU >= 0.45, >= 1.3x
# eager; the estimate within 15%), judged on an H100/H200-class GPU; a bf16 part there that runs math
# attention fails.
#
# The image has no pydantic and no network: first, here, `bash bench/gpu_wheels.sh` (-> .gpu_wheels/),
# then on the GPU machine, with `.gpu_wheels` carried:
#   bash bench/gpu_check.sh                  # python3; figures under $OUT (or ./gpu_check_out)
#   bash bench/gpu_check.sh --cpu-dry-run    # every part on the CPU, tiny bounds: imports, flags, paths
# Environment: PY (default python3), WHEELS (default .gpu_wheels), OUT.
# Files written under $OUT (3): summary.md (one line a part, then the targets), results.json (the
# figures), log.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
if [[ ${1:-} == --cpu-dry-run ]]; then
  DRY=1
elif [[ -n ${1:-} ]]; then
  echo "error: bench/gpu_check.sh: unknown argument ${1}: expected --cpu-dry-run or nothing" >&2
  exit 2
fi
PY=${PY:-python3}
WHEELS=${WHEELS:-.gpu_wheels}
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
rm -f "$OUT/results.json" "$OUT/summary.md" "$OUT/log.txt"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
status=0

# The carried wheels, installed outside the image's environment; the project from this checkout.
export PYTHONPATH=$PWD
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$WORK/site" "$WHEELS"/*.whl >"$WORK/pip.log" 2>&1 \
    || { cat "$WORK/pip.log"; echo "error: installing the wheels of $WHEELS failed" >&2; exit 1; }
  export PYTHONPATH=$WORK/site:$PWD
fi
export PYTHONUNBUFFERED=1

if [[ $DRY -eq 1 ]]; then
  DEVICE=cpu
  SCALE=4  # the CPU is slower than the GPU these limits are set for
  # Tiny bounds that still build each profile's full model and run a step, an evaluation and a save.
  BOUNDS=(--batch-size 1 --grad-accum 1 --max-steps 1 --training-examples 2 --validation-examples 1)
  COMPARE=(--axis precision --values fp32,bf16 --max-steps 2 --training-examples 8 --validation-examples 2)
  COMPILED=(--compile)  # auto is off on the CPU: the compiled parts ask for it
  FP16_ITERATION=1  # this CPU has no fast fp16 matrix multiply: the scaler's path on iteration 1's model
else
  DEVICE=cuda
  SCALE=1
  BOUNDS=()
  COMPARE=(--axis device)  # CPU against CUDA, iteration 1's bounded comparison (10 steps)
  COMPILED=()  # runtime.compile auto: what a CUDA run gets by default
  FP16_ITERATION=3
fi
echo "== gpu_check: device $DEVICE, python $("$PY" -c 'import sys; print(sys.version.split()[0])'), out $OUT"

part() {  # part KIND NAME LIMIT_SECONDS ARGS...: one `gptpipe` command, its figures recorded
  local kind=$1 name=$2 limit=$(($3 * SCALE))
  shift 3
  echo "== $name: gptpipe $*"
  timeout --kill-after=10 "$limit" "$PY" -m flows.cli.main "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
  local rc=$?
  [[ $rc -eq 124 || $rc -eq 137 ]] && echo "  $name: stopped at its ${limit} s limit"
  { echo "===== $name (exit $rc): gptpipe $*"; cat "$WORK/$name.out"; echo "----- stderr"; cat "$WORK/$name.err"; } \
    >>"$OUT/log.txt"
  "$PY" bench/gpu_check_report.py "$OUT" "$kind" "$name" "$WORK/$name.out" "$WORK/$name.err" "$rc" \
    "error: out of memory on $DEVICE at batch size 2048" || status=1
}

train() {  # train NAME LIMIT ARGS...: a bounded `gptpipe train` on a synthetic stream
  local name=$1 limit=$2
  shift 2
  part train "$name" "$limit" train --device "$DEVICE" --synthetic --no-track --log-every 10 \
    --eval-every 100000 --checkpoint-every 100000 --checkpoint-directory "$WORK/checkpoints/$name" \
    "$@" "${BOUNDS[@]}"
}

"$PY" -c 'import flows.cli.main, flows.cli.train, flows.cli.tracking, gptcore.train.trainer, gptcore.eval.comparison' \
  || { echo "error: the check's imports fail with $PY (PYTHONPATH=$PYTHONPATH)" >&2; exit 1; }

part device device 15 device --device "$DEVICE" --json
# The 16-bit precision of the bf16 parts. A CPU without AVX512-BF16 or AMX emulates bf16 and trains it
# tens of times slower than fp32 (the device part's probe says how much): there the dry run takes fp32,
# whose flags and paths are the same; the suite trains bf16 on tiny models.
P16=bf16
if [[ $DRY -eq 1 ]] && ! "$PY" -c 'import json, sys; sys.exit(json.load(open(sys.argv[1])).get("bf16_train_speedup", 0) < 1)' \
  "$WORK/device.out" 2>/dev/null; then
  P16=fp32
  echo "  bf16 trains slower than fp32 on this CPU (the device part's bf16_train_speedup): the bf16 parts run fp32"
fi
# gpt_100m at the profile's GPU batch (bf16, 32 x 4), 20 optimizer steps: compiled, then eager.
train bf16_100m 70 --iteration 3 --precision "$P16" --max-steps 20 --training-examples 4096 "${COMPILED[@]}"
train bf16_100m_eager 35 --iteration 3 --precision "$P16" --max-steps 20 --training-examples 4096 --no-compile
# A longer compiled run that evaluates and checkpoints (both every 25 steps, as iteration 3's full run
# does every 250): the summary prices its plan by bf16_100m's figures, the smoke stage's estimate.
train full_100m 80 --iteration 3 --precision "$P16" --max-steps 50 --training-examples 8192 \
  --eval-every 25 --checkpoint-every 25 "${COMPILED[@]}"
# fp16 with the grad scaler, and fp32 with TF32 tensor cores: eager, fewer steps, no accumulation.
train fp16_100m 30 --iteration "$FP16_ITERATION" --precision fp16 --max-steps 10 --grad-accum 1 --no-compile
train fp32_tf32_100m 35 --iteration 3 --precision fp32 --max-steps 10 --grad-accum 1 --no-compile
# gpt_42m (iteration 2) at its GPU defaults, compiled.
train bf16_42m 50 --iteration 2 --precision "$P16" --max-steps 20 --training-examples 4096 "${COMPILED[@]}"
# The largest batch that fits, probed (the dry run estimates it on the CPU instead), then a few steps.
if [[ $DRY -eq 1 ]]; then PROBE=(--dry-run --batch-size auto); else PROBE=(--batch-size auto --max-steps 3); fi
part train probe_100m 55 train --device "$DEVICE" --synthetic --no-track --iteration 3 --precision "$P16" \
  --grad-accum 1 --training-examples 8192 --no-compile --checkpoint-directory "$WORK/checkpoints/probe" \
  "${PROBE[@]}"
# Activation checkpointing at bf16_100m's batch: its training peak and step time against the eager part's.
train ckpt_100m 30 --iteration 3 --precision "$P16" --max-steps 5 --training-examples 4096 --activation-checkpointing \
  --no-compile
part compare compare_iteration_1 35 compare --iteration 1 --no-track "${COMPARE[@]}"
if [[ $DRY -eq 1 ]]; then  # the CPU cannot be filled safely: the same command, resolved and estimated only
  part train oom_dry 30 train --device cpu --synthetic --no-track --iteration 3 --precision "$P16" \
    --dry-run --batch-size 2048 --grad-accum 1
else  # batch 2048 x 1024 tokens cannot fit: expect exit 1, one advice line, no traceback (eager: at
  # once; compiled, the start-up probe runs out the same way, tests/test_compile.py)
  part oom oom 30 train --device cuda --synthetic --no-track --iteration 3 --precision "$P16" --max-steps 2 \
    --batch-size 2048 --grad-accum 1 --training-examples 2048 --no-compile \
    --checkpoint-directory "$WORK/checkpoints/oom"
fi

"$PY" bench/gpu_check_report.py "$OUT" summary
echo "== gpu_check: $([[ $status -eq 0 ]] && echo passed || echo FAILED)"
exit $status
