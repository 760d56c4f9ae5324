"""FP8 fused MoE for SM90 (Triton): routing on the GPU, gate/up GEMM with a fused SiLU·mul + FP8
quantization epilogue, down GEMM with the routing weight in its epilogue, top-k reduction.

Public entry points: ``op.fused_moe`` (the layer), ``reference.fused_moe_reference`` (ground truth).
"""

from .op import FusedMoEError, fused_moe, moe_unfused
from .reference import fused_moe_reference

__all__ = ["FusedMoEError", "fused_moe", "fused_moe_reference", "moe_unfused"]
