"""Tests of the prefill forms of the FP8 fused MoE's regular path (config keys W_TMA and 256-wide K
steps; hpc_advise/kernels/fused_moe/README.md, "Prefill").

- W_TMA = 1: both GEMMs read their weight tiles through host-side TMA tensor descriptors (the gathered
  activation rows stay pointer loads); DN_A_TMA = 1: the down GEMM reads its activation rows (the
  intermediate, contiguous in the padded order) by TMA too. On CPU the interpreter runs the descriptor loads, so the form is
  checked against the fp32 reference at small sizes, including ragged N (I = 192 with 128-wide tiles:
  rows past N come zero-filled from the copy engine) and K not a multiple of the step.
- GU_K / DN_K = 256 with per-tensor weight and static activation scales: fp32 promotion of the fp8
  tensor-core partial sums every 256 instead of every 128 (only the GPU accumulates in reduced
  precision; its error against the promoted kernel is measured there and printed).
- GU_TILES / DN_TILES (several N tiles per program) and GU_PERSIST / DN_PERSIST (persistent programs striding over
  the used tiles) at prefill tiles: bitwise the one-tile programs, their refusals, the tuner's --prefill-tiles
  candidates, and their sm_90a builds (one pipelined flattened loop; which tiles spill).
GPU tests run the real prefill shapes (T = 1024 and 4096, both scale modes, an EP rank, empty experts; the tile forms
at Hy3 T = 4096 and DeepSeek-V3 EP8 T = 16384, persistent programs under graph replay).
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from hpc_advise.kernels.fused_moe import op  # noqa: E402
from hpc_advise.kernels.fused_moe.op import FusedMoEError, fused_moe  # noqa: E402
from tests.kernels.sm90_compile import compile_sm90  # noqa: E402
from tests.kernels.test_fused_moe import (  # noqa: E402
    PREFILL_CFG,
    SM90_DOWN,
    SM90_GATE_UP,
    _seed,
    _sm90_job,
    check_graph_replay,
    device_scales,
    make_problem,
    rel_err,
    run_and_check,
)

# the half-height tile keys (GU_HALF, DN_HALF; tests at the end of the file), dropped where a test varies a form
# they have none of (DN_A_TMA, BLOCK_M 64, persistent programs)
HALF_KEYS = ("GU_HALF", "DN_HALF")


def _triton_full_tiles(cfg: dict) -> dict:
    """A tuned pick as the Triton kernels' full-height tiles: no half-height blocks and, where the pick runs the
    ping-pong Gluon down GEMM (Hy3 T = 4096 / 16384), the Triton down GEMM of the same tile (``op.triton_down_form``):
    the forms these tests vary (TMA operands, multi-tile and persistent programs) are the Triton kernels'."""
    return op.triton_down_form({key: v for key, v in cfg.items() if key not in HALF_KEYS})


# promotion every 256 against every 128 (per-tensor): measured 4.1e-3 - 5.0e-3 on the H200 (5.0003e-3 for one seed on
# 2026-11-30, so the tuner's 5e-3 accuracy guard may drop such a form at tune time); bounded below what no promotion
# at all (FAST_ACC) reads, 1.1-1.2e-2, so a form that silently stopped promoting fails
PROMOTION_REL_DIFF_MAX = 1e-2


def _ragged_ids(t: int, k: int, e: int) -> torch.Tensor:
    """Experts with 0, 1, a few and more than one 64-row block of rows; one slot of another EP rank."""
    ids = torch.randint(1, e, (t, k), dtype=torch.int32)
    ids[:, 0] = e - 2  # every token: more than one 64-row block
    ids[0, 1] = 1  # expert 1: likely few rows; expert 0: none
    ids[:, 1] = torch.where(ids[:, 1] == 0, 1, ids[:, 1])
    ids[:, 2] = torch.where(ids[:, 2] == 0, 2, ids[:, 2])
    ids[1, 2] = -1  # slot on another EP rank
    return ids


def _ragged_prefill_run(mode, h, i, extra, monkeypatch):
    """(problem, config, seed, output) of a small CPU prefill run through the multi-CTA router (chunks of 32)
    with ragged routing (an expert with none, one with more than one block, a slot of another EP rank), the
    config PREFILL_CFG + extra; the output checked against the reference at scaling 1.5."""
    monkeypatch.setattr(op, "ROUTE_MULTI_MIN_ENTRIES", 1)  # the prefill router too
    monkeypatch.setattr(op, "ROUTE_CHUNK", 32)
    seed = _seed()
    t, k, e = 40, 3, 6
    p = make_problem(t, e, h, i, k, mode, ids=_ragged_ids(t, k, e), device="cpu")
    cfg = dict(PREFILL_CFG, **extra)
    plain, _, _ = run_and_check(p, config=cfg, scaling=1.5, seed=seed)
    return p, cfg, seed, plain


def _moe(p, **kw):
    """fused_moe on make_problem's tensors; ``kw`` adds call arguments (out, config) or replaces the problem's
    scale arguments (device copies for graph capture)."""
    return fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], **(p["kw"] | kw))


@pytest.mark.parametrize(
    "mode,h,i,extra",
    [
        ("tensor-static", 384, 192, {}),  # two dots, promotion every 128; I = 192: ragged 2nd N tile
        ("tensor-static", 384, 192, {"FAST_ACC": 1}),  # one merged dot: [1, 2, BN, BK] blocks
        ("block-dynamic", 384, 192, {}),  # merged dot, per-step scales
        ("tensor-static", 320, 256, {"GU_K": 256, "DN_K": 256}),  # 256-wide steps, K = 320 ragged
        ("block-static", 256, 128, {"DN_N": 256}),
        ("block-dynamic", 384, 256, {"W_SCALAR": 1}),  # scalar weight scales, merged dot
        ("block-dynamic", 256, 256, {"W_SCALAR": 1, "GU_TWO_DOTS": 1, "BLOCK_M": 128}),  # scaled two dots
        ("tensor-dynamic", 256, 192, {"GU_TWO_DOTS": 1}),  # activation group scales only, ragged I
    ],
)
def test_weight_tma_matches_reference_and_the_pointer_form(mode, h, i, extra, monkeypatch):
    p, cfg, seed, plain = _ragged_prefill_run(mode, h, i, extra, monkeypatch)
    for tma_keys in ({"W_TMA": 1}, {"DN_A_TMA": 1}, {"W_TMA": 1, "DN_A_TMA": 1}):
        tma, _, _ = run_and_check(p, config=dict(cfg, **tma_keys), scaling=1.5, seed=seed)
        # same tiles, same products: the interpreter's sums are exact, so the forms agree bitwise
        assert torch.equal(plain, tma), (tma_keys, seed)


def test_weight_tma_expert_parallel_rank_without_local_tokens():
    seed = _seed()
    ids = torch.randint(0, 8, (20, 2), dtype=torch.int32)  # all on experts 0..7, this rank has 8..11
    p = make_problem(20, 4, 256, 128, 2, "block-dynamic", ids=ids, expert_offset=8, device="cpu")
    out, _, _ = run_and_check(p, config=dict(PREFILL_CFG, W_TMA=1), seed=seed)
    assert (out == 0).all()


def test_wide_k_steps_only_without_group_scales():
    """A 256-wide K step is refused where that GEMM has 128-wide scale groups (it would apply one
    group's scale to two groups), and above 256 everywhere."""
    p = make_problem(4, 4, 256, 128, 2, "block-dynamic", device="cpu")
    with pytest.raises(FusedMoEError, match="GU_K=256"):
        _moe(p, config=dict(PREFILL_CFG, GU_K=256))
    q = make_problem(4, 4, 256, 128, 2, "tensor-dynamic", device="cpu")  # static weights, dynamic a2
    with pytest.raises(FusedMoEError, match="DN_K=256"):
        _moe(q, config=dict(PREFILL_CFG, DN_K=256))
    with pytest.raises(FusedMoEError, match="BLOCK_K"):
        op.check_config(dict(PREFILL_CFG, GU_K=512), False, False)
    with pytest.raises(FusedMoEError, match="W_TMA=2"):
        op.check_config(dict(PREFILL_CFG, W_TMA=2), False, False)


