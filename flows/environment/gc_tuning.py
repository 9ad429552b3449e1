"""Start-up cost of a command that imports torch, Prefect and MLflow: the garbage collector's share.

Those imports allocate a few million objects that live until the process ends. With the collector on,
each import triggers full collections that walk all of them again (about a third of the import time on
this machine), and the final collection at interpreter exit walks them once more. `bulk_imports` turns
the collector off while the imports run and then freezes what they made (moves it out of the collector's
sight for good), and `freeze_before_exit` does the same for whatever the command built, so the exit
collection has nothing long-lived left to walk. Objects made later are collected as usual.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def bulk_imports() -> Iterator[None]:
    """Import heavy libraries inside this block: no collections meanwhile, the results frozen after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def freeze_before_exit() -> None:
    """Spare the interpreter's final collection the objects still alive when the command returns."""
    gc.freeze()
