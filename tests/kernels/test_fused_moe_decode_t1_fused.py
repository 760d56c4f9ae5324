"""Tests of the small-T path with its input quantization folded into the gate/up kernel (config FUSE_QUANT).

With PRE_Q the small-T path quantizes ``hidden`` in a launch of its own (``_small_quant_kernel``) before
gate/up and down. With FUSE_QUANT = 1 / 2 there is no such launch: every gate/up program that owns an
expert quantizes the T rows of its K range itself (``kernel_small._quant_span``, the arithmetic of the
quantization launch) into a private scratch slice and runs the PRE_Q loop on it. So the quantized values,
and with them every sum, are bitwise those of the three-launch path: asserted on the outputs and, on the
CPU, on the scratch itself against the quantization launch's buffers.

CPU tests run the Triton interpreter at small sizes (T = 1 / 2 / 3, split-K with the sums in gate/up, one
expert in every slot, empty experts, EP ranks with and without local tokens, NaN-poisoned outputs, the
launch-plan replay, T above FUSE_T_MAX, config errors, the tuner's candidates); the sm_90a build test
checks that the prologue leaves the K loop's pipeline, shared memory and tensor-core ops as they were;
``gpu`` tests run the real decode shapes at T = 1 on the H200, replayed from a CUDA graph with fresh
routing and from a launch plan.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.fused_moe import launch_plan as LP  # noqa: E402
from hpc_advise.kernels.fused_moe import op, op_small  # noqa: E402
from hpc_advise.kernels.fused_moe.op import FusedMoEError, fused_moe  # noqa: E402
from tests.kernels.sm90_compile import compile_sm90  # noqa: E402
from tests.kernels.test_fused_moe import (  # noqa: E402
    _seed,
    check_eager_plan_replay,
    check_graph_replay,
    device_scales,
    make_problem,
    run_and_check,
)
from tests.kernels.test_fused_moe_decode_group64 import match_h_group  # noqa: E402
from tests.kernels.test_fused_moe_host import check_plan_replays  # noqa: E402
from tests.kernels.test_fused_moe_small import _small_job  # noqa: E402

FP8_NAN = 0x7F  # float8_e4m3fn NaN bits: scratch bytes no program wrote


def cpu_cfg(**kw) -> dict:
    """The shipped Qwen3-235B T = 1 form at the CPU sizes: PRE_Q, 128-wide gate/up tiles (fp8 h), PDL."""
    cfg = dict(op_small.default_small_config(1, 3, 6, 384, 192), GU_N=128, DN_N=64, SPLIT_K=1, PDL=1)
    cfg.update(kw)
    return cfg


def _same_fused(p, cfg: dict, seed: int, scaling: float = 1.0) -> torch.Tensor:
    """The PRE_Q output and the FUSE_QUANT 1 / 2 outputs (2 also with FUSE_L1): each within the tolerance
    of the reference (NaN-poisoned ``out``, run_and_check) and the fused ones bitwise the PRE_Q one."""
    plain, _, _ = run_and_check(p, config=cfg, scaling=scaling, seed=seed)
    for fuse in (dict(FUSE_QUANT=1), dict(FUSE_QUANT=2), dict(FUSE_QUANT=2, FUSE_L1=1)):
        got, _, _ = run_and_check(p, config=dict(cfg, **fuse), scaling=scaling, seed=seed)
        assert torch.equal(plain, got), (seed, fuse)
    return plain


@pytest.mark.parametrize("mode", ["block-dynamic", "tensor-static", "block-static"])
@pytest.mark.parametrize(
    "t,extra",
    [
        (1, {}),
        (2, dict(SPLIT_K=2)),  # split-K 2: fp32 partials summed by the down kernel
        (3, dict(SPLIT_K=3, GU_RED=1, DN_SPLIT=2)),  # one K step per split, summed in gate/up
    ],
)
def test_fused_quant_bitwise_the_quant_launch(mode, t, extra):
    """E = 6, H = 384 (3 groups), I = 192 (a partial second N tile), k = 3."""
    seed = _seed()
    p = make_problem(t, 6, 384, 192, 3, mode, device="cpu")
    _same_fused(p, cpu_cfg(**extra), seed, scaling=2.5 if t == 3 else 1.0)


@pytest.fixture
def allocations(monkeypatch):
    """Unplanned calls whose workspace buffers are recorded in allocation order, fp8 ones filled with NaN
    bytes and fp32 ones with NaN: a program that read scratch it did not write could not pass."""
    made = []
    empty = LP.empty

    def recorded(*shape, dtype, device):
        buf = empty(*shape, dtype=dtype, device=device)
        if dtype == torch.float32:
            buf.fill_(float("nan"))
        elif buf.element_size() == 1:
            buf.view(torch.uint8).fill_(FP8_NAN)
        made.append(buf)
        return buf

    monkeypatch.setattr(LP, "ENABLED", False)
    monkeypatch.setattr(LP, "empty", recorded)
    return made


@pytest.mark.parametrize(
    "mode,t,split", [("block-dynamic", 2, 2), ("tensor-static", 1, 1), ("block-dynamic", 3, 3)]
)
def test_fused_quant_scratch_holds_the_quant_launch_values(mode, t, split, allocations):
    """The quantized rows themselves: the PRE_Q call's first two buffers are the quantization launch's
    output (fp8 [T, H], group scales [T, H / 128]); the fused call's first two are the scratch (one [T, H]
    slice per gate/up program). Each program that owns an expert wrote exactly its K range, bitwise the
    launch's values there; the others wrote nothing; as many programs wrote as there are (local expert,
    N tile, split) triples."""
    seed = _seed()
    h, i, gu_n = 384, 192, 128
    ids = torch.tensor([[1, 4, 5], [4, 0, 1], [2, 2, 2]], dtype=torch.int32)[:t]
    p = make_problem(t, 6, h, i, 3, mode, device="cpu", ids=ids)
    cfg = cpu_cfg(SPLIT_K=split)
    plain, _, _ = run_and_check(p, config=cfg, seed=seed)
    xq, xs = allocations[0], allocations[1]
    assert xq.shape == (t, h) and xs.shape == (t, h // 128), [a.shape for a in allocations]
    allocations.clear()
    fused, _, _ = run_and_check(p, config=dict(cfg, FUSE_QUANT=1), seed=seed)
    assert torch.equal(plain, fused), seed
    sq, ss = allocations[0], allocations[1]
    num_n = -(-i // gu_n)
    grid0 = 3 * t * num_n
    assert sq.shape == (grid0 * split * t, h), sq.shape
    sq, ss = sq.view(torch.uint8).view(split, grid0, t, h), ss.view(split, grid0, t, h // 128)
    span = -(-(h // 128) // split) * 128
    written = 0
    for pk in range(split):
        lo, hi = pk * span, min(pk * span + span, h)
        for pid in range(grid0):
            q = sq[pk, pid]
            outside = torch.cat([q[:, :lo], q[:, hi:]], dim=1)
            assert (outside == FP8_NAN).all(), (seed, pk, pid)
            if (q[:, lo:hi] == FP8_NAN).all():
                continue
            written += 1
            assert torch.equal(q[:, lo:hi], xq.view(torch.uint8)[:, lo:hi]), (seed, pk, pid)
            if mode == "block-dynamic":
                assert torch.equal(ss[pk, pid][:, lo // 128 : hi // 128], xs[:, lo // 128 : hi // 128]), seed
    assert written == len(set(ids.flatten().tolist())) * num_n * split, (seed, written)


@pytest.mark.parametrize("mode", ["block-dynamic", "tensor-static"])
def test_fused_quant_one_expert_in_every_slot_and_empty_experts(mode):
    """Token 0 names expert 2 in all k slots, token 1 shares it in one slot (one program serves both); of
    E = 8 experts, 4 are empty."""
    seed = _seed()
    ids = torch.tensor([[2, 2, 2], [0, 2, 3]], dtype=torch.int32)
    p = make_problem(2, 8, 384, 192, 3, mode, device="cpu", ids=ids)
    _same_fused(p, cpu_cfg(), seed)
    _same_fused(p, cpu_cfg(SPLIT_K=3, GU_RED=1), seed)


def test_fused_quant_expert_parallel_ranks():
    """EP rank with experts 4..7 of 12: slots of other ranks and -1 skipped, token 0 has no local slot
    (zeros); then a rank whose range holds none of the tokens' experts (all zeros)."""
    seed = _seed()
    ids = torch.tensor([[0, 11, -1], [5, -1, 9], [4, 7, 6]], dtype=torch.int32)
    p = make_problem(3, 4, 384, 192, 3, "block-dynamic", ids=ids, expert_offset=4, device="cpu")
    out = _same_fused(p, cpu_cfg(), seed)
    assert (out[0] == 0).all(), seed
    ids = torch.randint(0, 8, (2, 3), dtype=torch.int32)
    p = make_problem(2, 4, 384, 192, 3, "block-dynamic", ids=ids, expert_offset=8, device="cpu")
    out = _same_fused(p, cpu_cfg(SPLIT_K=2, GU_RED=1), seed)
    assert (out == 0).all(), seed


