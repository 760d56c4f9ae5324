"""Tests of the Gluon down GEMM of the fused MoE's prefill path (config DN_GLUON, kernel_gluon_down.py).

Gluon has no interpreter, so on CPU: the op refuses the key outside its form (block scales, dynamic
intermediate scales, decode tiles, keys it has no form of, a CPU device) with a clear error, and the kernel
builds offline for sm_90a with no spills and the waits it is written for (one wgmma group left in flight at
each K step's promotion; ``wait_group 0`` only after the loop). On the H200 (marked gpu): real prefill shapes
against the fp32 reference (2e-2) and bitwise against ``_down_kernel`` under the same config (same products,
same fp32 additions in the same order), ragged K (odd and even step counts), empty experts and an EP rank,
eager repeats and a CUDA-graph replay with fresh routing.
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
from tests.kernels.test_fused_moe import (  # noqa: E402
    _seed,
    check_graph_replay,
    device_scales,
    make_problem,
    run_and_check,
)

HY3_PREFILL = dict(  # the shipped Hy3 per-tensor prefill config (T = 4096) with the Gluon down GEMM
    BLOCK_M=64, GU_N=128, GU_K=128, SPLIT_K=1, GU_GROUP_M=8, GU_WARPS=8, GU_STAGES=4,
    DN_N=128, DN_K=128, DN_GROUP_M=8, DN_WARPS=8, DN_STAGES=4, DN_GLUON=1,
)  # fmt: skip


def _forms(cfg, *, a2_group=False, w_block=False, h=4096, i=1536):
    op.check_forms(op.check_config(dict(cfg), a2_group, a2_group), a2_group, a2_group, w_block, h, i)


def test_gluon_down_form_accepted_for_the_hy3_prefill_tiles():
    _forms(HY3_PREFILL)
    _forms(dict(HY3_PREFILL, DN_GLUON=2))
    _forms(dict(HY3_PREFILL, BLOCK_M=128))
    _forms(dict(HY3_PREFILL, BLOCK_M=128, DN_N=64, DN_WARPS=4), i=192)


@pytest.mark.parametrize(
    "change,kw,words",
    [
        ({}, {"w_block": True}, "per-tensor"),
        ({}, {"a2_group": True}, "per-tensor"),
        ({"BLOCK_M": 16}, {}, "BLOCK_M >= 64"),
        ({"DN_K": 64}, {}, "DN_K == 128"),
        ({"BLOCK_M": 128, "DN_WARPS": 4}, {}, "2048"),  # 128 fp32 values per thread: spills (sm_90a build)
        ({"DN_N": 128}, {"h": 4160}, "H % DN_N"),
        ({"PDL": 1}, {}, "PDL"),
        ({"DN_REDUCE": 1}, {}, "DN_REDUCE"),
        ({"DN_A_TMA": 1}, {}, "DN_A_TMA"),
        ({"DN_TILES": 2}, {}, "DN_TILES"),
        ({"DN_GLUON": 3}, {}, "must be 0"),
    ],
)
def test_gluon_down_refused_outside_its_form(change, kw, words):
    with pytest.raises(FusedMoEError, match=re.escape(words)):
        _forms(dict(HY3_PREFILL, **change), **kw)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal (no interpreter form)")
def test_gluon_down_refused_on_cpu_before_any_launch():
    p = make_problem(8, 4, 256, 128, 2, "tensor-static", device="cpu")
    out = torch.full_like(p["x"], float("nan"))
    with pytest.raises(FusedMoEError, match="SM90"):
        fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=out, config=HY3_PREFILL, **p["kw"])
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
from hpc_advise.kernels.fused_moe.kernel_gluon_down import _down_gluon_kernel as fn

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
out = []
for bm, bn, stages, warps, producer in json.loads(sys.argv[1]):
    base = torch.empty(256, 256, dtype=torch.float8_e4m3fn)
    descs = [TensorDescriptor.from_tensor(base, [r, 128], gl.NVMMASharedLayout.get_default_for([r, 128], gl.float8e4nv))
             for r in (bm, bn)]
    types = [mangle_type(d) for d in descs] + "*fp32 *fp32 *i32 *i32 *i32 *fp32 *bf16 i32 i32 i32 i32 fp32".split()
    consts = dict(BLOCK_M=bm, BLOCK_N=bn, GROUP_M=8, STAGES=stages, num_warps=warps, PRODUCER=producer)
    sig = dict(zip([a for a in fn.arg_names if a not in consts], types), **{c: "constexpr" for c in consts})
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if sig[a][0] == "*" or a in ("H", "I")}
    k = triton.compile(GluonASTSource(fn, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=warps))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    ins = [t for _, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    addr = {int(a, 16): i for i, (a, _) in enumerate(re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass))}
    loops = []
    for j, t in enumerate(ins):
        m = t.startswith("@") and re.search(r"BRA\s+0x([0-9a-f]+)", t)  # conditional: spin-wait exits are not
        i = addr.get(int(m.group(1), 16), j + 1) if m else j + 1
        if i <= j and any("GMMA" in x for x in ins[i:j + 1]):
            loops.append(ins[i:j + 1])
    body = min(loops, key=len)  # the K loop
    out.append({"registers": int(re.search(r"REG:(\d+)", res).group(1)),
                "stack": int(re.search(r"STACK:(\d+)", res).group(1)), "shared": k.metadata.shared,
                "ptx_waits": re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", k.asm["ptx"]),
                "loop_mma": sum("QGMMA" in x for x in body),
                "loop_waits": [re.search(r"0x(\d)", x).group(1) for x in body if "WARPGROUP.DEPBAR" in x],
                "loop_local": sum(bool(re.search(r"\b(LDL|STL)\b", x)) for x in body),
                "loop_tma": sum("UTMALDG" in x for x in body), "loop_bars": sum("BAR.SYNC" in x for x in body)})
print(json.dumps(out))
"""


