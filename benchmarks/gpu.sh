#!/usr/bin/env bash
# GPU work of hpc-advise in stages: the GPU tests, each bench's table, the fused MoE tuner, the SGLang tests with
# real SGLang, Nsight Compute reports. Device stages run on the device machine from the repository root and
# leave one archive per stage in $OUT; `carry` stages run here and build the folders those calls carry.
# docs/gpu.md says how a call is made; `bash benchmarks/gpu.sh --help` lists the stages.
set -o pipefail

usage() {
  cat <<'EOF'
usage: bash benchmarks/gpu.sh STAGE [ARGS...]

Device stages (on the device machine, from the repository root; results in $OUT/<stage>.tgz):
  tests [PATH...]              pytest -m gpu over PATH (default: tests); log gpu_tests_full_h200.log
                               (gpu_tests_h200.log when PATHs are given)
  bench decode_attention [A]   bench_decode_attention.py [A]: full grid, both KV dtypes  (FlashInfer: .whl_attn)
  bench fused_moe [decode|prefill] [A]
                               bench_fused_moe.py at T <= 128 on the five shapes, or T = 1024,4096,16384;
                               table fused_moe_decode / fused_moe_prefill           (fbgemm peer: .whl_moe)
  bench router_gemm [A]        bench_router_gemm.py [A]: full grid, the shipped configs
  bench traces [A]             bench_traces.py [A]                                  (CPU only)
  bench ep_moe [A]             bench_ep_moe.py on every GPU of the host (2 or more) -> ep_moe_h200x<N>
  bench comm                   hpc-advise profile --bench comm -> comm_h200x<N> (+ _graph, _ws1, _ws1_graph rows)
  bench profile                hpc-advise profile --bench all -> profile_bench_h200 (+ runs list)
  tune fused_moe [A]           tune_fused_moe.py [A] into a copy of configs.json ($RES/fused_moe_configs.json)
  tune router_gemm [A]         tune_router_gemm.py [A] into a copy of configs.json ($RES/router_gemm_configs.json),
                               then bench_router_gemm.py --configs on that copy (table router_gemm)
  sglang [run CMD...]          real SGLang 0.5.23 from .whl_sglang: the runtime's SGLang tests (GPU, then CPU
                               with CUDA hidden), or CMD with SGLang's model runner environment; with
                               .whl_deepgemm, DeepGEMM is built and smoke-checked first (log deepgemm.log)
  ncu TARGET...                Nsight Compute sections of diagnostics/ncu_targets.py workloads
  run CMD...                   any command (a diagnostic, a sweep) in the same environment; what it writes to
                               $HPC_ADVISE_RESULTS comes back in $OUT/run.tgz
  env                          machine facts only

