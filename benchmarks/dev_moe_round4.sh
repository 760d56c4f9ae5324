#!/usr/bin/env bash
# Fused MoE decode round 4 on the H200 (the `run` device tool, ONE call; carry .whl_profile and .whl_moe):
# benchmarks/dev_moe.sh with these stages and settings (its stage logic, limits and packing are reused):
#   newtests  GPU tests of tests/kernels/test_fused_moe_decode_round4.py: the swap-AB GEMMs (GU_SWAP_AB,
#             DN_SWAP_AB) at the real decode shapes against the plain form and the reference, a bitwise
#             rerun, CUDA-graph replay with fresh routing, an EP rank without local tokens (<= 60 s)
#   tune      tune_fused_moe.py --swap-ab: the current pick against the regular path with its GEMMs swapped
#             at T = 16 / 64 / 128 on DeepSeek-V3 EP8, Qwen3-30B, Qwen3-235B, Hy3 TP8, one process per
#             shape list, current pick timed first and again last, merged only where >= 2% faster (<= 90 s)
#   bench     bench_fused_moe.py --ts 1,4,16,64,128 on all five shapes with the peers, on the merged
#             configs (<= 100 s)
#   breakdown tune_fused_moe.py --breakdown at T = 16 / 128 on the merged picks (per-launch µs), if time is left
# Usage: CALL_S=292 bash benchmarks/dev_moe_round4.sh   (timeout_s 300). Results: $OUT/results.tgz.
export STAGES=${STAGES:-"newtests tune bench breakdown"}
export MOE_TESTS=${MOE_TESTS:-tests/kernels/test_fused_moe_decode_round4.py}
export MOE_NEW_SEL=${MOE_NEW_SEL:-gpu}
export NEWTEST_S=${NEWTEST_S:-60}
export MOE_TUNE_FLAG=--swap-ab
export MOE_SHAPES=${MOE_SHAPES:-deepseek-v3-ep8,qwen3-30b-a3b,qwen3-235b,hy3-tp8}
export MOE_TS=${MOE_TS:-16,64,128}
export TUNE_S=${TUNE_S:-90} TUNE_BUDGET=${TUNE_BUDGET:-50}
export MOE_BENCH_S=${MOE_BENCH_S:-100} BENCH_MIN_S=${BENCH_MIN_S:-75}
export MOE_BENCH_TS=1,4,16,64,128
export CALL_S=${CALL_S:-292}
exec bash "$(dirname "$0")/dev_moe.sh"
