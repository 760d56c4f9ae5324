"""Full-text search helpers: user query -> FTS5 MATCH expression, and date filters.

Queries use a small, forgiving syntax instead of raw FTS5 (where ``fp8-per-tensor`` or ``H200:``
would be syntax errors): words are ANDed, ``"quoted phrases"`` match in order, ``OR`` is an
operator, ``NOT word`` or ``-word`` excludes notes that contain it (also as the whole query:
``NOT flashinfer`` lists every note without it), ``title:word`` / ``body:"a phrase"`` match in one
column only, and a trailing ``*`` is a prefix match (``decod*``). Every other character is quoted,
so any input is a valid MATCH expression. Ranking is FTS5's bm25 (title weighted above body); see
``KnowledgeBase.search_notes``.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass

_TOKEN = re.compile(r'(-?)(?:(title|body):)?(?:"([^"]*)"|(\S+))')
_OPERATORS = {"OR", "AND"}
_RELATIVE = re.compile(r"^(\d+)([dhw])$")


def _quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


@dataclass(frozen=True)
class Query:
    """A parsed query: ``positive`` (None: every note) minus the notes matching ``negative``."""

    positive: str | None
    negative: str | None


def _term(column: str, phrase: str, word: str) -> str | None:
    if phrase:
        text = _quote(phrase) if phrase.strip() else None
    elif word.endswith("*") and len(word.rstrip("*")) > 0:
        text = _quote(word.rstrip("*")) + "*"
    elif word.strip("*"):
        text = _quote(word.strip("*"))
    else:
        text = None
    if text is None:
        return None
    return f"{column} : {text}" if column else text


def parse_query(query: str) -> Query:
    """Split a user query into the FTS5 expressions to include and to exclude (ValueError if empty)."""
    positive: list[str] = []
    negative: list[str] = []
    negate_next = False
    for dash, column, phrase, word in _TOKEN.findall(query):
        if not column and not phrase and not dash:
            if word == "NOT":
                negate_next = True
                continue
            if word in _OPERATORS:
                positive.append(word)
                continue
        if dash and not column and not phrase and not word.strip("-*"):
            continue  # a lone "-"
        term = _term(column, phrase, word)
        if term is None:
            continue
        if dash or negate_next:
            negative.append(term)
        else:
            positive.append(term)
        negate_next = False
    # binary operators need operands on both sides
    while positive and positive[0] in _OPERATORS:
        positive.pop(0)
    while positive and positive[-1] in _OPERATORS:
        positive.pop()
    cleaned: list[str] = []
    for part in positive:
        if part in _OPERATORS and cleaned and cleaned[-1] in _OPERATORS:
            continue
        cleaned.append(part)
    if not cleaned and not negative:
        raise ValueError(f"empty search query: {query!r}")
    return Query(" ".join(cleaned) or None, " OR ".join(negative) or None)


def match_expression(query: str) -> str:
    """One FTS5 MATCH expression for a query with at least one positive term (ValueError otherwise)."""
    parsed = parse_query(query)
    if parsed.positive is None:
        raise ValueError(f"query {query!r} only excludes: it needs a word to match")
    if parsed.negative is None:
        return parsed.positive
    return f"({parsed.positive}) NOT ({parsed.negative})"


def parse_when(text: str, *, end: bool = False, now: _dt.datetime | None = None) -> str:
    """An ISO 8601 timestamp bound (offset +00:00) for ``created_at`` comparisons.

    Accepts ``YYYY-MM-DD``, a full ISO datetime (naive means offset +00:00), or a relative age ``7d``
    / ``12h`` / ``2w`` before now. Lower bounds are inclusive (``created_at >= bound``); with
    ``end=True`` the bound is exclusive (``created_at < bound``) and covers the whole given day or
    second, so ``--until`` with a day includes that day.
    """
    text = text.strip()
    now = now or _dt.datetime.now(_dt.timezone.utc)
    rel = _RELATIVE.match(text)
    if rel:
        n, unit = int(rel.group(1)), rel.group(2)
        delta = {"h": _dt.timedelta(hours=n), "d": _dt.timedelta(days=n), "w": _dt.timedelta(weeks=n)}[unit]
        return (now - delta).isoformat(timespec="seconds")
    try:
        if len(text) == 10:
            day = _dt.date.fromisoformat(text)
            if end:
                day += _dt.timedelta(days=1)
            return _dt.datetime(day.year, day.month, day.day, tzinfo=_dt.timezone.utc).isoformat(
                timespec="seconds"
            )
        moment = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"not a date: {text!r} (use YYYY-MM-DD, an ISO datetime, or 7d / 12h / 2w)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=_dt.timezone.utc)
    if end:
        moment = moment.replace(microsecond=0) + _dt.timedelta(seconds=1)
    return moment.astimezone(_dt.timezone.utc).isoformat(timespec="seconds")
