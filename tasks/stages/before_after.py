"""A fine-tune's before/after stage: the base (before) and the fine-tuned model (after) measured on the
new corpus's test split and on the base corpus's, with the evaluate stage's settings: what was learned,
what was forgotten."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptcore.eval.answers import AnswerScore
from gptcore.tools.atomic import write_json_atomic, write_text_atomic
from gptcore.tools.fingerprint import sha256_file
from tasks.results import Figure, StageResult, file_record
from tasks.stage import announce
from tasks.stages.chat_tokens import ChatTokensResult
from tasks.stages.device import DeviceResult
from tasks.stages.evaluate import AfterEvaluation
from tasks.stages.start_model import BaseResult
from tasks.stages.training import run_directory

BEFORE_AFTER_FILE = "before_after.json"
ANSWERS_FILE = "answers.md"  # a chat fine-tune's: held-out questions answered before and after


class BeforeAfterResult(StageResult):
    pass  # its figures: new_test_* and base_test_* bits per byte and loss, _before and _after


@dataclass(frozen=True, kw_only=True)
class BeforeAfter(AfterEvaluation[BeforeAfterResult]):
    """Bits per byte of the base and of the fine-tuned model on the new corpus's test split
    (`new_test_*`) and the base corpus's (`base_test_*`), holding the device's slot; for a chat
    fine-tune, each model's answers to the held-out questions too (`new_test_answer_score_*`)."""

    result_type = BeforeAfterResult
    name: str = "before-after"
    device: DeviceResult
    base: BaseResult

    def key(self) -> tuple[Any, ...]:
        base, tokens = self.base, self.tokens
        base_test = sha256_file(base.base_test_tokens) if base.base_test_tokens else None
        evaluate, device = self.params.evaluate.model_dump(), self.device.runtime.device
        test = tokens.files.get(tokens.test)
        return ("before-after", base.weights_sha256, self.read.digest, test, base_test, evaluate, device)

    def compute(self, fingerprint: str | None) -> BeforeAfterResult:
        from gptcore.checkpoint.load import load_model
        from gptcore.data.tokenfile import open_tokens
        from gptcore.eval.held_out import stream_figures
        from gptcore.export.model_files import model_files_in, read_model_files
        from tasks.device_slot import device_slot

        device = self.device.runtime.device
        kept = model_files_in(Path(self.base.folder))
        splits = {"new": self.tokens.test, "base": self.base.base_test_tokens}
        figures: dict[str, Figure] = {}
        with device_slot(device, announce=announce):
            before = read_model_files(kept.weights, kept.config, device)
            models = {"before": before, "after": load_model(self.read.checkpoint, device)[0]}
            for split, path in splits.items():
                if path is None:
                    continue
                stream = open_tokens(path)
                for when, model in models.items():
                    loss, bits, predicted = stream_figures(model, stream, self.params.evaluate)
                    figures[f"{split}_test_loss_{when}"] = loss
                    figures[f"{split}_test_bits_per_byte_{when}"] = bits
                figures[f"{split}_test_tokens"] = predicted
            chat = self.tokens if isinstance(self.tokens, ChatTokensResult) else None
            answers = self._answers(chat, models) if chat is not None else {}
        if answers:
            figures.update({f"new_test_answer_score_{when}": score.share for when, score in answers.items()})
            figures["new_test_questions"] = answers["after"].asked
        folder = run_directory(self.params, "before-after", fingerprint)
        folder.mkdir(parents=True, exist_ok=True)
        written = [write_json_atomic(folder / BEFORE_AFTER_FILE, {"splits": splits, "figures": figures})]
        if answers:
            written.append(write_text_atomic(folder / ANSWERS_FILE, answers_markdown(answers)))
        announce(before_after_line(figures))
        return BeforeAfterResult(
            fingerprint=fingerprint,
            files=file_record(*written),
            outputs=[str(p) for p in written],
            figures=figures,
        )

    def _answers(self, chat: ChatTokensResult, models: dict[str, Any]) -> dict[str, AnswerScore]:
        """Each model's answer score on the chat test split's questions (`gptcore.eval.answers`)."""
        from tokenizers import Tokenizer

        from gptcore.chat.conversations import read
        from gptcore.eval.answers import answer_score

        asked = list(read(Path(chat.chat.splits["test"].conversations_path)))[
            : self.params.evaluate.questions
        ]
        tokenizer = Tokenizer.from_file(chat.tokenizer_path)
        return {when: answer_score(model, tokenizer, asked) for when, model in models.items()}


def answers_markdown(answers: dict[str, AnswerScore]) -> str:
    """The held-out questions' answers before and after, side by side, under each model's score."""
    before, after = answers["before"], answers["after"]
    lines = [
        "# Held-out questions, answered before and after the chat fine-tune",
        "",
        f"An answer counts when it starts with the reference's first {after.words} words: "
        f"before {before.matched} of {before.asked} ({before.share:.1%}), after {after.matched} of "
        f"{after.asked} ({after.share:.1%}).",
        "",
    ]
    for number, (old, new) in enumerate(zip(before.examples, after.examples, strict=False), 1):
        lines += [f"## {number}. {new.question}", "", f"- reference: {new.reference}"]
        lines += [f"- before{' (counts)' if old.matched else ''}: {old.answer}"]
        lines += [f"- after{' (counts)' if new.matched else ''}: {new.answer}", ""]
    return "\n".join(lines)


def before_after_line(figures: dict[str, Figure]) -> str:
    def change(split: str) -> str:
        before, after = (figures.get(f"{split}_test_bits_per_byte_{when}") for when in ("before", "after"))
        if not isinstance(before, float) or not isinstance(after, float):
            return "not measured (no base test split under the data root)"
        return f"{before:.4f} -> {after:.4f} bits/byte"

    line = f"before-after: new corpus {change('new')}; base corpus {change('base')}"
    before, after = (figures.get(f"new_test_answer_score_{when}") for when in ("before", "after"))
    if isinstance(before, float) and isinstance(after, float):
        line += f"; held-out answers starting right {before:.1%} -> {after:.1%}"
    return line
