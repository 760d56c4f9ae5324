"""Tests of the multi-tile GEMM programs of the regular path (config GU_TILES, DN_TILES; decode round 5).

With GU_TILES = g a gate/up program computes g adjacent N tiles of its block (DN_TILES: H tiles of the down
GEMM) one after the other, each with the one-tile program's own code (``kernel._gate_up_tile`` /
``_down_tile``), in a loop nest Triton flattens into one software-pipelined loop over (tile, K step). Every
output element is the same products summed in the same order, so the output is bitwise the one-tile
programs' on the interpreter and on the H200 (both asserted).

CPU tests run under the Triton interpreter at small sizes (I not a multiple of the tile, one expert taking
every token, empty experts, an EP rank with no local tokens, T = 1 / 3 / 16); the sm_90a build test checks
that the flattened loop still pipelines its weight loads and spills nothing; the ``gpu`` tests run the real
decode shapes on the H200, replayed from a CUDA graph with fresh routing and from a launch plan.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.fused_moe import launch_plan as LP  # noqa: E402
from hpc_advise.kernels.fused_moe import op  # noqa: E402
from hpc_advise.kernels.fused_moe.op import FusedMoEError, fused_moe  # noqa: E402
from tests.kernels.sm90_compile import compile_sm90  # noqa: E402
from tests.kernels.test_fused_moe import (  # noqa: E402
    CPU_CFG,
    _seed,
    _sm90_job,
    check_eager_plan_replay,
    check_graph_replay,
    device_scales,
    make_problem,
    run_and_check,
)
from tests.kernels.test_fused_moe_host import check_plan_replays  # noqa: E402


def _load_tuner():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "tune_fused_moe.py"
    spec = importlib.util.spec_from_file_location("tune_fused_moe", path)
    tune = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tune)
    return tune


@pytest.fixture
def poisoned_workspace(monkeypatch):
    """Unplanned calls whose fp32 workspace buffers (split partials) start as NaN: a sum that reads a
    partial before its split stored it cannot pass on stale memory of an earlier call."""
    empty = LP.empty

    def poisoned(*shape, dtype, device):
        t = empty(*shape, dtype=dtype, device=device)
        return t.fill_(float("nan")) if dtype == torch.float32 else t

    monkeypatch.setattr(LP, "ENABLED", False)
    monkeypatch.setattr(LP, "empty", poisoned)


def _same_with_tiles(p, cfg: dict, tiles: list[dict], seed: int) -> None:
    plain, _, _ = run_and_check(p, config=cfg, seed=seed)
    for extra in tiles:
        got, _, _ = run_and_check(p, config=dict(cfg, **extra), seed=seed)
        assert torch.equal(plain, got), (seed, extra)


@pytest.mark.parametrize(
    "mode,t,h,i,cfg,tiles",
    [
        # block scales, the shipped decode forms (TMA weights, scalar scales, both GEMMs swapped, block exit):
        # I = 384 = 3 gate/up tiles of 128, H = 256 = 4 down tiles of 64
        (
            "block-dynamic",
            3,
            256,
            384,
            dict(CPU_CFG, GU_N=128, W_TMA=1, W_SCALAR=1, GU_SWAP_AB=1, DN_SWAP_AB=1, BLOCK_EXIT=1),
            [dict(GU_TILES=3), dict(DN_TILES=2), dict(GU_TILES=3, DN_TILES=4)],
        ),
        # T = 1, split-K 2 (fp32 partials + the SiLU/quantization launch), pointer tiles, 2 x 64-wide gate/up
        ("block-dynamic", 1, 384, 128, dict(CPU_CFG, GU_N=64, SPLIT_K=2), [dict(GU_TILES=2, DN_TILES=3)]),
        # per-tensor, static scales, I = 160: two dots of 64 rows, the third gate/up tile ragged, 64-wide K
        (
            "tensor-static",
            16,
            256,
            160,
            dict(CPU_CFG, GU_N=64, DN_K=64, PDL=1),
            [dict(GU_TILES=3, DN_TILES=2)],
        ),
    ],
)
def test_multi_tile_bitwise_the_one_tile_programs(mode, t, h, i, cfg, tiles):
    seed = _seed()
    _same_with_tiles(make_problem(t, 8, h, i, 4, mode, device="cpu"), cfg, tiles, seed)


@pytest.mark.parametrize("mode", ["block-dynamic", "tensor-static"])
def test_multi_tile_one_expert_takes_every_token_others_empty(mode):
    """Expert 2 in every token's slot 0 (its rows fill two 16-row blocks at T = 17), the other two slots
    on experts 3-5: experts 0, 1, 6 and 7 stay empty, so most programs exit on an empty block."""
    seed = _seed()
    t = 17
    ids = torch.stack([torch.randperm(3)[:2] + 3 for _ in range(t)]).to(torch.int32)
    ids = torch.cat([torch.full((t, 1), 2, dtype=torch.int32), ids], dim=1)
    i = 192 if mode == "tensor-static" else 256
    p = make_problem(t, 8, 256, i, 3, mode, device="cpu", ids=ids)
    cfg = dict(CPU_CFG, GU_N=64 if i == 192 else 128, DN_N=64)  # 3 / 2 gate/up tiles, 4 down tiles
    _same_with_tiles(p, cfg, [dict(GU_TILES=3 if i == 192 else 2, DN_TILES=4)], seed)


def test_multi_tile_expert_parallel_rank_without_local_tokens():
    seed = _seed()
    ids = torch.randint(0, 8, (3, 4), dtype=torch.int32)  # every id on other ranks
    p = make_problem(3, 8, 256, 256, 4, "block-dynamic", device="cpu", ids=ids, expert_offset=8)
    cfg = dict(CPU_CFG, GU_N=128, GU_TILES=2, DN_TILES=2)
    out, _, _ = run_and_check(p, config=cfg, seed=seed)
    assert (out == 0).all(), seed


def test_multi_tile_launch_plan_replays_bitwise():
    """A multi-tile config through the launch plans: the first eager call records (the grid is the
    multi-tile one), a second call on other inputs and a third on the first inputs replay, each bitwise
    the unplanned call's output."""
    _seed()
    cfg = dict(CPU_CFG, GU_N=128, GU_TILES=2, DN_TILES=4, PDL=1)
    check_plan_replays(
        "block-dynamic",
        cfg,
        "cpu",
        problem=lambda: make_problem(3, 8, 256, 256, 4, "block-dynamic", device="cpu"),
    )


