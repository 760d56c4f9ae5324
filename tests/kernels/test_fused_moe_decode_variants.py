"""Tests of the regular decode path's launch variants ROUTE (ranked router), DN_REDUCE (top-k sum in
the down kernel, no reduce launch) and BLOCK_EXIT (GEMM programs exit on the block's expert) of
hpc_advise.kernels.fused_moe.

CPU tests run the kernels under TRITON_INTERPRET=1 at small sizes against the fp32 reference (same
checker as test_fused_moe.py: NaN-poisoned output, 2e-2 bound, fp8 midpoint second look); the ranked
router is checked element for element against ``moe_align_reference`` (both give the stable order).
``gpu`` tests run DeepSeek-V3 EP8 and Qwen3-30B-A3B shapes on the H200: bitwise the plain launches'
output, bitwise on reruns, and replayed from a CUDA graph with fresh routing.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.fused_moe import op, op_small  # noqa: E402
from hpc_advise.kernels.fused_moe.op import FusedMoEError, fused_moe  # noqa: E402
from hpc_advise.kernels.fused_moe.reference import moe_align_reference  # noqa: E402
from tests.kernels.sm90_compile import compile_sm90  # noqa: E402
from tests.kernels.test_fused_moe import (  # noqa: E402
    CPU_CFG,
    SM90_DOWN,
    SM90_GATE_UP,
    _seed,
    _sm90_job,
    check_graph_replay,
    device_scales,
    make_problem,
    run_and_check,
)

VARIANTS = {"ranked": dict(ROUTE=1), "reduce": dict(DN_REDUCE=1), "exit": dict(BLOCK_EXIT=1)}
ALL = dict(ROUTE=1, DN_REDUCE=1, BLOCK_EXIT=1)


def _cfg(mode: str, **extra) -> dict:
    # the fused per-group epilogue of dynamic a2 needs 128-wide gate/up tiles
    return dict(CPU_CFG, GU_N=128 if mode.endswith("dynamic") else 32, **extra)


def _launch(p, config, offset=0):
    kw = p["kw"]
    return op._Launch(
        p["x"],
        p["w13"],
        p["w2"],
        p["weights"],
        p["ids"],
        kw["w13_scale"],
        kw["w2_scale"],
        kw.get("a13_scale"),
        kw.get("a2_scale"),
        kw.get("block_shape"),
        offset,
        config,
    )


@pytest.mark.parametrize(
    "t,num_experts,top_k,offset,global_experts",
    [(1, 8, 2, 0, 8), (17, 6, 3, 0, 6), (100, 16, 4, 4, 24), (33, 4, 2, 0, 4)],
)
def test_ranked_router_gives_the_stable_order_of_the_torch_reference(
    t, num_experts, top_k, offset, global_experts
):
    """ROUTE = 1: cdiv(n, 64) router programs (T = 100, k = 4: 7, the last one ragged), ids of other EP
    ranks and -1 mixed in; sorted rows, block experts and the used row count exactly the reference's."""
    seed = _seed()
    ids = torch.randint(-1, global_experts, (t, top_k), dtype=torch.int32)
    p = make_problem(
        t, num_experts, 128, 64, top_k, "tensor-static", ids=ids, expert_offset=offset, device="cpu"
    )
    launch = _launch(p, dict(CPU_CFG, ROUTE=1), offset)
    assert launch.ranked and launch.num_route == -(-t * top_k // op.RANKED_CHUNK)
    launch.sorted_ids.fill_(-7)
    launch.block_expert.fill_(-7)
    launch.prep(p["x"])
    s_ref, b_ref, n_ref = moe_align_reference(ids, num_experts, offset, 16, launch.P)
    used = int(n_ref)
    assert launch.num_padded.tolist() == n_ref.tolist(), seed
    assert launch.block_expert.tolist() == b_ref.tolist(), seed
    assert launch.sorted_ids[:used].tolist() == s_ref[:used].tolist(), seed


@pytest.mark.parametrize("mode", ["tensor-static", "block-dynamic"])
@pytest.mark.parametrize("t", [1, 3, 17, 100])
def test_decode_variants_match_reference(mode, t):
    """Both keys together at every T; each alone at T = 17 (below)."""
    seed = _seed()
    p = make_problem(t, 8, 128, 64, 3, mode, device="cpu")
    run_and_check(p, config=_cfg(mode, **ALL), scaling=1.5, seed=seed)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("mode", ["tensor-static", "block-dynamic"])
def test_each_variant_alone_matches_reference(variant, mode):
    seed = _seed()
    p = make_problem(17, 8, 128, 64, 3, mode, device="cpu")
    run_and_check(p, config=_cfg(mode, **VARIANTS[variant]), seed=seed)


@pytest.mark.parametrize("mode", ["tensor-static", "block-dynamic"])
def test_variants_with_empty_and_one_token_experts_and_foreign_slots(mode):
    """Expert 5 takes every token, expert 2 exactly one, experts 0/1/3/4/6/7 none, slots of -1."""
    seed = _seed()
    t, k = 9, 3
    ids = torch.full((t, k), 5, dtype=torch.int32)
    ids[:, 1] = -1
    ids[:, 2] = -1
    ids[0, 1] = 2
    ids[4, 2] = 5  # a token naming one expert in two slots: two rows of one expert block
    p = make_problem(t, 8, 128, 64, k, mode, ids=ids, device="cpu")
    run_and_check(p, config=_cfg(mode, **ALL), seed=seed)


@pytest.mark.parametrize("mode", ["tensor-static", "block-dynamic"])
def test_variants_expert_parallel_tokens_without_local_slots_get_zeros(mode):
    """DN_REDUCE: no down program owns a token without a local slot; the prep launch zeroes its row
    (the output is NaN-poisoned first)."""
    seed = _seed()
    p = make_problem(12, 4, 128, 64, 3, mode, global_experts=16, expert_offset=4, device="cpu")
    p["ids"][0] = torch.tensor([0, 1, 15], dtype=torch.int32)
    p["ids"][7] = torch.tensor([-1, 9, 3], dtype=torch.int32)
    out, _, _ = run_and_check(p, config=_cfg(mode, **ALL), seed=seed)
    assert (out[0] == 0).all() and (out[7] == 0).all(), seed


def test_variants_expert_parallel_rank_without_local_tokens():
    seed = _seed()
    ids = torch.randint(0, 8, (5, 2), dtype=torch.int32)  # all on experts 0..7, this rank has 8..11
    p = make_problem(5, 4, 128, 64, 2, "tensor-static", ids=ids, expert_offset=8, device="cpu")
    out, _, _ = run_and_check(p, config=_cfg("tensor-static", **ALL), seed=seed)
    assert (out == 0).all(), seed


def test_reduce_in_down_leaves_its_counters_at_zero_and_reruns_bitwise():
    seed = _seed()
    p = make_problem(6, 8, 128, 64, 2, "block-dynamic", device="cpu")
    cfg = _cfg("block-dynamic", DN_REDUCE=1)
    first, _, _ = run_and_check(p, config=cfg, seed=seed)
    again, _, _ = run_and_check(p, config=cfg, seed=seed)
    assert torch.equal(first, again), seed
    counters = op_small._counters(torch.device("cpu"), 6 * 2)  # T x cdiv(H 128, DN_N 64)
    assert int(counters.abs().sum()) == 0, seed


def test_reduce_in_down_falls_back_to_the_reduce_launch_where_counters_do_not_fit(monkeypatch):
    """More (token, H tile) counters than one per-stream slice: the reduce launch runs instead (same
    result); prefill sizes (multi-CTA router) keep their own router."""
    seed = _seed()
    monkeypatch.setattr(op, "COUNTER_SLICE", 8)  # T 6 x 2 H tiles = 12 > 8
    p = make_problem(6, 8, 128, 64, 2, "tensor-static", device="cpu")
    cfg = _cfg("tensor-static", **ALL)
    assert not _launch(p, cfg).dn_reduce
    run_and_check(p, config=cfg, seed=seed)
    monkeypatch.setattr(op, "COUNTER_SLICE", op_small.COUNTER_SLICE)
    monkeypatch.setattr(op, "ROUTE_MULTI_MIN_ENTRIES", 1)
    launch = _launch(p, cfg)
    assert launch.route_chunks and not launch.ranked and not launch.dn_reduce


def test_decode_variant_keys_are_validated():
    for key in ("ROUTE", "DN_REDUCE", "BLOCK_EXIT"):
        with pytest.raises(FusedMoEError, match=key):
            op.check_config(dict(CPU_CFG, **{key: 2}), a2_group=False)


@pytest.mark.slow
def test_decode_variant_kernels_compile_for_sm90_without_spills():
    """The ranked prep launch (E_PAD 256: Hy3's 192 experts), the gate/up kernel with the block exit and
    the down kernel with the in-kernel top-k sum build for sm_90a, with and without PDL, without
    register spills; both GEMMs keep their pipelined loads."""
    prep = dict(BLOCK_M=16, E_PAD=256, ROUTE_BLK=256, QROWS=16, GROUP=128, A_GROUP=True)
    prep.update(RANKED=True, CHUNK=64, ZERO_OUT=True, K_PAD=8)
    gate_up = dict(SM90_GATE_UP, BLOCK_M=16, GROUP_M=1, BLOCK_EXIT=True)
    down = dict(SM90_DOWN, BLOCK_M=16, BLOCK_N=64, GROUP_M=1, REDUCE=True, K_PAD=8, BLOCK_EXIT=True)
    jobs = [["_prep_kernel", prep, 4, 3], ["_gate_up_kernel", gate_up, 4, 4], ["_down_kernel", down, 4, 4]]
    jobs += [[name, dict(c, USE_PDL=True), w, st] for name, c, w, st in jobs]
    res = compile_sm90([_sm90_job(*job) for job in jobs])
    assert all(r["stack"] == 0 for r in res), res
    assert all(r["async_copies"] > 0 for r in res if r["kernel"] != "_prep_kernel"), res


# ---------------------------------------------------------------------------------------------
# H200: real shapes

GPU_SHAPES = {  # name -> (E local, H, I, top_k, global experts, expert offset, mode)
    "deepseek-v3-ep8": (32, 7168, 2048, 8, 256, 64, "block-dynamic"),
    "qwen3-30b-a3b": (128, 2048, 768, 8, 128, 0, "block-dynamic"),
    "hy3-tp8": (192, 4096, 192, 8, 192, 0, "tensor-static"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(GPU_SHAPES))
@pytest.mark.parametrize("t", [16, 128])
def test_gpu_decode_variants_bitwise_plain_and_replay(shape, t):
    """ROUTE, DN_REDUCE, BLOCK_EXIT each alone and all three with PDL: bitwise the plain launches' output
    and bitwise on a rerun; captured in a CUDA graph (two calls back to back) and replayed with fresh
    routing."""
    seed = _seed()
    e, h, i, k, ge, off, mode = GPU_SHAPES[shape]
    p = make_problem(t, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off)
    base = op.default_config(t, k, e, h, i, mode.endswith("dynamic"))
    plain, _, _ = run_and_check(p, config=base, seed=seed)
    for extra in (*VARIANTS.values(), dict(ALL, PDL=1)):
        got, _, _ = run_and_check(p, config=dict(base, **extra), seed=seed)
        assert torch.equal(plain, got), (seed, extra)
    cfg = dict(base, **ALL, PDL=1)
    again, _, _ = run_and_check(p, config=cfg, seed=seed)
    assert torch.equal(plain, again), seed
    out = torch.empty_like(plain)
    # device-tensor static scales (the H200 run of 2026-11-29 14:51 failed Hy3 TP8 T = 16 with host floats)
    kw = device_scales(p["kw"])
    call = lambda: fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=out, config=cfg, **kw)
    check_graph_replay(p, call, out, seed=seed, replays=3, capture_calls=2)


@pytest.mark.gpu
def test_gpu_decode_variants_expert_parallel_rank_without_local_tokens():
    """DeepSeek-V3 EP8 shape, T = 64, every id on other ranks: zeros from the prep launch alone."""
    seed = _seed()
    e, h, i, k, ge, off, mode = GPU_SHAPES["deepseek-v3-ep8"]
    ids = torch.randint(0, off, (64, k), dtype=torch.int32, device="cuda")
    p = make_problem(64, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off, ids=ids)
    cfg = dict(op.default_config(64, k, e, h, i, True), **ALL, PDL=1)
    out, _, _ = run_and_check(p, config=cfg, seed=seed)
    assert (out == 0).all(), seed
