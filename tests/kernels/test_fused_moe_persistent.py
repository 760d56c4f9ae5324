"""Tests of the FP8 fused MoE's persistent decode path (kernel_persistent.py / op_persistent.py).

Same conventions as test_fused_moe.py (problem builder, checker with the fp8 midpoint second look,
REL_TOL_QUANT_REF = 2e-2 against the fp32 reference with the same quantization; kernel README,
"Tolerances"): fresh random inputs (seed in the failure message), NaN-poisoned ``out``. On CPU the
Triton interpreter runs the one launch as ONE program (programs run one after another there, so a
program waiting for another would never return): every phase-A item, then every phase-B item, with
the K splits sized for ``programs`` (so the split sums run too). The handover between programs
(arrival and ready counters, the reset by the last program) runs on the GPU, in the ``gpu`` tests.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.fused_moe import op, op_persistent, op_small  # noqa: E402
from hpc_advise.kernels.fused_moe.op import FusedMoEError, fused_moe, moe_unfused  # noqa: E402
from tests.kernels.sm90_compile import compile_sm90  # noqa: E402
from tests.kernels.test_fused_moe import (  # noqa: E402
    REL_TOL_QUANT_REF,
    _seed,
    check_graph_replay,
    device_scales,
    make_problem,
    rel_err,
    run_and_check,
)


def pcfg(mode: str, **kw) -> dict:
    """A persistent-path config: the default of the mode's a2 scales, overridden by ``kw``."""
    return dict(op_persistent.default_persistent_config(mode.endswith("dynamic")), **kw)


def persistent(programs=None):
    """op.fused_moe's signature, straight to op_persistent (the validation as op._Launch does it),
    with ``programs``: the grid on the GPU, the programs the K splits are sized for on CPU."""

    def call(x, w13, w2, w, ids, *, w13_scale, w2_scale, a13_scale=None, a2_scale=None, block_shape=None,
             expert_offset=0, routed_scaling_factor=1.0, out=None, config=None):  # fmt: skip
        del block_shape
        dev = x.device
        one = torch.ones(1, dtype=torch.float32, device=dev)
        scale = lambda v: one if v is None else torch.as_tensor(v, dtype=torch.float32, device=dev).reshape(1)
        return op_persistent.fused_moe_persistent(
            x, w13, w2, w, ids, w13_scale=w13_scale, w2_scale=w2_scale, a13=scale(a13_scale),
            a2=scale(a2_scale), a1_group=a13_scale is None, a2_group=a2_scale is None,
            w_block=w13_scale.dim() == 3, expert_offset=expert_offset,
            routed_scaling_factor=routed_scaling_factor, out=out, config=config, programs=programs,
        )  # fmt: skip

    return call


# ---------------------------------------------------------------------------------------------
# the persistent path vs the reference (CPU interpreter, one program)


@pytest.mark.parametrize(
    "mode,t,h,i,programs",
    [
        ("block-dynamic", 1, 384, 192, 1),  # I = 192: a partial second h group
        ("block-dynamic", 3, 320, 192, 40),  # H = 320: a partial third x group; 3 K splits
        ("tensor-static", 1, 384, 96, 40),  # I = 96: one partial 64-row tile of 2; split sums
        ("tensor-static", 4, 256, 192, 1),
        ("tensor-dynamic", 2, 384, 192, 24),
        ("block-static", 2, 320, 96, 40),
    ],
)
def test_persistent_path_matches_reference(mode, t, h, i, programs):
    seed = _seed()
    p = make_problem(t, 6, h, i, 3, mode, device="cpu")
    run_and_check(p, config=pcfg(mode), fn=persistent(programs), scaling=2.5, seed=seed)


@pytest.mark.parametrize("mode", ["block-dynamic", "tensor-static"])
def test_many_workers_split_both_phases_and_one_worker_matches(mode):
    """400 workers on a small problem: phase-A pairs in several K segments (stream-K) and the down
    items split over K (S_MAX = 4) — against the reference, and S_MAX = 1 (no split at all)."""
    seed = _seed()
    p = make_problem(2, 4, 512, 256, 2, mode, device="cpu")
    run_and_check(p, config=pcfg(mode, S_MAX=4, DN_N=128), fn=persistent(400), seed=seed)
    run_and_check(p, config=pcfg(mode, S_MAX=1), fn=persistent(400), seed=seed)


