"""Tests of hpc_advise.kernels.router_gemm: split, GEMM accuracy vs float64, top-k sets vs FP32, routing.

On CPU the Triton kernel runs under TRITON_INTERPRET=1 at small sizes (N 64-128, K 1024-1056); the
``gpu``-marked tests run the real router shapes on the H200. Fresh random inputs every run; outputs are
poisoned with NaN before each call. Tolerances are declared once below and derived in the README.
"""

from __future__ import annotations

import math

import pytest
import torch

from hpc_advise.kernels.router_gemm import op
from hpc_advise.kernels.router_gemm import reference as ref
from hpc_advise.kernels.router_gemm.configs import Config, heuristic_config, pick_config

DEV = "cuda" if torch.cuda.is_available() else "cpu"
REL_TOL = 1e-5  # ||y - y64|| / ||y64||, norm-wise over the whole [M, N] output
SPLIT_BOUND = 2.0**-16  # |W - hi - lo/256| <= 2^-16 |W| element-wise
ELEM_FACTOR = 2.0**-15  # |y_i - y64_i| <= 2^-15 * sum_k |x_k W_ik|: split bound x2 for fp32 sums
TIE_FACTOR = 2.0**-12  # near tie: gap(k-th, k+1-th) < 2^-12 * max_i ||x o W_i||_2 (README)
TOP_K = 8
BF16_ROWS = 8000  # rows of the BF16-router contrast in the top-8 test (torch only)
ROUTE_TIE_REL = 2.0**-20  # fp32 score (+ bias) rounding, a few ulp each, with margin: closer pairs may swap


# The interpreter's cost is per program and per K step: big tiles keep the large-M CPU cases fast.
BIG_TILE_CPU = None if DEV == "cuda" else Config(128, 64, 256, 1, 4, 2)


def _weights(n: int, k: int, device=DEV) -> torch.Tensor:
    return torch.randn(n, k, device=device) * 0.02


def _rel_err(y: torch.Tensor, r: torch.Tensor) -> float:
    return ((y.double() - r).norm() / r.norm()).item()


def _run(x, hi, lo, bias=None, **kw) -> torch.Tensor:
    out = torch.full((x.shape[0], hi.shape[0]), float("nan"), device=x.device)
    y = op.router_gemm(x, hi, lo, bias, out=out, **kw)
    assert y.data_ptr() == out.data_ptr() and y.dtype == torch.float32
    assert torch.isfinite(y).all(), "output not fully written (NaN poison left)"
    return y


def _check_accuracy(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias=None) -> float:
    r = ref.router_gemm_reference(x, w, bias)
    err = _rel_err(y, r)
    assert err <= REL_TOL, f"relative error {err:.3g} > {REL_TOL}"
    scale = x.double().abs() @ w.double().abs().t()  # sum_k |x_k W_ik|
    excess = ((y.double() - r).abs() - ELEM_FACTOR * scale).max().item()
    assert excess <= 0, f"element-wise error exceeds 2^-15 sum|x||w| by {excess:.3g}"
    return err


def _topk_mismatch(logits: torch.Tensor, peer: torch.Tensor, exact: torch.Tensor, x, w, k=TOP_K):
    """(rows whose top-k sets differ, near-tie rows) as boolean [M] tensors."""
    a = logits.topk(k, dim=-1).indices.sort(dim=-1).values
    b = peer.topk(k, dim=-1).indices.sort(dim=-1).values
    differ = (a != b).any(dim=-1)
    top = exact.topk(k + 1, dim=-1).values
    gap = top[:, k - 1] - top[:, k]
    # max_i ||x o W_i||_2 per token
    norm = torch.sqrt((x.double() ** 2) @ (w.double() ** 2).t()).amax(dim=-1)
    near_tie = gap < TIE_FACTOR * norm
    return differ, near_tie


# ---------------------------------------------------------------- prepare


def test_prepare_split_bound_and_exact_parts():
    w = _weights(96, 1024, "cpu")
    w[0, :4] = torch.tensor([1.0, -3.0e-5, 0.0, 7.0e3])  # exact bf16, tiny, zero, large
    hi, lo = op.prepare(w)
    assert hi.dtype == lo.dtype == torch.bfloat16 and hi.shape == lo.shape == w.shape
    assert torch.equal(hi, w.to(torch.bfloat16))
    back = hi.double() + lo.double() / 256.0
    resid = (w.double() - back).abs()
    assert (resid <= SPLIT_BOUND * w.double().abs()).all()
    assert lo[0, 0] == 0 and lo[0, 2] == 0 and hi[0, 2] == 0
    # the two-part split carries ~16 bits: typical residual far below one bf16 rounding
    assert (resid / w.double().abs().clamp_min(1e-30)).median() < 2.0**-17


