"""Tests of the small-T path with h quantized in 1×64 groups (config H_GROUP = 64, block-scaled shapes).

With dynamic intermediate scales the small path hands h to the down kernel as fp8 only when one gate/up tile
holds a whole quantization group, which held the block-scaled shapes to 128-wide gate/up tiles (Qwen3-235B
T = 1: 96 gate/up programs on 132 SMs). H_GROUP = 64 makes h's group 1×64: a 64-wide tile quantizes its own
columns in the epilogue (one scale per row and tile), and the down kernel applies one activation scale per
(row, 64 columns) times the 128×128 weight block scale of that K range, either stepping K by 64 (DN_K 64) or
by 128 with the step's two groups in two columns of the dot's activation side (DN_K 128: the 1×128 form's
loads; the same products summed in another order, so close to, not bitwise, the 64-step form). That is a finer
quantization than the checkpoints' 1×128 recipe, so the outputs are compared with the reference quantizing h
in 1×64 groups (``fused_moe_reference(..., h_group=64)``, the usual REL_TOL_QUANT_REF), and the distance to
the 1×128 reference and to unquantized math is reported.

The helpers of test_fused_moe.py (run_and_check, check_graph_replay) and test_fused_moe_host.py
(check_plan_replays) check against ``fused_moe_reference`` and fp8_midpoint's 1×128 analysis; the fixture
``group64`` points both at 64-wide groups for one test (``monkeypatch``), so they are reused unchanged.

CPU tests run the Triton interpreter at small sizes (T = 1 / 3, I not a multiple of the tile, one expert in
every slot, empty experts, EP ranks with and without local tokens, NaN-poisoned outputs, the three ways h
reaches the down kernel, FUSE_QUANT, both down K steps, the launch-plan replay, config errors, the tuner's
candidates); the sm_90a build test checks the 64-wide block-scaled gate/up and the 64- and 128-step down
kernels build without spills;
``gpu`` tests run Qwen3-235B / Qwen3-30B-A3B / DeepSeek-V3 EP8 at T = 1 and 4 on the H200, replayed from a
CUDA graph with fresh routing and from a launch plan.
"""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import tests.kernels.fp8_midpoint as midpoint  # noqa: E402
import tests.kernels.test_fused_moe as base  # noqa: E402
from hpc_advise.kernels.fused_moe import op, op_small, reference  # noqa: E402
from hpc_advise.kernels.fused_moe.op import FusedMoEError, fused_moe  # noqa: E402
from tests.kernels.sm90_compile import compile_sm90  # noqa: E402
from tests.kernels.test_fused_moe import (  # noqa: E402
    _seed,
    check_graph_replay,
    device_scales,
    make_problem,
    rel_err,
    run_and_check,
)
from tests.kernels.test_fused_moe_host import check_plan_replays  # noqa: E402
from tests.kernels.test_fused_moe_small import _small_job  # noqa: E402

# the 1×64 and 1×128 quantizations of h differ by up to an e4m3 step on the elements whose 64-wide half does
# not hold their 128-group's amax (about half): a few % of the output, measured below; a bug is O(1)
REL_TOL_VS_128_REF = 6e-2


def match_h_group(monkeypatch, cfg: dict) -> None:
    """Point the shared checkers' reference and fp8-midpoint analysis at the h groups of ``cfg`` (a small-T
    config with H_GROUP 64, as the shipped Qwen3-235B T = 1 / 4 and Qwen3-30B-A3B T = 4 picks since the
    2026-11-30 00:08 UTC run); nothing for the 1×128 form. Tests of other files that check a shipped pick call it."""
    group = op_small.h_group(cfg) if op_small.is_small(cfg) else op_small.GROUP
    if group == op_small.GROUP:
        return
    monkeypatch.setattr(
        base, "fused_moe_reference", functools.partial(reference.fused_moe_reference, h_group=group)
    )
    monkeypatch.setattr(midpoint, "GROUP", group)
    monkeypatch.setattr(midpoint, "quantize_group", functools.partial(reference.quantize_group, group=group))


@pytest.fixture
def group64(monkeypatch):
    """The shared checkers' reference and fp8-midpoint analysis quantize h in 1×64 groups."""
    match_h_group(monkeypatch, {"PATH": "small", "H_GROUP": 64})


