#!/usr/bin/env bash
# Prefill forms of the FP8 fused MoE on the H200 (the `device` tool), one call per STAGE:
#   STAGE=sweep  stage 1: GPU tests of tests/kernels/test_fused_moe_prefill.py (W_TMA / wide-K forms at
#                real shapes); stage 2: `tune_fused_moe.py
#                --prefill-variants` at T = 1024/4096/16384 on every shape (old pick vs new forms in one
#                process; entries written to $OUT/prefill_configs.json, not into configs.json).
#   STAGE=bench  stage 1: the GPU tests of $TESTS (shipped configs); stage 2 (RESWEEP=1): the sweep
#                again around the call-1 winners, written into the copy's configs.json (a new form only
#                where >= 2% faster than the current pick); stage 3: bench_fused_moe.py at T >= 1024 with
#                the peers on those configs (carry .whl_moe).
# Stage times on the H200 (2026-11-29): sweep call 61 s in all (tests 25 s, 150 candidates compiled +
# timed 28 s); bench call 123 s (tests cut at 45 s after 33 passed, re-sweep of 172 candidates 29 s,
# bench with peers 46 s). Carry .whl_profile (and .whl_moe for the bench). Results: $OUT/prefill.tgz, re-packed after every stage
# (a stage cut by its `timeout` keeps what the earlier ones wrote), and $OUT/log.txt via the caller's tee.
set -o pipefail
T0=$SECONDS
RES=/tmp/res
mkdir -p "$RES" /tmp/site
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
stamp() { echo "[$((SECONDS - T0))s] $*"; }
pack() { tar czf "$OUT/prefill.tgz" -C "$RES" . 2>/dev/null; stamp "packed: $1"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_profile/*.whl \
  && export PYTHONPATH=/tmp/site:$PYTHONPATH
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
SHAPES=${SHAPES:-hy3,qwen3-235b,deepseek-v3-ep8,qwen3-30b-a3b,hy3-tp8}
TESTS=${TESTS:-tests/kernels/test_fused_moe_prefill.py}

gpu_tests() {  # $1 = seconds
  timeout "$1" python3 -m pytest -v -m gpu $TESTS -n 2 -p no:cacheprovider -o addopts="" -rfEs \
    > "$RES/gpu_tests.log" 2>&1
  echo "tests rc $?" >> "$RES/gpu_tests.log"
}

if [ "${STAGE:-sweep}" = sweep ]; then
  # sequential: tests running beside the sweep would disturb its timings (the tuner precompiles its
  # candidates in parallel processes first; 15:45 call: 11 tests in 25 s, 42 configs compiled + timed in 28 s)
  gpu_tests "${TEST_S:-75}"
  grep -E "passed|failed|error|rc " "$RES/gpu_tests.log" | tail -20
  pack "stage 1 (GPU tests)"
  timeout "${TUNE_S:-110}" python3 benchmarks/tune_fused_moe.py --prefill-variants --shapes "$SHAPES" \
    --ts 1024,4096,16384 --budget "${TUNE_BUDGET:-80}" --out "$RES/prefill_configs.json" > "$RES/tune.log" 2>&1
  echo "tune rc $?" >> "$RES/tune.log"
  grep -v "^  cand" "$RES/tune.log" | cut -c1-260 | tail -25
  pack "stage 2 (sweep)"
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_moe/*.whl
  gpu_tests "${TEST_S:-50}"
  grep -cE " PASSED" "$RES/gpu_tests.log"; grep -E "FAILED|ERROR|passed|failed|rc " "$RES/gpu_tests.log" | tail -15
  pack "stage 1 (GPU tests)"
  if [ "${RESWEEP:-1}" = 1 ]; then  # stage 2: the sweep around the call-1 winners, into the copy's configs.json
    timeout "${TUNE_S:-55}" python3 benchmarks/tune_fused_moe.py --prefill-variants --shapes "$SHAPES" \
      --ts 1024,4096,16384 --budget "${TUNE_BUDGET:-35}" --out hpc_advise/kernels/fused_moe/configs.json \
      > "$RES/tune.log" 2>&1
    echo "tune rc $?" >> "$RES/tune.log"
    cp hpc_advise/kernels/fused_moe/configs.json "$RES/configs.json"
    grep -v "^  cand" "$RES/tune.log" | cut -c1-200 | tail -18
    pack "stage 2 (sweep)"
  fi
  HPC_ADVISE_RESULTS=$RES timeout "${BENCH_S:-115}" python3 benchmarks/bench_fused_moe.py --shapes "$SHAPES" \
    --ts 1024,4096,16384 > "$RES/bench.log" 2>&1
  echo "bench rc $?" >> "$RES/bench.log"
  grep -v "^  " "$RES/bench.log" | tail -30
  pack "stage 3 (bench)"
fi
