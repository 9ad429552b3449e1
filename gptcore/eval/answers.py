"""What a chat model learned to answer, measured as a person would check it: its greedy answer to each
held-out question, prompted in the chat template, against the answer the conversation gives.

`AnswerScore.share` is the share of questions whose answer starts with the reference's first `words`
words (whitespace aside): for the standard library's docstrings, whether the model names what a function
does the way its documentation does, on functions of packages it was never fine-tuned on. A base model
is scored the same way, prompted with the same template, so the two figures compare."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from tokenizers import Tokenizer

from gptcore.chat.conversations import Conversation, Message
from gptcore.chat.template import END_OF_TURN, encode
from gptcore.generate import sample
from gptcore.model.gpt import GPT

WORDS = 4  # an answer "starts like the reference" when its first four words are the reference's


@dataclass(frozen=True)
class Answered:
    question: str
    reference: str
    answer: str
    matched: bool


@dataclass(frozen=True)
class AnswerScore:
    asked: int
    matched: int
    words: int
    examples: list[Answered] = field(default_factory=list)  # the first few, to read

    @property
    def share(self) -> float:
        return self.matched / self.asked if self.asked else 0.0


def reply(
    model: GPT,
    tokenizer: Tokenizer,
    messages: Sequence[Message],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> str:
    """The model's answer to `messages` (ending on a user's), up to its end of turn, `max_new_tokens`
    tokens, or the end of its window; greedy at temperature 0."""
    prompt = encode(tokenizer, messages, add_generation_prompt=True).ids
    room = model.config.block_size - len(prompt)
    stop = frozenset({tokenizer.token_to_id(END_OF_TURN)})
    ids = sample(model, prompt, max(0, min(max_new_tokens, room)), temperature, top_k, generator, stop=stop)
    return tokenizer.decode(ids)


def answer(model: GPT, tokenizer: Tokenizer, conversation: Conversation, max_new_tokens: int) -> str:
    """The model's greedy answer to the conversation's last question (its messages before the last
    answer), up to its end of turn or `max_new_tokens` tokens."""
    return reply(model, tokenizer, conversation.messages[:-1], max_new_tokens)


def starts_like(answer_text: str, reference: str, words: int = WORDS) -> bool:
    """Whether `answer_text` begins with the reference's first `words` words (all of a shorter one)."""
    wanted = reference.split()[:words]
    return bool(wanted) and answer_text.split()[: len(wanted)] == wanted


def answer_score(
    model: GPT,
    tokenizer: Tokenizer,
    conversations: Sequence[Conversation],
    words: int = WORDS,
    max_new_tokens: int = 24,
    keep: int = 8,
) -> AnswerScore:
    """The model's answers to every conversation's last question, scored against its last answer;
    the first `keep` kept to read."""
    matched, examples = 0, []
    for conversation in conversations:
        reference = conversation.messages[-1].content
        text = answer(model, tokenizer, conversation, max_new_tokens)
        hit = starts_like(text, reference, words)
        matched += hit
        if len(examples) < keep:
            examples.append(Answered(conversation.messages[-2].content, reference, text, hit))
    return AnswerScore(len(conversations), matched, words, examples)