def g64(cfg: dict, **kw) -> dict:
    """``cfg`` with h in 1×64 groups: 64-wide gate/up tiles (4 warps, 4 stages, as Hy3's) and 64-wide down
    K steps."""
    out = dict(cfg, H_GROUP=64, GU_N=64, DN_K=64, GU_WARPS=4, GU_STAGES=4)
    out.update(kw)
    return out


def cpu_cfg(**kw) -> dict:
    """The shipped Qwen3-235B T = 1 form at CPU sizes (PRE_Q, 128-wide gate/up tiles, PDL) with H_GROUP 64."""
    cfg = dict(op_small.default_small_config(1, 3, 6, 384, 192), GU_N=128, DN_N=64, SPLIT_K=1, PDL=1)
    return g64(cfg, **kw)


def _refs(p, scaling: float):
    args = (p["x"], p["w13"], p["w2"], p["weights"], p["ids"])
    r128 = reference.fused_moe_reference(*args, routed_scaling_factor=scaling, **p["kw"])
    flt = reference.moe_float_reference(
        p["x"], p["w13f"], p["w2f"], p["weights"], p["ids"], expert_offset=p["kw"]["expert_offset"],
        routed_scaling_factor=scaling,
    )  # fmt: skip
    return r128, flt


def check_group64(p, cfg: dict, seed: int, scaling: float = 1.0) -> tuple[torch.Tensor, float]:
    """One NaN-poisoned call within REL_TOL_QUANT_REF of the 1×64 reference (run_and_check under the
    ``group64`` fixture), and within REL_TOL_VS_128_REF of the 1×128 one; the errors are printed."""
    out, ref64, err = run_and_check(p, config=cfg, scaling=scaling, seed=seed)
    if ref64.abs().max() == 0:
        return out, 0.0
    r128, flt = _refs(p, scaling)
    e128, eflt = rel_err(out, r128), rel_err(out, flt)
    print(f"rel err vs 1x64 ref {err:.2e}, vs 1x128 ref {e128:.2e}, vs unquantized {eflt:.2e} (seed {seed})")
    assert e128 <= REL_TOL_VS_128_REF, (e128, seed)
    assert eflt <= base.REL_TOL_FLOAT_REF, (eflt, seed)
    return out, e128


# ---------------------------------------------------------------------------------------------
# CPU (Triton interpreter)


@pytest.mark.parametrize(
    "t,inter,extra",
    [
        (1, 192, {}),  # PRE_Q: 3 tiles of 64, h quantized in the gate/up epilogue (fp8 h)
        (3, 160, {}),  # I = 160: the last tile and the last group are 32 wide (masked columns)
        (3, 192, dict(FUSE_QUANT=1)),  # the quantization launch folded into gate/up
        (1, 192, dict(SPLIT_K=3, GU_RED=1, DN_SPLIT=2)),  # split sums in gate/up, then its 64-wide epilogue
        (3, 160, dict(SPLIT_K=2)),  # fp32 partials: the down kernel quantizes each 64-wide K step
        (1, 192, dict(GU_N=128)),  # fp32 h from 128-wide tiles, quantized per 64 in the down kernel
        (3, 192, dict(PRE_Q=0)),  # the inputs quantized per gate/up K step
    ],
)
def test_group64_matches_the_1x64_reference(group64, t, inter, extra):
    """E = 6, H = 384 (3 input groups), k = 3, routed scaling 2.5 at T = 3."""
    seed = _seed()
    p = make_problem(t, 6, 384, inter, 3, "block-dynamic", device="cpu")
    check_group64(p, cpu_cfg(**extra), seed, scaling=2.5 if t == 3 else 1.0)


# the two down forms sum the same products (fp8 h times the weights, each group's scaled by its two scales) in
# another order (per 128-step column vs one running sum), then round to bf16: a bf16 step at most per element,
# measured 0 at these sizes; a wrong group scale or a group in the wrong column is O(1)
REL_TOL_DOWN_FORMS = 1e-2