Carry stages (here, not on the device; write into the root of the checkout the device tool sends):
  carry profile                .whl_profile: sqlite-utils & co., what every device stage installs
  carry moe                    .whl_moe: fbgemm-gpu-genai 1.6.0 (the fused MoE bench's fbgemm peer)
  carry attn                   .whl_attn: FlashInfer 0.7.2.post1 without the CUDA sources of other kernels
  carry sglang                 .whl_sglang: SGLang 0.5.23 (repacked) and the packages its imports need
  carry tree                   .whl_tree: this worktree's HEAD (git archive); device stages then run that tree
  carry deepgemm               .whl_deepgemm: DeepGEMM's source (sgl-project fork, CUTLASS/CuTe and fmt headers) as
                               one tar.xz; the sglang stage builds its _C.so on the device (install_deepgemm)

Environment: CARRY (the folder holding the carried .whl_* folders; default the repository root), LIMIT_S
(seconds per step; default 540), TREE_DIR (the carried tree's folder here and there; default .whl_tree),
WARM_S (FlashInfer's warm-up; 200), TEST_N (pytest workers; default 2), DG_BUILD_S / DG_SMOKE_S (DeepGEMM's
build and smoke check; 300 / 150); for carry stages PYTHON (default .venv/bin/python), CARRY_ROOT (default: the
main checkout of these worktrees) and DG_SRC / CUTLASS_SRC / FMT_SRC / DG_COMMIT (carry deepgemm's git sources).
EOF
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
CARRY=${CARRY:-$ROOT}
LIMIT_S=${LIMIT_S:-540}
TREE_DIR=${TREE_DIR:-.whl_tree}
T0=$SECONDS

die() { echo "gpu.sh: $*" >&2; exit 2; }
say() { echo "[$((SECONDS - T0))s] $*"; }

# ---------------------------------------------------------------- carry stages (here)

carry_root() {  # the device tool sends the checkout the session started in: a worktree's main checkout
  [ -n "${CARRY_ROOT:-}" ] && { echo "$CARRY_ROOT"; return; }
  git worktree list --porcelain 2>/dev/null | awk '/^worktree /{print $2; exit}' | grep . || echo "$ROOT"
}

carry_dest() {  # $1 folder name -> fresh folder in the carry root, ignored by git there
  local root dest exclude
  root=$(carry_root)
  dest="$root/$1"
  if git -C "$root" rev-parse 2>/dev/null && ! git -C "$root" check-ignore -q "$dest/"; then
    exclude="$(git -C "$root" rev-parse --path-format=absolute --git-common-dir)/info/exclude"
    mkdir -p "$(dirname "$exclude")"
    [ -s "$exclude" ] && [ -n "$(tail -c1 "$exclude")" ] && echo >> "$exclude"
    echo "/$1/" >> "$exclude" && echo "added /$1/ to $exclude" >&2
  fi
  rm -rf "$dest" && mkdir -p "$dest" && echo "$dest"
}

pip_download() {  # $1 folder, then NAME==VERSION...: cp312 manylinux x86_64 wheels, no dependencies
  local dest=$1 py=${PYTHON:-.venv/bin/python} plat=() p
  shift
  [ -x "$py" ] || py=python3
  for p in manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    plat+=(--platform "${p}_x86_64")
  done
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d "$dest" "$@"
}

carry_stage() {
  local what=$1 dest dl py=${PYTHON:-.venv/bin/python}
  [ -x "$py" ] || py=python3
  case $what in
    profile)
      # what the device image lacks of hpc-advise's dependencies (the image's list: the device tool's KINDS.md)
      dest=$(carry_dest .whl_profile) || exit 1
      pip_download "$dest" sqlite-utils==4.2.1 sqlite-fts4==1.0.3 click-default-group==1.2.4 platformdirs==4.14.9 \
        orjson==3.13.0 zstandard==0.25.0 || exit 1 ;;
    moe)
      dest=$(carry_dest .whl_moe) || exit 1
      pip_download "$dest" fbgemm-gpu-genai==1.6.0 || exit 1 ;;
    attn)
      # the 62 MB wheel minus flashinfer/data/csrc/<subfolder>/: sources of other kernels (MoE, GDN, KDA,
      # Blackwell, ...). The decode and prefill modules the bench JIT-compiles use csrc's top-level files,
      # include/ and cutlass/ only. Unpacked on the device by python3 -m zipfile -e.
      dest=$(carry_dest .whl_attn) || exit 1
      dl=$(mktemp -d)
      "$py" -m pip download -q --no-deps --only-binary=:all: -d "$dl" flashinfer-python==0.7.2.post1 || exit 1
      pip_download "$dest" apache-tvm-ffi==0.1.15.post2 || exit 1
      "$py" - "$dl"/flashinfer_python-*.whl "$dest/flashinfer_strip.zip" <<'EOF' || exit 1
import re, sys, zipfile
src, out = sys.argv[1:3]
drop = re.compile(r"^flashinfer/data/csrc/[^/]+/")
kept = dropped = 0
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist():
        if drop.match(info.filename):
            dropped += info.file_size
            continue
        data = zin.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            data = "".join(l + "\n" for l in data.decode().splitlines() if not drop.match(l.split(",")[0])).encode()
        zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
        kept += 1
print(f"flashinfer_strip.zip: {kept} files, dropped {dropped / 1e6:.0f} MB uncompressed under csrc/*/")
EOF
      rm -rf "$dl"
      echo "FlashInfer JIT-compiles its modules in the first call (minutes); FI_CACHE_OUT=1 returns the cache as" \
        "\$OUT/fi_cache.tgz: put it at $dest/fiws/fi_cache.tgz for later calls" ;;
    sglang)
      # Packages the SGLang tests and SGLang's model runner import that the device image lacks, at the versions CI
      # installs (requirements/sglang-cpu.txt; transformers 5.19.0 as sglang pins it). sgl-kernel is not carried
      # (373 MB): tests/runtime's sgl_kernel stand-in covers the imports. sglang's wheel is repacked without what
      # nothing here imports: the Rust extension binaries (loaded lazily by the HTTP server, gRPC, benchmarks and
      # multimodal processors), multimodal_gen/ (the diffusion runtime) and test/ (SGLang's own test kits).
      dest=$(carry_dest .whl_sglang) || exit 1
      dl=$(mktemp -d)
      pip_download "$dl" sglang==0.5.23 transformers==5.19.0 openai==2.8.0 distro==1.9.0 sniffio==1.3.1 \
        compressed-tensors==0.18.0 loguru==0.7.3 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
        typing-inspection==0.4.5 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 ipython==9.18.1 \
        traitlets==5.16.1 apache-tvm-ffi==0.1.11 pyzmq==27.3.0 msgspec==0.22.0 orjson==3.13.0 pybase64==1.5.1 \
        zstandard==0.25.0 dill==0.4.1 gguf==0.19.0 partial-json-parser==0.2.1.1.post7 opentelemetry-api==1.45.2 \
        setproctitle==1.3.8 || exit 1
      find "$dl" -name '*.whl' ! -name 'sglang-*' -exec cp {} "$dest/" \;
      "$py" - "$dl" "$dest" <<'EOF' || exit 1
