"""Full-text search helpers: user query -> FTS5 MATCH expression, and date filters.

Queries use a small, forgiving syntax instead of raw FTS5 (where ``fp8-per-tensor`` or ``H200:``
would be syntax errors): words are ANDed, ``"quoted phrases"`` match in order, ``OR`` / ``NOT``
are operators, and a trailing ``*`` is a prefix match (``decod*``). Every other character is
quoted, so any input is a valid MATCH expression. Ranking is FTS5's bm25 (title weighted above
body); see ``KnowledgeBase.search_notes``.
"""

from __future__ import annotations

import datetime as _dt
import re

_TOKEN = re.compile(r'"([^"]*)"|(\S+)')
_OPERATORS = {"OR", "NOT", "AND"}
_RELATIVE = re.compile(r"^(\d+)([dhw])$")


def _quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def match_expression(query: str) -> str:
    """Translate a user query into an FTS5 MATCH expression (raises ValueError if empty)."""
    parts: list[str] = []
    for phrase, word in _TOKEN.findall(query):
        if phrase:
            if phrase.strip():
                parts.append(_quote(phrase))
        elif word in _OPERATORS:
            parts.append(word)
        elif word.endswith("*") and len(word) > 1:
            parts.append(_quote(word.rstrip("*")) + "*")
        elif word.strip("*"):
            parts.append(_quote(word.strip("*")))
    # operators need operands on both sides (NOT also needs a left operand in FTS5)
    while parts and parts[0] in _OPERATORS:
        parts.pop(0)
    while parts and parts[-1] in _OPERATORS:
        parts.pop()
    cleaned: list[str] = []
    for part in parts:
        if part in _OPERATORS and cleaned and cleaned[-1] in _OPERATORS:
            continue
        cleaned.append(part)
    if not cleaned:
        raise ValueError(f"empty search query: {query!r}")
    return " ".join(cleaned)


def parse_when(text: str, *, end: bool = False, now: _dt.datetime | None = None) -> str:
    """An ISO timestamp bound for ``created_at`` comparisons (UTC, ISO 8601 strings).

    Accepts ``YYYY-MM-DD``, a full ISO datetime (naive means UTC), or a relative age ``7d`` /
    ``12h`` / ``2w`` before now. Lower bounds are inclusive (``created_at >= bound``); with
    ``end=True`` the bound is exclusive (``created_at < bound``) and covers the whole given day or
    second, so ``--until 2026-11-29`` includes that day.
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