@pytest.mark.parametrize(
    "t,inter,extra",
    [
        (1, 192, {}),  # fp8 h from 64-wide tiles: a 128-step's two group scales read per row
        (3, 160, {}),  # I = 160: the last step holds a 32-wide group and a fully masked one (scale not read)
        (3, 192, dict(FUSE_QUANT=1, SPLIT_K=3, GU_RED=1, DN_SPLIT=2)),  # fused quant, split sums, split down
        (3, 160, dict(SPLIT_K=2)),  # fp32 partials: the down kernel quantizes each 64-wide half of its step
        (1, 192, dict(GU_N=128)),  # fp32 h from 128-wide tiles, quantized per 64 in the down kernel
    ],
)
def test_group64_128_step_down_matches_the_reference_and_the_64_step(group64, t, inter, extra):
    """DN_K 128 with H_GROUP 64 (two group scales per down K step) against the 1×64 reference, NaN-poisoned,
    and within REL_TOL_DOWN_FORMS of the 64-step form; E = 6, H = 384, k = 3."""
    seed = _seed()
    p = make_problem(t, 6, 384, inter, 3, "block-dynamic", device="cpu")
    out, _ = check_group64(p, cpu_cfg(DN_K=128, **extra), seed, scaling=2.5 if t == 3 else 1.0)
    step64, _ = check_group64(p, cpu_cfg(**extra), seed, scaling=2.5 if t == 3 else 1.0)
    diff = rel_err(out, step64)
    print(f"128-step vs 64-step down: rel diff {diff:.2e}")
    assert diff <= REL_TOL_DOWN_FORMS, (diff, seed)


def test_group64_is_told_apart_from_the_1x128_reference(group64):
    """The 1×64 output is much closer to the 1×64 reference than to the 1×128 one (T = 4, I = 256: 3072 h
    elements), so the comparisons above tell the two quantizations apart; and the 1×128 form (H_GROUP 128,
    the default) is the other way round."""
    seed = _seed()
    p = make_problem(4, 6, 384, 256, 3, "block-dynamic", device="cpu")
    out, e128 = check_group64(p, cpu_cfg(), seed)
    r64 = reference.fused_moe_reference(
        p["x"], p["w13"], p["w2"], p["weights"], p["ids"], h_group=64, **p["kw"]
    )
    assert 4 * rel_err(out, r64) < e128, (rel_err(out, r64), e128, seed)
    plain = dict(cpu_cfg(), H_GROUP=128, GU_N=128, DN_K=128, GU_WARPS=8, GU_STAGES=3)
    out128 = fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], config=plain, **p["kw"])
    r128, _ = _refs(p, 1.0)
    assert 4 * rel_err(out128, r128) < rel_err(out128, r64), seed


def test_default_group_is_bitwise_todays_form():
    """H_GROUP = 128 given explicitly is the config without the key (same launches, same kernels), and the
    reference's default h_group is 128."""
    seed = _seed()
    p = make_problem(3, 6, 384, 192, 3, "block-dynamic", device="cpu")
    cfg = dict(op_small.default_small_config(1, 3, 6, 384, 192), GU_N=128, DN_N=64, SPLIT_K=1, PDL=1)
    plain, _, _ = run_and_check(p, config=cfg, seed=seed)
    given, _, _ = run_and_check(p, config=dict(cfg, H_GROUP=128), seed=seed)
    assert torch.equal(plain, given), seed
    args = (p["x"], p["w13"], p["w2"], p["weights"], p["ids"])
    assert torch.equal(
        reference.fused_moe_reference(*args, **p["kw"]),
        reference.fused_moe_reference(*args, h_group=128, **p["kw"]),
    )


@pytest.mark.parametrize("dn_k", [64, 128])
def test_group64_one_expert_in_every_slot_and_empty_experts(group64, dn_k):
    """Token 0 names expert 2 in all k slots, token 1 shares it in one slot (one program serves both); of
    E = 8 experts, 4 are empty; both down K steps."""
    seed = _seed()
    ids = torch.tensor([[2, 2, 2], [0, 2, 3]], dtype=torch.int32)
    p = make_problem(2, 8, 384, 192, 3, "block-dynamic", device="cpu", ids=ids)
    check_group64(p, cpu_cfg(DN_K=dn_k), seed)
    check_group64(p, cpu_cfg(SPLIT_K=3, GU_RED=1, DN_K=dn_k), seed)


