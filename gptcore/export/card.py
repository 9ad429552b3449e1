"""A Hugging Face export's model card (`README.md`): the hub's metadata block (license, library, the
datasets, the base model, `model-index` with the test split's figures) and the training's facts in
prose, written from the run's records (`CardFacts`). What the records do not say is left out, never
guessed: an export of a bare checkpoint still says its architecture and size."""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from gptcore.model.gpt import GPT

CARD = "README.md"


@dataclass(frozen=True)
class CardFacts:
    """What the run's records say of a model; every field optional but its name."""

    name: str  # the registered name (gptpipe-iteration-1), else the folder's
    test_bits_per_byte: float | None = None  # on the held-out test split
    test_loss: float | None = None  # nats per token, the same split
    test_split: str | None = None  # the split's fingerprint (test_split tag)
    dataset: str | None = None  # what it was trained on, as the corpus describes itself
    base_model: str | None = None  # a fine-tune's (or continued pretraining's) start model
    license: str = "other"  # the weights' license: the training text's terms decide it
    chat: bool = False  # a chat model: its tokenizer_config.json holds the template
    facts: dict[str, str | int | float] = field(default_factory=dict)  # the training's, by MLflow name


def card_text(model: GPT, facts: CardFacts) -> str:
    """The README.md of an export of `model`: the metadata block, then a few paragraphs."""
    config = model.config
    parameters = sum(p.numel() for p in model.parameters())
    meta: dict = {
        "license": facts.license,
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        "tags": ["gptpipe", "chat" if facts.chat else "text-generation", config.recipe_name()],
    }
    if facts.dataset:
        meta["datasets"] = [facts.dataset]
    if facts.base_model:
        meta["base_model"] = facts.base_model
    metrics = [
        {"type": kind, "value": round(value, 6), "name": label}
        for kind, value, label in (
            ("bits_per_byte", facts.test_bits_per_byte, "test bits per byte"),
            ("loss", facts.test_loss, "test loss (nats per token)"),
        )
        if value is not None
    ]
    if metrics:
        dataset = {
            "name": facts.dataset or "held-out test split",
            "type": facts.test_split or "unknown",
            "split": "test",
        }
        task = {"type": "text-generation", "name": "Language modeling"}
        meta["model-index"] = [
            {"name": facts.name, "results": [{"task": task, "dataset": dataset, "metrics": metrics}]}
        ]
    lines = [
        "---",
        yaml.safe_dump(meta, sort_keys=False, width=1000).strip(),
        "---",
        "",
        f"# {facts.name}",
        "",
        f"A GPT of {parameters:,} parameters ({config.n_layer} layers, {config.n_head} heads, width "
        f"{config.n_embd}, a window of {config.block_size} tokens, a vocabulary of {config.vocab_size}; "
        f"recipe {config.recipe_name()}), trained and exported by gptpipe.",
        "",
    ]
    if facts.test_bits_per_byte is not None:
        split = f" (split {facts.test_split})" if facts.test_split else ""
        lines += [f"Held-out test split{split}: {facts.test_bits_per_byte:.4f} bits per byte.", ""]
    if facts.base_model:
        lines += [f"Fine-tuned from `{facts.base_model}`.", ""]
    if facts.chat:
        lines += ["A chat model: `tokenizer.apply_chat_template(messages, add_generation_prompt=True)` "
                  "renders a conversation as it was trained; an answer ends at `<|end|>`.", ""]  # fmt: skip
    if facts.facts:
        lines += ["| fact | value |", "| --- | --- |"]
        lines += [f"| {key} | {value} |" for key, value in facts.facts.items()]
        lines.append("")
    return "\n".join(lines)
