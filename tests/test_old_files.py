"""Files an older gptpipe wrote load unchanged: token files, checkpoints and logged models made with
gptcore's flat layout (before issue 27's rooms), kept in `tests/fixtures/`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlflow.pyfunc
import torch

from gptcore.model.config import ModelConfig
from gptcore.runtime.config import RuntimeConfig
from gptcore.train.config import OptimizerConfig, TrainingConfig
from gptcore.train.job import TrainJob
from gptcore.train.trainer import train

FIXTURES = Path(__file__).parent / "fixtures"


def test_a_checkpoint_on_token_files_of_the_flat_layout_resumes_to_the_run_s_final_weights(
    tmp_path: Path,
) -> None:
    old = FIXTURES / "run_before_issue_27"
    shutil.copytree(old / "checkpoints", tmp_path / "checkpoints")
    job = TrainJob(  # the run that wrote them (see the fixture's README)
        model=ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=260),
        runtime=RuntimeConfig(device="cpu", precision="fp32", batch_size=4),
        training=TrainingConfig(
            max_steps=8,
            log_every=1,
            eval_every=4,
            checkpoint_every=4,
            keep_last=1,
            optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=2),
        ),
        train_tokens=old / "tokens" / "train.bin",
        validation_tokens=old / "tokens" / "validation.bin",
        checkpoint_directory=tmp_path / "checkpoints",
        resume=True,
    )
    summary = train(job)
    assert (summary.start_step, summary.steps) == (4, 8)
    resumed = torch.load(summary.final_checkpoint, weights_only=True)["model"]
    then = torch.load(old / "final_of_the_uninterrupted_run.pt", weights_only=True)["model"]
    # The same weights up to the order a machine's threads sum in (bit for bit on the machine and thread
    # count that wrote the fixture: 9e-8 apart here on one thread, the weights' scale is 1).
    torch.testing.assert_close(resumed, then, rtol=0, atol=1e-5)


def test_a_model_logged_before_gptcore_moved_into_subpackages_loads_and_completes_as_it_did() -> None:
    logged = FIXTURES / "model_logged_before_issue_27"  # its loader imports gptcore.generate, .model_files
    expected = json.loads((logged / "expected.json").read_text())
    model = mlflow.pyfunc.load_model(str(logged))
    assert model.predict(expected["prompts"], params=expected["params"]) == expected["completions"]
