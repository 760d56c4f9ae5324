#!/usr/bin/env bash
# Fused MoE decode round 5 on the H200 (the `run` device tool, ONE call; carry .whl_profile and .whl_moe):
# benchmarks/dev_moe.sh with these stages and settings (its stage logic, limits and packing are reused):
#   newtests  GPU tests of tests/kernels/test_fused_moe_decode_round5.py: multi-tile GEMM programs (GU_TILES,
#             DN_TILES) at the real decode shapes bitwise against the one-tile programs and within 2e-2 of the
#             reference, split-K summed in the gate/up kernel (GU_RED) bitwise the separate launch, CUDA-graph
#             replay with fresh routing, eager launch-plan replay, an EP rank without local tokens (<= 60 s)
#   tune      tune_fused_moe.py --multi-tile: the current pick against the regular path with multi-tile
#             programs (and GU_RED split-K at T = 16 where K is long) at T = 16 / 64 / 128 on DeepSeek-V3 EP8,
#             Qwen3-30B, Hy3 TP8, Qwen3-235B, one process per
#             shape list, current pick timed first and again last, merged only where >= 2% faster (<= 90 s)
#   bench     bench_fused_moe.py --ts 1,4,16,64,128 on all five shapes with the peers, on the merged
#             configs (<= 100 s)
#   breakdown tune_fused_moe.py --breakdown at T = 16 / 128 on the merged picks (per-launch µs), if time is left
# Usage: CALL_S=292 bash benchmarks/dev_moe_round5.sh   (timeout_s 300). Results: $OUT/results.tgz.
export STAGES=${STAGES:-"newtests tune bench breakdown"}
export MOE_TESTS=${MOE_TESTS:-tests/kernels/test_fused_moe_decode_round5.py}
export MOE_NEW_SEL=${MOE_NEW_SEL:-gpu}
export NEWTEST_S=${NEWTEST_S:-60}
export MOE_TUNE_FLAG=--multi-tile
export MOE_SHAPES=${MOE_SHAPES:-deepseek-v3-ep8,qwen3-30b-a3b,hy3-tp8,qwen3-235b}
export MOE_TS=${MOE_TS:-16,64,128}
export TUNE_S=${TUNE_S:-90} TUNE_BUDGET=${TUNE_BUDGET:-50}
export MOE_BENCH_S=${MOE_BENCH_S:-100} BENCH_MIN_S=${BENCH_MIN_S:-75}
export MOE_BENCH_TS=1,4,16,64,128
export CALL_S=${CALL_S:-292}
exec bash "$(dirname "$0")/dev_moe.sh"
