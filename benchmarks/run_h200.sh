#!/usr/bin/env bash
# One integrated call on the H200 machine (the `device` tool): GPU tests at real sizes, then
# `hpc-advise profile --bench all` into a fresh knowledge base, then the decode-attention sweep and full
# grid against FlashInfer. Carried folders (ignored by git, see README "Running on a GPU"):
#   .whl_profile  sqlite-utils & co. (wheels the device image lacks)
#   .whl_attn     FlashInfer 0.7.2.post1 as flashinfer_strip.zip: the py3-none-any wheel's files minus
#                 the CUDA sources of kernels the decode benchmark never JIT-compiles (fused MoE, GDN,
#                 KDA, Blackwell and other csrc/ and cutlass/ trees), so that it fits the 64 MiB carry
#                 limit; apache-tvm-ffi 0.1.15.post2 (cp312 wheel); fiws/fi_cache.tgz, FlashInfer's JIT
#                 cache from an earlier call (without it the first compile of its four modules took 102 s)
#   .whl_moe      fbgemm-gpu-genai 1.6.0 (cp312 wheel) for benchmarks/bench_fused_moe.py's fbgemm peer
#                 (carry it instead of .whl_attn: both together exceed 64 MiB)
# Results land in $OUT/results.tgz (re-packed after every stage, so a timeout keeps what finished).
# ONLY=decode runs the FlashInfer warm-up and the decode-attention stage alone.
set -o pipefail
T0=$SECONDS
RES=/tmp/res
mkdir -p "$RES"
pack() { tar czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null; echo "[$((SECONDS - T0))s] $1"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl_profile/*.whl .whl_attn/*.whl || exit 1
python3 -m zipfile -e .whl_attn/flashinfer_strip.zip /tmp/site || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FLASHINFER_WORKSPACE_BASE=/tmp/fiws MAX_JOBS=12
export PATH=$PATH:/usr/local/cuda/bin HPC_ADVISE_HOME=$RES/home HPC_ADVISE_RESULTS=$RES
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
mkdir -p /tmp/fiws && tar xzf .whl_attn/fiws/fi_cache.tgz -C /tmp/fiws
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv

( timeout 100 python3 benchmarks/bench_decode_attention.py --warm-flashinfer > "$RES/fi_warm.log" 2>&1 ) &
if [ "${ONLY:-}" != decode ]; then
timeout "${TEST_S:-110}" python3 -m pytest -q -m gpu tests/kernels tests/runtime -n 2 --timeout 100 \
  --continue-on-collection-errors -p no:cacheprovider -o addopts="" -rfEs > "$RES/gpu_tests.log" 2>&1
tail -12 "$RES/gpu_tests.log"
wait
pack "gpu tests done"

timeout "${PROFILE_S:-130}" python3 -m hpc_advise profile --bench all --write-results profile_bench_h200 \
  > "$RES/profile.log" 2>&1
tail -40 "$RES/profile_bench_h200.md" 2>/dev/null
python3 -m hpc_advise runs list > "$RES/runs_list.txt" 2>&1; head -5 "$RES/runs_list.txt"; wc -l "$RES/runs_list.txt"
pack "profile --bench done"
fi
wait

REMAIN=$(( ${TOTAL_S:-500} - (SECONDS - T0) ))
timeout "$REMAIN" python3 benchmarks/bench_decode_attention.py --tune --grid full > "$RES/decode.log" 2>&1
tail -60 "$RES/decode.log"
pack "decode attention done"
