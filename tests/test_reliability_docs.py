"""docs/reliability.md agrees with the reliability suite: the counts it reports are the ones the
tests run (computed from their parameter lists, hypothesis settings and @cases, nothing
recorded), every test and every table case is listed, and files lost is 0."""

from __future__ import annotations

import re

from tests import reliability
from tests.test_reliability_checkpoints import CHECKPOINT_FAULTS
from tests.test_reliability_download import HUB_FAULTS
from tests.test_reliability_inputs import API_CASES, INPUT_CASES

DOC = reliability.REPO / "docs" / "reliability.md"


def test_counts_match_the_suite():
    text = DOC.read_text()
    for kind, count in reliability.totals().items():
        assert f"| {kind} | {count} |" in text, (kind, count)
    assert "| files lost | 0 |" in text


def test_every_test_is_listed_with_its_count():
    text = DOC.read_text()
    for _module, name, kind, count in reliability.count_cases():
        assert f"| `{name}` | {kind} | {count} |" in text, (name, kind, count)


def test_every_table_case_is_described():
    text = DOC.read_text()
    listed = set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE))
    missing = [name for name in (*INPUT_CASES, *API_CASES, *CHECKPOINT_FAULTS, *HUB_FAULTS)
               if name not in listed and f"`{name}`" not in text]
    assert not missing, missing
