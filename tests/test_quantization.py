"""Post-training quantization: quantized models that round-trip through their files, a trade-off table with
fp32 as the reference, skipped rows for methods that cannot run, and quantized versions in the registry."""

from __future__ import annotations

import sysconfig
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from gptcore.data.config import CorpusConfig, TokenizerConfig
from gptcore.data.corpus import open_corpus
from gptcore.data.tokenfile import open_tokens
from gptcore.eval.config import EvaluateConfig, QuantizeConfig
from gptcore.export.model_files import model_files_in, read_model_files, write_model_files
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT
from gptcore.model.quantization import METHODS, quantized, weight_bytes
from tasks.params.loading import load_profile
from tasks.params.schema import QuantizeSection

# torchao makes the int8 and int4 methods; fp32, bf16 and the table's own logic run without it.
needs_torchao = pytest.mark.skipif(
    find_spec("torchao") is None, reason="the quant extra (pip install -e '.[quant]') is not installed"
)
TORCHAO_METHODS = ("int8-weight-only", "int8-dynamic", "int4-weight-only")

SMALL = ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=400)
STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tokenizer and the test token file of real text (two standard-library packages' sources)."""
    from gptcore.data.build import build_token_files
    from gptcore.data.tokenizer import train_tokenizer

    folder = tmp_path_factory.mktemp("quant")
    paths = [str(STDLIB / "json" / "*.py"), str(STDLIB / "email" / "*.py")]
    corpus = open_corpus(
        CorpusConfig(source="local", paths=paths, validation_fraction=0.2, test_fraction=0.2)
    )
    tokenizer = train_tokenizer(corpus, TokenizerConfig(vocab_size=400), folder)
    tokens = build_token_files(corpus, tokenizer, folder)
    return Path(tokenizer.path), Path(tokens.test.path)


def small_model() -> GPT:
    torch.manual_seed(0)
    return GPT(SMALL).eval()


@pytest.mark.parametrize(
    "method", [pytest.param(m, marks=needs_torchao) if m in TORCHAO_METHODS else m for m in METHODS]
)
def test_a_quantized_model_reads_back_from_its_files_with_the_same_logits(
    method: str, text, tmp_path
) -> None:
    tokenizer, _ = text
    model = quantized(small_model(), method)
    files = write_model_files(model, tokenizer, tmp_path, method)
    assert model_files_in(tmp_path) == files and files.method == method
    again = read_model_files(files.weights, files.config, quantization=files.quantization)
    ids = torch.randint(0, SMALL.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(again(ids, ids)[0], model(ids, ids)[0], rtol=0, atol=0)
    assert again.lm_head.weight is again.transformer.wte.weight  # still tied


@needs_torchao
def test_int8_keeps_the_tied_head_in_floating_point_and_shrinks_gpt_42m_below_045x(
    text, tmp_path: Path
) -> None:
    from safetensors.torch import save_model

    torch.manual_seed(0)
    model = GPT(load_profile("gpt_42m").architecture).eval()
    reference = tmp_path / "fp32.safetensors"
    save_model(model, str(reference))
    int8 = quantized(model, "int8-weight-only")
    assert int8.lm_head.weight is int8.transformer.wte.weight and int8.lm_head.weight.dtype == torch.float32
    assert type(int8.transformer.h[0].mlp.c_fc.weight).__name__ == "Int8Tensor"
    files = write_model_files(int8, text[0], tmp_path / "int8", "int8-weight-only")
    assert files.weights.stat().st_size <= 0.45 * reference.stat().st_size
    assert weight_bytes(int8) <= 0.45 * weight_bytes(model)
    assert type(model.transformer.h[0].mlp.c_fc.weight) is torch.nn.Parameter  # the original untouched


@needs_torchao
def test_the_tradeoff_table_measures_every_method_against_fp32(text, tmp_path: Path) -> None:
    from gptcore.eval.quant_tradeoff import measure_tradeoff, tradeoff_markdown
    from gptcore.model.quantization import cpu_features

    tokenizer, test = text
    settings = QuantizeConfig(methods=["int8-weight-only", "bf16"], new_tokens=6, repeats=1)
    rows = measure_tradeoff(
        small_model(),
        settings.methods,
        open_tokens(test),
        tokenizer,
        settings,
        EvaluateConfig(prompts=2),
        tmp_path,
    )
    assert [row.method for row in rows] == ["fp32", "int8-weight-only", "bf16"]  # fp32 first, always
    fp32, int8, bf16 = rows
    assert (fp32.size_ratio, fp32.test_loss_delta, fp32.greedy_agreement) == (1.0, 0.0, 1.0)
    assert int8.size_ratio < 1.0 and 0.45 < bf16.size_ratio < 0.55
    assert abs(int8.test_perplexity_change) < 0.05 and 0.0 <= int8.greedy_agreement <= 1.0
    assert all(row.generate_tokens_per_second > 0 and row.prefill_tokens_per_second > 0 for row in rows)
    assert fp32.test_tokens == len(open_tokens(test)) - 1 and fp32.test_bits_per_byte > 0
    assert (tmp_path / "int8-weight-only" / "model.pt").is_file()
    table = tradeoff_markdown(rows, cpu_features())
    assert "| int8-weight-only |" in table and "torchao" in table
    assert "test_loss" in fp32.metrics() and "| test loss |" in table, "the whole split: the evaluate stage's"


def test_a_method_that_cannot_run_here_is_a_skipped_row_not_a_failure(
    text, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gptcore.eval.quant_tradeoff as tradeoff

    tokenizer, test = text
    real = tradeoff.unavailable
    monkeypatch.setattr(
        tradeoff,
        "unavailable",
        lambda m, d: "no int8 kernels on this CPU" if m == "int8-dynamic" else real(m, d),
    )
    settings = QuantizeConfig(methods=["int8-dynamic"], max_test_tokens=64, new_tokens=4, repeats=1)
    rows = tradeoff.measure_tradeoff(
        small_model(), settings.methods, open_tokens(test), tokenizer, settings, EvaluateConfig(), tmp_path
    )
    assert [(row.method, row.status) for row in rows] == [
        ("fp32", "ok"),
        ("int8-dynamic", "skipped: no int8 kernels on this CPU"),
    ]
    assert rows[1].metrics() == {} and rows[0].test_tokens == 64


def test_quality_on_the_first_tokens_is_named_for_them(text, tmp_path: Path) -> None:
    from gptcore.eval.quant_tradeoff import measure_tradeoff, tradeoff_markdown
    from gptcore.model.quantization import cpu_features

    tokenizer, test = text
    settings = QuantizeConfig(methods=["bf16"], max_test_tokens=64, new_tokens=4, repeats=1)
    stream = open_tokens(test)
    rows = measure_tradeoff(
        small_model(), settings.methods, stream, tokenizer, settings, EvaluateConfig(), tmp_path
    )
    metrics = rows[1].metrics()
    assert rows[1].on_prefix and (rows[1].test_tokens, rows[1].test_split_tokens) == (64, len(stream) - 1)
    assert "prefix_test_loss" in metrics and "prefix_test_bits_per_byte_delta" in metrics
    assert not any(
        name.startswith("test_") and name not in ("test_tokens", "test_split_tokens") for name in metrics
    )
    table = tradeoff_markdown(rows, cpu_features())
    assert "| test loss (first 64 tokens) |" in table
    assert f"the test split's first 64 of {len(stream) - 1:,} tokens (quantize.max_test_tokens)" in table


def test_a_bf16_row_on_a_cpu_that_emulates_it_says_so_with_the_probes_ratios(
    text, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gptcore.eval import quant_tradeoff
    from gptcore.runtime.precision_speed import PrecisionSpeed, PrecisionSpeeds

    def probe(train: float) -> PrecisionSpeeds:  # a stubbed probe: never this machine's speed
        return PrecisionSpeeds("cpu", (PrecisionSpeed("bf16", "cpu", train, 2.5, train >= 1),))

    tokenizer, test = text
    settings = QuantizeConfig(methods=["bf16"], max_test_tokens=64, new_tokens=4, repeats=1)
    monkeypatch.setattr(quant_tradeoff, "measure_precision_speeds", lambda device: probe(0.15))
    rows = quant_tradeoff.measure_tradeoff(
        small_model(), settings.methods, open_tokens(test), tokenizer, settings, EvaluateConfig(), tmp_path
    )
    assert rows[0].emulated is None and "0.15x fp32's speed" in rows[1].emulated
    assert "emulated" not in rows[1].metrics()
    table = quant_tradeoff.tradeoff_markdown(rows, {})
    assert "| bf16 (emulated) |" in table and f"{rows[1].emulated}: its speed columns" in table
    monkeypatch.setattr(quant_tradeoff, "measure_precision_speeds", lambda device: probe(2.0))
    assert quant_tradeoff._emulated("bf16", "cpu") is None
    assert quant_tradeoff._emulated("bf16", "cuda") is None


def test_an_emulated_method_is_measured_briefly_against_fp32_on_the_same_tokens(
    text, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its quality on `emulated_test_tokens` (fp32's on the whole prefix, as configured), its change
    against fp32's loss on those same tokens, its speeds timed briefly (`repeats` 1)."""
    from gptcore.eval import quant_tradeoff
    from gptcore.eval.held_out import summed_nats
    from gptcore.runtime.precision_speed import PrecisionSpeed, PrecisionSpeeds

    emulated = PrecisionSpeeds("cpu", (PrecisionSpeed("bf16", "cpu", 0.05, 1.2, False),))
    monkeypatch.setattr(quant_tradeoff, "measure_precision_speeds", lambda device: emulated)
    timed: list[int] = []
    speed = quant_tradeoff.greedy_and_speed
    monkeypatch.setattr(
        quant_tradeoff,
        "greedy_and_speed",
        lambda model, prompts, new_tokens, repeats: (
            timed.append(repeats) or speed(model, prompts, new_tokens, repeats)
        ),
    )
    tokenizer, test = text
    settings = QuantizeConfig(methods=["bf16"], max_test_tokens=64, emulated_test_tokens=16, new_tokens=4)
    stream, model = open_tokens(test), small_model()
    fp32, bf16 = quant_tradeoff.measure_tradeoff(
        model, settings.methods, stream, tokenizer, settings, EvaluateConfig(), tmp_path
    )
    assert (fp32.test_tokens, bf16.test_tokens) == (64, 16)
    assert timed == [settings.repeats, 1], "fp32 timed as configured, the emulated row once"
    nats, predicted = summed_nats(model, stream.tokens, 8, 16)
    assert predicted == 16
    assert bf16.test_loss_delta == pytest.approx(bf16.test_loss - nats / predicted, abs=1e-9)
    assert fp32.test_loss != pytest.approx(nats / predicted, abs=1e-6), "the prefix differs from fp32's own"
    table = quant_tradeoff.tradeoff_markdown([fp32, bf16], {})
    assert "bf16: quality on the test split's first 16 tokens, its changes against fp32 on the same" in table


@needs_torchao
@pytest.mark.parametrize("native", [False, True])
def test_int8_dynamic_is_measured_briefly_where_the_cpu_has_no_int8_dot_products(
    text, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    """Without VNNI or AMX its int8 matmuls take a fallback path (13x slower than fp32 on an AVX2 EPYC):
    emulated, like bf16 without AVX512-BF16, so measured on `emulated_test_tokens` and said so."""
    from gptcore.eval import quant_tradeoff

    flags = "avx2 avx512f avx512_vnni" if native else "avx2"  # as cpu_features() names those present
    monkeypatch.setattr(quant_tradeoff, "cpu_features", lambda: {"cpu_flags": flags})
    tokenizer, test = text
    settings = QuantizeConfig(
        methods=["int8-dynamic"], max_test_tokens=64, emulated_test_tokens=16, new_tokens=4
    )
    fp32, int8 = quant_tradeoff.measure_tradeoff(
        small_model(), settings.methods, open_tokens(test), tokenizer, settings, EvaluateConfig(), tmp_path
    )
    table = quant_tradeoff.tradeoff_markdown([fp32, int8], {})
    if native:
        assert int8.emulated is None and (fp32.test_tokens, int8.test_tokens) == (64, 64)
        assert "| int8-dynamic |" in table
        return
    assert int8.emulated == (
        "int8-dynamic on cpu: int8 matmuls (emulated: this CPU has no avx512_vnni or avx_vnni or amx_int8)"
    )
    assert (fp32.test_tokens, int8.test_tokens) == (64, 16) and int8.test_loss_delta is not None
    assert "| int8-dynamic (emulated) |" in table
    assert f"{int8.emulated}: its speed columns are this CPU's stand-in, not the format's." in table
    assert quant_tradeoff._emulated("int8-dynamic", "cuda") is None
    assert quant_tradeoff._emulated("int8-weight-only", "cpu") is None, "its matmuls are fp32's"
    monkeypatch.setattr(quant_tradeoff, "cpu_features", lambda: {"cpu_flags": "none of avx2 avx512f"})
    assert quant_tradeoff._emulated("int8-dynamic", "cpu") is None, "flags unknown here: nothing claimed"


@needs_torchao
def test_int4_packs_every_block_layer_in_groups_that_divide_it(tmp_path: Path) -> None:
    from gptcore.model.quantization import int4_group_size

    model = small_model()
    assert int4_group_size(model) == 64, "n_embd 64: 128 does not divide it, 64 does"
    int4 = quantized(model, "int4-weight-only")
    weights = [
        m.weight for name, m in int4.named_modules() if isinstance(m, torch.nn.Linear) and name != "lm_head"
    ]
    assert weights and all(type(w).__name__ == "Int4OpaqueTensor" for w in weights), "none left in fp32"
    assert int4.lm_head.weight is int4.transformer.wte.weight and int4.lm_head.weight.dtype == torch.float32
    block = sum(w.numel() for w in weights) * 4  # their fp32 bytes
    quantized_block = weight_bytes(int4) - weight_bytes(model) + block
    assert quantized_block < 0.2 * block, "4 bits a weight and a scale and zero point a group of 64"
    odd = GPT(ModelConfig(**{**SMALL.model_dump(), "n_embd": 48, "n_head": 2}))
    with pytest.raises(
        NotImplementedError, match="no group size of 128, 64, 32 divides every layer's in-features"
    ):
        quantized(odd, "int4-weight-only")


def test_an_unknown_method_fails_validation_with_the_allowed_list() -> None:
    allowed = "'fp32', 'bf16', 'int8-weight-only', 'int8-dynamic' or 'int4-weight-only'"
    with pytest.raises(ValidationError, match=allowed):
        QuantizeConfig(methods=["int4"])
    with pytest.raises(ValidationError, match="may_hold_champion needs max_test_tokens unset"):
        QuantizeSection(methods=["bf16"], may_hold_champion=True, max_test_tokens=100)