@pytest.mark.parametrize(
    "shape,dtype,msg",
    [
        ((100, 1024), torch.float32, "N=100"),
        ((48, 1024), torch.float32, "N=48"),
        ((528, 1024), torch.float32, "N=528"),
        ((64, 1000), torch.float32, "K=1000"),
        ((64, 8208), torch.float32, "K=8208"),
        ((64, 1024), torch.bfloat16, "float32"),
    ],
)
def test_prepare_rejects_bad_weights(shape, dtype, msg):
    with pytest.raises(ValueError, match=msg):
        op.prepare(torch.zeros(shape, dtype=dtype))


# ---------------------------------------------------------------- GEMM on the interpreter / GPU


@pytest.mark.parametrize("m", [1, 3, 17, 1000])
def test_router_gemm_bf16_x_matches_fp64(m):
    n, k = 64, 1024
    w = _weights(n, k)
    hi, lo = op.prepare(w)
    x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
    _check_accuracy(_run(x, hi, lo, config=BIG_TILE_CPU if m > 64 else None), x, w)


@pytest.mark.parametrize(
    "cfg",
    [
        Config(16, 64, 64, 5, 4, 2),  # split-K, K tail (1056 % 64 = 32, 17 K steps over 5 slices)
        Config(32, 128, 128, 1, 4, 2),  # no split, N tile larger than N=96
        Config(16, 32, 256, 3, 4, 2),  # split-K with an empty last slice (5 K steps in 3 slices of 2)
    ],
)
def test_router_gemm_forced_configs_tail_and_bias(cfg):
    n, k, m = 96, 1056, 19
    w = _weights(n, k)
    hi, lo = op.prepare(w)
    bias = torch.randn(n, device=DEV) * 0.01
    x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
    _check_accuracy(_run(x, hi, lo, bias, config=cfg), x, w, bias)


GEMV = "gemv"


@pytest.mark.parametrize(
    "m,cfg",
    [
        (1, Config(1, 1, 1024, 1, 4, 1, GEMV)),  # one expert per program, K in 1024-wide strips + tail
        (3, Config(1, 4, 256, 1, 4, 2, GEMV)),  # M_PAD 4 (one padded token lane), pipelined K loop
        (8, Config(1, 8, 2048, 1, 8, 1, GEMV)),  # the most tokens the path takes, K in one strip
    ],
)
def test_router_gemv_small_m_matches_fp64_with_bias_and_tail(m, cfg):
    n, k = 96, 1056  # K tail in every strip width above
    w = _weights(n, k)
    hi, lo = op.prepare(w)
    bias = torch.randn(n, device=DEV) * 0.01
    x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
    _check_accuracy(_run(x, hi, lo, bias, config=cfg), x, w, bias)
    _check_accuracy(_run(x, hi, lo, config=cfg), x, w)


def test_router_gemv_fp32_x_and_strided_x():
    n, k, m = 64, 1024, 2
    w = _weights(n, k)
    hi, lo = op.prepare(w)
    cfg = Config(1, 2, 512, 1, 4, 1, GEMV)
    xf = torch.randn(m, k, device=DEV)
    _check_accuracy(_run(xf, hi, lo, config=cfg), xf, w)  # fp32 x used as is: fp32-accurate
    y_round = _run(xf, hi, lo, split_x=False, config=cfg)  # rounded to bf16 = the bf16-x result
    assert torch.equal(y_round, _run(xf.to(torch.bfloat16), hi, lo, config=cfg))
    big = torch.randn(m, k + 64, device=DEV).to(torch.bfloat16)
    xs = big[:, 32 : 32 + k]
    _check_accuracy(_run(xs, hi, lo, config=cfg), xs, w)


