"""Sampling speed with and without the key/value cache: batch 1, greedy, on CPU.

For each profile (random initial weights, seeded: speed does not depend on training) and each mode, a
fresh process loads the model, warms up, then times one greedy `gptcore.generate.sample` of the new
tokens from a 16-token prompt, and a 256-token prefill (best of 3). A process per mode keeps each
mode's peak memory (RSS) its own. Prints one JSON line per run, then a table: new tokens per second,
the cache's speed-up, prefill tokens per second, peak RSS, and whether both modes chose the same tokens.

Defaults are the issue's: 512 new tokens on `gpt_42m`, 200 on `gpt_first_cpu` (the uncached 42M run
takes a few minutes on 2 cores).

    .venv/bin/python bench/generate_throughput.py [--profiles gpt_42m:512,gpt_first_cpu:200] [--threads 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPT_TOKENS = 16
PREFILL_TOKENS = 256
MODES = ("no-cache", "cache")


def measure(profile: str, new_tokens: int, mode: str, threads: int) -> dict:
    """One profile in one mode, in this process."""
    import torch

    from gptcore.generate import sample
    from gptcore.model.gpt import GPT
    from gptcore.model.kv_cache import KVCache
    from gptcore.runtime.memory import peak_memory_bytes
    from tasks.params.loading import load_profile

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = load_profile(profile).architecture
    model = GPT(config).eval()
    ids = torch.randint(0, config.vocab_size, (PREFILL_TOKENS,), generator=torch.Generator().manual_seed(1))
    prompt = ids[:PROMPT_TOKENS].tolist()
    kv_cache = mode == "cache"
    sample(model, prompt, 8, temperature=0.0, kv_cache=kv_cache)  # warm-up: allocator, kernel choice
    started = time.perf_counter()
    tokens = sample(model, prompt, new_tokens, temperature=0.0, kv_cache=kv_cache)
    seconds = time.perf_counter() - started
    prefill = []
    with torch.no_grad():
        for _ in range(3):
            started = time.perf_counter()
            model(ids[None, :], cache=KVCache(config.n_layer, config.block_size))
            prefill.append(time.perf_counter() - started)
    return {
        "profile": profile,
        "mode": mode,
        "new_tokens": new_tokens,
        "seconds": round(seconds, 3),
        "new_tokens_per_second": round(new_tokens / seconds, 1),
        "prefill_tokens_per_second": round(PREFILL_TOKENS / min(prefill), 1),
        "peak_rss_mb": round(peak_memory_bytes("cpu") / 2**20, 1),
        "tokens_sha256": hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16],
        "threads": threads,
        "torch": torch.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default="gpt_42m:512,gpt_first_cpu:200", help="PROFILE:NEW_TOKENS,...")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", nargs=3, metavar=("PROFILE", "NEW_TOKENS", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        profile, new_tokens, mode = args.one
        print(json.dumps(measure(profile, int(new_tokens), mode, args.threads)), flush=True)
        return
    rows = []
    for item in args.profiles.split(","):
        profile, new_tokens = item.split(":")
        for mode in MODES:
            command = [
                sys.executable,
                __file__,
                "--threads",
                str(args.threads),
                "--one",
                profile,
                new_tokens,
                mode,
            ]
            result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
            rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'profile':<14} {'new':>4} {'no cache tok/s':>15} {'cache tok/s':>12} {'speed-up':>9} "
          f"{'prefill tok/s':>14} {'peak RSS MB (no cache / cache)':>31} same tokens")  # fmt: skip
    for plain, cached in zip(rows[::2], rows[1::2], strict=True):
        speedup = cached["new_tokens_per_second"] / plain["new_tokens_per_second"]
        print(
            f"{plain['profile']:<14} {plain['new_tokens']:>4} {plain['new_tokens_per_second']:>15} "
            f"{cached['new_tokens_per_second']:>12} {speedup:>8.2f}x "
            f"{cached['prefill_tokens_per_second']:>14} "
            f"{plain['peak_rss_mb']:>15} / {cached['peak_rss_mb']:<13} "
            f"{plain['tokens_sha256'] == cached['tokens_sha256']}"
        )


if __name__ == "__main__":
    main()
