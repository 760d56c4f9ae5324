"""Tests of the FP8 fused MoE's regular path (hpc_advise.kernels.fused_moe.op / kernel.py).

On CPU the Triton kernels run under TRITON_INTERPRET=1 at small sizes; ``gpu``-marked tests run the
real model shapes on the H200. Conventions and tolerances: helpers.py. The shipped forms (every
configs.json entry) are covered bitwise by test_goldens.py; the tests here check behaviour against the
reference: routing, odd shapes, EP ranks, errors, graph capture, the sm_90a builds.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.fused_moe import op  # noqa: E402
from hpc_advise.kernels.fused_moe.op import FusedMoEError, fused_moe, moe_unfused  # noqa: E402
from hpc_advise.kernels.fused_moe.reference import (  # noqa: E402
    _quant_dequant,
    dequantize_weight,
    fused_moe_reference,
    moe_align_reference,
    moe_float_reference,
)
from tests.kernels.fp8_midpoint import near_midpoint_flips  # noqa: E402
from tests.kernels.fused_moe.helpers import (  # noqa: E402
    CPU_CFG,
    MODES,
    REL_TOL_FLOAT_REF,
    REL_TOL_QUANT_REF,
    check_graph_replay,
    device_scales,
    fresh_seed,
    make_problem,
    rel_err,
    run_and_check,
)
from tests.kernels.sm90_compile import compile_sm90  # noqa: E402


def test_checker_forgives_one_fp8_step_at_a_midpoint_and_nothing_more():
    """run_and_check's second look, on outputs made from the reference (no kernel). The static a2 scale
    is chosen so that one h element lands on the midpoint of e4m3's 8 and 9: one step there (12% of
    the element) fails the first look and passes the second; two steps, or a 3% scale error, fail."""
    seed = fresh_seed()
    for _ in range(20):  # one draw nearly always has an element whose step is that visible
        p = make_problem(1, 1, 128, 16, 1, "tensor-static", device="cpu")
        kw = p["kw"]
        gu = (
            _quant_dequant(p["x"].float(), kw["a13_scale"])
            @ dequantize_weight(p["w13"], kw["w13_scale"])[0].t()
        )
        h = (torch.nn.functional.silu(gu[:, :16]) * gu[:, 16:])[0]
        j = int((h.abs() * dequantize_weight(p["w2"], kw["w2_scale"])[0].norm(dim=0)).argmax())
        kw["a2_scale"] = float(h[j].abs()) / 8.5
        ref = fused_moe_reference(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], **kw)
        big = [d for _, d in near_midpoint_flips(p, 1.0) if d.norm() > 1.2 * REL_TOL_QUANT_REF * ref.norm()]
        if big:
            break
    else:
        pytest.fail(f"no h element with a visible fp8 step in 20 draws (seed {seed})")

    def returns(value):
        def fn(*args, out, **kw):
            return out.copy_(value)

        return fn

    run_and_check(p, fn=returns(ref + big[0]), seed=seed)
    for wrong in (ref + 2 * big[0], ref * 1.03):
        with pytest.raises(AssertionError, match="rel err"):
            run_and_check(p, fn=returns(wrong), seed=seed)


# ---------------------------------------------------------------------------------------------
# routing preprocessing


@pytest.mark.parametrize("multi", [False, True], ids=["single-cta", "multi-cta"])
@pytest.mark.parametrize(
    "t,num_experts,top_k,offset,global_experts",
    [(1, 8, 2, 0, 8), (7, 6, 3, 0, 6), (33, 16, 4, 4, 24), (5, 4, 2, 0, 4)],
)
def test_router_matches_torch_reference(t, num_experts, top_k, offset, global_experts, multi, monkeypatch):
    """Single-CTA router (decode) and the multi-CTA one (kernel_route.py, prefill; here forced on with
    16-entry chunks so that T = 33, k = 4 spreads over 9 chunks with a ragged last one)."""
    if multi:
        monkeypatch.setattr(op, "ROUTE_MULTI_MIN_ENTRIES", 1)
        monkeypatch.setattr(op, "ROUTE_CHUNK", 16)
    seed = fresh_seed()
    ids = torch.randint(-1, global_experts, (t, top_k), dtype=torch.int32)
    p = make_problem(
        t, num_experts, 128, 64, top_k, "tensor-static", ids=ids, expert_offset=offset, device="cpu"
    )
    launch = op._Launch(
        p["x"],
        p["w13"],
        p["w2"],
        p["weights"],
        p["ids"],
        p["kw"]["w13_scale"],
        p["kw"]["w2_scale"],
        p["kw"]["a13_scale"],
        p["kw"]["a2_scale"],
        None,
        offset,
        CPU_CFG,
    )
    assert bool(launch.route_chunks) == multi
    launch.sorted_ids.fill_(-7)
    launch.block_expert.fill_(-7)
    launch.prep(p["x"])
    s_ref, b_ref, n_ref = moe_align_reference(ids, num_experts, offset, 16, launch.P)
    assert launch.num_padded.tolist() == n_ref.tolist(), seed
    assert launch.block_expert.tolist() == b_ref.tolist(), seed
    # same entries per block (the Triton router's order inside an expert is not fixed)
    got = launch.sorted_ids.view(-1, 16).sort(dim=1).values
    want = s_ref.view(-1, 16).sort(dim=1).values
    assert torch.equal(got, want), seed
    # every local entry appears exactly once
    local = ids.reshape(-1).long() - offset
    n_local = int(((local >= 0) & (local < num_experts)).sum())
    assert int((launch.sorted_ids < t * top_k).sum()) == n_local


# ---------------------------------------------------------------------------------------------
# the layer vs the reference (CPU interpreter, small shapes)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("t", [1, 3, 20])
def test_fused_moe_matches_reference(mode, t):
    seed = fresh_seed()
    p = make_problem(t, 6, 256, 128, 2, mode, device="cpu")
    cfg = dict(CPU_CFG, GU_N=128) if not MODES[mode][1] else CPU_CFG
    run_and_check(p, config=cfg, scaling=1.0 if t != 3 else 2.5, seed=seed)


@pytest.mark.parametrize("mode", ["tensor-static", "block-dynamic"])
def test_split_k_and_odd_intermediate(mode):
    """I = 192 (a TP shard that is not a multiple of 128: partial scale groups), H = 384 with a 64-wide
    K step (two steps per scale group), split-K 3 through the act-quant kernel."""
    seed = fresh_seed()
    p = make_problem(5, 4, 384, 192, 3, mode, device="cpu")
    cfg = dict(CPU_CFG, SPLIT_K=3, GU_K=64, DN_K=64)
    run_and_check(p, config=cfg, seed=seed)


PREFILL_CFG = dict(  # prefill tile shapes at interpreter sizes: BLOCK_M 64, merged gate|up N = 256
    CPU_CFG, BLOCK_M=64, GU_N=128, DN_N=128, GU_GROUP_M=4, DN_GROUP_M=4, GU_WARPS=8, DN_WARPS=8
)


@pytest.mark.parametrize(
    "mode,extra",
    [
        ("block-dynamic", {}),
        ("tensor-static", {}),  # fp32 promotion every BLOCK_K: two dots (TWO_DOTS)
        ("tensor-static", {"DN_N": 256}),  # 256-wide down tiles
        ("tensor-dynamic", {}),
        ("block-static", {"GU_K": 64, "DN_K": 64}),  # two K steps per scale group
    ],
)
def test_prefill_tiles_ragged_and_empty_experts(mode, extra, monkeypatch):
    """Prefill configs with the multi-CTA router: experts with 0, 1, a few and more than BLOCK_M rows
    (ragged runs padded to BLOCK_M), an EP slot of another rank."""
    monkeypatch.setattr(op, "ROUTE_MULTI_MIN_ENTRIES", 1)
    monkeypatch.setattr(op, "ROUTE_CHUNK", 32)
    seed = fresh_seed()
    t, k, e = 45, 3, 6
    ids = torch.randint(1, e, (t, k), dtype=torch.int32)
    ids[:, 0] = 4  # expert 4: 45+ rows (more than one 64-row block with the others)
    ids[:, 1] = torch.where(torch.arange(t) % 2 == 0, 2, 5).to(torch.int32)
    ids[:, 2] = 3
    ids[0, 2] = 1  # expert 1: exactly one row; expert 0: none
    ids[1, 2] = -1  # slot on another EP rank
    p = make_problem(t, e, 256, 256, k, mode, ids=ids, device="cpu")
    run_and_check(p, config=dict(PREFILL_CFG, **extra), scaling=1.5, seed=seed)


def test_routing_edge_cases():
    """Empty experts, an expert with one token, one expert taking every token, -1 ids."""
    seed = fresh_seed()
    t, k = 9, 2
    ids = torch.full((t, k), 5, dtype=torch.int32)  # expert 5 takes every token
    ids[:, 1] = -1  # slot of another EP rank
    ids[0, 1] = 2  # expert 2 gets exactly one token
    p = make_problem(t, 8, 128, 64, k, "block-dynamic", ids=ids, device="cpu")
    run_and_check(p, config=dict(CPU_CFG, GU_N=128), seed=seed)


def test_expert_parallel_rank_without_local_tokens():
    seed = fresh_seed()
    ids = torch.randint(0, 8, (4, 2), dtype=torch.int32)  # all on experts 0..7, this rank has 8..11
    p = make_problem(4, 4, 128, 64, 2, "tensor-static", ids=ids, expert_offset=8, device="cpu")
    out, _, _ = run_and_check(p, config=CPU_CFG, seed=seed)
    assert (out == 0).all()


def test_expert_parallel_offset_and_tokens_without_local_slots():
    seed = fresh_seed()
    p = make_problem(12, 4, 128, 64, 3, "block-dynamic", global_experts=16, expert_offset=4, device="cpu")
    p["ids"][0] = torch.tensor([0, 1, 15], dtype=torch.int32)  # token 0: no local slot → zeros
    out, _, _ = run_and_check(p, config=dict(CPU_CFG, GU_N=128), seed=seed)
    assert (out[0] == 0).all()


def test_unfused_variant_matches_reference():
    seed = fresh_seed()
    p = make_problem(6, 4, 256, 128, 2, "block-dynamic", device="cpu")
    run_and_check(p, config=dict(CPU_CFG, GU_N=128), fn=moe_unfused, seed=seed)
    p = make_problem(6, 4, 256, 128, 2, "tensor-static", device="cpu")
    run_and_check(p, config=CPU_CFG, fn=moe_unfused, seed=seed)


def test_error_against_unquantized_math_is_reported():
    seed = fresh_seed()
    p = make_problem(8, 4, 256, 128, 2, "block-dynamic", device="cpu")
    out, ref, err_q = run_and_check(p, config=dict(CPU_CFG, GU_N=128), seed=seed)
    ref_f = moe_float_reference(p["x"], p["w13f"], p["w2f"], p["weights"], p["ids"])
    err_f = rel_err(out, ref_f)
    print(f"rel err vs quantized reference {err_q:.2e}, vs unquantized fp32 {err_f:.2e}")
    assert err_f <= REL_TOL_FLOAT_REF, seed


def test_empty_batch():
    p = make_problem(0, 4, 128, 64, 2, "tensor-static", device="cpu")
    out = fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], config=CPU_CFG, **p["kw"])
    assert out.shape == (0, 128)


def test_bad_inputs_raise_clear_errors():
    p = make_problem(2, 4, 128, 64, 2, "block-dynamic", device="cpu")
    args = (p["x"], p["w13"], p["w2"], p["weights"], p["ids"])
    with pytest.raises(FusedMoEError, match="bf16"):
        fused_moe(p["x"].float(), *args[1:], **p["kw"])
    bad = dict(p["kw"], w13_scale=p["kw"]["w13_scale"][1:])
    with pytest.raises(FusedMoEError, match="block scales"):
        fused_moe(*args, **bad)
    with pytest.raises(FusedMoEError, match="128x128"):
        fused_moe(*args, **dict(p["kw"], block_shape=(64, 64)))
    with pytest.raises(FusedMoEError, match="GU_N == 128"):
        fused_moe(*args, config=dict(CPU_CFG, GU_N=32), **p["kw"])
    with pytest.raises(FusedMoEError, match="float8_e4m3fn"):
        fused_moe(p["x"], p["w13"].float(), *args[2:], **p["kw"])


def test_host_scale_inside_graph_capture_raises_fake_capture(monkeypatch):
    """A static activation scale given as a host number needs a host-to-GPU copy, which a CUDA-graph
    capture forbids: op refuses it by name before any copy. The capture state is faked (no GPU in CI);
    the GPU test below captures for real."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    for value in (0.5, torch.tensor([0.5])):  # a float, and a tensor on the wrong device
        with pytest.raises(FusedMoEError, match="a13_scale is a host value inside a CUDA-graph capture"):
            op._scale_tensor(value, "a13_scale", torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert op._scale_tensor(0.5, "a13_scale", torch.device("cpu")).tolist() == [0.5]


@pytest.mark.gpu
def test_gpu_host_scale_inside_graph_capture_raises():
    p = make_problem(4, 192, 4096, 192, 8, "tensor-static", device="cuda")
    assert isinstance(p["kw"]["a13_scale"], float)
    call = lambda: fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], **p["kw"])
    call()  # eager: the host scale is copied, fine
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(FusedMoEError, match="a13_scale is a host value"):
        with torch.cuda.graph(graph):
            call()
    # with device scales the same call captures and replays
    kw = device_scales(p["kw"])
    out = fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], **kw)
    static = torch.empty_like(out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=static, **kw)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static, out)


