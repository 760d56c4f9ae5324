"""Tests of the lagged scale application in the regular path's gate/up GEMM (config SCALE_LAG).

With group / block scales every K step's fresh product is scaled and added to the fp32 accumulator, so each
step waited for its wgmma. SCALE_LAG = 1 runs the two-dot gate/up form (GU_TWO_DOTS) and scales each step's
up product one step later (``kernel._gate_up_two_dots``): the up dot stays in flight while the gate product
and the previous up product are scaled. The same products are multiplied by the same scales in the same
order and added in the same order, so the output is bitwise the two-dot form's (asserted on the interpreter
and on the H200), and within 2e-2 of ``reference.fused_moe_reference`` (run_and_check). Per-tensor weights with
a static activation scale (the prefill shapes Hy3 / Hy3 TP8): the lag adds the up dot's fresh fp32 partial a
step late, the add Triton's per-step promotion makes at once, so bitwise the promoted two-dot form too.

CPU tests run under the Triton interpreter at small sizes (I not a multiple of the tile with activation
group scales, K of 1 and 2 block steps, one expert taking every token with empty experts, an EP rank with
no local tokens, T = 1 / 3 / 16; run_and_check poisons the output with NaN first); the sm_90a build test
checks what ptxas keeps in flight; the ``gpu`` tests run the real decode shapes on the H200, replayed from a
CUDA graph with fresh routing and from a launch plan.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from hpc_advise.kernels.fused_moe import op, op_small  # noqa: E402
from hpc_advise.kernels.fused_moe.op import FusedMoEError, fused_moe  # noqa: E402
from tests.kernels.sm90_compile import compile_sm90  # noqa: E402
from tests.kernels.test_fused_moe import (  # noqa: E402
    CPU_CFG,
    _seed,
    _sm90_job,
    check_eager_plan_replay,
    check_graph_replay,
    make_problem,
    run_and_check,
)
from tests.kernels.test_fused_moe_decode_group64 import match_h_group  # noqa: E402
from tests.kernels.test_fused_moe_host import check_plan_replays  # noqa: E402
from tests.kernels.test_fused_moe_small import _small_job  # noqa: E402

# the shipped swapped decode forms of the block-scaled picks (TMA weight tiles, scalar block scales)
SWAPPED = dict(CPU_CFG, GU_N=128, W_TMA=1, W_SCALAR=1, GU_SWAP_AB=1, DN_SWAP_AB=1, BLOCK_EXIT=1)


def _lag_matches_two_dots(p, cfg: dict, seed: int) -> torch.Tensor:
    """SCALE_LAG bitwise the two-dot form (both within 2e-2 of the reference); returns the output."""
    plain, _, _ = run_and_check(p, config=dict(cfg, GU_TWO_DOTS=1), seed=seed)
    lagged, _, _ = run_and_check(p, config=dict(cfg, SCALE_LAG=1), seed=seed)
    assert torch.equal(plain, lagged), seed
    return lagged


@pytest.mark.parametrize(
    "mode,t,h,i,cfg",
    [
        ("block-dynamic", 3, 256, 256, SWAPPED),  # 2 K steps of 128, swapped TMA tiles
        ("block-dynamic", 1, 128, 256, SWAPPED),  # 1 K step: only the after-loop scale-add
        ("block-dynamic", 16, 384, 128, dict(CPU_CFG, GU_N=128)),  # pointer tiles, unswapped, 3 K steps
        ("block-dynamic", 3, 512, 256, dict(SWAPPED, SPLIT_K=2)),  # split-K partials: 2 steps per split
        ("tensor-dynamic", 16, 256, 192, dict(CPU_CFG, GU_N=128)),  # group scales only; I = 1.5 tiles of 128
        # per-tensor weights, static activation scale: the promotion add lagged
        ("tensor-static", 16, 384, 192, CPU_CFG),  # 3 K steps, I = 6 tiles of 32
        ("tensor-static", 3, 320, 256, CPU_CFG),  # K = 320: 3 steps, the last 64 wide (masked)
        ("tensor-static", 1, 128, 256, CPU_CFG),  # 1 K step: only the after-loop add
        ("tensor-static", 5, 320, 256, dict(CPU_CFG, GU_K=256)),  # promotion every 256, ragged
        ("tensor-static", 3, 384, 192, dict(CPU_CFG, GU_N=64, GU_SWAP_AB=1, W_TMA=1)),  # swapped TMA tiles
        ("tensor-static", 3, 512, 256, dict(CPU_CFG, SPLIT_K=2, GU_RED=1)),  # split-K summed in gate/up
    ],
)
def test_scale_lag_bitwise_the_two_dot_form(mode, t, h, i, cfg):
    seed = _seed()
    _lag_matches_two_dots(make_problem(t, 8, h, i, 4, mode, device="cpu"), cfg, seed)


@pytest.mark.parametrize("mode,cfg", [("block-dynamic", SWAPPED), ("tensor-static", CPU_CFG)])
def test_scale_lag_one_expert_takes_every_token_others_empty(mode, cfg):
    """Expert 2 in every token's slot 0 (two 16-row blocks at T = 17), the other slots on experts 3-5:
    experts 0, 1, 6 and 7 stay empty."""
    seed = _seed()
    t = 17
    ids = torch.stack([torch.randperm(3)[:2] + 3 for _ in range(t)]).to(torch.int32)
    ids = torch.cat([torch.full((t, 1), 2, dtype=torch.int32), ids], dim=1)
    p = make_problem(t, 8, 256, 256, 3, mode, device="cpu", ids=ids)
    _lag_matches_two_dots(p, cfg, seed)


@pytest.mark.parametrize("mode,cfg", [("block-dynamic", SWAPPED), ("tensor-static", CPU_CFG)])
def test_scale_lag_expert_parallel_rank_without_local_tokens(mode, cfg):
    seed = _seed()
    ids = torch.randint(0, 8, (3, 4), dtype=torch.int32)  # every id on other ranks
    p = make_problem(3, 8, 256, 256, 4, mode, device="cpu", ids=ids, expert_offset=8)
    out, _, _ = run_and_check(p, config=dict(cfg, SCALE_LAG=1), seed=seed)
    assert (out == 0).all(), seed


def test_scale_lag_launch_plan_replays_bitwise():
    _seed()
    check_plan_replays(
        "block-dynamic",
        dict(SWAPPED, SCALE_LAG=1, PDL=1),
        "cpu",
        problem=lambda: make_problem(3, 8, 256, 256, 4, "block-dynamic", device="cpu"),
    )


def test_scale_lag_refused_where_it_does_not_apply():
    """Refused before any launch, with the reason (the output untouched): a block-scaled tile half that is not
    one 128-row group, FAST_ACC (no per-step product to delay; per-tensor weights included), and a value other
    than 0 / 1."""
    p = make_problem(2, 8, 256, 256, 4, "block-dynamic", device="cpu")
    args = (p["x"], p["w13"], p["w2"], p["weights"], p["ids"])
    for cfg, words in (
        (dict(CPU_CFG, GU_N=64, SPLIT_K=2, SCALE_LAG=1), "SCALE_LAG with block scales need GU_N == 128"),
        (dict(CPU_CFG, GU_N=128, SCALE_LAG=2), "must be 0 or 1"),
    ):
        with pytest.raises(FusedMoEError, match=words):
            fused_moe(*args, config=cfg, **p["kw"])
    with pytest.raises(FusedMoEError, match="FAST_ACC"):
        op.check_forms(dict(CPU_CFG, GU_N=128, SCALE_LAG=1, FAST_ACC=1), True, True, True, 256, 256)
    ps = make_problem(2, 8, 256, 256, 4, "tensor-static", device="cpu")
    out = torch.full_like(ps["x"], 7.0)
    with pytest.raises(FusedMoEError, match="FAST_ACC"):
        fused_moe(ps["x"], ps["w13"], ps["w2"], ps["weights"], ps["ids"], out=out,
                  config=dict(CPU_CFG, SCALE_LAG=1, FAST_ACC=1), **ps["kw"])  # fmt: skip
    assert (out == 7.0).all()


# ---------------------------------------------------------------------------------------------
# the small-T path (kernel_small._gate_up_step_lagged; PRE_Q, the tuned form)


def _small(**kw) -> dict:
    """A PRE_Q small-path config at the CPU sizes (128-wide gate/up tiles: one 1x128 group of h each)."""
    return dict(
        op_small.default_small_config(1, 4, 8, 256, 256), **dict(dict(GU_N=128, DN_N=64, PRE_Q=1), **kw)
    )


@pytest.mark.parametrize(
    "mode,t,h,i,extra",
    [
        ("block-dynamic", 1, 384, 256, {}),  # 3 K steps
        ("block-dynamic", 3, 128, 256, {}),  # 1 K step: only the after-loop scale-add
        ("block-dynamic", 16, 256, 128, dict(PDL=1)),  # 2 K steps, 16 tokens
        ("block-dynamic", 1, 640, 256, dict(SPLIT_K=4, GU_RED=1)),  # 5 steps in 4 splits: one split empty
        ("block-dynamic", 3, 384, 256, dict(FUSE_QUANT=1)),  # quantized in the gate/up prologue
        ("tensor-dynamic", 3, 256, 192, {}),  # activation group scales only, ragged I
    ],
)
def test_small_path_scale_lag_bitwise_the_plain_loop(mode, t, h, i, extra):
    seed = _seed()
    p = make_problem(t, 8, h, i, 4, mode, device="cpu")
    plain, _, _ = run_and_check(p, config=_small(**extra), seed=seed)
    lagged, _, _ = run_and_check(p, config=_small(SCALE_LAG=1, **extra), seed=seed)
    assert torch.equal(plain, lagged), seed


def test_small_path_scale_lag_shared_expert_and_other_ranks():
    """Two tokens share experts (one owner program serves both rows), slots of other EP ranks and -1."""
    seed = _seed()
    ids = torch.tensor([[1, 2, 9, -1], [2, 1, 6, 12]], dtype=torch.int32)
    p = make_problem(2, 8, 256, 256, 4, "block-dynamic", device="cpu", ids=ids)
    plain, _, _ = run_and_check(p, config=_small(), seed=seed)
    lagged, _, _ = run_and_check(p, config=_small(SCALE_LAG=1), seed=seed)
    assert torch.equal(plain, lagged), seed


def test_small_path_scale_lag_refusals():
    p = make_problem(2, 8, 256, 256, 4, "block-dynamic", device="cpu")
    args = (p["x"], p["w13"], p["w2"], p["weights"], p["ids"])
    with pytest.raises(FusedMoEError, match="PRE_Q = 1"):
        fused_moe(*args, config=_small(PRE_Q=0, SCALE_LAG=1), **p["kw"])
    with pytest.raises(FusedMoEError, match="must be 0 or 1"):
        fused_moe(*args, config=_small(SCALE_LAG=2), **p["kw"])
    ps = make_problem(2, 8, 256, 256, 4, "tensor-static", device="cpu")
    with pytest.raises(ValueError, match="static"):
        fused_moe(ps["x"], ps["w13"], ps["w2"], ps["weights"], ps["ids"], config=_small(GU_N=64, SCALE_LAG=1),
                  **ps["kw"])  # fmt: skip


def test_scale_lag_tuner_candidates_are_valid_configs_of_every_shape():
    """The tuner's --scale-lag candidates at every tuned decode and prefill point: the current pick first; on the
    regular path the lag (any scales: per-tensor picks too), with group / block scales on a merged-dot pick also
    the two-dot form alone; on the small-T PRE_Q path the lag with group / block scales only. Every candidate is a
    valid config of its shape, none with the lag has a tile whose lagged build spills (``_lag_spills``: BLOCK_M
    128 prefill picks), and each lagged replacement tile is timed without the lag too."""
    import importlib.util
    from pathlib import Path

    from hpc_advise.runtime.benches import fused_moe as fb

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "tune_fused_moe.py"
    spec = importlib.util.spec_from_file_location("tune_fused_moe", path)
    tune = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tune)
    lagged = {"decode": 0, "prefill": 0, "tensor-static": 0}
    for shape, (e, h, i, k, _, _) in fb.SHAPES.items():
        mode = fb.MODES[shape][0]
        a_group = mode.endswith("dynamic")
        for t in (1, 16, 64, 128, 1024, 4096, 16384):
            cands = tune.scale_lag_candidates(op, t, k, e, h, i, mode)
            cur = op.get_config(t, k, e, h, i, mode, a_group)
            assert cands[0] == cur
            if op_small.is_small(cur) and not a_group:
                assert cands == [cur], (shape, t)
            keys = [json.dumps(c, sort_keys=True) for c in cands]
            assert len(set(keys)) == len(keys), (shape, t)
            for c in cands[1:]:
                c = op.check_config(dict(c), a_group, a_group)
                if not op_small.is_small(c):
                    op.check_forms(c, a_group, a_group, mode.startswith("block"), h, i)
                if c.get("SCALE_LAG"):
                    lagged["prefill" if t >= 1024 else "decode"] += 1
                    lagged["tensor-static"] += mode == "tensor-static"
                    # the sm_90a build of a lagged 128 x 128 tile at 8 warps spills in its K loop (TUNING_LOG.md "Lag at prefill sizes")
                    assert op_small.is_small(c) or c["BLOCK_M"] * c["GU_N"] < 128 * 128, (shape, t, c)
                    # a tile replacing one whose lag spills is timed without the lag too
                    if not op_small.is_small(cur) and tune._lag_spills(cur):
                        plain = {key: v for key, v in c.items() if key != "SCALE_LAG"}
                        assert json.dumps(plain, sort_keys=True) in keys, (shape, t, c)
                else:
                    assert c.get("GU_TWO_DOTS") or tune._lag_spills(cur), (shape, t, c)
    # every prefill point has its lag candidates (15), the per-tensor shapes Hy3 / Hy3 TP8 at decode and prefill
    assert lagged["decode"] >= 8 and lagged["prefill"] >= 15 and lagged["tensor-static"] >= 6, lagged


def _sass_loops(cubin: str) -> list[dict]:
    """Per SASS loop (a backward branch) that issues wgmma: wgmma, issues (WARPGROUP.ARRIVE) and waits
    (WARPGROUP.DEPBAR; ptxas adds one per wgmma where it serializes them, C7514)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    ins = [(int(a, 16), t) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    loops = []
    for a, text in ins:
        m = re.search(r"BRA\s+0x([0-9a-f]+)", text)
        body = [u for b, u in ins if m and int(m.group(1), 16) <= b <= a]
        if any("GMMA" in u for u in body):
            count = {
                word: sum(word in u for u in body)
                for word in ("GMMA", "WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR")
            }
            loops.append(
                dict(
                    size=len(body),
                    gmma=count["GMMA"],
                    arrive=count["WARPGROUP.ARRIVE"],
                    wait=count["WARPGROUP.DEPBAR"],
                )
            )
    return loops


@pytest.mark.slow
def test_scale_lag_keeps_the_up_dot_in_flight_for_sm90(tmp_path, monkeypatch):
    """sm_90a builds of the DeepSeek-V3 EP8 T = 16 gate/up tile (swapped, TMA, scalar block scales, 3 stages,
    4 warps) and of the Qwen3-235B T = 1 small-path gate/up: the two-dot K loops wait after each of their two
    dots (2 wgmma waits per step); with the lag (SCALE_LAG 2, the device form with the order pin) one: the up
    dot is in flight across the loop's back edge. PTX: one ``wgmma.wait_group 0`` in the loop (Triton 3.6
    emits no ``wait_group 1`` here: its pipeliner relaxes a dot only if its result is read after a
    ``wait_group 0``) plus the one after it; SASS: 2 issues and 1 wait per K step (ptxas did not serialize
    them), no spills. The builds land in a private Triton cache, where the test reads the PTX and cubin."""
    gu = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, SPLIT_K=1, A_GROUP=True, W_BLOCK=True)
    gu.update(A2_GROUP=True, OUT_MODE=0, EVEN_K=True, FAST_ACC=False, TWO_DOTS=True, USE_PDL=True)
    gu.update(W_TMA=True, W_SCALAR=True, SWAP_AB=True, BLOCK_EXIT=True)
    # the Qwen3-235B T = 1 small-path gate/up (PRE_Q, 8 warps, 3 stages, 128-wide block-scaled tile, PDL)
    flags = dict(SPLIT_K=1, W_BLOCK=True, A2_GROUP=True, H_MODE=1, K_PAD=8, EVEN_K=True, USE_PDL=True)
    small = dict(flags, BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, N_PAD=256, A_GROUP=True, PRE_Q=1)
    res = {}
    for name, lag in (("_gate_up_kernel", 0), ("_gate_up_kernel", 2), ("_small_gate_up_kernel", 0),
                      ("_small_gate_up_kernel", 2)):  # fmt: skip
        cache = tmp_path / f"{name}{lag}"
        monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
        if name == "_gate_up_kernel":
            job = _sm90_job(name, dict(gu, SCALE_LAG=lag), 4, 3)
        else:
            job = _small_job(name, dict(small, SCALE_LAG=lag))
            job[4:6] = [8, 3]  # warps, stages
        (r,) = compile_sm90([job])
        (cubin,) = glob.glob(str(cache / "*" / f"{name}.cubin"))
        (ptx,) = glob.glob(str(cache / "*" / f"{name}.ptx"))
        r["k_loop"] = min(_sass_loops(cubin), key=lambda loop: loop["size"])
        r["waits"] = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", open(ptx).read())
        res[name, lag] = r
    for r in res.values():
        assert r["stack"] == 0 and r["async_copies"] > 0 and r["k_loop"]["arrive"] == 2, res
        assert r["waits"] == ["0", "0"], res  # lagged: the gate dot's (retires the previous up dot), the last
    for name in ("_gate_up_kernel", "_small_gate_up_kernel"):
        assert res[name, 0]["k_loop"]["wait"] == 2 and res[name, 2]["k_loop"]["wait"] == 1, res
    assert res["_gate_up_kernel", 2]["ctas_per_sm"] >= 2, res
    # the small tile's two live product tiles: 140 registers uncapped (1 CTA per SM); op_small caps the 8-warp
    # build at FUSE_MAXNREG = 128 (2 per SM, no spills: checked by hand with maxnreg, 2026-11-29)
    assert res["_small_gate_up_kernel", 2]["registers"] > 128 >= res["_small_gate_up_kernel", 0]["registers"]


