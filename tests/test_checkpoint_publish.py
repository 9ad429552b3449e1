"""A checkpoint is published as one unit: killed at any point while `best` (or `final`) is rewritten,
every reader (the evaluate stage, whose choice the export and quantize stages read; `gptpipe export`;
`gptpipe generate`; a resume) gets the checkpoint as it was or as it became, whole, its record agreeing
with its weights. And every reader passes over a pair an older gptpipe left cut short by the same rule."""

from __future__ import annotations

import itertools
import json
import logging
import os
from pathlib import Path

import pytest
import torch

from gptcore.checkpoint import files as ckpt
from gptcore.checkpoint.load import choose_checkpoint, load_model
from gptcore.checkpoint.record import CheckpointRecord
from gptcore.generate import generate_text
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT
from tasks.params.loading import PARAMS_DIR, load_params
from tasks.results import CheckpointsResult
from tasks.stages.reading import evaluated_checkpoint

TINY = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=300)
KILLED = 137
# The checkpoint rewritten: (its name, its step before, its step after), and the periodic one beside it.
REWRITES = {"best": (4, 8), "final": (6, 10)}
PERIODIC = 2


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(["def train(model):\n    return model\n"] * 20, trainer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def weights(step: int) -> dict[str, torch.Tensor]:
    """The model a checkpoint of `step` holds: each step's its own."""
    torch.manual_seed(step)
    return GPT(TINY).state_dict()


def save(directory: Path, name: str, step: int, tokenizer: Path) -> None:
    kind = "step" if name.startswith("step-") else name
    record = CheckpointRecord(
        kind, step, config={"seed": 1}, model_config=TINY, metadata={"tokenizer": str(tokenizer)}
    )
    ckpt.save_checkpoint(directory, name, {"model": weights(step), "step": step}, record)


def saved_in_a_child_killed_at(directory: Path, name: str, step: int, tokenizer: Path, rename: int) -> int:
    """Save `name` of `step` in a child process that dies just before its `rename`-th file rename
    (`os._exit`: no handler, no clean-up runs, as under `kill -9`). Its exit code: KILLED when it died
    there, 0 when the save had fewer renames and completed."""
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            renames, replace = itertools.count(), os.replace

            def dying(source: object, target: object) -> None:
                if next(renames) == rename:
                    os._exit(KILLED)
                replace(source, target)

            os.replace = dying
            save(directory, name, step, tokenizer)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def evaluate_params(name: str):
    params = load_params(PARAMS_DIR / "iteration_1.yaml", [])
    return params.model_copy(update={"evaluate": params.evaluate.model_copy(update={"checkpoint": name})})


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def steps_every_reader_gets(directory: Path, name: str, tokenizer: Path, scratch: Path) -> set[int]:
    """The step of the checkpoint each reader takes, each checked whole: `name` itself, its weights
    those of the step its record names."""
    from flows.cli.main import main

    taken = [
        evaluated_checkpoint(evaluate_params(name), CheckpointsResult(run_directory=str(directory))),
        choose_checkpoint(directory, name),  # gptpipe export, generate and merge of a folder
    ]
    steps = set()
    for path in taken:
        assert path == directory / f"{name}.pt"
        model, record = load_model(path)
        assert same(model.state_dict(), weights(record.step)), "the record and the weights agree"
        steps.add(record.step)
    greedy = {"max_new_tokens": 2, "temperature": 0.0, "checkpoint": name}
    steps.add(generate_text(directory, "def ", tokenizer, **greedy).step)
    export = ["export", "--checkpoint-directory", str(directory), "--checkpoint", name]
    assert main([*export, "--tokenizer", str(tokenizer), "--output", str(scratch / "hf")]) == 0
    if name == "final":  # a resume takes the newest periodic or final checkpoint: final here
        path, record, state = ckpt.load_latest_valid(directory)
        assert path == directory / "final.pt" and same(state["model"], weights(record.step))
        steps.add(record.step)
    return steps


@pytest.mark.parametrize("name", sorted(REWRITES))
def test_a_kill_at_any_point_of_rewriting_a_checkpoint_leaves_every_reader_the_old_or_the_new_one_whole(
    tmp_path: Path, tokenizer: Path, name: str
) -> None:
    before, after = REWRITES[name]
    taken: list[int] = []
    for rename in itertools.count():
        directory = tmp_path / f"killed-at-rename-{rename}"
        save(directory, ckpt.step_name(PERIODIC), PERIODIC, tokenizer)
        save(directory, name, before, tokenizer)
        code = saved_in_a_child_killed_at(directory, name, after, tokenizer, rename)
        assert code in (KILLED, 0)
        steps = steps_every_reader_gets(directory, name, tokenizer, tmp_path / f"scratch-{rename}")
        assert len(steps) == 1 and steps <= {before, after}, f"killed before rename {rename}: {steps}"
        taken.append(steps.pop())
        save(directory, name, after + 1, tokenizer)  # the next run's save, over whatever the kill left
        assert ckpt.damage(directory / f"{name}.pt") is None
        assert json.loads((directory / f"{name}.json").read_text())["step"] == after + 1
        assert "previous" not in json.loads((directory / f"{name}.json").read_text())
        if code == 0:
            break
    assert taken[0] == before and taken[-1] == after and rename >= 2, "killed before, within and after"
    assert taken == sorted(taken), "once the new one is read, never the old one again"


def test_every_reader_passes_over_a_pair_an_older_gptpipe_left_cut_short_for_the_newest_whole_one(
    tmp_path: Path, tokenizer: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An older gptpipe killed between `best.pt` and `best.json`: the pair disagrees. Evaluate, export
    and generate all take `final` instead, each saying why; none refuses."""
    from flows.cli.main import main

    save(tmp_path, "best", 4, tokenizer)
    save(tmp_path, "final", 6, tokenizer)
    torch.save({"model": weights(8), "step": 8}, tmp_path / "best.pt")  # its record not written yet
    assert evaluated_checkpoint(evaluate_params("best"), CheckpointsResult(run_directory=str(tmp_path))) == (
        tmp_path / "final.pt"
    )
    with caplog.at_level(logging.WARNING):
        assert generate_text(tmp_path, "def ", tokenizer, 2, 0.0, checkpoint="best").step == 6
        export = ["export", "--checkpoint-directory", str(tmp_path), "--tokenizer", str(tokenizer)]
        assert main([*export, "--output", str(tmp_path / "hf")]) == 0  # --checkpoint best, the default
    said = [r.getMessage() for r in caplog.records]
    expected = (
        f"warning: {tmp_path / 'best.pt'}: checkpoint is corrupted (content sha256 differs from its "
        "record); taking final.pt instead"
    )
    assert said.count(expected) == 2, said
    assert json.loads((tmp_path / "final.json").read_text())["step"] == 6
