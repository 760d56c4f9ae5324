"""Tests of the FP8 fused MoE's small-T path (hpc_advise.kernels.fused_moe.kernel_small / op_small).

Same conventions as the regular path's tests (problem builder, checker and tolerances: helpers.py):
fresh random inputs (seed in the failure message), NaN-poisoned ``out``, the fp32 reference with the
same fp8 quantization as ground truth, bound REL_TOL_QUANT_REF = 2e-2 (kernel README, "Tolerances":
bf16 rounding ~2.4e-3 plus rare one-ulp fp8 flips of re-quantized intermediates; any indexing,
scale or routing bug gives O(1)). CPU tests run the Triton interpreter at small sizes; ``gpu`` tests
run the real shapes on the H200.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.fused_moe import op, op_small  # noqa: E402
from hpc_advise.kernels.fused_moe.op import FusedMoEError, fused_moe, moe_unfused  # noqa: E402
from hpc_advise.kernels.fused_moe.reference import moe_float_reference  # noqa: E402
from tests.kernels.fused_moe.helpers import (  # noqa: E402
    MODES,
    REL_TOL_FLOAT_REF,
    check_graph_replay,
    fresh_seed,
    make_problem,
    rel_err,
    run_and_check,
)
from tests.kernels.sm90_compile import compile_sm90  # noqa: E402


def small_cfg(**kw) -> dict:
    """A small-path config for the CPU sizes (narrow tiles: several N tiles and H tiles)."""
    cfg = dict(op_small.default_small_config(1, 2, 4, 256, 192), GU_N=32, DN_N=64)
    cfg.update(kw)
    return cfg


# ---------------------------------------------------------------------------------------------
# the small path vs the reference (CPU interpreter)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("t,split,gu_n,pre_q", [(1, 1, 32, 0), (3, 3, 64, 1), (2, 1, 128, 1)])
def test_small_path_matches_reference(mode, t, split, gu_n, pre_q):
    """I = 192 (partial 128-groups and N tiles), H = 384 (3 K groups), k = 3. The three ways h reaches
    the down kernel (op_small.h_mode): fp8 from the gate/up epilogue (static a2, or GU_N = 128), fp32
    (dynamic a2, GU_N < 128), split-K 3 partials; inputs quantized per K step or by launch 0 (PRE_Q)."""
    seed = fresh_seed()
    p = make_problem(t, 6, 384, 192, 3, mode, device="cpu")
    cfg = small_cfg(SPLIT_K=split, GU_N=gu_n, PRE_Q=pre_q)
    run_and_check(p, config=cfg, scaling=2.5 if t == 3 else 1.0, seed=seed)


# GU_RED (split-K partials summed in the gate/up kernel by the last-arriving split) and DN_SPLIT (the
# down kernel's K split over programs, summed in split order by the token's last arrival)
SPLIT_SUMS = dict(SPLIT_K=3, GU_RED=1, GU_N=128, DN_SPLIT=2)
VARIANTS = {"base": {}, "split-sums": SPLIT_SUMS}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("t,split,dn_split", [(1, 3, 1), (3, 2, 2), (2, 1, 3)])
def test_small_path_split_sums_match_reference(mode, t, split, dn_split):
    """I = 192 (a partial second N tile), H = 384: split 3 leaves one 128-K step per split, split 2
    an uneven share; DN_SPLIT 3 over I's two K steps leaves one split without K steps (zeros)."""
    seed = fresh_seed()
    p = make_problem(t, 6, 384, 192, 3, mode, device="cpu")
    cfg = small_cfg(SPLIT_K=split, GU_RED=1, GU_N=128, DN_SPLIT=dn_split)
    run_and_check(p, config=cfg, scaling=2.5 if t == 3 else 1.0, seed=seed)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_small_path_is_deterministic_and_leaves_counters_at_zero(variant):
    seed = fresh_seed()
    p = make_problem(3, 4, 256, 128, 3, "block-dynamic", device="cpu")
    p["ids"][1] = p["ids"][0]  # two tokens on the same experts: one gate/up program serves both
    cfg = small_cfg(**VARIANTS[variant])
    out1, _, _ = run_and_check(p, config=cfg, seed=seed)
    out2, _, _ = run_and_check(p, config=cfg, seed=seed)
    assert torch.equal(out1, out2), seed
    assert all(int(c.abs().sum()) == 0 for c in op_small._COUNTERS.values()), seed


