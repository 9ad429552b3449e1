"""The evaluate stage: the full run's chosen checkpoint measured on the held-out test split, and its
samples; cached on the checkpoint's content hash, the test token file's and the settings."""

from __future__ import annotations

from pathlib import Path

from gptcore.errors import CheckpointError
from gptcore.tools.atomic import write_json_atomic, write_text_atomic
from gptcore.tools.fingerprint import code_version_of, fingerprint
from tasks.caching import stage_task
from tasks.params.schema import PipelineParams
from tasks.results import CheckpointsResult, EvaluateResult, TokensResult, file_record
from tasks.stages.training import announce, run_directory

EVALUATION_FILE = "evaluation.json"
SAMPLES_FILE = "samples.md"
_FIGURES = (
    "test_loss",
    "test_perplexity",
    "test_bits_per_byte",
    "unigram_test_loss",
    "unigram_test_bits_per_byte",
    "test_tokens",
    "step",
)


def evaluated_checkpoint(params: PipelineParams, full: CheckpointsResult) -> Path:
    """The checkpoint `evaluate.checkpoint` names in the trained (or merged) folder (best, else final);
    one that is damaged (a write cut short between its two files) is passed over for the newest whole
    one, with a line saying so, so a retry never fails on it forever."""
    from gptcore.checkpoint.files import damage, named_checkpoint, resume_candidates

    directory = Path(full.run_directory)
    named = [
        named_checkpoint(directory, name) for name in dict.fromkeys((params.evaluate.checkpoint, "final"))
    ]
    candidates = [path for path in dict.fromkeys([*named, *resume_candidates(directory)]) if path is not None]
    if not candidates:
        raise CheckpointError(f"{directory}: no {params.evaluate.checkpoint} or final checkpoint to evaluate")
    problems = []
    for path in candidates:
        problem = damage(path)
        if problem is None:
            if problems:
                announce(f"evaluate: {'; '.join(problems)}; evaluating {path.name} instead")
            return path
        problems.append(problem)
    raise CheckpointError(f"{directory}: no whole checkpoint to evaluate: {'; '.join(problems)}")


def checkpoint_digest(full: CheckpointsResult, checkpoint: Path) -> str:
    """The checkpoint's sha256 as the stage that wrote it recorded it (checked unchanged when it was
    taken from the cache), else computed."""
    from gptcore.tools.fingerprint import sha256_file

    return full.files.get(str(checkpoint)) or sha256_file(checkpoint)


def evaluate_fingerprint(params: PipelineParams, tokens: TokensResult, digest: str, device: str) -> str:
    import gptcore.data.batches
    import gptcore.eval.held_out
    import gptcore.generate
    import gptcore.model.gpt
    import gptcore.train.validate

    code = code_version_of(
        gptcore.eval.held_out,
        gptcore.generate,
        gptcore.train.validate,
        gptcore.model.gpt,
        gptcore.data.batches,
    )
    return fingerprint(
        "evaluate",
        digest,
        tokens.files.get(tokens.test),
        tokens.files.get(tokens.train),  # the unigram baseline's counts
        params.evaluate.model_dump(),
        device,
        code,
    )


@stage_task("evaluate")
def evaluate_task(
    fingerprint: str, params: PipelineParams, tokens: TokensResult, checkpoint: str, device: str
) -> EvaluateResult:
    """Test loss, perplexity and bits per byte of the checkpoint, beside the unigram baseline; samples.
    Computed holding the device's slot (`tasks.device_slot`), as training does."""
    from gptcore.eval.held_out import evaluate_held_out
    from tasks.device_slot import device_slot

    with device_slot(device, announce=announce):  # alone on the device: no training beside it
        record = evaluate_held_out(
            Path(checkpoint),
            Path(tokens.train),
            Path(tokens.test),
            Path(tokens.tokenizer_path),
            params.evaluate,
            device,
        )
    folder = run_directory(params, "evaluate", fingerprint)
    folder.mkdir(parents=True, exist_ok=True)
    evaluation = write_json_atomic(folder / EVALUATION_FILE, record.to_dict())
    samples = write_text_atomic(folder / SAMPLES_FILE, record.samples_markdown())
    figures = {name: getattr(record, name) for name in _FIGURES}
    if record.samples:
        first = record.samples[0]
        figures["sample"] = " ".join(f"{first.prompt}⟶{first.greedy}".split())[:160]
    bits = record.test_bits_per_byte or float("nan")
    announce(
        f"evaluate: test loss {record.test_loss:.4f} ({bits:.4f} bits/byte) against the unigram "
        f"{record.unigram_test_loss:.4f}; samples in {samples}"
    )
    return EvaluateResult(
        fingerprint=fingerprint,
        checkpoint=checkpoint,
        evaluation=record.to_dict(),
        files=file_record(evaluation, samples),
        outputs=[str(evaluation), str(samples)],
        figures=figures,
    )
