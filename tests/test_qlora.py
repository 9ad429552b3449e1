"""QLoRA: LoRA's adapters over a base whose adapted layers hold their weights in int8. It starts at the
dequantized base, trains only the adapters (in fp32), resumes exactly from checkpoints torch loads with
weights_only, merges into a plain model computing what was trained, and is refused in one line where it
cannot run."""

from __future__ import annotations

import copy
import json
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch
from torch import nn

from gptcore.checkpoint.files import load_checkpoint
from gptcore.errors import CheckpointError, ConfigError
from gptcore.finetune.config import LoRAConfig, QLoRAConfig
from gptcore.finetune.lora import apply_lora, lora_layers, trainable_parameters
from gptcore.finetune.qlora import QuantizedLinear, check_available
from gptcore.finetune.start import adapt, start_from, start_identity
from gptcore.model.gpt import GPT
from gptcore.train.trainer import train
from tasks.params.schema import FinetuneConfig
from tests import test_finetune
from tests.test_finetune import LORA, finetune
from tests.test_lora import EVERY, base_model, tokens
from tests.test_trainer import TINY, Recorder

QLORA = QLoRAConfig(**LORA.model_dump())
base = test_finetune.base  # the same 'trained' base's model files (a module-scoped fixture)
needs_torchao = pytest.mark.skipif(
    find_spec("torchao") is None, reason="the quant extra (pip install -e '.[quant]') is not installed"
)


def qlora_model(seed: int = 0) -> GPT:
    model = base_model(seed)
    adapt(model, QLoRAConfig(**EVERY.model_dump()))
    return model


def quantized_layers(model: nn.Module) -> dict[str, QuantizedLinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, QuantizedLinear)}


@needs_torchao
def test_the_base_holds_int8_weights_and_the_model_starts_at_the_dequantized_base() -> None:
    base_fp32, model = base_model(), qlora_model()
    layers = quantized_layers(model)
    assert len(layers) == 4 * TINY.n_layer and all(name.endswith(".base") for name in layers)
    assert all(layer.weight.qdata.dtype == torch.int8 for layer in layers.values())
    dequantized = copy.deepcopy(base_fp32)
    with torch.no_grad():
        for name, layer in layers.items():
            dequantized.get_submodule(name.removesuffix(".base")).weight.copy_(layer.dequantized())
    x, _ = tokens()
    with torch.no_grad():
        logits, reference, fp32 = model(x)[0], dequantized(x)[0], base_fp32(x)[0]
    assert (logits - reference).abs().max() < 1e-5, "B starts at zero: the dequantized base's outputs"
    assert 0 < (logits - fp32).abs().max() < 0.05, "int8 with a scale a row: close to the fp32 base"


@needs_torchao
def test_only_the_fp32_adapters_train_and_the_loss_falls() -> None:
    model, lora = qlora_model(), base_model()
    apply_lora(lora, EVERY)
    assert trainable_parameters(model)[0] == trainable_parameters(lora)[0], "LoRA's adapters, no more"
    frozen = {name: layer.weight.qdata.clone() for name, layer in quantized_layers(model).items()}
    trained = [p for p in model.parameters() if p.requires_grad]
    assert all(p.dtype == torch.float32 for p in trained)
    optimizer = torch.optim.AdamW(trained, lr=1e-2)
    x, y = tokens()
    model.train()
    losses = []
    for _ in range(6):
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1
    moments = [t for state in optimizer.state.values() for t in state.values() if t.dim() > 0]
    assert moments and all(t.dtype == torch.float32 for t in moments)
    for name, layer in quantized_layers(model).items():
        assert torch.equal(layer.weight.qdata, frozen[name]), f"{name} changed"