@pytest.mark.parametrize("mode", ["tensor-static", "block-dynamic"])
@pytest.mark.parametrize("variant", ["split-k-2", "split-sums"])
def test_one_token_with_every_slot_on_one_expert(mode, variant):
    """Token 0 names expert 2 in all k slots (the result is counted k times, weighted per slot);
    token 1 shares expert 2 with it in one slot, so one program serves both tokens."""
    seed = fresh_seed()
    ids = torch.tensor([[2, 2, 2], [0, 2, 3]], dtype=torch.int32)
    p = make_problem(2, 4, 256, 128, 3, mode, ids=ids, device="cpu")
    cfg = small_cfg(SPLIT_K=2) if variant == "split-k-2" else small_cfg(**SPLIT_SUMS)
    run_and_check(p, config=cfg, seed=seed)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_small_path_ids_of_other_ranks_and_minus_one(variant):
    """EP rank with experts 4..7 of 12: slots of other ranks and -1 are skipped; token 0 has no
    local slot and gets zeros."""
    seed = fresh_seed()
    ids = torch.tensor([[0, 11, -1], [5, -1, 9], [4, 7, 6]], dtype=torch.int32)
    p = make_problem(3, 4, 256, 128, 3, "block-dynamic", ids=ids, expert_offset=4, device="cpu")
    out, _, _ = run_and_check(p, config=small_cfg(**VARIANTS[variant]), seed=seed)
    assert (out[0] == 0).all(), seed


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_small_path_rank_without_local_slots_writes_zeros(variant):
    seed = fresh_seed()
    ids = torch.randint(0, 8, (2, 3), dtype=torch.int32)  # experts 0..7; this rank holds 8..11
    p = make_problem(2, 4, 256, 128, 3, "tensor-static", ids=ids, expert_offset=8, device="cpu")
    out, _, _ = run_and_check(p, config=small_cfg(**VARIANTS[variant]), seed=seed)
    assert (out == 0).all(), seed


def test_small_path_error_against_unquantized_math_is_reported():
    seed = fresh_seed()
    p = make_problem(2, 4, 256, 128, 2, "block-dynamic", device="cpu")
    out, _, err_q = run_and_check(p, config=small_cfg(), seed=seed)
    err_f = rel_err(out, moe_float_reference(p["x"], p["w13f"], p["w2f"], p["weights"], p["ids"]))
    print(f"small path: rel err vs quantized reference {err_q:.2e}, vs unquantized fp32 {err_f:.2e}")
    assert err_f <= REL_TOL_FLOAT_REF, seed


def test_programmatic_launch_flags_are_ignored_off_sm90():
    """PDL / PREFETCH need SM90 (griddepcontrol, inline PTX); elsewhere (here: the CPU interpreter) the
    path runs plain launches and gives bitwise the output of the config without them."""
    seed = fresh_seed()
    p = make_problem(2, 4, 256, 128, 3, "block-dynamic", device="cpu")
    plain, _, _ = run_and_check(p, config=small_cfg(**SPLIT_SUMS), seed=seed)
    flagged, _, _ = run_and_check(p, config=small_cfg(**SPLIT_SUMS, PDL=1, PREFETCH=1), seed=seed)
    assert torch.equal(plain, flagged), seed


# ---------------------------------------------------------------------------------------------
# dispatch and config validation (no kernel runs)


