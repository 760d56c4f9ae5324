"""``hpc-advise kb export``: the knowledge base as JSON (all tables) or CSV (one table).

JSON: ``{"schema": [migration names], "<table>": [rows…], …}`` with JSON columns as nested objects.
CSV: one table, a header row, JSON columns written as compact JSON strings.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence

from hpc_advise.knowledge_base.migrations import applied
from hpc_advise.knowledge_base.store import KnowledgeBase


def to_json(kb: KnowledgeBase, tables: Sequence[str] | None = None) -> str:
    data: dict = {"schema": applied(kb.db)}
    data.update(kb.dump(tables))
    return json.dumps(data, indent=2, ensure_ascii=False)


def to_csv(kb: KnowledgeBase, table: str) -> str:
    rows = kb.dump([table])[table]
    columns = [c.name for c in kb.db[table].columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {k: json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v for k, v in row.items()}
        )
    return buf.getvalue()
