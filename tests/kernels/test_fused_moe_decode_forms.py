"""Tests of the regular path's tile forms at decode sizes (BLOCK_M 16, split-K included): TMA weight
tiles (W_TMA), one scalar block scale per tile half (W_SCALAR) and the down GEMM's activation rows by
TMA (DN_A_TMA), first built for prefill (test_fused_moe_prefill.py) and timed at T <= 128 by
``benchmarks/tune_fused_moe.py --decode-forms``.

The TMA forms load the same bytes as the masked pointer loads (the copy engine zero-fills what the masks
zero) and leave every product and sum in place, so their output is bitwise the pointer form's; W_SCALAR
multiplies each step's product by the same fp32 scale value the per-column vector holds, so it is held
to 1e-3 of the vector form (bitwise on the interpreter and where the compiler keeps the same
contraction; the GPU test prints which). Every output is also checked against the fp32 reference
(2e-2, test_fused_moe.py's checker). CPU tests run under the Triton interpreter at small sizes; the
``gpu`` tests run the tuned decode picks of DeepSeek-V3 EP8, Qwen3-30B-A3B, Qwen3-235B and Hy3 TP8 on
the H200, replayed from a CUDA graph with fresh routing, and an EP rank without local tokens.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.fused_moe import op, op_persistent, op_small  # noqa: E402
from hpc_advise.kernels.fused_moe.op import fused_moe  # noqa: E402
from tests.kernels.sm90_compile import compile_sm90  # noqa: E402
from tests.kernels.test_fused_moe import (  # noqa: E402
    CPU_CFG,
    _seed,
    _sm90_job,
    check_graph_replay,
    device_scales,
    make_problem,
    rel_err,
    run_and_check,
)

SCALAR_REL_DIFF_MAX = 1e-3  # W_SCALAR vs the per-column scale vector: same products, same order


@pytest.mark.parametrize(
    "mode,t,h,i,cfg",
    [
        # block scales, dynamic a2: the fused per-group epilogue (GU_N 128), I = 256 (two groups)
        ("block-dynamic", 3, 256, 256, dict(CPU_CFG, GU_N=128)),
        # split-K 2 with 64-wide gate/up tiles (fp32 partials + the SiLU/quantization launch), K = 384
        ("block-dynamic", 5, 384, 256, dict(CPU_CFG, GU_N=64, SPLIT_K=2)),
        # per-tensor weights, static scales, I = 192: two dots, ragged last gate/up tile, 64-wide down K
        ("tensor-static", 4, 256, 192, dict(CPU_CFG, GU_N=64, DN_K=64)),
    ],
)
def test_decode_forms_bitwise_the_pointer_form(mode, t, h, i, cfg):
    seed = _seed()
    p = make_problem(t, 8, h, i, 4, mode, device="cpu")
    plain, _, _ = run_and_check(p, config=cfg, seed=seed)
    for extra in (dict(W_TMA=1), dict(W_TMA=1, DN_A_TMA=1), dict(DN_A_TMA=1)):
        got, _, _ = run_and_check(p, config=dict(cfg, **extra), seed=seed)
        assert torch.equal(plain, got), (seed, extra)
    if mode.startswith("block"):
        scalar, _, _ = run_and_check(p, config=dict(cfg, W_SCALAR=1), seed=seed)
        assert rel_err(scalar, plain) <= SCALAR_REL_DIFF_MAX, seed
        both, _, _ = run_and_check(p, config=dict(cfg, W_SCALAR=1, W_TMA=1, DN_A_TMA=1), seed=seed)
        assert torch.equal(scalar, both), seed


def test_decode_forms_expert_parallel_rank_without_local_tokens():
    seed = _seed()
    ids = torch.randint(0, 8, (3, 4), dtype=torch.int32)  # every id on other ranks
    p = make_problem(3, 8, 256, 256, 4, "block-dynamic", device="cpu", ids=ids, expert_offset=8)
    cfg = dict(CPU_CFG, GU_N=128, W_TMA=1, W_SCALAR=1, DN_A_TMA=1)
    out, _, _ = run_and_check(p, config=cfg, seed=seed)
    assert (out == 0).all(), seed


def test_only_the_regular_path_checks_the_tile_forms(monkeypatch):
    """op._Launch checks W_TMA / W_SCALAR / ... (op.check_forms) for regular-path configs only: the
    small-T and persistent paths have their own checks and never read those keys."""
    seen = []
    monkeypatch.setattr(op, "check_forms", lambda cfg, *a: seen.append(cfg.get("PATH", "regular")))
    p = make_problem(2, 8, 256, 256, 4, "block-dynamic", device="cpu")
    kw = p["kw"]
    args = (p["x"], p["w13"], p["w2"], p["weights"], p["ids"], kw["w13_scale"], kw["w2_scale"])
    args += (None, None, kw["block_shape"], 0)
    small = op_small.default_small_config(2, 4, 8, 256, 256, True)
    persistent = op_persistent.default_persistent_config(True)
    for cfg in (persistent, small, dict(CPU_CFG, GU_N=128)):
        op._Launch(*args, cfg, allow_small=True)
    assert seen == ["regular"]


def test_dynamic_modes_share_one_unit_scale_tensor():
    """The unused activation scale of the dynamic modes is one cached 1.0 per device (no fill launch per
    eager call); static scales stay the caller's values."""
    p = make_problem(2, 8, 256, 256, 4, "block-dynamic", device="cpu")
    kw = p["kw"]
    args = (p["x"], p["w13"], p["w2"], p["weights"], p["ids"], kw["w13_scale"], kw["w2_scale"])
    first = op._Launch(*args, None, None, kw["block_shape"], 0, dict(CPU_CFG, GU_N=128))
    second = op._Launch(*args, None, 0.25, kw["block_shape"], 0, dict(CPU_CFG, GU_N=128))
    assert first.a13.data_ptr() == first.a2.data_ptr() == second.a13.data_ptr()
    assert float(first.a13) == 1.0 and float(second.a2) == 0.25