def test_dispatch_defaults_small_path_only_for_small_t(monkeypatch, tmp_path):
    monkeypatch.setattr(op, "CONFIG_PATH", tmp_path / "none.json")  # no tuned entries
    monkeypatch.setattr(op, "SMALL_T_DEFAULT", 8)
    op._config_table.cache_clear()
    try:
        for t in (1, 8):
            assert op_small.is_small(op.get_config(t, 8, 192, 4096, 1536, "tensor-static", False))
        assert not op_small.is_small(op.get_config(9, 8, 192, 4096, 1536, "tensor-static", False))
        assert not op_small.is_small(
            op.get_config(1, 8, 192, 4096, 1536, "tensor-static", False, allow_small=False)
        )
    finally:
        op._config_table.cache_clear()


def test_tuned_small_entry_is_used_near_its_t_and_never_past_the_limit(monkeypatch, tmp_path):
    tuned = small_cfg(SPLIT_K=2)
    entry = dict(E=8, H=512, I=256, top_k=2, mode="block-dynamic", config=tuned)
    path = tmp_path / "configs.json"
    path.write_text(json.dumps({"version": 1, "entries": [dict(entry, T=32)]}))
    monkeypatch.setattr(op, "CONFIG_PATH", path)
    op._config_table.cache_clear()
    try:
        assert op.get_config(20, 2, 8, 512, 256, "block-dynamic", True) == tuned
        # T = 64 is within a factor 2 of the tuned 32, but past SMALL_T_MAX: the regular path
        assert not op_small.is_small(op.get_config(64, 2, 8, 512, 256, "block-dynamic", True))
    finally:
        op._config_table.cache_clear()


def test_unfused_baseline_never_takes_the_small_path():
    """moe_unfused given a small config (as the benchmark's precompile does) runs its own path."""
    seed = fresh_seed()
    p = make_problem(2, 4, 256, 128, 2, "tensor-static", device="cpu")
    run_and_check(p, config=small_cfg(), fn=moe_unfused, seed=seed)


def test_small_config_errors_are_clear():
    p = make_problem(2, 4, 256, 128, 2, "block-dynamic", device="cpu")
    args = (p["x"], p["w13"], p["w2"], p["weights"], p["ids"])
    with pytest.raises(FusedMoEError, match="GU_K / DN_K == 128"):
        fused_moe(*args, config=small_cfg(GU_K=64), **p["kw"])
    with pytest.raises(FusedMoEError, match="lacks"):
        fused_moe(*args, config={"PATH": "small", "GU_N": 32}, **p["kw"])
    with pytest.raises(FusedMoEError, match="power of two"):
        fused_moe(*args, config=small_cfg(DN_N=48), **p["kw"])
    with pytest.raises(FusedMoEError, match="DN_SPLIT=9"):
        fused_moe(*args, config=small_cfg(DN_SPLIT=9), **p["kw"])
    for key in ("GU_RED", "PDL"):
        with pytest.raises(FusedMoEError, match=f"{key}=2 must be 0 or 1"):
            fused_moe(*args, config=small_cfg(**{key: 2}), **p["kw"])
    big = make_problem(op_small.SMALL_T_MAX + 1, 4, 128, 64, 2, "tensor-static", device="cpu")
    with pytest.raises(FusedMoEError, match="T <= 32"):
        fused_moe(
            big["x"], big["w13"], big["w2"], big["weights"], big["ids"], config=small_cfg(), **big["kw"]
        )