import fnmatch, pathlib, sys, zipfile
dl, dest = map(pathlib.Path, sys.argv[1:3])
DROP = ("sglang/srt/rust_extensions/*.so", "sglang/multimodal_gen/*", "sglang/test/*")
(src,) = dl.glob("sglang-0.5.23-cp312-*.whl")
dropped = 0
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest / src.name, "w", zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist():
        if any(fnmatch.fnmatch(info.filename, p) for p in DROP):
            dropped += info.file_size
            continue
        data = zin.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            keep = [l for l in data.decode().splitlines() if not any(fnmatch.fnmatch(l.split(",")[0], p) for p in DROP)]
            data = ("\n".join(keep) + "\n").encode()
        zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
print(f"{src.name}: {src.stat().st_size / 1e6:.1f} -> {(dest / src.name).stat().st_size / 1e6:.1f} MB")
EOF
      rm -rf "$dl" ;;
    tree)
      # the device copy is the main checkout; this carries a worktree's committed HEAD (no uncommitted edits)
      dest=$(carry_dest "$TREE_DIR") || exit 1
      git rev-parse HEAD > "$dest/TREE_COMMIT"
      git archive --format=tar.gz -o "$dest/tree.tar.gz" --add-file="$dest/TREE_COMMIT" HEAD \
        hpc_advise tests benchmarks pyproject.toml README.md ':!benchmarks/results' || exit 1
      echo "tree.tar.gz = $(git rev-parse --short=12 HEAD) of $ROOT" ;;
    deepgemm)
      # SGLang 0.5.23 pins sgl-deep-gemm 0.2.3.post2, whose prebuilt _C.so needs a newer torch than the device's
      # 2.11 and whose sources are published nowhere here (no sdist; the fork's snapshot ends before it). This
      # carries the newest whole source tree there is: sgl-project/DeepGEMM's dev branch (its tvm-ffi binding,
      # csrc/tvm_ffi_api.cpp, one host C++ file; the CUDA kernels are JIT-compiled at run time by nvcc from
      # deep_gemm/include) with the CUTLASS and fmt commits its submodules name. Only what the build and the JIT
      # read: deep_gemm/ (no tests), csrc/, CUTLASS's include/cute and include/cutlass (put where setup.py's
      # prepare_includes puts them, deep_gemm/include/), fmt's include/.
      local mirror=/work/.mirror src cl fm commit clc fmc stage
      src=${DG_SRC:-$mirror/sgl-project+DeepGEMM/repo}
      cl=${CUTLASS_SRC:-$mirror/NVIDIA+cutlass/repo}
      fm=${FMT_SRC:-$mirror/fmtlib+fmt/repo}
      commit=${DG_COMMIT:-2176dff556d6fb8f0184516dc224a3b31a094b98}  # dev, 2026-06-12
      for r in "$src" "$cl" "$fm"; do
        [ -d "$r" ] || die "no git source at $r (DG_SRC / CUTLASS_SRC / FMT_SRC; the fetch tool's mirrors)"
      done
      git -C "$src" rev-parse -q --verify "$commit^{commit}" > /dev/null \
        || die "no DeepGEMM commit $commit in $src (DG_SRC: a clone of github.com/sgl-project/DeepGEMM)"
      clc=$(git -C "$src" rev-parse "$commit:third-party/cutlass") || exit 1
      fmc=$(git -C "$src" rev-parse "$commit:third-party/fmt") || exit 1
      dest=$(carry_dest .whl_deepgemm) || exit 1
      stage=$(mktemp -d)
      mkdir -p "$stage/deepgemm/third-party/fmt" "$stage/deepgemm/third-party/cutlass"
      git -C "$src" archive "$commit" deep_gemm csrc setup.py LICENSE README.md | tar x -C "$stage/deepgemm" || exit 1
      git -C "$cl" archive "$clc" include/cute include/cutlass LICENSE.txt | tar x -C "$stage/deepgemm/deep_gemm" \
        || die "CUTLASS $clc (the commit DeepGEMM $commit names) is not in $cl"
      mv "$stage/deepgemm/deep_gemm/LICENSE.txt" "$stage/deepgemm/third-party/cutlass/LICENSE.txt"
      git -C "$fm" archive "$fmc" include LICENSE | tar x -C "$stage/deepgemm/third-party/fmt" \
        || die "fmt $fmc (the commit DeepGEMM $commit names) is not in $fm"
      printf 'deepgemm %s (%s)\ncutlass %s (%s)\nfmt %s (%s)\n' \
        "$commit" "$(git -C "$src" log -1 --format='%ci %s' "$commit")" \
        "$clc" "$(git -C "$cl" describe --tags "$clc" 2>/dev/null)" \
        "$fmc" "$(git -C "$fm" describe --tags "$fmc" 2>/dev/null)" > "$stage/deepgemm/SOURCE"
      cp "$stage/deepgemm/SOURCE" "$dest/SOURCE"
      tar cJf "$dest/deepgemm-src.tar.xz" -C "$stage" deepgemm || exit 1
      echo "deepgemm-src.tar.xz: $(find "$stage/deepgemm" -type f | wc -l) files," \
        "$(du -sm "$stage/deepgemm" | cut -f1) MB unpacked"
      cat "$dest/SOURCE"
      rm -rf "$stage" ;;
    *) die "unknown carry stage '$what' (profile, moe, attn, sglang, tree, deepgemm)" ;;
  esac
  du -sh "$dest"
  git -C "$(carry_root)" rev-parse 2>/dev/null || return 0
  echo "what travels besides the carried folders: $(git -C "$(carry_root)" ls-files -co --exclude-standard -z \
    | (cd "$(carry_root)" && du -ch --files0-from=- 2>/dev/null) | tail -1)  (limit: 64 MiB in all)"
}