def test_decode_form_candidates_are_valid_configs_of_every_shape():
    """The tuner's --decode-forms candidates pass the op's checks at every tuned decode point (so none is
    refused at launch), W_SCALAR only with block scales and I % 128 == 0, and the current pick first."""
    from hpc_advise.runtime.benches import fused_moe as fb

    for shape, (e, h, i, k, _, _) in fb.SHAPES.items():
        mode = fb.MODES[shape][0]
        a_group = mode.endswith("dynamic")
        for t in (16, 64, 128):
            cands = fb.decode_form_candidates(op, t, k, e, h, i, mode)
            assert cands[0] == op.get_config(t, k, e, h, i, mode, a_group)
            assert any(c.get("W_TMA") for c in cands) and any(c.get("DN_A_TMA") for c in cands)
            scalar = any(c.get("W_SCALAR") for c in cands)
            assert scalar == (mode.startswith("block") and i % 128 == 0), (shape, t)
            for c in cands:
                c = op.check_config(dict(c), a_group, a_group)
                if c.get("PATH") is None:
                    op.check_forms(c, a_group, a_group, mode.startswith("block"), h, i)


def test_precompile_builds_persistent_kernels_at_the_real_hidden_size():
    """The persistent kernel's constexpr G_PAD follows H, so its precompile jobs carry the shape's H
    (at H = 256 every candidate compiled again inside the tuner's timed budget, 16:00 UTC call); the
    regular and small-T jobs stay at H = 256 (one build serves every shape)."""
    from hpc_advise.runtime.benches import fused_moe as fb

    for shape, (e, h, i, *_rest) in fb.SHAPES.items():
        mode = fb.MODES[shape][0]
        pers = op_persistent.default_persistent_config(mode.endswith("dynamic"))
        assert fb.compile_job(shape, mode, pers)[3:] == (256 if i % 128 == 0 else 192, h)
        regular = op.get_config(16, 8, e, h, i, mode, mode.endswith("dynamic"), allow_small=False)
        assert fb.compile_job(shape, mode, regular, unfused=True)[2:] == (
            True,
            256 if i % 128 == 0 else 192,
            256,
        )


@pytest.mark.slow
def test_decode_form_tiles_compile_for_sm90_with_fewer_registers():
    """sm_90a builds of the decode tiles (BLOCK_M 16, 4 warps; mma.sync, not wgmma, at 16 rows): TMA
    weight tiles and scalar scales take registers off the block-scaled gate/up tile (188 -> 162 when
    written) and the 128-row down tile (138 -> 96), no spills; the 3-stage TMA gate/up tile fits 3
    programs per SM (2 with pointer loads); with A_TMA the down kernel has no cp.async left."""
    gu = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, SPLIT_K=1, A_GROUP=True, W_BLOCK=True)
    gu.update(A2_GROUP=True, OUT_MODE=0, EVEN_K=True, FAST_ACC=False, TWO_DOTS=False, USE_PDL=True)
    dn = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, A_GROUP=True, W_BLOCK=True, EVEN_K=True)
    dn.update(FAST_ACC=False, USE_PDL=True)
    jobs = [
        ["_gate_up_kernel", gu, 4, 3],
        ["_gate_up_kernel", dict(gu, W_TMA=True, W_SCALAR=True), 4, 3],
        ["_down_kernel", dn, 4, 4],
        ["_down_kernel", dict(dn, W_TMA=True, W_SCALAR=True), 4, 4],
        ["_down_kernel", dict(dn, W_TMA=True, W_SCALAR=True, A_TMA=True), 4, 4],
    ]
    res = compile_sm90([_sm90_job(*job) for job in jobs])
    assert all(r["stack"] == 0 for r in res), res
    assert res[1]["registers"] < res[0]["registers"] and res[3]["registers"] < res[2]["registers"], res
    assert res[1]["ctas_per_sm"] > res[0]["ctas_per_sm"], res
    assert res[4]["async_copies"] == 0 and res[3]["async_copies"] > 0, res


