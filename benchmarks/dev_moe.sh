#!/usr/bin/env bash
# Fused MoE decode work on the H200 machine (the `run` device tool), in stages chosen by STAGES
# (default "newtests tune bench oldtests breakdown"), each under its own time limit and skipped when
# less than its limit is left of CALL_S (the call's timeout_s); results re-packed into
# $OUT/results.tgz after every stage, so a timeout keeps what finished:
#   newtests  GPU tests of tests/kernels/test_fused_moe_decode_variants.py (ROUTE / DN_REDUCE; -n 2)
#   tune      tune_fused_moe.py --route-reduce over MOE_SHAPES x MOE_TS: the config op.get_config picks
#             now against the regular decode path with the ranked router, the in-kernel top-k sum and
#             more pipeline depths, old and new timed in one process; merged into a copy of configs.json
#             ($RES/fused_moe_configs.json), which the bench stage then uses (copied over the package's)
#   bench     bench_fused_moe.py at MOE_BENCH_TS with the torch / fbgemm peers (carry .whl_moe)
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
TESTS="tests/kernels/test_fused_moe_decode_variants.py tests/kernels/test_fused_moe_small.py tests/kernels/test_fused_moe.py"
NEW_SEL="decode_variants"

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
  cp hpc_advise/kernels/fused_moe/configs.json "$RES/fused_moe_configs.json"
  timeout "${TUNE_S:-80}" python3 benchmarks/tune_fused_moe.py --route-reduce --shapes "$MOE_SHAPES" \
    --ts "${MOE_TS:-16,64,128}" --budget "${TUNE_BUDGET:-35}" --out "$RES/fused_moe_configs.json" \
    > "$RES/moe_tune.log" 2>&1
  grep -v "^  cand" "$RES/moe_tune.log" | tail -12
  # the bench measures the merged table (the device copy of the tree is scratch)
  python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$RES/fused_moe_configs.json" \
    && cp "$RES/fused_moe_configs.json" hpc_advise/kernels/fused_moe/configs.json
  pack "tune done"
fi
if has bench && fits "${MOE_BENCH_S:-105}" bench; then
  timeout "${MOE_BENCH_S:-105}" python3 benchmarks/bench_fused_moe.py \
    --shapes "${MOE_BENCH_SHAPES:-deepseek-v3-ep8,qwen3-30b-a3b,hy3-tp8,qwen3-235b,hy3}" \
    --ts "${MOE_BENCH_TS:-1,4,16,64,128}" > "$RES/moe_bench.log" 2>&1
  grep -E "^decode|^T=1|^Hy3|^T<=" "$RES/fused_moe.md" 2>/dev/null
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
