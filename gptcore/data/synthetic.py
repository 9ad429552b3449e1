"""A synthetic, learnable token stream: for tests and for `gptpipe train --synthetic` before real data.

Each next token follows from the current one through a fixed random permutation, except for a
fraction of uniformly random tokens. A model that learns the bigram drives the loss far below the
unigram floor (log vocab), so a falling loss is a real signal, not noise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gptcore.data.tokenfile import TokenStream


def synthetic_tokens(
    vocab_size: int, count: int, seed: int = 0, noise: float = 0.1, language_seed: int = 0
) -> np.ndarray:
    """`language_seed` fixes the rule (shared by train and validation); `seed` draws this stream."""
    successor = np.random.default_rng(language_seed).permutation(vocab_size)
    rng = np.random.default_rng([language_seed, seed])
    random_tokens = rng.integers(0, vocab_size, size=count)
    is_noise = rng.random(count) < noise
    tokens = np.empty(count, dtype=np.uint16 if vocab_size <= 1 << 16 else np.uint32)
    current = int(random_tokens[0])
    for i in range(count):  # sequential by nature; fine for the sizes tests and demos use
        current = int(random_tokens[i]) if is_noise[i] else int(successor[current])
        tokens[i] = current
    return tokens


def synthetic_stream(vocab_size: int, count: int, seed: int = 0, split: str = "train") -> TokenStream:
    """An in-memory stream; `path` names it for messages (nothing is written)."""
    return TokenStream(Path(f"synthetic-{split}-seed{seed}"), synthetic_tokens(vocab_size, count, seed), None)
