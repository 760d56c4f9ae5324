#!/usr/bin/env bash
# The lead's integrated call on the H200 machine (the `device` tool), in stages chosen by STAGES
# (default "tests profile decode"), each under its own time limit:
#   tests         GPU tests at real sizes (-n 2; more runs out of memory) of TEST_PATHS (tests/kernels tests/runtime)
#   profile       `hpc-advise profile --bench all` into a fresh knowledge base, then `runs list`
#   decode        decode attention full grid against FlashInfer (KV=all|bf16|fp8, GRID_ARGS adds e.g. --tune)
#   moe-small     fused MoE: the small-T path's candidates against the tuned configs (T = 1, 4, 16)
#   moe-breakdown fused MoE: per-launch times of the tuned configs (MOE_SHAPES, BREAKDOWN_TS)
#   moe-bench     fused MoE benchmark at T in MOE_BENCH_TS with its peers (carry .whl_moe for fbgemm)
#   moe-tune      fused MoE: tuner over TUNE_SHAPES (default MOE_SHAPES) x MOE_TS, merged configs in $RES/fused_moe_configs.json
#   ncu           Nsight Compute sections of benchmarks/ncu_targets.py workloads (NCU_TARGETS), one text report each
# Carried folders (ignored by git, see README "Running on a GPU"):
#   .whl_profile  sqlite-utils & co. (wheels the device image lacks)
#   .whl_attn     FlashInfer 0.7.2.post1 as flashinfer_strip.zip: the py3-none-any wheel's files minus
#                 the CUDA sources of kernels the decode benchmark never JIT-compiles (fused MoE, GDN,
#                 KDA, Blackwell and other csrc/ and cutlass/ trees), so that it fits the 64 MiB carry
#                 limit; apache-tvm-ffi 0.1.15.post2 (cp312 wheel); fiws/fi_cache.tgz, FlashInfer's JIT
#                 cache from an earlier call (without it the first compile of its four modules took 102 s;
#                 FI_CACHE_OUT=1 returns the cache after the grid, with whatever this call compiled)
#   .whl_moe      fbgemm-gpu-genai 1.6.0 (cp312 wheel) for benchmarks/bench_fused_moe.py's fbgemm peer
#                 (carry it instead of .whl_attn: both together exceed 64 MiB)
# Results land in $OUT/results.tgz (re-packed after every stage, so a timeout keeps what finished).
set -o pipefail
T0=$SECONDS
# fresh folders per call: a warm machine keeps /tmp from earlier calls, and packages or results left
# there by another script (same --target, no --upgrade) would silently win over this call's
RES=$(mktemp -d /tmp/res.XXXX)
SITE=$(mktemp -d /tmp/site.XXXX)
STAGES=" ${STAGES:-tests profile decode} "
mkdir -p "$RES"
pack() { tar czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null; echo "[$((SECONDS - T0))s] $1"; }
has() { [[ "$STAGES" == *" $1 "* ]]; }
WHEELS=".whl_profile/*.whl"
[ -d .whl_attn ] && WHEELS="$WHEELS .whl_attn/*.whl"
[ -d .whl_moe ] && WHEELS="$WHEELS .whl_moe/*.whl"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" $WHEELS || exit 1
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 MAX_JOBS=12
export PATH=$PATH:/usr/local/cuda/bin HPC_ADVISE_HOME=$RES/home HPC_ADVISE_RESULTS=$RES
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv
if [ -d .whl_attn ]; then
  python3 -m zipfile -e .whl_attn/flashinfer_strip.zip "$SITE" || exit 1
  export FLASHINFER_WORKSPACE_BASE=/tmp/fiws
  mkdir -p /tmp/fiws && tar xzf .whl_attn/fiws/fi_cache.tgz -C /tmp/fiws
  has decode && (timeout 100 python3 benchmarks/bench_decode_attention.py --warm-flashinfer > "$RES/fi_warm.log" 2>&1) &
fi

if has tests; then
  timeout "${TEST_S:-150}" python3 -m pytest -v -m gpu ${TEST_PATHS:-tests/kernels tests/runtime} -n 2 --timeout 100 \
    --continue-on-collection-errors -p no:cacheprovider -o addopts="" -rfEs > "$RES/gpu_tests.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$RES/gpu_tests.log" | head -20; tail -3 "$RES/gpu_tests.log"
  pack "gpu tests done"
