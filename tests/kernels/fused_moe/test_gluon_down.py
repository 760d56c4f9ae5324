"""Tests of the ping-pong Gluon down GEMM of the fused MoE prefill (config DN_GLUON = 3, kernel_gluon_down.py).

Gluon has no interpreter, so on CPU: the op refuses the key outside its form (block scales, dynamic intermediate
scales, tiles whose sum and two partials do not fit one warpgroup's registers, keys it has no form of, the small-T
path, a CPU device) with a clear error, and the kernel builds offline for sm_90a: the three
partitions present (setmaxnreg to 232 registers for the two consumer warpgroups, 40 for the producer warp), no
stack at the accepted tiles, one wgmma group left in flight at the K loop's promotions, and the 128 x 128 tile the
op refuses spilling. On the H200 (marked gpu): Hy3 at T = 4096 and 16384 bitwise the Triton down GEMM of the
shipped pick (same products, same fp32 additions in the same order, same epilogue), ragged experts incl. empty
ones, an EP rank with no rows, a CUDA-graph replay with fresh routing, row counts leaving 64-row tiles of padding
only on two EP ranks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.fused_moe import op  # noqa: E402
from hpc_advise.kernels.fused_moe.op import FusedMoEError, fused_moe  # noqa: E402
from tests.kernels.fused_moe.helpers import (  # noqa: E402
    check_graph_replay,
    device_scales,
    fresh_seed,
    make_problem,
    run_and_check,
)

HY3 = (192, 4096, 1536, 8)  # E, H, I, top_k
PICK_16384 = dict(  # the shipped Hy3 per-tensor pick at T = 16384 (configs.json)
    BLOCK_M=128, GU_N=128, GU_K=128, SPLIT_K=1, GU_GROUP_M=8, GU_WARPS=8, GU_STAGES=3,
    DN_N=128, DN_K=128, DN_GROUP_M=8, DN_WARPS=8, DN_STAGES=4,
)  # fmt: skip
PINGPONG = dict(DN_GLUON=3, DN_GLUON_M=64, DN_N=128, DN_WARPS=4, DN_STAGES=6)  # 64 x 128 per consumer


def _cfg(**change):
    """The T = 16384 pick with the ping-pong down GEMM (64 x 128 per consumer), then ``change``."""
    return {**PICK_16384, **PINGPONG, **change}


def _pick(t):
    return op.get_config(t, HY3[3], *HY3[:3], "tensor-static", False, allow_small=False)


def _forms(cfg, *, a2_group=False, w_block=False, h=4096, i=1536):
    op.check_forms(op.check_config(dict(cfg), a2_group, a2_group), a2_group, a2_group, w_block, h, i)


def test_pingpong_form_accepted_for_the_hy3_prefill_tiles():
    _forms(_cfg())
    _forms(_cfg(DN_STAGES=8))
    _forms(dict(PICK_16384, DN_GLUON=3, DN_N=64, DN_WARPS=4))  # 128 x 64 (DN_GLUON_M defaults to BLOCK_M)
    _forms(_cfg(BLOCK_M=64))  # the T = 4096 pick's BLOCK_M
    _forms(_cfg(), i=192)  # Hy3 TP8: one and a half K steps


@pytest.mark.parametrize(
    "change,kw,words",
    [
        ({}, {"w_block": True}, "per-tensor"),
        ({}, {"a2_group": True}, "per-tensor"),
        ({"DN_GLUON_M": 128}, {}, "<= 8192"),  # 128 x 128: sum + partials need 256 registers (spills)
        ({"DN_GLUON_M": 32}, {}, "64 or 128"),
        ({"BLOCK_M": 64, "DN_GLUON_M": 128}, {}, "dividing"),
        ({"DN_WARPS": 8}, {}, "DN_WARPS == 4"),
        ({"DN_K": 64}, {}, "DN_K == 128"),
        ({"DN_STAGES": 9}, {}, "ring of"),
        ({"DN_N": 128}, {"h": 4160}, "H % DN_N"),
        ({"PDL": 1}, {}, "PDL"),
        ({"DN_TILES": 2}, {}, "DN_TILES"),
        ({"DN_GLUON": 1}, {}, "must be 0 (Triton down GEMM) or 3"),
        ({"DN_GLUON": 0}, {}, "needs DN_GLUON = 3"),  # DN_GLUON_M alone
    ],
)
def test_pingpong_refused_outside_its_form(change, kw, words):
    with pytest.raises(FusedMoEError, match=re.escape(words)):
        _forms(_cfg(**change), **kw)


def test_pingpong_refused_on_the_small_t_path():
    for path in (op.default_small_config(8, 8, 192, 4096, 1536),):
        with pytest.raises(FusedMoEError, match="regular prefill path key"):
            op.check_config(dict(path, DN_GLUON=3), False)


@pytest.mark.parametrize("t", [4096, 16384])
def test_shipped_hy3_prefill_picks_are_the_pingpong_form_and_its_triton_form(t):
    """configs.json ships DN_GLUON 3 at Hy3 T = 16384 (H200 call 2, 2026-11-30 05:10 UTC) and T = 4096 (08:18 UTC,
    energy_fused_moe_hy3_4096_pingpong.md); the Triton form (the fallback off SM90) is the same tile on 8 warps, and
    both pass the op's checks."""
    pick = _pick(t)
    assert pick["DN_GLUON"] == 3 and pick["DN_GLUON_M"] * pick["DN_N"] <= 8192, pick
    _forms(pick)
    tri = op.triton_down_form(pick)
    assert "DN_GLUON" not in tri and "DN_GLUON_M" not in tri and tri["DN_WARPS"] == 8, tri
    assert {k: v for k, v in tri.items() if k != "DN_WARPS"} == {
        k: v for k, v in pick.items() if k not in ("DN_GLUON", "DN_GLUON_M", "DN_WARPS")
    }
    _forms(tri)
    assert op.triton_down_form(PICK_16384) == PICK_16384  # a Triton pick is left as it is


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU fallback (no interpreter form)")
def test_picked_pingpong_config_falls_back_to_the_triton_down_off_sm90(monkeypatch):
    """A configs.json pick with DN_GLUON runs the Triton down GEMM where Gluon cannot run (here: the interpreter),
    with the right result; an explicit DN_GLUON config is refused (next test)."""
    seen = []

    def pick(*args, **kw):
        seen.append(args)
        return _cfg(BLOCK_M=64)

    monkeypatch.setattr(op, "get_config", pick)
    p = make_problem(8, 4, 256, 128, 2, "tensor-static", device="cpu")
    run_and_check(p, config=None, seed=0)
    assert seen, "the op did not pick a config"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal (no interpreter form)")