# ---------------------------------------------------------------------------------------------
# H200: the real decode shapes

GPU_POINTS = {  # name -> (E local, H, I, top_k, global experts, expert offset, T)
    "deepseek-v3-ep8-16": (32, 7168, 2048, 8, 256, 64, 16),
    "qwen3-30b-a3b-16": (128, 2048, 768, 8, 128, 0, 16),
    "qwen3-30b-a3b-128": (128, 2048, 768, 8, 128, 0, 128),
}


def _regular(t, k, e, h, i):
    cfg = op.get_config(t, k, e, h, i, "block-dynamic", True, allow_small=False)
    return {key: v for key, v in cfg.items() if key != "PREFETCH"}


def _gpu_problem(point, ids=None):
    e, h, i, k, ge, off, t = GPU_POINTS[point]
    p = make_problem(
        t, e, h, i, k, "block-dynamic", device="cuda", global_experts=ge, expert_offset=off, ids=ids
    )
    return p, _regular(t, k, e, h, i)


@pytest.mark.gpu
@pytest.mark.parametrize("point", list(GPU_POINTS))
def test_gpu_scale_lag_bitwise_the_two_dot_form(point):
    """The tuned regular pick (swaps, TMA, scalar scales where tuned) with SCALE_LAG: bitwise the same config
    with GU_TWO_DOTS, both within 2e-2 of the reference, reproducible."""
    seed = _seed()
    p, cfg = _gpu_problem(point)
    got = _lag_matches_two_dots(p, cfg, seed)
    again, _, _ = run_and_check(p, config=dict(cfg, SCALE_LAG=1), seed=seed)
    assert torch.equal(got, again), seed


