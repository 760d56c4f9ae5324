"""Side-by-side comparison of runs (``hpc-advise runs compare``), as plain data.

The first run is the baseline: every numeric row carries each other run's value divided by the
baseline's. Rows: identity (kind, subject, provider, GPU, date), the config keys whose values differ
(nested dicts flattened to ``server.tp_size``), the headline metric (p20/p50/p80) and every named
metric any of the runs has (serving imports: TTFT/TPOT/ITL/E2E statistics and throughputs).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Comparison:
    run_ids: list[int]
    rows: list[dict] = field(default_factory=list)  # {"name", "values", "ratios" (None for text rows)}
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"run_ids": self.run_ids, "rows": self.rows, "warnings": self.warnings}


def flatten(config: dict, prefix: str = "") -> dict:
    """{"server": {"tp_size": 8}} -> {"server.tp_size": 8}."""
    out: dict = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _is_num(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _ratios(values: list) -> list[float | None]:
    base = values[0]
    out: list[float | None] = []
    for v in values[1:]:
        out.append(v / base if _is_num(v) and _is_num(base) and base != 0 else None)
    return out


def compare(runs: list[dict]) -> Comparison:
    """Compare two or more ``KnowledgeBase.run()`` dicts, the first being the baseline."""
    if len(runs) < 2:
        raise ValueError("compare needs at least two runs")
    cmp = Comparison(run_ids=[r["id"] for r in runs])
    for key in ("kind", "subject", "provider", "gpu", "created_at"):
        cmp.rows.append({"name": key, "values": [r.get(key) for r in runs], "ratios": None})
    configs = [flatten(r.get("config") or {}) for r in runs]
    keys = list(dict.fromkeys(k for c in configs for k in c))
    # a key that only some runs have (vLLM results carry no server settings) is not a difference
    differing = [k for k in keys if len({repr(c[k]) for c in configs if k in c}) > 1]
    for key in differing:
        values = [c.get(key) for c in configs]
        numeric = all(_is_num(v) for v in values)
        cmp.rows.append(
            {"name": f"config.{key}", "values": values, "ratios": _ratios(values) if numeric else None}
        )
    if not differing:
        cmp.rows.append({"name": "config", "values": ["(same)"] * len(runs), "ratios": None})
    heads = {(r["metric"], r["unit"]) for r in runs}
    if len(heads) > 1:
        cmp.warnings.append(
            "runs measure different things: " + ", ".join(f"{m} [{u}]" for m, u in sorted(heads))
        )
    metric, unit = runs[0]["metric"], runs[0]["unit"]
    if not all(metric in (r.get("metrics") or {}) for r in runs):  # else it is repeated below
        single = all(r.get("p20") in (None, r["p50"]) and r.get("p80") in (None, r["p50"]) for r in runs)
        for q in ("p50",) if single else ("p20", "p50", "p80"):
            values = [r.get(q) for r in runs]
            label = f"{metric} [{unit}]" if single else f"{metric} {q} [{unit}]"
            cmp.rows.append({"name": label, "values": values, "ratios": _ratios(values)})
    names = list(dict.fromkeys(k for r in runs for k in (r.get("metrics") or {})))
    for name in names:
        values = [(r.get("metrics") or {}).get(name) for r in runs]
        cmp.rows.append({"name": name, "values": values, "ratios": _ratios(values)})
    return cmp