def test_k_segments_are_summed_in_k_order_and_counters_end_at_zero():
    """H = 384: three K steps per (expert, group) pair. With 40 workers and S_MAX = 4 every worker takes
    one step (W = min(40, pairs·3, pairs·3 steps)), so each pair's three one-step segments are added
    in K order exactly as one program adds its steps: the output is bitwise the unsplit one. With
    S_MAX = 3 (W = pairs·2) a pair gets a one-step and a two-step segment: another fp32 summation order,
    so only the reference bound holds. A rerun is bitwise equal; every counter is back at 0."""
    seed = _seed()
    p = make_problem(3, 4, 384, 128, 3, "block-dynamic", device="cpu")
    p["ids"][1] = p["ids"][0]  # two tokens on the same experts: one owner serves both
    cfg = pcfg("block-dynamic", S_MAX=4)
    one, _, _ = run_and_check(p, config=cfg, fn=persistent(1), seed=seed)
    split, _, _ = run_and_check(p, config=cfg, fn=persistent(40), seed=seed)
    again, _, _ = run_and_check(p, config=cfg, fn=persistent(40), seed=seed)
    assert torch.equal(one, split) and torch.equal(split, again), seed
    uneven, _, _ = run_and_check(p, config=pcfg("block-dynamic", S_MAX=3), fn=persistent(40), seed=seed)
    assert torch.equal(uneven, run_and_check(p, config=pcfg("block-dynamic", S_MAX=3), fn=persistent(40))[0])
    assert all(int(c.abs().sum()) == 0 for c in op_small._COUNTERS.values()), seed


@pytest.mark.parametrize("mode", ["tensor-static", "block-dynamic"])
def test_one_token_naming_an_expert_in_two_slots(mode):
    """Token 0 names expert 2 in slots 0 and 2 (counted twice, weighted per slot); token 1 shares
    expert 2 in one slot (one owner entry serves both tokens) and has a single local slot."""
    seed = _seed()
    ids = torch.tensor([[2, 1, 2], [7, 2, -1]], dtype=torch.int32)
    p = make_problem(2, 4, 256, 128, 3, mode, ids=ids, device="cpu")
    run_and_check(p, config=pcfg(mode), fn=persistent(16), seed=seed)


def test_ids_of_other_ranks_and_minus_one_are_skipped():
    """EP rank with experts 4..7 of 12: token 0 has no local slot and gets zeros, token 1 one local
    slot (written directly), token 2 three (summed in slot order)."""
    seed = _seed()
    ids = torch.tensor([[0, 11, -1], [5, -1, 9], [4, 7, 6]], dtype=torch.int32)
    p = make_problem(3, 4, 256, 128, 3, "block-dynamic", ids=ids, expert_offset=4, device="cpu")
    out, _, _ = run_and_check(p, config=pcfg("block-dynamic"), fn=persistent(8), seed=seed)
    assert (out[0] == 0).all(), seed


def test_rank_without_local_tokens_writes_zeros():
    seed = _seed()
    ids = torch.randint(0, 8, (4, 3), dtype=torch.int32)  # experts 0..7; this rank holds 8..11
    p = make_problem(4, 4, 256, 128, 3, "tensor-static", ids=ids, expert_offset=8, device="cpu")
    out, _, _ = run_and_check(p, config=pcfg("tensor-static"), fn=persistent(), seed=seed)
    assert (out == 0).all(), seed


# ---------------------------------------------------------------------------------------------
# dispatch and config validation (op.py hook)


def test_shipped_configs_never_pick_the_persistent_path():
    """The persistent path is opt-in (an explicit config, or a table of one's own from the tuner's
    --persistent): its programs wait on each other's counters and assume the whole grid is resident, which
    a kernel on another stream (an EP collective, the other micro-batch) can break (README)."""
    data = json.loads(op.CONFIG_PATH.read_text())
    assert data["entries"] and not [x for x in data["entries"] if op_persistent.is_persistent(x["config"])]


