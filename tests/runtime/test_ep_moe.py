"""Expert-parallel and tensor-parallel MoE (hpc_advise.runtime.ep_moe) at world size 2.

CPU: two real gloo processes (hpc_advise.runtime.measure.dist_run, FileStore rendezvous) run every case once;
the local experts are the torch references (the Triton interpreter is too slow for this), so:
- with unquantized fp32 experts (``moe_float_reference``) EP and TP must equal the single-process
  layer over all experts up to fp32 summation order (REL_TOL_SUM_ORDER);
- with the fp8 reference (``fused_moe_reference``, the same activation quantization as our kernel)
  they must stay within the fused op's bound (REL_TOL_QUANT_REF, kernel README "Tolerances": a
  different fp32 summation order can move an h element across an e4m3 rounding midpoint).
Cases: uneven token counts, T = 1, a rank that receives no rows, a rank without tokens, ids = -1
(a token with no expert at all gets zeros), invalid ids (every rank raises, none hangs).
GPU (``gpu``): NCCL on two GPUs with our fused FP8 op at the Hy3 and DeepSeek-V3 shapes.
Fresh inputs each run; HPC_ADVISE_TEST_SEED=N replays a seed printed in a failure message.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from hpc_advise.kernels.fused_moe.reference import (  # noqa: E402
    fused_moe_reference,
    moe_float_reference,
    quantize_weight,
)
from hpc_advise.runtime import ep_moe as E  # noqa: E402
from hpc_advise.runtime.measure.dist_run import run_ranks  # noqa: E402

REL_TOL_SUM_ORDER = 1e-5  # fp32 sums in another order (and bf16 -> fp32 exact): ~1e-7 measured
REL_TOL_QUANT_REF = 2e-2  # the fused op's documented bound (kernels/fused_moe/README.md, "Tolerances")
NUM_EXPERTS, HIDDEN, INTER, TOP_K, WS = 8, 256, 256, 3, 2


def _seed() -> int:
    env = os.environ.get("HPC_ADVISE_TEST_SEED")
    seed = int(env) if env else int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    return seed


def rel_err(out, ref) -> float:
    out64, ref64 = out.double(), ref.double()
    return float((out64 - ref64).norm() / ref64.norm().clamp(min=1e-30))


def _routing(t: int, experts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct top-k ids drawn from ``experts`` and softmax weights."""
    pool = torch.tensor(experts)
    ids = pool[torch.rand(t, len(experts)).topk(TOP_K, dim=1).indices].to(torch.int32)
    return ids, torch.softmax(torch.randn(t, TOP_K), dim=1)


def _tokens(t: int, experts: list[int] | None = None) -> dict:
    ids, w = _routing(t, experts or list(range(NUM_EXPERTS)))
    return {"x": torch.randn(t, HIDDEN).to(torch.bfloat16), "ids": ids, "w": w}