@pytest.mark.parametrize(
    "mode,t,h,i,cfg",
    [
        # block scales, dynamic a2 (GU_N 128: one group per tile), swapped TMA forms, with multi-tile programs
        (
            "block-dynamic",
            3,
            512,
            256,
            dict(CPU_CFG, GU_N=128, W_TMA=1, W_SCALAR=1, GU_SWAP_AB=1, GU_TILES=2),
        ),
        # T = 1, pointer tiles, I = 128: one N tile per expert (split 4: one K step per split)
        ("block-dynamic", 1, 512, 128, dict(CPU_CFG, GU_N=128)),
        # per-tensor, static a2: 64-wide tiles, the third ragged (I = 160)
        ("tensor-static", 16, 512, 160, dict(CPU_CFG, GU_N=64, DN_K=64, PDL=1)),
    ],
)
def test_split_k_summed_in_gate_up_bitwise_the_separate_launch(mode, t, h, i, cfg, poisoned_workspace):
    """GU_RED: the last split of a tile sums the fp32 partials (split order) and runs the fused epilogue:
    bitwise the split-K path with the SiLU / quantization launch, and every arrival counter back at 0."""
    from hpc_advise.kernels.fused_moe.op_small import _counters

    seed = _seed()
    p = make_problem(t, 8, h, i, 4, mode, device="cpu")
    for split in (2, 4):
        plain, _, _ = run_and_check(p, config=dict(cfg, SPLIT_K=split), seed=seed)
        got, _, _ = run_and_check(p, config=dict(cfg, SPLIT_K=split, GU_RED=1), seed=seed)
        assert torch.equal(plain, got), (seed, split)
        assert not _counters(torch.device("cpu"), 1).any(), "counters are reset by the last arrival"