def test_default_small_config_uses_wgmma_tiles_and_covers_the_sms():
    sms = op_small.NUM_SMS_H200
    for t, e, h, i, a2_group in [
        (1, 192, 4096, 192, False),
        (1, 192, 4096, 1536, False),
        (1, 32, 7168, 2048, True),
        (1, 128, 2048, 768, True),
        (4, 128, 2048, 768, True),
    ]:
        cfg = op_small.default_small_config(t, 8, e, h, i, a2_group)
        c = op_small.check_small_config(cfg, a2_group, a2_group)
        assert c["GU_N"] >= 64 and c["DN_N"] >= 64  # the dot's M side: wgmma needs 64 rows
        assert 2 * min(e, 8 * t) * -(-i // c["GU_N"]) * c["SPLIT_K"] >= sms or c["SPLIT_K"] == 4
        assert t * 8 * -(-h // c["DN_N"]) >= sms
        if c["SPLIT_K"] == 1:
            assert op_small.h_mode(c, a2_group) == 1  # quantized once, in the gate/up epilogue


# ---------------------------------------------------------------------------------------------
# the kernels compile for SM90 with pipelined loads (no GPU needed)

_SMALL_TYPES = {
    "_small_quant_kernel": "*bf16 *fp8e4nv *fp32 *fp32 i32 i32 i32",
    "_small_gate_up_kernel": "*bf16 *fp8e4nv *fp32 *fp32 *fp32 *i32 *fp8e4nv *fp32 *fp8e4nv *fp32 *fp32 *i32 "
    + "i32 " * 12,
    "_small_down_kernel": "*fp8e4nv *fp32 *fp32 *i32 *fp32 *fp8e4nv *fp32 *fp32 *i32 *bf16 "
    + "i32 " * 7
    + "fp32 "
    + "i32 " * 5,
}


def _small_job(name: str, consts: dict) -> list:
    consts = dict(consts, USE_PDL=consts.get("USE_PDL", False))
    if name != "_small_quant_kernel":
        consts.setdefault("PREFETCH", False)
    if name == "_small_gate_up_kernel":
        consts.setdefault("GU_RED", False)
    if name == "_small_down_kernel":
        consts.setdefault("DN_SPLIT", 1)
    types = _SMALL_TYPES[name].split()
    if consts.get("H_MODE", 1) != 1:  # fp32 h or split-K partials
        types[8 if name == "_small_gate_up_kernel" else 0] = "*fp32"
    aligned = ["H", "I", "stride_x", "stride_we", "stride_wn", "stride_out"]
    return ["hpc_advise.kernels.fused_moe.kernel_small", name, " ".join(types), consts, 4, 4, aligned]


@pytest.mark.slow
def test_small_kernels_compile_for_sm90_with_pipelined_loads():
    jobs = []
    for group, h_mode, split, pre_q in [(False, 1, 1, 0), (True, 1, 1, 1), (True, 0, 1, 0), (True, 2, 3, 1)]:
        flags = dict(SPLIT_K=split, W_BLOCK=group, A2_GROUP=group, H_MODE=h_mode, K_PAD=8, EVEN_K=True)
        gu_n = 128 if group and h_mode == 1 else 64
        gu = dict(flags, BLOCK_M=16, BLOCK_N=gu_n, BLOCK_K=128, N_PAD=256, A_GROUP=group, PRE_Q=pre_q)
        jobs.append(_small_job("_small_gate_up_kernel", gu))
        jobs.append(_small_job("_small_down_kernel", dict(flags, BLOCK_H=64, BLOCK_K=128)))
    # split-K summed in the gate/up kernel (h handed over as fp8), split down K, programmatic launches
    flags = dict(SPLIT_K=4, W_BLOCK=True, A2_GROUP=True, H_MODE=1, K_PAD=8, EVEN_K=True, USE_PDL=True)
    flags["PREFETCH"] = True  # weights prefetched to L2 before each grid's wait
    gu = dict(flags, BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, N_PAD=256, A_GROUP=True, PRE_Q=1, GU_RED=True)
    jobs.append(_small_job("_small_gate_up_kernel", gu))
    jobs.append(_small_job("_small_down_kernel", dict(flags, BLOCK_H=64, BLOCK_K=128, DN_SPLIT=2)))
    jobs.append(_small_job("_small_quant_kernel", dict(QROWS=16, GROUP=128, A_GROUP=True, USE_PDL=True)))
    res = compile_sm90(jobs)
    quant = res.pop()
    assert quant["stack"] == 0, quant
    assert all(r["async_copies"] > 0 and r["stack"] == 0 for r in res), res
    # weight rows on the dot's M side: Hopper wgmma reads the fp8 tiles from shared memory
    assert all(r["wgmma"] > 0 for r in res), res
    # the down kernel's weight tiles are multi-buffered (software-pipelined K loop)
    assert all(r["shared"] >= 2 * 128 * 32 for r in res if r["kernel"] == "_small_down_kernel"), res


# ---------------------------------------------------------------------------------------------
# real shapes on the GPU

GPU_SHAPES = {  # name -> (E local, H, I, top_k, global experts, expert offset)
    "hy3": (192, 4096, 1536, 8, 192, 0),
    "hy3-tp8": (192, 4096, 192, 8, 192, 0),
    "qwen3-30b-a3b": (128, 2048, 768, 8, 128, 0),
    "deepseek-v3-ep8": (32, 7168, 2048, 8, 256, 64),
}


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(GPU_SHAPES))
@pytest.mark.parametrize("mode", ["tensor-static", "block-dynamic"])
@pytest.mark.parametrize("t,split", [(1, 1), (3, 2), (16, 1)])
def test_gpu_small_path_real_shapes(shape, mode, t, split):
    seed = fresh_seed()
    e, h, i, k, ge, off = GPU_SHAPES[shape]
    p = make_problem(t, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off)
    cfg = dict(op_small.default_small_config(t, k, e, h, i, mode.endswith("dynamic")), SPLIT_K=split)
    out, ref, err = run_and_check(p, config=cfg, scaling=2.5, seed=seed)
    print(f"small {shape} {mode} T={t} split={split}: rel err vs quantized ref {err:.2e}")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(GPU_SHAPES))