def test_fused_quant_above_fuse_t_max_runs_the_quant_launch(allocations):
    """T = FUSE_T_MAX + 1 (a T = 4 entry serves up to T = 8): the config runs as plain PRE_Q, with the
    quantization launch's [T, H] buffer, and gives its output."""
    seed = _seed()
    t = op_small.FUSE_T_MAX + 1
    p = make_problem(t, 6, 256, 128, 2, "block-dynamic", device="cpu")
    plain, _, _ = run_and_check(p, config=cpu_cfg(), seed=seed)
    allocations.clear()
    fused, _, _ = run_and_check(p, config=cpu_cfg(FUSE_QUANT=2), seed=seed)
    assert torch.equal(plain, fused), seed
    assert allocations[0].shape == (t, 256), allocations[0].shape


def test_fused_quant_launch_plan_replays_bitwise():
    """Through the launch plans: the first eager call records (two launches, the scratch a workspace slot),
    a call on other inputs and a third on the first inputs replay, each bitwise the unplanned call."""
    _seed()
    cfg = cpu_cfg(FUSE_QUANT=1, SPLIT_K=2, GU_RED=1)
    check_plan_replays(
        "block-dynamic",
        cfg,
        "cpu",
        problem=lambda: make_problem(2, 6, 384, 192, 3, "block-dynamic", device="cpu"),
    )


