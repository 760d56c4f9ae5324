"""The measured comparisons behind the MoE hand-off (``hpc_advise.measured``): rows where ours wins, where
SGLang's triton wins and where nothing was measured, layer-step and kernel rows, and the shipped rows'
rank shapes."""

from __future__ import annotations

import pytest

from hpc_advise import measured, rules
from hpc_advise.profiles import get_gpu, get_model
from tests.measured_rows import kernel_row, layer_row

HY3_TP8 = measured.MoeShape(192, 4096, 192, 8, "fp8-per-tensor")


def _rows():
    """Hy3 TP8 rank: ours faster at bs 1 and 256, SGLang's triton faster at bs 32 (both attention
    backends, two mixes: the medians decide)."""
    rows = []
    for attn in ("triton", "hpc_advise"):
        for mix in ("uniform-2k", "agentic"):
            rows += [
                layer_row(attn, "triton", mix, 1, 700.0),
                layer_row(attn, "hpc_advise", mix, 1, 650.0),
                layer_row(attn, "triton", mix, 32, 1000.0),
                layer_row(attn, "hpc_advise", mix, 32, 1040.0),
                layer_row(attn, "triton", mix, 256, 2100.0),
                layer_row(attn, "hpc_advise", mix, 256, 2000.0),
            ]
    return rows


def test_layer_rows_take_the_rank_shape_of_their_subject():
    cells = measured.layer_cells(_rows())
    assert len(cells) == 24
    assert {c.moe_shape for c in cells} == {HY3_TP8}
    assert {(c.conditions.q_heads, c.conditions.kv_heads) for c in cells} == {(8, 1)}


def test_cells_run_with_our_router_are_left_out_of_the_comparisons():
    """The same combination with our router GEMM would otherwise share a cell key with SGLang's gate
    (the newest row would win at random); only SGLang's-gate rows are compared."""
    ours_router = [layer_row("hpc_advise", "hpc_advise", "agentic", 1, 10.0, router="hpc_advise")]
    cells = measured.layer_cells(_rows() + ours_router)
    assert len(cells) == 24
    assert all(c.p50 != 10.0 for c in cells)


def test_handoff_where_sglang_measured_faster_and_ours_elsewhere():
    points = measured.moe_points(_rows())
    assert len(points) == 12  # 2 attention backends x 2 mixes x 3 batches, each paired with triton
    slower = measured.moe_handoff(HY3_TP8, 32, points)
    assert slower.runner == "triton" and slower.measured
    assert slower.bucket.per_layer_delta_us == pytest.approx(10.0)  # (1040 - 1000) / 4 layers
    assert "at T = 32: ours 0.96x SGLang's triton MoE runner, the median of 4" in slower.reason()
    # buckets: bs 1 -> T 1-5, bs 32 -> 6-90, bs 256 -> 91-512 (geometric midpoints)
    for t in (1, 5, 91, 200, 512):
        got = measured.moe_handoff(HY3_TP8, t, points)
        assert (got.runner, got.measured) == ("hpc_advise", True), t
    for t in (6, 20, 90):
        assert measured.moe_handoff(HY3_TP8, t, points).runner == "triton", t


def test_a_bucket_over_several_mixes_decides_by_its_median_ratio():
    """Three mixes at one batch: ours 2 % faster on the two short ones, 2.3 % slower on the long one,
    the median per-layer delta says ours (-12.8 us), but the median times' ratio would print 0.98x
    (4683.6 / 4789.3) beside "ours measured faster". The decision and the printed figure come from the median of the
    pairs' ratios (1.02, 0.978, 1.008 -> 1.008): ours, shown above 1."""
    rows = []
    for mix, triton, ours in (("uniform-2k", 3732.0, 3657.6), ("mixed-1k-32k", 4683.6, 4789.3),
                              ("agentic", 6359.5, 6308.3)):  # fmt: skip
        rows += [
            layer_row("triton", "triton", mix, 64, triton),
            layer_row("triton", "hpc_advise", mix, 64, ours),
        ]
    got = measured.moe_handoff(HY3_TP8, 64, measured.moe_points(rows))
    assert got.runner == "hpc_advise" and got.bucket.ratio == pytest.approx(6359.5 / 6308.3)
    assert "ours 1.01x SGLang's triton MoE runner, the median of 3 measured pair(s), 0.98-1.02x" in got.reason()
    assert "4683.6" not in got.reason()  # no step times whose own ratio disagrees with the printed one


def test_a_later_run_with_our_runner_handing_off_keeps_the_earlier_pairs():
    """A run measured under the hand-off (SGLang's default and all-ours only, our runner sending bs 32 to
    triton) neither replaces the first run's cells nor pairs its handed-off cells: the hand-off stays
    decided by the run that timed our kernel."""
    later = []
    for mix in ("uniform-2k", "agentic"):
        for bs, ours in ((1, 640.0), (32, 1001.0), (256, 1990.0)):
            later += [
                layer_row("triton", "triton", mix, bs, ours + 5.0, command="later"),
                layer_row("hpc_advise", "hpc_advise", mix, bs, ours, command="later",
                          moe_paths=["triton"] if bs == 32 else ["hpc_advise"]),
            ]  # fmt: skip
    cells = measured.layer_cells(_rows() + later)
    assert len(cells) == 24 + 12
    assert {c.batch for c in cells if c.handed_off} == {32}
    points = measured.moe_points(_rows() + later)
    assert len(points) == 12  # the later run has no two cells that differ only in the MoE runner
    assert measured.moe_handoff(HY3_TP8, 32, points).runner == "triton"
    # handed-off cells of a run that has a triton partner still pair with nothing
    paired = later + [layer_row("hpc_advise", "triton", m, b, 900.0, command="later")
                      for m in ("uniform-2k", "agentic") for b in (1, 32, 256)]  # fmt: skip
    got = measured.moe_points(paired)
    assert {p.tokens for p in got} == {1, 256}


