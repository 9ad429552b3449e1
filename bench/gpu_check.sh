#!/usr/bin/env bash
# GPU check for a lent H200 (or any CUDA GPU), at most ~8 minutes: the device report; gpt_100m in bf16
# for a bounded number of steps (tokens/s, MFU against the H200's 989 TFLOP/s dense bf16 peak, peak
# memory); the fp16 (grad scaler) and fp32+TF32 paths; a deliberately too-large batch showing the clear
# out-of-memory error. Every run is the real `gptpipe train` on a synthetic stream; each prints JSON lines.
#
#   bash bench/gpu_check.sh            # results under $OUT (or ./gpu_check_out)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
status=0

train() {  # train NAME TIMEOUT ARGS...: one bounded gpt_100m run, JSON lines to $OUT/NAME.jsonl
  local name=$1 limit=$2
  shift 2
  echo "== $name: gptpipe train --iteration 3 $*"
  timeout "$limit" "$PY" -m flows.cli train --iteration 3 --device cuda --synthetic \
    --training-examples 1024 --validation-examples 32 --log-every 10 --eval-every 100000 \
    --checkpoint-every 100000 --checkpoint-directory "$WORK/$name" "$@" \
    >"$OUT/$name.jsonl" 2>"$OUT/$name.stderr"
  local rc=$?
  "$PY" - "$OUT/$name.jsonl" <<'PYEOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
start = next((l for l in lines if l["event"] == "startup"), {})
end = next((l for l in lines if l["event"] == "summary"), None)
if end:
    print(f"  {start.get('gpu_name')} {start.get('precision')} batch {start.get('batch_size')}x"
          f"{start.get('grad_accum_steps')} fused_adamw={start.get('fused_adamw')} tf32={start.get('tf32_enabled')}")
    print(f"  steps {end['steps']}  tokens/s {end['tokens_per_second']:.0f}  MFU {end['mfu']:.3f} "
          f"of {end['peak_flops'] / 1e12:.1f} TFLOP/s  peak memory {end['peak_memory_bytes'] / 2**30:.2f} GiB "
          f"(estimated {end['estimated_peak_memory_bytes'] / 2**30:.2f})  loss {end['final_train_loss']:.3f}")
PYEOF
  return $rc
}

echo "== device report"
"$PY" -m flows.cli device --device cuda --json | tee "$OUT/device.json" || status=1

# bf16, the profile's GPU defaults (batch 32 x accumulation 4), 30 optimizer steps.
train bf16 150 --precision bf16 --max-steps 30 || status=1
# fp16 with the grad scaler, and fp32 with TF32 tensor cores: fewer steps, same batch per step.
train fp16 100 --precision fp16 --max-steps 15 --grad-accum 1 || status=1
train fp32_tf32 120 --precision fp32 --max-steps 15 --grad-accum 1 || status=1

echo "== out of memory: batch 2048 x 1024 tokens cannot fit; expect exit 1 and one advice line"
train oom 90 --precision bf16 --max-steps 2 --batch-size 2048 --grad-accum 1 --training-examples 2048
rc=$?
cat "$OUT/oom.stderr"
if [[ $rc -eq 1 ]] && grep -q "^error: out of memory on cuda at batch size 2048" "$OUT/oom.stderr" \
   && ! grep -q Traceback "$OUT/oom.stderr"; then
  echo "  OOM handled: exit $rc, one line, no traceback"
else
  echo "  OOM NOT handled as expected (exit $rc)"; status=1
fi
exit $status