def test_fused_quant_config_errors_are_clear():
    p = make_problem(1, 6, 256, 128, 2, "block-dynamic", device="cpu")
    for cfg, words in (
        (cpu_cfg(PRE_Q=0, FUSE_QUANT=1), "needs PRE_Q = 1"),
        (cpu_cfg(FUSE_QUANT=3), "FUSE_QUANT=3 must be 0, 1"),
        (cpu_cfg(FUSE_L1=1), "FUSE_L1=1 must be 0 or 1, and 1 only with FUSE_QUANT"),
    ):
        with pytest.raises(FusedMoEError, match=words):
            fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], config=cfg, **p["kw"])


def _load_tuner():
    from tests.kernels.test_fused_moe_decode_round5 import _load_tuner as load

    return load()


def test_tuner_fuse_quant_candidates(monkeypatch):
    """--fuse-quant: the current pick first; FUSE_QUANT 1 / 2 only for a small-T PRE_Q pick at T <= 4,
    with dynamic group scales also with FUSE_L1, with PDL added where the pick has none; nothing else
    changed in the candidates."""
    tune = _load_tuner()
    small = cpu_cfg(PDL=0)
    monkeypatch.setattr(op, "get_config", lambda *a, **kw: small)
    cands = tune.fuse_quant_candidates(op, 1, 8, 192, 4096, 1536, "tensor-static")
    assert cands[0] == small and len(cands) == 5
    rest = lambda c: {k: v for k, v in c.items() if k not in ("FUSE_QUANT", "PDL", "FUSE_L1")}  # noqa: E731
    assert all(rest(c) == rest(small) for c in cands)
    assert {(c.get("FUSE_QUANT"), c.get("PDL")) for c in cands[1:]} == {(1, 0), (2, 0), (1, 1), (2, 1)}
    cands = tune.fuse_quant_candidates(op, 1, 8, 128, 4096, 1536, "block-dynamic")
    assert cands[0] == small and len(cands) == 7 and all(rest(c) == rest(small) for c in cands)
    assert sum(c.get("FUSE_L1", 0) for c in cands) == 2
    assert tune.fuse_quant_candidates(op, op_small.FUSE_T_MAX + 1, 8, 128, 4096, 1536, "block-dynamic") == [
        small
    ]
    regular = {k: v for k, v in small.items() if k != "PATH"}
    monkeypatch.setattr(op, "get_config", lambda *a, **kw: regular)
    assert tune.fuse_quant_candidates(op, 1, 8, 128, 4096, 1536, "block-dynamic") == [regular]
    job = tune.fuse_quant_compile_job("qwen3-235b", "block-dynamic", dict(small, FUSE_QUANT=1))
    assert job[4] == 4096  # the prologue's tile follows H: built at the shape's own H