def test_split_k_summed_in_gate_up_shared_experts_and_fallback(monkeypatch, poisoned_workspace):
    """GU_RED where two tokens share experts and one expert is empty on this rank's half, then with a counter
    slice too small for the (block, N tile) counters: the separate launch runs instead (same output)."""
    seed = _seed()
    ids = torch.tensor([[1, 2, 5, 6], [2, 1, 6, 7]], dtype=torch.int32)
    p = make_problem(2, 8, 512, 256, 4, "block-dynamic", device="cpu", ids=ids)
    cfg = dict(CPU_CFG, GU_N=128, SPLIT_K=2)
    plain, _, _ = run_and_check(p, config=cfg, seed=seed)
    got, _, _ = run_and_check(p, config=dict(cfg, GU_RED=1), seed=seed)
    assert torch.equal(plain, got), seed
    monkeypatch.setattr(op, "COUNTER_SLICE", 4)
    launches = []
    act_quant = op._Launch.act_quant
    monkeypatch.setattr(op._Launch, "act_quant", lambda self, *a: launches.append(a) or act_quant(self, *a))
    fallback, _, _ = run_and_check(p, config=dict(cfg, GU_RED=1), seed=seed)
    assert len(launches) == 1 and torch.equal(plain, fallback), seed


def test_multi_tile_refused_where_the_tiles_do_not_divide():
    """Refused before any launch, with the reason: a tile count that does not divide the GEMM's tiles per
    block (I = 256 has 2 gate/up tiles of 128; H = 256 has 4 down tiles of 64), a count that is not a whole
    number >= 1, and DN_TILES with the down kernel's one-tile L2 prefetch."""
    p = make_problem(2, 8, 256, 256, 4, "block-dynamic", device="cpu")
    base = dict(CPU_CFG, GU_N=128)
    for cfg, words in (
        (dict(base, GU_TILES=3), "GU_TILES=3 must divide the 2 tiles"),
        (dict(base, DN_TILES=8), "DN_TILES=8 must divide the 4 tiles"),
        (dict(base, GU_TILES=0), "whole number"),
        (dict(base, DN_TILES=True), "whole number"),
        (dict(base, DN_TILES=2.0), "whole number"),
        (dict(base, DN_TILES=2, PDL=1, PREFETCH=1), "prefetch"),
        (dict(base, GU_RED=1), "SPLIT_K > 1"),  # nothing to sum
        (dict(base, GU_N=64, SPLIT_K=2, GU_RED=1), "GU_N == 128"),  # a 64-wide tile is half a group
        (dict(base, SPLIT_K=2, GU_RED=2), "must be 0 or 1"),
    ):
        with pytest.raises(FusedMoEError, match=words):
            fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], config=cfg, **p["kw"])


def test_multi_tile_candidates_are_valid_configs_of_every_shape():
    """The tuner's --multi-tile candidates pass the op's checks at every tuned decode point (the current
    pick first, every other a regular config with tiles or split-K), and their precompile jobs are built at an I and H
    the tile counts divide, with I % 128 == 0 exactly where the shape's I has it."""
    from hpc_advise.runtime.benches import fused_moe as fb

    tune = _load_tuner()
    for shape, (e, h, i, k, _, _) in fb.SHAPES.items():
        mode = fb.MODES[shape][0]
        a_group = mode.endswith("dynamic")
        for t in (16, 64, 128):
            cands = tune.multi_tile_candidates(op, t, k, e, h, i, mode)
            assert cands[0] == op.get_config(t, k, e, h, i, mode, a_group)
            assert len(cands) >= 3, (shape, t, cands)
            for c in cands[1:]:
                assert c.get("GU_TILES", 1) > 1 or c.get("DN_TILES", 1) > 1 or c["SPLIT_K"] > 1, c
                c = op.check_config(dict(c), a_group, a_group)
                op.check_forms(c, a_group, a_group, mode.startswith("block"), h, i)
                _, _, _, inter, hidden = tune.multi_tile_compile_job(shape, mode, c)
                op.check_forms(c, a_group, a_group, mode.startswith("block"), hidden, inter)
                assert (inter % 128 == 0) == (i % 128 == 0), (shape, c, inter)


