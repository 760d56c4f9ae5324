#!/usr/bin/env bash
# Fused MoE, block-scaled decode at T <= 4 with h quantized in 1x64 groups (config H_GROUP 64: 64-wide gate/up
# tiles with fp8 h; the down kernel stepping K by 128 with two group scales per step, DN_K 128, or by 64; issue 7,
# Qwen3-235B T = 1) on the H200 (the `run` device tool, ONE call; carry .whl_profile and .whl_moe).
# benchmarks/dev_moe.sh's stages, limits and packing (results re-packed into $OUT/results.tgz after every
# stage), with these settings:
#   1. newtests   GPU tests of tests/kernels/test_fused_moe_decode_group64.py: the 1x64 forms of the shipped
#                 small-T picks (64- and 128-step down) at Qwen3-235B T = 1 / 4, Qwen3-30B-A3B and DeepSeek-V3
#                 EP8 T = 1 against the 1x64 reference (errors against the 1x128 reference, unquantized math
#                 and the other down form printed), eager launch-plan replay bitwise, CUDA-graph replay with
#                 fresh routing (<= NEWTEST_S, -n 2)
#      tune       tune_fused_moe.py --h-group at T = MOE_TS on Qwen3-235B, Qwen3-30B-A3B, DeepSeek-V3 EP8 (the
#                 regular DeepSeek T = 4 pick times itself only): the current pick against its 1x64 forms
#                 (h_group_candidates), current pick timed first and again last, merged into
#                 $RES/fused_moe_configs.json only where >= 2% faster (<= TUNE_S, timing budget TUNE_BUDGET)
#   2. breakdown  tune_fused_moe.py --small-breakdown at Qwen3-235B T = 1 on the table shipped before this call:
#                 the whole call and each launch alone (quantization, gate/up, down) for the pick and its 1x64
#                 form (tune_fused_moe.BREAKDOWN_FORMS; <= BREAKDOWN_S; $RES/fused_moe_small_breakdown.jsonl)
#   3. bench      only if the tuner changed a pick (BENCH=always: regardless): bench_fused_moe.py --ts MOE_TS on
#                 the three shapes with the peers, on the merged table (<= MOE_BENCH_S)
# Then a short table: the tuner's candidates per point (H_GROUP / GU_N / DN_K / DN_STAGES / FUSE_QUANT / SPLIT_K,
# p50) and the breakdown rows.
# Usage: CALL_S=190 bash benchmarks/dev_moe_group64.sh   (timeout_s 200). Results: $OUT/results.tgz.
# The call of 2026-11-30 00:07 UTC (CALL_S=190) took 85 s: GPU tests 31 s incl. the wheels, tune 21 s, breakdown
# ~7 s, bench 27 s (fused_moe_decode_group64b_run.log). Its GPU-test log kept no printed errors (dev_moe.sh's pytest
# runs without -s).
T_ALL=$SECONDS
CALL_S=${CALL_S:-192}
here="$(dirname "$0")"
RES=/tmp/res
SHIPPED=hpc_advise/kernels/fused_moe/configs.json
SHAPES=qwen3-235b,qwen3-30b-a3b,deepseek-v3-ep8
cp "$SHIPPED" /tmp/configs_before.json
export MOE_TESTS=tests/kernels/test_fused_moe_decode_group64.py MOE_NEW_SEL=gpu MOE_TUNE_FLAG=--h-group
MOE_TS=${MOE_TS:-1,4}
STAGES="newtests tune" NEWTEST_S=${NEWTEST_S:-40} TUNE_S=${TUNE_S:-60} TUNE_BUDGET=${TUNE_BUDGET:-35} \
  CALL_S=$((CALL_S - ${BREAKDOWN_S:-25})) MOE_SHAPES=$SHAPES MOE_TS=$MOE_TS bash "$here/dev_moe.sh"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HPC_ADVISE_HOME=$RES/home HPC_ADVISE_RESULTS=$RES
