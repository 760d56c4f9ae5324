#!/usr/bin/env bash
# Fused MoE: the lagged scale application (config SCALE_LAG) on the H200 (the `run` device tool, ONE call;
# carry .whl_profile and .whl_moe): benchmarks/dev_moe.sh's stages, limits and packing (as dev_moe_round5.sh
# uses them), three times with these settings:
#   1. newtests  GPU tests of tests/kernels/test_fused_moe_decode_scale_lag.py: SCALE_LAG bitwise the two-dot
#                form at DeepSeek-V3 EP8 T = 16 and Qwen3-30B T = 16 / 128 (regular picks), bitwise the plain
#                loop on the small-T path (Qwen3-235B T = 1 / 16), CUDA-graph replay with fresh routing, eager
#                launch-plan replay, an EP rank without local tokens (<= 50 s)
#      tune      tune_fused_moe.py --scale-lag at T = 16 / 64 / 128 on Qwen3-30B-A3B and DeepSeek-V3 EP8: the
#                current pick, its two-dot form, the lag (and at one gate/up stage fewer), current pick timed
#                first and again last, merged only where >= 2% faster (<= 48 s)
#   2. tune      the same at T = 1 / 16 on Qwen3-235B (T = 1: the small-T pick with the lag; <= 28 s), merged
#                into the same copy of configs.json ($RES/fused_moe_configs.json)
#   3. bench     bench_fused_moe.py --ts 1,4,16,64,128 on all five shapes with the peers, on the merged
#                configs (what is left of the call, <= 100 s)
# Usage: CALL_S=244 bash benchmarks/dev_moe_scale_lag.sh   (timeout_s 250). Results: $OUT/results.tgz.
# Run once, 2026-11-29 21:48-21:50 UTC (142.6 s, working tree of 6915041): 7/7 GPU tests, tests 20 s, tune 21 s +
# 16 s, bench 73 s; no pick changed (benchmarks/results/fused_moe_decode_scale_lag.md, *_h200.log).
T_ALL=$SECONDS
CALL_S=${CALL_S:-244}
here="$(dirname "$0")"
export MOE_TESTS=tests/kernels/test_fused_moe_decode_scale_lag.py MOE_NEW_SEL=gpu MOE_TUNE_FLAG=--scale-lag
STAGES="newtests tune" NEWTEST_S=50 TUNE_S=48 TUNE_BUDGET=26 CALL_S=100 \
  MOE_SHAPES=qwen3-30b-a3b,deepseek-v3-ep8 MOE_TS=16,64,128 bash "$here/dev_moe.sh"
[ -f /tmp/res/moe_tune.log ] && mv /tmp/res/moe_tune.log /tmp/res/moe_tune_regular.log  # the next run writes one
STAGES=tune TUNE_S=28 TUNE_BUDGET=12 CALL_S=30 MOE_SHAPES=qwen3-235b MOE_TS=1,16 bash "$here/dev_moe.sh"
left=$((CALL_S - (SECONDS - T_ALL)))
STAGES=bench MOE_BENCH_S=100 BENCH_MIN_S=60 CALL_S=$left bash "$here/dev_moe.sh"
grep -hE "^  [a-z0-9-]+ [a-z-]+ T=[0-9]+: |re-timed|budget" /tmp/res/moe_tune*.log 2>/dev/null | cut -c1-220
echo "[$((SECONDS - T_ALL))s] all stages"
