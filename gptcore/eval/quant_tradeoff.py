"""The quantization trade-off, measured: for each method one row of size, quality and speed beside fp32.

Every row is measured the same way, in this process, one method after another:
- size: the serialized weights file (`gptcore.export.model_files`) in bytes, and as a fraction of fp32's;
- quality on the held-out test split (the evaluate stage's test token file): loss, perplexity and bits
  per byte, each with its change against fp32;
- greedy-token agreement with fp32: the fraction of positions where the method's greedy continuation of
  each fixed prompt (the evaluate stage's, from the test documents' starts) chooses fp32's token;
- speed: greedy generation, batch 1, `new_tokens` new tokens with the key/value cache, warm, median of
  at least `repeats` (the greedy continuations' own decodes); prefill tokens per second over one full
  window;
- memory: the weights' bytes in memory, and the process's peak resident set while the row was measured.

A method this build or device cannot run is a row `skipped: <reason>`, never a failure of the whole. A
method this CPU only emulates (bf16 without AVX512-BF16 or AMX: every multiply converted to fp32 and back;
int8-dynamic without VNNI or AMX: its int8 matmuls on a fallback path, 13x slower than fp32 on one AVX2 CPU)
is measured briefly and says so: quality on the test split's first `emulated_test_tokens`, against fp32's
on the same tokens, and its speeds timed briefly (the greedy continuations' decodes, one prefill), since
those speeds are the stand-in's, not the format's.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from gptcore.data.tokenfile import TokenStream
from gptcore.errors import first_line
from gptcore.eval.config import EvaluateConfig, QuantizeConfig
from gptcore.eval.held_out import held_out_prompts, stream_bits_per_byte, summed_nats
from gptcore.export.model_files import write_model_files
from gptcore.generate import sample
from gptcore.model.gpt import GPT
from gptcore.model.kv_cache import KVCache
from gptcore.model.quantization import REFERENCE, cpu_features, quantized, unavailable, weight_bytes
from gptcore.runtime.load import MachineLoad
from gptcore.runtime.memory import peak_memory_bytes, reset_peak_memory
from gptcore.runtime.precision_speed import PRECISIONS, measure_precision_speeds
from gptcore.tools.markdown import cell, table
from gptcore.tools.records import JSONObject

OK = "ok"
# Methods whose matmuls multiply int8 by int8 (weight-only ones dequantize to the activations' type), and
# the CPU instructions that do it natively: without them an int8 matmul takes a fallback path (on an
# AVX2-only EPYC, int8-dynamic prefilled 878 tokens a second where fp32 did 11,801).
INT8_MATMULS = ("int8-dynamic",)
INT8_NATIVE_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


# A row's quality figures: on the whole test split, or on its first tokens (`TradeoffRow.on_prefix`).
QUALITY = frozenset({
    "test_loss", "test_loss_delta", "test_perplexity", "test_perplexity_change", "test_bits_per_byte",
    "test_bits_per_byte_delta",
})  # fmt: skip


@dataclass(frozen=True)
class TradeoffRow:
    """One method's figures; the field names are the MLflow metric names (`method` and `status` aside)."""

    method: str
    status: str  # "ok", or "skipped: <reason>"
    size_bytes: int | None = None
    size_ratio: float | None = None  # of fp32's file
    weight_memory_bytes: int | None = None
    test_loss: float | None = None
    test_loss_delta: float | None = None  # nats per token, against fp32
    test_perplexity: float | None = None
    test_perplexity_change: float | None = None  # relative: 0.01 is 1% above fp32
    test_bits_per_byte: float | None = None
    test_bits_per_byte_delta: float | None = None
    test_tokens: int | None = None  # the tokens predicted: the whole split's, or its first ones
    test_split_tokens: int | None = None  # the whole split's (the evaluate stage's `test_tokens`)
    greedy_agreement: float | None = None
    generate_tokens_per_second: float | None = None
    prefill_tokens_per_second: float | None = None
    load_average: float | None = None  # the machine's over the two speeds' measurement (runtime.load)
    other_cpu_cores: float | None = None  # what other processes used meanwhile: 0 means measured alone
    peak_rss_bytes: int | None = None
    # A 16-bit method this CPU emulates: the precision probe's ratios (gptcore.runtime.precision_speed).
    emulated: str | None = None

    @property
    def measured(self) -> bool:
        return self.status == OK

    @property
    def on_prefix(self) -> bool:
        """Quality measured on the test split's first `test_tokens` tokens (`quantize.max_test_tokens`),
        not all of it: its figures are not the evaluate stage's, and their names say so."""
        return self.test_split_tokens is not None and (self.test_tokens or 0) < self.test_split_tokens

    def metrics(self) -> dict[str, float]:
        """The numeric figures, for MLflow (a skipped row has none); quality on a prefix of the test split
        as `prefix_test_*`, so `test_*` always means the whole split, as the evaluate stage's does."""
        skip = {"method", "status", "emulated"}
        return {
            (f"prefix_{f.name}" if self.on_prefix and f.name in QUALITY else f.name): float(
                getattr(self, f.name)
            )
            for f in fields(self)
            if f.name not in skip and getattr(self, f.name) is not None
        }

    def to_dict(self) -> JSONObject:
        return asdict(self)