def test_scalar_scales_and_two_dots_need_group_aligned_tiles():
    """W_SCALAR and block-scaled GU_TWO_DOTS take one weight scale per tile half and K step, so each
    half must lie in one 128-row group: refused for I = 192 (the up half straddles two groups) and for
    256-wide down tiles, with the reason."""
    p = make_problem(4, 4, 256, 192, 2, "block-dynamic", device="cpu")
    with pytest.raises(FusedMoEError, match="W_SCALAR"):
        _moe(p, config=dict(PREFILL_CFG, W_SCALAR=1))
    with pytest.raises(FusedMoEError, match="GU_TWO_DOTS"):
        _moe(p, config=dict(PREFILL_CFG, GU_TWO_DOTS=1))
    with pytest.raises(FusedMoEError, match="W_SCALAR"):
        op.check_forms(dict(PREFILL_CFG, W_SCALAR=1, DN_N=256), True, True, True, 256, 256)
    with pytest.raises(FusedMoEError, match="FAST_ACC"):
        op.check_config(dict(PREFILL_CFG, GU_TWO_DOTS=1, FAST_ACC=1), False, False)


@pytest.mark.parametrize("key", ["W_TMA", "DN_A_TMA"])
def test_tma_forms_refuse_rows_that_are_not_16_byte_multiples(key):
    """I = 40: 40-byte rows cannot be TMA tiles; refused before any launch, the output untouched."""
    p = make_problem(4, 4, 128, 40, 2, "tensor-static", device="cpu")
    out = torch.full_like(p["x"], 7.0)
    with pytest.raises(FusedMoEError, match="16-byte rows"):
        _moe(p, out=out, config=dict(PREFILL_CFG, **{key: 1}))
    assert (out == 7.0).all()


def test_default_prefill_config_takes_the_tma_forms_where_the_shape_allows():
    """Untuned shapes at prefill sizes (T·k > 2048) with dynamic scales get W_TMA (16-byte rows) and
    W_SCALAR (I % 128 == 0), as tuned on the three block-scaled shapes; per-tensor static ones do not;
    and the default config runs a prefill-sized call against the reference (block scales, CPU)."""
    cfg = op.default_config(4096, 8, 128, 4096, 1536, True)
    assert cfg["W_TMA"] == 1 and cfg["W_SCALAR"] == 1 and cfg["GU_STAGES"] == 4
    assert op.default_config(4096, 8, 128, 4096, 192, True)["W_SCALAR"] == 0  # up half straddles groups
    assert "W_TMA" not in op.default_config(4096, 8, 128, 4096, 40, True)  # 40-byte rows: no TMA
    assert "W_TMA" not in op.default_config(4096, 8, 128, 4096, 1536, False)
    seed = _seed()
    p = make_problem(260, 8, 128, 128, 8, "block-dynamic", device="cpu")  # 2080 entries: prefill branch
    default = op.default_config(260, 8, 8, 128, 128, True)
    assert default["W_TMA"] == 1 and default["W_SCALAR"] == 1
    out, _, _ = run_and_check(p, config=None, seed=seed)  # no configs.json entry: the default config
    plain, _, _ = run_and_check(p, config=dict(default, W_TMA=0, W_SCALAR=0, GU_STAGES=3), seed=seed)
    assert torch.equal(out, plain), seed


def test_shipped_prefill_configs_fit_their_shapes():
    """Every regular-path entry of configs.json passes the prefill-form checks for its own shape (a
    W_SCALAR / GU_TWO_DOTS / TMA entry tuned for one shape must not land on a shape it cannot serve)."""
    data = json.loads(op.CONFIG_PATH.read_text())
    regular = [x for x in data["entries"] if x["config"].get("PATH") is None]
    assert any(x["config"].get("W_TMA") for x in regular)  # the H200 sweep's forms are shipped
    for x in regular:
        mode = x["mode"]
        a1 = mode.endswith("dynamic")
        op.check_forms(x["config"], a1, a1, mode.startswith("block"), x["H"], x["I"])


@pytest.mark.slow
def test_weight_tma_tiles_compile_for_sm90_without_spills():
    """The W_TMA GEMMs build for sm_90a with wgmma, the activation rows still by cp.async, and no
    register spills, for the prefill tiles the tuner times (block scales: BLOCK_M 64 / 8 warps merged
    gate|up, 4-warp down; per-tensor: BLOCK_M 128 two dots, 128- and 256-wide K steps)."""
    gu = dict(SM90_GATE_UP, W_TMA=True)
    static = dict(gu, BLOCK_M=128, A_GROUP=False, W_BLOCK=False, A2_GROUP=False, TWO_DOTS=True)
    dn = dict(SM90_DOWN, W_TMA=True)
    dn_static = dict(dn, BLOCK_M=128, A_GROUP=False, W_BLOCK=False)
    jobs = [
        ["_gate_up_kernel", gu, 8, 3],
        ["_gate_up_kernel", dict(gu, W_TMA=False), 8, 3],  # the pointer form, for the register count
        ["_gate_up_kernel", dict(gu, W_SCALAR=True), 8, 3],
        ["_down_kernel", dict(dn, W_SCALAR=True), 4, 3],
        ["_gate_up_kernel", static, 8, 4],
        ["_gate_up_kernel", dict(static, BLOCK_K=256), 8, 2],
        ["_down_kernel", dn, 4, 3],
        ["_down_kernel", dn_static, 8, 4],
        ["_down_kernel", dict(dn_static, BLOCK_K=256), 8, 2],
        ["_down_kernel", dict(dn, W_SCALAR=True, A_TMA=True), 4, 3],  # both operands by TMA
        ["_down_kernel", dict(dn_static, A_TMA=True), 8, 4],
    ]
    res = compile_sm90([_sm90_job(*job) for job in jobs])
    for job, r in zip(jobs, res, strict=True):  # (with A_TMA the down kernel has no cp.async left)
        assert r["stack"] == 0 and r["wgmma"] > 0 and (r["async_copies"] > 0) != job[1].get("A_TMA", False), (
            job,
            r,
        )
    # block-scaled gate/up: TMA weight tiles and scalar weight scales free registers (246 -> 178 when
    # written); fewer address and scale registers is what the forms are for
    assert res[0]["registers"] < res[1]["registers"] and res[2]["registers"] < res[0]["registers"], res
    # the shipped BLOCK_M 128 block-scaled two-dot tile (T = 16384) sits at 255 registers with a small
    # stack frame (8 / 16 bytes when written, stored before the K loop and reloaded after it per the
    # SASS); a larger frame would mean spills have moved into the loop's working set
    two = dict(gu, BLOCK_M=128, TWO_DOTS=True, W_SCALAR=True)
    res = compile_sm90([_sm90_job("_gate_up_kernel", dict(two, W_TMA=w), 8, 3) for w in (False, True)])
    assert all(r["stack"] <= 16 and r["wgmma"] > 0 for r in res), res


# ---------------------------------------------------------------------------------------------
# H200: real prefill shapes

GPU_PREFILL = {  # name -> (E local, H, I, top_k, global experts, expert offset, mode)
    "hy3": (192, 4096, 1536, 8, 192, 0, "tensor-static"),
    "hy3-tp8": (192, 4096, 192, 8, 192, 0, "tensor-static"),
    "qwen3-30b-a3b": (128, 2048, 768, 8, 128, 0, "block-dynamic"),
    "deepseek-v3-ep8": (32, 7168, 2048, 8, 256, 64, "block-dynamic"),
}


