"""The test split a model was measured on, as tags of its logged model and its registered versions:
`test_split` (the split's content fingerprint, `gptcore.data.tokenfile.split_fingerprint`) and
`corpus_fingerprint` (the corpus it was cut from). The champion rule compares only figures measured on
one split (`registry`), and whatever measures a model again finds its own split under the data root by
the fingerprint (`own_split`), so no figure is silently measured on other text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TEST_SPLIT = "test_split"
CORPUS = "corpus_fingerprint"


def split_tags(path: str | Path) -> dict[str, str]:
    """The tags naming the test split at `path` (a `test.bin`, or a sharded split's manifest); none
    where no file is there to name."""
    from gptcore.data.tokenfile import read_manifest, split_fingerprint

    if not Path(path).is_file():
        return {}
    manifest = read_manifest(path)
    corpus = manifest.corpus_fingerprint if manifest is not None else ""
    return {TEST_SPLIT: split_fingerprint(path, manifest), **({CORPUS: corpus} if corpus else {})}


@dataclass(frozen=True)
class ChosenSplit:
    """The test split a command measures a model on, and the one line that says which and why."""

    path: Path
    line: str


def own_split(
    uri: str,
    recorded: dict[str, str],
    given: Path | None,
    data_root: Path,
    newest: Callable[[], Path | None],
) -> ChosenSplit:
    """The split to measure the model `uri` on: `given` (`--test-tokens`), said when it is not the model's
    own; else its own split (`recorded`) found under `data_root`, refused in one line when it is gone;
    else (a model that names none) `newest()`, the newest made with its tokenizer, said as such."""
    from gptcore.data.tokenfile import find_split, split_fingerprint
    from gptcore.errors import DataError

    own = recorded.get(TEST_SPLIT)
    if given is not None:
        fingerprint = split_fingerprint(given)
        if own == fingerprint:
            return ChosenSplit(given, f"{uri}: measured on its own test split {given} (test split {own})")
        if own is None:
            return ChosenSplit(
                given,
                f"{uri}: measured on {given} (test split {fingerprint}), as --test-tokens gives; the model "
                "names no test split of its own",
            )
        return ChosenSplit(
            given,
            f"{uri}: measured on {given} (test split {fingerprint}), not the model's own test split {own}; "
            "its figures do not compare with the registry's",
        )
    if own is not None:
        found = find_split(data_root, own)
        if found is None:
            raise DataError(
                f"--test-tokens: {uri} was measured on test split {own} (corpus "
                f"{recorded.get(CORPUS, 'unknown')}), which is not under {data_root}/tokens; rebuild it "
                "(gptpipe run with that corpus) or pass --test-tokens PATH"
            )
        return ChosenSplit(found, f"{uri}: measured on its own test split {found} (test split {own})")
    path = newest()
    if path is None:
        raise DataError(
            f"--test-tokens: {uri} names no test split and no test.bin under {data_root}/tokens was made "
            "with its tokenizer (gptpipe run builds one); pass --test-tokens PATH"
        )
    return ChosenSplit(
        path,
        f"{uri}: names no test split (registered before gptpipe tagged them); measured on the newest made "
        f"with its tokenizer, {path} (test split {split_fingerprint(path)})",
    )
