"""The garbage-collector handling `gptpipe` uses around its heavy imports."""

from __future__ import annotations

import gc

from flows.environment.gc_tuning import bulk_imports


def test_bulk_imports_pause_the_collector_and_freeze_what_was_made() -> None:
    gc.enable()
    frozen_before = gc.get_freeze_count()
    with bulk_imports():
        assert not gc.isenabled()
        made = [[index] for index in range(1000)]  # containers the collector would track
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen_before + len(made)
    gc.unfreeze()


def test_bulk_imports_leave_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with bulk_imports():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()