@pytest.mark.slow
def test_multi_tile_programs_compile_pipelined_for_sm90():
    """sm_90a builds of the decode tiles with 2-4 tiles per program: the flattened loop keeps its weight
    tiles in flight (async copies / TMA), the swapped dots stay wgmma, nothing spills, and the DeepSeek-V3
    gate/up tile (swapped, TMA, scalar scales, 3 stages) still fits 2 programs per SM."""
    gu = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, SPLIT_K=1, A_GROUP=True, W_BLOCK=True)
    gu.update(A2_GROUP=True, OUT_MODE=0, EVEN_K=True, FAST_ACC=False, TWO_DOTS=False, USE_PDL=True)
    gu.update(W_TMA=True, W_SCALAR=True, SWAP_AB=True, BLOCK_EXIT=True)
    dn = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, A_GROUP=True, W_BLOCK=True, EVEN_K=True)
    dn.update(FAST_ACC=False, USE_PDL=True, PREFETCH=False, W_TMA=True, W_SCALAR=True, SWAP_AB=True)
    gut = dict(gu, BLOCK_N=64, A_GROUP=False, W_BLOCK=False, A2_GROUP=False, TWO_DOTS=True, W_SCALAR=False)
    dnt = dict(dn, BLOCK_N=64, BLOCK_K=64, A_GROUP=False, W_BLOCK=False, W_SCALAR=False)
    jobs = [
        _sm90_job("_gate_up_kernel", dict(gu, TILES=2), 4, 3),
        _sm90_job("_gate_up_kernel", dict(gu, TILES=3, SWAP_AB=False), 4, 4),
        _sm90_job("_down_kernel", dict(dn, TILES=4), 4, 4),
        _sm90_job("_gate_up_kernel", dict(gut, TILES=3, SWAP_AB=False), 4, 3),
        _sm90_job("_down_kernel", dict(dnt, TILES=8), 4, 4),
    ]
    res = compile_sm90(jobs)
    assert all(r["stack"] == 0 and r["async_copies"] > 0 for r in res), res
    assert res[0]["wgmma"] > 0 and res[2]["wgmma"] > 0 and res[4]["wgmma"] > 0, res
    assert res[0]["ctas_per_sm"] >= 2, res


# ---------------------------------------------------------------------------------------------
# H200: the real decode shapes

GPU_POINTS = {  # name -> (E local, H, I, top_k, global experts, expert offset, mode, T, tiles)
    "deepseek-v3-ep8": (32, 7168, 2048, 8, 256, 64, "block-dynamic", 16, dict(GU_TILES=2, DN_TILES=4)),
    "qwen3-30b-a3b-16": (128, 2048, 768, 8, 128, 0, "block-dynamic", 16, dict(GU_TILES=3, DN_TILES=2)),
    "qwen3-30b-a3b-128": (128, 2048, 768, 8, 128, 0, "block-dynamic", 128, dict(GU_TILES=2, DN_TILES=4)),
    "hy3-tp8": (192, 4096, 192, 8, 192, 0, "tensor-static", 16, dict(GU_TILES=3, DN_TILES=8)),
}


def _regular(t, k, e, h, i, mode):
    cfg = op.get_config(t, k, e, h, i, mode, mode.endswith("dynamic"), allow_small=False)
    return {key: v for key, v in cfg.items() if key != "PREFETCH"}


@pytest.mark.gpu
@pytest.mark.parametrize("point", list(GPU_POINTS))
def test_gpu_multi_tile_bitwise_the_one_tile_programs(point):
    """At the real decode shapes (regular pick, with its swaps / TMA forms where tuned): each tile count on
    its own and both, bitwise the one-tile programs and within 2e-2 of the reference (run_and_check)."""
    seed = _seed()
    e, h, i, k, ge, off, mode, t, tiles = GPU_POINTS[point]
    p = make_problem(t, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off)
    base = _regular(t, k, e, h, i, mode)
    singles = [{key: v} for key, v in tiles.items()]
    _same_with_tiles(p, base, singles + [tiles], seed)