def _skewed_replay_and_empty_ep_rank(shape, cfg, seed, replays):
    """GPU, T = 1024 on ``shape`` (a GPU_PREFILL entry) with ``cfg``: one expert takes every token and one the first
    three rows, the rest none (checked against the reference); the call replays ``replays`` times from a CUDA graph
    with fresh routing (static activation scales as device tensors: a host float would be copied inside the
    capture); an EP rank without local tokens gives zeros."""
    e, h, i, k, _, _, mode = shape
    ids = torch.full((1024, k), -1, dtype=torch.int32, device="cuda")
    ids[:, 0] = 7
    ids[:3, 1] = 11
    p = make_problem(1024, e, h, i, k, mode, device="cuda", ids=ids)
    run_and_check(p, config=cfg, seed=seed)
    out = torch.empty_like(p["x"])
    kw = device_scales(p["kw"])
    call = lambda: _moe(p, out=out, config=cfg, **kw)  # noqa: E731
    check_graph_replay(p, call, out, seed=seed, replays=replays)
    away = torch.randint(0, e, (1024, k), dtype=torch.int32, device="cuda")  # all on experts of rank 0
    q = make_problem(1024, e, h, i, k, mode, device="cuda", global_experts=2 * e, expert_offset=e, ids=away)
    got, _, _ = run_and_check(q, config=cfg, seed=seed)
    assert (got == 0).all(), seed


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(GPU_PREFILL))
@pytest.mark.parametrize("t", [1024, 4096])
def test_gpu_weight_tma_real_prefill_shapes(shape, t):
    """W_TMA against the reference at the tuned config's tiles, and against the pointer form: the same
    tiles and products, so the output is bitwise the same."""
    seed = _seed()
    e, h, i, k, ge, off, mode = GPU_PREFILL[shape]
    p = make_problem(t, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off)
    cfg = _triton_full_tiles(op.get_config(t, k, e, h, i, mode, mode.endswith("dynamic"), allow_small=False))
    plain, _, _ = run_and_check(p, config=dict(cfg, W_TMA=0, DN_A_TMA=0), seed=seed)
    tma, _, err = run_and_check(p, config=dict(cfg, W_TMA=1, DN_A_TMA=1), seed=seed)
    print(f"{shape} T={t} W_TMA + DN_A_TMA rel err vs quantized ref {err:.2e}")
    assert torch.equal(plain, tma), seed
    if mode.startswith("block"):  # the scalar-scale and two-dot forms against the vector-scale merged dot
        old = dict(cfg, W_TMA=0, W_SCALAR=0, GU_TWO_DOTS=0, BLOCK_M=64, GU_WARPS=8, GU_STAGES=3)
        ref_old, _, _ = run_and_check(p, config=old, seed=seed)
        assert rel_err(plain, ref_old) <= 1e-3, seed  # same products; only fp32 summation order may differ


@pytest.mark.gpu
def test_gpu_weight_tma_empty_experts_and_graph_replay():
    """One expert takes every token, a few get three, the rest none; the W_TMA call replays from a CUDA
    graph with fresh routing (the descriptors are launch parameters, the weights do not move)."""
    seed = _seed()
    t, k, e = 1024, 8, 128
    ids = torch.full((t, k), -1, dtype=torch.int32, device="cuda")
    ids[:, 0] = 7
    ids[:3, 1] = 11
    p = make_problem(t, e, 2048, 768, k, "block-dynamic", device="cuda", ids=ids)
    cfg = op.get_config(t, k, e, 2048, 768, "block-dynamic", True, allow_small=False)
    cfg = dict(cfg, W_TMA=1, DN_A_TMA=1)
    run_and_check(p, config=cfg, seed=seed)
    out = torch.empty_like(p["x"])
    call = lambda: _moe(p, out=out, config=cfg)  # noqa: E731
    check_graph_replay(p, call, out, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["hy3", "hy3-tp8"])
def test_gpu_wide_k_promotion_error(shape):
    """Per-tensor scales at T = 1024: fp32 promotion every 256 (GU_K = DN_K = 256, with and without
    W_TMA) against every 128 (the shipped form). Printed, and bounded below what FAST_ACC (no
    promotion) reads, 1.1-1.2e-2 (PROMOTION_REL_DIFF_MAX's comment)."""
    seed = _seed()
    e, h, i, k, ge, off, mode = GPU_PREFILL[shape]
    p = make_problem(1024, e, h, i, k, mode, device="cuda")
    base = dict(op.get_config(1024, k, e, h, i, mode, False, allow_small=False), BLOCK_M=128, GU_N=128)
    ref, _, _ = run_and_check(p, config=base, seed=seed)
    for extra in ({"GU_K": 256, "DN_K": 256, "GU_STAGES": 2, "DN_STAGES": 2}, {"GU_K": 256, "GU_STAGES": 2}):
        for tma in (0, 1):
            out, _, err = run_and_check(p, config=dict(base, W_TMA=tma, **extra), seed=seed)
            diff = rel_err(out, ref)
            print(f"{shape} T=1024 {extra} W_TMA={tma}: vs promoted-every-128 {diff:.2e}, vs ref {err:.2e}")
            assert diff <= PROMOTION_REL_DIFF_MAX, (extra, tma, diff, seed)


# ---------------------------------------------------------------------------------------------
# the scale / promotion lag (config SCALE_LAG) at prefill tiles

PT_GATE_UP = dict(SM90_GATE_UP, A_GROUP=False, W_BLOCK=False, A2_GROUP=False, TWO_DOTS=True)


@pytest.mark.parametrize(
    "mode,h,i,extra",
    [
        ("tensor-static", 384, 192, {}),  # per-tensor: the promotion add lagged; ragged 2nd N tile
        ("tensor-static", 320, 256, {"W_TMA": 1}),  # K = 320: the last step 64 wide (zero-filled by TMA)
        ("tensor-static", 384, 256, {"BLOCK_M": 128, "GU_N": 64}),  # the tile that replaces 128 x 128
        ("block-dynamic", 256, 256, {"W_SCALAR": 1, "W_TMA": 1, "GU_TWO_DOTS": 1}),  # block scales, 2 steps
    ],
)
def test_scale_lag_at_prefill_tiles_bitwise_the_two_dot_form(mode, h, i, extra, monkeypatch):
    """SCALE_LAG at the prefill tiles (BLOCK_M 64 / 128, 8 warps) with the multi-CTA router and ragged routing
    (an expert with none, one with more than one block, a slot of another EP rank): bitwise the two-dot form
    without it, both within the reference bound."""
    p, cfg, seed, plain = _ragged_prefill_run(mode, h, i, extra, monkeypatch)
    lagged, _, _ = run_and_check(p, config=dict(cfg, SCALE_LAG=1), scaling=1.5, seed=seed)
    assert torch.equal(plain, lagged), seed


@pytest.mark.slow
def test_scale_lag_prefill_tiles_wait_once_per_k_step_for_sm90(tmp_path, monkeypatch):
    """sm_90a builds of the gate/up tiles the tuner's --scale-lag times at prefill sizes. Per-tensor two dots
    (the promotion's fp32 add of each dot's partial; ptxas waits before each add): 3 wgmma waits per K step; with
    the lag (SCALE_LAG 2) 1: the up dot in flight across the back edge, no stack. Block-scaled BLOCK_M 64 two
    dots with TMA weights: 1 wait with the lag. The 128 x 128 per-tensor tile with the lag spills (stack,
    local-memory accesses in the K loop), which is why the tuner does not time it (``_lag_spills``)."""
    from tests.kernels.test_fused_moe_decode_scale_lag import _sass_loops

    blk = dict(SM90_GATE_UP, TWO_DOTS=True, W_TMA=True, W_SCALAR=True)
    jobs = {  # name -> (constexprs, warps, stages)
        "pt64": (PT_GATE_UP, 8, 4),  # Hy3 T = 1024 / 4096 pick
        "pt64 lag": (dict(PT_GATE_UP, SCALE_LAG=2), 8, 4),
        "pt128x64 lag": (dict(PT_GATE_UP, BLOCK_M=128, BLOCK_N=64, SCALE_LAG=2), 8, 3),
        "pt64x64 tma lag": (dict(PT_GATE_UP, BLOCK_N=64, W_TMA=True, SCALE_LAG=2), 8, 3),  # Hy3 TP8 T = 16384
        "blk64 lag": (dict(blk, SCALE_LAG=2), 8, 4),
        "pt128 lag": (dict(PT_GATE_UP, BLOCK_M=128, SCALE_LAG=2), 8, 3),
    }
    res = {}
    for name, (consts, warps, stages) in jobs.items():
        cache = tmp_path / name.replace(" ", "_")
        monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
        (r,) = compile_sm90([_sm90_job("_gate_up_kernel", consts, warps, stages)])
        (cubin,) = cache.glob("*/_gate_up_kernel.cubin")
        r["k_loop"] = min(_sass_loops(str(cubin)), key=lambda loop: loop["size"])
        res[name] = r
    print({n: (r["registers"], r["stack"], r["k_loop"]) for n, r in res.items()})
    assert res["pt64"]["k_loop"]["wait"] == 3 and res["pt64"]["stack"] == 0, res
    for name in ("pt64 lag", "pt128x64 lag", "pt64x64 tma lag", "blk64 lag"):
        assert res[name]["stack"] == 0 and res[name]["k_loop"]["arrive"] == 2, (name, res[name])
        assert res[name]["k_loop"]["wait"] == 1, (name, res[name])
    assert res["pt128 lag"]["stack"] > 0, res["pt128 lag"]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(GPU_PREFILL) + ["qwen3-235b"])
