"""The held-out evaluation: every test token predicted once, bits per byte over the test text, samples."""

from __future__ import annotations

import math
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from gptcore.data.build import TokenFolderManifest, build_token_files
from gptcore.data.config import CorpusConfig, TokenizerConfig
from gptcore.data.corpus import open_corpus
from gptcore.data.tokenfile import open_tokens
from gptcore.data.tokenizer import train_tokenizer
from gptcore.errors import DataError
from gptcore.eval.config import EvaluateConfig
from gptcore.eval.held_out import evaluate_held_out, held_out_prompts, summed_nats
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT
from gptcore.runtime.config import RuntimeConfig
from gptcore.train.callbacks import TrainingCallback
from gptcore.train.config import OptimizerConfig, TrainingConfig
from gptcore.train.job import TrainJob
from gptcore.train.records import EvalRecord
from gptcore.train.trainer import train

STDLIB = Path(sysconfig.get_paths()["stdlib"])
TINY = ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=512)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TokenFolderManifest]:
    """Real text (three stdlib packages) split three ways, a tokenizer, token files and a trained model."""
    folder = tmp_path_factory.mktemp("held-out")
    paths = [str(STDLIB / name / "*.py") for name in ("json", "email", "unittest")]
    corpus = open_corpus(
        CorpusConfig(source="local", paths=paths, validation_fraction=0.2, test_fraction=0.2)
    )
    tokenizer = train_tokenizer(corpus, TokenizerConfig(vocab_size=512), folder)
    tokens = build_token_files(corpus, tokenizer, folder)
    train(
        TrainJob(
            model=TINY,
            runtime=RuntimeConfig(device="cpu", precision="fp32", batch_size=8),
            training=TrainingConfig(
                max_steps=150,
                log_every=50,
                eval_every=150,
                optimizer=OptimizerConfig(learning_rate=1e-2, warmup_steps=10),
            ),
            train_tokens=Path(tokens.train.path),
            validation_tokens=Path(tokens.validation.path),
            checkpoint_directory=folder / "run",
            tokenizer=Path(tokenizer.path),
        ),
        TrainingCallback(),
    )
    return folder, tokens


def test_every_token_after_the_first_is_predicted_once_whatever_the_batch() -> None:
    torch.manual_seed(0)
    model = GPT(TINY).eval().requires_grad_(False)
    stream = np.random.default_rng(0).integers(0, TINY.vocab_size, 16 * 5 + 7 + 1)
    nats, predicted = summed_nats(model, stream, batch_size=2)
    assert predicted == len(stream) - 1
    assert summed_nats(model, stream, batch_size=64)[0] == pytest.approx(nats, rel=1e-6)
    short = stream[:12]  # within one window: the plain cross-entropy of the sequence
    logits, _ = model(torch.from_numpy(short[None, :-1]), torch.from_numpy(short[None, 1:]))
    expected = torch.nn.functional.cross_entropy(logits[0], torch.from_numpy(short[1:]), reduction="sum")
    assert summed_nats(model, short, batch_size=1)[0] == pytest.approx(expected.item(), rel=1e-5)
    assert summed_nats(model, stream, batch_size=2, max_tokens=20)[1] == 20


def test_the_checkpoint_is_measured_on_the_test_text_in_bits_per_byte(
    built: tuple[Path, TokenFolderManifest],
) -> None:
    folder, tokens = built
    settings = EvaluateConfig(prompts=2, prompt_tokens=8, max_new_tokens=6)
    record = evaluate_held_out(
        folder / "run" / "best.pt",
        Path(tokens.train.path),
        Path(tokens.test.path),
        folder / "tokenizers" / tokens.tokenizer_fingerprint / "tokenizer.json",
        settings,
    )
    test = open_tokens(tokens.test.path)
    assert record.test_tokens == len(test) - 1 and record.test_text_bytes == tokens.test.text_bytes > 0
    summed = record.test_loss * record.test_tokens
    assert record.test_bits_per_byte == pytest.approx(summed / (math.log(2) * tokens.test.text_bytes))
    assert record.test_perplexity == pytest.approx(math.exp(record.test_loss))
    assert record.test_loss < record.unigram_test_loss  # it learned more than token frequencies
    assert record.test_bits_per_byte < record.unigram_test_bits_per_byte
    assert len(record.samples) == 2 and all(s.greedy and s.sampled for s in record.samples)
    assert "Greedy:" in record.samples_markdown()


def test_prompts_are_the_first_tokens_of_the_first_long_enough_test_documents(
    built: tuple[Path, TokenFolderManifest],
) -> None:
    _, tokens = built
    test = open_tokens(tokens.test.path)
    end = test.manifest.end_of_text_id
    assert test.manifest.document_count >= 2
    prompts = held_out_prompts(test, end, count=2, length=5)
    assert len(prompts) == 2 and all(len(p) == 5 and end not in p for p in prompts)
    assert prompts[0] == np.asarray(test.tokens[:5]).tolist()  # the first document is long enough


def test_a_file_of_another_split_is_refused_as_the_test_split(
    built: tuple[Path, TokenFolderManifest],
) -> None:
    folder, tokens = built
    with pytest.raises(
        DataError, match=r"validation.manifest.json: holds the validation split, not the held-out test"
    ):
        evaluate_held_out(
            folder / "run" / "best.pt",
            Path(tokens.train.path),
            Path(tokens.validation.path),
            folder / "tokenizers" / tokens.tokenizer_fingerprint / "tokenizer.json",
            EvaluateConfig(),
        )


def test_validation_reports_bits_per_byte_where_the_token_file_knows_its_text(
    built: tuple[Path, TokenFolderManifest],
) -> None:
    _, tokens = built

    class Evals(TrainingCallback):
        def __init__(self) -> None:
            self.records: list[dict] = []

        def on_eval(self, record: EvalRecord) -> None:
            self.records.append(record.to_dict())

    evals = Evals()
    train(
        TrainJob(
            model=TINY,
            runtime=RuntimeConfig(device="cpu", precision="fp32", batch_size=4),
            training=TrainingConfig(max_steps=2, log_every=1, eval_every=2),
            train_tokens=Path(tokens.train.path),
            validation_tokens=Path(tokens.validation.path),
        ),
        evals,
    )
    record = evals.records[-1]
    tokens_per_byte = tokens.validation.tokens / tokens.validation.text_bytes
    assert record["val_bits_per_byte"] == pytest.approx(record["val_loss"] * tokens_per_byte / math.log(2))
