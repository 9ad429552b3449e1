"""Conversations as token files a fine-tune trains on: packed whole into examples with a loss mask on
the answers, read back as examples whose prompt positions have no target, scored on the answers alone;
and a base model grown to the chat tokens, each new row the mean of the old."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, trainers

from gptcore.chat import template
from gptcore.chat.conversations import Conversation
from gptcore.chat.template import chat_template_of
from gptcore.chat.tokens import build_chat_tokens, pack
from gptcore.data.batches import BatchLoader, open_examples, unigram_loss
from gptcore.data.tokenfile import open_tokens
from gptcore.data.tokenizer import new_tokenizer
from gptcore.errors import DataError
from gptcore.eval.config import EvaluateConfig
from gptcore.eval.held_out import stream_figures
from gptcore.export.model_files import model_files_in, read_model_files, write_model_files
from gptcore.finetune.vocabulary import chat_model_files, grow_vocabulary
from gptcore.model.config import ModelConfig
from gptcore.model.cross_entropy import IGNORE
from gptcore.model.gpt import GPT

TEXT = Path(__file__).read_text(encoding="utf-8")  # real text: this file's own source
BLOCK = 48


def conversation(number: int, answer_words: int = 6) -> Conversation:
    words = TEXT.split()
    answer = " ".join(words[number : number + answer_words])
    return Conversation.of([("system", "Be brief."), ("user", f"Say {number}."), ("assistant", answer)])


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = new_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False)
    tokenizer.train_from_iterator([TEXT], trainer=trainer)
    template.add_chat_tokens(tokenizer)
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_conversations_pack_whole_into_examples_that_each_start_a_conversation(tokenizer_path: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    items = [conversation(n) for n in range(12)] + [conversation(99, answer_words=60)]  # the last: too long
    packed = pack(items, tokenizer, BLOCK + 1)
    assert packed.conversations == 12 and packed.too_long == 1
    windows, masks = packed.ids.reshape(-1, BLOCK + 1), packed.mask.reshape(-1, BLOCK + 1)
    system = tokenizer.token_to_id("<|system|>")
    assert (windows[:, 0] == system).all() and not masks[:, 0].any()
    ids, trained = [], []  # the examples, padding taken out, are the conversations' encodings in order
    for window, mask in zip(windows, masks, strict=True):
        starts = np.flatnonzero(window == system)
        ends = np.flatnonzero(window == tokenizer.token_to_id(template.END_OF_TURN))
        last = ends[ends > starts[-1]][2] + 1  # system, user, assistant: three turns a conversation
        ids += window[:last].tolist()
        trained += mask[:last].astype(bool).tolist()
    expected = [template.encode(tokenizer, c.messages) for c in items[:12]]
    assert ids == [i for e in expected for i in e.ids] and trained == [t for e in expected for t in e.trained]
    assert packed.answer_bytes == sum(len(c.messages[-1].content.encode()) for c in items[:12])


def test_a_built_split_reads_as_examples_whose_prompts_have_no_target(
    tokenizer_path: Path, tmp_path: Path
) -> None:
    splits = {"train": [conversation(n) for n in range(30)], "test": [conversation(n) for n in range(40, 50)]}
    folder = build_chat_tokens(splits, tokenizer_path, tmp_path / "chat", "source-fp", BLOCK + 1)
    assert (
        json.loads((tmp_path / "chat" / "manifest.json").read_text())["splits"]["train"]["conversations"]
        == 30
    )
    stream = open_tokens(folder.splits["train"].path)
    manifest = stream.manifest
    assert manifest.trained_tokens == int(stream.mask.sum()) == folder.splits["train"].trained_tokens
    assert manifest.tokens_per_byte == manifest.trained_tokens / folder.splits["train"].answer_bytes
    examples = open_examples(stream, BLOCK, 404)
    assert examples.count == len(stream) // (BLOCK + 1)
    x, y = next(BatchLoader(examples, "cpu", False, 0).batches(iter([np.arange(examples.count)])))
    window = examples.gather(np.arange(examples.count))
    assert torch.equal(x, window[:, :-1])
    targets = torch.from_numpy(np.asarray(stream.mask, dtype=bool).reshape(examples.count, -1)[:, 1:])
    assert torch.equal(y == IGNORE, ~targets) and torch.equal(y[targets], window[:, 1:][targets])
    assert len(examples.target_tokens()) == manifest.trained_tokens
    assert unigram_loss(examples, examples, 404) > 0
    with pytest.raises(DataError, match=rf"holds examples of {BLOCK + 1} tokens .* block_size \+ 1 = 33"):
        open_examples(stream, 32, 404)


def test_held_out_figures_of_a_chat_split_are_the_answers_nats_per_answer_byte(
    tokenizer_path: Path, tmp_path: Path
) -> None:
    splits = {"test": [conversation(n) for n in range(20)]}
    folder = build_chat_tokens(splits, tokenizer_path, tmp_path / "chat", "source-fp", BLOCK + 1)
    stream = open_tokens(folder.splits["test"].path)
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=BLOCK, vocab_size=404)).eval()
    loss, bits, predicted = stream_figures(model, stream, EvaluateConfig(batch_size=3))
    windows = torch.from_numpy(np.asarray(stream.tokens, dtype=np.int64).reshape(-1, BLOCK + 1))
    mask = torch.from_numpy(np.asarray(stream.mask, dtype=bool).reshape(-1, BLOCK + 1))[:, 1:]
    with torch.no_grad():
        logits = model(windows[:, :-1], windows[:, 1:])[0]
    nats = torch.nn.functional.cross_entropy(logits[mask], windows[:, 1:][mask], reduction="sum").item()
    assert predicted == int(mask.sum()) == folder.splits["test"].trained_tokens
    assert loss == pytest.approx(nats / predicted, rel=1e-5)
    assert bits == pytest.approx(nats / (math.log(2) * folder.splits["test"].answer_bytes), rel=1e-5)


def test_a_base_grows_a_mean_row_for_each_chat_token_and_says_what_it_said_before(tmp_path: Path) -> None:
    tokenizer = new_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False)
    tokenizer.train_from_iterator([TEXT], trainer=trainer)
    tokenizer.save(str(tmp_path / "base-tokenizer.json"))
    known = tokenizer.get_vocab_size()
    torch.manual_seed(0)
    base = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=BLOCK, vocab_size=known)).eval()
    write_model_files(base, tmp_path / "base-tokenizer.json", tmp_path / "base")
    files, added = chat_model_files(model_files_in(tmp_path / "base"), tmp_path / "chat")
    assert added == 4 and chat_template_of(tmp_path / "chat") == template.JINJA
    assert chat_template_of(tmp_path / "base") is None
    grown = read_model_files(files.weights, files.config)
    assert grown.config.vocab_size == known + 4
    assert template.has_chat_tokens(Tokenizer.from_file(str(files.tokenizer)))
    rows = grown.transformer.wte.weight.detach()
    assert torch.allclose(rows[known:], rows[:known].mean(dim=0).expand(4, -1))
    ids = torch.tensor([Tokenizer.from_file(str(files.tokenizer)).encode(TEXT[:200]).ids[:BLOCK]])
    with torch.no_grad():
        before, after = base(ids)[0], grown(ids)[0]
    torch.testing.assert_close(after[..., :known], before)  # the base's predictions, as they were
    again, _ = chat_model_files(files, tmp_path / "again")  # a chat model already has the tokens
    assert read_model_files(again.weights, again.config).config.vocab_size == known + 4


def test_rows_past_the_tokenizer_are_reset_to_the_mean_of_those_it_had() -> None:
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=BLOCK, vocab_size=310)).eval()
    grown = grow_vocabulary(model, 300, 304)  # a base padded to 310 rows, 300 of them its tokenizer's
    rows = grown.transformer.wte.weight.detach()
    assert grown.config.vocab_size == 310
    assert torch.allclose(rows[300:], model.transformer.wte.weight[:300].detach().mean(dim=0).expand(10, -1))
