"""Launch configuration of paged decode attention: the frozen ``Config`` and the tuned defaults.

``Config``'s fields are exactly the keys the tuned tables below use; every other launch choice is fixed in
``op.py`` (one value in every tuned default, so not an option). ``tuned_config`` picks the table rows for a
KV dtype, KV-head count, head_dim and page size, as measured on an H200 (README.md, "Decisions"):

- ``BASE`` per KV dtype, then on top of it
- ``MANY_KV_HEADS_TABLE`` for plans with at least ``MANY_KV_HEADS`` KV heads at head_dim <= 128,
  ``MANY_KV_HEADS_WIDE_TABLE`` for those at head_dim 256, and ``FEW_KV_HEADS_TABLE`` for fewer KV heads at
  head_dim <= 128 with pages of at least that row's tile.

The MLA form (``op.plan_mla``) takes ``BASE`` and ``MLA_TABLE`` (``tuned_mla_config``).

The KV-head count stands in for the work per step (the planner sees no lengths without a host sync). A KV dtype
of None (the caller does not know the pool's dtype) gets the bf16 rows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

TILES = (16, 32, 64, 128)
NUM_WARPS = (1, 2, 4, 8)
MAX_CTAS_PER_SM = 8
MAX_SEG_COST = 64
MAX_WHOLE_BELOW = 200
MAX_MERGE_IN_PASS = 64
MERGE_COLS = (64, 128, 256, 512)
MANY_KV_HEADS = 8


@dataclass(frozen=True)
class Config:
    """One launch configuration; defaults are what applies where no tuned table sets the key."""

    tile: int = 64  # tokens per tile (32 at head_dim 256: twice the bytes per token)
    num_warps: int = 4  # warps per attention program
    ctas_per_sm: int = 2  # programs per SM of the persistent grid
    seg_cost: int = 0  # planner: tiles charged per segment start when balancing programs
    f16_dot: bool = False  # fp8 KV: products in fp16 (e4m3 -> fp16 is exact) instead of q's dtype
    transposed: bool = False  # kernel_transposed's tile loop (tokens on the MMA's M side)
    warp_split: bool = False  # a tile's tokens split over the warps, one softmax state per warp
    whole_below: int = 0  # planner: segments costing <= this % of a program's share are never split
    merge_in_pass: int = 0  # split segments over <= this many programs merge in the attention pass
    merge_cols: int = 64  # columns of D per narrow merge program (at most D; 2 warps per 64 columns)

    def problem(self, page_size: int) -> str | None:
        """Why this config cannot run with pages of ``page_size`` tokens, or None."""
        if self.tile not in TILES:
            return f"tile {self.tile} must be one of {TILES}"
        if page_size < self.tile and self.tile % page_size:
            return f"tile {self.tile} must be a multiple of page_size {page_size} (or at most it)"
        if self.num_warps not in NUM_WARPS:
            return f"num_warps {self.num_warps} must be one of {NUM_WARPS}"
        for name, lo, hi in (
            ("ctas_per_sm", 1, MAX_CTAS_PER_SM),
            ("seg_cost", 0, MAX_SEG_COST),
            ("whole_below", 0, MAX_WHOLE_BELOW),
            ("merge_in_pass", 0, MAX_MERGE_IN_PASS),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                return f"{name} must be an int in {lo}..{hi}, got {v!r}"
        if self.merge_cols not in MERGE_COLS:
            return f"merge_cols {self.merge_cols} must be one of {MERGE_COLS}"
        if self.transposed and not transposed_fits(page_size, self.tile):
            return f"transposed needs page_size >= tile or == tile / 2, got page_size {page_size}, tile {self.tile}"
        return None

    def to_dict(self) -> dict:
        return asdict(self)


KEYS = tuple(f.name for f in fields(Config))

# Rows of the tuned tables by KV dtype name ("bf16", "fp16", "fp8"); only keys of Config.
BASE = {
    "bf16": {"seg_cost": 2},
    "fp16": {"seg_cost": 2},
    "fp8": {"seg_cost": 4, "f16_dot": True, "ctas_per_sm": 3},
}
MANY_KV_HEADS_TABLE = {
    "bf16": {"whole_below": 100, "merge_in_pass": 32},
    "fp8": {"transposed": True, "num_warps": 4, "ctas_per_sm": 3, "tile": 64},
}
MANY_KV_HEADS_WIDE_TABLE = {"fp8": {"warp_split": True, "num_warps": 2, "ctas_per_sm": 4}}
FEW_KV_HEADS_TABLE = {"fp8": {"transposed": True, "num_warps": 4, "ctas_per_sm": 2, "tile": 64}}
# The MLA form (kernel_mla.py: 512 latent + 64 rope columns per token, one pool row for all heads).
MLA_TABLE = {"bf16": {"tile": 32, "merge_cols": 128}, "fp16": {"tile": 32, "merge_cols": 128}}
TABLES = {
    "BASE": BASE,
    "MANY_KV_HEADS_TABLE": MANY_KV_HEADS_TABLE,
    "MANY_KV_HEADS_WIDE_TABLE": MANY_KV_HEADS_WIDE_TABLE,
    "FEW_KV_HEADS_TABLE": FEW_KV_HEADS_TABLE,
    "MLA_TABLE": MLA_TABLE,
}


def transposed_fits(page_size: int, tile: int) -> bool:
    """The transposed kernel reads one or two page ids per tile: page >= tile or page == tile / 2."""
    return page_size >= tile or 2 * page_size == tile


def kv_name(kv_dtype: object) -> str:
    """The KV dtype's name in the tables ("bf16", "fp16" or "fp8") for a torch dtype or a name; None is bf16."""
    text = "bfloat16" if kv_dtype is None else str(kv_dtype)
    if text in BASE:
        return text
    if "float8" in text:
        return "fp8"
    if "bfloat16" in text:
        return "bf16"
    if "float16" in text:
        return "fp16"
    raise ValueError(f"decode_attention: no tuned config for KV dtype {kv_dtype}")


def tuned_config(
    kv_dtype: object, num_kv_heads: int, head_dim: int = 128, page_size: int | None = None
) -> Config:
    """The tuned ``Config`` for this KV dtype, KV-head count, head_dim and page size (None: as for pages of at
    least 64 tokens). A tuned row whose transposed kernel cannot read this page size falls back to the nested
    loop with the same tile, warps and grid."""
    kv = kv_name(kv_dtype)
    keys = dict(BASE[kv])
    if head_dim > 128:
        keys["tile"] = 32
        if num_kv_heads >= MANY_KV_HEADS:
            keys |= MANY_KV_HEADS_WIDE_TABLE.get(kv, {})
    elif num_kv_heads >= MANY_KV_HEADS:
        keys |= MANY_KV_HEADS_TABLE.get(kv, {})
    else:
        few = FEW_KV_HEADS_TABLE.get(kv, {})
        if page_size is None or page_size >= few.get("tile", Config.tile):
            keys |= few
    cfg = Config(**keys)
    if cfg.transposed and page_size is not None and not transposed_fits(page_size, cfg.tile):
        cfg = replace(cfg, transposed=False)
    return cfg


def tuned_mla_config(kv_dtype: object) -> Config:
    """The tuned ``Config`` of the MLA form for this KV dtype (bf16 or fp16; None is bf16)."""
    kv = kv_name(kv_dtype)
    if kv not in MLA_TABLE:
        raise ValueError(f"decode_attention: the MLA form reads bf16/fp16 KV, got {kv_dtype}")
    return Config(**(BASE[kv] | MLA_TABLE[kv]))
