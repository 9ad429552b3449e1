"""Full fine-tuning, LoRA and QLoRA side by side on a GPT-2-124M-shaped model (random weights) on CPU:
the memory training holds and its speed, each method measured in its own process (a fresh heap).

Each process builds the model, puts on the method's adapters (QLoRA: over those layers' weights in int8,
`gptcore.finetune.start.adapt`, as the trainer does), makes AdamW over what trains and runs `--steps + 1`
optimizer steps on random tokens, `--batch` sequences of `--seq-len`. It reports:

- `peak_rss_bytes`: the process's peak resident set (`ru_maxrss`), and `rss_before_model_bytes`, the
  resident set once the method's modules are imported (QLoRA's torchao: about 80 MB), before the model is
  built; `training_rss_bytes` is the difference. The peak falls in training: a QLoRA process builds the
  fp32 model before quantizing its layers, but holds less then than its first step does.
- `live_heap_peak_bytes`: the largest of the live heap's samples less its size before the model was
  built (`LiveHeap`): what training holds, without what the allocator keeps of what it freed.
- `state_bytes`: computed from the model: the weights as held (QLoRA's int8 data and scales), and an fp32
  gradient and AdamW's two fp32 moments for each trained parameter.
- `tokens_per_second`: over the steps after the first (which allocates the gradients and moments).

Prints one JSON line per method, then a table with each figure's ratio against full fine-tuning.

    .venv/bin/python bench/finetune_memory.py [--steps 4] [--batch 2] [--seq-len 128] [--r 8]
        [--targets attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj]
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import importlib
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
METHODS = ("full", "lora", "qlora")  # full first: the reference of every ratio
EVERY_LINEAR = "attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj"  # QLoRA's usual choice: every linear layer


def gpt2_small() -> Any:
    from gptcore.model.config import ModelConfig

    return ModelConfig(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, block_size=1024, dropout=0.0)


def prepared(method: str, r: int, targets: list[str]) -> Any:
    """The model as `method` trains it: every weight, or adapters (over an int8 base for QLoRA)."""
    import torch

    from gptcore.finetune.config import LoRAConfig, QLoRAConfig
    from gptcore.finetune.start import adapt
    from gptcore.model.gpt import GPT

    torch.manual_seed(0)
    model = GPT(gpt2_small())
    if method != "full":
        kind = QLoRAConfig if method == "qlora" else LoRAConfig
        adapt(model, kind(r=r, alpha=2.0 * r, dropout=0.0, targets=targets))
    return model.train()


def state_bytes(model: Any) -> dict[str, int]:
    """Weights as held, and per trained parameter an fp32 gradient and AdamW's two fp32 moments."""
    from gptcore.model.quantization import weight_bytes

    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    weights = weight_bytes(model)
    return {
        "trainable_parameters": trained,
        "weight_bytes": weights,
        "gradient_bytes": 4 * trained,
        "optimizer_bytes": 8 * trained,
        "state_bytes": weights + 12 * trained,
    }