fi
if has profile; then
  timeout "${PROFILE_S:-130}" python3 -m hpc_advise profile --bench all --write-results profile_bench_h200 \
    > "$RES/profile.log" 2>&1
  tail -40 "$RES/profile_bench_h200.md" 2>/dev/null
  python3 -m hpc_advise runs list > "$RES/runs_list.txt" 2>&1; wc -l "$RES/runs_list.txt"
  pack "profile --bench done"
fi
wait
if has decode; then
  timeout "${DECODE_S:-200}" python3 benchmarks/bench_decode_attention.py --grid full --kv "${KV:-all}" \
    ${GRID_ARGS:-} > "$RES/decode.log" 2>&1
  tail -30 "$RES/decode.log"
  pack "decode attention done"
  # FI_CACHE_OUT=1: FlashInfer's JIT cache after the grid (modules compiled in this call included) as
  # $OUT/fi_cache.tgz, to replace .whl_attn/fiws/fi_cache.tgz so later calls skip the compiles
  [ -n "${FI_CACHE_OUT:-}" ] && tar czf "$OUT/fi_cache.tgz" -C /tmp/fiws .cache && ls -la "$OUT/fi_cache.tgz"
fi
MOE_SHAPES=${MOE_SHAPES:-hy3,qwen3-235b,hy3-tp8,qwen3-30b-a3b,deepseek-v3-ep8}
if has moe-small; then
  timeout "${SMALL_S:-50}" python3 benchmarks/tune_fused_moe.py --small-vs-tuned --shapes "$MOE_SHAPES" \
    --ts 1,4,16 --out "$RES/fused_moe_small_vs_tuned.json" > "$RES/moe_small.log" 2>&1
  grep -v "^  cand" "$RES/moe_small.log" | tail -20
  pack "moe small-vs-tuned done"
fi
if has moe-breakdown; then
  OUT=$RES timeout "${BREAKDOWN_S:-40}" python3 benchmarks/tune_fused_moe.py --breakdown --shapes "$MOE_SHAPES" \
    --ts "${BREAKDOWN_TS:-1,16,128}" > "$RES/moe_breakdown.log" 2>&1
  tail -20 "$RES/moe_breakdown.log"
  pack "moe breakdown done"
fi
if has moe-bench; then
  timeout "${MOE_BENCH_S:-120}" python3 benchmarks/bench_fused_moe.py --ts "${MOE_BENCH_TS:-1,4,16,64,128}" \
    > "$RES/moe_bench.log" 2>&1
  grep -v "^ *$" "$RES/moe_bench.log" | tail -42
  pack "moe bench done"
fi
if has moe-tune; then
  timeout "${TUNE_S:-60}" python3 benchmarks/tune_fused_moe.py --shapes "${TUNE_SHAPES:-$MOE_SHAPES}" --ts "${MOE_TS:-16,64,128}" \
    --budget "${TUNE_BUDGET:-45}" --out "$RES/fused_moe_configs.json" > "$RES/moe_tune.log" 2>&1
  grep -v "^  cand" "$RES/moe_tune.log" | tail -20
  pack "moe tune done"
fi
if has ncu; then
  # Nsight Compute on benchmarks/ncu_targets.py's workloads (NCU_TARGETS, space-separated), clocks left alone
  # (--clock-control none, METHOD.md), L2 flushed before each profiled launch (ncu's default cache control).
  # Kernels: the fused MoE's two GEMMs (regular or small-T path), or decode attention's pass (NCU_ATTN_RE).
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  "$NCU" --version | tail -1
  for t in ${NCU_TARGETS:-moe-deepseek-ep8-t16 attn-fp8-64x4k}; do
    case $t in moe-*) re="gate_up_kernel|_down_kernel"; n=2 ;; *) re=${NCU_ATTN_RE:-decode_kernel|decode_transposed_kernel}; n=1 ;; esac
    timeout "${NCU_S:-60}" "$NCU" --clock-control none -k "regex:$re" -c $n \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
      python3 benchmarks/ncu_targets.py "$t" > "$RES/ncu_$t.txt" 2>&1
    echo "ncu $t: rc $?"; grep -E "^  [a-z_]+kernel|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|One or More Eligible" "$RES/ncu_$t.txt" | head -24
    pack "ncu $t done"
  done
fi
