#!/usr/bin/env bash
# Build .whl_sglang/ (ignored by git), the folder that carries real SGLang 0.5.23 to the H200 machine
# for benchmarks/dev_sglang.sh: cp312 manylinux x86_64 wheels of sglang and of the packages its imports
# need there, plus tree.tar.gz, the committed tree (git archive HEAD) the tests run from.
#
# The device image already has torch 2.11, triton 3.6, numpy, torchvision 0.26, tokenizers, safetensors,
# huggingface_hub, aiohttp, requests, pillow, psutil, einops, tqdm, sentencepiece, ... (the image's
# package list: /work/.library/device/KINDS.md). What it lacks was found by recording every module the
# runtime tests import on CPU (tests/runtime/test_sglang_*.py) and mapping them to distributions;
# versions are the ones CI installs (requirements/sglang-cpu.txt; transformers 5.19.0 as sglang pins
# it, the image has 5.17.0). sgl-kernel is not carried (far too large): see
# tests/runtime/sgl_kernel_stand_in.py.
#
# sglang's cp312 wheel is 38 MB and the carry limit is 64 MiB for everything, so it is repacked without
# what the tests never import (checked against the recorded module list): the four Rust extension
# binaries in sglang/srt/rust_extensions/ (_server, _bench, _grpc, _multimodal: 18 MB; loaded lazily
# by load_rust_extension, only by the HTTP server, gRPC, benchmarks and multimodal processors),
# sglang/multimodal_gen/ (the diffusion runtime) and sglang/test/ (SGLang's own test kits). RECORD
# loses those lines; no file of SGLang is edited. Usage: bash benchmarks/pack_sglang_carry.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.whl_sglang
CACHE=${CACHE:-/tmp/sglang_carry_dl}
PY=${PYTHON:-.venv/bin/python}
PKGS=(
  sglang==0.5.23
  transformers==5.19.0
  openai==2.8.0 distro==1.9.0 sniffio==1.3.1
  compressed-tensors==0.18.0 loguru==0.7.3
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0
  ipython==9.18.1 traitlets==5.16.1
  apache-tvm-ffi==0.1.11 pyzmq==27.3.0 msgspec==0.22.0 orjson==3.13.0 pybase64==1.5.1 zstandard==0.25.0
  dill==0.4.1 gguf==0.19.0 partial-json-parser==0.2.1.1.post7 opentelemetry-api==1.45.2
)
PLATFORMS=()
for p in manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1 manylinux_2_5; do
  PLATFORMS+=(--platform "${p}_x86_64")
done
mkdir -p "$CACHE"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d "$CACHE" "${PKGS[@]}"
rm -rf "$DEST" && mkdir -p "$DEST"
for w in "$CACHE"/*.whl; do
  case "$(basename "$w")" in
    sglang-*) ;;
    *) cp "$w" "$DEST/" ;;
  esac
done
"$PY" - "$CACHE" "$DEST" <<'EOF'
import fnmatch, pathlib, sys, zipfile

cache, dest = map(pathlib.Path, sys.argv[1:3])
DROP = ("sglang/srt/rust_extensions/*.so", "sglang/multimodal_gen/*", "sglang/test/*")
(src,) = cache.glob("sglang-0.5.23-cp312-*.whl")
dropped = 0
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest / src.name, "w", zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist():
        name = info.filename
        if any(fnmatch.fnmatch(name, pat) for pat in DROP):
            dropped += info.file_size
            continue
        data = zin.read(info)
        if name.endswith(".dist-info/RECORD"):
            keep = [line for line in data.decode().splitlines()
                    if not any(fnmatch.fnmatch(line.split(",")[0], pat) for pat in DROP)]
            data = ("\n".join(keep) + "\n").encode()
        zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
print(f"repacked {src.name}: {src.stat().st_size / 1e6:.1f} MB -> {(dest / src.name).stat().st_size / 1e6:.1f} MB "
      f"(dropped {dropped / 1e6:.1f} MB uncompressed: {', '.join(DROP)})")
EOF
git rev-parse HEAD > "$DEST/tree_commit.txt"
git archive --format=tar.gz -o "$DEST/tree.tar.gz" HEAD hpc_advise tests pyproject.toml README.md
echo "tree.tar.gz = committed tree $(cat "$DEST/tree_commit.txt")"
du -sh "$DEST" .whl_profile
echo "working tree that travels: $(git ls-files -co --exclude-standard -z | du -ch --files0-from=- | tail -1)"
