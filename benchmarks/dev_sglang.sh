#!/usr/bin/env bash
# The SGLang integration's tests on the H200 machine (the `device` tool), with real SGLang 0.5.23 carried
# in .whl_sglang/ (built by benchmarks/pack_sglang_carry.sh) and .whl_profile/. Call it as
#   run(command="bash benchmarks/dev_sglang.sh", carry=[".whl_profile", ".whl_sglang"], timeout_s=150)
# Stages, each under its own time limit, results re-packed into $OUT/results.tgz after each:
#   install  the carried wheels into /tmp/sglang_site (--no-index --no-deps --no-compile --target)
#   tree     the tests run from .whl_sglang/tree.tar.gz (git archive of a commit; the device copy has no
#            .git, and other engineers' uncommitted edits in the working tree must not leak into the run)
#   gpu      pytest -m gpu on test_sglang_attention/_moe/_plugin at real sizes (GPU_S, default 95 s)
#   cpu      the same files' CPU tests plus the sgl_kernel stand-in's as CI runs them: CUDA hidden
#            (CUDA_VISIBLE_DEVICES=), so SGLang takes its CPU branches (with CUDA visible its KV store
#            runs its CUDA-only store_cache op even on CPU tensors) and conftest picks the Triton
#            interpreter; with whatever time is left (to 140 s); the entry point test needs the
#            hpc-advise dist-info (built from the tree with the image's setuptools)
# A warm machine keeps /tmp from earlier calls (other scripts install into /tmp/site), so the site and
# results folders here are fresh ones of this script's own.
set -o pipefail
T0=$SECONDS
RES=/tmp/sglang_res
SITE=/tmp/sglang_site
rm -rf "$RES" "$SITE" /tmp/sglang_site_hpc /tmp/tree
mkdir -p "$RES"
pack() { tar czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null; echo "[$((SECONDS - T0))s] $1"; }
FILES="tests/runtime/test_sglang_attention.py tests/runtime/test_sglang_moe.py tests/runtime/test_sglang_plugin.py"

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
  .whl_sglang/*.whl .whl_profile/*.whl > "$RES/install.log" 2>&1 || { tail -20 "$RES/install.log"; pack "install FAILED"; exit 1; }
SRC=$PWD
if [ -f .whl_sglang/tree.tar.gz ]; then
  mkdir -p /tmp/tree && tar xzf .whl_sglang/tree.tar.gz -C /tmp/tree && SRC=/tmp/tree
  cp .whl_sglang/tree_commit.txt "$RES/"
  # the tree is whatever commit pack_sglang_carry.sh archived last: say loudly when it is not this working tree
  # (a stale tree.tar.gz ran the previous session's code in one call of 2026-11-29 20:07 UTC)
  STALE=$(diff -rq /tmp/tree/hpc_advise hpc_advise 2>&1 | grep -v __pycache__ | tee "$RES/tree_vs_working_tree.txt" | wc -l)
  [ "$STALE" -gt 0 ] && echo "WARNING: the carried tree (commit $(cat .whl_sglang/tree_commit.txt)) differs from this" \
    "working tree in $STALE hpc_advise paths (uncommitted edits, or a stale tree.tar.gz: re-pack it with" \
    "git archive, see benchmarks/pack_sglang_carry.sh)"
fi
cd "$SRC" || exit 1
export PYTHONPATH=$SITE:$SRC PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
pack "installed; tests run from $SRC (commit $(cat "$RES/tree_commit.txt" 2>/dev/null || echo 'working tree'))"

{
  date -u +"%Y-%m-%d %H:%M:%S UTC"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
  python3 - <<'EOF'
import importlib.metadata as md, sys
import torch, triton
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| triton", triton.__version__, "|", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
for d in ("sglang", "transformers", "torchvision", "tokenizers", "huggingface_hub", "pydantic", "apache-tvm-ffi",
          "compressed-tensors", "openai", "numpy", "pytest", "sgl-kernel"):
    try:
        v = md.version(d)
    except md.PackageNotFoundError:
        v = "not installed"
    print(f"  {d} {v}")
EOF
} > "$RES/versions.txt" 2>&1
cat "$RES/versions.txt"

timeout "${GPU_S:-95}" python3 -m pytest -v -m gpu $FILES -p no:cacheprovider -o addopts="" -rfEs \
  --timeout 80 > "$RES/gpu_tests.log" 2>&1
echo "gpu stage rc=$?" >> "$RES/gpu_tests.log"
pack "gpu tests done"

LEFT=$((140 - (SECONDS - T0)))
if [ "$LEFT" -gt 20 ]; then
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/sglang_site_hpc . \
    > "$RES/hpc_dist.log" 2>&1 && export PYTHONPATH=$PYTHONPATH:/tmp/sglang_site_hpc
  CUDA_VISIBLE_DEVICES= timeout "$LEFT" python3 -m pytest -q -m "not gpu" $FILES \
    tests/runtime/test_sglang_sgl_kernel_stand_in.py -n 4 -p no:cacheprovider -o addopts="" -rfEs \
    --timeout 100 > "$RES/cpu_tests.log" 2>&1
  echo "cpu stage rc=$?" >> "$RES/cpu_tests.log"
  pack "cpu tests done"
fi

echo "== GPU tests (-m gpu) =="
grep -E "(PASSED|FAILED|ERROR|SKIPPED)" "$RES/gpu_tests.log" | grep "::" | sed 's/ *\[ *[0-9]*%\]//' | tail -12
grep -E "^(FAILED|ERROR)|^E  " "$RES/gpu_tests.log" | head -12
tail -2 "$RES/gpu_tests.log"
if [ -f "$RES/cpu_tests.log" ]; then
  echo "== CPU tests on the GPU machine (CUDA hidden, Triton interpreter) =="
  grep -E "^(FAILED|ERROR)" "$RES/cpu_tests.log" | head -12
  tail -2 "$RES/cpu_tests.log"
fi