case ${1:-} in
  ""|-h|--help|help) usage; exit 0 ;;
  carry) [ -n "${2:-}" ] || die "carry needs one of: profile, moe, attn, sglang, tree, deepgemm"; carry_stage "$2"; exit ;;
  tests|bench|tune|sglang|ncu|run|env) ;;
  *) die "unknown stage '$1' (bash benchmarks/gpu.sh --help lists them)" ;;
esac

# ---------------------------------------------------------------- device stages

[ -n "${OUT:-}" ] || die "\$OUT is not set: device stages run on the device machine (docs/gpu.md)"
command -v nvidia-smi > /dev/null || [ "$1 ${2:-}" = "bench traces" ] || die "no nvidia-smi: not a GPU machine"

# A carried worktree (carry tree): unpack it and run its own gpu.sh there, carried folders still read from here.
if [ -z "${GPU_SH_TREE:-}" ] && [ -f "$CARRY/$TREE_DIR/tree.tar.gz" ]; then
  TREE=$(mktemp -d /tmp/tree.XXXX)
  tar xzf "$CARRY/$TREE_DIR/tree.tar.gz" -C "$TREE" || die "cannot unpack $CARRY/$TREE_DIR/tree.tar.gz"
  [ -f "$TREE/benchmarks/gpu.sh" ] \
    || die "the carried tree ($(cat "$TREE/TREE_COMMIT" 2>/dev/null)) has no benchmarks/gpu.sh"
  echo "running the carried tree $(cat "$TREE/TREE_COMMIT" 2>/dev/null) in $TREE"
  GPU_SH_TREE=$TREE CARRY=$CARRY exec bash "$TREE/benchmarks/gpu.sh" "$@"
