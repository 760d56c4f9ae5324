#!/usr/bin/env bash
# Fused MoE, block-scaled decode at T <= 4 with h quantized in 1x64 groups (config H_GROUP 64: 64-wide gate/up
# tiles with fp8 h, 64-wide down K steps; issue 7, Qwen3-235B T = 1) on the H200 (the `run` device tool, ONE
# call; carry .whl_profile and .whl_moe). benchmarks/dev_moe.sh's stages, limits and packing (results re-packed
# into $OUT/results.tgz after every stage), with these settings:
#   1. newtests   GPU tests of tests/kernels/test_fused_moe_decode_group64.py: the 1x64 forms of the shipped
#                 small-T picks at Qwen3-235B T = 1 / 4, Qwen3-30B-A3B and DeepSeek-V3 EP8 T = 1 against the
#                 1x64 reference (errors against the 1x128 reference and unquantized math printed), eager
#                 launch-plan replay bitwise, CUDA-graph replay with fresh routing (<= 55 s, -n 2)
#      tune       tune_fused_moe.py --h-group at T = 1 / 4 on Qwen3-235B, Qwen3-30B-A3B, DeepSeek-V3 EP8: the
#                 current pick against its 1x64 forms and the 128-wide pick with split 2 summed in gate/up
#                 (h_group_candidates), current pick timed first and again last, merged into
#                 $RES/fused_moe_configs.json only where >= 2% faster (<= 75 s, timing budget 35 s)
#   2. breakdown  tune_fused_moe.py --small-breakdown at Qwen3-235B T = 1 on the table shipped before this call:
#                 the whole call and each launch alone (quantization, gate/up, down) for the 128-wide pick and
#                 its 1x64 form (<= 25 s; $RES/fused_moe_small_breakdown.jsonl)
#   3. bench      bench_fused_moe.py --ts 1,4,16,64,128 on all five shapes with the peers, on the merged table
#                 (what is left of the call, <= 100 s)
# Usage: CALL_S=262 bash benchmarks/dev_moe_group64.sh   (timeout_s 270). Results: $OUT/results.tgz.
# Run once, 2026-11-29 23:46-23:48 UTC (102 s, working tree of bce81b2's files): tests 6/6 in 12 s, tune 16 s, breakdown,
# bench 61 s; no pick changed (benchmarks/results/fused_moe_decode.md, fused_moe_decode_group64_*).
T_ALL=$SECONDS
CALL_S=${CALL_S:-262}
here="$(dirname "$0")"
RES=/tmp/res
SHIPPED=hpc_advise/kernels/fused_moe/configs.json
cp "$SHIPPED" /tmp/configs_before.json
export MOE_TESTS=tests/kernels/test_fused_moe_decode_group64.py MOE_NEW_SEL=gpu MOE_TUNE_FLAG=--h-group
STAGES="newtests tune" NEWTEST_S=55 TUNE_S=75 TUNE_BUDGET=35 CALL_S=140 \
  MOE_SHAPES=qwen3-235b,qwen3-30b-a3b,deepseek-v3-ep8 MOE_TS=1,4 bash "$here/dev_moe.sh"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HPC_ADVISE_HOME=$RES/home HPC_ADVISE_RESULTS=$RES
left=$((CALL_S - (SECONDS - T_ALL) - 75))  # the bench keeps its minimum
if [ "$left" -ge 10 ]; then
  cp /tmp/configs_before.json "$SHIPPED"  # the breakdown's "current pick" is the one shipped before this call
  OUT=$RES timeout $((left < 25 ? left : 25)) python3 benchmarks/tune_fused_moe.py --small-breakdown \
    --shapes qwen3-235b --ts 1 > "$RES/moe_small_breakdown.log" 2>&1
  echo "small breakdown rc=$?"
  [ -f "$RES/fused_moe_configs.json" ] && cp "$RES/fused_moe_configs.json" "$SHIPPED"
  tar czf "$OUT/results.tgz.tmp" -C "$RES" . 2>/dev/null && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"
else
  echo "skip small breakdown: ${left}s left before the bench's minimum"
fi
left=$((CALL_S - (SECONDS - T_ALL)))
STAGES=bench MOE_BENCH_S=100 BENCH_MIN_S=60 CALL_S=$left bash "$here/dev_moe.sh"
echo "---- summary"
grep -h "small breakdown" "$RES/moe_small_breakdown.log" 2>/dev/null | cut -c1-200
grep -hE "^  [a-z0-9-]+ [a-z-]+ T=[0-9]+: |re-timed|budget|dropped" "$RES/moe_tune.log" 2>/dev/null | cut -c1-200
grep -hE "^  cand " "$RES/moe_tune.log" 2>/dev/null | sed -E 's/"(DN_STAGES|DN_WARPS|GU_K|PATH|PRE_Q)": [^,]*, //g' \
  | cut -c1-230
echo "[$((SECONDS - T_ALL))s] all stages"