def test_gpu_scale_lag_real_prefill_shapes(shape):
    """T = 1024 at the tuned pick's tiles (two dots where the pick is the merged dot) and, per-tensor, at the
    128 x 64 tile the tuner times in place of 128 x 128: SCALE_LAG bitwise the same config without it (on the
    GPU the per-tensor lag's fresh partial + fp32 add must be the promotion's add, bit for bit), both within
    2e-2 of the reference; errors printed."""
    seed = _seed()
    e, h, i, k, ge, off, mode = GPU_PREFILL.get(shape, (128, 4096, 1536, 8, 128, 0, "block-dynamic"))
    p = make_problem(1024, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off)
    cfg = op.get_config(1024, k, e, h, i, mode, mode.endswith("dynamic"), allow_small=False)
    forms = [dict(cfg, GU_TWO_DOTS=1)]
    if mode == "tensor-static":
        forms.append(dict(cfg, BLOCK_M=128, GU_N=64, GU_STAGES=3))
    for form in forms:
        plain, _, err = run_and_check(p, config=form, seed=seed)
        lagged, _, err_lag = run_and_check(p, config=dict(form, SCALE_LAG=1), seed=seed)
        print(f"{shape} T=1024 BLOCK_M {form['BLOCK_M']} GU_N {form['GU_N']}: rel err vs quantized ref {err:.2e}, "
              f"lagged {err_lag:.2e}, lagged vs plain {rel_err(lagged, plain):.2e}")  # fmt: skip
        assert torch.equal(plain, lagged), (seed, form)


@pytest.mark.gpu
def test_gpu_scale_lag_per_tensor_empty_experts_ep_rank_and_graph_replay():
    """Per-tensor lag (Hy3 TP8 shape, T = 1024): one expert takes every token and a few take three rows, the
    rest none; an EP rank without local tokens gives zeros; the call replays from a CUDA graph with fresh
    routing (the static activation scales as device tensors: a host float would be copied inside the capture)."""
    seed = _seed()
    shape = GPU_PREFILL["hy3-tp8"]
    e, h, i, k, _, _, mode = shape
    cfg = dict(op.get_config(1024, k, e, h, i, mode, False, allow_small=False), SCALE_LAG=1)
    _skewed_replay_and_empty_ep_rank(shape, cfg, seed, replays=1)


# ---------------------------------------------------------------------------------------------
# multi-tile (GU_TILES / DN_TILES) and persistent (GU_PERSIST / DN_PERSIST) GEMM programs at prefill tiles


@pytest.mark.parametrize(
    "mode,i,extra",
    [
        ("tensor-static", 256, {}),  # per-tensor two dots, promotion every 128
        ("tensor-static", 192, {"BLOCK_M": 128}),  # ragged 2nd gate/up tile (I = 192), the T = 16384 BLOCK_M
        ("block-dynamic", 256, {"W_TMA": 1, "W_SCALAR": 1}),  # the block-scaled T = 4096 form
        ("block-dynamic", 256, {"W_SCALAR": 1, "GU_TWO_DOTS": 1, "BLOCK_M": 128}),  # the T = 16384 form
    ],
)
def test_prefill_tiles_and_persistent_programs_bitwise_the_one_tile_programs(mode, i, extra, monkeypatch):
    """The prefill tiles with the multi-CTA router and ragged routing (an expert with none, one with more than one
    block, a slot of another EP rank): 2 N tiles per program, and persistent programs (the interpreter's grid is
    op.INTERPRET_SMS x programs per SM, so each program takes several tiles of the strided loop), each bitwise
    the one-tile programs' output (same products, same order), which run_and_check holds to the reference."""
    p, cfg, seed, plain = _ragged_prefill_run(mode, 256, i, extra, monkeypatch)
    forms = [
        {"GU_TILES": 2, "DN_TILES": 2},
        {"GU_PERSIST": 1, "DN_PERSIST": 1},
        {"GU_PERSIST": 3, "DN_PERSIST": 2},
    ]
    for form in forms:
        got, _, _ = run_and_check(p, config=dict(cfg, **form), scaling=1.5, seed=seed)
        assert torch.equal(plain, got), (form, seed)


def test_persistent_programs_with_pdl_and_no_local_rows():
    """Persistent programs read the router's row count after the PDL wait; an EP rank whose tokens all sit on
    other ranks has no used block, so every program's loop is empty and the output is zeros."""
    seed = _seed()
    cfg = dict(PREFILL_CFG, GU_PERSIST=1, DN_PERSIST=1, PDL=1)
    p = make_problem(24, 6, 256, 256, 3, "block-dynamic", device="cpu")
    run_and_check(p, config=cfg, seed=seed)
    away = torch.randint(0, 6, (24, 3), dtype=torch.int32)  # experts 0..5; this rank holds 6..11
    q = make_problem(24, 6, 256, 256, 3, "block-dynamic", ids=away, expert_offset=6, device="cpu")
    out, _, _ = run_and_check(q, config=cfg, seed=seed)
    assert (out == 0).all(), seed


def test_persistent_programs_refused_outside_their_forms():
    """Refused before any launch, with the reason: a persistent GEMM takes one tile per loop step (not with
    GU_TILES / DN_TILES > 1), no split-K, no down-kernel prefetch or top-k sum; 0-8 programs per SM, integers."""
    p = make_problem(4, 4, 256, 256, 2, "block-dynamic", device="cpu")
    out = torch.full_like(p["x"], 7.0)
    for extra, words in (
        (dict(GU_PERSIST=1, GU_TILES=2), "GU_TILES 1 and SPLIT_K 1"),
        (dict(GU_PERSIST=1, SPLIT_K=2), "GU_TILES 1 and SPLIT_K 1"),
        (dict(DN_PERSIST=1, DN_TILES=2), "DN_TILES 1, PREFETCH 0 and DN_REDUCE 0"),
        (dict(DN_PERSIST=1, PDL=1, PREFETCH=1), "PREFETCH 0"),
        (dict(DN_PERSIST=1, DN_REDUCE=1), "DN_REDUCE 0"),
        (dict(DN_PERSIST=9), "0 \\(off\\) or 1-8"),
        (dict(GU_PERSIST=-1), "0 \\(off\\) or 1-8"),
        (dict(GU_PERSIST=True), "0 \\(off\\) or 1-8"),
        (dict(DN_PERSIST=1.0), "0 \\(off\\) or 1-8"),
    ):
        with pytest.raises(FusedMoEError, match=words):
            _moe(p, out=out, config=dict(PREFILL_CFG, **extra))
    assert (out == 7.0).all()


def test_prefill_tile_candidates_are_valid_configs_of_every_shape():
    """The tuner's --prefill-tiles candidates at T = 4096 / 16384 on every bench shape: the current pick first,
    every other the pick with other tile counts or persistent programs (nothing else changed; where the pick ships
    tiles, its one-tile form among them), each passing the op's checks at
    the shape and at the size its precompile job builds; no gate/up form of the block-scaled BLOCK_M 128 two-dot
    tile (its flattened build spills: test_prefill_tiles_compile_pipelined_for_sm90)."""
    from hpc_advise.runtime.benches import fused_moe as fb
    from tests.kernels.test_fused_moe_decode_round5 import _load_tuner

    tune = _load_tuner()
    # the keys' defaults (the half-tile keys: dropped from the forms, GU_HALF has no multi-tile / persistent form)
    one_tile = {"GU_TILES": 1, "DN_TILES": 1, "GU_PERSIST": 0, "DN_PERSIST": 0, "GU_HALF": 0, "DN_HALF": 0}
    for shape, (e, h, i, k, _, _) in fb.SHAPES.items():
        mode = fb.MODES[shape][0]
        a_group, block = mode.endswith("dynamic"), mode.startswith("block")
        for t in (4096, 16384):
            cands = tune.prefill_tile_candidates(op, t, k, e, h, i, mode)
            pick = op.get_config(t, k, e, h, i, mode, a_group, allow_small=False)
            assert cands[0] == pick and len(cands) >= 4, (shape, t, cands)
            spills = block and pick["BLOCK_M"] == 128 and pick.get("GU_TWO_DOTS", 0)
            for c in cands[1:]:
                cn, pn = dict(one_tile, **c), dict(one_tile, **pick)
                changed = {key for key in cn if cn[key] != pn.get(key)}
                assert changed and changed <= set(one_tile), (shape, t, c)
                assert not (spills and changed & {"GU_TILES", "GU_PERSIST"}), (shape, t, c)
                c = op.check_config(dict(c), a_group, a_group)
                op.check_forms(c, a_group, a_group, block, h, i)
                _, _, _, inter, hidden = tune.multi_tile_compile_job(shape, mode, c)
                op.check_forms(c, a_group, a_group, block, hidden, inter)