def test_unmeasured_tokens_and_shapes_keep_ours():
    points = measured.moe_points(_rows())
    beyond = measured.moe_handoff(HY3_TP8, 513, points)  # past twice the largest measured batch
    assert (beyond.runner, beyond.measured, beyond.bucket) == ("hpc_advise", False, None)
    other = measured.MoeShape(192, 4096, 384, 8, "fp8-per-tensor")  # Hy3 at TP4: never measured
    assert measured.moe_handoff(other, 32, points).runner == "hpc_advise"
    assert not measured.moe_handoff(other, 32, points).measured
    assert measured.moe_handoff(HY3_TP8, 32, []).runner == "hpc_advise"


def test_kernel_rows_decide_where_no_layer_step_was_measured():
    rows = [kernel_row("ours", 32, 80.0), kernel_row("sglang_triton", 32, 70.0),
            kernel_row("ours", 2048, 500.0), kernel_row("sglang_triton", 2048, 600.0),
            kernel_row("torch", 32, 10.0)]  # fmt: skip
    points = measured.moe_points(rows)
    assert {(p.tokens, p.runner) for p in points} == {(32, "hpc_advise"), (2048, "hpc_advise")}
    assert measured.moe_handoff(HY3_TP8, 32, points).runner == "triton"
    assert measured.moe_handoff(HY3_TP8, 2048, points).runner == "hpc_advise"
    # with layer steps of the same shape, those decide (the real layer)
    both = points + measured.moe_points(_rows())
    assert measured.moe_handoff(HY3_TP8, 32, both).bucket.source.startswith("layer step")


def test_rows_of_different_runs_are_not_paired():
    rows = [layer_row("triton", "triton", "agentic", 8, 900.0, command="run a"),
            layer_row("triton", "hpc_advise", "agentic", 8, 950.0, command="run b")]  # fmt: skip
    assert measured.moe_points(rows) == []


def test_bucket_edges_split_at_geometric_midpoints():
    assert measured.bucket_edges([1, 8, 32, 256]) == [(1, 2), (3, 16), (17, 90), (91, 512)]


def test_conditions_and_layer_give_the_same_shape():
    c = rules.conditions(get_model("hy3"), get_gpu("h200"), tp=8)
    assert measured.moe_shape_of(c) == HY3_TP8
    assert measured.moe_shape_of(rules.conditions(get_model("hy3"), None, tp=8, ep=8), ep=8).experts == 24


def test_handoff_off_cell_pairs_where_a_handoff_cell_of_the_same_run_also_ran():
    """One run with SGLang's triton, our runner with its hand-off (its bs 1 cell timed our kernel, slower
    under noise) and the benchmark's hand-off-off worker (``moe_handoff`` off): the hand-off-off cell pairs."""
    rows = []
    for bs, ours, raw in ((1, 690.0, 650.0), (32, 1001.0, 1040.0)):
        rows.append(layer_row("hpc_advise", "triton", "agentic", bs, 700.0 if bs == 1 else 1000.0))
        off = layer_row("hpc_advise", "hpc_advise", "agentic", bs, raw, moe_paths=["hpc_advise"])
        off["provider"] += "-raw"
        off["config"]["moe_handoff"] = "off"
        rows.append(off)  # before the hand-off worker's row: which comes last does not decide
        rows.append(layer_row("hpc_advise", "hpc_advise", "agentic", bs, ours,
                              moe_paths=["hpc_advise"] if bs == 1 else ["triton"]))  # fmt: skip
    points = measured.moe_points(rows)
    assert sorted((p.tokens, p.runner_us) for p in points) == [(1, 650.0), (32, 1040.0)]
    assert measured.moe_handoff(HY3_TP8, 32, points).runner == "triton"


def test_a_later_run_with_pairs_at_the_shape_supersedes_the_earlier_pairs():
    """The first run (``_rows``: SGLang's triton faster at bs 32) and a later one with other weights whose
    hand-off-off cells beat triton at bs 32: the later run decides; with the later rows alone stamped
    earlier, the first run would."""
    later = []
    for mix in ("uniform-2k", "agentic"):
        for bs in (1, 32, 256):
            tri = layer_row("hpc_advise", "triton", mix, bs, 1000.0, command="later")
            off = layer_row(
                "hpc_advise", "hpc_advise", mix, bs, 950.0, command="later", moe_paths=["hpc_advise"]
            )
            off["provider"] += "-raw"
            off["config"]["moe_handoff"] = "off"
            for r in (tri, off):
                r["created_at"] = "2026-12-02T03:00:00+00:00"
            later += [tri, off]
    points = measured.moe_points(_rows() + later)
    assert measured.moe_handoff(HY3_TP8, 32, points).runner == "hpc_advise"
    buckets = measured.moe_buckets(points, HY3_TP8)
    assert [b.n for b in buckets] == [
        2,
        2,
        2,
    ]  # the later run's two mixes only, not the first run's four pairs
    for r in later:
        r["created_at"] = "2026-11-30T00:00:00+00:00"
    assert measured.moe_handoff(HY3_TP8, 32, measured.moe_points(_rows() + later)).runner == "triton"
