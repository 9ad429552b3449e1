"""The quantization trade-off on this machine: each method's row (`gptcore.eval.quant_tradeoff`) for the
trained
iteration-1 model and for `gpt_42m`, optionally with generation under `torch.compile` beside eager.

- `gpt_first_cpu`: the evaluated checkpoint of `make run` (the newest `checkpoints/iteration-1-full-*/
  best.pt`), on its whole test split unless `--max-test-tokens` says otherwise.
- `gpt_42m`: random initial weights (no trained 42M model on a CPU machine): its sizes and speeds are
  real, its quality columns only say how far each method moves an untrained model's loss.

Targets (issue 16): `int8-weight-only` of `gpt_42m` at most 0.45x the fp32 file; test perplexity of the
trained model within 1% of fp32. Prints JSON lines, then a Markdown table per profile.

    .venv/bin/python bench/quantize_tradeoff.py [--compile] [--max-test-tokens N] [--profiles first,42m]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gptcore.errors import first_line
from gptcore.eval.config import EvaluateConfig, QuantizeConfig
from gptcore.model.quantization import METHODS, cpu_features, quantized
from tasks.params.loading import load_profile

REPO = Path(__file__).resolve().parents[1]


def newest(pattern: str) -> Path:
    found = sorted(REPO.glob(pattern), key=lambda path: path.stat().st_mtime)
    if not found:
        raise SystemExit(f"no {pattern} under {REPO}: run `make run` first")
    return found[-1]


def compiled_speeds(model, ids: list[int], settings: QuantizeConfig) -> dict[str, str | float]:
    """Generation tokens per second of each method's model under `torch.compile` (dynamic shapes: the
    cache grows every step); a method that does not compile says why."""
    import torch

    from gptcore.eval.quant_tradeoff import generation_speed

    speeds: dict[str, str | float] = {}
    for method in METHODS:
        try:
            candidate = quantized(model, method)
            candidate.forward = torch.compile(candidate.forward, dynamic=True)
            speeds[method] = round(generation_speed(candidate, ids, settings.new_tokens, settings.repeats), 1)
        except Exception as error:  # a backend without kernels for a quantized layout
            first = first_line(error, 120)
            speeds[method] = f"failed: {first}"
        torch._dynamo.reset()
        print(json.dumps({"compiled": method, "generate_tokens_per_second": speeds[method]}), flush=True)
    return speeds


def measure(
    profile: str,
    model,
    test_path: Path,
    tokenizer: Path,
    args: argparse.Namespace,
    max_test_tokens: int | None,
) -> None:
    import tempfile

    from gptcore.data.tokenfile import open_tokens
    from gptcore.eval.quant_tradeoff import measure_tradeoff, tradeoff_markdown

    settings = QuantizeConfig(methods=list(METHODS), max_test_tokens=max_test_tokens)
    test = open_tokens(test_path)
    with tempfile.TemporaryDirectory(prefix="gptpipe-quant-bench-") as scratch:
        rows = measure_tradeoff(
            model, list(METHODS), test, tokenizer, settings, EvaluateConfig(), Path(scratch)
        )
    for row in rows:
        print(json.dumps({"profile": profile, **row.to_dict()}), flush=True)
    print(f"\n### {profile}\n\n{tradeoff_markdown(rows, cpu_features())}\n", flush=True)
    if args.compile:
        ids = test.tokens[:16].astype("int64").tolist()
        eager = {row.method: row.generate_tokens_per_second for row in rows}
        compiled = compiled_speeds(model, ids, settings)
        print("| method | eager gen tok/s | torch.compile gen tok/s |\n|---|---|---|")
        for method in METHODS:
            speed = eager.get(method)
            print(f"| {method} | {'-' if speed is None else f'{speed:.1f}'} | {compiled[method]} |")
    int8 = next(row for row in rows if row.method == "int8-weight-only")
    print(
        f"\n{profile}: int8-weight-only file {int8.size_ratio:.3f}x fp32 (target <= 0.45 for gpt_42m); "
        f"test perplexity change {int8.test_perplexity_change:+.3%} (target within 1% when trained)\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default="first,42m", help="first (trained iteration 1), 42m, or both")
    parser.add_argument("--max-test-tokens", type=int, default=None, help="default: the whole test split")
    parser.add_argument(
        "--max-test-tokens-42m", type=int, default=32768, help="gpt_42m's quality columns (minutes per 100k)"
    )
    parser.add_argument("--compile", action="store_true", help="also time generation under torch.compile")
    args = parser.parse_args()
    import torch

    from gptcore.checkpoint.load import load_model
    from gptcore.export.model_files import checkpoint_tokenizer
    from gptcore.model.gpt import GPT

    checkpoint = newest("checkpoints/iteration-1-full-*/best.pt")
    trained, record = load_model(checkpoint)
    tokenizer = checkpoint_tokenizer(record)
    from gptcore.data.tokenfile import find_test_tokens

    test_path = find_test_tokens(tokenizer, REPO / "data")  # the checkpoint's own test split, any layout
    if test_path is None:
        raise SystemExit(f"no test tokens made with {tokenizer} under {REPO / 'data'}: run `make run` first")
    print(json.dumps({"checkpoint": str(checkpoint), "test": str(test_path), **cpu_features()}), flush=True)
    wanted = args.profiles.split(",")
    if "first" in wanted:
        measure(
            "gpt_first_cpu (trained, iteration 1)", trained, test_path, tokenizer, args, args.max_test_tokens
        )
    if "42m" in wanted:
        torch.manual_seed(0)
        model = GPT(load_profile("gpt_42m").architecture).eval()
        measure(
            "gpt_42m (random initial weights)", model, test_path, tokenizer, args, args.max_test_tokens_42m
        )


if __name__ == "__main__":
    main()