@needs_torchao
def test_the_backward_keeps_no_fp32_copy_of_a_quantized_weight() -> None:
    model = qlora_model().train()
    shapes = {tuple(layer.weight.shape) for layer in quantized_layers(model).values()}
    shapes |= {shape[::-1] for shape in shapes}
    kept: list[tuple[int, ...]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.is_floating_point():
            kept.append(tuple(tensor.shape))
        return tensor

    x, y = tokens()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        _, loss = model(x, y)
    loss.backward()
    assert kept and not shapes & set(kept), "a frozen weight's fp32 copy would double the base's memory"


@needs_torchao
def test_a_killed_qlora_fine_tune_resumes_bit_for_bit(tmp_path: Path, base: Path) -> None:
    whole, broken, resumed = Recorder(), Recorder(stop_at=6), Recorder()
    train(finetune(tmp_path / "whole", base, lora=QLORA), whole)
    with pytest.raises(KeyboardInterrupt):
        train(finetune(tmp_path / "broken", base, lora=QLORA), broken)
    train(finetune(tmp_path / "broken", base, lora=QLORA, resume=True), resumed)
    assert resumed.of("start")[0]["start_step"] == 4
    assert resumed.losses() == whole.losses()[4:], "adapters, optimizer, RNG and data position restored"
    ends = [load_checkpoint(tmp_path / run / "final.pt")["model"] for run in ("whole", "broken")]
    assert ends[0].keys() == ends[1].keys()
    assert all(torch.equal(ends[0][key], ends[1][key]) for key in ends[0])
    assert ends[0]["transformer.h.0.attn.c_attn.base.weight.qdata"].dtype == torch.int8
    assert "transformer.h.0.attn.c_attn.base.weight" not in ends[0], "plain tensors: weights_only loads"
    assert load_checkpoint(tmp_path / "whole" / "final.pt")["optimizer"]["state"][0]["exp_avg"].dtype == (
        torch.float32
    )
    as_lora = finetune(tmp_path / "broken", base, lora=LORA, resume=True)
    with pytest.raises(CheckpointError, match=r"lora.quantized_base: 'int8-weight-only' -> None"):
        train(as_lora, Recorder())


@needs_torchao
def test_the_merge_folds_the_adapters_into_the_dequantized_weights(tmp_path: Path, base: Path) -> None:
    from gptcore.checkpoint.load import load_model
    from gptcore.checkpoint.merge import ADAPTER_CONFIG, merge_checkpoint, write_adapter

    train(finetune(tmp_path / "run", base, lora=QLORA), Recorder())
    adapted = tmp_path / "run" / "final.pt"
    path = merge_checkpoint(adapted, tmp_path / "merged")
    plain, record = load_model(path)
    assert lora_layers(plain) == [] and not quantized_layers(plain)
    assert set(load_checkpoint(path)["model"]) == set(GPT(TINY).state_dict()), "the base's shape, fp32"
    assert record.merged_from is not None and record.merged_from.adapters.model_dump()["quantized_base"] == (
        "int8-weight-only"
    )
    model = GPT(TINY)
    start_from(model, TINY, base, QLORA)
    model.load_state_dict(load_checkpoint(adapted)["model"])
    layer = dict(lora_layers(model))["transformer.h.0.mlp.c_fc"]
    expected = layer.base.dequantized() + layer.delta()
    assert torch.allclose(plain.get_submodule("transformer.h.0.mlp.c_fc").weight, expected, atol=1e-6)
    x = torch.randint(0, TINY.vocab_size, (2, TINY.block_size))
    with torch.no_grad():
        assert torch.allclose(model.eval()(x)[0], plain(x)[0], atol=1e-5), "it computes what was trained"
    adapter = write_adapter(adapted, tmp_path / "adapter")
    described = json.loads(adapter.with_name(ADAPTER_CONFIG).read_text())
    assert described["method"] == "qlora" and described["quantized_base"] == "int8-weight-only"
    assert described["r"] == QLORA.r


def test_qlora_is_refused_in_one_line_where_it_cannot_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, base: Path
) -> None:
    import gptcore.model.quantization

    refusal = r"^finetune.method: value qlora is not allowed: "
    with pytest.raises(ConfigError, match=refusal + r"torchao's int8 kernels run on cpu and cuda, not mps"):
        check_available(QLORA, "mps")

    def missing() -> None:
        raise ImportError("No module named 'torchao'")

    monkeypatch.setattr(gptcore.model.quantization, "torchao", missing)
    with pytest.raises(
        ConfigError, match=refusal + r"torchao is not installed .*; allowed here: lora, full$"
    ) as refused:
        train(finetune(tmp_path, base, lora=QLORA), Recorder())
    assert len(str(refused.value).splitlines()) == 1
    assert not (tmp_path / "final.pt").exists(), "refused before anything trained"