def _flattened_build(
    tmp_path, monkeypatch, name: str, kernel: str, consts: dict, warps: int, stages: int
) -> dict:
    """compile_sm90 of one job in a private Triton cache, plus from its TTGIR the scf.for loops and the
    pipeliner's async_wait depths, and from its SASS the local-memory accesses of the wgmma loop."""
    import re

    cache = tmp_path / name
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    (r,) = compile_sm90([_sm90_job(kernel, consts, warps, stages)])
    (ttgir,) = cache.glob(f"*/{kernel}.ttgir")
    text = ttgir.read_text()
    r["loops"] = text.count("scf.for")
    r["waits"] = sorted(set(re.findall(r"async_wait[^\n]*num = (\d+)", text)))
    return r


@pytest.mark.slow
def test_prefill_tiles_compile_pipelined_for_sm90(tmp_path, monkeypatch):
    """sm_90a builds of the prefill picks' tiles with 4 down tiles per program, persistent down programs, and 2
    gate/up tiles / persistent gate/up programs: one flattened loop over (tile, K step) pipelined as deep as the
    one-tile K loop (the same async_wait depth; the second scf.for is the guarded unflattened copy the flattening
    pass keeps for an empty K loop), wgmma, no stack on the down tiles and the per-tensor BLOCK_M 64 gate/up;
    the per-tensor BLOCK_M 128 gate/up (Hy3 T = 16384) keeps a 16-byte frame; the block-scaled BLOCK_M 128
    two-dot gate/up spills with persistent programs (the tuner leaves it out: ``_prefill_gate_up_spills``)."""
    pt = dict(A_GROUP=False, W_BLOCK=False, A2_GROUP=False)
    gu64 = dict(SM90_GATE_UP, TWO_DOTS=True, **pt)  # Hy3 T = 4096: per-tensor, BLOCK_M 64, 8 warps, 4 stages
    dn128 = dict(SM90_DOWN, BLOCK_M=128, A_GROUP=False, W_BLOCK=False)  # Hy3 T = 16384: 8 warps, 4 stages
    dn64 = dict(SM90_DOWN, W_TMA=True, W_SCALAR=True)  # block-scaled T = 4096: 4 warps, 3 stages
    jobs = {  # name -> (kernel, constexprs, warps, stages)
        "dn128": ("_down_kernel", dn128, 8, 4),
        "dn128 tiles4": ("_down_kernel", dict(dn128, TILES=4), 8, 4),
        "dn128 persist": ("_down_kernel", dict(dn128, PERSIST=True), 8, 4),
        "dn64 persist": ("_down_kernel", dict(dn64, PERSIST=True), 4, 3),
        "gu64": ("_gate_up_kernel", gu64, 8, 4),
        "gu64 tiles2": ("_gate_up_kernel", dict(gu64, TILES=2), 8, 4),
        "gu64 persist": ("_gate_up_kernel", dict(gu64, PERSIST=True), 8, 4),
        "gu128 persist": ("_gate_up_kernel", dict(gu64, BLOCK_M=128, PERSIST=True), 8, 3),
        "blk128 persist": (
            "_gate_up_kernel",
            dict(SM90_GATE_UP, BLOCK_M=128, TWO_DOTS=True, W_SCALAR=True, PERSIST=True),
            8,
            3,
        ),  # fmt: skip
    }
    res = {n: _flattened_build(tmp_path, monkeypatch, n.replace(" ", "_"), *job) for n, job in jobs.items()}
    print({n: (r["registers"], r["stack"], r["shared"], r["loops"], r["waits"]) for n, r in res.items()})
    assert res["dn128"]["loops"] == 1 and res["gu64"]["loops"] == 1, res
    for name, r in res.items():
        assert r["wgmma"] > 0 and r["async_copies"] > 0, (name, r)
        if " " in name:  # a flattened build: the loop and its guarded copy
            assert r["loops"] == 2, (name, r)
        if name.split()[0] in ("dn128", "gu64"):  # as deep as its one-tile build
            assert r["waits"] == res[name.split()[0]]["waits"], (name, r)
    for name in ("dn128 tiles4", "dn128 persist", "dn64 persist", "gu64 tiles2", "gu64 persist"):
        assert res[name]["stack"] == 0, (name, res[name])
    assert res["gu128 persist"]["stack"] <= 16, res["gu128 persist"]
    assert res["blk128 persist"]["stack"] > 64, res["blk128 persist"]


def _one_tile(cfg: dict) -> dict:
    """``cfg`` with one tile per GEMM program (the form the multi-tile and persistent ones are compared with), all
    128 rows high and the Triton down GEMM (``_triton_full_tiles``)."""
    drop = ("GU_TILES", "DN_TILES", "GU_PERSIST", "DN_PERSIST")
    return {key: v for key, v in _triton_full_tiles(cfg).items() if key not in drop}


GPU_TILE_POINTS = {  # name -> (GPU_PREFILL shape, T, forms against the tuned pick)
    # per-tensor BLOCK_M 64 (Hy3 T = 4096): both GEMMs with 2 / 4 tiles per program, both persistent
    "hy3-4096": ("hy3", 4096, [dict(GU_TILES=2, DN_TILES=4), dict(GU_PERSIST=1, DN_PERSIST=1)]),
    # block-scaled BLOCK_M 128 two dots, an EP rank's 32 experts (DeepSeek-V3 EP8 T = 16384): the down forms
    "deepseek-v3-ep8-16384": ("deepseek-v3-ep8", 16384, [dict(DN_TILES=8), dict(DN_PERSIST=1)]),
}


@pytest.mark.gpu
@pytest.mark.parametrize("point", list(GPU_TILE_POINTS))
def test_gpu_prefill_tiles_and_persistent_bitwise_the_one_tile_programs(point):
    """At real prefill shapes and the tuned pick's tiles (its one-tile form): multi-tile and persistent GEMM programs
    bitwise the one-tile programs (same products in the same order; on the GPU too) and within 2e-2 of the reference."""
    from tests.kernels.test_fused_moe_decode_round5 import _same_with_tiles

    seed = _seed()
    shape, t, forms = GPU_TILE_POINTS[point]
    e, h, i, k, ge, off, mode = GPU_PREFILL[shape]
    p = make_problem(t, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off)
    cfg = _one_tile(op.get_config(t, k, e, h, i, mode, mode.endswith("dynamic"), allow_small=False))
    _same_with_tiles(p, cfg, forms, seed)


@pytest.mark.gpu
def test_gpu_persistent_programs_empty_experts_ep_rank_and_graph_replay():
    """Persistent gate/up and down programs (Qwen3-30B shape, T = 1024, PDL): one expert takes every token and a
    few take three rows, the rest none; the call replays from a CUDA graph with fresh routing (the programs read
    the used row count on the GPU, so a replay's new routing changes their loop bounds); an EP rank without local
    tokens gives zeros."""
    seed = _seed()
    shape = GPU_PREFILL["qwen3-30b-a3b"]
    e, h, i, k, _, _, mode = shape
    cfg = _one_tile(op.get_config(1024, k, e, h, i, mode, True, allow_small=False))
    cfg = dict(cfg, GU_PERSIST=1, DN_PERSIST=2, PDL=1, PREFETCH=0)
    _skewed_replay_and_empty_ep_rank(shape, cfg, seed, replays=2)


# ---------------------------------------------------------------------------------------------
# half-height last row blocks (config GU_HALF): a 128-row block with padding only in rows 64.. runs a 64-row tile


def _half_ids() -> torch.Tensor:
    """[200, 3] routing over 6 local experts, padded to 128-row blocks: expert 0 none, 1 one row, 2 exactly 64,
    3 65 (a full block), 4 192 (a full block, then 64), 5 130 (a full block, then 2); the other slots are -1 (on
    another EP rank)."""
    ids = torch.full((200, 3), -1, dtype=torch.int32)
    ids[:192, 0] = 4
    ids[192:, 0] = 5
    ids[:64, 1] = 2
    ids[64:129, 1] = 3
    ids[129:, 1] = 5
    ids[0, 2] = 1
    ids[1:52, 2] = 5
    return ids


