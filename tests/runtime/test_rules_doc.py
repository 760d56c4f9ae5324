"""docs/runtime.md carries the tables generated from hpc_advise/rules.py, unchanged."""

from __future__ import annotations

from pathlib import Path

from hpc_advise import rules

DOC = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"


def test_docs_tables_are_generated_from_the_rules():
    text = DOC.read_text(encoding="utf-8")
    start, end = text.index(rules.DOC_START), text.index(rules.DOC_END) + len(rules.DOC_END)
    assert text[start:end] == rules.docs_block(), (
        "regenerate: python -c 'from hpc_advise import rules; print(rules.docs_block())'"
    )


def test_where_table_says_b200_runs_neither_fa3_nor_ours():
    b200 = next(line for line in rules.where_table_markdown().splitlines() if "B200" in line)
    assert "fa3" not in b200 and rules.NAME not in b200