def test_configs_json_entries_are_valid():
    data = json.loads(op.CONFIG_PATH.read_text())
    for entry in data["entries"]:
        assert {"E", "H", "I", "top_k", "mode", "T", "config"} <= set(entry)
        op.check_config(dict(entry["config"]), entry["mode"].endswith("dynamic"))


def test_default_config_spreads_decode_over_the_sms():
    cfg = op.default_config(1, 8, 192, 4096, 192, a2_group=False)  # Hy3 TP8 shard, T = 1
    tiles = 8 * -(-192 // cfg["GU_N"]) * cfg["SPLIT_K"]
    assert tiles >= op.NUM_SMS_H200
    cfg = op.default_config(4096, 8, 192, 4096, 1536, a2_group=True)
    assert cfg["BLOCK_M"] >= 64 and cfg["SPLIT_K"] == 1


def test_default_config_between_decode_and_prefill_takes_the_tuned_picks_block_rows():
    """256 < T·top_k <= 2048 (few tokens per expert): the untuned default has the block rows and grouping
    of every tuned regular-path pick in that range, so an untuned shape does not pad each expert to 64 rows."""
    picks = [
        e
        for e in json.loads(op.CONFIG_PATH.read_text())["entries"]
        if 256 < e["T"] * e["top_k"] <= 2048 and e["config"].get("PATH") != "small"
    ]
    assert len(picks) >= 8
    for e in picks:
        cfg = op.default_config(e["T"], e["top_k"], e["E"], e["H"], e["I"], e["mode"].endswith("dynamic"))
        for key in ("BLOCK_M", "GU_GROUP_M", "DN_GROUP_M"):
            assert cfg[key] == e["config"][key], (key, e["E"], e["I"], e["T"])


# ---------------------------------------------------------------------------------------------
# real shapes on the GPU

GPU_SHAPES = {  # name -> (E local, H, I, top_k, global experts, expert offset)
    "hy3": (192, 4096, 1536, 8, 192, 0),
    "hy3-tp8": (192, 4096, 192, 8, 192, 0),
    "deepseek-v3-ep8": (32, 7168, 2048, 8, 256, 64),
}


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(GPU_SHAPES))
@pytest.mark.parametrize("mode", ["tensor-static", "block-dynamic"])
@pytest.mark.parametrize("t", [1, 3, 1000])
def test_gpu_real_shapes(shape, mode, t):
    seed = fresh_seed()
    e, h, i, k, ge, off = GPU_SHAPES[shape]
    p = make_problem(t, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off)
    out, ref, err = run_and_check(p, scaling=2.5, seed=seed)
    ref_f = moe_float_reference(
        p["x"], p["w13f"], p["w2f"], p["weights"], p["ids"], expert_offset=off, routed_scaling_factor=2.5
    )
    err_f = rel_err(out, ref_f) if ref_f.abs().max() > 0 else 0.0
    print(f"{shape} {mode} T={t}: rel err vs quantized ref {err:.2e}, vs unquantized {err_f:.2e}")
    assert err_f <= REL_TOL_FLOAT_REF


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["block-dynamic", "tensor-dynamic"])
@pytest.mark.parametrize("t", [1, 3, 8, 32, 128, 200])
def test_gpu_deepseek_v3_tp8_rank_with_the_fused_shared_expert(mode, t):
    """DeepSeek-V3's TP8 rank as SGLang runs it: 257 experts of width 256, the shared one fused in last and
    taken by every token as its ninth; every tuned T regime of both modes it is tuned in (configs.json)."""
    seed = fresh_seed()
    e, h, i, k = 257, 7168, 256, 9
    routed = torch.rand(t, e - 1, device="cuda").topk(k - 1, dim=1).indices
    ids = torch.cat([routed, torch.full((t, 1), e - 1, device="cuda")], dim=1).to(torch.int32)
    p = make_problem(t, e, h, i, k, mode, device="cuda", ids=ids)
    out, _, err = run_and_check(p, scaling=2.5, seed=seed)
    ref_f = moe_float_reference(
        p["x"], p["w13f"], p["w2f"], p["weights"], p["ids"], routed_scaling_factor=2.5
    )
    err_f = rel_err(out, ref_f)
    print(f"deepseek-v3-tp8 {mode} T={t}: rel err vs quantized ref {err:.2e}, vs unquantized {err_f:.2e}")
    assert err_f <= REL_TOL_FLOAT_REF


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["block-dynamic", "tensor-static"])
def test_gpu_untuned_shape_between_decode_and_prefill(mode):
    """A shape with no configs.json entry (Qwen3-235B's EP4 rank: 32 of 128 experts) at T = 40, T*top_k = 320:
    ``default_config``'s middle branch, 16-row blocks."""
    seed = fresh_seed()
    e, h, i, k, ge, off, t = 32, 4096, 1536, 8, 128, 32, 40
    assert not any(
        x["E"] == e and x["H"] == h and x["I"] == i for x in json.loads(op.CONFIG_PATH.read_text())["entries"]
    )
    p = make_problem(t, e, h, i, k, mode, device="cuda", global_experts=ge, expert_offset=off)
    run_and_check(p, scaling=2.5, seed=seed)