@pytest.mark.slow
def test_fused_quant_prologue_keeps_the_k_loop_sm90():
    """sm_90a builds of the gate/up kernel at the shipped T = 1 forms (Qwen3-235B: 128-wide block-scaled
    tile, 8 warps, 3 stages; DeepSeek-V3 EP8: split 4 summed in gate/up; Hy3: per-tensor 64-wide, 4 warps, 4
    stages) with and without the prologue: same pipelined async copies, wgmma ops and shared memory, no
    spills. Registers: ptxas takes 136 with the prologue at 8 warps (92 without), which op_small caps at
    FUSE_MAXNREG = 128 (2 CTAs per SM, as the shared memory allows; no spills there, checked by hand with
    maxnreg, 2026-11-29)."""
    base = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, SPLIT_K=1, K_PAD=8, N_PAD=256, H_MODE=1, PRE_Q=1,
                A_GROUP=True, A2_GROUP=True, W_BLOCK=True, EVEN_K=True, USE_PDL=True)  # fmt: skip
    hy3 = dict(base, BLOCK_N=64, A_GROUP=False, A2_GROUP=False, W_BLOCK=False)
    forms = [(base, 32, 1, 8, 3), (dict(base, SPLIT_K=4, GU_RED=True), 16, 1, 8, 3), (hy3, 32, 1, 4, 4)]
    jobs = []
    for consts, groups, chunks, warps, stages in forms:
        fused = dict(consts, FUSE_QUANT=True, Q_GROUPS=groups, Q_CHUNKS=chunks, PF_STEPS=stages)
        for c in (consts, fused):
            job = _small_job("_small_gate_up_kernel", c)
            job[4], job[5] = warps, stages
            jobs.append(job)
    res = compile_sm90(jobs)
    for plain, fused in zip(res[::2], res[1::2], strict=True):
        print(f"gate/up registers without / with the prologue: {plain['registers']} / {fused['registers']}")
        assert fused["stack"] == 0 and plain["stack"] == 0, (plain, fused)
        for key in ("async_copies", "wgmma", "shared"):
            assert fused[key] == plain[key] and plain[key] > 0, (key, plain, fused)


# ---------------------------------------------------------------------------------------------
# real shapes on the GPU (T = 1, the shipped small-T picks)

GPU_SHAPES = {  # name -> (E local, H, I, top_k, global experts, expert offset)
    "qwen3-235b": (128, 4096, 1536, 8, 128, 0),
    "qwen3-30b-a3b": (128, 2048, 768, 8, 128, 0),
    "deepseek-v3-ep8": (32, 7168, 2048, 8, 256, 64),
}


def _gpu_problem(shape: str, t: int = 1):
    e, h, i, k, ge, off = GPU_SHAPES[shape]
    p = make_problem(t, e, h, i, k, "block-dynamic", device="cuda", global_experts=ge, expert_offset=off)
    cfg = op.get_config(t, k, e, h, i, "block-dynamic", True)
    if not (op_small.is_small(cfg) and cfg.get("PRE_Q")):  # the shipped pick is the small path at T = 1
        cfg = dict(op_small.default_small_config(t, k, e, h, i), PDL=1)
    return p, {key: v for key, v in cfg.items() if key != "FUSE_QUANT"}


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(GPU_SHAPES))
def test_gpu_fused_quant_real_shapes_bitwise(shape, monkeypatch):
    seed = _seed()
    p, cfg = _gpu_problem(shape)
    match_h_group(monkeypatch, cfg)  # Qwen3-235B's pick quantizes h in 1x64 groups since 2026-11-30 00:08 UTC
    plain = _same_fused(p, cfg, seed, scaling=2.5)
    # the signature's plan, recorded above, replayed twice: bitwise the recorded call
    replays = [run_and_check(p, config=dict(cfg, FUSE_QUANT=2), scaling=2.5, seed=seed)[0] for _ in range(2)]
    assert torch.equal(replays[0], plain) and torch.equal(replays[1], plain), seed


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["qwen3-235b", "deepseek-v3-ep8"])
def test_gpu_fused_quant_graph_replay_tracks_new_routing(shape, monkeypatch):
    """Captured once (two calls back to back, PDL), replayed with fresh routing written into the ids,
    output poisoned with NaN before each replay (test_fused_moe.check_graph_replay)."""
    seed = _seed()
    p, cfg = _gpu_problem(shape)
    match_h_group(monkeypatch, cfg)
    cfg = dict(cfg, FUSE_QUANT=2, PDL=1)
    kw = device_scales(p["kw"])
    out = torch.empty_like(p["x"])
    call = lambda: fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=out, config=cfg, **kw)
    check_graph_replay(p, call, out, seed=seed, replays=3, capture_calls=2)


@pytest.mark.gpu
def test_gpu_fused_quant_eager_plan_replay_and_new_routing():
    """The second eager call of the signature (replaying the compiled launches) is bitwise the first; a
    call on new routing matches the unplanned call."""
    seed = _seed()
    p, cfg = _gpu_problem("qwen3-30b-a3b")
    check_eager_plan_replay(p, dict(cfg, FUSE_QUANT=1), seed=seed)
