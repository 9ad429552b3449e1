"""Fine-tuning through the trainer: a run starts from a trained model's files, trains LoRA adapters on
it (the base frozen), resumes exactly like any run, and refuses weights of another shape. Its adapted
checkpoints are merged by one explicit step into plain ones, the only kind a reader takes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gptcore.checkpoint.files import load_checkpoint
from gptcore.errors import CheckpointError, ConfigError
from gptcore.export.model_files import write_model_files
from gptcore.finetune.config import LoRAConfig
from gptcore.finetune.lora import lora_layers, merge_lora
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT
from gptcore.train.trainer import train
from tests.test_trainer import TINY, Recorder, job

LORA = LoRAConfig(r=4, alpha=8.0, dropout=0.0, targets=["attn.c_attn", "mlp.c_fc"])


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 'trained' base model's files: a short run's weights, written as the pipeline writes them."""
    recorder = Recorder()
    folder = tmp_path_factory.mktemp("base")
    train(job(folder / "run", training={"max_steps": 6}), recorder)
    model = GPT(TINY)
    state = load_checkpoint(folder / "run" / "final.pt")["model"]
    model.load_state_dict(state)
    write_model_files(model, None, folder / "model")
    return folder / "model"


def finetune(directory: Path | None, base: Path, **changes) -> object:
    training = {"max_steps": 8, "checkpoint_every": 4, "eval_every": 4, "eval_at_start": True}
    return job(directory, init_weights=base, training=training, **{"lora": LORA, **changes})


def test_a_lora_fine_tune_starts_at_the_base_and_trains_only_the_adapters(tmp_path: Path, base: Path) -> None:
    plain, tuned = Recorder(), Recorder()
    train(job(None, init_weights=base, training={"max_steps": 1, "eval_at_start": True}), plain)
    train(finetune(tmp_path, base), tuned)
    start = tuned.of("start")[0]
    n = TINY.n_embd
    assert start["trainable_parameter_count"] == TINY.n_layer * (4 * (n + 3 * n) + 4 * (n + 4 * n))
    assert start["trainable_parameter_count"] < start["parameter_count"] // 10
    baseline = tuned.of("eval")[0]["val_loss"]
    assert baseline == pytest.approx(plain.of("eval")[0]["val_loss"], abs=1e-5), "it starts at the base"
    assert tuned.of("eval")[-1]["val_loss"] < baseline, "and learns"
    final = load_checkpoint(tmp_path / "final.pt")["model"]
    base_key = "transformer.h.0.attn.c_attn.base.weight"
    from safetensors.torch import load_file

    assert torch.equal(
        final[base_key], load_file(base / "model.safetensors")["transformer.h.0.attn.c_attn.weight"]
    )


def test_a_killed_fine_tune_resumes_bit_for_bit(tmp_path: Path, base: Path) -> None:
    whole, broken, resumed = Recorder(), Recorder(stop_at=6), Recorder()
    train(finetune(tmp_path / "whole", base), whole)
    with pytest.raises(KeyboardInterrupt):
        train(finetune(tmp_path / "broken", base), broken)
    train(finetune(tmp_path / "broken", base, resume=True), resumed)
    assert resumed.of("start")[0]["start_step"] == 4
    assert resumed.losses() == whole.losses()[4:], "adapters, optimizer, RNG and data position restored"
    other = finetune(tmp_path / "broken", base, resume=True, lora=LORA.model_copy(update={"r": 2}))
    with pytest.raises(CheckpointError):
        train(other, Recorder())


def test_the_fine_tuned_model_merges_into_a_plain_model_of_the_base_shape(tmp_path: Path, base: Path) -> None:
    from gptcore.finetune.start import start_from

    train(finetune(tmp_path, base), Recorder())
    model = GPT(TINY)
    start_from(model, TINY, base, LORA)
    model.load_state_dict(load_checkpoint(tmp_path / "final.pt")["model"])
    x = torch.randint(0, TINY.vocab_size, (2, TINY.block_size))
    with torch.no_grad():
        adapted = model.eval()(x)[0]
        merged = merge_lora(model)(x)[0]
    assert lora_layers(model) == [] and torch.allclose(adapted, merged, atol=1e-5)