@pytest.fixture
def exact_fp8_dot(monkeypatch):
    """The interpreter's fp8 x fp8 dot summed exactly (float64: up to 128 products of two e4m3 values span fewer
    than 53 bits), rounded once to fp32 and added to the accumulator. numpy's fp32 matmul sums in an order that
    depends on the operands' shape, so a 64-row tile's row sums could differ in the last bit from the same rows
    in a 128-row tile; the GPU's wgmma sums each row the same way at either height (checked bitwise on the H200)."""
    import numpy as np
    from triton.runtime import interpreter as itp

    original = itp.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        fp8 = [x.dtype.primitive_bitwidth == 8 and x.dtype.is_floating() for x in (a, b)]
        if not all(fp8) or a.data.shape[-1] > 128:
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        a64, b64 = (itp._convert_float(x.data, x.dtype, tl.float16, None).view(np.float16).astype(np.float64)
                    for x in (a, b))  # fmt: skip
        return itp.TensorHandle(np.matmul(a64, b64).astype(d.data.dtype) + d.data, d.dtype.scalar)

    monkeypatch.setattr(itp.InterpreterBuilder, "create_dot", create_dot)


def _gate_up_h(p: dict, cfg: dict) -> dict:
    """One prepared call's gate/up launch, h and its scales poisoned with NaN before it (fp8 e4m3 NaN 0x7f), so every
    row it must write shows: ``h`` / ``s`` the bytes of h and the group scales of the real rows in entry order (the
    GPU router orders one expert's entries within a chunk by its atomics' arrival, so a row's place in the padded
    order may differ between two launches; the entry it holds does not), ``h_pad`` / ``s_pad`` those of the padding
    rows, ``used`` the padded row count."""
    launch = op._Launch(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], p["kw"]["w13_scale"],
                        p["kw"]["w2_scale"], p["kw"].get("a13_scale"), p["kw"].get("a2_scale"), None,
                        p["kw"]["expert_offset"], cfg)  # fmt: skip
    launch.prep(p["x"])
    launch.inter.view(torch.uint8).fill_(0x7F)
    launch.inter_s.fill_(float("nan"))
    launch.gate_up(p["w13"], launch.inter, launch.inter_s, 0, 1)
    used = int(launch.num_padded)
    ids = launch.sorted_ids[:used]
    real = ids < launch.n
    order = torch.argsort(ids[real])
    h, s = launch.inter.view(torch.uint8)[:used], launch.inter_s[:used].view(torch.int32)  # bits (NaN == NaN)
    return {"h": h[real][order], "s": s[real][order], "h_pad": h[~real], "s_pad": s[~real], "used": used}


def _same_h(full: dict, half: dict) -> int:
    """Asserts h and its scales of the full and the half-height gate/up tiles (``_gate_up_h``) bitwise equal for every
    real row, every h byte written (no fp8 NaN), and every padding row's h zero (+0 or -0) with the same scales;
    returns how many padding elements differ in the sign of that zero (the down GEMM masks those rows' products:
    nothing reads them)."""
    assert full["used"] == half["used"]
    assert torch.equal(full["h"], half["h"]) and torch.equal(full["s"], half["s"])
    assert not ((full["h"] & 0x7F) == 0x7F).any()
    assert not ((full["h_pad"] & 0x7F) != 0).any() and not ((half["h_pad"] & 0x7F) != 0).any()
    assert torch.equal(full["s_pad"], half["s_pad"])
    return int((full["h_pad"] != half["h_pad"]).sum())