def test_pingpong_refused_on_cpu_before_any_launch():
    p = make_problem(8, 4, 256, 128, 2, "tensor-static", device="cpu")
    out = torch.full_like(p["x"], float("nan"))
    with pytest.raises(FusedMoEError, match="SM90"):
        fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=out, config=_cfg(), **p["kw"])  # fmt: skip
    assert torch.isnan(out).all()  # nothing ran


# ---------------------------------------------------------------------------------------------
# offline sm_90a build (CPU)

_BUILD = r"""
import json, os, re, subprocess, sys, tempfile
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import mangle_type
from hpc_advise.kernels.fused_moe.kernel_gluon_down import MAXNREG, _down_pingpong_kernel as fn

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
out = []
for tm, bn, stages in json.loads(sys.argv[1]):
    base = torch.empty(256, 256, dtype=torch.float8_e4m3fn)
    descs = [TensorDescriptor.from_tensor(base, [r, 128], gl.NVMMASharedLayout.get_default_for([r, 128], gl.float8e4nv))
             for r in (tm, bn)]
    types = [mangle_type(d) for d in descs] + "*fp32 *fp32 *i32 *i32 *i32 *fp32 *bf16 i32 i32 i32 fp32".split()
    consts = dict(BLOCK_M=128, GROUP_M=8, STAGES=stages, num_warps=4)
    sig = dict(zip([a for a in fn.arg_names if a not in consts], types), **{c: "constexpr" for c in consts})
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if sig[a][0] == "*" or a in ("H", "I")}
    k = triton.compile(GluonASTSource(fn, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=4, maxnreg=MAXNREG))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    ptx = k.asm["ptx"]
    out.append({"stack": int(re.search(r"STACK:(\d+)", res).group(1)), "shared": k.metadata.shared,
                "warps": k.metadata.num_warps,
                "setmaxnreg": sorted({int(v) for v in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
                "waits": sorted(set(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx))),
                "named_bars": sorted(set(re.findall(r"bar\.sync\s+(\d+),\s*128", ptx)))})
print(json.dumps(out))
"""


@pytest.mark.slow
def test_pingpong_builds_for_sm90_with_three_partitions_and_no_spills():
    """64 x 128 (4 and 8 stages) and 128 x 64 per consumer build with no stack in 12 warps (4 + 4 + 1, rounded to
    warpgroups): the consumer warpgroups raise their registers to 232, the producer's lowers to 40; each consumer
    frees slots behind a barrier of its own 128 threads (two named barriers); the promotions wait with one wgmma
    group in flight (``wait_group 1``) and drain with ``wait_group 0``. 128 x 128 spills (refused by the op)."""
    jobs = [(64, 128, 4), (64, 128, 8), (128, 64, 6), (128, 128, 4)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "-c", _BUILD, json.dumps(jobs)], capture_output=True, text=True, env=env, cwd=root,
        timeout=900,
    )  # fmt: skip
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("triton's bundled ptxas is missing")
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    for (tm, bn, stages), r in zip(jobs, res, strict=True):
        assert r["warps"] == 12, r
        assert {232, 40} <= set(r["setmaxnreg"]), r
        assert r["waits"] == ["0", "1"], r
        assert len(r["named_bars"]) == 2, r  # one per consumer warpgroup
        assert r["shared"] <= stages * (tm + bn) * 128 + 1024, r
        assert (r["stack"] > 0) == (tm * bn > 8192), r
    print(res)