def test_qlora_is_compared_with_lora_and_full_and_says_so_in_its_identity() -> None:
    def tune(method: str, compare: bool = True) -> FinetuneConfig:
        return FinetuneConfig(name="notes", model="models:/m@champion", method=method, compare=compare)

    assert tune("qlora").methods() == ["qlora", "lora", "full"]
    assert tune("lora").methods() == ["lora", "full"] and tune("full").methods() == ["full", "lora"]
    assert tune("qlora", compare=False).methods() == ["qlora"]
    settings = tune("qlora").adapters()
    assert isinstance(settings, QLoRAConfig) and settings.r == LoRAConfig().r
    assert type(tune("lora").adapters()) is LoRAConfig and tune("full").adapters() is None
    assert start_identity(None, settings)["lora.quantized_base"] == "int8-weight-only"
    assert "lora.quantized_base" not in start_identity(None, tune("lora").adapters())


def test_a_launched_rank_rebuilds_a_qlora_job(tmp_path: Path) -> None:
    from gptcore.runtime.config import RuntimeConfig
    from gptcore.train.config import TrainingConfig
    from gptcore.train.job import TrainJob
    from gptcore.train.multiprocess import load_job, read_job, save_job

    runtime = RuntimeConfig(device="cpu", precision="fp32", batch_size=2)
    job = TrainJob(
        model=TINY, runtime=runtime, training=TrainingConfig(max_steps=2), train_tokens=None, lora=QLORA
    )
    rank = load_job(read_job(save_job(job, tmp_path / "job")), world_size=2, rank=1)
    assert isinstance(rank.lora, QLoRAConfig) and rank.lora == QLORA, "a rank without it trains plain LoRA"


DATA_PARALLEL_PROBE = """
import json, torch
from gptcore.distributed.group import leave_rank, process_group
from gptcore.finetune.start import adapt
from gptcore.model.gpt import GPT
from gptcore.train.setup import data_parallel
from tests.test_qlora import QLORA, TINY

class Job:
    world_size = 2

class Runtime:
    device = "cpu"

with process_group("cpu") as world:
    torch.manual_seed(0)
    model = GPT(TINY)
    adapt(model, QLORA)
    torch.manual_seed(world.rank)
    with torch.no_grad():
        for parameter in (p for p in model.parameters() if p.requires_grad):
            parameter.normal_()  # the ranks' adapters differ: DDP starts them all from rank 0's
    replica = data_parallel(model, Job, Runtime)
    own = torch.Generator().manual_seed(world.rank)  # each rank its own batch
    x = torch.randint(0, TINY.vocab_size, (2, TINY.block_size), generator=own)
    replica(x, x)[1].backward()
    layer = model.transformer.h[0].attn.c_attn
    figures = {"a": layer.lora_a.sum().item(), "grad": layer.lora_b.grad.sum().item()}
    print(json.dumps({"rank": world.rank, **figures}))
leave_rank(0)
"""


@needs_torchao
@pytest.mark.slow
def test_data_parallel_ranks_share_the_adapters_and_leave_the_quantized_base_be() -> None:
    from tests.process_support import two_ranks
    from tests.test_distributed import ROOT

    codes, outputs = two_ranks(DATA_PARALLEL_PROBE, ROOT)
    assert codes == [0, 0], "torch cannot broadcast a torchao weight"
    results = [json.loads(output.splitlines()[-1]) for output in outputs]
    assert results[0]["a"] == results[1]["a"], "rank 0's adapters on every rank"
    assert results[0]["grad"] == pytest.approx(results[1]["grad"], abs=1e-6), "gradients averaged"


def test_a_qlora_parameter_file_trains_over_an_int8_base_and_is_checked_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gptcore.model.quantization
    from tasks.params.jobs import TrainingStart, train_job
    from tasks.params.loading import load_params
    from tasks.stages.finetune import check_quantized_base
    from tests.test_finetune_flow import finetune_params

    params = load_params(str(finetune_params(tmp_path)), ["finetune.method=qlora", "model=gpt_first_cpu"])
    assert params.finetune.methods() == ["qlora", "lora", "full"]
    start = TrainingStart(params.model, tmp_path / "base")  # what the base stage hands on from its files
    assert train_job(params, start=start, train_tokens=None).lora == QLoRAConfig(
        **params.finetune.lora.model_dump()
    )
    check_quantized_base(params)  # runtime.device cpu: torchao's int8 kernels are there
    monkeypatch.setattr(gptcore.model.quantization, "unavailable", lambda method, device: "no kernels")
    with pytest.raises(
        ConfigError, match=r"^finetune.method: value qlora is not allowed: no kernels; allowed"
    ):
        check_quantized_base(params)
