"""Bad command-line flags and values: one line each, nothing written."""

from __future__ import annotations

import pytest

from .cases import FLAG_CASES as CASES
from .support import Case, Outcome, assert_rejected_cleanly


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_rejected_cleanly(case: Case, outcomes: dict[str, Outcome]) -> None:
    assert_rejected_cleanly(case, outcomes[case.id])
