"""Goldens of the fused MoE: every configs.json entry (its launch keys on a small problem of its form) and
the untuned defaults, bitwise equal to the output recorded before the refactor (tests/kernels/goldens.py).

Each entry keeps its scale mode and launch keys; the problem is shrunk to E = 4 experts, top_k = 2 and the
smallest H / I its keys accept (DN_TILES needs H / DN_N tiles divisible by it; W_SCALAR and the block
forms need I % 128 == 0). T keeps the path: 1 and 4 stay (the small path's FUSE_QUANT serves T <= 4), the
other small-path entries run at T = 16 (<= 32), the regular decode entries at T = 24 and the prefill
entries (T >= 1024) at T = 72 with expert 0 in every token's first slot (BLOCK_M 128 blocks both full past
row 64 and padding-only there: GU_HALF / DN_HALF take both forms) and the multi-CTA router forced on, as it runs at their real sizes
(n >= ROUTE_MULTI_MIN_ENTRIES). A DN_GLUON entry runs its Triton down form (op.triton_down_form), as a
pick does off SM90: Gluon has no interpreter.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from hpc_advise.kernels.fused_moe import op  # noqa: E402
from hpc_advise.kernels.fused_moe.reference import quantize_weight  # noqa: E402
from tests.kernels.goldens import Goldens  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="goldens are CPU-interpreter outputs")

GOLDENS = Goldens(Path(__file__).with_name("goldens.json"))
ENTRIES = json.loads(op.CONFIG_PATH.read_text())["entries"]
E, TOP_K = 4, 2


def small_problem(t: int, hidden: int, inter: int, mode: str, seed: int, skew: bool = False) -> dict:
    """Fixed-seed problem: bf16 x, fp8 weights (per-tensor or 128x128 block scales), distinct top-k ids;
    ``skew``: every token's first slot is expert 0 (more than 64 rows there, ~T/3 on the others)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, hidden, generator=g).to(torch.bfloat16)
    wq = "block" if mode.startswith("block") else "tensor"
    w13, s13 = quantize_weight(torch.randn(E, 2 * inter, hidden, generator=g) / hidden**0.5, wq)
    w2, s2 = quantize_weight(torch.randn(E, hidden, inter, generator=g) / inter**0.5, wq)
    ids = torch.rand(t, E, generator=g).topk(TOP_K, dim=1).indices.to(torch.int32)
    if skew:
        ids = torch.stack(
            [torch.zeros(t, dtype=torch.int32), 1 + torch.randint(0, E - 1, (t,), generator=g).int()], 1
        )
    weights = torch.softmax(torch.randn(t, TOP_K, generator=g), dim=1)
    kw = dict(w13_scale=s13, w2_scale=s2)
    if mode.endswith("static"):
        kw.update(a13_scale=float(x.float().abs().max()) / 448.0, a2_scale=6.0 / 448.0)
    if wq == "block":
        kw["block_shape"] = (128, 128)
    return dict(x=x, w13=w13, w2=w2, ids=ids, weights=weights, kw=kw)


def small_form(entry: dict) -> tuple[int, int, int, bool]:
    """(T, H, I, multi-CTA router) of the small problem for a configs.json entry (module docstring)."""
    cfg, t = entry["config"], entry["T"]
    hidden = max(256, cfg["DN_N"] * cfg.get("DN_TILES", 1))
    inter = 128 if entry["mode"].startswith("block") or cfg.get("W_SCALAR") or cfg["GU_N"] >= 128 else 64
    if cfg.get("PATH") == "small":
        return (t if t <= 4 else 16), hidden, inter, False
    return (72, hidden, inter, True) if t >= 1024 else (24, hidden, inter, False)


def run(p: dict, config) -> torch.Tensor:
    out = torch.full_like(p["x"], float("nan"))
    op.fused_moe(p["x"], p["w13"], p["w2"], p["weights"], p["ids"], out=out, config=config, **p["kw"])
    assert not torch.isnan(out).any()
    return out


def _entry_id(i: int, e: dict) -> str:
    return f"{i:02d}-E{e['E']}-H{e['H']}-I{e['I']}-{e['mode']}-T{e['T']}"


@pytest.mark.parametrize("i", range(len(ENTRIES)), ids=[_entry_id(i, e) for i, e in enumerate(ENTRIES)])
def test_configs_json_entry_matches_its_golden(i, monkeypatch):
    entry = ENTRIES[i]
    t, hidden, inter, multi = small_form(entry)
    if multi:
        monkeypatch.setattr(op, "ROUTE_MULTI_MIN_ENTRIES", 1)
        monkeypatch.setattr(op, "ROUTE_CHUNK", 32)
    p = small_problem(t, hidden, inter, entry["mode"], seed=1000 + i, skew=multi)
    GOLDENS.check(_entry_id(i, entry), run(p, op.triton_down_form(dict(entry["config"]))))


# untuned shapes (E = 4 is in no table): op.default_config's decode, mid and prefill branches
DEFAULTS = [
    ("decode-tensor-static", 3, 256, 64, "tensor-static"),
    ("decode-block-dynamic", 3, 256, 128, "block-dynamic"),
    ("mid-block-dynamic", 160, 256, 128, "block-dynamic"),
    ("prefill-block-dynamic", 1100, 256, 128, "block-dynamic"),
    ("prefill-tensor-static", 1100, 256, 64, "tensor-static"),
]


@pytest.mark.parametrize("name,t,hidden,inter,mode", DEFAULTS, ids=[d[0] for d in DEFAULTS])
def test_default_config_matches_its_golden(name, t, hidden, inter, mode):
    p = small_problem(t, hidden, inter, mode, seed=7)
    GOLDENS.check(f"default-{name}", run(p, None))