def test_router_gemv_agrees_with_tensor_core_path():
    n, k, m = 64, 1024, 4
    w = _weights(n, k)
    hi, lo = op.prepare(w)
    x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
    a = _run(x, hi, lo, config=Config(1, 4, 1024, 1, 4, 1, GEMV))
    b = _run(x, hi, lo, config=Config(16, 32, 64, 4, 4, 2))
    # both are within 2^-15 sum|x||w| of the exact value; only the fp32 summation order differs
    scale = x.float().abs() @ w.abs().t()
    assert ((a - b).abs() <= 2.0**-14 * scale).all()


def test_router_gemv_config_checks():
    x, hi, lo = _good(m=9)
    with pytest.raises(ValueError, match="does not serve M=9"):
        op.router_gemm(x, hi, lo, config=Config(1, 1, 1024, 1, 4, 1, GEMV))
    for bad, msg in (
        (Config(16, 1, 1024, 1, 4, 1, GEMV), "block_m=1"),
        (Config(1, 3, 1024, 1, 4, 1, GEMV), "block_n=3"),
        (Config(1, 1, 48, 1, 4, 1, GEMV), "block_k=48"),
        (Config(16, 32, 64, 1, 4, 2, "simt"), "impl"),
    ):
        with pytest.raises(ValueError, match=msg):
            bad.validate(1024)


def test_config_table_rejects_gemv_bucket_above_its_range(tmp_path, monkeypatch):
    import json

    from hpc_advise.kernels.router_gemm import configs

    entry = dict(n=64, k=1024, m_max=16, block_m=1, block_n=1, block_k=1024, split_k=1)
    path = tmp_path / "configs.json"
    path.write_text(json.dumps({"entries": [dict(entry, num_warps=4, num_stages=1, impl=GEMV)]}))
    monkeypatch.setattr(configs, "CONFIG_FILE", path)
    configs._table.cache_clear()
    try:
        with pytest.raises(ValueError, match="entry 0.*m_max=16"):
            configs.pick_config(1, 64, 1024, 132)
    finally:
        configs._table.cache_clear()


def test_router_gemm_fp32_x_split_keeps_fp32_accuracy():
    n, k, m = 64, 1024, 24
    w = _weights(n, k)
    hi, lo = op.prepare(w)
    x = torch.randn(m, k, device=DEV)  # not bf16-representable
    y = _run(x, hi, lo)  # default: x split into x_hi + x_lo/256, 3 products
    _check_accuracy(y, x, w)
    # rounding fp32 x to bf16 (split_x=False) equals the bf16-x path and is NOT fp32-accurate in x
    y_round = _run(x, hi, lo, split_x=False)
    y_bf16 = _run(x.to(torch.bfloat16), hi, lo)
    assert torch.equal(y_round, y_bf16)
    assert _rel_err(y_round, ref.router_gemm_reference(x, w)) > 10 * REL_TOL


def test_router_gemm_strided_x_view():
    n, k, m = 64, 1024, 5
    w = _weights(n, k)
    hi, lo = op.prepare(w)
    big = torch.randn(m, k + 64, device=DEV).to(torch.bfloat16)
    x = big[:, 32 : 32 + k]
    assert x.stride(0) == k + 64
    _check_accuracy(_run(x, hi, lo), x, w)


def test_router_gemm_top8_sets_match_fp32_except_near_ties():
    n, k, m = 64, 1024, 1000
    w = _weights(n, k)
    hi, lo = op.prepare(w)
    x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
    exact = ref.router_gemm_reference(x, w)
    fp32 = x.float() @ w.t()
    differ, near_tie = _topk_mismatch(_run(x, hi, lo, config=BIG_TILE_CPU), fp32, exact, x, w)
    assert not (differ & ~near_tie).any(), f"{int((differ & ~near_tie).sum())} non-tie top-8 changes"
    assert near_tie.float().mean() < 0.05
    # The same check fails for a plain BF16 router (so it can fail): bf16(x)·bf16(W). It changes
    # ~1% of rows beyond a near tie here (2000 draws of 1000 rows: mean 10.3, fewest 2), so 1000 rows
    # alone would miss it about once in 10^4 runs; torch alone checks BF16_ROWS more rows (mean ~80).
    xb = torch.cat([x, torch.randn(BF16_ROWS - m, k, device=DEV).to(torch.bfloat16)])
    exact_b = ref.router_gemm_reference(xb, w)
    differ16, near_b = _topk_mismatch(xb.float() @ hi.float().t(), xb.float() @ w.t(), exact_b, xb, w)
    assert (differ16 & ~near_b).any(), "a BF16 router should change top-8 sets beyond near ties"