@pytest.mark.gpu
def test_gpu_one_expert_takes_every_token_and_graph_capture():
    seed = fresh_seed()
    t, k = 1000, 8
    ids = torch.full((t, k), -1, dtype=torch.int32, device="cuda")
    ids[:, 0] = 7
    ids[:3, 1] = 11  # expert with few tokens
    p = make_problem(t, 192, 4096, 1536, k, "block-dynamic", device="cuda", ids=ids)
    out, _, _ = run_and_check(p, seed=seed)
    # the whole call replays from a CUDA graph with fresh routing written into the same buffers
    static_out = torch.empty_like(out)
    call = lambda: fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=static_out, **p["kw"])
    check_graph_replay(p, call, static_out, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("t,split", [(1, 4), (16, 1), (128, 1)])
def test_gpu_programmatic_launches_give_the_same_output_and_replay(t, split):
    """PDL = 1 (every launch of the regular path a programmatic dependent launch, griddepcontrol.wait
    before its first read): bitwise the output of the plain launches, at DeepSeek-V3 EP8's shape
    (split-K: five launches), and captured in a CUDA graph with fresh routing."""
    seed = fresh_seed()
    e, h, i, k, ge, off = 32, 7168, 2048, 8, 256, 64
    p = make_problem(t, e, h, i, k, "block-dynamic", device="cuda", global_experts=ge, expert_offset=off)
    base = dict(op.default_config(t, k, e, h, i, True), SPLIT_K=split)
    plain, _, _ = run_and_check(p, config=base, seed=seed)
    cfg = dict(base, PDL=1)
    pdl, _, _ = run_and_check(p, config=cfg, seed=seed)
    assert torch.equal(plain, pdl), seed
    out = torch.empty_like(plain)
    call = lambda: fused_moe(
        p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=out, config=cfg, **p["kw"]
    )
    # two calls back to back in the graph: the second call's first launch overlaps the first call's last
    check_graph_replay(p, call, out, seed=seed, replays=2, capture_calls=2)


@pytest.mark.gpu
def test_gpu_prefill_multi_cta_router_gives_the_same_output(monkeypatch):
    """T = 4096 (32768 entries): the multi-CTA router and the single-CTA one order entries inside an
    expert differently, yet every output row depends only on its own rows, so the layer's output must
    be bitwise identical."""
    seed = fresh_seed()
    p = make_problem(4096, 128, 2048, 768, 8, "block-dynamic", device="cuda")
    outs = []
    for threshold in (1 << 62, 1):
        monkeypatch.setattr(op, "ROUTE_MULTI_MIN_ENTRIES", threshold)
        out, _, _ = run_and_check(p, seed=seed)
        outs.append(out)
    assert torch.equal(outs[0], outs[1]), seed


@pytest.mark.gpu
def test_gpu_unfused_variant_matches_reference():
    seed = fresh_seed()
    p = make_problem(64, 128, 2048, 768, 8, "block-dynamic", device="cuda")
    run_and_check(p, fn=moe_unfused, seed=seed)


def test_tuned_configs_apply_only_near_their_t(tmp_path, monkeypatch):
    tuned = dict(CPU_CFG, GU_N=64, SPLIT_K=3)
    path = tmp_path / "configs.json"
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "entries": [
                    {
                        "E": 8,
                        "H": 512,
                        "I": 256,
                        "top_k": 2,
                        "mode": "tensor-static",
                        "T": 16,
                        "config": tuned,
                    }
                ],
            }
        )
    )
    monkeypatch.setattr(op, "CONFIG_PATH", path)
    op._config_table.cache_clear()
    try:
        assert op.get_config(16, 2, 8, 512, 256, "tensor-static", False) == tuned
        assert op.get_config(9, 2, 8, 512, 256, "tensor-static", False) == tuned
        far = op.get_config(4096, 2, 8, 512, 256, "tensor-static", False)
        assert far == op.default_config(4096, 2, 8, 512, 256, False)
        other_mode = op.get_config(16, 2, 8, 512, 256, "block-dynamic", True)
        assert other_mode == op.default_config(16, 2, 8, 512, 256, True)
    finally:
        op._config_table.cache_clear()


