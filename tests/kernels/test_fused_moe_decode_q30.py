"""Tests of the occupancy forms of the regular decode path (Qwen3-30B-A3B decode, issue 7).

Nsight Compute had Qwen3-30B's T = 16 gate/up GEMM at 2 programs (8 warps) per SM, limited by shared memory, with
0.30 eligible warps per scheduler. The forms tried against it change how many programs fit on an SM, not what they
compute: fewer pipeline stages (GU_STAGES / DN_STAGES), a register cap for the gate/up build (config key
GU_MAXNREG, Triton's ``maxnreg``; 0 = ptxas' choice), more warps per program. A stage count or a register cap
leaves the products and their order alone, so the output is bitwise the current pick's (GPU tests); more warps
may change the MMA instruction split, so those are held to the reference tolerance only.

CPU: the key's validation (refused before any launch, with the reason), a capped config through the interpreter
(where the cap is not passed: nothing is compiled) against the reference, the tuner's ``--occupancy`` candidates
for every tuned shape, and the sm_90a builds (slow): the capped 2-stage tile fits 4 programs per SM with no
register spill inside its K loop. GPU: the candidates at Qwen3-30B T = 16 / 128 against the current pick, the cap
read back from the compiled kernel, and a CUDA-graph replay of the capped config with fresh routing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from hpc_advise.kernels.fused_moe import kernel as K  # noqa: E402
from hpc_advise.kernels.fused_moe import op  # noqa: E402
from hpc_advise.kernels.fused_moe.op import FusedMoEError, fused_moe  # noqa: E402
from tests.kernels.sm90_compile import compile_sm90  # noqa: E402
from tests.kernels.test_fused_moe import (  # noqa: E402
    CPU_CFG,
    _seed,
    _sm90_job,
    check_graph_replay,
    make_problem,
    run_and_check,
)

# the block-scaled decode tile of the Qwen3-30B picks (TMA weight tiles, scalar block scales), at CPU sizes
Q30 = dict(CPU_CFG, GU_N=128, W_TMA=1, W_SCALAR=1, BLOCK_EXIT=1)


def _tuner():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "tune_fused_moe.py"
    spec = importlib.util.spec_from_file_location("tune_fused_moe", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_register_cap_refused_unless_a_multiple_of_8_in_range():
    """GU_MAXNREG: 0 or a multiple of 8 in [MAXNREG_MIN, 248]; anything else is refused before a launch."""
    p = make_problem(2, 8, 256, 256, 4, "block-dynamic", device="cpu")
    args = (p["x"], p["w13"], p["w2"], p["weights"], p["ids"])
    for bad in (100, op.MAXNREG_MIN - 8, 256, "128", True, 128.0):
        with pytest.raises(FusedMoEError, match="GU_MAXNREG"):
            fused_moe(*args, config=dict(Q30, GU_MAXNREG=bad), **p["kw"])
    for good in (0, op.MAXNREG_MIN, 128, 248):
        assert op.check_config(dict(Q30, GU_MAXNREG=good), True, True)["GU_MAXNREG"] == good


@pytest.mark.parametrize("extra", [dict(GU_MAXNREG=128), dict(GU_MAXNREG=128, GU_SWAP_AB=1, DN_STAGES=3)])
def test_capped_config_runs_through_the_interpreter(extra):
    """The key reaches the launcher without breaking the CPU path: 2 K steps, I = 2 tiles of 128 (the cap is a
    build option, so on the interpreter the output must equal the uncapped one's exactly)."""
    seed = _seed()
    p = make_problem(5, 8, 256, 256, 4, "block-dynamic", device="cpu")
    capped, _, _ = run_and_check(p, config=dict(Q30, **extra), seed=seed)
    plain, _, _ = run_and_check(p, config=dict(Q30, **{k: v for k, v in extra.items() if k != "GU_MAXNREG"}))
    assert torch.equal(capped, plain), seed


def test_occupancy_candidates_are_valid_configs_of_every_shape():
    """--occupancy: the current pick first; regular decode picks (BLOCK_M <= 32) get the stage, cap and warp
    forms (valid configs of the shape, each differing from the pick only in occupancy keys); the others only
    the current pick."""
    from hpc_advise.runtime.benches import fused_moe as fb

    tune = _tuner()
    keys = {"GU_STAGES", "GU_MAXNREG", "GU_SWAP_AB", "GU_WARPS", "DN_STAGES", "DN_WARPS"}
    regular = 0
    for shape, (e, h, i, k, _, _) in fb.SHAPES.items():
        mode = fb.MODES[shape][0]
        a_group = mode.endswith("dynamic")
        for t in (1, 16, 64, 128):
            cands = tune.occupancy_candidates(op, t, k, e, h, i, mode)
            cur = op.get_config(t, k, e, h, i, mode, a_group)
            assert cands[0] == cur
            if cur.get("PATH") is not None:
                assert cands == [cur], (shape, t)
                continue
            regular += 1
            assert len(cands) >= 6, (shape, t, cands)
            for c in cands[1:]:
                assert {key for key in set(c) | set(cur) if c.get(key) != cur.get(key)} <= keys, c
                op.check_forms(op.check_config(dict(c), a_group, a_group), a_group, a_group,
                               mode.startswith("block"), h, i)  # fmt: skip
            assert any(c.get("GU_MAXNREG") == 128 and c["GU_STAGES"] == 2 for c in cands), cands
    assert regular >= 6, regular


@pytest.mark.slow
def test_capped_two_stage_gate_up_fits_four_programs_per_sm_for_sm90():
    """sm_90a builds of the Qwen3-30B T = 16 gate/up tile (BLOCK_M 16, 128-wide block-scaled TMA tile, scalar
    scales, 4 warps): 4 stages 104 KB of shared memory, 2 programs per SM; 2 stages 35 KB but ~168 registers, 3
    per SM; capped at 128 registers, 4 per SM, and what ptxas spills stays outside the K loop (4 bytes, checked in
    the SASS by hand, 2026-11-29: stored before the loop, reloaded in the epilogue) so the stack stays tiny."""
    gu = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, SPLIT_K=1, A_GROUP=True, W_BLOCK=True)
    gu.update(A2_GROUP=True, OUT_MODE=0, EVEN_K=True, FAST_ACC=False, TWO_DOTS=False, USE_PDL=True)
    gu.update(W_TMA=True, W_SCALAR=True, BLOCK_EXIT=True)
    jobs = [_sm90_job("_gate_up_kernel", gu, 4, 4), _sm90_job("_gate_up_kernel", gu, 4, 2)]
    jobs.append(_sm90_job("_gate_up_kernel", gu, 4, 2) + [128])
    four, two, capped = compile_sm90(jobs)
    assert four["ctas_per_sm"] == 2 and four["stack"] == 0, four
    assert two["ctas_per_sm"] == 3 and two["registers"] > 128 and two["stack"] == 0, two
    assert capped["ctas_per_sm"] == 4 and capped["registers"] <= 128 and capped["stack"] <= 8, capped
    assert capped["shared"] == two["shared"] < four["shared"] / 2, (capped, four)