def test_split_k_counters_return_to_zero_and_result_is_deterministic():
    n, k, m = 64, 1024, 2
    w = _weights(n, k)
    hi, lo = op.prepare(w)
    x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
    cfg = Config(16, 32, 64, 8, 4, 2)
    a = _run(x, hi, lo, config=cfg)
    b = _run(x, hi, lo, config=cfg)
    assert torch.equal(a, b)
    assert int(op._counter_buffer(x.device).abs().sum()) == 0


# ---------------------------------------------------------------- input validation


def _good(m=4, n=64, k=1024):
    w = torch.randn(n, k) * 0.02
    hi, lo = op.prepare(w)
    return torch.randn(m, k).to(torch.bfloat16), hi, lo


@pytest.mark.parametrize(
    "mutate,msg",
    [
        (lambda x, hi, lo: (x.to(torch.float16), hi, lo, {}), "bfloat16 or float32"),
        (lambda x, hi, lo: (x, hi.float(), lo, {}), "hi and lo must be bfloat16"),
        (lambda x, hi, lo: (x, hi, lo[:32], {}), "differ"),
        (lambda x, hi, lo: (x[:, :512], hi, lo, {}), "K=512"),
        (lambda x, hi, lo: (x.t().contiguous().t(), hi, lo, {}), "unit stride"),
        (lambda x, hi, lo: (x[:0], hi, lo, {}), "M=0"),
        (lambda x, hi, lo: (x, hi, lo, {"bias": torch.zeros(63)}), "bias"),
        (lambda x, hi, lo: (x, hi, lo, {"out": torch.zeros(4, 64, dtype=torch.bfloat16)}), "out"),
        (lambda x, hi, lo: (x, hi, lo, {"split_x": True}), "split_x"),
        (lambda x, hi, lo: (x, hi, lo, {"config": Config(16, 64, 64, 99, 4, 2)}), "split_k"),
        (lambda x, hi, lo: (x, hi, lo, {"config": Config(16, 48, 64, 1, 4, 2)}), "power of two"),
    ],
)
def test_router_gemm_rejects_bad_inputs(mutate, msg):
    x, hi, lo, kw = mutate(*_good())
    with pytest.raises(ValueError, match=msg):
        op.router_gemm(x, hi, lo, **kw)


def test_router_gemm_rejects_too_many_tokens():
    x, hi, lo = _good()
    big = torch.empty(16385, 1024, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="M=16385"):
        op.router_gemm(big, hi, lo)


def test_config_table_and_heuristic():
    for m in (1, 8, 64, 512, 8192, 16384):
        for n, k in ((192, 4096), (128, 4096), (256, 7168), (160, 5120)):
            cfg = pick_config(m, n, k, 132)
            cfg.validate(k)
    assert heuristic_config(1, 160, 5120, 132) == Config(1, 1, 8192, 1, 8, 1, "gemv")
    h = heuristic_config(2, 192, 4096, 132)
    assert h.split_k > 1 and 4096 // h.block_k % h.split_k == 0
    assert heuristic_config(8192, 192, 4096, 132).split_k == 1


def test_bench_rejects_unknown_grid():
    from hpc_advise.runtime.measure.cases.router_gemm import bench

    with pytest.raises(ValueError, match="grid"):
        bench(grid="huge")


# ---------------------------------------------------------------- routing


def _ranks_tie(ids, ids64, choice, magnitude):
    """Rows whose ranks each pick an expert with the same fp64 selection score as ``ids64``'s, up to
    fp32 rounding (ROUTE_TIE_REL of the score's magnitude)."""
    mine, theirs = choice.gather(1, ids), choice.gather(1, ids64)
    return ((mine - theirs).abs() <= ROUTE_TIE_REL * magnitude.gather(1, ids64)).all(dim=-1)