left=$((CALL_S - (SECONDS - T_ALL) - 5))
if [ "$left" -ge 10 ]; then
  cp /tmp/configs_before.json "$SHIPPED"  # the breakdown's "current pick" is the one shipped before this call
  lim=${BREAKDOWN_S:-25}
  OUT=$RES timeout $((left < lim ? left : lim)) python3 benchmarks/tune_fused_moe.py --small-breakdown \
    --shapes qwen3-235b --ts 1 > "$RES/moe_small_breakdown.log" 2>&1
  echo "small breakdown rc=$?"
  [ -f "$RES/fused_moe_configs.json" ] && cp "$RES/fused_moe_configs.json" "$SHIPPED"
  tar czf "$OUT/results.tgz.tmp" -C "$RES" . 2>/dev/null && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"
else
  echo "skip small breakdown: ${left}s left"
fi
# did the tuner change a pick? (the merged table re-times unchanged entries too: compare configs only)
changed=$(python3 - /tmp/configs_before.json "$SHIPPED" <<'EOF'
import json, sys
def picks(path):
    return {(x["E"], x["H"], x["I"], x["top_k"], x["mode"], x["T"]): x["config"] for x in json.load(open(path))["entries"]}
old, new = picks(sys.argv[1]), picks(sys.argv[2])
print(" ".join(f"E{k[0]}/H{k[1]}/T{k[5]}" for k in new if old.get(k) != new[k]))
EOF
)
echo "picks changed: ${changed:-none}"
left=$((CALL_S - (SECONDS - T_ALL)))
if [ -n "$changed" ] || [ "${BENCH:-}" = always ]; then
  STAGES=bench MOE_BENCH_S=${MOE_BENCH_S:-50} BENCH_MIN_S=30 CALL_S=$left MOE_BENCH_SHAPES=$SHAPES \
    MOE_BENCH_TS=$MOE_TS bash "$here/dev_moe.sh"
else
  echo "skip bench: no pick changed"
fi
echo "---- summary [$((SECONDS - T_ALL))s]"
grep -hE "^(FAILED|ERROR)|passed|failed" "$RES/gpu_tests_new.log" 2>/dev/null | tail -3 | cut -c1-200
grep -hE "^  [a-z0-9-]+ [a-z-]+ T=[0-9]+: |re-timed|budget|dropped" "$RES/moe_tune.log" 2>/dev/null | cut -c1-160
python3 - "$RES" <<'EOF'
import json, re, sys
from pathlib import Path
res = Path(sys.argv[1])
print(f"{'point':<24} {'HG':>3} {'GU_N':>4} {'DN_K':>4} {'DN_ST':>5} {'FUSE':>4} {'SPLIT':>5} {'p50 us':>7}")
log = res / "moe_tune.log"
for line in (log.read_text().splitlines() if log.exists() else []):
    m = re.match(r"  cand (\S+) \S+ T=(\d+) p50 ([\d.]+) us (\{.*\})", line)
    if m:
        c = json.loads(m[4])
        print(f"{m[1] + ' T=' + m[2]:<24} {c.get('H_GROUP', 128):>3} {c['GU_N']:>4} {c['DN_K']:>4} "
              f"{c['DN_STAGES']:>5} {c.get('FUSE_QUANT', 0):>4} {c['SPLIT_K']:>5} {float(m[3]):>7.2f}")
rows = res / "fused_moe_small_breakdown.jsonl"
for line in (rows.read_text().splitlines() if rows.exists() else []):
    r = json.loads(line)
    c = r["config"]
    parts = ", ".join(f"{k[:-3].strip('_').replace('small_', '')} {v:.2f}" for k, v in r.items() if k.endswith("_us"))
    print(f"breakdown T={r['T']} HG {c.get('H_GROUP', 128)} GU_N {c['GU_N']} DN_K {c['DN_K']}/{c['DN_STAGES']}: {parts}")
EOF
echo "[$((SECONDS - T_ALL))s] all stages"
