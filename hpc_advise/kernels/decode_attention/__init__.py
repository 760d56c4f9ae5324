"""Paged decode attention for SM90 (Triton): a GPU-side planner spreads uniform KV tiles of all requests
over a persistent grid; split requests are merged by log-sum-exp. ``op`` has the public functions."""

from .op import DecodePlan, decode_attention, plan, run

__all__ = ["DecodePlan", "decode_attention", "plan", "run"]
