"""Tests of the fused MoE's launch plans (hpc_advise/kernels/fused_moe/launch_plan.py): the host side of an
eager call done once per call signature, later calls replaying the recorded launches with their own
tensors.

A plan must give bitwise the output of the unplanned call (it replays the same compiled kernels with the
same arguments), for any tensors of the same signature: each check records a plan on one problem and
replays it on another (different weights, routing, hidden rows: another layer), so a stale binding of any
tensor shows as a wrong output. Keys must change with everything the checks, the config and Triton's
specialization read (shape, stride, dtype, alignment, config, offset, scaling), and errors must be those
of the unplanned path. CPU tests run under the Triton interpreter, where plans relaunch through
``kernel[grid]`` with the recorded arguments (no compiled kernels there); the ``gpu`` tests run the three
paths' tuned configs at real shapes on the H200 through the compiled launchers, plus a CUDA-graph
capture with a cached plan and two streams.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from hpc_advise.kernels.fused_moe import launch_plan as LP  # noqa: E402
from hpc_advise.kernels.fused_moe import op, op_small  # noqa: E402
from tests.kernels.fused_moe.helpers import CPU_CFG, make_problem  # noqa: E402

T, E, H, I, K = 3, 8, 256, 128, 4  # CPU sizes (interpreter)


@pytest.fixture(autouse=True)
def _fresh_plans():
    """Every test starts and ends with plans on and no plan cached."""
    op._PLANS.clear()
    LP.ENABLED = True
    yield
    op._PLANS.clear()
    LP.ENABLED = True


def _call(p, cfg, **extra):
    kw = dict(p["kw"], **extra)
    return op.fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], config=cfg, **kw)


def _unplanned(p, cfg, **extra):
    LP.ENABLED = False
    try:
        return _call(p, cfg, **extra)
    finally:
        LP.ENABLED = True


def _paths(a2_group: bool) -> dict:
    regular = dict(CPU_CFG, GU_N=128) if a2_group else CPU_CFG
    return {
        "regular": regular,
        "regular-split-k": dict(CPU_CFG, GU_N=64, SPLIT_K=2),
        # TMA weight tiles and activation rows: host tensor descriptors over w13 / w2 (call slots) and the
        # intermediate (a workspace slot), rebuilt per replay
        "regular-tma": dict(regular, W_TMA=1, DN_A_TMA=1),
        "small": op_small.default_small_config(T, K, E, H, I, a2_group),
    }


def check_plan_replays(mode: str, cfg: dict, device: str, problem=None, **extra) -> None:
    """Record on problem 1, replay on problem 2 and on problem 1 again: each bitwise the unplanned call (also
    used by the other fused-MoE test files for their config keys)."""
    make = problem or (lambda: make_problem(T, E, H, I, K, mode, device=device))
    p1, p2 = make(), make()
    want1, want2 = _unplanned(p1, cfg, **extra), _unplanned(p2, cfg, **extra)
    assert not torch.equal(want1, want2)  # the two problems tell a stale binding apart
    records, hits = op._PLANS.records, op._PLANS.hits
    got1 = _call(p1, cfg, **extra)
    assert op._PLANS.records == records + 1, "the first call of a signature is recorded"
    got2 = _call(p2, cfg, **extra)
    again = _call(p1, cfg, **extra)
    assert op._PLANS.hits == hits + 2, "later calls of the signature replay the plan"
    assert torch.equal(got1, want1) and torch.equal(got2, want2) and torch.equal(again, want1)


@pytest.mark.parametrize(
    "mode,path",
    [
        ("block-dynamic", "regular"),
        ("block-dynamic", "regular-split-k"),
        ("block-dynamic", "regular-tma"),
        ("block-dynamic", "small"),
        ("tensor-static", "regular"),
        ("tensor-static", "small"),
    ],
)
def test_plan_replays_bitwise_the_unplanned_call(mode, path):
    check_plan_replays(mode, _paths(mode.endswith("dynamic"))[path], "cpu")
    (plan,) = op._PLANS.plans.values()
    descs = sum(len(step.descs) for step in plan.steps)
    assert descs == (3 if path == "regular-tma" else 0)  # over w13, w2 and the intermediate (workspace)


def test_plan_with_device_scale_tensors_passes_them_as_they_are():
    """Static activation scales given as 1-element fp32 tensors (as SGLang passes them) are the kernels'
    own arguments (no per-call copy); a host float becomes a per-call tensor. Both replay bitwise."""
    cfg = _paths(False)["small"]

    def problem():
        p = make_problem(T, E, H, I, K, "tensor-static", device="cpu")
        p["kw"] = {k: torch.tensor([v]) if k.startswith("a") else v for k, v in p["kw"].items()}
        return p

    check_plan_replays("tensor-static", cfg, "cpu", problem=problem)
    (plan,) = op._PLANS.plans.values()
    assert plan.meta == (True, True, True)


def test_workspace_allocated_per_call_above_the_kept_size(monkeypatch):
    monkeypatch.setattr(LP, "WS_PLAN_BYTES", 0)
    check_plan_replays("block-dynamic", _paths(True)["regular"], "cpu")
    (plan,) = op._PLANS.plans.values()
    assert plan.ws is None and plan.spec


def test_int64_ids_and_expert_parallel_offset_replay_bitwise():
    """ids converted per call (int64 given), EP offset with ids of other ranks (-1 and out of range)."""

    def problem():
        p = make_problem(T, E, H, I, K, "block-dynamic", device="cpu", global_experts=2 * E, expert_offset=E)
        p["ids"] = p["ids"].long()
        p["ids"][0, 0] = -1
        return p

    check_plan_replays("block-dynamic", _paths(True)["regular"], "cpu", problem=problem)
    (plan,) = op._PLANS.plans.values()
    assert plan.meta[0] is False  # the ids are a per-call conversion, not the caller's tensor


def _key(p, cfg=None, **over):
    args = dict(
        hidden=p["x"],
        w13=p["w13"],
        w2=p["w2"],
        topk_weights=p["weights"],
        topk_ids=p["ids"],
        w13_scale=p["kw"]["w13_scale"],
        w2_scale=p["kw"]["w2_scale"],
        a13_scale=p["kw"].get("a13_scale"),
        a2_scale=p["kw"].get("a2_scale"),
        block_shape=p["kw"].get("block_shape"),
        expert_offset=p["kw"]["expert_offset"],
        routed_scaling_factor=1.0,
        out=None,
        config=cfg,
    )
    args.update(over)
    return op._plan_key(**args)


def test_plan_key_follows_shape_dtype_stride_alignment_and_config():
    p = make_problem(T, E, H, I, K, "block-dynamic", device="cpu")
    base = _key(p, CPU_CFG)
    assert base == _key(make_problem(T, E, H, I, K, "block-dynamic", device="cpu"), dict(CPU_CFG))
    wide = torch.empty(T, H + 8, dtype=torch.bfloat16)
    changed = {
        "T": _key(make_problem(T + 1, E, H, I, K, "block-dynamic", device="cpu"), CPU_CFG),
        "ids dtype": _key(p, CPU_CFG, topk_ids=p["ids"].long()),
        "hidden stride": _key(p, CPU_CFG, hidden=wide[:, :H]),
        "hidden alignment": _key(p, CPU_CFG, hidden=wide[:, 1 : H + 1]),
        "config": _key(p, dict(CPU_CFG, GU_STAGES=3)),
        "no config": _key(p, None),
        "offset": _key(p, CPU_CFG, expert_offset=1),
        "scaling": _key(p, CPU_CFG, routed_scaling_factor=2.5),
        "static scale": _key(p, CPU_CFG, a13_scale=0.01),
        "out given": _key(p, CPU_CFG, out=torch.empty(T, H, dtype=torch.bfloat16)),
        "weights dtype": _key(p, CPU_CFG, topk_weights=p["weights"].double()),
    }
    assert None not in changed.values()
    keys = [base, *changed.values()]
    assert len(set(keys)) == len(keys), changed
    # unexpected argument types are left to the unplanned path's checks
    assert _key(p, CPU_CFG, expert_offset=1.5) is None
    assert _key(p, CPU_CFG, hidden=p["x"].tolist()) is None
    assert _key(p, dict(CPU_CFG, GU_N=[32])) is None


def test_errors_are_those_of_the_unplanned_path_with_a_plan_cached():
    cfg = _paths(True)["regular"]
    p = make_problem(T, E, H, I, K, "block-dynamic", device="cpu")
    _call(p, cfg)
    assert len(op._PLANS.plans) == 1
    bad = {
        "hidden dtype": dict(hidden=p["x"].half()),
        "hidden shape": dict(hidden=p["x"][:, :128]),
        "ids shape": dict(topk_ids=p["ids"][:, :2]),
        "config": dict(config=dict(cfg, GU_N=48)),
        "scale shape": dict(w13_scale=p["kw"]["w13_scale"][:1]),
    }
    for what, over in bad.items():
        args = dict(hidden=p["x"], topk_ids=p["ids"], config=cfg, w13_scale=p["kw"]["w13_scale"])
        args.update(over)
        rest = {k: v for k, v in p["kw"].items() if k != "w13_scale"}
        errors = []
        for enabled in (False, True):
            LP.ENABLED = enabled
            with pytest.raises(op.FusedMoEError) as info:
                op.fused_moe(
                    args["hidden"], p["w13"], p["w2"], p["weights"], args["topk_ids"],
                    w13_scale=args["w13_scale"], config=args["config"], **rest,
                )  # fmt: skip
            errors.append(str(info.value))
        assert errors[0] == errors[1], what
    assert len(op._PLANS.plans) == 1  # failed calls record nothing


def test_aliased_inputs_are_not_planned_and_stay_correct():
    """One tensor in two slots (the same per-tensor scales for w13 and w2): which slot a launch meant is
    unknown, so such calls are never planned; the output is the unplanned one."""
    cfg = _paths(False)["regular"]
    p = make_problem(T, E, H, I, K, "tensor-static", device="cpu")
    p["kw"]["w2_scale"] = p["kw"]["w13_scale"]
    want = _unplanned(p, cfg)
    assert torch.equal(_call(p, cfg), want)
    assert not op._PLANS.plans


@triton.jit
def _scale_copy_kernel(x, y, s, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y + offs, tl.load(x + offs, mask=mask) * tl.load(s), mask=mask)


def _record_copy(x, y, s, tmp=None):
    rec = LP.Recorder()
    with LP.recording(rec):
        w = LP.empty(x.numel(), dtype=torch.float32, device=x.device)
        LP.launch(_scale_copy_kernel, (2,))(x, w, s, x.numel(), BLOCK=16)
        LP.launch(_scale_copy_kernel, (2,))(w, y, s if tmp is None else tmp, x.numel(), BLOCK=16)
        LP.set_io((x, y, s))
    return rec.finish()


def test_recorder_binds_slots_and_refuses_untracked_temporaries():
    x, y, s = torch.randn(20), torch.empty(20), torch.tensor([2.0])
    plan = _record_copy(x, y, s)
    assert plan is not None and len(plan.steps) == 2 and torch.equal(y, x * 4)
    x2, y2, s2 = torch.randn(20), torch.empty(20), torch.tensor([3.0])
    plan.run((x2, y2, s2), 0, False)
    assert torch.equal(y2, x2 * 3 * 3)
    (kept_ws,) = plan.ws
    assert torch.equal(kept_ws, x2 * 3)  # replays reuse the recording call's workspace
    # inside a graph capture a replay takes buffers of its own (the graph's), never the kept ones
    x3, y3 = torch.randn(20), torch.empty(20)
    plan.run((x3, y3, s2), 0, True)
    assert torch.equal(y3, x3 * 3 * 3) and torch.equal(kept_ws, x2 * 3)
    # a per-call tensor the plan could not rebuild: no plan
    assert _record_copy(x, y, s, tmp=torch.tensor([1.0])) is None
    # a kept (process-lifetime) buffer is a fixed argument
    kept = LP.keep(torch.tensor([0.5]))
    plan = _record_copy(x, y, s, tmp=kept)
    plan.run((x2, y2, s2), 0, False)
    assert torch.equal(y2, x2 * 3 * 0.5)


def test_plan_cache_drops_least_recently_used_plans_within_the_workspace_budget(monkeypatch):
    cache = LP.PlanCache()
    monkeypatch.setattr(LP, "WS_TOTAL_BYTES", 3 * 80)
    plans = []
    for key in range(4):
        rec = LP.Recorder()
        with LP.recording(rec):
            LP.empty(20, dtype=torch.float32, device="cpu")  # 80 bytes
            LP.set_io(())
        plans.append(rec.finish())
        cache.put(key, plans[-1])
        if key == 1:
            assert cache.get(0) is plans[0]  # 0 is now more recent than 1
    assert set(cache.plans) == {0, 2, 3} and cache.kept_bytes == 240


# --------------------------------------------------------------------------------------------------
# GPU: the tuned configs of the three paths at real shapes (H200)

GPU_POINTS = [  # (shape, T, path the tuned table sends it to)
    ("deepseek-v3-ep8", 1, "small"),
    ("hy3", 1, "small"),
    ("hy3-tp8", 4, "small"),  # T = 16 runs the regular path since decode round 5 (DN_TILES)
    ("qwen3-235b", 128, "regular"),
    ("hy3-tp8", 128, "regular"),  # TMA weight tiles (host tensor descriptors rebuilt per call)
]


def _gpu_case(shape: str, t: int):
    from hpc_advise.runtime.measure.cases import fused_moe as fb

    e, h, i, k, eg, off = fb.SHAPES[shape]
    mode = fb.MODES[shape][0]
    wts = [fb.make_weights(e, h, i, mode, seed=s) for s in (0, 1)]  # two layers
    kws = [fb._kwargs(w, mode, off) for w in wts]
    routings = fb.make_routings(t, k, eg, h, 2)
    return wts, kws, routings


def _gpu_call(w, kw, r, out=None):
    return op.fused_moe(r["x"], w["w13"], w["w2"], r["w"], r["ids"], out=out, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,t,path", GPU_POINTS)
def test_gpu_plan_bitwise_the_unplanned_call_at_real_shapes(shape, t, path):
    from hpc_advise.runtime.measure.cases import fused_moe as fb

    wts, kws, routings = _gpu_case(shape, t)
    e, h, i, k, _, _ = fb.SHAPES[shape]
    mode = fb.MODES[shape][0]
    cfg = op.get_config(t, k, e, h, i, mode, mode.endswith("dynamic"))
    assert cfg.get("PATH", "regular") == path, cfg
    cases = [(0, 0), (1, 1), (0, 1), (1, 0)]  # (layer, routing)
    LP.ENABLED = False
    want = [_gpu_call(wts[a], kws[a], routings[b]) for a, b in cases]
    LP.ENABLED = True
    got = [_gpu_call(wts[a], kws[a], routings[b]) for a, b in cases]
    torch.cuda.synchronize()
    assert op._PLANS.records == 1 and op._PLANS.hits == 3
    for j, (a, b) in enumerate(cases):
        assert torch.equal(got[j], want[j]), (shape, t, a, b)
    assert not torch.equal(want[0], want[1])


def _gpu_wants(shape: str, t: int):
    wts, kws, routings = _gpu_case(shape, t)
    LP.ENABLED = False
    wants = [_gpu_call(wts[0], kws[0], r) for r in routings]
    LP.ENABLED = True
    return wts[0], kws[0], routings, wants


def _replays_match(graph, static, out, cases):
    """Each (routing, want) of ``cases``: the routing copied into the graph's static inputs, ``out`` poisoned
    with NaN, one replay, and ``out`` bitwise ``want``."""
    for r, want in cases:
        static["x"].copy_(r["x"]), static["w"].copy_(r["w"]), static["ids"].copy_(r["ids"])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,t", [("deepseek-v3-ep8", 1), ("hy3-tp8", 16), ("hy3-tp8", 128)])
def test_gpu_graph_capture_with_a_cached_plan(shape, t):
    """A plan recorded eagerly on the capture stream is replayed inside a CUDA-graph capture with buffers
    of its own (the graph keeps them): while eager calls reuse the plans' kept buffers, the graph's
    replays with new routing match the unplanned call."""
    w, kw, (r0, r1), (want0, want1) = _gpu_wants(shape, t)
    static = dict(x=r0["x"].clone(), w=r0["w"].clone(), ids=r0["ids"].clone())
    out = torch.empty_like(want0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _gpu_call(w, kw, static, out)  # records the plan of the side stream
        _gpu_call(w, kw, static, out)  # replays it with its kept buffers
    torch.cuda.current_stream().wait_stream(side)
    assert (op._PLANS.records, op._PLANS.hits) == (1, 1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        _gpu_call(w, kw, static, out)
    assert (op._PLANS.records, op._PLANS.hits) == (1, 2)  # the capture replayed the cached plan
    with torch.cuda.stream(side):
        eager = _gpu_call(w, kw, r1)  # the side stream's kept buffers (the graph holds its own)
    torch.cuda.synchronize()  # the graph shares the side stream's arrival counters (op_small._counters)
    _replays_match(graph, static, out, ((r1, want1), (r0, want0)))
    assert torch.equal(eager, want1)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,t", [("deepseek-v3-ep8", 1), ("hy3-tp8", 128)])
def test_gpu_capture_graph_same_stream_replays_the_warmup_plan(shape, t):
    """benchmarking.capture_graph(same_stream=True), as the tuner's --launch-overhead times a call: the
    warm-up records the side stream's plan, the capture on that stream replays it (one record, one hit),
    and graph replays with new routing give the unplanned call's output bitwise."""
    from hpc_advise.runtime.measure.harness import capture_graph

    w, kw, (r0, r1), (want0, want1) = _gpu_wants(shape, t)
    static = dict(x=r0["x"].clone(), w=r0["w"].clone(), ids=r0["ids"].clone())
    out = torch.empty_like(want0)
    graph = capture_graph(lambda: _gpu_call(w, kw, static, out), same_stream=True)
    assert (op._PLANS.records, op._PLANS.hits) == (1, 1)
    _replays_match(graph, static, out, ((r1, want1), (r0, want0)))


@pytest.mark.gpu
@pytest.mark.parametrize("shape,t", [("hy3-tp8", 16), ("hy3-tp8", 128)])
def test_gpu_two_streams_get_their_own_plans(shape, t):
    """Calls on two streams at once: a plan (and kept buffers) per stream, every output bitwise the
    unplanned one. (Not the persistent path: its grid must be co-resident, so two of its launches must
    never run at once on two streams, with plans or without.)"""
    w, kw, (r0, r1), (want0, want1) = _gpu_wants(shape, t)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for s in (s1, s2):
        s.wait_stream(torch.cuda.current_stream())
    outs = []
    for _ in range(3):
        with torch.cuda.stream(s1):
            outs.append((_gpu_call(w, kw, r0), want0))
        with torch.cuda.stream(s2):
            outs.append((_gpu_call(w, kw, r1), want1))
    torch.cuda.synchronize()
    assert (op._PLANS.records, op._PLANS.hits) == (2, 4)
    for got, want in outs:
        assert torch.equal(got, want)
