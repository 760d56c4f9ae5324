#!/usr/bin/env bash
# Fused MoE decode round 3 on the H200 (the `run` device tool, ONE call; carry .whl_profile and .whl_moe):
# benchmarks/dev_moe.sh with these stages and settings (its stage logic, limits and packing are reused):
#   newtests  GPU tests of tests/kernels/test_fused_moe_decode_forms.py (the prefill forms W_TMA /
#             W_SCALAR / DN_A_TMA at decode points: bitwise the pointer form, graph replay, EP rank) and the
#             persistent path's graph-replay / EP / few-program tests (op_persistent's per-call plan cache)
#   tune      tune_fused_moe.py --decode-forms: the current pick against the regular path with the forms at
#             T = 16 / 64 / 128 on DeepSeek-V3 EP8, Qwen3-30B, Qwen3-235B, then Hy3 TP8 (a form is merged
#             only where >= 2% faster)
#   persist   tune_fused_moe.py --persistent at T = 1 on Qwen3-235B, Hy3 TP8, Qwen3-30B (precompiled at each
#             shape's H now), then --launch-overhead on DeepSeek-V3 EP8 and Qwen3-30B at T = 1
#   bench     bench_fused_moe.py --ts 1,4,16,64,128 on all five shapes with the peers, on the merged configs
# Usage: CALL_S=272 bash benchmarks/dev_moe_decode.sh   (timeout_s 280). Results: $OUT/results.tgz.
# The call of 2026-11-29 16:19 UTC (CALL_S=272, timeout_s 280) took 193 s: wheels + tests 46 s (12 passed), tune 26 s
# (50 configs precompiled, 12 points), persist 56 s (3 points + the overhead timing), bench 65 s.
# (Until 16:15 UTC 2026-11-29 this file was the round-1 script of the small-T path; it is in git history.)
export STAGES=${STAGES:-"newtests tune persist bench"}
export MOE_TESTS=${MOE_TESTS:-"tests/kernels/test_fused_moe_decode_forms.py tests/kernels/test_fused_moe_persistent.py"}
export MOE_NEW_SEL=${MOE_NEW_SEL:-"decode_forms or graph_replay or without_local or few_programs"}
export NEWTEST_S=${NEWTEST_S:-55}
export MOE_TUNE_FLAG=--decode-forms
export MOE_SHAPES=${MOE_SHAPES:-deepseek-v3-ep8,qwen3-30b-a3b,qwen3-235b,hy3-tp8}
export MOE_TS=${MOE_TS:-16,64,128}
export TUNE_S=${TUNE_S:-75} TUNE_BUDGET=${TUNE_BUDGET:-40}
export PERSIST_S=${PERSIST_S:-45} PERSIST_TUNE_S=${PERSIST_TUNE_S:-35} PERSIST_BUDGET=${PERSIST_BUDGET:-15}
export PERSIST_TS=${PERSIST_TS:-1} OVERHEAD_S=${OVERHEAD_S:-30}
export MOE_BENCH_S=${MOE_BENCH_S:-100} BENCH_MIN_S=${BENCH_MIN_S:-75}
export MOE_BENCH_TS=1,4,16,64,128
export CALL_S=${CALL_S:-272}
exec bash "$(dirname "$0")/dev_moe.sh"