@pytest.mark.parametrize("mode", ["tensor-static", "block-dynamic"])
@pytest.mark.parametrize("t,split,dn_split", [(1, 8, 4), (3, 4, 2)])
def test_gpu_small_path_split_sums_and_pdl_real_shapes(shape, mode, t, split, dn_split):
    """GU_RED + DN_SPLIT with programmatic dependent launches and L2 weight prefetch, real shapes."""
    seed = fresh_seed()
    e, h, i, k, ge, off = GPU_SHAPES[shape]
    p = make_problem(t, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off)
    cfg = dict(
        op_small.default_small_config(t, k, e, h, i, mode.endswith("dynamic")),
        GU_N=128,
        GU_WARPS=8,
        GU_STAGES=3,
        SPLIT_K=split,
        GU_RED=1,
        DN_SPLIT=dn_split,
        PDL=1,
        PREFETCH=1,
    )
    out, ref, err = run_and_check(p, config=cfg, scaling=2.5, seed=seed)
    print(f"small {shape} {mode} T={t} split={split}/{dn_split} PDL: rel err vs quantized ref {err:.2e}")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["default", "split-sums-pdl"])
def test_gpu_small_path_graph_replay_is_deterministic_and_tracks_new_routing(variant):
    seed = fresh_seed()
    t, k = 4, 8
    p = make_problem(t, 192, 4096, 1536, k, "block-dynamic", device="cuda")
    p["ids"][0] = 17  # one token with every slot on one expert
    cfg = op_small.default_small_config(t, k, 192, 4096, 1536)
    if variant != "default":
        cfg = dict(cfg, GU_N=128, SPLIT_K=4, GU_RED=1, DN_SPLIT=2, PDL=1, PREFETCH=1)
    out = torch.empty_like(p["x"])
    call = lambda: fused_moe(
        p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=out, config=cfg, **p["kw"]
    )
    call()
    first = out.clone()
    call()
    assert torch.equal(out, first), seed  # bitwise reproducible
    check_graph_replay(p, call, out, seed=seed)