@pytest.mark.parametrize("dn_k", [64, 128])
def test_group64_expert_parallel_ranks(group64, dn_k):
    """EP rank with experts 4..7 of 12: slots of other ranks and -1 skipped, token 0 has no local slot
    (zeros); then a rank whose range holds none of the tokens' experts (all zeros); both down K steps."""
    seed = _seed()
    ids = torch.tensor([[0, 11, -1], [5, -1, 9], [4, 7, 6]], dtype=torch.int32)
    p = make_problem(3, 4, 384, 192, 3, "block-dynamic", ids=ids, expert_offset=4, device="cpu")
    out, _ = check_group64(p, cpu_cfg(DN_K=dn_k), seed)
    assert (out[0] == 0).all(), seed
    ids = torch.randint(0, 8, (1, 3), dtype=torch.int32)
    p = make_problem(1, 4, 384, 192, 3, "block-dynamic", ids=ids, expert_offset=8, device="cpu")
    out, _ = check_group64(p, cpu_cfg(FUSE_QUANT=1, DN_K=dn_k), seed)
    assert (out == 0).all(), seed


@pytest.mark.parametrize("dn_k", [64, 128])
def test_group64_launch_plan_replays_bitwise(dn_k):
    """Through the launch plans: record, replay on other inputs and on the first again, each bitwise the
    unplanned call (the group scales' workspace is cdiv(I, 64) wide, read two per step at DN_K 128)."""
    _seed()
    check_plan_replays(
        "block-dynamic",
        cpu_cfg(FUSE_QUANT=1, DN_K=dn_k),
        "cpu",
        problem=lambda: make_problem(1, 6, 384, 192, 3, "block-dynamic", device="cpu"),
    )


def test_group64_config_errors_are_clear():
    p = make_problem(1, 6, 256, 128, 2, "block-dynamic", device="cpu")
    ps = make_problem(1, 6, 256, 128, 2, "block-static", device="cpu")
    regular = dict(base.CPU_CFG, H_GROUP=64)
    for prob, cfg, words in (
        (p, cpu_cfg(H_GROUP=32), "H_GROUP=32 must be 128"),
        (p, cpu_cfg(H_GROUP=64.0), "H_GROUP=64.0 must be 128"),
        (p, cpu_cfg(DN_K=32), "GU_K / DN_K == 128 / 64 or 128"),  # a group across two K steps
        (p, dict(cpu_cfg(), H_GROUP=128), "GU_K / DN_K == 128 / 128 "),
        (ps, cpu_cfg(), "a static a2 scale has none"),
        (p, regular, "H_GROUP .* is a small-T path key"),
    ):
        with pytest.raises(FusedMoEError, match=words):
            fused_moe(
                prob["x"], prob["w13"], prob["w2"], prob["weights"], prob["ids"], config=cfg, **prob["kw"]
            )


def test_match_h_group_follows_the_config(monkeypatch):
    """The checkers stay at 1×128 for a 1×128 small config and a regular one, and follow a 1×64 one (the
    shipped Qwen3-235B T = 1 pick's groups, whichever they are)."""
    before = base.fused_moe_reference
    for cfg in (dict(cpu_cfg(), H_GROUP=128), dict(base.CPU_CFG, H_GROUP=64)):
        match_h_group(monkeypatch, cfg)
        assert base.fused_moe_reference is before and midpoint.GROUP == 128, cfg
    pick = op.get_config(1, 8, 128, 4096, 1536, "block-dynamic", True)
    match_h_group(monkeypatch, pick)
    group = op_small.h_group(pick)
    assert midpoint.GROUP == group and midpoint.quantize_group(torch.ones(1, 128))[1].shape == (
        1,
        128 // group,
    )
    assert group == 128 or base.fused_moe_reference.keywords == {"h_group": 64}


