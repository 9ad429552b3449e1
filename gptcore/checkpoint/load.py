"""A trained model from a checkpoint folder: which checkpoint (`final`, `best`, `latest`, `auto`) and
the model it holds, ready for inference or as model files.

Every reader takes a plain model. A LoRA fine-tune's checkpoints hold the adapted model whole (frozen
base and adapters), for the trainer to resume exactly; they are read once more, by the merge step
(`gptcore.checkpoint.merge`, `gptpipe merge`), and refused here with the command that merges them.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from gptcore.checkpoint import files as ckpt
from gptcore.checkpoint.record import CheckpointRecord
from gptcore.errors import CheckpointError
from gptcore.export.model_files import WEIGHTS, ModelFiles, checkpoint_tokenizer, with_config
from gptcore.model.gpt import GPT

# What each choice tries before the periodic and final checkpoints the manifest lists, newest first.
NAMED = {"best": ("best", "final"), "final": ("final",), "auto": ("final",), "latest": ()}
log = logging.getLogger(__name__)


def choose_checkpoint(directory: Path, name: str = "auto") -> Path:
    """`whole_checkpoint`'s choice, a warning naming each checkpoint passed over and why."""
    path, passed_over = whole_checkpoint(directory, name)
    if passed_over:
        log.warning("warning: %s; taking %s instead", "; ".join(passed_over), path.name)
    return path


def whole_checkpoint(directory: Path, name: str = "auto") -> tuple[Path, list[str]]:
    """The rule every reader of a checkpoint folder takes one by: the first whole one (`files.damage`)
    of `name` (`best`, `final`; `auto`: final), final, then the newest periodic or final one (`latest`
    starts there). Returns it and why each before it was passed over (a named one missing included); a
    CheckpointError when none is there or none is whole."""
    directory = Path(directory)
    if name not in NAMED:
        raise CheckpointError(f"--checkpoint {name!r}: expected auto, final, best or latest")
    candidates = [directory / f"{each}.pt" for each in NAMED[name]] + ckpt.resume_candidates(directory)
    present = [path for path in dict.fromkeys(candidates) if path.is_file()]
    if not present:
        raise CheckpointError(
            f"{directory}: no {name} checkpoint there (train with --checkpoint-directory first)"
        )
    missing = name in ("best", "final") and candidates[0] not in present
    passed_over = [f"{candidates[0]}: checkpoint not found"] if missing else []
    for path in present:
        problem = ckpt.damage(path)
        if problem is None:
            return path, passed_over
        passed_over.append(problem)
    raise CheckpointError(f"{directory}: no whole checkpoint there: {'; '.join(passed_over)}")


def load_model(path: Path, device: str = "cpu") -> tuple[GPT, CheckpointRecord]:
    """The model of a plain checkpoint and the record of the very weights loaded (`read_checkpoint`)."""
    plain_record(path)  # an adapted checkpoint is refused before its weights are read
    payload, record = ckpt.read_checkpoint(path)
    model = GPT(plain_record(path, record).architecture(path))
    model.load_state_dict(payload["model"])
    return model.to(device).eval(), record


def plain_record(path: Path, record: CheckpointRecord | None = None) -> CheckpointRecord:
    """The record of a checkpoint that holds a plain model (`record`, else its sidecar's); a
    CheckpointError naming the merge for a LoRA fine-tune's adapted checkpoint."""
    record = record if record is not None else ckpt.checkpoint_metadata(path)
    if holds_adapters(record):
        raise CheckpointError(
            f"{path}: a LoRA fine-tune's checkpoint, its adapters not merged into the weights: merge it "
            f"first (gptpipe merge --checkpoint-file {path})"
        )
    return record


def holds_adapters(record: CheckpointRecord) -> bool:
    """Whether a checkpoint's record is a LoRA run's, whose model is adapted, not merged."""
    return record.adapted


def checkpoint_model_files(checkpoint: Path, folder: Path) -> tuple[ModelFiles, CheckpointRecord]:
    """A checkpoint's model files and its record. The weights are written without building
    the model: no arithmetic on tensors, so the thread that calls this (the tracking writer's)
    never starts an OpenMP team of its own, which would slow every later torch call of the process's
    main thread (docs/benchmarks.md, Serving)."""
    from safetensors.torch import save_file

    from gptcore.checkpoint.merge import merged_adapter, write_adapter_files

    plain_record(checkpoint)  # an adapted checkpoint is refused before its weights are read
    payload, record = ckpt.read_checkpoint(checkpoint)  # the record of these very weights
    config = plain_record(checkpoint, record).architecture(checkpoint)
    state = dict(payload["model"])
    folder.mkdir(parents=True, exist_ok=True)
    adapter = None
    if record.merged_from is not None and "adapter" in payload:  # a merged fine-tune's: its adapter too
        settings = record.merged_from.adapters
        adapter = write_adapter_files(merged_adapter(payload, settings), settings, record, folder)
    if config.tie_embeddings:  # tied to `lm_head.weight`: once, as `save_model` keeps it
        state.pop("transformer.wte.weight", None)
    weights = folder / WEIGHTS
    save_file({name: tensor.contiguous() for name, tensor in state.items()}, str(weights))
    files = with_config(weights, config, checkpoint_tokenizer(record), folder, "fp32")
    return replace(files, adapter=adapter), record