def test_dispatch_sends_persistent_configs_to_the_path_and_checks_its_limits(monkeypatch, tmp_path):
    """A tuned persistent entry is used near its T through op.fused_moe (same output as the direct
    call), never past PERSISTENT_T_MAX, and never by the unfused baseline."""
    seed = _seed()
    p = make_problem(2, 4, 256, 128, 3, "block-dynamic", device="cpu")
    cfg = pcfg("block-dynamic")
    entry = dict(E=4, H=256, I=128, top_k=3, mode="block-dynamic", T=2, config=cfg)
    path = tmp_path / "configs.json"
    path.write_text(json.dumps({"version": 1, "entries": [entry, dict(entry, T=16)]}))
    monkeypatch.setattr(op, "CONFIG_PATH", path)
    op._config_table.cache_clear()
    try:
        assert op.get_config(3, 3, 4, 256, 128, "block-dynamic", True) == cfg
        assert not op_persistent.is_persistent(op.get_config(24, 3, 4, 256, 128, "block-dynamic", True))
        via_op, _, _ = run_and_check(p, seed=seed)
        direct, _, _ = run_and_check(p, config=cfg, fn=persistent(), seed=seed)
        assert torch.equal(via_op, direct), seed
        run_and_check(p, config=cfg, fn=moe_unfused, seed=seed)
        big = make_problem(op_persistent.PERSISTENT_T_MAX + 1, 4, 128, 64, 2, "tensor-static", device="cpu")
        with pytest.raises(FusedMoEError, match="T <= 16"):
            fused_moe(
                big["x"],
                big["w13"],
                big["w2"],
                big["weights"],
                big["ids"],
                config=pcfg("tensor-static"),
                **big["kw"],
            )
    finally:
        # every call that reads the table runs above, so none caches the temporary one past the test
        op._config_table.cache_clear()


def test_persistent_config_errors_are_clear():
    p = make_problem(1, 4, 256, 128, 2, "block-dynamic", device="cpu")
    args = (p["x"], p["w13"], p["w2"], p["weights"], p["ids"])
    bad = {
        "lacks": {"PATH": "persistent", "GU_N": 128},
        "GU_N == DN_K == 128": pcfg("block-dynamic", GU_N=64),
        "GU_K == 128": pcfg("block-dynamic", GU_K=64),
        "DN_N=32 must be 64, 128 or 256": pcfg("block-dynamic", DN_N=32),
        "S_MAX=0": pcfg("block-dynamic", S_MAX=0),
        "WARPS=2": pcfg("block-dynamic", WARPS=2),
        "PROGS_PER_SM=5 must be 1 to 4": pcfg("block-dynamic", PROGS_PER_SM=5),
        "PDL=2 must be 0 or 1": pcfg("block-dynamic", PDL=2),
    }
    for match, cfg in bad.items():
        with pytest.raises(FusedMoEError, match=match):
            fused_moe(*args, config=cfg, **p["kw"])


# ---------------------------------------------------------------------------------------------
# the kernel builds for SM90: wgmma products, pipelined weight loads, no register spills

_TYPES = (
    "*bf16 *i32 *fp32 *fp32 *fp32 *fp8e4nv *fp32 *fp8e4nv *fp32 *fp8e4nv *fp32 *fp8e4nv *fp32 *fp32 *fp32 *bf16 "
    + "*i32 " * 4
    + "i32 " * 7
    + "fp32 "
    + "i32 " * 11
)


@pytest.mark.slow
def test_persistent_kernel_compiles_for_sm90_without_spills():
    aligned = ["H", "I", "stride_x", "stride_out", "stride_w13e", "stride_w13n", "stride_w2e", "stride_w2n"]
    jobs = []
    for group, cfg in ((True, pcfg("block-dynamic")), (False, pcfg("tensor-static"))):
        consts = dict(
            BLOCK_N=cfg["GU_N"], BLOCK_K=128, BLOCK_H=cfg["DN_N"], BLOCK_KB=128, S_MAX=cfg["S_MAX"],
            K_PAD=8, N_PAD=32, A_GROUP=group, A2_GROUP=group, W_BLOCK=group, USE_PDL=True, PREFETCH=2,
            PREFETCH_A=True, G_PAD=32,
            STAGES_A=cfg["GU_STAGES"], STAGES_B=cfg["DN_STAGES"],
        )  # fmt: skip
        job = ["hpc_advise.kernels.fused_moe.kernel_persistent", "_persistent_moe_kernel", _TYPES.strip()]
        jobs.append(job + [consts, cfg["WARPS"], 1, aligned])
    res = compile_sm90(jobs)
    # gate, up and down products on wgmma (weight rows as the M side), weight tiles by cp.async
    assert all(r["wgmma"] == 3 and r["async_copies"] > 0 and r["stack"] == 0 for r in res), res
    assert all(r["ctas_per_sm"] >= 1 for r in res), res


