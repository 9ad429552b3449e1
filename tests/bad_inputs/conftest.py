"""Every case runs once per session, several at a time (each is a separate `gptpipe` process)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from .cases import ALL_CASES
from .support import Outcome, run_case


@pytest.fixture(scope="session")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    root = tmp_path_factory.mktemp("bad_inputs")
    ids = [case.id for case in ALL_CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = pool.map(lambda case: run_case(case, Path(root) / case.id), ALL_CASES)
        return dict(zip(ids, results, strict=True))
