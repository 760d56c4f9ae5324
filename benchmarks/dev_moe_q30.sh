#!/usr/bin/env bash
# Fused MoE, Qwen3-30B-A3B decode (issue 7): more resident gate/up / down programs per SM, on the H200 (the `run`
# device tool, ONE call; carry .whl_profile and .whl_moe). benchmarks/dev_moe.sh's stages, limits and packing
# (results re-packed into $OUT/results.tgz after every stage), with these settings:
#   1. tune      tune_fused_moe.py --occupancy on Qwen3-30B-A3B at T = 16 / 64 / 128: the current pick against
#                fewer gate/up / down stages, the 2-stage gate/up capped at 128 registers (GU_MAXNREG: 4 programs
#                per SM), 8-warp programs (occupancy_candidates), current pick timed first and again last, merged
#                into $RES/fused_moe_configs.json only where >= 2% faster (<= 90 s). First, because its 14
#                precompile processes fill the Triton cache the tests then read (built one by one in 2 pytest
#                workers, the tests' kernels alone took most of a 40 s limit in earlier calls).
#   2. newtests  GPU tests of tests/kernels/test_fused_moe_decode_q30.py: every candidate at Qwen3-30B T = 16 / 128
#                against the pick (stage / cap forms bitwise), the cap read back from the compiled kernel, a CUDA
#                graph replay of the capped config with fresh routing (<= 40 s, -n 2)
#   3. bench     only if a Qwen3-30B pick changed: bench_fused_moe.py --shapes qwen3-30b-a3b --ts 16,64,128 with
#                the torch / fbgemm peers on the merged table (<= 40 s)
# Usage: CALL_S=190 bash benchmarks/dev_moe_q30.sh   (timeout_s 200). Results: $OUT/results.tgz.
# Run once, 2026-11-29 22:24-22:25 UTC (48.2 s, working tree of a43eb54): tune 27 s, GPU tests 3/3 in 21 s, no pick
# changed (best -1.8%: the capped 2-stage gate/up at T = 16), so no bench (benchmarks/results/fused_moe_decode_q30.md).
T_ALL=$SECONDS
CALL_S=${CALL_S:-190}
here="$(dirname "$0")"
cp hpc_advise/kernels/fused_moe/configs.json /tmp/configs_before.json
export MOE_TESTS=tests/kernels/test_fused_moe_decode_q30.py MOE_NEW_SEL=gpu MOE_TUNE_FLAG=--occupancy
STAGES=tune TUNE_S=90 TUNE_BUDGET=50 CALL_S=92 MOE_SHAPES=qwen3-30b-a3b MOE_TS=16,64,128 bash "$here/dev_moe.sh"
STAGES=newtests NEWTEST_S=40 CALL_S=42 bash "$here/dev_moe.sh"
changed=$(python3 - /tmp/configs_before.json /tmp/res/fused_moe_configs.json <<'EOF'
import json, sys
def picks(path):
    try:
        data = json.load(open(path))
    except OSError:
        return {}
    return {x["T"]: x["config"] for x in data["entries"] if (x["E"], x["H"], x["I"]) == (128, 2048, 768) and x["T"] <= 128}
old, new = picks(sys.argv[1]), picks(sys.argv[2])
print(" ".join(str(t) for t in sorted(new) if new[t] != old.get(t)))
EOF
)
echo "Qwen3-30B picks changed at T: ${changed:-none}"
left=$((CALL_S - (SECONDS - T_ALL)))
if [ -n "$changed" ]; then
  STAGES=bench MOE_BENCH_SHAPES=qwen3-30b-a3b MOE_BENCH_TS=16,64,128 MOE_BENCH_S=40 BENCH_MIN_S=25 CALL_S=$left \
    bash "$here/dev_moe.sh"
fi
grep -hE "^  cand |^  [a-z0-9-]+ [a-z-]+ T=[0-9]+: |budget" /tmp/res/moe_tune.log 2>/dev/null \
  | sed -E 's/"(GU_GROUP_M|DN_GROUP_M|GU_K|DN_K|BLOCK_M|GU_N|SPLIT_K|W_SCALAR|W_TMA|PDL)": [0-9]+, //g' | cut -c1-230
echo "[$((SECONDS - T_ALL))s] all stages"