@pytest.mark.parametrize(
    "mode,i,extra",
    [
        ("tensor-static", 192, {}),  # per-tensor two dots (Hy3's form); I = 192: a ragged 2nd N tile
        (
            "block-dynamic",
            256,
            {"W_SCALAR": 1, "GU_TWO_DOTS": 1, "W_TMA": 1},
        ),  # the block-scaled T = 16384 form
        ("block-dynamic", 128, {}),  # merged gate|up dot, vector weight scales, group-scaled h
    ],
)
def test_gu_half_bitwise_the_full_tiles(mode, i, extra, monkeypatch, exact_fp8_dot):
    """GU_HALF against the full 128-row tiles (BLOCK_M 128, multi-CTA router): h and its group scales bitwise
    (poisoned with NaN before, so a padding row the half tiles failed to store shows), every used row written, the
    output bitwise and within the reference bound; the half tile runs on exactly the blocks whose rows 64.. are
    padding (experts 1, 2 and the last blocks of 4 and 5, not 65-row expert 3). DN_HALF on top (the down GEMM's
    tiles of those blocks at 64 rows, with one and two H tiles per program): the output bitwise."""
    from hpc_advise.kernels.fused_moe import kernel as K

    monkeypatch.setattr(op, "ROUTE_MULTI_MIN_ENTRIES", 1)
    monkeypatch.setattr(op, "ROUTE_CHUNK", 32)
    seed = _seed()
    p = make_problem(200, 6, 256, i, 3, mode, ids=_half_ids(), device="cpu")
    cfg = dict(PREFILL_CFG, BLOCK_M=128, **extra)
    full_h = _gate_up_h(p, cfg)
    half_blocks = []  # the interpreter runs the kernel as Python: record each half tile's zero-row store
    zero_rows = K._zero_rows_store

    def spy(offs, *args):  # offs: the interpreter's tensor of the padding rows' indices
        half_blocks.append(int(offs.handle.data[0]) // 128)
        return zero_rows(offs, *args)

    monkeypatch.setattr(K, "_zero_rows_store", spy)
    half_h = _gate_up_h(p, dict(cfg, GU_HALF=1))
    tiles_n = -(-i // cfg["GU_N"])
    assert full_h["used"] == 7 * 128 and sorted(set(half_blocks)) == [0, 1, 4, 6], half_blocks
    assert len(half_blocks) == 4 * tiles_n, half_blocks
    assert _same_h(full_h, half_h) == 0, seed  # the interpreter's exact sums: the padding zeros' signs too
    if mode.endswith("dynamic"):  # every row's group scales written
        assert not half_h["s"].view(torch.float32).isnan().any(), seed
        assert not half_h["s_pad"].view(torch.float32).isnan().any(), seed
    full, _, _ = run_and_check(p, config=cfg, seed=seed)
    half, _, _ = run_and_check(p, config=dict(cfg, GU_HALF=1), seed=seed)
    assert torch.equal(full, half), seed
    # DN_HALF: the down tiles of the same four blocks at 64 rows (one H tile or two per program), output bitwise
    dn_rows = []
    down_tiles = K._down_tiles

    def dn_spy(*args):  # args[2]: the tile's padded rows
        dn_rows.append(int(args[2].shape[0]))
        return down_tiles(*args)

    monkeypatch.setattr(K, "_down_tiles", dn_spy)
    for dn in ({"DN_HALF": 1}, {"DN_HALF": 1, "DN_TILES": 2}):
        got, _, _ = run_and_check(p, config=dict(cfg, GU_HALF=1, **dn), seed=seed)
        assert torch.equal(full, got), (dn, seed)
    assert (dn_rows.count(64), dn_rows.count(128)) == (4 * 2 + 4, 3 * 2 + 3), (
        dn_rows
    )  # H = 256: 2 tiles of 128


def test_unfused_baseline_runs_a_half_tile_pick():
    """moe_unfused (the benchmark's baseline) given a GU_HALF / DN_HALF config, as the bench passes the shipped pick:
    its gate/up writes fp32 rows (no fused epilogue), so it runs the full tiles (the 2026-11-30 07:40 UTC bench's
    unfused rows failed at compile time on every half-tile pick before); within the quantized reference's bound."""
    p = make_problem(200, 6, 256, 128, 3, "tensor-static", ids=_half_ids(), device="cpu")
    run_and_check(
        p, config=dict(PREFILL_CFG, BLOCK_M=128, GU_HALF=1, DN_HALF=1), fn=op.moe_unfused, seed=_seed()
    )


def test_gu_half_expert_parallel_rank_without_local_rows():
    """An EP rank whose tokens all sit on other ranks: no used block, zeros out (GU_HALF on)."""
    seed = _seed()
    away = torch.randint(0, 6, (24, 3), dtype=torch.int32)  # experts 0..5; this rank holds 6..11
    q = make_problem(24, 6, 256, 128, 3, "tensor-static", ids=away, expert_offset=6, device="cpu")
    out, _, _ = run_and_check(q, config=dict(PREFILL_CFG, BLOCK_M=128, GU_HALF=1), seed=seed)
    assert (out == 0).all(), seed


def test_gu_half_refused_outside_its_form():
    """Refused before any launch, with the reason: GU_HALF needs BLOCK_M 128, one unsplit gate/up tile per program
    (no GU_TILES / GU_PERSIST / SPLIT_K), the regular path, and is 0 or 1; DN_HALF BLOCK_M 128 and the Triton down
    GEMM without persistent programs or the intermediate by TMA."""
    p = make_problem(4, 4, 256, 256, 2, "block-dynamic", device="cpu")
    out = torch.full_like(p["x"], 7.0)
    base = dict(PREFILL_CFG, BLOCK_M=128, GU_HALF=1)
    for extra, words in (
        (dict(BLOCK_M=64), "BLOCK_M 128"),
        (dict(SPLIT_K=2), "SPLIT_K 1"),
        (dict(SPLIT_K=2, GU_RED=1), "SPLIT_K 1"),
        (dict(GU_TILES=2), "GU_TILES 1"),
        (dict(GU_PERSIST=1), "GU_PERSIST 0"),
        (dict(GU_HALF=2), "GU_HALF=2 must be 0 or 1"),
        (dict(GU_HALF=0, DN_HALF=1, BLOCK_M=64), "DN_HALF .* needs BLOCK_M 128"),
        (dict(DN_HALF=1, DN_PERSIST=1), "without DN_PERSIST / DN_A_TMA"),
        (dict(DN_HALF=1, DN_A_TMA=1), "without DN_PERSIST / DN_A_TMA"),
        (dict(DN_HALF=2), "DN_HALF=2 must be 0 or 1"),
    ):
        with pytest.raises(FusedMoEError, match=words):
            _moe(p, out=out, config=dict(base, **extra))
    for key in ("GU_HALF", "DN_HALF"):
        with pytest.raises(FusedMoEError, match="regular path keys"):
            op.check_config({"PATH": "small", key: 1}, True, True)
    assert (out == 7.0).all()


def test_half_tile_candidates_are_valid_configs_of_every_shape():
    """tune --half-tiles on every bench shape: the current pick first; where the pick is BLOCK_M 128 the pick + GU_HALF
    and, with a Triton down GEMM, + GU_HALF + DN_HALF (those equal to the pick left out); at BLOCK_M 64 picks the
    T = 16384 pick without and with them; nothing where no BLOCK_M 128 pick exists (Hy3 TP8). Each passes the op's
    checks at the shape and at its precompile job's sizes."""
    from hpc_advise.runtime.benches import fused_moe as fb
    from tests.kernels.test_fused_moe_decode_round5 import _load_tuner

    tune = _load_tuner()
    for shape, (e, h, i, k, _, _) in fb.SHAPES.items():
        mode = fb.MODES[shape][0]
        a_group, block = mode.endswith("dynamic"), mode.startswith("block")
        p16 = op.get_config(16384, k, e, h, i, mode, a_group, allow_small=False)
        for t in (4096, 16384):
            cands = tune.half_tile_candidates(op, t, k, e, h, i, mode)
            pick = op.get_config(t, k, e, h, i, mode, a_group, allow_small=False)
            base = pick if pick["BLOCK_M"] == 128 else p16
            want = [base, dict(base, GU_HALF=1)] + ([dict(base, GU_HALF=1, DN_HALF=1)] if block else [])
            want = [pick] + [c for c in want if c != pick] if p16["BLOCK_M"] == 128 else [pick]
            want = list(
                {json.dumps(c, sort_keys=True): c for c in want}.values()
            )  # a pick with GU_HALF: once
            assert cands == want, (shape, t, cands)
            for c in cands:
                op.check_forms(op.check_config(dict(c), a_group, a_group), a_group, a_group, block, h, i)
                _, _, _, inter, hidden = tune.multi_tile_compile_job(shape, mode, c)
                op.check_forms(c, a_group, a_group, block, hidden, inter)


@pytest.mark.slow
def test_half_tiles_build_for_sm90_as_the_full_tile():
    """sm_90a builds of the T = 16384 gate/up tiles (per-tensor two dots, Hy3; block-scaled two dots with scalar
    scales, the three block-scaled shapes; BLOCK_M 128, 8 warps, 3 stages) with GU_HALF: the 64-row tile's K loop is
    a second pipelined copy (twice the async copies and wgmma ops), and the registers, stack and shared memory stay
    the full tile's (255 / 0 and 8 bytes / 144 KB when written): the half tile adds no spill."""
    pt = dict(SM90_GATE_UP, BLOCK_M=128, A_GROUP=False, W_BLOCK=False, A2_GROUP=False, TWO_DOTS=True)
    blk = dict(SM90_GATE_UP, BLOCK_M=128, TWO_DOTS=True, W_SCALAR=True)
    forms = [pt, dict(pt, HALF=True), blk, dict(blk, HALF=True)]
    res = compile_sm90([_sm90_job("_gate_up_kernel", c, 8, 3) for c in forms])
    print([(r["registers"], r["stack"], r["shared"], r["async_copies"], r["wgmma"]) for r in res])
    for full, half in (res[:2], res[2:]):
        assert half["async_copies"] == 2 * full["async_copies"] and half["wgmma"] == 2 * full["wgmma"], (
            full,
            half,
        )
        for key in ("registers", "stack", "shared"):
            assert half[key] <= full[key], (key, full, half)
    assert res[1]["stack"] == 0 and res[3]["stack"] <= 16, res
    # DN_HALF on the block-scaled BLOCK_M 128 down tile (8 warps, 3 stages; 8 H tiles per program at DeepSeek-V3 EP8
    # / Qwen3-30B T = 16384): no stack either way, registers at most the full tile's (239 / 200 when written)
    dn = dict(SM90_DOWN, BLOCK_M=128, W_SCALAR=True)
    forms = [dict(dn, TILES=8), dict(dn, TILES=8, HALF=True), dn, dict(dn, HALF=True)]
    res = compile_sm90([_sm90_job("_down_kernel", c, 8, 3) for c in forms])
    for full, half in (res[:2], res[2:]):
        assert half["stack"] == 0 and half["wgmma"] == 2 * full["wgmma"], (full, half)
        assert half["registers"] <= full["registers"] and half["shared"] <= full["shared"], (full, half)


GPU_HALF_SHAPES = {  # name -> GPU_PREFILL-style shape of the T = 16384 GU_HALF / DN_HALF tests
    "hy3": GPU_PREFILL["hy3"],
    "qwen3-235b": (128, 4096, 1536, 8, 128, 0, "block-dynamic"),
    "deepseek-v3-ep8": GPU_PREFILL["deepseek-v3-ep8"],
}


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(GPU_HALF_SHAPES))
def test_gpu_half_tiles_bitwise_the_pick_at_t16384(shape):
    """T = 16384 at the shipped pick (BLOCK_M 128: Hy3 per-tensor two dots with the ping-pong down, Qwen3-235B
    block-scaled two dots, DeepSeek-V3 EP8 the same with 8 down tiles per program) with all-128-row tiles: + GU_HALF
    and (Triton down GEMM) + GU_HALF + DN_HALF give the output bitwise (within 2e-2 of the reference); h and its scales
    bitwise for every real row (compared by entry: the GPU router's row order within an expert follows its atomics,
    so it differs between launches) and every padding row's h zero, h poisoned with NaN before each gate/up launch;
    how many experts end in a half block and how many padding zeros differ in sign is printed."""
    seed = _seed()
    e, h, i, k, ge, off, mode = GPU_HALF_SHAPES[shape]
    p = make_problem(16384, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off)
    pick = op.get_config(16384, k, e, h, i, mode, mode.endswith("dynamic"), allow_small=False)
    cfg = dict(pick, GU_HALF=0, DN_HALF=0)
    assert cfg["BLOCK_M"] == 128, cfg
    full, _, err = run_and_check(p, config=cfg, seed=seed)
    forms = [{"GU_HALF": 1}] + ([] if cfg.get("DN_GLUON", 0) else [{"GU_HALF": 1, "DN_HALF": 1}])
    for form in forms:
        half = torch.full_like(full, float("nan"))
        _moe(p, out=half, config=dict(cfg, **form))
        assert torch.equal(full, half), (form, seed)
    full_h = _gate_up_h(p, cfg)
    half_h = _gate_up_h(p, dict(cfg, GU_HALF=1))
    ids = p["ids"][(p["ids"] >= off) & (p["ids"] < off + e)].long() - off  # this rank's slots
    rows = torch.bincount(ids, minlength=e)
    print(f"{shape} T=16384: rel err vs quantized ref {err:.2e}; {full_h['used']} padded rows, "
          f"{int(((rows % 128 > 0) & (rows % 128 <= 64)).sum())} of {e} experts end in a half block")  # fmt: skip
    signs = _same_h(full_h, half_h)
    print(
        f"{shape}: {signs} of {full_h['h_pad'].numel()} padding-row h elements -0 in one form, +0 in the other"
    )


@pytest.mark.gpu
def test_gpu_half_tiles_skewed_routing_graph_replay_and_empty_ep_rank():
    """Hy3's T = 16384 pick + GU_HALF at T = 1024 (then with its down GEMM's Triton form + DN_HALF): one expert takes
    every token (8 full blocks) and one the first three rows (a half block), checked against the reference;
    CUDA-graph replay with fresh routing (~43 rows per expert: half blocks everywhere); an EP rank without local
    tokens gives zeros."""
    seed = _seed()
    shape = GPU_PREFILL["hy3"]
    e, h, i, k, _, _, mode = shape
    cfg = dict(op.get_config(16384, k, e, h, i, mode, False, allow_small=False), GU_HALF=1)
    _skewed_replay_and_empty_ep_rank(shape, cfg, seed, replays=2)
    # DN_HALF with the Triton down GEMM of the pick's tile (the Gluon one has no such form)
    _skewed_replay_and_empty_ep_rank(shape, dict(op.triton_down_form(cfg), DN_HALF=1), seed, replays=1)


def test_bench_precompiles_the_shipped_multi_tile_picks_at_sizes_they_divide():
    """The bench's precompile (``benches.fused_moe.compile_job``) builds every shipped prefill pick with several
    tiles per program at an I / H its tile counts divide (before, the DN_TILES 8 picks were refused at H = 256 and
    compiled inside the first timed call), keeping I % 128 == 0 as the shape has it."""
    from hpc_advise.runtime.benches import fused_moe as fb

    names = {v[:3]: name for name, v in fb.SHAPES.items()}
    table = json.loads(op.CONFIG_PATH.read_text())["entries"]
    multi = [x for x in table if x["config"].get("DN_TILES", 1) > 1 or x["config"].get("GU_TILES", 1) > 1]
    assert multi  # DeepSeek-V3 EP8 and Qwen3-30B at T = 16384 ship DN_TILES 8
    for x in multi:
        cfg = x["config"]
        _, _, _, inter, hidden = fb.compile_job(names[(x["E"], x["H"], x["I"])], x["mode"], cfg)
        assert hidden % (cfg["DN_N"] * cfg.get("DN_TILES", 1)) == 0, x
        assert inter % (cfg["GU_N"] * cfg.get("GU_TILES", 1)) == 0, x
        assert (inter % 128 == 0) == (x["I"] % 128 == 0), x


def test_tuner_decides_prefill_points_on_sustained_finalists_mock_gpu_timer(monkeypatch):
    """``benches.fused_moe.sustained_finalists`` (the tuner's prefill decision input): the short screen's
    SUSTAINED_FINALISTS fastest, and the current pick when asked, are re-timed after PREFILL_SETTLE_S of their own
    load in SUSTAINED_ROUNDS interleaved rounds, and the medians of those rounds replace the short figures. The GPU
    timer is mocked (no GPU on CI): each call reports a fixed sustained time and the settle it was asked for."""
    import statistics

    from hpc_advise.runtime.benches import fused_moe as fb
    from hpc_advise.runtime.measure.harness import Timing

    order, sustained = (
        [],
        {"a": [7400, 7300, 7350], "b": [7100, 7500, 7450], "c": [7600] * 3, "d": [7000] * 3},
    )

    def fake_time(fn, t, settle_s=0.0):
        assert settle_s == fb.PREFILL_SETTLE_S and t == 4096
        name = fn()
        order.append(name)
        v = sustained[name][sum(x == name for x in order) - 1]
        return Timing(v, v, v, 5), None

    monkeypatch.setattr(fb, "_time", fake_time)
    monkeypatch.setattr(fb, "SUSTAINED_FINALISTS", 2)
    calls = {n: (lambda n=n: n) for n in "abcd"}
    # short screen: b and c read fastest (boost windows), a is the current pick, d read slow
    timed = [(6600.0, {"n": "a"}, calls["a"]), (6300.0, {"n": "b"}, calls["b"]),
             (6400.0, {"n": "c"}, calls["c"]), (6900.0, {"n": "d"}, calls["d"])]  # fmt: skip
    got = fb.sustained_finalists(timed, 4096, keep_first=True, where="x", log=lambda *_: None)
    assert [c["n"] for _, c, *_ in got] == ["a", "b", "c"]  # the pick stays first, d was screened out
    assert order == ["a", "b", "c"] * fb.SUSTAINED_ROUNDS  # interleaved rounds
    assert [us for us, *_ in got] == [statistics.median(sustained[n]) for n in "abc"]
    assert [r for *_, r in got] == [sustained[n] for n in "abc"]  # each finalist's rounds
    order.clear()
    got = fb.sustained_finalists(timed, 4096, keep_first=False, where="x", log=lambda *_: None)
    assert [c["n"] for _, c, *_ in got] == ["b", "c"] and len(order) == 2 * fb.SUSTAINED_ROUNDS


def test_tuner_keeps_the_current_prefill_pick_unless_beaten_by_the_sustained_bar_mock_gpu_timer(monkeypatch):
    """``benches.fused_moe._decide`` at a prefill T in an old-vs-new mode: the current pick (first candidate) stays
    unless a finalist's sustained median beats it by SUSTAINED_MIN_GAIN; in a plain tune the fastest wins. The GPU
    timer is mocked (no GPU on CI)."""
    from hpc_advise.runtime.benches import fused_moe as fb
    from hpc_advise.runtime.measure.harness import Timing

    def decide(sustained, old_vs_new):
        def fake_time(fn, t, settle_s=0.0):
            v = sustained[fn()]
            return Timing(v, v, v, 5), None

        monkeypatch.setattr(fb, "_time", fake_time)
        timed = [(1.0, {"n": n}, lambda n=n: n) for n in sustained]
        return fb._decide(timed, 16384, old_vs_new, "x", log=lambda *_: None)

    gain = fb.SUSTAINED_MIN_GAIN
    assert decide({"pick": 1000.0, "new": 1000.0 * (1 - gain / 2)}, True)[1] == {"n": "pick"}
    assert decide({"pick": 1000.0, "new": 1000.0 * (1 - 2 * gain)}, True)[1] == {"n": "new"}
    assert decide({"pick": 1000.0, "new": 1000.0 * (1 - gain / 2)}, False) == (
        1000.0 * (1 - gain / 2),
        {"n": "new"},
    )


def test_tuner_decides_decode_points_on_interleaved_rounds_mock_gpu_timer(monkeypatch):
    """``benches.fused_moe._decide`` at a decode T in an old-vs-new mode: the current pick (first candidate) and the
    short screen's fastest are timed again in DECODE_ROUNDS interleaved rounds with no settle; a candidate ships only
    at a median gain of DECODE_ROUNDS_MIN_GAIN and a win in every round. In a plain tune the fastest single timing
    wins. The GPU timer is mocked (no GPU on CI): each call reports its scripted time of that round."""
    from hpc_advise.runtime.benches import fused_moe as fb
    from hpc_advise.runtime.measure.harness import Timing

    def decide(rounds, old_vs_new=True):
        seen = {n: 0 for n in rounds}

        def fake_time(fn, t, settle_s=0.0):
            assert settle_s == 0.0 and t == 128
            name = fn()
            seen[name] += 1
            v = rounds[name][seen[name] - 1]
            return Timing(v, v, v, 5), None

        monkeypatch.setattr(fb, "_time", fake_time)
        timed = [(rounds[n][0], {"n": n}, lambda n=n: n) for n in rounds]
        got = fb._decide(timed, 128, old_vs_new, "x", log=lambda *_: None)
        if old_vs_new:
            assert all(v == fb.DECODE_ROUNDS for v in seen.values())  # every finalist, every round
        return got[1]["n"]

    n, pick = fb.DECODE_ROUNDS, [600.0] * fb.DECODE_ROUNDS
    assert decide({"pick": pick, "new": [588.0] * n}) == "new"  # -2 % in every round
    assert decide({"pick": pick, "new": [591.0] * n}) == "new"  # -1.5 %: under the old 2 % bar, over 1 %
    assert decide({"pick": pick, "new": [597.0] * n}) == "pick"  # -0.5 %: noise
    assert decide({"pick": pick, "new": [588.0] * (n - 1) + [601.0]}) == "pick"  # lost one round
    assert decide({"pick": pick, "new": [601.0] * n}) == "pick"
    assert (
        decide({"pick": [600.0], "new": [597.0]}, old_vs_new=False) == "new"
    )  # plain tune: the fastest timing