def _pair(p, cfg, change, seed):
    """(Triton down under ``cfg``'s Triton form, ping-pong down under cfg + change) outputs of one problem, each
    checked against the reference."""
    tri, _, err_t = run_and_check(p, config=op.triton_down_form(cfg), seed=seed)
    glu, _, err_g = run_and_check(p, config=dict(cfg, **change), seed=seed)
    return tri, glu, err_t, err_g


@pytest.mark.gpu
@pytest.mark.parametrize("t", [4096, 16384])
def test_gpu_pingpong_bitwise_the_triton_down_hy3(t):
    """Hy3 at the pick's tiles: the shipped ping-pong pick (T = 16384) and the other ping-pong tile shapes
    bitwise the Triton down GEMM of the same tile."""
    seed = fresh_seed()
    e, h, i, k = HY3
    p = make_problem(t, e, h, i, k, "tensor-static", device="cuda")
    cfg = _pick(t)
    shapes = [dict(PINGPONG)] + ([dict(PINGPONG, DN_GLUON_M=128, DN_N=64)] if cfg["BLOCK_M"] == 128 else [])
    if cfg.get("DN_GLUON", 0):
        shapes.insert(0, {})
    for change in shapes:
        tri, glu, err_t, err_g = _pair(p, cfg, change, seed)
        diff = (tri.float() - glu.float()).abs().max().item()
        print(f"Hy3 T={t} {change}: rel err vs ref Triton {err_t:.3e} Gluon {err_g:.3e}; max |d| {diff:.3e}")
        assert torch.equal(tri, glu), (t, change, diff, seed)


@pytest.mark.gpu
def test_gpu_pingpong_ragged_empty_experts_ep_rank_and_graph_replay():
    """Hy3 TP8 rows (I = 192: one full and one half K step): one expert takes every token, a few take three,
    the rest none, slots of another EP rank; bitwise the Triton down GEMM; an EP rank with no rows gives zeros;
    then a CUDA-graph replay with fresh routing (descriptors are launch parameters; the weights do not move)."""
    seed = fresh_seed()
    t, k, e, h, i = 1024, 4, 32, 1024, 192
    ids = torch.full((t, k), -1, dtype=torch.int32, device="cuda")
    ids[:, 0] = 7
    ids[:3, 1] = 11
    ids[5:, 2] = torch.randint(0, e, (t - 5,), device="cuda", dtype=torch.int32)
    p = make_problem(t, e, h, i, k, "tensor-static", device="cuda", ids=ids)
    cfg = dict(PICK_16384, GU_STAGES=4)
    tri, glu, _, _ = _pair(p, cfg, PINGPONG, seed)
    assert torch.equal(tri, glu), seed
    away = torch.randint(0, e, (t, k), dtype=torch.int32, device="cuda")  # all on experts of rank 0
    q = make_problem(
        t, e, h, i, k, "tensor-static", device="cuda", global_experts=2 * e, expert_offset=e, ids=away
    )
    got, _, _ = run_and_check(q, config=dict(cfg, **PINGPONG), seed=seed)
    assert (got == 0).all(), seed
    kw = device_scales(p["kw"])
    out = torch.empty_like(p["x"])
    call = lambda: fused_moe(  # noqa: E731
        p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=out, config=dict(cfg, **PINGPONG), **kw
    )
    check_graph_replay(p, call, out, seed=seed)


# local experts' rows: a last 128-row block with 1-64 rows (its second 64-row tile all padding), 65-127 rows, whole
# blocks, none
ROW_COUNTS = (1, 64, 65, 127, 128, 0, 129, 192, 200, 256, 3, 0, 70, 33, 100, 64)


@pytest.mark.gpu
def test_gpu_pingpong_ragged_row_counts_on_two_ep_ranks_hy3_tp8():
    """Hy3 TP8 rows (I = 192) on 16 local experts of 32 (EP rank 0) with the row counts of ROW_COUNTS (slot 0),
    slot 1 on the other rank or -1: the ping-pong down over 64-row tiles, some of them padding only, is bitwise the
    Triton down GEMM; then rank 1 of the same routing (its local rows: slot 1's)."""
    seed = fresh_seed()
    e, h, i, k = 16, 1024, 192, 2
    counts = torch.tensor(ROW_COUNTS)
    assert ((counts % 128 >= 1) & (counts % 128 <= 64)).sum() >= 4 and (counts == 0).sum() >= 2
    t = int(counts.sum())
    ids = torch.empty((t, k), dtype=torch.int32)
    ids[:, 0] = torch.repeat_interleave(torch.arange(e), counts)[torch.randperm(t)]
    ids[:, 1] = torch.randint(e, 2 * e, (t,))
    ids[torch.rand(t) < 0.25, 1] = -1
    ids = ids.cuda()
    cfg = dict(PICK_16384, GU_STAGES=4)
    for off in (0, e):
        p = make_problem(t, e, h, i, k, "tensor-static", device="cuda", global_experts=2 * e, expert_offset=off,
                         ids=ids)  # fmt: skip
        tri, glu, _, _ = _pair(p, cfg, PINGPONG, seed)
        assert torch.equal(tri, glu), (off, seed)