fi

case $1 in  # the archive's name: tests, bench_<what>[_decode|_prefill], tune_<what>, sglang, ncu, env
  bench|tune) LABEL=$1_${2:-}
    if [ "$1 ${2:-}" = "bench fused_moe" ]; then [ "${3:-}" = prefill ] && LABEL+=_prefill || LABEL+=_decode; fi ;;
  *) LABEL=$1 ;;
esac
LABEL=${LABEL//[^A-Za-z0-9_.-]/_}
# fresh folders per call: a warm machine keeps /tmp from earlier calls, and packages left there would win
RES=$(mktemp -d /tmp/res.XXXX)
SITE=$(mktemp -d /tmp/site.XXXX)
pack() { tar czf "$OUT/$LABEL.tgz.part" -C "$RES" . 2>/dev/null && mv "$OUT/$LABEL.tgz.part" "$OUT/$LABEL.tgz"; }
trap pack EXIT

install_wheels() {  # carried folders $@ (in order; the first wheel of a distribution wins) into $SITE
  local d w name seen=" " list=()
  for d in "$@"; do
    for w in "$CARRY/$d"/*.whl; do
      [ -f "$w" ] || continue
      name=$(basename "$w" | cut -d- -f1 | tr 'A-Z' 'a-z')
      [[ "$seen" == *" $name "* ]] && continue
      seen="$seen$name "
      list+=("$w")
    done
  done
  [ ${#list[@]} -gt 0 ] || return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "${list[@]}" \
    > "$RES/install.log" 2>&1 || { tail -20 "$RES/install.log"; die "installing the carried wheels failed"; }
}

setup_flashinfer() {  # FlashInfer from .whl_attn, with its JIT cache from an earlier call if carried
  [ -f "$CARRY/.whl_attn/flashinfer_strip.zip" ] || return 1
  python3 -m zipfile -e "$CARRY/.whl_attn/flashinfer_strip.zip" "$SITE" || die "cannot unpack flashinfer_strip.zip"
  export FLASHINFER_WORKSPACE_BASE=/tmp/fiws
  mkdir -p /tmp/fiws
  [ -f "$CARRY/.whl_attn/fiws/fi_cache.tgz" ] && tar xzf "$CARRY/.whl_attn/fiws/fi_cache.tgz" -C /tmp/fiws
  return 0
}

install_deepgemm() {  # DeepGEMM from .whl_deepgemm: build its _C.so against this torch, smoke-check, then use it
  local tgz=$CARRY/.whl_deepgemm/deepgemm-src.tar.xz t0=$SECONDS d log=$RES/deepgemm.log rc
  [ -f "$tgz" ] || return 0
  d=$(mktemp -d /tmp/deepgemm.XXXX)
  {
    echo "source: $(tr '\n' ';' < "$CARRY/.whl_deepgemm/SOURCE" 2>/dev/null)"
    echo "c++: $(c++ --version 2>&1 | head -1) | nvcc: $(nvcc --version 2>&1 | grep -o 'release [0-9.]*')"
  } > "$log"
  tar xJf "$tgz" -C "$d" >> "$log" 2>&1 || { say "deepgemm: cannot unpack $tgz"; rm -rf "$d"; return 1; }
  # the build reads CUTLASS from third-party/cutlass/include, the JIT from deep_gemm/include: one copy, carried
  # where the JIT looks (setup.py's prepare_includes), linked for the build
  ln -s ../../deep_gemm/include "$d/deepgemm/third-party/cutlass/include"
  # _C.so: deep_gemm/__init__.py builds it on first import when it is missing (tvm_ffi.cpp.build: one host C++
  # file, csrc/tvm_ffi_api.cpp, with ninja, against this torch and CUDA; no device code in it). The GEMM kernels
  # are JIT-compiled on first call by nvcc for sm_90a (DeepGEMM's device_runtime names the arch with its 'a'),
  # cached in DG_JIT_CACHE_DIR.
  export DG_JIT_CACHE_DIR=${DG_JIT_CACHE_DIR:-/tmp/deepgemm_jit}
  timeout "${DG_BUILD_S:-300}" env PYTHONPATH="$PYTHONPATH:$d/deepgemm" MAX_JOBS=16 TVM_FFI_CUDA_ARCH_LIST=9.0a \
    CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} python3 -c 'import deep_gemm; print("built", deep_gemm.__file__)' \
    >> "$log" 2>&1
  rc=$?
  say "deepgemm: build rc $rc$([ $rc = 124 ] && echo " (cut at DG_BUILD_S=${DG_BUILD_S:-300})") in $((SECONDS - t0)) s"
  if [ $rc = 0 ] && [ -f "$d/deepgemm/deep_gemm/_C.so" ]; then
    timeout "${DG_SMOKE_S:-150}" env PYTHONPATH="$PYTHONPATH:$d/deepgemm" CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} \
      python3 "$ROOT/benchmarks/diagnostics/deepgemm_smoke.py" >> "$log" 2>&1
    rc=$?
    [ $rc = 124 ] && echo "deepgemm smoke: FAIL cut at DG_SMOKE_S=${DG_SMOKE_S:-150}" >> "$log"
  fi
  grep -E "^deepgemm smoke:|^  (contiguous|masked):" "$log" || tail -15 "$log"
  pack
  if [ $rc = 0 ]; then
    export PYTHONPATH=$PYTHONPATH:$d/deepgemm CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    say "deepgemm: installed ($d/deepgemm on PYTHONPATH), wall $((SECONDS - t0)) s"
    return 0
  fi
  rm -rf "$d"  # nothing half-built stays importable: SGLang's DeepSeek modules must import without it
  say "deepgemm: NOT installed (rc $rc; $RES/deepgemm.log), wall $((SECONDS - t0)) s"
  return 1
}

machine_facts() {
  {
    if [ -f "$ROOT/TREE_COMMIT" ]; then
      echo "tree: $(cat "$ROOT/TREE_COMMIT") (carried)"
    else  # the sent copy's .git can be stale, and its uncommitted edits are not in it
      echo "tree: the sent checkout; its .git names $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo nothing)"
    fi
    nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.mem,memory.used --format=csv
    [ "$(nvidia-smi -L | wc -l)" -gt 1 ] && nvidia-smi topo -m
    python3 - <<'EOF'
import importlib.metadata as md, sys
import torch, triton
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| triton", triton.__version__, "| gpus", torch.cuda.device_count())
for d in ("sglang", "transformers", "flashinfer-python", "apache-tvm-ffi", "fbgemm-gpu-genai", "sqlite-utils"):
    try:
        print(f"  {d} {md.version(d)}")
    except md.PackageNotFoundError:
        pass
EOF
  } > "$RES/machine.txt" 2>&1
  head -4 "$RES/machine.txt"
}

step() {  # $1 log name, then the command: under LIMIT_S, output to $RES/$1.log, archive re-packed after
  local log=$1 rc
  shift
  timeout "$LIMIT_S" "$@" > "$RES/$log.log" 2>&1
  rc=$?
  echo "rc $rc" >> "$RES/$log.log"
  pack
  say "$log: rc $rc$([ $rc = 124 ] && echo " (cut at LIMIT_S=$LIMIT_S)")"
  return $rc
}

# the environment every device stage shares (NVLink multicast off: the device tool's KINDS.md)
export PYTHONPATH=$SITE:$ROOT PYTHONUNBUFFERED=1 HPC_ADVISE_HOME=$RES/home HPC_ADVISE_RESULTS=$RES
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export MAX_JOBS=12 PATH=$PATH:/usr/local/cuda/bin
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)

if [ "$1" = sglang ]; then
  [ -d "$CARRY/.whl_sglang" ] || die "sglang needs .whl_sglang carried (bash benchmarks/gpu.sh carry sglang)"
  install_wheels .whl_sglang .whl_profile .whl_attn
  setup_flashinfer || true
  install_deepgemm || true  # with .whl_deepgemm only; the stage runs on without it
else
  [ -d "$CARRY/.whl_profile" ] || echo "warning: .whl_profile not carried: sqlite-utils & co. missing" >&2
  install_wheels .whl_profile .whl_attn .whl_moe
fi
machine_facts
pack

# pytest -m gpu as every stage runs it (paths follow): 2 workers (more ran out of GPU memory), 100 s per test
PYTEST_GPU=(python3 -m pytest -v -m gpu -n "${TEST_N:-2}" --continue-on-collection-errors -p no:cacheprovider
  -o addopts="" -rfEs)
python3 -c "import pytest_timeout" 2> /dev/null && PYTEST_GPU+=(--timeout "${TEST_TIMEOUT:-100}")

case $1 in
  env) ;;
  run)
    shift
    [ $# -gt 0 ] || die "run needs a command"
    step run "$@"
    tail -40 "$RES/run.log" ;;
  tests)
    shift
    log=gpu_tests_full_h200
    [ $# -gt 0 ] && log=gpu_tests_h200
    step "$log" "${PYTEST_GPU[@]}" "${@:-tests}"
    grep -E "^(FAILED|ERROR)" "$RES/$log.log" | head -20; tail -2 "$RES/$log.log" ;;
  bench)
    what=${2:-}
    shift 2 || true
    case $what in
      decode_attention)
        if setup_flashinfer; then
          # compiles FlashInfer's modules before the grid times them (minutes without a carried JIT cache)
          LIMIT_S=${WARM_S:-200} step warm_flashinfer python3 benchmarks/bench_decode_attention.py --warm-flashinfer
          peers=()
        else
          echo "no .whl_attn: FlashInfer peers left out"
          peers=(--peers static,torch_fa2)
        fi
        step bench_decode_attention python3 benchmarks/bench_decode_attention.py "${peers[@]}" "$@"
        tail -30 "$RES/bench_decode_attention.log"
        # FI_CACHE_OUT=1: FlashInfer's JIT cache after the grid, for .whl_attn/fiws/fi_cache.tgz
        [ -n "${FI_CACHE_OUT:-}" ] && [ -d /tmp/fiws ] && tar czf "$OUT/fi_cache.tgz" -C /tmp/fiws . ;;
      fused_moe)
        part=decode
        case ${1:-} in decode|prefill) part=$1; shift ;; esac
        [ -d "$CARRY/.whl_moe" ] || echo "no .whl_moe: the fbgemm peer is left out"
        # the part's shapes and T unless given
        args=()
        if [ "$part" = decode ] && [[ " $* " != *" --shapes "* ]]; then
          args+=(--shapes deepseek-v3-ep8,qwen3-30b-a3b,hy3-tp8,qwen3-235b,hy3)
        fi
        if [[ " $* " != *" --ts "* ]]; then
          [ "$part" = decode ] && args+=(--ts 1,4,16,64,128) || args+=(--ts 1024,4096,16384)
        fi
        # one table per part: fused_moe_decode / fused_moe_prefill
        step "bench_fused_moe_$part" python3 benchmarks/bench_fused_moe.py --stem "fused_moe_$part" "${args[@]}" "$@"
        grep -v "^ *$" "$RES/bench_fused_moe_$part.log" | tail -30 ;;
      router_gemm)
        step bench_router_gemm python3 benchmarks/bench_router_gemm.py "$@"
        tail -30 "$RES/bench_router_gemm.log" ;;
      traces)
        step bench_traces python3 benchmarks/bench_traces.py "$@"
        tail -20 "$RES/bench_traces.log" ;;
      ep_moe)
        [ "$NGPU" -ge 2 ] || die "bench ep_moe needs 2 or more GPUs (nvidia-h200-x2 or larger); this host has $NGPU"
        step bench_ep_moe python3 benchmarks/bench_ep_moe.py --world-size "$NGPU" --stem "ep_moe_h200x$NGPU" "$@"
        grep -E "^\| |Error" "$RES/bench_ep_moe.log" | tail -20 ;;
      comm)
        stem=comm_h200x$NGPU
        step bench_comm python3 -m hpc_advise profile --bench comm --write-results "$stem"
        python3 -m hpc_advise runs list --kind comm --limit 200 > "$RES/comm_runs_list.txt" 2>&1
        # the same collectives as CUDA-graph replays, and at world size 1 (the per-call floor, no link bytes)
        for spec in "$NGPU True ${stem}_graph" "1 False ${stem}_ws1" "1 True ${stem}_ws1_graph"; do
          read -r ws graph name <<< "$spec"
          step "bench_$name" python3 -c "
import json, os, sys
from hpc_advise.runtime.measure import comm
rows = comm.measure($ws, device='cuda', graph=$graph)
with open(os.path.join(os.environ['HPC_ADVISE_RESULTS'], '$name.jsonl'), 'w') as fh:
    fh.writelines(json.dumps(r, sort_keys=True) + '\n' for r in rows)
print(len(rows), 'rows, world size $ws, graph $graph')"
        done ;;
      profile)
        step bench_profile python3 -m hpc_advise profile --bench all --write-results profile_bench_h200
        python3 -m hpc_advise runs list > "$RES/profile_runs_list.txt" 2>&1
        tail -40 "$RES/profile_bench_h200.md" 2>/dev/null ;;
      *) die "bench needs one of: decode_attention, fused_moe, router_gemm, traces, ep_moe, comm, profile" ;;
    esac ;;
  tune)
    what=${2:-}
    shift 2 || true
    case $what in
      fused_moe)
        # the tuner merges its picks into a copy; ship by copying it over hpc_advise/kernels/fused_moe/configs.json
        cp hpc_advise/kernels/fused_moe/configs.json "$RES/fused_moe_configs.json"
        # (the tuner's per-launch rows go to $OUT: here, into the archive)
        step tune_fused_moe env OUT="$RES" python3 benchmarks/tune_fused_moe.py --out "$RES/fused_moe_configs.json" "$@"
        grep -v "^  cand" "$RES/tune_fused_moe.log" | tail -30 ;;
      router_gemm)
        # ship by copying router_gemm_configs.json over hpc_advise/kernels/router_gemm/configs.json
        step tune_router_gemm python3 benchmarks/tune_router_gemm.py --out "$RES/router_gemm_configs.json" "$@" \
          || exit 1
        tail -12 "$RES/tune_router_gemm.log"
        step bench_router_gemm python3 benchmarks/bench_router_gemm.py --configs "$RES/router_gemm_configs.json"
        tail -30 "$RES/bench_router_gemm.log" ;;
      *) die "tune needs one of: fused_moe, router_gemm" ;;
    esac ;;
  sglang)
    shift
    if [ "${1:-}" = run ]; then
      shift
      [ $# -gt 0 ] || die "sglang run needs a command"
      # SGLang's own ModelRunner without sgl-kernel: norms, activation, top-k, rotary on their torch paths, and
      # no sgl-kernel version assert (the stand-in is import-only)
      step sglang_run env SGLANG_FORCE_FUSED_OP_BACKEND=torch SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 "$@"
      tail -40 "$RES/sglang_run.log"
      exit
    fi
    mapfile -t files < <(find tests/runtime -name 'test_*.py' -path '*sglang*' | sort)
    [ ${#files[@]} -gt 0 ] || die "no SGLang test files under tests/"
    step sglang_gpu_tests_h200 "${PYTEST_GPU[@]}" "${files[@]}"
    grep -E "^(FAILED|ERROR)" "$RES/sglang_gpu_tests_h200.log" | head -12; tail -2 "$RES/sglang_gpu_tests_h200.log"
    # the CPU tests as CI runs them: CUDA hidden (SGLang takes its CPU branches), the Triton interpreter, and the
    # hpc-advise dist-info for the entry-point test
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$SITE/hpc" . \
      > "$RES/hpc_dist.log" 2>&1 && export PYTHONPATH=$PYTHONPATH:$SITE/hpc
    step sglang_cpu_tests env CUDA_VISIBLE_DEVICES= python3 -m pytest -q -m "not gpu" "${files[@]}" -n 4 \
      -p no:cacheprovider -o addopts="" -rfEs
    tail -2 "$RES/sglang_cpu_tests.log" ;;
  ncu)
    shift
    [ $# -gt 0 ] || set -- moe-deepseek-ep8-t16 attn-fp8-64x4k
    targets=benchmarks/diagnostics/ncu_targets.py
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    [ -n "$NCU" ] || die "no ncu on this machine"
    for t in "$@"; do
      case $t in
        moe-*) re="gate_up_kernel|_down_kernel"; n=2 ;;
        *) re=${NCU_ATTN_RE:-decode_kernel|decode_transposed_kernel}; n=1 ;;
      esac
      # clocks left alone (--clock-control none); L2 flushed before each profiled launch (ncu's default)
      step "ncu_$t" "$NCU" --clock-control none -k "regex:$re" -c $n --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section ComputeWorkloadAnalysis python3 "$targets" "$t"
      grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per" "$RES/ncu_$t.log" | head -12
    done ;;
esac
say "done: \$OUT/$LABEL.tgz"