def _group_tie_alternative(choice, magnitude, kw):
    """(rows whose last kept group and first dropped group have fp64 group scores within fp32
    rounding, the fp64 top-k of every row with those two groups swapped). Such rows may keep either
    group: the op ranks fp32 group scores (a max, or a sum of two fp32 scores), the reference fp64."""
    m, n = choice.shape
    groups, keep = kw["num_groups"], kw["topk_groups"]
    size = n // groups
    top = 1 if kw["scoring"] == "softmax" else min(2, size)
    members = choice.view(m, groups, size).topk(top, dim=-1)
    score = members.values.sum(-1)
    score_mag = magnitude.view(m, groups, size).gather(2, members.indices).sum(-1)
    order = score.sort(dim=-1, descending=True, stable=True).indices
    last, first_out = order[:, keep - 1 : keep], order[:, keep : keep + 1]
    gap = (score.gather(1, last) - score.gather(1, first_out)).abs().squeeze(1)
    tie = gap <= ROUTE_TIE_REL * score_mag.gather(1, last).squeeze(1)
    alt = torch.zeros(m, groups, dtype=torch.bool, device=choice.device)
    alt.scatter_(1, torch.cat([order[:, : keep - 1], first_out], dim=1), True)
    masked = choice.masked_fill(~alt.repeat_interleave(size, dim=1), float("-inf"))
    return tie, masked.sort(dim=-1, descending=True, stable=True).indices[:, :TOP_K]


@pytest.mark.parametrize(
    "kw",
    [
        {"scoring": "softmax"},
        {"scoring": "softmax", "renormalize": False},
        {"scoring": "softmax", "num_groups": 8, "topk_groups": 3},
        {"scoring": "sigmoid", "bias": True, "routed_scaling_factor": 2.5},
        {"scoring": "sigmoid", "bias": True, "num_groups": 8, "topk_groups": 4},
    ],
)
def test_route_topk_matches_reference(kw):
    kw = dict(kw)
    m, n = 257, 256
    logits = torch.randn(m, n, device=DEV) * 2.0
    if kw.pop("bias", False):
        kw["correction_bias"] = torch.randn(n, device=DEV) * 0.1
    w, ids = op.route_topk(logits, TOP_K, **kw)
    w64, ids64 = ref.route_topk_reference(logits, TOP_K, **kw)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32 and ids.shape == (m, TOP_K)
    # The op ranks fp32 scores, the reference fp64 ones: two experts whose fp64 selection scores are
    # within fp32 rounding (ROUTE_TIE_REL) may swap places. Such rows are allowed, counted and rare;
    # every rank of them must still pick an expert whose fp64 selection score equals the reference's.
    z = logits.double()
    choice = torch.softmax(z, -1) if kw["scoring"] == "softmax" else torch.sigmoid(z)
    magnitude = choice.clone()  # what the fp32 rounding is relative to (score + |bias| when biased)
    if "correction_bias" in kw:
        choice = choice + kw["correction_bias"].double()
        magnitude = magnitude + kw["correction_bias"].double().abs()
    differ = (ids.long() != ids64).any(dim=-1)
    tie_ok = _ranks_tie(ids.long(), ids64, choice, magnitude)
    if "num_groups" in kw:  # a near-tie between the last kept group and the first dropped one
        group_tie, ids_alt = _group_tie_alternative(choice, magnitude, kw)
        tie_ok |= group_tie & _ranks_tie(ids.long(), ids_alt, choice, magnitude)
    assert not (differ & ~tie_ok).any(), f"{int((differ & ~tie_ok).sum())} rows differ beyond a tie"
    assert int(differ.sum()) <= 2, f"{int(differ.sum())} of {m} rows hit fp32 near-ties"
    same = ~differ
    assert torch.allclose(w[same].double(), w64[same], rtol=1e-5, atol=1e-7)
    if kw.get("renormalize", True):
        scale = kw.get("routed_scaling_factor", 1.0)
        assert torch.allclose(
            w.sum(-1).double(), torch.full((m,), scale, dtype=torch.float64, device=DEV), rtol=1e-5
        )
    if "num_groups" in kw:  # every chosen expert lies in one of the kept groups
        groups = (ids // (n // kw["num_groups"])).long()
        assert all(len(set(r.tolist())) <= kw["topk_groups"] for r in groups)


@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"scoring": "relu"}, "scoring"),
        ({"scoring": "softmax", "correction_bias": torch.zeros(64)}, "sigmoid"),
        ({"num_groups": 5, "topk_groups": 1}, "groups"),
        ({"num_groups": 8}, "both"),
    ],
)
def test_route_topk_rejects_bad_args(kw, msg):
    with pytest.raises(ValueError, match=msg):
        op.route_topk(torch.randn(4, 64), TOP_K, **kw)