def test_reference_group_argument_quantizes_h_in_that_group():
    """``_quant_dequant`` with group 64 is the 1×64 quantization: each 64 columns scaled by their own amax. A
    128-wide group whose halves differ 10^4x in size pushes the small half into e4m3's subnormals at 1×128
    (large relative error); at 1×64 it keeps e4m3's half-step bound (2^-4) on every element."""
    small = torch.linspace(1e-3, 1e-2, 64)[None]
    x = torch.cat([torch.full((1, 64), 100.0), small], dim=1)
    assert reference.quantize_group(x, 64)[1].shape == (1, 2)
    q64 = reference._quant_dequant(x, None, 64)
    q128 = reference._quant_dequant(x, None)
    assert torch.equal(q64[:, :64], x[:, :64]) and torch.equal(q128[:, :64], x[:, :64])
    assert ((q64[:, 64:] - small).abs() <= 2.0**-4 * small).all()
    assert ((q128[:, 64:] - small).abs() / small).max() > 0.1


def _load_tuner():
    from tests.kernels.test_fused_moe_decode_round5 import _load_tuner as load

    return load()


def test_tuner_h_group_candidates(monkeypatch):
    """--h-group: the current pick first; for a small-T block-dynamic pick at T <= 4 its 1×64 form (64-wide
    gate/up tiles, the pick's 128-step down with two group scales per step: the breakdown's second form), that
    form with FUSE_QUANT toggled, and with one split where the pick splits, all without PREFETCH; a pick that is
    the 1×64 form already keeps its place first; nothing for static a2, T > 4 or a regular pick."""
    tune = _load_tuner()
    small = dict(op_small.default_small_config(1, 8, 128, 4096, 1536), GU_N=128, PDL=1, PREFETCH=1)
    monkeypatch.setattr(op, "get_config", lambda *a, **kw: small)
    cands = tune.h_group_candidates(op, 1, 8, 128, 4096, 1536, "block-dynamic")
    assert cands[0] == small and len(cands) == len({repr(sorted(c.items())) for c in cands}) == 3
    g = {key: v for key, v in small.items() if key != "PREFETCH"}
    assert cands[1] == dict(g, H_GROUP=64, GU_N=64, GU_WARPS=4, GU_STAGES=4) and tune.BREAKDOWN_FORMS == 2
    assert cands[2] == dict(cands[1], FUSE_QUANT=1)
    for c in cands[1:]:
        op_small.check_small_config(c, True, True)
    assert tune.h_group_candidates(op, 5, 8, 128, 4096, 1536, "block-dynamic") == [small]
    assert tune.h_group_candidates(op, 1, 8, 192, 4096, 1536, "tensor-static") == [small]
    regular = {k: v for k, v in small.items() if k != "PATH"}
    monkeypatch.setattr(op, "get_config", lambda *a, **kw: regular)
    assert tune.h_group_candidates(op, 1, 8, 128, 4096, 1536, "block-dynamic") == [regular]
    split = dict(small, SPLIT_K=2, GU_RED=1, FUSE_QUANT=1)
    monkeypatch.setattr(op, "get_config", lambda *a, **kw: split)
    cands = tune.h_group_candidates(op, 1, 8, 128, 4096, 1536, "block-dynamic")
    assert [(c["SPLIT_K"], c["FUSE_QUANT"]) for c in cands] == [(2, 1), (2, 1), (2, 0), (1, 1)], cands
    shipped = cands[1]  # the 1x64 form as the current pick (Qwen3-235B T = 1 / 4 since 00:08 UTC)
    monkeypatch.setattr(op, "get_config", lambda *a, **kw: shipped)
    cands = tune.h_group_candidates(op, 1, 8, 128, 4096, 1536, "block-dynamic")
    assert cands[0] == shipped and len(cands) == 3 and all(c.get("H_GROUP") == 64 for c in cands), cands