# ---------------------------------------------------------------------------------------------
# H200: the tuned decode picks with the forms

GPU_POINTS = {  # name -> (E local, H, I, top_k, global experts, expert offset, mode, T)
    "deepseek-v3-ep8": (32, 7168, 2048, 8, 256, 64, "block-dynamic", 16),
    "qwen3-30b-a3b": (128, 2048, 768, 8, 128, 0, "block-dynamic", 64),
    "qwen3-235b": (128, 4096, 1536, 8, 128, 0, "block-dynamic", 128),
    "hy3-tp8": (192, 4096, 192, 8, 192, 0, "tensor-static", 16),
}


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(GPU_POINTS))
def test_gpu_decode_forms_bitwise_the_pointer_form(shape):
    """The regular pick at a decode point with each form the tuner times: TMA forms bitwise the pointer
    form, W_SCALAR within 1e-3 of the vector scales (bitwise or not: printed), all against the reference."""
    seed = _seed()
    e, h, i, k, ge, off, mode, t = GPU_POINTS[shape]
    p = make_problem(t, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off)
    base = op.get_config(t, k, e, h, i, mode, mode.endswith("dynamic"), allow_small=False)
    base = {key: v for key, v in base.items() if key not in ("W_TMA", "W_SCALAR", "DN_A_TMA")}
    plain, _, err = run_and_check(p, config=base, seed=seed)
    for extra in (dict(W_TMA=1), dict(W_TMA=1, DN_A_TMA=1), dict(W_TMA=1, GU_STAGES=3, DN_N=128)):
        ref_form = dict(base, **{key: v for key, v in extra.items() if key in ("GU_STAGES", "DN_N")})
        ref_out = plain if ref_form == base else run_and_check(p, config=ref_form, seed=seed)[0]
        got, _, _ = run_and_check(p, config=dict(base, **extra), seed=seed)
        assert torch.equal(ref_out, got), (seed, extra)
    if mode.startswith("block"):
        scalar, _, _ = run_and_check(p, config=dict(base, W_SCALAR=1), seed=seed)
        both, _, _ = run_and_check(p, config=dict(base, W_SCALAR=1, W_TMA=1, DN_A_TMA=1), seed=seed)
        diff = rel_err(scalar, plain)
        print(
            f"{shape} T={t}: rel err {err:.2e}; W_SCALAR vs vector scales {diff:.2e} (bitwise: {diff == 0})"
        )
        assert diff <= SCALAR_REL_DIFF_MAX, seed
        assert torch.equal(scalar, both), seed


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["deepseek-v3-ep8", "hy3-tp8"])
def test_gpu_decode_forms_graph_replay_tracks_new_routing(shape):
    """Every form on, with PDL: captured in a CUDA graph (two calls back to back; the TMA descriptors are
    launch parameters) and replayed with fresh routing three times."""
    seed = _seed()
    e, h, i, k, ge, off, mode, t = GPU_POINTS[shape]
    p = make_problem(t, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off)
    base = op.get_config(t, k, e, h, i, mode, mode.endswith("dynamic"), allow_small=False)
    cfg = dict(base, W_TMA=1, DN_A_TMA=1, PDL=1, W_SCALAR=int(mode.startswith("block")))
    kw = device_scales(p["kw"])
    out = torch.empty_like(p["x"])
    call = lambda: fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=out, config=cfg, **kw)
    check_graph_replay(p, call, out, seed=seed, replays=3, capture_calls=2)


@pytest.mark.gpu
def test_gpu_decode_forms_expert_parallel_rank_without_local_tokens():
    seed = _seed()
    e, h, i, k, ge, off, mode, _ = GPU_POINTS["deepseek-v3-ep8"]
    ids = torch.randint(0, off, (64, k), dtype=torch.int32, device="cuda")
    p = make_problem(64, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off, ids=ids)
    cfg = dict(op.default_config(64, k, e, h, i, True), W_TMA=1, W_SCALAR=1, DN_A_TMA=1, PDL=1)
    out, _, _ = run_and_check(p, config=cfg, seed=seed)
    assert (out == 0).all(), seed