# ---------------------------------------------------------------- real sizes on the GPU

GPU_SHAPES = [(192, 4096), (128, 4096), (256, 7168), (256, 8192)]  # K = 8192: the top of the supported range
# CUDA-core forms beside the shipped and heuristic picks: 1-4 experts per program, pipelined K strips
GEMV_FORMS = [
    Config(1, 1, 1024, 1, 4, 3, "gemv"),
    Config(1, 2, 1024, 1, 8, 2, "gemv"),  # x rows of 1024 fp32 per stage: fits 227 KiB at M = 8
    Config(1, 4, 512, 1, 8, 3, "gemv"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", GPU_SHAPES)
@pytest.mark.parametrize("m", [1, 3, 17, 1000, 8192])
def test_gpu_router_gemm_real_shapes(n, k, m):
    w = _weights(n, k)
    hi, lo = op.prepare(w)
    x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
    bias = torch.randn(n, device=DEV) * 0.01 if m == 17 else None
    err = _check_accuracy(_run(x, hi, lo, bias), x, w, bias)
    print(f"router_gemm N={n} K={k} M={m}: rel err {err:.2e}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 1000])
def test_gpu_router_gemm_fp32_x(m):
    n, k = 192, 4096
    w = _weights(n, k)
    hi, lo = op.prepare(w)
    x = torch.randn(m, k, device=DEV)
    _check_accuracy(_run(x, hi, lo), x, w)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", GPU_SHAPES)
def test_gpu_top8_sets_match_cublas_fp32(n, k):
    m = 8192
    w = _weights(n, k)
    hi, lo = op.prepare(w)
    x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
    exact = ref.router_gemm_reference(x, w)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        fp32 = x.float() @ w.t()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    differ, near_tie = _topk_mismatch(_run(x, hi, lo), fp32, exact, x, w)
    bf16 = x @ hi.t()
    differ16, _ = _topk_mismatch(bf16.float(), fp32, exact, x, w)
    print(
        f"top-8 N={n} K={k} M={m}: near ties {int(near_tie.sum())}, differ {int(differ.sum())} "
        f"(non-tie {int((differ & ~near_tie).sum())}); bf16 router differs on {int(differ16.sum())}"
    )
    assert not (differ & ~near_tie).any()
    assert (differ16 & ~near_tie).any()


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_and_determinism():
    n, k, m = 192, 4096, 8
    w = _weights(n, k)
    hi, lo = op.prepare(w)
    x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
    cfg = Config(16, 64, 128, 8, 4, 3)  # split-K: the in-kernel reduction is what is checked
    eager = [op.router_gemm(x, hi, lo, config=cfg) for _ in range(3)]
    assert all(torch.equal(eager[0], e) for e in eager[1:])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        op.router_gemm(x, hi, lo, config=cfg)  # counters exist for the capture stream
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            out = op.router_gemm(x, hi, lo, config=cfg)
    torch.cuda.current_stream().wait_stream(stream)
    x.copy_(torch.randn(m, k, device=DEV).to(torch.bfloat16))
    for _ in range(3):
        out.fill_(math.nan)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, op.router_gemm(x, hi, lo, config=cfg))
    _check_accuracy(out, x, w)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", GPU_SHAPES)
@pytest.mark.parametrize("m", [1, 3, 8])
def test_gpu_router_gemv_real_shapes_and_graph_replay(n, k, m):
    w = _weights(n, k)
    hi, lo = op.prepare(w)
    bias = torch.randn(n, device=DEV) * 0.01
    x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
    cfg = pick_config(1, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    assert cfg.impl == "gemv"
    for c in [cfg, heuristic_config(1, n, k, 132), *GEMV_FORMS]:
        _check_accuracy(_run(x, hi, lo, bias, config=c), x, w, bias)
    g = torch.cuda.CUDAGraph()
    out = torch.empty(m, n, device=DEV)
    op.router_gemm(x, hi, lo, bias, out=out, config=cfg)  # compiled before capture
    with torch.cuda.graph(g):
        op.router_gemm(x, hi, lo, bias, out=out, config=cfg)
    x.copy_(torch.randn(m, k, device=DEV).to(torch.bfloat16))
    out.fill_(math.nan)
    g.replay()
    torch.cuda.synchronize()
    _check_accuracy(out, x, w, bias)