def make_cases() -> dict[str, list[dict]]:
    """Case name -> the tokens of rank 0 and rank 1."""
    low = list(range(NUM_EXPERTS // 2))  # rank 0's experts only
    minus = _tokens(6)
    minus["ids"][0, 1] = -1
    minus["ids"][2] = -1  # a token with no expert: zeros
    minus["ids"][4, 0] = -1
    bad = _tokens(3)
    bad["ids"][1, 2] = NUM_EXPERTS  # out of range on rank 1 only
    return {
        "uneven": [_tokens(5), _tokens(17)],
        "t1": [_tokens(1), _tokens(1)],
        "rank1_gets_nothing": [_tokens(4, low), _tokens(7, low)],
        "rank0_has_no_tokens": [_tokens(0), _tokens(9)],
        "minus_one": [minus, _tokens(2)],
        "bad_ids": [_tokens(3), bad],
    }


def make_weights() -> dict:
    w13f = torch.randn(NUM_EXPERTS, 2 * INTER, HIDDEN) / HIDDEN**0.5
    w2f = torch.randn(NUM_EXPERTS, HIDDEN, INTER) / INTER**0.5
    out = {"w13f": w13f, "w2f": w2f}
    for mode in ("tensor", "block"):
        out[f"w13_{mode}"], out[f"s13_{mode}"] = quantize_weight(w13f, mode)
        out[f"w2_{mode}"], out[f"s2_{mode}"] = quantize_weight(w2f, mode)
    return out


def _float_experts(w13f, w2f):
    return lambda x, ids, w: moe_float_reference(x, w13f, w2f, w, ids)


def _quant_experts(w13, w2, s13, s2):
    return lambda x, ids, w: fused_moe_reference(x, w13, w2, w, ids, w13_scale=s13, w2_scale=s2)


def _cpu_worker(rank: int, ws: int, cases: dict, wts: dict) -> dict:
    """Every case on this rank: EP and TP with float and fp8 reference experts."""
    ep_w = E.shard_ep(wts, NUM_EXPERTS, ws, rank)
    experts = {"float": _float_experts(ep_w["w13f"], ep_w["w2f"])}
    tp_experts = {}
    w13f_tp = torch.cat([wts["w13f"][:, : INTER][:, rank * INTER // ws : (rank + 1) * INTER // ws],
                         wts["w13f"][:, INTER:][:, rank * INTER // ws : (rank + 1) * INTER // ws]], dim=1)  # fmt: skip
    w2f_tp = wts["w2f"][:, :, rank * INTER // ws : (rank + 1) * INTER // ws]
    tp_experts["float"] = _float_experts(w13f_tp, w2f_tp)
    for mode in ("tensor", "block"):
        experts[mode] = _quant_experts(
            ep_w[f"w13_{mode}"], ep_w[f"w2_{mode}"], ep_w[f"s13_{mode}"], ep_w[f"s2_{mode}"]
        )
        tp_experts[mode] = _quant_experts(
            *E.shard_tp(
                wts[f"w13_{mode}"], wts[f"w2_{mode}"], wts[f"s13_{mode}"], wts[f"s2_{mode}"], ws, rank
            )
        )
    results = {}
    for name, per_rank in cases.items():
        mine = per_rank[rank]
        res: dict = {}
        try:
            for kind, fn in experts.items():
                res[f"ep_{kind}"] = E.ep_moe(
                    mine["x"], mine["ids"], mine["w"], fn, NUM_EXPERTS, combine_dtype=torch.float32
                )
            res["ep_float_again"] = E.ep_moe(
                mine["x"], mine["ids"], mine["w"], experts["float"], NUM_EXPERTS, combine_dtype=torch.float32
            )
            res["counts"] = E.dispatch(mine["x"], mine["ids"], mine["w"], NUM_EXPERTS).send_counts
            glob = {k: torch.cat([r[k] for r in per_rank]) for k in ("x", "ids", "w")}  # TP: all tokens
            for kind, fn in tp_experts.items():
                res[f"tp_{kind}"] = E.tp_moe(glob["x"], glob["ids"], glob["w"], fn)
        except E.EPMoEError as exc:
            res = {"error": str(exc)}
        results[name] = res
    return results


@pytest.fixture(scope="module")
def cpu_run():
    seed = _seed()
    cases, wts = make_cases(), make_weights()
    results = run_ranks(_cpu_worker, WS, backend="gloo", args=(cases, wts), timeout_s=300)
    return seed, cases, wts, results


def _single_process(kind: str, tok: dict, wts: dict) -> torch.Tensor:
    """The layer on one process with all experts: the ground truth."""
    if kind == "float":
        return moe_float_reference(tok["x"], wts["w13f"], wts["w2f"], tok["w"], tok["ids"])
    return fused_moe_reference(
        tok["x"], wts[f"w13_{kind}"], wts[f"w2_{kind}"], tok["w"], tok["ids"],
        w13_scale=wts[f"s13_{kind}"], w2_scale=wts[f"s2_{kind}"],
    )  # fmt: skip


def _check(got: torch.Tensor, want: torch.Tensor, tol: float, what: str, seed: int) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)} (seed {seed})"
    assert not torch.isnan(got).any(), f"{what}: NaN (seed {seed})"
    if want.numel() == 0:
        return
    err = rel_err(got, want)
    assert err <= tol, (
        f"{what}: rel err {err:.3e} > {tol} (seed {seed}: HPC_ADVISE_TEST_SEED={seed} replays it)"
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", ["uneven", "t1", "rank1_gets_nothing", "rank0_has_no_tokens", "minus_one"])
def test_ep_and_tp_equal_the_single_process_layer(cpu_run, case):
    seed, cases, wts, results = cpu_run
    per_rank = cases[case]
    glob = {k: torch.cat([r[k] for r in per_rank]) for k in ("x", "ids", "w")}
    for kind, tol in (
        ("float", REL_TOL_SUM_ORDER),
        ("tensor", REL_TOL_QUANT_REF),
        ("block", REL_TOL_QUANT_REF),
    ):
        for rank in range(WS):
            res = results[rank][case]
            want = _single_process(kind, per_rank[rank], wts)
            _check(res[f"ep_{kind}"], want, tol, f"{case} EP rank {rank} {kind}", seed)
            # TP: every rank holds the whole batch and the same sum
            _check(
                res[f"tp_{kind}"],
                _single_process(kind, glob, wts),
                tol,
                f"{case} TP rank {rank} {kind}",
                seed,
            )
        assert torch.equal(results[0][case][f"tp_{kind}"], results[1][case][f"tp_{kind}"]), seed
    for rank in range(WS):  # deterministic: the same call twice gives the same bits
        assert torch.equal(results[rank][case]["ep_float"], results[rank][case]["ep_float_again"]), seed


@pytest.mark.slow
def test_dispatch_counts_by_hand(cpu_run):
    seed, cases, _, results = cpu_run

    def counts(tok):  # tokens with at least one slot on rank 0 / rank 1 (experts 0-3 / 4-7)
        ids = tok["ids"].long()
        return [int(((ids >= 0) & (ids // 4 == r)).any(dim=1).sum()) for r in range(WS)]

    for case in ("uneven", "t1", "rank1_gets_nothing", "rank0_has_no_tokens", "minus_one"):
        for rank in range(WS):
            assert results[rank][case]["counts"] == counts(cases[case][rank]), (case, rank, seed)
    assert results[0]["rank1_gets_nothing"]["counts"][1] == results[1]["rank1_gets_nothing"]["counts"][1] == 0
    assert results[0]["rank0_has_no_tokens"]["counts"] == [0, 0]


@pytest.mark.slow
def test_token_without_experts_gets_zeros(cpu_run):
    _, _, _, results = cpu_run
    res = results[0]["minus_one"]
    for kind in ("ep_float", "ep_tensor", "ep_block"):
        assert torch.equal(res[kind][2], torch.zeros(HIDDEN)), kind
        assert res[kind][[0, 1, 3, 4, 5]].abs().sum(dim=1).min() > 0, kind


@pytest.mark.slow
def test_invalid_ids_raise_on_every_rank(cpu_run):
    _, _, _, results = cpu_run
    for rank in range(WS):
        msg = results[rank]["bad_ids"].get("error", "")
        assert "outside [-1, 8)" in msg and "rank(s) [1]" in msg, (rank, results[rank]["bad_ids"])


def test_fused_op_reads_packed_rows_with_local_ids():
    """Our Triton op (interpreter on CPU) on rows laid out as ``dispatch`` receives them: strided bf16
    rows inside the packed byte rows, local ids with -1 for other ranks' slots."""
    pytest.importorskip("triton")
    seed = _seed()
    t, e_local, h, i, k = 5, 4, 256, 128, 3
    w13, s13 = quantize_weight(torch.randn(e_local, 2 * i, h) / h**0.5, "block")
    w2, s2 = quantize_weight(torch.randn(e_local, h, i) / i**0.5, "block")
    x = torch.randn(t, h).to(torch.bfloat16)
    ids = torch.randint(-1, e_local, (t, k), dtype=torch.int32)
    ids[0] = torch.tensor([2, -1, 0])
    w = torch.softmax(torch.randn(t, k), dim=1)
    ids_off, w_off, row = E.packed_layout(h, k)
    buf = torch.zeros(t, row, dtype=torch.uint8)
    buf[:, : 2 * h] = x.view(torch.uint8)
    buf[:, ids_off : ids_off + 4 * k] = ids.view(torch.uint8)
    buf[:, w_off : w_off + 4 * k] = w.view(torch.uint8)
    xv = buf[:, : 2 * h].view(torch.bfloat16)
    assert xv.stride(0) == row // 2 and torch.equal(xv, x)
    cfg = dict(BLOCK_M=16, GU_N=128, GU_K=128, SPLIT_K=1, GU_GROUP_M=1, GU_WARPS=4, GU_STAGES=2,
               DN_N=64, DN_K=128, DN_GROUP_M=1, DN_WARPS=4, DN_STAGES=2)  # fmt: skip
    fn = E.fused_experts(w13, w2, w13_scale=s13, w2_scale=s2, block_shape=(128, 128), config=cfg)
    got = fn(
        xv,
        buf[:, ids_off : ids_off + 4 * k].view(torch.int32),
        buf[:, w_off : w_off + 4 * k].view(torch.float32),
    )
    want = fused_moe_reference(x, w13, w2, w, ids, w13_scale=s13, w2_scale=s2)
    _check(got.float(), want, REL_TOL_QUANT_REF, "fused op on packed rows", seed)


def _interpreter_worker(rank: int, ws: int, seed: int) -> dict:
    """EP and TP with our Triton op (interpreter) as the local experts; rank 1 has no tokens when the
    seed is odd."""
    import tests.conftest  # noqa: F401  (the Triton interpreter's patches, in this child process too)

    torch.manual_seed(seed)
    wts = make_weights()
    toks = [_tokens(5), _tokens(0 if seed % 2 else 3)]
    cfg = dict(BLOCK_M=16, GU_N=128, GU_K=128, SPLIT_K=1, GU_GROUP_M=1, GU_WARPS=4, GU_STAGES=2,
               DN_N=64, DN_K=128, DN_GROUP_M=1, DN_WARPS=4, DN_STAGES=2)  # fmt: skip
    kw = dict(block_shape=(128, 128), config=cfg)
    ep = E.shard_ep({"w13": wts["w13_block"], "w2": wts["w2_block"], "s13": wts["s13_block"],
                     "s2": wts["s2_block"]}, NUM_EXPERTS, ws, rank)  # fmt: skip
    ep_fn = E.fused_experts(ep["w13"], ep["w2"], w13_scale=ep["s13"], w2_scale=ep["s2"], **kw)
    tp = E.shard_tp(wts["w13_block"], wts["w2_block"], wts["s13_block"], wts["s2_block"], ws, rank)
    tp_fn = E.fused_experts(tp[0], tp[1], w13_scale=tp[2], w2_scale=tp[3], **kw)
    mine = toks[rank]
    glob = {key: torch.cat([tk[key] for tk in toks]) for key in ("x", "ids", "w")}
    return {
        "ep": E.ep_moe(mine["x"], mine["ids"], mine["w"], ep_fn, NUM_EXPERTS),
        "tp": E.tp_moe(glob["x"], glob["ids"], glob["w"], tp_fn),
        "toks": toks,
        "wts": wts,
    }


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU (interpreter) check; the GPU test covers CUDA")
def test_ep_and_tp_with_our_triton_op_under_the_interpreter():
    pytest.importorskip("triton")
    seed = _seed()
    res = run_ranks(_interpreter_worker, WS, backend="gloo", args=(seed,), timeout_s=300)
    toks, wts = res[0]["toks"], res[0]["wts"]
    glob = {key: torch.cat([tk[key] for tk in toks]) for key in ("x", "ids", "w")}
    for rank in range(WS):
        assert res[rank]["ep"].dtype == torch.bfloat16
        _check(res[rank]["ep"].float(), _single_process("block", toks[rank], wts), REL_TOL_QUANT_REF,
               f"EP rank {rank} (our op)", seed)  # fmt: skip
        _check(res[rank]["tp"].float(), _single_process("block", glob, wts), REL_TOL_QUANT_REF,
               f"TP rank {rank} (our op)", seed)  # fmt: skip


def test_packed_layout_is_aligned():
    for h, k in ((4096, 8), (7168, 8), (255, 3), (1, 1)):
        ids_off, w_off, row = E.packed_layout(h, k)
        assert ids_off >= 2 * h and w_off >= ids_off + 4 * k and row >= w_off + 4 * k
        assert ids_off % 16 == w_off % 16 == row % 16 == 0


def test_shard_tp_keeps_gate_and_up_halves_and_block_scales():
    e, h, i, tp = 2, 256, 512, 2
    w13f, w2f = torch.randn(e, 2 * i, h), torch.randn(e, h, i)
    w13, s13 = quantize_weight(w13f, "block")
    w2, s2 = quantize_weight(w2f, "block")
    pieces = [E.shard_tp(w13, w2, s13, s2, tp, r) for r in range(tp)]
    gate = torch.cat([p[0][:, : i // tp] for p in pieces], dim=1)
    up = torch.cat([p[0][:, i // tp :] for p in pieces], dim=1)
    assert torch.equal(torch.cat([gate, up], dim=1).float(), w13.float())
    assert torch.equal(torch.cat([p[1] for p in pieces], dim=2).float(), w2.float())
    s13_back = torch.cat(
        [torch.cat([p[2][:, :2] for p in pieces], 1), torch.cat([p[2][:, 2:] for p in pieces], 1)], 1
    )
    assert torch.equal(s13_back, s13) and torch.equal(torch.cat([p[3] for p in pieces], dim=2), s2)
    with pytest.raises(E.EPMoEError, match="divisible by 128"):
        E.shard_tp(w13, w2, s13, s2, 8, 0)  # I/tp = 64
    assert E.shard_tp(w13, w2, s13, s2, 4, 3)[0].shape == (e, 2 * 128, h)  # I/tp = 128 is fine
    with pytest.raises(E.EPMoEError, match="evenly"):
        E.shard_tp(w13, w2, s13, s2, 3, 0)


def test_expert_range_errors():
    assert E.expert_range(256, 8, 3) == (96, 32)
    with pytest.raises(E.EPMoEError, match="evenly"):
        E.expert_range(10, 4, 0)
    with pytest.raises(E.EPMoEError, match="outside"):
        E.expert_range(8, 2, 2)


# ------------------------------------------------------------------------------------------------
# GPU: NCCL on two GPUs, our fused FP8 op as the local experts, real model shapes

# T = 128 per rank as in benchmarks/bench_ep_moe.py, whose parallel precompile (run first on the device)
# leaves these launch configs compiled
GPU_CASES = {  # name -> (E, H, I, top_k, weight scales, static activation scales?, T per rank)
    "hy3-tensor-static": (192, 4096, 1536, 8, "tensor", True, 128),
    "deepseek-v3-block-dynamic": (256, 7168, 2048, 8, "block", False, 128),
}


def _gpu_weights(e: int, h: int, i: int, wmode: str, dev: str):
    """fp8 weights quantized expert by expert from N(0, 1/fan_in) (small fp32 temporaries)."""
    fp8 = torch.float8_e4m3fn
    w13, w2 = torch.empty(e, 2 * i, h, dtype=fp8, device=dev), torch.empty(e, h, i, dtype=fp8, device=dev)
    s13, s2 = [], []
    for x in range(e):
        q, s = quantize_weight(torch.randn(1, 2 * i, h, device=dev) / h**0.5, wmode)
        w13[x], s13 = q[0], [*s13, s]
        q, s = quantize_weight(torch.randn(1, h, i, device=dev) / i**0.5, wmode)
        w2[x], s2 = q[0], [*s2, s]
    return w13, w2, torch.cat(s13), torch.cat(s2)


def _chunked_reference(tok: dict, w13, w2, s13, s2, kw: dict, chunk: int = 32) -> torch.Tensor:
    """``fused_moe_reference`` over all experts, 32 experts at a time (fp32 dequantized weights of all
    256 DeepSeek experts would take ~45 GB at once); the slot sums only change order."""
    out = torch.zeros(tok["x"].shape, dtype=torch.float32, device=tok["x"].device)
    ids = tok["ids"].long()
    for c0 in range(0, w13.shape[0], chunk):
        local = ids - c0
        ids_c = torch.where((local >= 0) & (local < chunk), local, -1).to(torch.int32)
        out += fused_moe_reference(
            tok["x"], w13[c0 : c0 + chunk], w2[c0 : c0 + chunk], tok["w"], ids_c,
            w13_scale=s13[c0 : c0 + chunk], w2_scale=s2[c0 : c0 + chunk], **kw,
        )  # fmt: skip
    return out


def _gpu_worker(rank: int, ws: int, seed: int, case: str) -> dict:
    e, h, i, k, wmode, static, t = GPU_CASES[case]
    dev = f"cuda:{rank}"
    torch.manual_seed(seed)  # every rank draws the same weights and every rank's tokens
    w13, w2, s13, s2 = _gpu_weights(e, h, i, wmode, dev)
    toks = []
    for _ in range(ws):
        ids = torch.rand(t, e, device=dev).topk(k, dim=1).indices.to(torch.int32)
        toks.append({"x": torch.randn(t, h, device=dev).to(torch.bfloat16), "ids": ids,
                     "w": torch.softmax(torch.randn(t, k, device=dev), dim=1)})  # fmt: skip
    glob = {key: torch.cat([tk[key] for tk in toks]) for key in ("x", "ids", "w")}
    kw = {}
    if static:
        kw = {"a13_scale": float(glob["x"].float().abs().max()) / 448.0, "a2_scale": 6.0 / 448.0}
    if wmode == "block":
        kw["block_shape"] = (128, 128)
    ep = E.shard_ep({"w13": w13, "w2": w2, "s13": s13, "s2": s2}, e, ws, rank)
    ep_fn = E.fused_experts(ep["w13"], ep["w2"], w13_scale=ep["s13"], w2_scale=ep["s2"], **kw)
    mine = toks[rank]
    ep_out = E.ep_moe(mine["x"], mine["ids"], mine["w"], ep_fn, e)
    ep_again = E.ep_moe(mine["x"], mine["ids"], mine["w"], ep_fn, e)
    tw13, tw2, ts13, ts2 = E.shard_tp(w13, w2, s13, s2, ws, rank)
    tp_fn = E.fused_experts(tw13, tw2, w13_scale=ts13, w2_scale=ts2, **kw)
    tp_out = E.tp_moe(glob["x"], glob["ids"], glob["w"], tp_fn)
    ref_kw = {key: v for key, v in kw.items() if key != "block_shape"}
    torch.cuda.synchronize()
    return {
        "ep_err": rel_err(ep_out, _chunked_reference(mine, w13, w2, s13, s2, ref_kw)),
        "tp_err": rel_err(tp_out, _chunked_reference(glob, w13, w2, s13, s2, ref_kw)),
        "ep_nan": bool(torch.isnan(ep_out).any()),
        "tp_nan": bool(torch.isnan(tp_out).any()),
        "deterministic": bool(torch.equal(ep_out, ep_again)),
        "tp_out": tp_out.cpu(),
    }


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_gpu_ep2_and_tp2_equal_the_single_gpu_reference(case):
    if torch.cuda.device_count() < WS:
        pytest.skip(f"needs {WS} GPUs")
    seed = _seed()
    res = run_ranks(_gpu_worker, WS, backend="nccl", args=(seed, case), timeout_s=400)
    for rank, r in enumerate(res):
        print(
            f"{case} rank {rank}: EP2 rel err {r['ep_err']:.2e}, TP2 rel err {r['tp_err']:.2e} (seed {seed})"
        )
        assert not r["ep_nan"] and not r["tp_nan"], (rank, seed)
        assert r["ep_err"] <= REL_TOL_QUANT_REF, (rank, r["ep_err"], seed)
        assert r["tp_err"] <= REL_TOL_QUANT_REF, (rank, r["tp_err"], seed)
        assert r["deterministic"], (rank, seed)
    assert torch.equal(res[0]["tp_out"], res[1]["tp_out"]), seed  # the all-reduce gives every rank the same


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_gpu_ep1_and_tp1_through_nccl_equal_the_reference(case):
    """World size 1 on one GPU: the NCCL rendezvous through the FileStore, the counts and rows
    all-to-alls of a single rank, the fused op on the received rows and the all-reduce of TP1 (what a
    one-GPU machine can check of the EP/TP layers)."""
    seed = _seed()
    (r,) = run_ranks(_gpu_worker, 1, backend="nccl", args=(seed, case), timeout_s=400)
    print(f"{case}: EP1 rel err {r['ep_err']:.2e}, TP1 rel err {r['tp_err']:.2e} (seed {seed})")
    assert not r["ep_nan"] and not r["tp_nan"], seed
    assert r["ep_err"] <= REL_TOL_QUANT_REF, (r["ep_err"], seed)
    assert r["tp_err"] <= REL_TOL_QUANT_REF, (r["tp_err"], seed)
    assert r["deterministic"], seed
