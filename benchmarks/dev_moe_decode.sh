#!/usr/bin/env bash
# Device-call script of the fused-MoE decode work (small-T path, T <= 128 tuning), one H200.
#   STAGE=1: GPU tests of the small-T path at the real shapes, then the tuner over the small-T path and
#            the regular path's candidates for every shape at T = 1, 4, 16, 64, 128 (every candidate's
#            p50 is logged: the sweep of small path vs current path).
#   STAGE=2: a subset of the GPU tests (T = 1, 3, graph replay), then benchmarks/bench_fused_moe.py at
#            T <= 128 with the torch and fbgemm peers and the small-T path column (carry .whl_moe).
# Results: $OUT/results.tgz, re-packed after each stage (a timeout keeps what finished).
set -o pipefail
T0=$SECONDS
RES=/tmp/res_moe_decode
mkdir -p "$RES"
pack() { tar czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null; echo "[$((SECONDS - T0))s] $1"; }
WHEELS=".whl_profile/*.whl"
[ "${STAGE:-1}" = 2 ] && WHEELS="$WHEELS .whl_moe/*.whl"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $WHEELS || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HPC_ADVISE_RESULTS=$RES HPC_ADVISE_HOME=$RES/home
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
if [ "${STAGE:-1}" = 1 ]; then
  timeout "${TEST_S:-50}" python3 -m pytest -q -m gpu tests/kernels/test_fused_moe_small.py -n 2 \
    -p no:cacheprovider -o addopts="" -rfEs -s > "$RES/gpu_tests.log" 2>&1
  grep -E "rel err|passed|failed|Error" "$RES/gpu_tests.log" | tail -40
  pack "gpu tests done"
  timeout "${TUNE_S:-92}" python3 benchmarks/tune_fused_moe.py --budget "${TUNE_BUDGET:-50}" \
    --shapes hy3-tp8,hy3,qwen3-30b-a3b,deepseek-v3-ep8,qwen3-235b --ts 1,4,16,64,128 \
    --out "$RES/fused_moe_configs.json" > "$RES/tune.log" 2>&1
  grep -v "^  cand" "$RES/tune.log" | tail -30
  pack "tune done"
else
  timeout "${TEST_S:-16}" python3 -m pytest -q -m gpu tests/kernels/test_fused_moe_small.py -n 2 \
    -p no:cacheprovider -o addopts="" -rfEs -k "${TEST_K:-3-2- or graph}" > "$RES/gpu_tests.log" 2>&1
  grep -E "passed|failed|Error" "$RES/gpu_tests.log" | tail -8
  pack "gpu tests done"
  timeout $(( ${TOTAL_S:-86} - (SECONDS - T0) )) python3 benchmarks/bench_fused_moe.py --ts 1,4,16,64,128 \
    > "$RES/bench.log" 2>&1
  grep -v "^ *$" "$RES/bench.log" | tail -42
  pack "bench done"
fi
