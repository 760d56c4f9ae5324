"""The shipped forms of paged decode attention against the float64 reference: one table of the tuned defaults
(KV dtype x GQA group x head_dim x page size x dynamic / static schedule), each row also asserting which kernel
path its tuned config runs, so the table covers every path a tuned default reaches. Tolerances: helpers.TOL.

CPU: the Triton interpreter, lengths around a tile next to ones split over several programs of the small grid
(op.CPU_NUM_SMS SMs). GPU (``-m gpu``): the same forms at real sizes, and CUDA-graph replay with new lengths.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.decode_attention import op  # noqa: E402
from tests.kernels.decode_attention.helpers import (  # noqa: E402
    BF16,
    FP8,
    FP16,
    check,
    check_graph_replay,
    make_case,
    plan_of,
)

LENS = [1, 63, 65, 97, 300, 700]  # one-tile rows (written directly) next to rows split and merged
LENS_MANY = [
    1,
    65,
    97,
    300,
]  # the same with 8 KV heads (8 segments per request) at an eighth of the grid's share
# (id, kv dtype, q heads, kv heads, head_dim, page, schedule, tensor scales, path the tuned config takes)
FORMS = [
    ("bf16-8/1-d128-p64", BF16, 8, 1, 128, 64, "dynamic", False, "chunked"),
    ("bf16-8/1-d128-p16-static", BF16, 8, 1, 128, 16, "static", False, "plain"),
    ("bf16-5/1-d64-p1", BF16, 5, 1, 64, 1, "dynamic", False, "plain"),
    ("bf16-16/1-d64-p16", BF16, 16, 1, 64, 16, "dynamic", False, "plain"),
    ("fp16-8/1-d128-p64", FP16, 8, 1, 128, 64, "dynamic", False, "chunked"),
    ("bf16-16/8-d128-p64", BF16, 16, 8, 128, 64, "dynamic", False, "chunked+whole+in-pass"),
    ("bf16-16/8-d256-p16", BF16, 16, 8, 256, 16, "dynamic", False, "chunked"),
    ("fp8-8/1-d128-p64", FP8, 8, 1, 128, 64, "dynamic", True, "transposed"),
    ("fp8-8/1-d128-p16", FP8, 8, 1, 128, 16, "dynamic", False, "plain+f16"),
    ("fp8-16/8-d128-p64", FP8, 16, 8, 128, 64, "dynamic", True, "transposed"),
    ("fp8-16/8-d128-p64-static", FP8, 16, 8, 128, 64, "static", False, "transposed"),
    ("fp8-16/8-d128-p16", FP8, 16, 8, 128, 16, "dynamic", False, "plain+f16"),
    ("fp8-16/8-d256-p64", FP8, 16, 8, 256, 64, "dynamic", False, "warp-split+f16"),
    ("fp8-4/2-d64-p1", FP8, 4, 2, 64, 1, "dynamic", False, "plain+f16"),
]


def path_of(p) -> str:
    """The kernel path a plan runs (op.run's dispatch), in FORMS' words."""
    cfg = p.config
    if cfg.transposed:
        path = "transposed"
    elif op._warp_split(p):
        path = "warp-split"
    elif p.page_size >= p.tile or p.tile == 2 * p.page_size:
        path = "chunked"
    else:
        path = "plain"
    if cfg.whole_below:
        path += "+whole"
    if cfg.merge_in_pass:
        path += "+in-pass"
    if cfg.f16_dot and not cfg.transposed:
        path += "+f16"
    return path


@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
def test_shipped_form_matches_reference(form):
    _, kv, hq, hkv, d, page, schedule, tensor_scales, path = form
    scales = (0.37, 1.9) if kv == FP8 else (1.0, 1.0)
    if tensor_scales:
        scales = tuple(
            torch.tensor([s], device="cuda" if torch.cuda.is_available() else "cpu") for s in scales
        )
    lens = LENS_MANY if hkv >= op.MANY_KV_HEADS else LENS
    p, _ = check(lens, hq=hq, hkv=hkv, d=d, page=page, kv_dtype=kv, schedule=schedule, scales=scales)
    assert path_of(p) == path
    assert p.config == op.tuned_config(kv, hkv, d, page)
    # the case splits segments, so the merge (launch or in-pass) ran
    assert (p.merge_first >= 0).any() or p.config.merge_in_pass or schedule == "static"


def test_decode_attention_runs_the_tuned_plan():
    # the one-call form plans with the KV dtype's tuned config: bitwise the plan + run of that config
    q, k, v, table, seq_lens = make_case(LENS, hq=8, hkv=1, d=64, page=16, kv_dtype=FP8)
    one = op.decode_attention(q, k, v, table, seq_lens, page_size=16, k_scale=0.5, v_scale=2.0)
    p = plan_of(seq_lens, table, hq=8, hkv=1, d=64, page=16, kv_dtype=FP8)
    assert torch.equal(one, op.run(p, q, k, v, k_scale=0.5, v_scale=2.0))


# ---------------------------------------------------------------- GPU, real sizes

EDGE = [1, 63, 64, 65, 97] + [4096] * 11  # lengths around a tile / page, next to full ones
MIXED = [128] * 8 + [3000] * 8 + [70000]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lens,hq,hkv,d,page,kv,schedule",
    [
        (EDGE, 8, 1, 128, 64, BF16, "dynamic"),
        (EDGE + [70000], 8, 1, 128, 64, FP8, "dynamic"),
        (EDGE, 8, 1, 128, 64, BF16, "static"),
        (MIXED, 64, 8, 128, 64, BF16, "dynamic"),
        (MIXED, 64, 8, 128, 64, FP8, "dynamic"),
        (MIXED, 64, 8, 128, 64, FP8, "static"),
        (EDGE + [127, 129, 70000], 64, 8, 128, 16, FP8, "dynamic"),
        ([5, 1000, 20000], 16, 1, 256, 16, BF16, "dynamic"),
        ([5, 1000, 20000, 3000], 16, 8, 256, 64, FP8, "dynamic"),
        ([777, 33, 2500], 12, 12, 64, 1, FP8, "dynamic"),
        (EDGE + [70000], 8, 1, 128, 64, FP16, "dynamic"),
    ],
)
def test_gpu_tuned_forms_real_sizes(lens, hq, hkv, d, page, kv, schedule):
    check(lens, hq=hq, hkv=hkv, d=d, page=page, kv_dtype=kv, schedule=schedule)


@pytest.mark.gpu
def test_gpu_longest_context_and_largest_batch():
    check([op.MAX_SEQ_LEN], hq=8, hkv=1, d=128, page=64)
    gen = torch.Generator().manual_seed(3)
    check(torch.randint(1, 600, (op.MAX_BATCH,), generator=gen).tolist(), hq=4, hkv=1, d=128, page=16)


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,kv", [(8, 1, BF16), (8, 1, FP8), (64, 8, BF16), (64, 8, FP8)])
def test_gpu_cuda_graph_replay_matches_eager(hq, hkv, kv):
    # the tuned form, captured once with the merge launch as a programmatic dependent, replayed with new lengths
    page = 64
    q, k, v, table, _ = make_case([12800, 100, 12800, 5000], hq=hq, hkv=hkv, d=128, page=page, kv_dtype=kv)
    lens_buf = torch.tensor([4000, 100, 9000, 64], dtype=torch.int32, device="cuda")
    p = plan_of(lens_buf, table, hq=hq, hkv=hkv, d=128, page=page, kv_dtype=kv)
    steps = ([4001, 1, 12000, 65], [64, 64, 64, 64], [12800, 100, 300, 5000])
    scales = (0.8, 1.3) if kv == FP8 else (1.0, 1.0)
    check_graph_replay(p, q, k, v, table, lens_buf, steps, page=page, scales=scales)