def measure_tradeoff(
    model: GPT,
    methods: list[str],
    test: TokenStream,
    tokenizer: Path | None,
    settings: QuantizeConfig,
    prompts: EvaluateConfig,
    folder: Path,
    device: str = "cpu",
) -> list[TradeoffRow]:
    """A row per method (fp32 first, always), each quantized model's files written to `folder/<method>`."""
    ordered = [REFERENCE, *(method for method in methods if method != REFERENCE)]
    end_of_text = test.manifest.end_of_text_id if test.manifest else None
    prompt_ids = (
        held_out_prompts(test, end_of_text, max(prompts.prompts, 1), prompts.prompt_tokens)
        if end_of_text is not None
        else []
    ) or [[0]]
    rows: list[TradeoffRow] = []
    reference_greedy: list[list[int]] = []
    for method in ordered:
        reason = unavailable(method, device)
        if reason is not None:
            rows.append(TradeoffRow(method, f"skipped: {reason}"))
            continue
        emulated = _emulated(method, device)
        measured = settings if emulated is None else _briefly(settings)
        try:
            row, greedy = _measure(model, method, test, tokenizer, measured, prompt_ids, folder / method)
        except (NotImplementedError, RuntimeError) as error:  # no kernel for this method here
            if method == REFERENCE:
                raise  # nothing to compare against: not a skip
            first = first_line(error)
            rows.append(TradeoffRow(method, f"skipped: {first[:200]}"))
            continue
        if method == REFERENCE:
            reference_greedy = greedy
        reference = _reference_on(model, test, rows[0], row.test_tokens) if rows else row
        rows.append(_against(replace(row, emulated=emulated), reference, greedy, reference_greedy))
    return rows


def _briefly(settings: QuantizeConfig) -> QuantizeConfig:
    """What an emulated method is measured over: quality on `emulated_test_tokens`, speeds timed briefly
    (the decodes its greedy continuations need, one prefill). Its speed is this CPU's conversions, not the
    format's, so repeating it buys nothing, and its compute-bound work runs 15-45x slower than fp32's:
    the whole prefix would cost minutes."""
    prefix = min(settings.max_test_tokens or settings.emulated_test_tokens, settings.emulated_test_tokens)
    return settings.model_copy(update={"max_test_tokens": prefix, "repeats": 1})


def _reference_on(model: GPT, test: TokenStream, reference: TradeoffRow, tokens: int | None) -> TradeoffRow:
    """The fp32 row with its quality measured on the first `tokens` predicted tokens, where a row was
    measured on fewer than fp32 was (an emulated method): a change against fp32 is on the same tokens."""
    if tokens is None or reference.test_tokens is None or tokens >= reference.test_tokens:
        return reference
    return replace(reference, **_quality(model, test, tokens))


def _quality(model: GPT, test: TokenStream, max_tokens: int | None) -> dict[str, Any]:
    """A row's quality fields: loss, perplexity and bits per byte on the test stream's first `max_tokens`
    predicted tokens (None: all), read in the evaluate stage's passes, and how many tokens that was."""
    nats, predicted = summed_nats(model, test.tokens, EvaluateConfig().batch_size, max_tokens)
    loss = nats / predicted
    return {
        "test_loss": loss,
        "test_perplexity": math.exp(min(loss, 700.0)),
        "test_bits_per_byte": stream_bits_per_byte(test, nats, predicted),
        "test_tokens": predicted,
    }


