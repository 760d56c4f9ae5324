"""The advisor's layer-step models (``kernel_models.LayerAttention`` / ``LayerMoe``): a measured cell is
reproduced exactly, so the predicted order of attention backends is the measured one in every cell of
the shipped tables; between cells it interpolates and outside them it says so; MoE runners are told
apart by measured pairs, our runner's handed-off buckets count as SGLang's time."""

from __future__ import annotations

import numpy as np
import pytest

from hpc_advise import measured
from hpc_advise.advisor.kernel_models import LayerAttention, LayerMoe, shipped_rows
from tests.measured_rows import layer_row

HY3_TP8 = measured.MoeShape(192, 4096, 192, 8, "fp8-per-tensor")


def _query(cell):
    c = cell.conditions
    return dict(q_heads=c.q_heads, kv_heads=c.kv_heads, head_dim=c.head_dim, kv_dtype=c.kv_dtype,
                mla=c.attention == "mla", batch=cell.batch, context=np.array([cell.context_mean]),
                kv_bytes_per_token=2.0 * c.kv_heads * c.head_dim * (1 if c.kv_dtype == "fp8_e4m3" else 2))  # fmt: skip


# Two backends within 1 % of one step are a tie (the bench's within-run spread is mostly p80/p20 <= 1.02), and so
# are two whose difference is inside either cell's own p20-p80 spread: at one short request the replays of a
# worker spread by up to 5 % (Hy3 agentic bs 1), more than the backends differ.
TIE = 0.01


def _spreads(rows: list[dict]) -> dict[tuple, float]:
    """(subject, command, provider, mix, batch) -> p80 - p20 of a layer-step row (µs)."""
    return {
        (r["subject"], r.get("command"), r["provider"], r["config"]["mix"], r["config"]["batch"]): r["p80"]
        - r["p20"]
        for r in rows
        if r.get("kind") == "layer_step"
    }


def _spread_of(spreads: dict, cell) -> float:
    moe = "hpc_advise-raw" if cell.handoff_off else cell.moe
    return spreads.get(
        (cell.subject, cell.run[0], f"attn={cell.attention},moe={moe}", cell.mix, cell.batch), 0.0
    )


def _shape(subject: str, cells: dict) -> tuple:
    c = next(cell for k, by in cells.items() if k[0] == subject for v in by.values() for cell in v.values())
    k = c.conditions
    return (k.q_heads, k.kv_heads, k.head_dim, k.kv_dtype, k.attention)