def test_small_breakdown_times_each_launch_alone_fake_gpu_timer(monkeypatch):
    """--small-breakdown at CPU sizes with a fake GPU timer (it only calls the timed function once): the whole
    call launches quantization, gate/up and down; each 'alone' timing launches only its kernel; for both the
    current pick and its 1×64 form; the launch plans are back on afterwards."""
    import types

    tune = _load_tuner()
    fb = tune.fb
    from hpc_advise.kernels.fused_moe import launch_plan as LP

    prob = make_problem(1, 6, 384, 192, 3, "block-dynamic", device="cpu")
    monkeypatch.setitem(fb.SHAPES, "tiny", (6, 384, 192, 3, 6, 0))
    monkeypatch.setitem(fb.MODES, "tiny", ("block-dynamic",))
    weights = dict(w13=prob["w13"], w2=prob["w2"], s13=prob["kw"]["w13_scale"], s2=prob["kw"]["w2_scale"])
    monkeypatch.setattr(fb, "make_weights", lambda *a, **kw: dict(weights, block=True))
    routing = [dict(ids=prob["ids"], w=prob["weights"], x=prob["x"])]
    monkeypatch.setattr(fb, "make_routings", lambda *a, **kw: routing)
    pick = dict(cpu_cfg(), H_GROUP=128, GU_N=128, DN_K=128, GU_WARPS=8, GU_STAGES=3)
    monkeypatch.setattr(op, "get_config", lambda *a, **kw: pick)
    launched: list = []
    real = LP.launch
    monkeypatch.setattr(
        LP, "launch", lambda kernel, grid: (launched.append(kernel.fn.__name__), real(kernel, grid))[1]
    )
    sections: list = []

    def fake_timer(fn, t):
        launched.clear()
        fn()
        sections.append(tuple(launched))
        return types.SimpleNamespace(p50=1.0), None

    monkeypatch.setattr(fb, "_time", fake_timer)
    rows = tune.small_breakdown(["tiny"], (1,), log=lambda *a: None)
    allk = tuple(tune.SMALL_LAUNCHES)
    assert sections == [allk, *((k,) for k in allk)] * 2, sections
    assert [(r["config"].get("H_GROUP", 128), r["config"]["DN_K"]) for r in rows] == [(128, 128), (64, 128)]
    assert all(r["call_us"] == 1.0 and r["_small_down_kernel_us"] == 1.0 for r in rows)
    assert LP.ENABLED


@pytest.mark.slow
def test_group64_kernels_build_for_sm90_without_spills():
    """sm_90a builds: the 64-wide block-scaled gate/up tile (4 warps, 4 stages; PRE_Q, and FUSE_QUANT) and the
    down kernel with 64-wide K steps and one group scale per step (64-row H tiles, 4 stages) and with
    128-wide steps holding two groups (fp8 h, and fp32 h quantized per 64 in the kernel): pipelined async
    copies, one wgmma per step, no spills; registers and CTAs per SM printed. Measured 2026-11-29: gate/up 94
    registers, 72 KB, 3 CTAs/SM (FUSE_QUANT 112 registers); 64-step down 40 registers, 20 KB; 128-step
    down 48 registers, 40 KB, 5 CTAs/SM, 8 async copies per step (the 1×128 pick's 40, 40 KB, 8); fp32 h 87."""
    gu = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=1, K_PAD=8, N_PAD=256, H_MODE=1, PRE_Q=1,
              A_GROUP=True, A2_GROUP=True, W_BLOCK=True, EVEN_K=True, USE_PDL=True)  # fmt: skip
    fused = dict(gu, FUSE_QUANT=True, Q_GROUPS=32, Q_CHUNKS=1)
    dn = dict(BLOCK_H=64, BLOCK_K=64, SPLIT_K=1, K_PAD=8, H_MODE=1, A2_GROUP=True, W_BLOCK=True, EVEN_K=True,
              USE_PDL=True)  # fmt: skip
    jobs = []
    for name, consts, warps, stages in (
        ("_small_gate_up_kernel", gu, 4, 4),
        ("_small_gate_up_kernel", fused, 4, 4),
        ("_small_down_kernel", dn, 4, 4),
        ("_small_down_kernel", dict(dn, BLOCK_K=128, H_GROUPS=2), 4, 4),  # two groups per 128-wide step
        ("_small_down_kernel", dict(dn, BLOCK_K=128, H_GROUPS=2, H_MODE=0), 4, 4),
    ):
        job = _small_job(name, consts)
        job[4], job[5] = warps, stages
        jobs.append(job)
    res = compile_sm90(jobs)
    for r in res:
        print(
            f"{r['kernel']}: {r['registers']} registers, {r['shared']} B shared, {r['ctas_per_sm']} CTAs/SM, "
            f"loop {r['loop']}"
        )
        assert r["stack"] == 0 and r["async_copies"] > 0 and r["wgmma"] > 0, r
    assert res[0]["ctas_per_sm"] >= 2, res[0]  # 192 gate/up programs on 132 SMs all resident at once
    step128 = res[3]  # the 1×128 pick's loads: one 128-wide weight and h tile per stage, one wgmma per step
    assert step128["wgmma"] == 1 and step128["async_copies"] == 8 and step128["shared"] <= 40 * 1024, step128