@pytest.mark.slow
def test_gluon_down_builds_for_sm90_with_one_wgmma_group_in_flight():
    """Hy3's prefill tiles (BLOCK_M 64 / 128 × DN_N 128, 8 warps, 4 stages), a 4-warp 64-row tile, and the
    producer-warp form (DN_GLUON = 2): no stack, at most the ring + barriers of shared memory, and in the K loop
    (two 128-wide steps per trip) the QGMMAs of two steps and two waits that leave one group in flight;
    ``wait_group 0`` only after it. The consumer-fed ring issues its copies in the loop behind 4 CTA barriers per
    step (8 warps); with the producer warp the loop holds no copy and 2 barriers per step."""
    jobs = [(64, 128, 4, 8, False), (128, 128, 4, 8, False), (64, 128, 4, 4, False), (128, 128, 4, 8, True),
            (64, 128, 4, 8, True)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "-c", _BUILD, json.dumps(jobs)], capture_output=True, text=True, env=env, cwd=root,
        timeout=600,
    )  # fmt: skip
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("triton's bundled ptxas is missing")
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    for job, r in zip(jobs, res, strict=True):
        assert r["stack"] == 0 and r["loop_local"] == 0, (job, r)
        assert r["shared"] <= 4 * (job[0] + job[1]) * 128 + 1024, (job, r)
        assert r["loop_waits"] == ["1", "1"], (job, r)  # never 0 inside the loop
        assert r["loop_mma"] >= 2 * 128 // 32, (job, r)  # 4 k=32 MMAs per step (per warpgroup N split: more)
        assert r["ptx_waits"].count("0") == 2, (job, r)  # the two tails (odd / even step counts)
        if job[4]:
            assert r["loop_tma"] == 0 and r["loop_bars"] <= 4, (job, r)
        else:
            assert r["loop_tma"] == 4, (job, r)  # A and B of two steps
    print(res)


# ---------------------------------------------------------------------------------------------
# H200

