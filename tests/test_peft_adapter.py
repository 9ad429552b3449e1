"""A LoRA fine-tune's adapter in PEFT's format, proven with `peft` itself, offline: loaded by
`PeftModel.from_pretrained` onto the Hugging Face export of the base it applies to, it computes the
logits gptpipe's adapted model computes, in GPT-2's layout (the fused `c_attn` over Conv1D weights), in
Llama's and Qwen3's (the fused linears split), with a trained embedding, and for QLoRA over the
dequantized base."""

from __future__ import annotations

import copy
import json
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch

from gptcore.checkpoint.files import load_checkpoint
from gptcore.checkpoint.merge import PEFT, adapter_of, merge_checkpoint, write_adapter
from gptcore.errors import CheckpointError, ConfigError
from gptcore.finetune.config import LoRAConfig, QLoRAConfig
from gptcore.finetune.lora import adapter_state_dict, apply_lora, lora_layers, merge_lora
from gptcore.finetune.peft import PEFT_CONFIG, PEFT_WEIGHTS
from gptcore.finetune.start import start_from
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT
from gptcore.train.trainer import train
from tasks.stages.export import export_checkpoint, export_part
from tests import test_finetune
from tests.test_finetune import finetune
from tests.test_hf_export_modern import LLAMA, perturbed, tokenizer
from tests.test_trainer import TINY, Recorder

transformers = pytest.importorskip("transformers")  # the `hf` extra, which `make test` installs
peft = pytest.importorskip("peft")

SHAPE = {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 32, "vocab_size": 300}
EVERY = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
base = test_finetune.base  # a 'trained' base's model files (module-scoped fixture)
__all__ = ["tokenizer"]  # the 300-id tokenizer fixture, shared with the modern export's tests


def adapted(config: ModelConfig, settings: LoRAConfig) -> GPT:
    """A perturbed model with adapters whose B (and the embedding, where it trains) are off their
    init, so an adapter PEFT dropped, misplaced or scaled wrongly shows in the logits."""
    model = perturbed(config)
    apply_lora(model, settings)
    with torch.no_grad():
        for _, layer in lora_layers(model):
            layer.lora_b.normal_(0.0, 0.05)
        if settings.train_embedding:
            model.transformer.wte.weight.add_(0.1 * torch.randn_like(model.transformer.wte.weight))
    return model.eval()


def peft_logits(base_folder: Path, adapter_folder: Path, ids: torch.Tensor) -> torch.Tensor:
    loaded = transformers.AutoModelForCausalLM.from_pretrained(base_folder, local_files_only=True)
    tuned = peft.PeftModel.from_pretrained(loaded, adapter_folder).eval()
    with torch.no_grad():
        return tuned(ids).logits


def window(vocab_size: int, length: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (2, length), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    ("recipe", "targets", "train_embedding", "modules"),
    [
        ({}, EVERY, False, ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]),
        ({"bias": False}, ["attn.c_attn"], True, ["attn.c_attn"]),
        ({**LLAMA, "bias": False}, EVERY, False,
         ["mlp.down_proj", "mlp.gate_proj", "mlp.up_proj", "self_attn.k_proj", "self_attn.o_proj",
          "self_attn.q_proj", "self_attn.v_proj"]),
        ({**LLAMA, "bias": True, "tie_embeddings": False}, ["attn.c_attn", "mlp.c_fc"], True,
         ["mlp.gate_proj", "mlp.up_proj", "self_attn.k_proj", "self_attn.q_proj", "self_attn.v_proj"]),
        ({**LLAMA, "bias": False, "qk_norm": True}, ["attn.c_attn", "mlp.c_proj"], True,
         ["mlp.down_proj", "self_attn.k_proj", "self_attn.q_proj", "self_attn.v_proj"]),
    ],
    ids=["gpt2", "gpt2-embedding", "llama", "llama-untied-embedding", "qwen3-embedding"],
)  # fmt: skip
def test_peft_loads_the_adapter_onto_the_exported_base_and_computes_what_gptpipe_computed(
    tmp_path: Path,
    tokenizer: Path,
    recipe: dict[str, object],
    targets: list[str],
    train_embedding: bool,
    modules: list[str],
) -> None:
    config = ModelConfig(**SHAPE, **recipe)
    settings = LoRAConfig(r=4, alpha=8.0, dropout=0.0, targets=targets, train_embedding=train_embedding)
    model = adapted(config, settings)
    adapter = (adapter_state_dict(model, train_embedding), settings)
    merged = merge_lora(copy.deepcopy(model))
    export_part("hf-base", merged, adapter, tokenizer, tmp_path / "base", False, None)
    export_part("peft", merged, adapter, None, tmp_path / "adapter", False, None)
    described = json.loads((tmp_path / "adapter" / PEFT_CONFIG).read_text())
    assert sorted(described["target_modules"]) == modules
    assert described["fan_in_fan_out"] is (config.position == "learned"), "GPT-2's Conv1D: (in, out)"
    ids = window(config.vocab_size, config.block_size)
    with torch.no_grad():
        ours, _ = model(ids, ids)  # targets given: the logits of every position
    assert (ours - peft_logits(tmp_path / "base", tmp_path / "adapter", ids)).abs().max().item() < 1e-4