# ---------------------------------------------------------------------------------------------
# the kernels compile for SM90 (ptxas ships with triton; no GPU needed). The interpreter does not
# compile, so without this a kernel could pass every CPU test and fail to build on the H200.

# Triton types of each kernel's non-constexpr arguments, in order (tests/kernels/sm90_compile.py).
SM90_TYPES = {
    "_prep_kernel": "*i32 i32 i32 i32 *i32 *i32 *i32 *i32 i32 *bf16 *fp8e4nv *fp32 *fp32 i32 i32 i32 "
    "i32 i32 *bf16 i32",
    "_gate_up_kernel": "*fp8e4nv *fp32 *fp32 *fp8e4nv *fp32 *i32 *i32 *i32 *fp8e4nv *fp32 *fp32 "
    + "i32 " * 9,
    "_act_quant_kernel": "*fp32 *i32 *i32 *fp8e4nv *fp32 *fp32 i32 i32",
    "_down_kernel": "*fp8e4nv *fp32 *fp32 *fp8e4nv *fp32 *i32 *i32 *i32 *fp32 *bf16 i32 i32 i32 i32 "
    "fp32 i32 i32 i32 i32 *i32 *i32 *bf16 i32 i32 i32 i32",
    "_reduce_kernel": "*bf16 *i32 *bf16 i32 i32 i32 i32 i32",
}
SM90_ALIGNED = ["H", "I", "stride_we", "stride_wn", "stride_x", "stride_out"]  # multiples of 16 here