def test_readers_refuse_an_adapted_checkpoint_until_the_merge_step_makes_it_plain(
    tmp_path: Path, base: Path
) -> None:
    from gptcore.checkpoint.files import checkpoint_metadata
    from gptcore.checkpoint.load import checkpoint_model_files, load_model
    from gptcore.checkpoint.merge import merge_checkpoint
    from gptcore.finetune.start import start_from

    train(finetune(tmp_path / "run", base), Recorder())
    adapted = tmp_path / "run" / "final.pt"
    with pytest.raises(CheckpointError, match=r"final.pt: a LoRA fine-tune's checkpoint, .*\(gptpipe merge"):
        load_model(adapted)
    with pytest.raises(CheckpointError, match=r"gptpipe merge --checkpoint-file .*final.pt"):
        checkpoint_model_files(adapted, tmp_path / "files")

    path = merge_checkpoint(adapted, tmp_path / "merged")
    plain, record = load_model(path)
    assert path == tmp_path / "merged" / "final.pt" and lora_layers(plain) == []
    assert record.step == checkpoint_metadata(adapted).step == 8
    assert record.merged_from is not None and record.merged_from.sha256 == checkpoint_metadata(adapted).sha256
    assert record.merged_from.adapters.r == LORA.r
    assert not any(key.startswith("lora.") for key in record.config or {}), "nothing says adapted any more"
    assert checkpoint_metadata(adapted).adapted and not record.adapted
    model = GPT(TINY)
    start_from(model, TINY, base, LORA)
    model.load_state_dict(load_checkpoint(adapted)["model"])
    x = torch.randint(0, TINY.vocab_size, (2, TINY.block_size))
    with torch.no_grad():
        assert torch.allclose(model.eval()(x)[0], plain(x)[0], atol=1e-5), "it computes what was trained"
    with pytest.raises(CheckpointError, match=r"a plain model's checkpoint, no LoRA adapters in it to merge"):
        merge_checkpoint(path, tmp_path / "again")


def test_weights_of_another_architecture_are_refused_before_training(tmp_path: Path) -> None:
    wider = GPT(ModelConfig(**{**TINY.model_dump(), "n_embd": 64}))
    write_model_files(wider, None, tmp_path / "wider")
    with pytest.raises(
        ConfigError,
        match=r"^model: the weights in .* are of another architecture: n_embd 64 \(this run: 32\)",
    ):
        train(job(None, init_weights=tmp_path / "wider"), Recorder())
    # ReLU²'s weights have GELU's shapes: they would load, and train another function than they learned.
    relu2 = GPT(ModelConfig(**{**TINY.model_dump(), "mlp": "relu2"}))
    write_model_files(relu2, None, tmp_path / "relu2")
    with pytest.raises(ConfigError, match=r"are of another architecture: mlp relu2 \(this run: gelu\)"):
        train(job(None, init_weights=tmp_path / "relu2"), Recorder())
    with pytest.raises(ConfigError, match=r"no fp32 model weights \(model.safetensors\) to start from"):
        train(job(None, init_weights=tmp_path / "nothing-here"), Recorder())


def test_gptpipe_merge_makes_the_checkpoint_export_refused_until_then(
    tmp_path: Path, base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from flows.cli.main import main
    from gptcore.checkpoint.load import load_model

    train(finetune(tmp_path / "run", base), Recorder())
    export = ["export", "--checkpoint-directory", str(tmp_path / "run"), "--output", str(tmp_path / "hf")]
    assert main([*export, "--checkpoint", "final"]) != 0
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "gptpipe merge --checkpoint-file" in error
    assert not (tmp_path / "hf").exists()

    assert main(["merge", "--checkpoint-directory", str(tmp_path / "run"), "--checkpoint", "final"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["merged"] == str(tmp_path / "run" / "merged" / "final.pt")
    assert Path(said["adapter"]) == tmp_path / "run" / "merged" / "final-adapter" / "adapter.safetensors"
    assert lora_layers(load_model(Path(said["merged"]))[0]) == []

    assert main(["merge", "--checkpoint-file", said["merged"]]) != 0
    assert "a plain model's checkpoint, no LoRA adapters in it to merge" in capsys.readouterr().err
    assert main(["merge"]) == 2
    assert "give one of --checkpoint-directory or --checkpoint-file" in capsys.readouterr().err