@pytest.mark.gpu
@pytest.mark.parametrize("point", ["hy3-tp8"])  # block scales: the GU_RED graph test below (with DN_TILES)
def test_gpu_multi_tile_graph_replay_tracks_new_routing(point):
    """Captured once (two calls back to back, PDL), replayed with fresh routing written into the ids,
    output poisoned with NaN before each replay (test_fused_moe.check_graph_replay)."""
    seed = _seed()
    e, h, i, k, ge, off, mode, t, tiles = GPU_POINTS[point]
    p = make_problem(t, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off)
    cfg = dict(_regular(t, k, e, h, i, mode), PDL=1, **tiles)
    kw = device_scales(p["kw"])
    out = torch.empty_like(p["x"])
    call = lambda: fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=out, config=cfg, **kw)
    check_graph_replay(p, call, out, seed=seed, replays=3, capture_calls=2)


@pytest.mark.gpu
@pytest.mark.parametrize("point", ["qwen3-30b-a3b-128"])
def test_gpu_multi_tile_eager_plan_replay_bitwise(point):
    """Eager calls through the launch plans: the second call of the signature (replaying the compiled
    multi-tile launches) is bitwise the first (recorded) one, and a call on new routing matches the
    unplanned call."""
    seed = _seed()
    e, h, i, k, ge, off, mode, t, tiles = GPU_POINTS[point]
    p = make_problem(t, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off)
    check_eager_plan_replay(p, dict(_regular(t, k, e, h, i, mode), **tiles), seed=seed)


@pytest.mark.gpu
def test_gpu_multi_tile_expert_parallel_rank_without_local_tokens():
    seed = _seed()
    e, h, i, k, ge, off, mode, t, tiles = GPU_POINTS["deepseek-v3-ep8"]
    ids = torch.randint(0, off, (t, k), device="cuda", dtype=torch.int32)  # all on lower ranks
    p = make_problem(t, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off, ids=ids)
    out, _, _ = run_and_check(p, config=dict(_regular(t, k, e, h, i, mode), **tiles), seed=seed)
    assert (out == 0).all(), seed


@pytest.mark.gpu
@pytest.mark.parametrize("point", ["deepseek-v3-ep8"])
def test_gpu_split_k_summed_in_gate_up_bitwise_the_separate_launch(point):
    """GU_RED at the real T = 16 shape it is for (DeepSeek-V3 EP8: block scales, swapped TMA tiles): split 2
    and 4, bitwise the split-K path with the SiLU / quantization launch, reproducible (with PDL), and the
    arrival counters back at 0."""
    from hpc_advise.kernels.fused_moe.op_small import _counters

    seed = _seed()
    e, h, i, k, ge, off, mode, t, _ = GPU_POINTS[point]
    p = make_problem(t, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off)
    base = _regular(t, k, e, h, i, mode)
    for split in (2, 4):
        plain, _, _ = run_and_check(p, config=dict(base, SPLIT_K=split), seed=seed)
        got, _, _ = run_and_check(p, config=dict(base, SPLIT_K=split, GU_RED=1), seed=seed)
        again, _, _ = run_and_check(p, config=dict(base, SPLIT_K=split, GU_RED=1, PDL=1), seed=seed)
        assert torch.equal(plain, got) and torch.equal(got, again), (seed, split)
    assert not _counters(torch.device("cuda"), 4096).any()


@pytest.mark.gpu
def test_gpu_split_k_summed_in_gate_up_graph_replay_tracks_new_routing():
    seed = _seed()
    e, h, i, k, ge, off, mode, t, tiles = GPU_POINTS["deepseek-v3-ep8"]
    p = make_problem(t, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off)
    cfg = dict(_regular(t, k, e, h, i, mode), PDL=1, SPLIT_K=2, GU_RED=1, DN_TILES=tiles["DN_TILES"])
    out = torch.empty_like(p["x"])
    call = lambda: fused_moe(
        p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=out, config=cfg, **p["kw"]
    )
    check_graph_replay(p, call, out, seed=seed, replays=3, capture_calls=2)
