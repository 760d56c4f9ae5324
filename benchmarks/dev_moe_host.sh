#!/usr/bin/env bash
# Issue 7, the eager host cost of one fused_moe call (launch plans, hpc_advise/kernels/fused_moe/launch_plan.py),
# on the H200 in ONE call of the `run` device tool (carry .whl_profile; timeout_s 160):
#   overhead  tune_fused_moe.py --launch-overhead on hy3, qwen3-235b, deepseek-v3-ep8, hy3-tp8 at T = 1, 16, 128,
#             1024, every path that serves T: host / wall µs per eager call and GPU µs per call (CUDA graph),
#             plans off vs on in one process, bitwise check, plan-key µs, cProfile of the planned call at T = 1
#             (its parallel precompile also builds the kernels the tests below use: they run warm)
#   tests     GPU tests of tests/kernels/test_fused_moe_host.py (-n 2): bitwise planned vs unplanned on the three
#             paths' tuned configs at real shapes, CUDA-graph capture with a cached plan, two streams
# Each stage under its own `timeout`; results packed into $OUT/results.tgz after each stage.
# Usage: bash benchmarks/dev_moe_host.sh
set -o pipefail
T0=$SECONDS
RES=/tmp/res
mkdir -p "$RES"
pack() { tar czf "$OUT/results.tgz.tmp" -C "$RES" . 2>/dev/null && mv "$OUT/results.tgz.tmp" "$OUT/results.tgz"; echo "[$((SECONDS - T0))s] $1"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_profile/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HPC_ADVISE_HOME=$RES/home
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  lscpu | grep -E "^Model name"
} | tee "$RES/env.txt"

OUT=$RES timeout "${OVERHEAD_S:-75}" python3 benchmarks/tune_fused_moe.py --launch-overhead \
  --shapes hy3,qwen3-235b,deepseek-v3-ep8,hy3-tp8 --ts 1,16,128,1024 > "$RES/overhead.log" 2>&1
echo "overhead rc=$?"
pack "overhead done"

timeout "${TESTS_S:-60}" python3 -m pytest -v -m gpu tests/kernels/test_fused_moe_host.py -n 2 -p no:cacheprovider \
  -o addopts="" -rfEs > "$RES/gpu_tests.log" 2>&1
echo "tests rc=$?"
grep -E "^(FAILED|ERROR)|passed|failed" "$RES/gpu_tests.log" | cut -c1-300 | tail -12
pack "gpu tests done"

grep -E "Error|Traceback" "$RES/overhead.log" | head -5
grep -E "^\| " "$RES/overhead.log"
