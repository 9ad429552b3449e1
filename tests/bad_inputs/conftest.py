"""Each module's cases run once, several at a time (each is a separate `gptpipe` process): `make test`
hands whole modules to its workers, so a module runs its own cases, never another's."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from .cases import ALL_CASES
from .support import Case, Outcome, run_case


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """The outcome of each of the module's `CASES`, by id."""
    cases: list[Case] = request.module.CASES
    ids = [case.id for case in ALL_CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    root = tmp_path_factory.mktemp("bad_inputs")
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = pool.map(lambda case: run_case(case, Path(root) / case.id), cases)
        return dict(zip([case.id for case in cases], results, strict=True))
