"""The launch configuration of paged decode attention (kernels/decode_attention/config.py): ``Config``'s fields
are exactly the keys the tuned tables use, every tuned default loads and runs on every supported geometry, and
the table picks the measured rows."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

torch = pytest.importorskip("torch")

from hpc_advise.kernels.decode_attention import config as C  # noqa: E402
from hpc_advise.kernels.decode_attention import op  # noqa: E402

KV_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn, None)


def test_config_fields_are_exactly_the_tuned_tables_keys():
    used = {key for table in C.TABLES.values() for row in table.values() for key in row}
    assert used == set(C.KEYS), (sorted(used), C.KEYS)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        C.Config().tile = 32


@pytest.mark.parametrize(
    "kv,hkv,d,page",
    list(itertools.product(KV_DTYPES, (1, 2, 8, 16), op.HEAD_DIMS, op.PAGE_SIZES)),
)
def test_every_tuned_default_loads_and_fits_its_geometry(kv, hkv, d, page):
    cfg = C.tuned_config(kv, hkv, d, page)
    assert isinstance(cfg, C.Config)
    assert cfg.problem(page) is None, cfg
    # head_dim 256 doubles every tile's bytes: half the tile, so as many programs fit an SM
    assert cfg.tile == (32 if d > 128 else 64)


def test_tuned_rows_per_form():
    bf16, fp16, fp8 = torch.bfloat16, torch.float16, torch.float8_e4m3fn
    base = C.Config(seg_cost=2)
    assert C.tuned_config(bf16, 1) == base == C.tuned_config(None, 1) == C.tuned_config(fp16, 1)
    assert C.tuned_config(bf16, 8) == dataclasses.replace(base, whole_below=100, merge_in_pass=32)
    assert C.tuned_config(fp16, 8) == base  # the many-heads bf16 rows were measured on bf16 only
    few_fp8 = C.tuned_config(fp8, 1, 128, 64)
    assert few_fp8 == C.Config(seg_cost=4, f16_dot=True, ctas_per_sm=2, transposed=True)
    # pages under the transposed tile: the plain loop's fp8 row (3 programs per SM)
    assert C.tuned_config(fp8, 1, 128, 16) == C.Config(seg_cost=4, f16_dot=True, ctas_per_sm=3)
    many_fp8 = C.tuned_config(fp8, 8, 128, 64)
    assert many_fp8 == C.Config(seg_cost=4, f16_dot=True, ctas_per_sm=3, transposed=True)
    # with >= 8 KV heads the transposed row falls back to the nested loop with the same tile, warps and grid
    assert C.tuned_config(fp8, 8, 128, 16) == dataclasses.replace(many_fp8, transposed=False)
    assert C.tuned_config(fp8, 8, 256, 64) == C.Config(
        tile=32, seg_cost=4, f16_dot=True, ctas_per_sm=4, num_warps=2, warp_split=True
    )


def test_unknown_kv_dtype_is_refused():
    with pytest.raises(ValueError, match="no tuned config"):
        C.tuned_config(torch.float32, 1)
