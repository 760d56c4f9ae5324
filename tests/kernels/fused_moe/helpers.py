"""Shared pieces of the fused MoE tests: tolerances (declared once), problem builder, checkers.

Every test draws fresh random inputs (``fresh_seed``: the seed is in the failure message), poisons the
output with NaN before the call (``run_and_check``) and compares with the fp32 torch reference that
dequantizes the weights and applies the same activation quantization. The kernel README ("Tolerances")
says why the bounds are what they are.
"""

from __future__ import annotations

import os

import torch

from hpc_advise.kernels.fused_moe import launch_plan as LP
from hpc_advise.kernels.fused_moe.op import fused_moe
from hpc_advise.kernels.fused_moe.reference import (
    fused_moe_reference,
    quantize_weight,
)
from tests.kernels.fp8_midpoint import reference_with_flips

# Tolerances, declared once (README.md, "Tolerances", says why; the fp8 midpoint second look's own
# bounds, FLIP_REL and FLIP_MAX_PER_TOKEN, live with it in tests/kernels/fp8_midpoint.py).
REL_TOL_QUANT_REF = 2e-2  # vs the reference with the same fp8 quantization, fp32 math
REL_TOL_FLOAT_REF = 2.5e-1  # vs unquantized fp32 math (reported; bound only catches gross errors: README)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


CPU_CFG = dict(
    BLOCK_M=16,
    GU_N=32,
    GU_K=128,
    SPLIT_K=1,
    GU_GROUP_M=2,
    GU_WARPS=4,
    GU_STAGES=2,
    DN_N=64,
    DN_K=128,
    DN_GROUP_M=2,
    DN_WARPS=4,
    DN_STAGES=2,
)
MODES = {  # name -> (weight scales, static activation scales?)
    "tensor-static": ("tensor", True),
    "block-dynamic": ("block", False),
    "tensor-dynamic": ("tensor", False),
    "block-static": ("block", True),
}


def fresh_seed() -> int:
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    return seed


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.double(), ref.double()
    return float((out64 - ref64).norm() / ref64.norm().clamp(min=1e-30))


def make_problem(
    t,
    num_experts,
    hidden,
    inter,
    top_k,
    mode,
    *,
    device=DEVICE,
    global_experts=None,
    expert_offset=0,
    ids=None,
):
    """Random MoE problem; float weights kept for the unquantized comparison."""
    wq_mode, static = MODES[mode]
    ge = global_experts or num_experts
    x = torch.randn(t, hidden, device=device).to(torch.bfloat16)
    w13f = torch.randn(num_experts, 2 * inter, hidden, device=device) / hidden**0.5
    w2f = torch.randn(num_experts, hidden, inter, device=device) / inter**0.5
    w13, s13 = quantize_weight(w13f, wq_mode)
    w2, s2 = quantize_weight(w2f, wq_mode)
    if ids is None:
        ids = torch.rand(t, ge, device=device).topk(top_k, dim=1).indices.to(torch.int32)
    weights = torch.softmax(torch.randn(t, top_k, device=device), dim=1)
    kw = dict(w13_scale=s13, w2_scale=s2, expert_offset=expert_offset)
    if static:
        kw["a13_scale"] = float(x.float().abs().max()) / 448.0 if t else 1.0
        kw["a2_scale"] = 6.0 / 448.0
    if wq_mode == "block":
        kw["block_shape"] = (128, 128)
    return dict(x=x, w13=w13, w2=w2, w13f=w13f, w2f=w2f, ids=ids, weights=weights, kw=kw, experts=ge)


def run_and_check(p, *, config=None, scaling=1.0, fn=fused_moe, tol=REL_TOL_QUANT_REF, seed=None):
    out = torch.full_like(p["x"], float("nan"))
    got = fn(
        p["x"],
        p["w13"],
        p["w2"],
        p["weights"],
        p["ids"],
        routed_scaling_factor=scaling,
        out=out,
        config=config,
        **p["kw"],
    )
    assert got.data_ptr() == out.data_ptr()
    return (out, *check_output(out, p, scaling=scaling, tol=tol, seed=seed))


def check_output(out, p, *, scaling=1.0, tol=REL_TOL_QUANT_REF, seed=None):
    """Every row written, and ``out`` within ``tol`` of the fp32 reference for p's current routing;
    returns (reference, relative error)."""
    assert not torch.isnan(out).any(), f"unwritten/NaN outputs (seed {seed})"
    ref = fused_moe_reference(
        p["x"], p["w13"], p["w2"], p["weights"], p["ids"], routed_scaling_factor=scaling, **p["kw"]
    )
    if ref.abs().max() == 0:
        assert (out == 0).all(), f"expected zeros (seed {seed})"
        return ref, 0.0
    err = rel_err(out, ref)
    if err > tol:  # a second look: h elements at an fp8 rounding midpoint may round the other way
        err = rel_err(out, reference_with_flips(out, ref, p, scaling, seed))
    assert err <= tol, f"rel err {err:.3e} > {tol} (seed {seed})"
    return ref, err


def device_scales(kw: dict) -> dict:
    """p["kw"] with the static activation scales as 1-element device tensors: a host float would be
    copied to the GPU inside a CUDA-graph capture, which CUDA refuses."""
    return {
        k: torch.tensor([v], device="cuda") if k in ("a13_scale", "a2_scale") else v for k, v in kw.items()
    }


def check_graph_replay(p, call, out, *, seed, replays=1, capture_calls=1):
    """GPU: ``call`` (one fused MoE call on p's tensors writing ``out``) runs once eagerly (compiles), is
    captured in a CUDA graph ``capture_calls`` times back to back, and the graph is replayed ``replays``
    times, each with fresh routing written into p["ids"] (distinct top-k of p's global experts; on the
    second replay token 0 also repeats its first expert in its last slot) and ``out`` poisoned with
    NaN, then checked like run_and_check."""
    call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(capture_calls):
            call()
    k = p["ids"].shape[1]
    for rep in range(replays):
        _fresh_routing(p)
        if rep == 1:
            p["ids"][0, k - 1] = p["ids"][0, 0]
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_output(out, p, seed=f"{seed}, replay {rep}")


def _fresh_routing(p):
    """Distinct top-k of p's global experts for every token, written into p["ids"] in place."""
    t, k = p["ids"].shape
    p["ids"].copy_(torch.rand(t, p["experts"], device=p["ids"].device).topk(k, dim=1).indices.to(torch.int32))


def check_eager_plan_replay(p, cfg, *, seed):
    """Eager calls through the launch plans (launch_plan.py): the second call of the signature (replaying
    the compiled launches) is bitwise the first (recorded) one, and a call on fresh routing (same tensors)
    is bitwise the same call with launch plans off; each output also checked like run_and_check."""
    first, _, _ = run_and_check(p, config=cfg, seed=seed)
    second, _, _ = run_and_check(p, config=cfg, seed=seed)
    assert torch.equal(first, second), seed
    _fresh_routing(p)
    replayed, _, _ = run_and_check(p, config=cfg, seed=seed)
    LP.ENABLED = False
    try:
        unplanned, _, _ = run_and_check(p, config=cfg, seed=seed)
    finally:
        LP.ENABLED = True
    assert torch.equal(replayed, unplanned), seed
