"""Inputs of paged decode attention: layouts the kernel must read right (odd strides, SGLang's token pool, fp16,
more programs than work, tensor scales) against the float64 reference, and every unsupported input refused with
one clear error (helpers.TOL for the tolerances)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.decode_attention import op  # noqa: E402
from hpc_advise.kernels.decode_attention.config import Config  # noqa: E402
from hpc_advise.kernels.decode_attention.reference import decode_attention_reference  # noqa: E402
from tests.kernels.decode_attention.helpers import (  # noqa: E402
    BF16,
    DEVICE,
    FP8,
    FP16,
    TOL,
    check,
    fix_grid,
    make_case,
    plan_of,
    rel_err,
)


def test_fp8_fp16_products_fall_back_on_odd_v_layout():
    # f16_dot reads V as int16 pairs: a V view with an odd base address and odd strides (a slice of a wider
    # buffer) must take the plain conversion instead of reading shifted pairs; the warp-split loop the same way
    lens = [70, 5, 33]
    q, k, v, table, seq_lens = make_case(lens, hq=4, hkv=1, d=64, page=16, kv_dtype=FP8)
    wide = torch.zeros(*v.shape[:3], 65, dtype=torch.uint8, device=DEVICE)
    wide[..., 1:] = v.view(torch.uint8)
    v_odd = wide[..., 1:].view(FP8)
    assert v_odd.data_ptr() % 2 == 1 and v_odd.stride(2) % 2 == 1
    ref = decode_attention_reference(q, k, v, table, seq_lens, page_size=16, k_scale=0.5, v_scale=2.0)
    for cfg in (Config(tile=16, f16_dot=True), Config(tile=16, f16_dot=True, warp_split=True, num_warps=1)):
        p = plan_of(seq_lens, table, hq=4, hkv=1, d=64, page=16, config=cfg)
        assert bool(op._warp_split(p)) == cfg.warp_split
        out = op.run(p, q, k, v_odd, k_scale=0.5, v_scale=2.0, out=torch.full_like(q, float("nan")))
        assert rel_err(out, ref) <= TOL[FP8]


def test_transposed_fp8_k_not_4_byte_aligned_takes_plain_conversion():
    # the transposed kernel reads fp8 K as int32: a K view whose base is not 4-byte aligned converts bytewise
    lens = [70, 5, 33]
    q, k, v, table, seq_lens = make_case(lens, hq=8, hkv=1, d=64, page=64, kv_dtype=FP8)
    wide = torch.zeros(*k.shape[:3], 66, dtype=torch.uint8, device=DEVICE)
    wide[..., 2:] = k.view(torch.uint8)
    k_odd = wide[..., 2:].view(FP8)
    assert k_odd.data_ptr() % 4 == 2
    p = plan_of(seq_lens, table, hq=8, hkv=1, d=64, page=64, kv_dtype=FP8)
    assert p.config.transposed
    out = op.run(p, q, k_odd, v, k_scale=0.5, v_scale=2.0, out=torch.full_like(q, float("nan")))
    ref = decode_attention_reference(q, k, v, table, seq_lens, page_size=64, k_scale=0.5, v_scale=2.0)
    assert rel_err(out, ref) <= TOL[FP8]


def test_token_pool_viewed_as_pages():
    # SGLang's pool is [num_tokens, Hkv, D]; with page size 1 it is used as [num_tokens, 1, Hkv, D] (a view)
    gen = torch.Generator().manual_seed(torch.seed() % (2**31))
    pool_k = torch.randn(300, 2, 64, generator=gen).bfloat16().to(DEVICE)
    pool_v = torch.randn(300, 2, 64, generator=gen).bfloat16().to(DEVICE)
    lens = [37, 5]
    table = torch.stack([torch.randperm(300, generator=gen)[:40] for _ in lens]).int().to(DEVICE)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    q = torch.randn(2, 4, 64, generator=gen).bfloat16().to(DEVICE)
    k, v = pool_k.unsqueeze(1), pool_v.unsqueeze(1)
    out = op.decode_attention(q, k, v, table, seq_lens, page_size=1)
    assert rel_err(out, decode_attention_reference(q, k, v, table, seq_lens, page_size=1)) <= TOL[BF16]


def test_more_programs_than_work_fp16(monkeypatch):
    # 2 tiles over 9 programs: most ranges are empty and must neither write nor merge
    fix_grid(monkeypatch, 9)
    p, out = check([20], hq=2, hkv=1, d=64, page=16, kv_dtype=FP16, config=Config(tile=16, ctas_per_sm=1))
    assert out.dtype == FP16 and p.grid_size() == 9


def test_kv_dtype_unknown_takes_the_bf16_config():
    _, _, _, table, seq_lens = make_case([5], hq=2, hkv=1, d=64, page=16)
    p = plan_of(seq_lens, table, hq=2, hkv=1, d=64, page=16, kv_dtype=None)
    assert p.config == op.tuned_config(BF16, 1, 64, 16)


def _valid_args():
    q, k, v, table, seq_lens = make_case([20, 3], hq=4, hkv=2, d=64, page=16)
    return dict(q=q, k=k, v=v, table=table, seq_lens=seq_lens)


@pytest.mark.parametrize(
    "mutate,exc,msg",
    [
        (lambda a: a.update(q=a["q"].float()), TypeError, "q dtype"),
        (lambda a: a.update(k=a["k"].float()), TypeError, "k_cache dtype"),
        (lambda a: a.update(seq_lens=a["seq_lens"].long()), TypeError, "seq_lens dtype"),
        (lambda a: a.update(q=a["q"].transpose(1, 2).contiguous().transpose(1, 2)), ValueError, "contiguous"),
        (lambda a: a.update(q=a["q"][:, :3]), ValueError, "GQA|multiple|shape"),
        (lambda a: a.update(seq_lens=a["seq_lens"] * 0), ValueError, "lengths must lie"),
        (lambda a: a.update(seq_lens=a["seq_lens"] + 100), ValueError, "pages"),
        (lambda a: a.update(table=a["table"] * 0 + 999), ValueError, "page ids"),
        (lambda a: a.update(q=a["q"][:1]), ValueError, "batch"),
    ],
)
def test_bad_inputs_raise_clear_errors(mutate, exc, msg):
    a = _valid_args()
    mutate(a)
    with pytest.raises(exc, match=msg):
        op.decode_attention(a["q"], a["k"], a["v"], a["table"], a["seq_lens"], page_size=16)


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(head_dim=96), "head_dim 96"),
        (dict(page_size=32), "page_size 32"),
        (dict(num_q_heads=34, num_kv_heads=2), "group 17"),
        (dict(num_q_heads=5, num_kv_heads=2), "multiple"),
        (dict(schedule="greedy"), "schedule"),
        (dict(max_batch=2000), "max_batch"),
        (dict(config=Config(tile=48)), "tile 48"),
        (dict(config=Config(seg_cost=-1)), "seg_cost"),
        (dict(config=Config(seg_cost=2.5)), "seg_cost"),
        (dict(config=Config(whole_below=201)), "whole_below"),
        (dict(config=Config(merge_in_pass=True)), "merge_in_pass"),
        (dict(config=Config(ctas_per_sm=0)), "ctas_per_sm"),
        (dict(config=Config(num_warps=3)), "num_warps"),
        (dict(config=Config(transposed=True), page_size=16), "transposed needs"),
        (dict(config={"tile": 64}), "Config"),
        (dict(kv_dtype=torch.float32), "KV dtype"),
    ],
)
def test_plan_rejects_unsupported_shapes_and_configs(kw, msg):
    _, _, _, table, seq_lens = make_case([5], hq=2, hkv=1, d=64, page=16)
    args = dict(page_size=64, num_q_heads=2, num_kv_heads=1, head_dim=64) | kw
    with pytest.raises((ValueError, TypeError), match=msg):
        op.plan(seq_lens, table, **args)


def test_run_rejects_mismatched_cache():
    a = _valid_args()
    p = op.plan(a["seq_lens"], a["table"], page_size=16, num_q_heads=4, num_kv_heads=2, head_dim=64)
    with pytest.raises(ValueError, match="k_cache has shape"):
        op.run(p, a["q"], a["k"][:, :, :1].contiguous(), a["v"][:, :, :1].contiguous())
    with pytest.raises(TypeError, match="v_cache is"):
        op.run(p, a["q"], a["k"], a["v"].to(FP8))
    with pytest.raises(ValueError, match="k_scale"):
        op.run(p, a["q"], a["k"], a["v"], k_scale=-1.0)
    with pytest.raises(TypeError, match="DecodePlan"):
        op.run(None, a["q"], a["k"], a["v"])
