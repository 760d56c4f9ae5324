"""Full-text search: bm25 ranking, highlighted snippets, tag/date filters, trigger sync."""

from __future__ import annotations

import datetime as _dt

import pytest

from hpc_advise.knowledge_base.search import match_expression, parse_when


@pytest.fixture
def notes(kb):
    ids = {
        "title": kb.add_note("Numbers for the H200 box.", title="paged decode attention", tags=["kernels"]),
        "many": kb.add_note("decode decode decode: decode batches of 64 requests, decode dominated.", tags=["kernels", "h200"]),
        "once": kb.add_note("A long note about prefill, chunked prefill sizes, and one decode remark at the end "
                            "after many unrelated words about scheduling, radix cache and routing.", tags=["sglang"]),
        "none": kb.add_note("FP8 fused MoE reached 4.1 TB/s at T=64.", title="moe", tags=["kernels"]),
    }  # fmt: skip
    for filler in ("NVLink all-reduce bus bandwidth on eight GPUs.", "Mooncake arrivals are bursty.",
                   "Weights load from local disk in under a minute."):  # fmt: skip
        kb.add_note(filler)  # realistic corpus: bm25's IDF stays positive for the terms searched
    return ids


def test_ranking_prefers_title_then_frequency(kb, notes):
    hits = kb.search_notes("decode")
    assert [h["id"] for h in hits] == [notes["title"], notes["many"], notes["once"]]
    assert hits[0]["score"] > hits[1]["score"] > hits[2]["score"] > 0.01


def test_snippets_highlight_matched_terms(kb, notes):
    [hit] = kb.search_notes("fused moe", highlight=("<b>", "</b>"))
    assert "<b>fused</b>" in hit["snippet"] and "<b>MoE</b>" in hit["snippet"]
    long = kb.search_notes("scheduling")[0]
    assert "**scheduling**" in long["snippet"] and len(long["snippet"]) < len(kb.note(notes["once"])["body"])


def test_stemming_phrases_prefix_and_or(kb, notes):
    assert {h["id"] for h in kb.search_notes("batch")} == {notes["many"]}  # porter: batches -> batch
    assert {h["id"] for h in kb.search_notes('"chunked prefill"')} == {notes["once"]}
    assert {h["id"] for h in kb.search_notes('"sizes chunked"')} == set()
    assert {h["id"] for h in kb.search_notes("sched*")} == {notes["once"]}
    assert {h["id"] for h in kb.search_notes("moe OR radix")} == {notes["none"], notes["once"]}
    assert {h["id"] for h in kb.search_notes("decode NOT prefill")} == {notes["title"], notes["many"]}


def test_punctuation_is_not_fts_syntax(kb, notes):
    assert {h["id"] for h in kb.search_notes("T=64 TB/s")} == {notes["none"]}
    assert kb.search_notes("fp8-per-tensor: (") == []  # no syntax error
    with pytest.raises(ValueError, match="empty search query"):
        kb.search_notes('OR "" *')


def test_tag_filters(kb, notes):
    assert {h["id"] for h in kb.search_notes("decode", tags=["kernels"])} == {notes["title"], notes["many"]}
    assert {h["id"] for h in kb.search_notes("decode", tags=["kernels", "H200"])} == {notes["many"]}
    assert kb.search_notes("decode", tags=["nope"]) == []


def test_date_filters(kb, notes):
    kb.conn.execute("UPDATE notes SET created_at = '2026-10-01T12:00:00+00:00' WHERE id = ?", [notes["many"]])
    kb.conn.commit()
    assert {h["id"] for h in kb.search_notes("decode", until="2026-10-01")} == {notes["many"]}
    assert {h["id"] for h in kb.search_notes("decode", until="2026-09-30")} == set()
    assert notes["many"] not in {h["id"] for h in kb.search_notes("decode", since="2026-10-02")}
    assert {
        h["id"] for h in kb.search_notes("decode", since="2026-10-01T12:00:00Z", until="2026-10-01T12:00:00")
    } == {notes["many"]}
    assert notes["many"] not in {h["id"] for h in kb.search_notes("decode", since="7d")}
    with pytest.raises(ValueError, match="not a date"):
        kb.search_notes("decode", since="yesterday")


def _fts_ids(kb, term):
    return {r[0] for r in kb.conn.execute("SELECT rowid FROM notes_fts WHERE notes_fts MATCH ?", [term])}


def test_update_trigger_reindexes(kb, notes):
    kb.update_note(notes["none"], body="Router GEMM split-K on small M.", title="router")
    assert kb.search_notes("moe") == []
    assert [h["id"] for h in kb.search_notes("router")] == [notes["none"]]
    assert _fts_ids(kb, "fused") == set()
    kb.conn.execute("INSERT INTO notes_fts (notes_fts) VALUES ('integrity-check')")  # raises if out of sync


def test_delete_trigger_removes_from_index(kb, notes):
    kb.delete_notes([notes["many"], notes["title"]])
    assert [h["id"] for h in kb.search_notes("decode")] == [notes["once"]]
    assert _fts_ids(kb, "batches") == set()
    kb.conn.execute("INSERT INTO notes_fts (notes_fts) VALUES ('integrity-check')")


def test_match_expression_quotes_everything():
    assert match_expression("fp8-per-tensor H200:") == '"fp8-per-tensor" "H200:"'
    assert match_expression('a OR "b c" decod*') == '"a" OR "b c" "decod"*'
    assert match_expression("OR a OR OR b NOT") == '"a" OR "b"'
    assert match_expression('say "he said ""hi"""').startswith('"say"')


def test_parse_when():
    now = _dt.datetime(2026, 11, 29, 8, 0, tzinfo=_dt.timezone.utc)
    assert parse_when("2026-11-29") == "2026-11-29T00:00:00+00:00"
    assert parse_when("2026-11-29", end=True) == "2026-11-30T00:00:00+00:00"
    assert parse_when("2026-11-29T10:00:00+02:00") == "2026-11-29T08:00:00+00:00"
    assert parse_when("2d", now=now) == "2026-11-27T08:00:00+00:00"
    assert parse_when("12h", now=now) == "2026-11-28T20:00:00+00:00"