def _emulated(method: str, device: str) -> str | None:
    """Why this CPU only emulates `method`, else None: a 16-bit precision the probe finds emulated (its
    ratios), or int8 matmuls without the CPU's int8 dot-product instructions (its flags)."""
    if device != "cpu":
        return None
    if method in INT8_MATMULS:
        present = cpu_features()["cpu_flags"]
        if present.startswith("none of") or any(flag in present.split() for flag in INT8_NATIVE_FLAGS):
            return None  # native, or an x86 CPU's flags unknown here: nothing to claim
        flags = " or ".join(INT8_NATIVE_FLAGS)
        return f"{method} on cpu: int8 matmuls (emulated: this CPU has no {flags})"
    if method not in PRECISIONS:
        return None
    speed = measure_precision_speeds(device).of(method)
    return speed.describe() if speed is not None and speed.emulated else None


def _measure(
    model: GPT,
    method: str,
    test: TokenStream,
    tokenizer: Path | None,
    settings: QuantizeConfig,
    prompt_ids: list[list[int]],
    folder: Path,
) -> tuple[TradeoffRow, list[list[int]]]:
    device = next(model.parameters()).device.type
    reset_peak_memory(device)
    candidate = quantized(model, method)
    files = write_model_files(candidate, tokenizer, folder, method)
    quality = _quality(candidate, test, settings.max_test_tokens)
    load = MachineLoad()
    greedy, generate = greedy_and_speed(candidate, prompt_ids, settings.new_tokens, settings.repeats)
    prefill = _prefill_speed(candidate, test, settings.repeats)
    row = TradeoffRow(
        method=method,
        status=OK,
        size_bytes=files.weights.stat().st_size,
        weight_memory_bytes=weight_bytes(candidate),
        **quality,
        test_split_tokens=len(test) - 1,
        generate_tokens_per_second=generate,
        prefill_tokens_per_second=prefill,
        **load.whole(),
        peak_rss_bytes=peak_memory_bytes(device),
    )
    return row, greedy


def greedy_and_speed(
    model: GPT, prompt_ids: list[list[int]], new_tokens: int, repeats: int
) -> tuple[list[list[int]], float]:
    """Each prompt's greedy continuation (`new_tokens`, with the cache, batch 1), and new tokens per
    second of that decoding: the median of at least `repeats` timed decodes. The prompts' own decodes
    are timed after the first (untimed: kernels chosen, allocator grown), then the first prompt's again
    while fewer than `repeats`: every decode is the same work (prompts of one length, no stop), so the
    continuations the table compares cost no decoding beyond the timing's."""
    greedy, seconds = [], []
    for index, ids in enumerate(prompt_ids):
        started = time.perf_counter()
        greedy.append(sample(model, ids, new_tokens, temperature=0.0))
        if index > 0:
            seconds.append(time.perf_counter() - started)
    while len(seconds) < repeats:
        started = time.perf_counter()
        sample(model, prompt_ids[0], new_tokens, temperature=0.0)
        seconds.append(time.perf_counter() - started)
    return greedy, new_tokens / statistics.median(seconds)


@torch.no_grad()
def _prefill_speed(model: GPT, test: TokenStream, repeats: int) -> float:
    """Tokens per second of one full window run into an empty cache (the median of `repeats`)."""
    config = model.config
    length = min(config.block_size, len(test))
    window = torch.from_numpy(test.tokens[:length].astype("int64"))[None, :]
    model(window, cache=KVCache(config.n_layer, config.block_size))  # warm
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        model(window, cache=KVCache(config.n_layer, config.block_size))
        seconds.append(time.perf_counter() - started)
    return length / statistics.median(seconds)