def _sm90_job(name: str, consts: dict, warps: int, stages: int) -> list:
    from hpc_advise.kernels.fused_moe import kernel as K

    consts = dict(consts, USE_PDL=consts.get("USE_PDL", False))
    if name in ("_gate_up_kernel", "_down_kernel"):
        consts.setdefault("BLOCK_EXIT", False)
    if name == "_prep_kernel":
        consts = dict(dict(RANKED=False, CHUNK=64), **consts)
    types = SM90_TYPES[name].split()
    if name == "_gate_up_kernel" and consts["OUT_MODE"] == 1:  # split-K partials are fp32
        args = [a for a in getattr(K, name).arg_names if a not in consts]
        types[args.index("out_ptr")] = "*fp32"
    if name in ("_gate_up_kernel", "_down_kernel"):
        consts.setdefault("W_SCALAR", False)
        if consts.setdefault("W_TMA", False):  # weights by TMA: a 4-D descriptor [1, halves, N, K]
            halves = 1 if name == "_down_kernel" or consts["TWO_DOTS"] else 2
            types.append(f"tensordesc<fp8e4nv[1,{halves},{consts['BLOCK_N']},{consts['BLOCK_K']}]>")
        else:
            consts["w_desc"] = None
    if name == "_down_kernel":
        if consts.setdefault("A_TMA", False):  # the intermediate by TMA: [BLOCK_M, BLOCK_K] blocks
            types.append(f"tensordesc<fp8e4nv[{consts['BLOCK_M']},{consts['BLOCK_K']}]>")
        else:
            consts["a_desc"] = None
    return ["hpc_advise.kernels.fused_moe.kernel", name, " ".join(types), consts, warps, stages, SM90_ALIGNED]


