#!/usr/bin/env bash
# One-off for issue 30 on a lent GPU, after bench/gpu_check.sh: which attention kernel SDPA runs for
# gpt_100m's shapes in bf16 (each backend timed alone, the default's kernel named by the profiler), and
# gpt_100m bf16 compiled at the check's bf16_100m settings (compare with that part's eager figures).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-probe_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .gpu_wheels/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
timeout 60 python3 - <<'PYEOF' 2>&1 | tee "$OUT/attention.txt"
import time, torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
q, k, v = (torch.randn(32, 12, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
def step():
    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
for backend in [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]:
    try:
        with sdpa_kernel([backend]):
            for _ in range(3):
                step()
            torch.cuda.synchronize(); started = time.perf_counter()
            for _ in range(10):
                step()
            torch.cuda.synchronize()
        print(f"{backend.name}: {(time.perf_counter() - started) * 100:.2f} ms per forward+backward")
    except Exception as error:
        print(f"{backend.name}: unavailable: {str(error).splitlines()[0][:200]}")
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
    step(); torch.cuda.synchronize()
names = [e.key for e in profile.key_averages() if any(w in e.key.lower() for w in ("flash", "fmha", "attention", "efficient", "cudnn"))]
print("default kernels:", names[:6])
print("torch", torch.__version__, torch.cuda.get_device_name())
PYEOF
timeout 240 python3 -m flows.cli.main train --device cuda --synthetic --no-track --log-every 5 \
  --eval-every 100000 --checkpoint-every 100000 --checkpoint-directory /tmp/probe_ck --iteration 3 \
  --precision bf16 --max-steps 25 --training-examples 4096 --compile >"$OUT/compiled.txt" 2>&1
echo "compiled run exit $?"
tail -40 "$OUT/compiled.txt"