GPU_SHAPES = {  # name -> (E, H, I, top_k, T, config changes): Hy3 prefill, Hy3 TP8 (2 steps, 64 ragged), odd steps
    "hy3-4096": (192, 4096, 1536, 8, 4096, {}),
    "hy3-tp8-1024": (192, 4096, 192, 8, 1024, {}),
    "odd-steps": (16, 1024, 320, 4, 1024, {"BLOCK_M": 128, "DN_STAGES": 3}),
}


def _pair(p, cfg, seed, form=1):
    """(Triton down, Gluon down) outputs of one problem under one config (each checked against the reference)."""
    tri, _, err_t = run_and_check(p, config=dict(cfg, DN_GLUON=0), seed=seed)
    glu, _, err_g = run_and_check(p, config=dict(cfg, DN_GLUON=form), seed=seed)
    return tri, glu, err_t, err_g


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(GPU_SHAPES))
def test_gpu_gluon_down_bitwise_the_triton_down(shape):
    seed = _seed()
    e, h, i, k, t, change = GPU_SHAPES[shape]
    p = make_problem(t, e, h, i, k, "tensor-static", device="cuda")
    for form in (1, 2):
        tri, glu, err_t, err_g = _pair(p, dict(HY3_PREFILL, **change), seed, form)
        diff = (tri.float() - glu.float()).abs().max().item()
        print(
            f"{shape} DN_GLUON={form}: rel err vs ref Triton {err_t:.3e} Gluon {err_g:.3e}; max |d| {diff:.3e}"
        )
        assert torch.equal(tri, glu), (shape, form, diff, seed)


@pytest.mark.gpu
def test_gpu_gluon_down_hy3_16384_bitwise_and_eager_repeat():
    """The T = 16384 pick's tile (BLOCK_M 128): bitwise the Triton down GEMM; a second eager call (the call
    is never recorded as a launch plan) gives the same output."""
    seed = _seed()
    t, e, h, i, k = 16384, 192, 4096, 1536, 8
    p = make_problem(t, e, h, i, k, "tensor-static", device="cuda")
    cfg = dict(HY3_PREFILL, BLOCK_M=128, GU_STAGES=3)
    outs = []
    for gl_on in (0, 1, 1, 2, 2):
        out = torch.full_like(p["x"], float("nan"))
        fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=out, config=dict(cfg, DN_GLUON=gl_on),
                  **p["kw"])  # fmt: skip
        outs.append(out)
    assert not any(torch.isnan(o).any() for o in outs), seed
    assert all(torch.equal(outs[0], o) for o in outs[1:]), seed


@pytest.mark.gpu
def test_gpu_gluon_down_empty_experts_ep_rank_and_graph_replay():
    """One expert takes every token, a few take three, the rest none; slots of another EP rank; then a
    CUDA-graph replay with fresh routing (descriptors are launch parameters; the weights do not move)."""
    seed = _seed()
    t, k, e, h, i = 1024, 4, 32, 1024, 256
    ids = torch.full((t, k), -1, dtype=torch.int32, device="cuda")
    ids[:, 0] = 7
    ids[:3, 1] = 11
    ids[5:, 2] = torch.randint(0, e, (t - 5,), device="cuda", dtype=torch.int32)
    p = make_problem(t, e, h, i, k, "tensor-static", device="cuda", ids=ids)
    tri, glu, _, _ = _pair(p, HY3_PREFILL, seed)
    assert torch.equal(tri, glu), seed
    _, glu2, _, _ = _pair(p, HY3_PREFILL, seed, 2)
    assert torch.equal(tri, glu2), seed
    p["kw"] = device_scales(p["kw"])
    out = torch.empty_like(p["x"])
    call = lambda: fused_moe(  # noqa: E731
        p["x"],
        p["w13"],
        p["w2"],
        p["weights"],
        p["ids"],
        out=out,
        config=dict(HY3_PREFILL, DN_GLUON=2),
        **p["kw"],
    )
    check_graph_replay(p, call, out, seed=seed)
