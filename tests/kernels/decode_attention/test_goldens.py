"""Goldens of paged decode attention: every tuned-default branch of ``op.tuned_config`` (KV dtype x KV heads x
head_dim x page size) and the static split-k schedule, bitwise equal to the output recorded before the
refactor (tests/kernels/goldens.py). Plans are built as ``decode_attention()`` and the SGLang backend build
them: ``kv_dtype`` given, every launch knob left to the tuned table. The lengths mix one-tile requests (written
directly), requests split over a few programs and one split over many (merged by log-sum-exp), so the merge
paths of each branch run on the interpreter's small grid (op.CPU_NUM_SMS SMs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.decode_attention import op  # noqa: E402
from tests.kernels.decode_attention.helpers import BF16, FP8, FP16, MLA_SM_SCALE, make_case, make_mla_case  # noqa: E402
from tests.kernels.goldens import Goldens  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="goldens are CPU-interpreter outputs")

GOLDENS = Goldens(Path(__file__).with_name("goldens.json"))
LENS = [5, 64, 333, 1000, 90]

# (id, kv dtype, q heads, kv heads, head_dim, page, schedule, tensor scales)
CASES = [
    ("bf16-few-d128-p64", BF16, 8, 1, 128, 64, "dynamic", False),
    ("bf16-few-d128-p16", BF16, 8, 1, 128, 16, "dynamic", False),
    ("bf16-few-d64-p1", BF16, 4, 2, 64, 1, "dynamic", False),
    ("fp16-few-d128-p64", FP16, 8, 1, 128, 64, "dynamic", False),
    ("bf16-many-d128-p64", BF16, 16, 8, 128, 64, "dynamic", False),
    ("bf16-many-d256-p16", BF16, 16, 8, 256, 16, "dynamic", False),
    ("fp8-few-d128-p64", FP8, 8, 1, 128, 64, "dynamic", False),
    ("fp8-few-d128-p16", FP8, 8, 1, 128, 16, "dynamic", True),
    ("fp8-many-d128-p64", FP8, 16, 8, 128, 64, "dynamic", True),
    ("fp8-many-d128-p16", FP8, 16, 8, 128, 16, "dynamic", False),
    ("fp8-many-d256-p64", FP8, 16, 8, 256, 64, "dynamic", False),
    ("bf16-few-d128-p64-static", BF16, 8, 1, 128, 64, "static", False),
    ("fp8-many-d128-p64-static", FP8, 16, 8, 128, 64, "static", False),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_tuned_branch_matches_its_golden(case):
    name, kv_dtype, hq, hkv, d, page, schedule, tensor_scales = case
    q, k, v, table, seq_lens = make_case(
        LENS, hq=hq, hkv=hkv, d=d, page=page, kv_dtype=kv_dtype, seed=11, device="cpu"
    )
    p = op.plan(
        seq_lens,
        table,
        page_size=page,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=d,
        schedule=schedule,
        kv_dtype=kv_dtype,
    )
    scales = (0.5, 2.0) if kv_dtype == FP8 else (1.0, 1.0)
    if tensor_scales:
        scales = tuple(torch.tensor([s]) for s in scales)
    out = torch.full_like(q, float("nan"))
    op.run(p, q, k, v, k_scale=scales[0], v_scale=scales[1], out=out)
    assert not torch.isnan(out).any()
    GOLDENS.check(name, out)


# The MLA form (op.plan_mla, its tuned row): one row per tile-loop path, recorded when the form was added so that
# later changes to the shared planner, merge or page-id helpers show in it bit for bit.
MLA_CASES = [("mla-h16-p64", 16, 64), ("mla-h32-p16", 32, 16), ("mla-h8-p1", 8, 1)]


@pytest.mark.parametrize("case", MLA_CASES, ids=[c[0] for c in MLA_CASES])
def test_mla_form_matches_its_golden(case):
    name, heads, page = case
    q, kv, table, seq_lens = make_mla_case([5, 64, 333, 90], heads=heads, page=page, seed=11, device="cpu")
    p = op.plan_mla(seq_lens, table, page_size=page, num_heads=heads, kv_dtype=kv.dtype)
    out = torch.full((q.shape[0], heads, op.MLA_LORA), float("nan"), dtype=q.dtype)
    op.run_mla(p, q, kv, sm_scale=MLA_SM_SCALE, out=out)
    assert not torch.isnan(out).any()
    GOLDENS.check(name, out)