class LiveHeap:
    """Bytes malloc holds for live objects (glibc `mallinfo2`: chunks in use, and mmapped ones), sampled at
    the end of each forward pass, before each block's backward and after each optimizer step. The
    resident set also counts freed memory the allocator keeps (gptpipe's malloc tuning keeps up to 512 MiB
    of it), which can hide the difference in what the methods hold; the largest sample cannot."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        self.mallinfo2 = getattr(libc, "mallinfo2", None)  # glibc 2.33+
        if self.mallinfo2 is not None:
            self.mallinfo2.restype = _MallInfo2
        self.baseline = self.now() or 0
        self.peak = 0

    def now(self) -> int | None:
        if self.mallinfo2 is None:
            return None
        info = self.mallinfo2()
        return int(info.uordblks + info.hblkhd)

    def sample(self, *_: Any) -> None:
        self.peak = max(self.peak, (self.now() or 0) - self.baseline)

    def watch(self, model: Any) -> None:
        for block in model.transformer.h:
            block.register_full_backward_pre_hook(self.sample)


_MALLINFO2 = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (*_MALLINFO2, "keepcost")]


def measure(method: str, steps: int, batch: int, seq_len: int, r: int, targets: list[str]) -> dict:
    """One method, in this process."""
    from gptcore.runtime.malloc import tune_malloc

    tune_malloc()  # as `gptpipe` runs
    import torch

    from gptcore.model.gpt import optimizer_groups
    from gptcore.model.quantization import torchao
    from gptcore.runtime.memory import resident_bytes

    importlib.import_module("gptcore.finetune.start")  # every module imported: the baseline's, not training's
    if method == "qlora":
        torchao()
    before, heap = resident_bytes() or 0, LiveHeap()
    model = prepared(method, r, targets)
    heap.watch(model)
    optimizer = torch.optim.AdamW(optimizer_groups(model, 0.1), lr=1e-4)
    vocab = model.config.vocab_size
    windows = torch.randint(
        0, vocab, (steps + 1, batch, seq_len + 1), generator=torch.Generator().manual_seed(1)
    )
    started = time.perf_counter()
    for step, window in enumerate(windows):
        if step == 1:
            started = time.perf_counter()
        _, loss = model(window[:, :-1], window[:, 1:])
        heap.sample()  # every activation alive
        loss.backward()
        optimizer.step()
        heap.sample()
        optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    return {
        "method": method,
        "peak_rss_bytes": peak,
        "rss_before_model_bytes": before,
        "training_rss_bytes": peak - before,
        "live_heap_peak_bytes": heap.peak if heap.mallinfo2 is not None else None,
        **state_bytes(model),
        "tokens_per_second": steps * batch * seq_len / seconds,
        "final_loss": float(loss.item()),
        "threads": torch.get_num_threads(),
    }


def run_case(method: str, args: argparse.Namespace) -> dict:
    arguments = [method, str(args.steps), str(args.batch), str(args.seq_len), str(args.r), args.targets]
    done = subprocess.run(
        [sys.executable, __file__, "--case", *arguments], cwd=REPO, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"{method}: failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


COLUMNS = (  # (header, figure, scale)
    ("peak RSS MiB", "peak_rss_bytes", 2**20),
    ("peak - RSS before model MiB", "training_rss_bytes", 2**20),
    ("live heap peak MiB", "live_heap_peak_bytes", 2**20),
    ("weights MiB", "weight_bytes", 2**20),
    ("params+grads+AdamW MiB", "state_bytes", 2**20),
    ("tokens/s", "tokens_per_second", 1),
)


def table(rows: list[dict]) -> str:
    full = rows[0]
    headers = ["method", "trainable params", *(header for header, _, _ in COLUMNS)]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        cells = [row["method"], f"{row['trainable_parameters']:,}"]
        for _, figure, scale in COLUMNS:
            cells.append(f"{row[figure] / scale:,.0f} ({row[figure] / full[figure]:.2f}x)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=4, help="timed optimizer steps (after one untimed)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--r", type=int, default=8, help="the adapters' rank (alpha 2r)")
    parser.add_argument("--targets", default=EVERY_LINEAR, help="the layers adapted (QLoRA: and quantized)")
    parser.add_argument("--case", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        method, steps, batch, seq_len, r, targets = args.case
        print(json.dumps(measure(method, int(steps), int(batch), int(seq_len), int(r), targets.split(","))))
        return
    from gptcore.model.quantization import cpu_features

    machine = cpu_features()
    print(
        json.dumps({"machine": machine, **{k: v for k, v in vars(args).items() if k != "case"}}), flush=True
    )
    rows = []
    for method in METHODS:
        rows.append(run_case(method, args))
        print(json.dumps(rows[-1]), flush=True)
    print(
        f"\nGPT-2 124M shape, batch {args.batch} x {args.seq_len} tokens, {args.steps} timed steps, "
        f"r {args.r} on {args.targets}; {machine['cpu']}, {rows[0]['threads']} threads, fp32 "
        "(ratios against full)"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
