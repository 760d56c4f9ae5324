"""FP32-accurate MoE router GEMM from two BF16 tensor-core products, plus top-k routing.

``op.prepare`` splits the fp32 gate weight once; ``op.router_gemm`` computes fp32 logits in one Triton
launch; ``op.route_topk`` picks the experts; ``reference`` holds float64 ground truth. See README.md.
"""