# constexprs of the regular GEMMs' sm_90a builds at the block-scaled prefill tile (BLOCK_M 64, merged gate|up
# dot, 128-wide K steps); every compile test of the fused MoE files derives its tiles from these two
SM90_GATE_UP = dict(
    BLOCK_M=64,
    BLOCK_N=128,
    BLOCK_K=128,
    GROUP_M=8,
    SPLIT_K=1,
    A_GROUP=True,
    W_BLOCK=True,
    A2_GROUP=True,
    OUT_MODE=0,
    EVEN_K=True,
    TWO_DOTS=False,
)
SM90_DOWN = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, A_GROUP=True, W_BLOCK=True, EVEN_K=True)


@pytest.mark.slow
def test_kernels_compile_for_sm90_with_pipelined_loads():
    per_tensor = dict(A_GROUP=False, W_BLOCK=False, A2_GROUP=False, TWO_DOTS=True)
    gu = dict(SM90_GATE_UP, BLOCK_M=16, BLOCK_N=32, GROUP_M=1, **per_tensor)
    jobs = [
        ["_prep_kernel", dict(BLOCK_M=16, E_PAD=256, ROUTE_BLK=256, QROWS=16, GROUP=128, A_GROUP=True), 4, 3],
        ["_gate_up_kernel", gu, 4, 4],
        [
            "_gate_up_kernel",
            dict(
                gu,
                BLOCK_N=128,
                SPLIT_K=2,
                A_GROUP=True,
                W_BLOCK=True,
                A2_GROUP=True,
                OUT_MODE=1,
                TWO_DOTS=False,
            ),
            4,
            4,
        ],
        ["_act_quant_kernel", dict(BLOCK_M=16, SPLIT_K=2, A2_GROUP=True), 4, 3],
        ["_down_kernel", dict(SM90_DOWN, EVEN_K=False), 4, 4],
        ["_reduce_kernel", dict(BLOCK_H=1024), 4, 3],
    ]
    # programmatic dependent launches (config PDL = 1): griddepcontrol in every launch of the path
    jobs += [[name, dict(consts, USE_PDL=True), w, st] for name, consts, w, st in jobs]
    res = compile_sm90([_sm90_job(*job) for job in jobs])
    gemms = [r for r in res if r["kernel"] in ("_gate_up_kernel", "_down_kernel")]
    assert gemms and all(r["async_copies"] > 0 for r in gemms), res  # software-pipelined
    assert res[4]["wgmma"] > 0, res  # the down kernel at BLOCK_M 64: Hopper wgmma, not mma.sync