def test_predicted_attention_order_is_the_measured_one_in_every_shipped_cell():
    """Per cell (subject, run, mix, batch) the prediction is the measured difference averaged over the
    MoE runners it was measured with, and over the subjects and runs of the same attention shape (Qwen3-235B's
    TP4 and EP4 ranks), exactly; its sign is the measured order under each runner, except
    ties. A cell whose runners measured opposite orders beyond their spread can match only on average
    (Hy3 agentic bs 1 in the shipped rows: ours 25 us a step slower beside SGLang's Triton MoE, 9 and 38 us
    faster beside ours): those are counted and held to one in twenty. Cells are compared within one run."""
    rows = shipped_rows()
    layer = LayerAttention.from_rows(rows)
    spreads = _spreads(rows)
    if len(layer.backends()) < 2:
        pytest.skip("no shipped layer-step table compares two attention backends")
    cells: dict[tuple, dict[tuple, dict[str, object]]] = {}
    for c in layer.cells:
        # our runner with and without its hand-off are two MoE paths (the benchmark's raw control)
        cells.setdefault((c.subject, c.run, c.mix, c.batch), {}).setdefault((c.moe, c.handoff_off), {})[
            c.attention
        ] = c
    checked = ties = 0
    subjects, contradictory, compared = set(), [], 0
    for key, by_moe in cells.items():
        names = sorted({att for v in by_moe.values() for att in v})
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                both = [v for v in by_moe.values() if a in v and b in v]
                if not both:
                    continue
                got = layer.delta_us(a, b, **_query(both[0][a]))
                assert got is not None, key
                predicted, notes = float(got[0][0]), got[1]
                per_moe = [(v[a].p50 - v[b].p50) / v[a].layers for v in both]
                # every run of every subject at this attention shape is one point, averaged
                same = [
                    float(np.mean([(w[a].p50 - w[b].p50) / w[a].layers for w in other.values() if a in w and b in w]))
                    for k2, other in cells.items()
                    if k2[2:] == key[2:] and _shape(k2[0], cells) == _shape(key[0], cells)
                    and any(a in w and b in w for w in other.values())
                ]  # fmt: skip
                assert predicted == pytest.approx(float(np.mean(same)), rel=1e-9, abs=1e-9) and notes == [], (
                    key
                )
                subjects.add(key[0])
                compared += 1
                signs = []
                for v, measured_d in zip(both, per_moe, strict=True):
                    spread = max(_spread_of(spreads, v[a]), _spread_of(spreads, v[b]))
                    if abs(v[a].p50 / v[b].p50 - 1) < TIE or abs(v[a].p50 - v[b].p50) < spread:
                        ties += 1
                        continue
                    signs.append(np.sign(measured_d))
                    checked += 1
                if len(set(signs)) > 1:
                    contradictory.append((key[0], key[2], key[3], a, b))
                elif signs:
                    assert np.sign(predicted) == signs[0], (key, a, b, predicted, per_moe)
    # Hy3 (3 MoE paths), Qwen3-235B TP4 and EP4 (2), Qwen3-30B (2): 3 mixes x 6 batches each
    assert {"hy3-tp8-rank", "qwen3-235b-tp4-rank", "qwen3-235b-ep4-rank", "qwen3-30b-tp1-rank"} <= subjects, (
        subjects
    )
    assert checked >= 72 and ties <= checked // 4, (checked, ties)
    # cells whose runners disagree are ties on the evidence (the same kernels differed by up to 4 % between
    # workers); more than one in twenty would mean the average hides real interactions
    assert len(contradictory) <= max(1, compared // 20), (compared, contradictory)


def _two_backend_rows():
    rows = []
    for bs, (fast, slow) in {8: (900.0, 1000.0), 64: (1100.0, 1400.0)}.items():
        for mix, ctx, scale in (("uniform-2k", 2049.0, 1.0), ("agentic", 20000.0, 3.0)):
            rows.append(layer_row("hpc_advise", "hpc_advise", mix, bs, fast, context=ctx))
            rows.append(layer_row("triton", "hpc_advise", mix, bs, fast + (slow - fast) * scale, context=ctx))
    return rows


def test_attention_interpolates_between_cells_and_flags_outside():
    layer = LayerAttention.from_rows(_two_backend_rows())
    q = dict(q_heads=8, kv_heads=1, head_dim=128, kv_dtype="bf16", mla=False, kv_bytes_per_token=512.0)
    # bs 8: triton - ours = 25 us per layer at 2K, 75 at 20K; bs 64: 75 / 225
    at = lambda bs, ctx: layer.delta_us("triton", "hpc_advise", batch=bs, context=np.array([ctx]), **q)  # noqa: E731
    d, notes = at(8, 2049.0)
    assert float(d[0]) == pytest.approx(25.0) and notes == []
    d, notes = at(8, (2049.0 + 20000.0) / 2)  # halfway in context: halfway in difference
    assert float(d[0]) == pytest.approx(50.0) and notes == []
    d, notes = at(int(round(np.sqrt(8 * 64))), 2049.0)  # geometric middle of the batches
    assert float(d[0]) == pytest.approx(50.0, rel=0.02) and notes == []
    d, notes = at(256, 40000.0)  # beyond both: the edge value, said so
    assert float(d[0]) == pytest.approx(225.0)
    assert any("batch 256 outside the measured 8-64" in n for n in notes)
    assert any("contexts outside" in n for n in notes)
    d, notes = layer.delta_us("triton", "hpc_advise", q_heads=32, kv_heads=4, head_dim=128, kv_dtype="bf16",
                              mla=False, batch=8, context=np.array([2049.0]), kv_bytes_per_token=2048.0)  # fmt: skip
    assert float(d[0]) == pytest.approx(100.0)  # 4 KV heads per rank: 4x the bytes of the measured 1
    assert any("measured at hy3-tp8-rank" in n and "scaled by KV bytes" in n for n in notes)
    assert layer.delta_us("fa3", "hpc_advise", batch=8, context=np.array([1.0]), **q) is None
    assert layer.delta_us("triton", "hpc_advise", q_heads=128, kv_heads=1, head_dim=576, kv_dtype="bf16", mla=True,
                          batch=8, context=np.array([1.0]), kv_bytes_per_token=1152.0) is None  # fmt: skip


def test_moe_runners_told_apart_by_measured_pairs():
    rows = []
    for bs, (sglang, ours) in {1: (700.0, 660.0), 32: (1000.0, 1040.0), 256: (2100.0, 2000.0)}.items():
        rows += [
            layer_row("hpc_advise", "triton", "agentic", bs, sglang),
            layer_row("hpc_advise", "hpc_advise", "agentic", bs, ours),
        ]
    moe = LayerMoe.from_rows(rows)
    d, notes = moe.delta_us("hpc_advise", HY3_TP8, 1)
    assert d == pytest.approx(-10.0) and notes == []  # (660 - 700) / 4 layers
    d, notes = moe.delta_us("hpc_advise", HY3_TP8, 32)
    assert d == 0.0 and notes == []  # SGLang's faster there: our runner hands the bucket over
    d, _ = moe.delta_us("hpc_advise", HY3_TP8, 256)
    assert d == pytest.approx(-25.0)
    d, notes = moe.delta_us("hpc_advise", HY3_TP8, 1024)
    assert d == pytest.approx(-25.0) and any("outside the measured 1-256" in n for n in notes)
    tp4 = measured.MoeShape(
        192, 4096, 384, 8, "fp8-per-tensor"
    )  # not measured: scaled by expert bytes, said so
    d, notes = moe.delta_us("hpc_advise", tp4, 1)
    assert d == pytest.approx(-20.0) and any("scaled by expert bytes" in n for n in notes)
    assert moe.delta_us("deep_gemm", HY3_TP8, 32) is None
    assert moe.delta_us("hpc_advise", measured.MoeShape(256, 7168, 256, 9, "fp8-block128"), 32) is None
    # same scheme, another top-k (DeepSeek's fused shared expert makes top-9): scaled by the bytes of the
    # experts a batch touches at each top-k, said so
    top9 = measured.MoeShape(192, 4096, 192, 9, "fp8-per-tensor")
    d, notes = moe.delta_us("hpc_advise", top9, 1)
    assert d == pytest.approx(-10.0 * top9.expert_bytes(1) / HY3_TP8.expert_bytes(1))
    assert any("MoE measured at E192 H4096 I192 top-8" in n for n in notes)
