"""Launch configurations of the router GEMM: a data table (``configs.json``) plus the fallback rule.

``configs.json`` holds measured configs per (N, K) and M bucket: ``{"entries": [{"n", "k", "m_max",
"block_m", "block_n", "block_k", "split_k", "num_warps", "num_stages", "impl"}, ...]}``. ``impl`` is
"mma" (tensor-core tiles, ``router_gemm_kernel``; the default when absent) or "gemv" (CUDA-core path
for M <= ``GEMV_MAX_M``, ``router_gemv_kernel``: ``block_n`` = experts per program, ``block_k`` = K
strip per step, ``block_m`` and ``split_k`` = 1). For M the entry with
the smallest ``m_max >= M`` of that (N, K) is used (the largest one above the last bucket). Shapes not
in the table get ``heuristic_config``: tile sizes by M, and for small M a K split that puts about two
CTAs on every SM. Every config is checked by ``Config.validate`` before use.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

CONFIG_FILE = Path(__file__).with_name("configs.json")
GEMV_MAX_M = 8  # most tokens the CUDA-core path takes (its lanes are M_PAD x experts per program)


@dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    impl: str = "mma"

    def validate(self, K: int) -> None:
        if self.impl == "gemv":
            self._validate_gemv()
        elif self.impl == "mma":
            self._validate_mma(K)
        else:
            raise ValueError(f"router_gemm config: impl={self.impl!r} must be 'mma' or 'gemv'")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise ValueError(
                f"router_gemm config: bad num_warps/num_stages {self.num_warps}/{self.num_stages}"
            )

    def _validate_mma(self, K: int) -> None:
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"router_gemm config: {name}={v} must be a power of two >= 16")
        k_blocks = -(-K // self.block_k)
        if not 1 <= self.split_k <= k_blocks:
            raise ValueError(f"router_gemm config: split_k={self.split_k} outside 1..{k_blocks} for K={K}")

    def _validate_gemv(self) -> None:
        if self.block_m != 1 or self.split_k != 1:
            raise ValueError("router_gemm config: impl='gemv' takes block_m=1 and split_k=1")
        if self.block_n not in (1, 2, 4, 8):
            raise ValueError(f"router_gemm config: gemv block_n={self.block_n} must be 1, 2, 4 or 8")
        if self.block_k < 64 or self.block_k > 8192 or self.block_k & (self.block_k - 1):
            raise ValueError(
                f"router_gemm config: gemv block_k={self.block_k} must be a power of two in 64..8192"
            )

    def serves(self, M: int) -> bool:
        """Whether this config can run M tokens (the gemv path stops at GEMV_MAX_M)."""
        return self.impl != "gemv" or M <= GEMV_MAX_M

    def to_dict(self) -> dict:
        return asdict(self)


def _pow2_floor(v: int) -> int:
    return 1 << (max(1, v).bit_length() - 1)


def heuristic_config(M: int, N: int, K: int, num_sms: int) -> Config:
    """Fallback for shapes without a measured entry, shaped after the H200 sweep's winners: the
    CUDA-core path over the whole K for a single token; thin tiles and a K split to about one CTA per SM for decode-size M; 64×64 tiles split ~2 CTAs per SM up
    to M = 512; 64×64×128 tiles, 4 stages, no split above."""
    if M == 1:  # the CUDA-core path won M = 1 at all three tuned shapes (one expert row per program)
        return Config(1, 1, min(8192, 1 << (K - 1).bit_length()), 1, 8, 1, "gemv")
    if M <= 64:
        bm, bn, bk, stages, target = (16 if M <= 16 else 32), 32, 128, 3, num_sms
    elif M <= 512:
        bm, bn, bk, stages, target = 64, 64, 128, 3, 2 * num_sms
    else:
        bm, bn, bk, stages, target = 64, 64, 128, 4, 0
    k_blocks = -(-K // bk)
    tiles = -(-M // bm) * -(-N // bn)
    split = 1
    if target >= 2 * tiles:
        split = min(k_blocks, _pow2_floor(target // tiles))
        while split > 1 and k_blocks % split:
            split //= 2
    return Config(bm, bn, bk, split, 4, stages)


@functools.lru_cache(maxsize=1)
def _table() -> dict[tuple[int, int], list[tuple[int, Config]]]:
    if not CONFIG_FILE.exists():
        return {}
    data = json.loads(CONFIG_FILE.read_text())
    table: dict[tuple[int, int], list[tuple[int, Config]]] = {}
    for i, e in enumerate(data.get("entries", [])):
        try:
            cfg = Config(
                int(e["block_m"]),
                int(e["block_n"]),
                int(e["block_k"]),
                int(e["split_k"]),
                int(e["num_warps"]),
                int(e["num_stages"]),
                str(e.get("impl", "mma")),
            )
            key = (int(e["n"]), int(e["k"]))
            cfg.validate(key[1])
            if not cfg.serves(int(e["m_max"])):
                raise ValueError(f"impl 'gemv' serves M <= {GEMV_MAX_M}, not m_max={e['m_max']}")
            table.setdefault(key, []).append((int(e["m_max"]), cfg))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{CONFIG_FILE}: entry {i}: {exc}") from exc
    for entries in table.values():
        entries.sort(key=lambda t: t[0])
    return table


def pick_config(M: int, N: int, K: int, num_sms: int) -> Config:
    """The measured config for (M bucket, N, K), else ``heuristic_config``."""
    entries = _table().get((N, K))
    if not entries:
        return heuristic_config(M, N, K, num_sms)
    for m_max, cfg in entries:
        if M <= m_max and cfg.serves(M):
            return cfg
    for _m_max, cfg in reversed(entries):  # past the last bucket: the largest one that serves M
        if cfg.serves(M):
            return cfg
    return heuristic_config(M, N, K, num_sms)