def _against(
    row: TradeoffRow, reference: TradeoffRow, greedy: list[list[int]], reference_greedy: list[list[int]]
) -> TradeoffRow:
    """`row` with its changes against the fp32 row filled in."""
    both = zip(greedy, reference_greedy, strict=True)
    pairs = [pair for ours, theirs in both for pair in zip(ours, theirs, strict=True)]
    same, total = sum(a == b for a, b in pairs), len(pairs)
    return replace(
        row,
        size_ratio=row.size_bytes / reference.size_bytes,
        test_loss_delta=row.test_loss - reference.test_loss,
        test_perplexity_change=row.test_perplexity / reference.test_perplexity - 1.0,
        test_bits_per_byte_delta=(
            row.test_bits_per_byte - reference.test_bits_per_byte
            if row.test_bits_per_byte is not None and reference.test_bits_per_byte is not None
            else None
        ),
        greedy_agreement=same / total if total else None,
    )


TRADEOFF_HEADER = [
    "method", "size MB", "x fp32", "test loss", "Δ loss", "perplexity", "Δ ppl", "bits/byte", "greedy agree",
    "gen tok/s", "prefill tok/s", "other cores", "weights MB", "peak RSS MB",
]  # fmt: skip


def tradeoff_markdown(rows: list[TradeoffRow], machine: dict[str, Any]) -> str:
    """The table as Markdown, with the machine it was measured on under it."""
    cells = []
    for row in rows:
        if not row.measured:
            cells.append([row.method, row.status, *[""] * (len(TRADEOFF_HEADER) - 2)])
            continue
        cells.append([
            f"{row.method} (emulated)" if row.emulated else row.method,
            cell(row.size_bytes / 1e6, ".2f"), cell(row.size_ratio, ".3f"),
            cell(row.test_loss, ".4f"), cell(row.test_loss_delta, "+.4f"), cell(row.test_perplexity, ".2f"),
            cell(row.test_perplexity_change, "+.2%"), cell(row.test_bits_per_byte, ".4f"),
            cell(row.greedy_agreement, ".1%"), cell(row.generate_tokens_per_second, ".1f"),
            cell(row.prefill_tokens_per_second, ".0f"), cell(row.other_cpu_cores, ".2f"),
            cell(row.weight_memory_bytes / 1e6, ".2f"),
            cell(row.peak_rss_bytes / 1e6, ".0f"),
        ])  # fmt: skip
    described = ", ".join(f"{key} {value}" for key, value in machine.items())
    header, lines = list(TRADEOFF_HEADER), []
    reference = next((row for row in rows if row.measured), None)
    if reference is not None and reference.on_prefix:  # the loss is not the evaluate stage's: say whose
        header[header.index("test loss")] = f"test loss (first {reference.test_tokens:,} tokens)"
        lines = [
            f"Quality columns: the test split's first {reference.test_tokens:,} of "
            f"{reference.test_split_tokens:,} tokens (quantize.max_test_tokens); the evaluate stage's test "
            "loss covers them all.",
            "",
        ]
    for row in rows:
        if row.emulated:  # its speed columns are this CPU's stand-in for the format, not the format's
            lines += [f"{row.emulated}: its speed columns are this CPU's stand-in, not the format's.", ""]
        if row.measured and reference is not None and row.test_tokens != reference.test_tokens:
            lines += [
                f"{row.method}: quality on the test split's first {row.test_tokens:,} tokens, its changes "
                "against fp32 on the same tokens (quantize.emulated_test_tokens); speeds timed briefly.",
                "",
            ]
    return "\n".join([table(header, cells), "", *lines, f"Measured on: {described}."])


TABLE_JSON = "tradeoff.json"
TABLE_MARKDOWN = "tradeoff.md"


def write_tradeoff(rows: list[TradeoffRow], machine: dict[str, Any], folder: Path) -> list[Path]:
    """The table as JSON (rows and machine) and as Markdown in `folder`, each written whole or not at all."""
    from gptcore.tools.atomic import write_json_atomic, write_text_atomic

    folder.mkdir(parents=True, exist_ok=True)
    table = tradeoff_markdown(rows, machine)
    return [
        write_json_atomic(folder / TABLE_JSON, {"rows": [row.to_dict() for row in rows], "machine": machine}),
        write_text_atomic(folder / TABLE_MARKDOWN, f"# Quantization trade-off\n\n{table}\n"),
    ]