@pytest.mark.gpu
def test_gpu_small_path_scale_lag_bitwise_the_plain_loop(monkeypatch):
    """Qwen3-235B T = 1 (the small-T PRE_Q pick; with 8 warps the lag's build is capped at 128 registers) and
    T = 16 with the small path: SCALE_LAG bitwise the plain loop, within 2e-2 of the reference (quantizing h in
    the pick's groups)."""
    seed = _seed()
    for t in (1, 16):
        p = make_problem(t, 128, 4096, 1536, 8, "block-dynamic", device="cuda")
        cfg = op.get_config(1, 8, 128, 4096, 1536, "block-dynamic", True)
        assert op_small.is_small(cfg) and cfg.get("PRE_Q"), cfg
        match_h_group(monkeypatch, cfg)  # the pick's h groups: 1x64 since 2026-11-30 00:08 UTC
        plain, _, _ = run_and_check(p, config=cfg, seed=seed)
        lagged, _, _ = run_and_check(p, config=dict(cfg, SCALE_LAG=1), seed=seed)
        assert torch.equal(plain, lagged), (seed, t)


@pytest.mark.gpu
def test_gpu_scale_lag_graph_replay_tracks_new_routing():
    seed = _seed()
    p, cfg = _gpu_problem("deepseek-v3-ep8-16")
    cfg = dict(cfg, PDL=1, SCALE_LAG=1)
    out = torch.empty_like(p["x"])
    call = lambda: fused_moe(  # noqa: E731
        p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=out, config=cfg, **p["kw"]
    )
    check_graph_replay(p, call, out, seed=seed, replays=3, capture_calls=2)


@pytest.mark.gpu
def test_gpu_scale_lag_eager_plan_replay_bitwise():
    """The second eager call of the signature (replaying the compiled launches) is bitwise the first, and a
    call on new routing matches the unplanned call."""
    seed = _seed()
    p, cfg = _gpu_problem("qwen3-30b-a3b-128")
    check_eager_plan_replay(p, dict(cfg, SCALE_LAG=1), seed=seed)


@pytest.mark.gpu
def test_gpu_scale_lag_expert_parallel_rank_without_local_tokens():
    seed = _seed()
    e, h, i, k, ge, off, t = GPU_POINTS["deepseek-v3-ep8-16"]
    ids = torch.randint(0, off, (t, k), device="cuda", dtype=torch.int32)  # all on lower ranks
    p, cfg = _gpu_problem("deepseek-v3-ep8-16", ids=ids)
    out, _, _ = run_and_check(p, config=dict(cfg, SCALE_LAG=1), seed=seed)
    assert (out == 0).all(), seed
