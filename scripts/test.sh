#!/usr/bin/env bash
# Install the dev extras (CPU torch 2.13.0, triton 3.6.0 for interpreter-mode kernel tests) and real
# SGLang 0.5.23 (--no-deps, plus the pure-Python packages its imports need) into ./.venv, then run
# the whole test suite. README.md's test command and .ci/run both call this script.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip
"$VPY" -m pip install -q -e '.[dev]'
"$VPY" -m pip install -q --no-deps 'sglang==0.5.23'
if grep -qv '^\s*#' requirements/sglang-cpu.txt 2>/dev/null; then
  "$VPY" -m pip install -q -r requirements/sglang-cpu.txt
fi
export TRITON_INTERPRET=1
# The kernel and advisor goldens are bitwise. OpenBLAS picks its GEMM kernels by CPU (SkylakeX's on Intel
# AVX-512 parts, Haswell's on AMD Zen and other AVX2 parts) and their summation order moves the last bits of numpy's
# matmul, which the Triton interpreter's tl.dot and the advisor's fits use. The goldens are recorded with the
# Haswell (AVX2) kernels, which every x86-64 CI machine can run.
if [ "$(uname -m)" = x86_64 ]; then
  export OPENBLAS_CORETYPE=Haswell
fi
exec "$VPY" -m pytest -n "${PYTEST_WORKERS:-2}" "$@"
