#!/usr/bin/env bash
# Fused MoE decode work on the H200 machine (the `run` device tool), in stages chosen by STAGES
# (default "newtests tune bench oldtests breakdown"), each under its own time limit and skipped when
# less than its limit is left of CALL_S (the call's timeout_s); results re-packed into
# $OUT/results.tgz after every stage, so a timeout keeps what finished:
#   newtests  GPU tests of $MOE_TESTS selected by -k "$MOE_NEW_SEL" (default: test_fused_moe_decode_variants.py,
#             ROUTE / DN_REDUCE; -n 2)
#   tune      tune_fused_moe.py $MOE_TUNE_FLAG (default --route-reduce) over MOE_SHAPES x MOE_TS: the config
#             op.get_config picks now against the mode's candidates (--route-reduce: the ranked router, the
#             in-kernel top-k sum, pipeline depths; --decode-forms: TMA weight tiles, scalar block scales,
#             TMA activation rows), old and new timed in one process; merged into a copy of configs.json
#             ($RES/fused_moe_configs.json), which the later stages then use (copied over the package's)
#   persist   tune_fused_moe.py --persistent over PERSIST_SHAPES x PERSIST_TS (the one-launch path against
#             the current picks, merged as above), then --launch-overhead over OVERHEAD_SHAPES at T = 1
#             (eager host vs graph-replay GPU time per path; $RES/fused_moe_launch_overhead.jsonl)
#   bench     bench_fused_moe.py at MOE_BENCH_TS with the torch / fbgemm peers (carry .whl_moe); its time
#             limit is MOE_BENCH_S or what is left of CALL_S, whichever is less (it needs BENCH_MIN_S)
#   oldtests  the remaining GPU tests of tests/kernels/test_fused_moe*.py
#   breakdown tune_fused_moe.py --breakdown (per-launch µs, incl. the ROUTE prep and DN_REDUCE down)
# Carry .whl_profile (sqlite-utils & co.) always, .whl_moe for the bench's fbgemm peer.
# The call of 2026-11-29 14:51 UTC (CALL_S=262, timeout_s 270) took 187 s: new tests 42 s (cut at their
# then 40 s limit, 2 of 7 unfinished: hence 70 now), tune 30 s, bench 67 s, old tests 39 s, breakdown 9 s.
set -o pipefail
T0=$SECONDS
RES=/tmp/res
CALL_S=${CALL_S:-265}
STAGES=" ${STAGES:-newtests tune bench oldtests breakdown} "
mkdir -p "$RES"
pack() { tar czf "$OUT/results.tgz.tmp" -C "$RES" . 2>/dev/null && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"; echo "[$((SECONDS - T0))s] $1"; }
has() { [[ "$STAGES" == *" $1 "* ]]; }
fits() { local left=$((CALL_S - (SECONDS - T0))); if [ "$left" -lt "$1" ]; then echo "skip $2: ${left}s left < $1"; return 1; fi; }
WHEELS=".whl_profile/*.whl"
[ -d .whl_moe ] && WHEELS="$WHEELS .whl_moe/*.whl"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $WHEELS || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HPC_ADVISE_HOME=$RES/home HPC_ADVISE_RESULTS=$RES
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
MOE_SHAPES=${MOE_SHAPES:-deepseek-v3-ep8,qwen3-30b-a3b,hy3-tp8}
PERSIST_SHAPES=${PERSIST_SHAPES:-qwen3-235b,hy3-tp8,qwen3-30b-a3b}
OVERHEAD_SHAPES=${OVERHEAD_SHAPES:-deepseek-v3-ep8,qwen3-30b-a3b}
TESTS=${MOE_TESTS:-"tests/kernels/test_fused_moe_decode_variants.py tests/kernels/test_fused_moe_small.py tests/kernels/test_fused_moe.py"}
NEW_SEL=${MOE_NEW_SEL:-decode_variants}
# the tuned table the stages share: the package's, then each tuning stage's merged copy
merged() { [ -f "$RES/fused_moe_configs.json" ] || cp hpc_advise/kernels/fused_moe/configs.json "$RES/fused_moe_configs.json"; }
install_merged() {
  python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$RES/fused_moe_configs.json" \
    && cp "$RES/fused_moe_configs.json" hpc_advise/kernels/fused_moe/configs.json
}

gpu_tests() {  # $1 name, $2 -k selection, $3 limit
  timeout "$3" python3 -m pytest -v -m gpu $TESTS -k "$2" -n 2 -p no:cacheprovider -o addopts="" -rfEs \
    > "$RES/gpu_tests_$1.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$RES/gpu_tests_$1.log" | head -20
  echo "$1: $(grep -c PASSED "$RES/gpu_tests_$1.log") passed; $(tail -1 "$RES/gpu_tests_$1.log")"
}

if has newtests && fits "${NEWTEST_S:-70}" newtests; then
  gpu_tests new "$NEW_SEL" "${NEWTEST_S:-70}"
  pack "new gpu tests done"
fi
if has tune && fits "${TUNE_S:-80}" tune; then
  merged
  timeout "${TUNE_S:-80}" python3 benchmarks/tune_fused_moe.py "${MOE_TUNE_FLAG:---route-reduce}" --shapes "$MOE_SHAPES" \
    --ts "${MOE_TS:-16,64,128}" --budget "${TUNE_BUDGET:-35}" --out "$RES/fused_moe_configs.json" \
    > "$RES/moe_tune.log" 2>&1
  grep -v "^  cand" "$RES/moe_tune.log" | cut -c1-240 | tail -16
  install_merged  # the later stages measure the merged table (the device copy of the tree is scratch)
  pack "tune done"
fi
if has persist && fits "${PERSIST_S:-50}" persist; then
  merged
  timeout "${PERSIST_TUNE_S:-35}" python3 benchmarks/tune_fused_moe.py --persistent --shapes "$PERSIST_SHAPES" \
    --ts "${PERSIST_TS:-1}" --budget "${PERSIST_BUDGET:-15}" --out "$RES/fused_moe_configs.json" \
    > "$RES/moe_persist.log" 2>&1
  grep -E "^  [a-z0-9-]+ [a-z-]+ T=[0-9]+: |re-timed|Error|budget|precompiled" "$RES/moe_persist.log" | cut -c1-240
  install_merged
  left=$((CALL_S - (SECONDS - T0) - ${BENCH_MIN_S:-75}))
  if [ "$left" -ge 10 ]; then
    OUT=$RES timeout $((left < ${OVERHEAD_S:-30} ? left : ${OVERHEAD_S:-30})) python3 benchmarks/tune_fused_moe.py \
      --launch-overhead --shapes "$OVERHEAD_SHAPES" --ts 1 > "$RES/moe_overhead.log" 2>&1
    grep -E "overhead|  [0-9.]+ us" "$RES/moe_overhead.log" | cut -c1-200 | head -40
  else
    echo "skip launch overhead: ${left}s left before the bench's minimum"
  fi
  pack "persist done"
fi
if has bench && fits "${BENCH_MIN_S:-75}" bench; then
  left=$((CALL_S - (SECONDS - T0) - 2))
  timeout $((left < ${MOE_BENCH_S:-105} ? left : ${MOE_BENCH_S:-105})) python3 benchmarks/bench_fused_moe.py \
    --shapes "${MOE_BENCH_SHAPES:-deepseek-v3-ep8,qwen3-30b-a3b,hy3-tp8,qwen3-235b,hy3}" \
    --ts "${MOE_BENCH_TS:-1,4,16,64,128}" > "$RES/moe_bench.log" 2>&1
  grep -E "^decode|^T=1|^Hy3|^T<=" "$RES/fused_moe.md" 2>/dev/null
  grep -E "^\| [a-z0-9-]+ +\|" "$RES/fused_moe.md" 2>/dev/null | cut -d"|" -f2,4,5,6,7,9,10,15
  pack "moe bench done"
fi
if has oldtests && fits 25 oldtests; then
  left=$((CALL_S - (SECONDS - T0) - 3))
  gpu_tests old "not ($NEW_SEL)" $((left < 45 ? left : 45))
  pack "old gpu tests done"
fi
if has breakdown && fits 12 breakdown; then
  timeout $((CALL_S - (SECONDS - T0) - 2)) python3 benchmarks/tune_fused_moe.py --breakdown \
    --shapes "$MOE_SHAPES" --ts 16,128 > "$RES/moe_breakdown.log" 2>&1
  grep breakdown "$RES/moe_breakdown.log"
  pack "breakdown done"
fi
echo "[$((SECONDS - T0))s] end"
