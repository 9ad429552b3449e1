"""Sampling with the key/value cache: the same tokens as recomputing the whole context, on every profile."""

from __future__ import annotations

import pytest
import torch

from gptcore.generate import sample
from gptcore.model.config import ModelConfig
from gptcore.model.gpt import GPT
from gptcore.model.kv_cache import KVCache
from tasks.params.loading import load_profile

TINY = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=300)


def random_model(config: ModelConfig) -> GPT:
    torch.manual_seed(0)
    return GPT(config).eval()


def prompt(config: ModelConfig, length: int) -> list[int]:
    return torch.randint(0, config.vocab_size, (length,), generator=torch.Generator().manual_seed(1)).tolist()


@pytest.mark.parametrize("profile", ["gpt_first_cpu", "gpt_42m", "gpt_100m"])
def test_greedy_tokens_are_the_same_with_and_without_the_cache(profile: str) -> None:
    config = load_profile(profile).architecture
    model = random_model(config)
    ids = prompt(config, 12)
    cached = sample(model, ids, 24, temperature=0.0, kv_cache=True)
    assert cached == sample(model, ids, 24, temperature=0.0, kv_cache=False)
    assert len(cached) == 24


def test_logits_fed_in_pieces_through_the_cache_equal_the_whole_sequence_at_once() -> None:
    model = random_model(TINY)
    ids = torch.tensor([prompt(TINY, 16)])
    with torch.no_grad():
        whole = model(ids, targets=ids)[0]  # every position's logits
        cache = KVCache(TINY.n_layer, TINY.block_size)
        pieces = [model(ids[:, :5], cache=cache)[0]]  # a prefill
        for start, end in ((5, 8), (8, 9), (9, 16)):  # several new positions, then one, then several
            pieces.append(model(ids[:, start:end], cache=cache)[0])
    for (_, end), logits in zip(((0, 5), (5, 8), (8, 9), (9, 16)), pieces, strict=True):
        torch.testing.assert_close(logits[:, -1], whole[:, end - 1], rtol=1e-5, atol=1e-5)
    assert cache.length == 16 and cache.full


def test_a_full_cache_refuses_more_positions_with_a_clear_message() -> None:
    model = random_model(TINY)
    cache = KVCache(TINY.n_layer, TINY.block_size)
    with torch.no_grad():
        model(torch.zeros(1, 16, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="16 cached \\+ 1 new positions exceed block_size 16"):
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache)


def test_sampling_past_the_window_goes_on_from_a_new_cache_and_agrees_until_the_window_fills() -> None:
    model = random_model(TINY)
    ids = prompt(TINY, 6)
    cached = sample(model, ids, 40, temperature=0.0, kv_cache=True)
    plain = sample(model, ids, 40, temperature=0.0, kv_cache=False)
    assert len(cached) == 40 and all(0 <= token < TINY.vocab_size for token in cached)
    inside = TINY.block_size - len(ids) + 1  # the tokens chosen before the context outgrows the window
    assert cached[:inside] == plain[:inside]


def test_a_prompt_longer_than_the_window_is_cut_to_its_last_block_size_tokens() -> None:
    model = random_model(TINY)
    long_prompt = prompt(TINY, 16) * 2
    assert sample(model, long_prompt, 5, temperature=0.0) == sample(
        model, long_prompt[-16:], 5, temperature=0.0
    )


def test_seeded_sampling_with_the_cache_repeats_itself() -> None:
    model = random_model(TINY)
    ids = prompt(TINY, 4)
    draw = [sample(model, ids, 10, generator=torch.Generator().manual_seed(3)) for _ in range(2)]
    assert draw[0] == draw[1]