# ---------------------------------------------------------------------------------------------
# real shapes on the GPU (T = 1 and 4)

GPU_SHAPES = {  # name -> (E local, H, I, top_k, global experts, expert offset)
    "qwen3-235b": (128, 4096, 1536, 8, 128, 0),
    "qwen3-30b-a3b": (128, 2048, 768, 8, 128, 0),
    "deepseek-v3-ep8": (32, 7168, 2048, 8, 256, 64),
}


def _gpu_problem(shape: str, t: int, dn_k: int = 64):
    """The real problem and the shipped small-T pick at T (the default small config where the pick is the
    regular path) with h in 1×64 groups, the down kernel stepping K by dn_k."""
    e, h, i, k, ge, off = GPU_SHAPES[shape]
    p = make_problem(t, e, h, i, k, "block-dynamic", device="cuda", global_experts=ge, expert_offset=off)
    cfg = op.get_config(t, k, e, h, i, "block-dynamic", True)
    if not op_small.is_small(cfg):
        cfg = dict(op_small.default_small_config(t, k, e, h, i), PDL=1)
    return p, g64({key: v for key, v in cfg.items() if key != "PREFETCH"}, DN_K=dn_k)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape,t", [("qwen3-235b", 1), ("qwen3-235b", 4), ("qwen3-30b-a3b", 1), ("deepseek-v3-ep8", 1)]
)
def test_gpu_group64_real_shapes(group64, shape, t):
    """Against the 1×64 reference (and the errors against the 1×128 reference and unquantized math printed);
    the second eager call (the signature's launch plan, replaying the compiled launches) bitwise the first."""
    seed = _seed()
    p, cfg = _gpu_problem(shape, t)
    first, _ = check_group64(p, cfg, seed, scaling=2.5)
    second, _ = check_group64(p, cfg, seed, scaling=2.5)
    assert torch.equal(first, second), seed


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 4])
def test_gpu_group64_128_step_down_real_size(group64, t):
    """Qwen3-235B: the 128-step down form (DN_K 128, two group scales per step) against the 1×64 reference and
    within REL_TOL_DOWN_FORMS of the 64-step form (the measured distance printed); its launch-plan replay
    bitwise its first call."""
    seed = _seed()
    p, cfg = _gpu_problem("qwen3-235b", t, dn_k=128)
    first, _ = check_group64(p, cfg, seed, scaling=2.5)
    second, _ = check_group64(p, cfg, seed, scaling=2.5)
    step64, _ = check_group64(p, dict(cfg, DN_K=64), seed, scaling=2.5)
    diff = rel_err(first, step64)
    print(f"Qwen3-235B T={t}: 128-step vs 64-step down rel diff {diff:.2e}")
    assert torch.equal(first, second) and diff <= REL_TOL_DOWN_FORMS, (diff, seed)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "t,extra", [(1, dict(FUSE_QUANT=1)), (4, {}), (1, dict(DN_K=128)), (4, dict(DN_K=128))]
)
def test_gpu_group64_graph_replay_tracks_new_routing(group64, t, extra):
    """Qwen3-235B: captured once (two calls back to back, PDL), replayed with fresh routing written into the
    ids, output poisoned with NaN before each replay, checked against the 1×64 reference (both down steps)."""
    seed = _seed()
    p, cfg = _gpu_problem("qwen3-235b", t)
    cfg = dict(cfg, PDL=1, **extra)
    kw = device_scales(p["kw"])
    out = torch.empty_like(p["x"])
    call = lambda: fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=out, config=cfg, **kw)  # noqa: E731
    check_graph_replay(p, call, out, seed=seed, replays=3, capture_calls=2)
