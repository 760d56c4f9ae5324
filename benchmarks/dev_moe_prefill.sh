#!/usr/bin/env bash
# Prefill side of the FP8 fused MoE on the H200 (the `device` tool), one call per STAGE:
#   STAGE=tune   GPU tests of tests/kernels/test_fused_moe.py (real shapes) while the tuner's candidates
#                compile, then the tuner at T = 1024/4096/16384 on every shape (merged into the copy's
#                configs.json), then the per-launch breakdown of the tuned configs. Also returns the
#                Triton cache (cubins + metadata) so the next call need not compile again.
#   STAGE=bench  benchmarks/bench_fused_moe.py at T >= 1024 with the peers (carry .whl_moe).
# Carry .triton_moe (the cache from the last call) when it exists. Results: $OUT/prefill.tgz
# (re-packed after every stage, so a timeout keeps what finished) and $OUT/log.txt.
set -o pipefail
T0=$SECONDS
RES=/tmp/res
mkdir -p "$RES"
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache OUT_FINAL=$OUT
pack() { tar czf "$OUT/prefill.tgz" -C "$RES" . 2>/dev/null; echo "[$((SECONDS - T0))s] $1"; }
mkdir -p "$TRITON_CACHE_DIR"
[ -f .triton_moe/cache.tgz ] && tar xzf .triton_moe/cache.tgz -C "$TRITON_CACHE_DIR"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
SHAPES=hy3,qwen3-235b,hy3-tp8,qwen3-30b-a3b,deepseek-v3-ep8

if [ "${STAGE:-tune}" = tune ]; then
  ( timeout "${TEST_S:-60}" python3 -m pytest -q -m gpu tests/kernels/test_fused_moe.py -n 2 -p no:cacheprovider \
      -o addopts="" -rfEs > "$RES/gpu_tests.log" 2>&1; echo "tests rc $?" >> "$RES/gpu_tests.log" ) &
  timeout "${COMPILE_S:-60}" python3 - > "$RES/precompile.log" 2>&1 <<'EOF'
from hpc_advise.runtime.benches import fused_moe as fb
jobs = []
for shape in fb.SHAPES:
    mode = fb.MODES[shape][0]
    inter = 256 if fb.SHAPES[shape][2] % 128 == 0 else 192
    jobs += [(mode, c, False, inter) for c in fb.candidates(4096, 8, mode.endswith("dynamic"))]
print("precompiled", fb.precompile(jobs, workers=12), "of", len(jobs))
EOF
  wait
  tail -25 "$RES/gpu_tests.log"; tail -3 "$RES/precompile.log"
  pack "gpu tests + precompile done"
  timeout "${TUNE_S:-90}" python3 benchmarks/tune_fused_moe.py --shapes $SHAPES --ts 1024,4096,16384 \
    --budget "${TUNE_BUDGET:-40}" --out hpc_advise/kernels/fused_moe/configs.json > "$RES/tune.log" 2>&1
  cp hpc_advise/kernels/fused_moe/configs.json "$RES/configs.json"
  grep -v "^  cand" "$RES/tune.log" | tail -20
  pack "tune done"
  (cd "$TRITON_CACHE_DIR" && find . -name '*.json' -o -name '*.cubin' -o -name '*.so' | tar czf "$OUT_FINAL/tcache.tgz" -T -)
  OUT=$RES timeout "${BREAK_S:-20}" python3 benchmarks/tune_fused_moe.py --breakdown --shapes hy3,qwen3-235b \
    --ts 1024,16384 > "$RES/breakdown.log" 2>&1
  grep breakdown "$RES/breakdown.log" | cut -c1-230
  pack "breakdown done"
  ls -la "$OUT_FINAL"
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_moe/*.whl \
    && export PYTHONPATH=/tmp/site:$PYTHONPATH
  export HPC_ADVISE_RESULTS=$RES
  timeout "${BENCH_S:-95}" python3 benchmarks/bench_fused_moe.py --shapes $SHAPES --ts 1024,4096,16384 \
    > "$RES/bench.log" 2>&1
  grep -v "^  " "$RES/bench.log" | tail -30
  pack "bench done"
fi