def test_the_adapter_export_is_refused_where_no_adapter_is_and_into_a_folder_it_did_not_write(
    tmp_path: Path, tokenizer: Path, base: Path
) -> None:
    plain = base.parent / "run" / "final.pt"  # the base's own training: a plain model's checkpoint
    with pytest.raises(CheckpointError, match=r"final.pt: a plain model.s checkpoint, no LoRA adapters"):
        export_checkpoint(plain, tmp_path / "out", tokenizer, part="peft")
    assert not (tmp_path / "out").exists()
    settings = LoRAConfig(r=4, targets=["attn.c_attn"])
    model = adapted(ModelConfig(**SHAPE), settings)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    adapter = (adapter_state_dict(model), settings)
    with pytest.raises(ConfigError, match=r"^--output .*taken: exists and is not empty; choose another"):
        export_part("peft", model.config, adapter, None, taken, False, None)
    with pytest.raises(ConfigError, match=r"holds notes.txt, which no export wrote"):
        export_part("peft", model.config, adapter, None, taken, True, None)
    assert sorted(p.name for p in taken.iterdir()) == ["notes.txt"]


@pytest.mark.skipif(find_spec("torchao") is None, reason="the quant extra is not installed")
def test_a_qlora_adapter_in_peft_format_computes_the_fine_tune_on_the_dequantized_base(
    tmp_path: Path, tokenizer: Path, base: Path
) -> None:
    qlora = QLoRAConfig(r=4, alpha=8.0, dropout=0.0, targets=EVERY)
    train(finetune(tmp_path / "run", base, lora=qlora), Recorder())
    adapted_checkpoint = tmp_path / "run" / "final.pt"
    merged = merge_checkpoint(adapted_checkpoint, tmp_path / "merged")
    folder = write_adapter(adapted_checkpoint, tmp_path / "adapter").parent
    assert sorted(p.name for p in (folder / PEFT).iterdir()) == [PEFT_CONFIG, PEFT_WEIGHTS]
    from_merged, settings, _ = adapter_of(merged)  # the merged checkpoint carries its adapter
    from_adapted, _, _ = adapter_of(adapted_checkpoint)
    assert isinstance(settings, QLoRAConfig) and from_merged.keys() == from_adapted.keys()
    assert all(torch.equal(from_merged[name], from_adapted[name]) for name in from_adapted)
    export_checkpoint(merged, tmp_path / "base", tokenizer, part="hf-base")
    export_checkpoint(merged, tmp_path / "peft", part="peft")
    model = GPT(TINY)
    start_from(model, TINY, base, qlora)
    model.load_state_dict(load_checkpoint(adapted_checkpoint)["model"])
    ids = window(TINY.vocab_size, TINY.block_size)
    with torch.no_grad():
        ours, _ = model.eval()(ids, ids)
    for adapter in (folder / PEFT, tmp_path / "peft"):
        assert (ours - peft_logits(tmp_path / "base", adapter, ids)).abs().max().item() < 1e-4


def test_an_adapter_that_cannot_be_read_is_one_line_naming_what_the_user_named(
    tmp_path: Path, base: Path
) -> None:
    from gptcore.checkpoint import files as ckpt
    from gptcore.checkpoint.merge import ADAPTER_CONFIG, read_adapter_files
    from gptcore.errors import DataError

    train(finetune(tmp_path / "run", base), Recorder())
    merged = merge_checkpoint(tmp_path / "run" / "final.pt", tmp_path / "merged")
    state = load_checkpoint(merged)  # as an earlier gptpipe merged it: the weights alone
    record = ckpt.checkpoint_metadata(merged).unpublished()
    older, _ = ckpt.save_checkpoint(tmp_path / "older", "final", {"model": state["model"]}, record)
    with pytest.raises(CheckpointError, match=r"an earlier gptpipe.*gptpipe merge --checkpoint-file "):
        adapter_of(older)
    adapter = write_adapter(merged, tmp_path / "adapter")
    adapter.with_name(ADAPTER_CONFIG).write_text('{"r": "eight"}')
    with pytest.raises(DataError, match=r"^--model models:/x/1: adapter.safetensors: the adapter.s files"):
        read_adapter_files(adapter, source="--model models:/x/1")
