"""Workloads for Nsight Compute: each target builds one benchmark case with the shipped defaults and runs it a
few times, so that `ncu` can profile its kernels (the decode-attention and fused-MoE misses of issues 5 and 7).

    ncu --clock-control none -k regex:'gate_up|down_kernel' -c 2 --section SpeedOfLight \\
        python3 benchmarks/diagnostics/ncu_targets.py moe-deepseek-ep8-t16

The inputs are the benchmarks' own (hpc_advise.runtime.measure.cases: random weights and routings, a KV pool with
pages scattered over it); this script times nothing itself. `--list` prints the targets.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

CALLS = 3  # the first call compiles; ncu's -c / --launch-skip choose which launches it profiles

MOE_TARGETS = {  # name -> (bench shape, T)
    "moe-deepseek-ep8-t16": ("deepseek-v3-ep8", 16),
    "moe-qwen3-30b-t16": ("qwen3-30b-a3b", 16),
    "moe-qwen3-30b-t128": ("qwen3-30b-a3b", 128),
    "moe-qwen3-235b-t1": ("qwen3-235b", 1),
}
ATTN_TARGETS = {  # name -> (bench case, Hq, Hkv, KV dtype)
    "attn-fp8-64x4k": ("64 x 4K", 64, 8, "fp8"),
    "attn-fp8-mix": ("32 x 128 + 32 x 4K", 64, 8, "fp8"),
    "attn-bf16-mix": ("32 x 128 + 32 x 4K", 64, 8, "bf16"),
    "attn-bf16-8-1-128k": ("1 x 128K", 8, 1, "bf16"),
}


def moe_calls(shape: str, t: int) -> list:
    from hpc_advise.runtime.measure.cases import fused_moe as fb

    e, h, i, k, eg, _ = fb.SHAPES[shape]
    mode = fb.MODES[shape][0]
    wts = fb.make_weights(e, h, i, mode)
    ours = fb.providers(shape, mode, wts, peers=False, fbgemm_ok=False)["ours"]
    return [lambda s=s: ours(s) for s in fb.make_routings(t, k, eg, h, CALLS)]


def attn_calls(case: str, hq: int, hkv: int, kv: str) -> list:
    import torch

    from hpc_advise.runtime.measure.cases import decode_attention as da

    kv_dtype = torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16
    w = da.Workload(da.case_lengths(case), hq, hkv, kv_dtype)
    calls, _, _ = da._ours(w, "dynamic")
    return [calls[j % len(calls)] for j in range(CALLS)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", nargs="?", choices=[*MOE_TARGETS, *ATTN_TARGETS])
    ap.add_argument("--list", action="store_true", help="print the targets and exit")
    args = ap.parse_args()
    if args.list or args.target is None:
        print("\n".join([*MOE_TARGETS, *ATTN_TARGETS]))
        return 0
    import torch

    if args.target in MOE_TARGETS:
        calls = moe_calls(*MOE_TARGETS[args.target])
    else:
        calls = attn_calls(*ATTN_TARGETS[args.target])
    for call in calls:
        call()
        torch.cuda.synchronize()
    print(f"{args.target}: {len(calls)} calls done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