# ---------------------------------------------------------------------------------------------
# H200: Qwen3-30B-A3B decode, the tuned regular picks

GPU_POINTS = {"qwen3-30b-a3b-16": 16, "qwen3-30b-a3b-128": 128}
E, H, I, TOP_K = 128, 2048, 768, 8
BITWISE_KEYS = {"GU_STAGES", "GU_MAXNREG", "DN_STAGES"}  # forms that keep every product and its order


def _capped_builds() -> list:
    """Compiled gate/up kernels in this process built with maxnreg 128 (Triton's per-device kernel cache)."""
    found = []
    for cache in K._gate_up_kernel.device_caches.values():
        found += [k for k in cache[0].values() if getattr(k.metadata, "maxnreg", None) == 128]
    return found


@pytest.mark.gpu
@pytest.mark.parametrize("point", list(GPU_POINTS))
def test_gpu_occupancy_candidates_match_the_current_pick(point):
    """Each --occupancy candidate at the point against the current pick: the stage / cap forms bitwise, the
    warp forms within the reference tolerance (run_and_check; bitwise or not printed); the capped gate/up
    kernel really built with maxnreg 128 and <= 128 registers."""
    seed = _seed()
    t = GPU_POINTS[point]
    p = make_problem(t, E, H, I, TOP_K, "block-dynamic", device="cuda")
    cands = _tuner().occupancy_candidates(op, t, TOP_K, E, H, I, "block-dynamic")
    cur = cands[0]
    assert cur.get("PATH") is None and len(cands) >= 6, cands
    base, _, _ = run_and_check(p, config=cur, seed=seed)
    for c in cands[1:]:
        got, _, err = run_and_check(p, config=c, seed=seed)
        changed = {key for key in set(c) | set(cur) if c.get(key) != cur.get(key)}
        print(f"{point} {sorted(changed)}: rel err {err:.2e}, bitwise the pick: {torch.equal(got, base)}")
        if changed <= BITWISE_KEYS:
            assert torch.equal(got, base), (seed, c)
    builds = _capped_builds()
    assert builds and all(k.n_regs <= 128 for k in builds), [(k.n_regs, k.n_spills) for k in builds]


@pytest.mark.gpu
def test_gpu_capped_config_graph_replay_tracks_new_routing():
    seed = _seed()
    p = make_problem(16, E, H, I, TOP_K, "block-dynamic", device="cuda")
    cur = op.get_config(16, TOP_K, E, H, I, "block-dynamic", True, allow_small=False)
    cfg = dict(cur, GU_SWAP_AB=0, GU_STAGES=2, GU_MAXNREG=128, PDL=1)
    out = torch.empty_like(p["x"])
    call = lambda: fused_moe(  # noqa: E731
        p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=out, config=cfg, **p["kw"]
    )
    check_graph_replay(p, call, out, seed=seed, replays=3, capture_calls=2)
