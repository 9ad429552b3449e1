"""`gptpipe chat --model URI`: a conversation with a chat model in the terminal (or over a pipe: a line a
message). The model's files are read as data, as `gptpipe serve` reads them; a model without a chat
template is refused in one line. The conversation is kept, its oldest exchanges dropped when the model's
window would not hold it; `/reset` starts again, `/exit` (or end of input) ends it."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import typer

from gptcore.errors import ConfigError


def chat_command(
    model: str = typer.Option(..., "--model", help="a chat model: models:/gptpipe-iteration-1-chat@champion"),
    system: str | None = typer.Option(None, "--system", help="a system message the conversation starts with"),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", min=1, help="an answer's tokens at most"),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0: the likeliest token each time"),
    top_k: int = typer.Option(50, "--top-k", min=0, help="0 keeps every token"),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Talk to a chat model (one made by a chat fine-tune, finetune.format: chat) in the terminal."""
    import torch

    from gptcore.chat.conversations import Message
    from gptcore.chat.template import fitting
    from gptcore.eval.answers import reply
    from gptcore.serving.served import load_served
    from tasks.tracking.models.model_uri import model_files_of

    with tempfile.TemporaryDirectory(prefix="gptpipe-chat-") as scratch:
        files = model_files_of(model, into=Path(scratch))
        if files.chat_template is None:
            raise ConfigError(
                f"--model {model}: no chat template among its files (it was not chat fine-tuned: "
                "finetune.format: chat); gptpipe generate continues text"
            )
        served = load_served(files, model)
    generator = torch.Generator().manual_seed(seed)
    start = [Message("system", system)] if system else []
    history = list(start)
    interactive = sys.stdin.isatty()
    while True:
        line = _ask(interactive)
        if line is None or line.strip() == "/exit":
            return
        if line.strip() == "/reset":
            history = list(start)
            continue
        if not line.strip():
            continue
        history.append(Message("user", line.strip()))
        history = fitting(served.tokenizer, history, served.window, min(max_new_tokens, served.window // 2))
        text = reply(
            served.model, served.tokenizer, history, max_new_tokens, temperature, top_k or None, generator
        )
        history.append(Message("assistant", text.strip() or "..."))
        print(f"assistant> {text.strip()}" if interactive else text.strip(), flush=True)


def _ask(interactive: bool) -> str | None:
    """The next message, or None at the end of input."""
    try:
        return input("you> ") if interactive else sys.stdin.readline() or None
    except (EOFError, KeyboardInterrupt):
        return None