@pytest.mark.slow
def test_prefill_gemm_tiles_compile_without_register_spills():
    """The prefill tiles the tuner chooses from keep their accumulators in registers on sm_90a: the old
    block-scaled gate/up tile (BLOCK_M 128, two accumulators + two fresh partial products) spilled
    ~300 bytes per thread (local-memory traffic in every K step) and ran at 11-13% of the fp8 rate."""
    gu, dn = SM90_GATE_UP, SM90_DOWN
    static = dict(gu, BLOCK_M=128, A_GROUP=False, W_BLOCK=False, A2_GROUP=False)
    dn_static = dict(dn, BLOCK_M=128, A_GROUP=False, W_BLOCK=False)
    jobs = [
        ["_gate_up_kernel", gu, 8, 3],  # block scales, one merged N = 256 dot
        ["_gate_up_kernel", dict(static, TWO_DOTS=True), 8, 4],  # per-tensor, fp32 promotion
        ["_down_kernel", dn, 8, 3],
        ["_down_kernel", dict(dn, BLOCK_N=256), 8, 3],
        ["_down_kernel", dn_static, 8, 4],
    ]
    res = compile_sm90([_sm90_job(*job) for job in jobs])
    for job, r in zip(jobs, res, strict=True):
        assert r["stack"] == 0 and r["wgmma"] > 0 and r["async_copies"] > 0, (job, r)
