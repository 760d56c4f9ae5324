"""Source hygiene of the package: code carries no history (dates, "UTC", commit ids), the wheel no lab notes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "hpc_advise"

DATE = re.compile(r"\b(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])\b")
UTC = re.compile(r"\bUTC\b")
# 7-40 hex digits with at least one digit and one letter: a commit id, not a word or a decimal number
HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


def history_marks(text: str) -> list[str]:
    """``LINE: what`` for each line of ``text`` that carries a date, "UTC" or a commit-id-like token."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for name, pattern in (("date", DATE), ("UTC", UTC), ("commit id", HASH)):
            match = pattern.search(line)
            if match:
                found.append(f"{number}: {name} {match.group(0)!r}")
    return found


@pytest.mark.parametrize(
    "line, expected",
    [
        ("# measured 2026-11-29 on one H200", ["1: date '2026-11-29'"]),
        ("x = 1  # 11:04 UTC", ["1: UTC 'UTC'"]),
        ("# see 41fb96b", ["1: commit id '41fb96b'"]),
        ("BLOCK = 0x7FFF; n = 1234567; word = 'deadline'; utc = timezone.utc", []),
    ],
)
def test_history_marks_finds_what_it_should(line, expected):
    assert history_marks(line) == expected


def test_package_code_carries_no_dates_utc_or_commit_ids():
    bad = {}
    for path in sorted(PKG.rglob("*.py")):
        marks = history_marks(path.read_text(encoding="utf-8"))
        if marks:
            bad[str(path.relative_to(REPO))] = marks[:3]
    assert bad == {}, f"{len(bad)} files carry history in code: {bad}"
