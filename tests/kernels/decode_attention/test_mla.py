"""The MLA form of paged decode attention (op.plan_mla / op.run_mla, kernel_mla.py) against the float64 reference
(reference.mla_decode_reference): one latent row of 512 + 64 columns per token shared by every query head, the
value being the row's first 512 columns. Tolerance: helpers.TOL (the same two bf16 roundings as the GQA form:
the probabilities before P.V and the output).

CPU: the Triton interpreter, each tile-loop path of the kernel once (chunked page ids at page 64, half-tile pages
at page 16, per-token pages at page 1), with a grid small enough that long rows are split and merged. GPU
(``-m gpu``): DeepSeek-V3 TP8 and attention-DP head counts at real lengths, and CUDA-graph replay.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.decode_attention import op  # noqa: E402
from hpc_advise.kernels.decode_attention.reference import mla_decode_reference  # noqa: E402
from tests.kernels.decode_attention.helpers import (  # noqa: E402
    BF16,
    DEVICE,
    FP16,
    TOL,
    fix_grid,
    make_mla_case,
    rel_err,
)
from tests.kernels.decode_attention.helpers import MLA_SM_SCALE as SM_SCALE  # noqa: E402

LORA = op.MLA_LORA


def check_mla(lens, *, heads, page, dtype=BF16, case=None, **plan_kw):
    q, kv, table, seq_lens = case or make_mla_case(lens, heads=heads, page=page, dtype=dtype)
    p = op.plan_mla(seq_lens, table, page_size=page, num_heads=heads, kv_dtype=kv.dtype, **plan_kw)
    out = torch.full((len(lens), heads, LORA), float("nan"), dtype=q.dtype, device=q.device)
    op.run_mla(p, q, kv, sm_scale=SM_SCALE, out=out)
    ref = mla_decode_reference(q, kv, table, seq_lens, page_size=page, kv_lora_rank=LORA, sm_scale=SM_SCALE)
    err = rel_err(out, ref)
    assert err <= TOL[dtype], f"relative error {err:.2e} > {TOL[dtype]:.0e} (lens {lens}, heads {heads})"
    return p, out


# (heads, page, dtype, lens): one row per tile-loop path; tile 32 (the tuned MLA tile)
FORMS = [
    pytest.param(16, 64, BF16, [1, 31, 33, 190], id="h16-p64-chunked"),
    pytest.param(32, 16, BF16, [2, 47, 130], id="h32-p16-half-tile"),
    pytest.param(8, 1, FP16, [3, 40], id="h8-p1-per-token-fp16"),
]


@pytest.mark.parametrize("heads, page, dtype, lens", FORMS)
def test_mla_forms_match_the_reference_with_split_rows(monkeypatch, heads, page, dtype, lens):
    fix_grid(monkeypatch, 2)  # 4 programs: the long rows are split over several and merged
    p, _ = check_mla(lens, heads=heads, page=page, dtype=dtype)
    assert p.config.tile == 32 and p.group == min(heads, 16) and p.rope_dim == op.MLA_ROPE
    assert int((p.merge_first >= 0).sum()) > 0, "no row was split: the merge went untested"


def test_mla_plan_update_reuses_the_plan_for_new_lengths(monkeypatch):
    fix_grid(monkeypatch, 2)
    q, kv, table, seq_lens = make_mla_case([60, 100], heads=16, page=16)
    p = op.plan_mla(seq_lens, table, page_size=16, num_heads=16, max_batch=4)
    shorter = torch.tensor([5, 99], dtype=torch.int32, device=q.device)
    out = op.run_mla(p.update(shorter, table), q, kv, sm_scale=SM_SCALE)
    ref = mla_decode_reference(q, kv, table, shorter, page_size=16, kv_lora_rank=LORA, sm_scale=SM_SCALE)
    assert rel_err(out, ref) <= TOL[BF16]


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(num_heads=24), "num_heads 24"),
        (dict(num_heads=16, kv_lora_rank=256), "latent 256"),
        (dict(num_heads=16, kv_dtype=torch.float8_e4m3fn), "bf16/fp16 KV"),
        (dict(num_heads=16, page_size=32), "page_size 32"),
    ],
)
def test_mla_plan_refuses_unsupported_geometry(kw, message):
    seq_lens = torch.ones(1, dtype=torch.int32, device=DEVICE)
    table = torch.zeros(1, 1, dtype=torch.int32, device=DEVICE)
    args = dict(page_size=16) | kw
    with pytest.raises(ValueError, match=message):
        op.plan_mla(seq_lens, table, **args)


def test_mla_run_refuses_wrong_tensors_and_forms():
    q, kv, table, seq_lens = make_mla_case([5], heads=16, page=16)
    p = op.plan_mla(seq_lens, table, page_size=16, num_heads=16)
    with pytest.raises(ValueError, match="kv_cache has shape"):
        op.run_mla(p, q, kv[..., :LORA].contiguous(), sm_scale=SM_SCALE)
    with pytest.raises(TypeError, match="kv_cache dtype"):
        op.run_mla(p, q, kv.to(torch.float8_e4m3fn), sm_scale=SM_SCALE)
    with pytest.raises(ValueError, match="run_mla"):
        op.run(p, q, kv, kv)
    gqa = op.plan(seq_lens, table, page_size=16, num_q_heads=16, num_kv_heads=1, head_dim=128)
    with pytest.raises(TypeError, match="plan_mla"):
        op.run_mla(gqa, q, kv, sm_scale=SM_SCALE)


# ---------------------------------------------------------------- GPU: real sizes


@pytest.mark.gpu
@pytest.mark.parametrize(
    "heads, page, lens",
    [
        (
            16,
            64,
            [1, 314, 2049, 17_000, 32_768, 9000, 77, 4096],
        ),  # DeepSeek-V3 TP8 rank, agentic-like lengths
        (16, 64, [2049] * 96),  # uniform, many requests
        (128, 64, [1, 513, 20_000, 3000]),  # attention-DP: all 128 heads on one rank
        (16, 1, [1, 700, 5000]),
        (16, 16, [15, 16, 17, 12_345]),
    ],
)
def test_gpu_mla_real_sizes(heads, page, lens):
    check_mla(lens, heads=heads, page=page)


@pytest.mark.gpu
def test_gpu_mla_cuda_graph_replay_matches_eager():
    lens = [4000, 64, 900, 20_000]  # the filled lengths: replays stay within them (slots past hold NaN)
    q, kv, table, seq_lens = make_mla_case(lens, heads=16, page=64)
    lens_buf, table_buf = seq_lens.clone(), table.clone()
    p = op.plan_mla(lens_buf, table_buf, page_size=64, num_heads=16, validate=False)
    out = torch.empty(len(lens), 16, LORA, dtype=q.dtype, device=q.device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        op.run_mla(p.update(lens_buf, table_buf), q, kv, sm_scale=SM_SCALE, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op.run_mla(p.update(lens_buf, table_buf, validate=False), q, kv, sm_scale=SM_SCALE, out=out)
    for new in ([3000, 1, 1, 19_999], [1, 1, 1, 1], lens):
        lens_buf.copy_(torch.tensor(new, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = op.run_mla(p.update(lens_buf, table_buf), q, kv, sm_scale=SM_SCALE)
        assert torch.equal(out, want), new
        ref = mla_decode_reference(
            q, kv, table_buf, lens_buf, page_size=64, kv_lora_rank=LORA, sm_scale=SM_SCALE
        )
        assert rel_err(out, ref) <= TOL[BF16], new
