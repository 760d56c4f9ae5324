#!/usr/bin/env bash
# Fused MoE decode work on the H200 machine (the `run` device tool), in stages chosen by STAGES
# (default "tune tests"), each under its own time limit; results re-packed into $OUT/results.tgz after
# every stage, so a timeout keeps what finished:
#   tune   tune_fused_moe.py --variants over MOE_SHAPES x MOE_TS: the config op.get_config picks now
#          against its PDL / L2-prefetch forms and the new decode variants (small-T split sums), old and
#          new timed in one process; merged into a copy of configs.json ($RES/fused_moe_configs.json)
#   tests  GPU tests of tests/kernels/test_fused_moe_small.py and test_fused_moe.py (-n 2)
#   bench  bench_fused_moe.py at MOE_BENCH_TS with the torch / fbgemm peers (carry .whl_moe)
# Carry .whl_profile (sqlite-utils & co.) always, .whl_moe for the bench's fbgemm peer.
set -o pipefail
T0=$SECONDS
RES=/tmp/res
STAGES=" ${STAGES:-tune tests} "
mkdir -p "$RES"
pack() { tar czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null; echo "[$((SECONDS - T0))s] $1"; }
has() { [[ "$STAGES" == *" $1 "* ]]; }
WHEELS=".whl_profile/*.whl"
[ -d .whl_moe ] && WHEELS="$WHEELS .whl_moe/*.whl"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $WHEELS || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HPC_ADVISE_HOME=$RES/home HPC_ADVISE_RESULTS=$RES
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv
MOE_SHAPES=${MOE_SHAPES:-deepseek-v3-ep8,qwen3-30b-a3b,hy3-tp8,qwen3-235b,hy3}

if has tune; then
  cp hpc_advise/kernels/fused_moe/configs.json "$RES/fused_moe_configs.json"
  timeout "${TUNE_S:-90}" python3 benchmarks/tune_fused_moe.py --variants --shapes "$MOE_SHAPES" \
    --ts "${MOE_TS:-1,16,64,128}" --budget "${TUNE_BUDGET:-45}" --out "$RES/fused_moe_configs.json" \
    > "$RES/moe_tune.log" 2>&1
  grep -v "^  cand" "$RES/moe_tune.log" | tail -25
  pack "tune done"
fi
NEW_TESTS="split_sums or programmatic or graph_replay"  # the new variants' GPU tests run first
if has tests; then
  for part in new old; do
    if [ $part = new ]; then sel="$NEW_TESTS"; lim=${TEST_NEW_S:-45}; else sel="not ($NEW_TESTS)"; lim=${TEST_S:-60}; fi
    timeout "$lim" python3 -m pytest -v -m gpu tests/kernels/test_fused_moe_small.py tests/kernels/test_fused_moe.py \
      -k "$sel" -n 2 -p no:cacheprovider -o addopts="" -rfEs > "$RES/gpu_tests_$part.log" 2>&1
    grep -E "^(FAILED|ERROR)" "$RES/gpu_tests_$part.log" | head -20
    echo "$part: $(grep -c PASSED "$RES/gpu_tests_$part.log") passed; $(tail -1 "$RES/gpu_tests_$part.log")"
  done
  pack "gpu tests done"
fi
if has bench; then
  timeout "${MOE_BENCH_S:-110}" python3 benchmarks/bench_fused_moe.py --ts "${MOE_BENCH_TS:-1,4,16,64,128}" \
    > "$RES/moe_bench.log" 2>&1
  grep -v "^ *$" "$RES/moe_bench.log" | tail -12
  cp "$RES"/fused_moe.md "$RES"/fused_moe.jsonl "$OUT"/ 2>/dev/null
  pack "moe bench done"
fi
