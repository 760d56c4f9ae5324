#!/usr/bin/env bash
# Fused MoE T = 1 with the input quantization folded into gate/up (config FUSE_QUANT) on the H200 (the `run`
# device tool, ONE call; carry .whl_profile): benchmarks/dev_moe.sh's stages, limits and packing with these
# settings, then a peer-less bench:
#   newtests  GPU tests of tests/kernels/test_fused_moe_decode_t1_fused.py: FUSE_QUANT 1 / 2 bitwise the
#             three-launch PRE_Q path at Qwen3-235B, Qwen3-30B-A3B and DeepSeek-V3 EP8 T = 1 (the shipped
#             small-T picks), CUDA-graph replay with fresh routing, eager launch-plan replay (<= 40 s)
#   tune      tune_fused_moe.py --fuse-quant at T = 1, 4 on Qwen3-235B, Qwen3-30B-A3B, DeepSeek-V3 EP8, Hy3:
#             the current pick against FUSE_QUANT 1 / 2 (with PDL where the pick has none), current pick
#             timed first and again last, merged into $RES/fused_moe_configs.json only where >= 2% faster
#             (<= 60 s, timing budget 35 s)
#   bench     bench_fused_moe.py --no-peers --shapes (those four) --ts 1 on the merged table, in what is left
# Usage: CALL_S=144 bash benchmarks/dev_moe_t1_fused.sh   (timeout_s 150). Results: $OUT/results.tgz.
# Run once, 2026-11-29 19:53 UTC (74 s; benchmarks/results/fused_moe_decode_t1_fused.md), before FUSE_L1 existed.
# FUSE_L1 (the tuner's --fuse-quant now also times it with group scales) untimed; the T = 1 point it is for:
#   STAGES=tune MOE_SHAPES=qwen3-235b,qwen3-30b-a3b,deepseek-v3-ep8 MOE_TS=1 CALL_S=90 bash benchmarks/dev_moe_t1_fused.sh
export STAGES=${STAGES:-"newtests tune"}
export MOE_TESTS=${MOE_TESTS:-tests/kernels/test_fused_moe_decode_t1_fused.py}
export MOE_NEW_SEL=${MOE_NEW_SEL:-gpu}
export NEWTEST_S=${NEWTEST_S:-40}
export MOE_TUNE_FLAG=--fuse-quant
export MOE_SHAPES=${MOE_SHAPES:-qwen3-235b,qwen3-30b-a3b,deepseek-v3-ep8,hy3}
export MOE_TS=${MOE_TS:-1,4}
export TUNE_S=${TUNE_S:-60} TUNE_BUDGET=${TUNE_BUDGET:-35}
export CALL_S=${CALL_S:-145}
T_START=$SECONDS
bash "$(dirname "$0")/dev_moe.sh"
RES=/tmp/res
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HPC_ADVISE_HOME=$RES/home HPC_ADVISE_RESULTS=$RES
[ -f "$RES/fused_moe_configs.json" ] && cp "$RES/fused_moe_configs.json" hpc_advise/kernels/fused_moe/configs.json
left=$((CALL_S - (SECONDS - T_START) - 2))
if [ "$left" -ge 15 ]; then
  timeout "$left" python3 benchmarks/bench_fused_moe.py --no-peers --shapes "$MOE_SHAPES" --ts 1 \
    > "$RES/moe_bench.log" 2>&1
  echo "bench rc=$? in ${left}s limit"
  grep -E "^\| [a-z0-9-]+ +\|" "$RES/fused_moe.md" 2>/dev/null | cut -c1-200
else
  echo "skip bench: ${left}s left"
fi
tar czf "$OUT/results.tgz.tmp" -C "$RES" . 2>/dev/null && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"
grep -E "^  [a-z0-9-]+ [a-z-]+ T=[0-9]+: |re-timed|budget" "$RES/moe_tune.log" 2>/dev/null | cut -c1-200
echo "[$((SECONDS - T_START))s] end"