# ---------------------------------------------------------------------------------------------
# real shapes on the GPU: P = SM count, programs handing tiles over through the counters

GPU_SHAPES = {  # name -> (E local, H, I, top_k, global experts, expert offset, mode)
    "qwen3-30b-a3b": (128, 2048, 768, 8, 128, 0, "block-dynamic"),
    "deepseek-v3-ep8": (32, 7168, 2048, 8, 256, 64, "block-dynamic"),
    "qwen3-235b": (128, 4096, 1536, 8, 128, 0, "block-dynamic"),
    "hy3-tp8": (192, 4096, 192, 8, 192, 0, "tensor-static"),
    "hy3": (192, 4096, 1536, 8, 192, 0, "tensor-static"),
}


def _gpu_problem(shape, t, mode=None):
    e, h, i, k, ge, off, m = GPU_SHAPES[shape]
    return make_problem(t, e, h, i, k, mode or m, device="cuda", global_experts=ge, expert_offset=off)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(GPU_SHAPES))
@pytest.mark.parametrize("t", [1, 4])
def test_gpu_persistent_real_shapes_rerun_bitwise_and_small_path_agrees(shape, t):
    seed = _seed()
    p = _gpu_problem(shape, t)
    mode = GPU_SHAPES[shape][6]
    # T = 1: every weight tile of a program requested towards L2 at its start; T = 4: per phase-B item
    cfg = pcfg(mode, PDL=1, PREFETCH=2, PREFETCH_A=1) if t == 1 else pcfg(mode, PDL=1, PREFETCH=1)
    out, ref, err = run_and_check(p, config=cfg, fn=persistent(), scaling=2.5, seed=seed)
    again, _, _ = run_and_check(p, config=cfg, fn=persistent(), scaling=2.5, seed=seed)
    assert torch.equal(out, again), seed  # fixed-order sums: bitwise reproducible
    e, h, i, k = GPU_SHAPES[shape][:4]
    small = op_small.default_small_config(t, k, e, h, i, mode.endswith("dynamic"))
    small_out, _, _ = run_and_check(p, config=small, scaling=2.5, seed=seed)
    print(f"persistent {shape} T={t}: rel err {err:.2e}; vs small path {rel_err(out, small_out.float()):.2e}")
    assert rel_err(out, small_out.float()) <= 2 * REL_TOL_QUANT_REF, seed


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["tensor-static", "block-dynamic"])
def test_gpu_persistent_few_programs_and_other_mode(mode):
    """7 programs (many items each, phase-B programs waiting on others), the shape's other scale mode."""
    seed = _seed()
    p = _gpu_problem("qwen3-30b-a3b", 3, mode)
    run_and_check(p, config=pcfg(mode, S_MAX=4), fn=persistent(7), scaling=2.5, seed=seed)


@pytest.mark.gpu
def test_gpu_persistent_ep_rank_without_local_tokens_writes_zeros():
    seed = _seed()
    p = _gpu_problem("deepseek-v3-ep8", 2)
    p["ids"].copy_(
        torch.randint(0, 64, p["ids"].shape, device="cuda", dtype=torch.int32)
    )  # rank holds 64..95
    out, _, _ = run_and_check(p, config=pcfg("block-dynamic", PDL=1), fn=persistent(), seed=seed)
    assert (out == 0).all(), seed


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["qwen3-30b-a3b", "hy3-tp8"])
def test_gpu_persistent_graph_replay_tracks_new_routing(shape):
    """Captured once, replayed with fresh routing (and one token on one expert in two slots): the
    counters are back at 0 after each replay (no memset in the graph) and the output is right."""
    seed = _seed()
    p = _gpu_problem(shape, 4)
    cfg = pcfg(GPU_SHAPES[shape][6], PDL=1, PREFETCH=1)
    out = torch.empty_like(p["x"])
    kw = device_scales(p["kw"])
    call = lambda: persistent()(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=out, config=cfg, **kw)
    check_graph_replay(p, call, out, seed=seed, replays=3)
    assert all(int(c.abs().sum()) == 0 for c in op_small._COUNTERS.values()), seed
