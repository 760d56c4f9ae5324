#!/usr/bin/env bash
# The Gluon down GEMM of the fused MoE's prefill path (config DN_GLUON, kernel_gluon_down.py) on the H200 (the
# `device` tool; carry .whl_profile). One call:
#   stage 1: the GPU tests of tests/kernels/test_fused_moe_gluon.py (-n 1, <= TEST_S, default 60 s);
#   stage 2: the down launch alone, Gluon vs ``_down_kernel`` under the shipped Hy3 per-tensor prefill pick
#            at T = $TS (default 4096,16384): one prepared op._Launch (routing, quantization, gate/up run
#            once), the same inputs for both kernels, CUDA-graph replay (runtime.benchmarking.time_cuda), the
#            Triton launch timed first and again last; y compared bitwise; Gluon variants $VARIANTS
#            ("stages:warps" pairs, default the pick's own and 3 / 5 stages, 4 warps where the tile allows);
#   stage 3: `tune_fused_moe.py --gluon-down` (the whole fused_moe call, the current pick vs its DN_GLUON
#            forms in one process, current pick re-timed last, merged into a copy of configs.json only where
#            >= 2% faster; <= TUNE_S);
# then a short table. Results: $OUT/gluon.tgz (re-packed after every stage) and $OUT/log.txt via the caller's tee.
set -o pipefail
T0=$SECONDS
RES=/tmp/res
mkdir -p "$RES" /tmp/site
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
stamp() { echo "[$((SECONDS - T0))s] $*"; }
pack() { tar czf "$OUT/gluon.tgz" -C "$RES" . 2>/dev/null; stamp "packed: $1"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_profile/*.whl \
  && export PYTHONPATH=/tmp/site:$PYTHONPATH
export HPC_ADVISE_HOME=$RES/home
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader

if [ "${TEST_S:-60}" -gt 0 ]; then
  timeout "${TEST_S:-60}" python3 -m pytest -v -s -m gpu tests/kernels/test_fused_moe_gluon.py -k "${TEST_SEL:-}" \
    -n 1 -p no:cacheprovider -o addopts="" -rA > "$RES/gpu_tests.log" 2>&1
  echo "tests rc $?" >> "$RES/gpu_tests.log"
  grep -E "PASSED|FAILED|ERROR|rel err|Error|rc " "$RES/gpu_tests.log" | cut -c1-220 | tail -16
  pack "stage 1 (GPU tests)"
fi

timeout "${LAUNCH_S:-70}" python3 - "${TS:-4096,16384}" "${VARIANTS:-}" > "$RES/launch.log" 2>&1 <<'PY'
import json, os, sys
import torch
from hpc_advise.kernels.fused_moe import op
from hpc_advise.runtime.benches import fused_moe as fb
from hpc_advise.runtime.benchmarking import time_cuda

ts = [int(t) for t in sys.argv[1].split(",")]
e, h, i, k, eg, off = fb.SHAPES["hy3"]
mode = "tensor-static"
wts = fb.make_weights(e, h, i, mode)
kw = fb._kwargs(wts, mode, off)
rows = []
for t in ts:
    s = fb.make_routings(t, k, eg, h, 1)[0]
    args = (s["x"], wts["w13"], wts["w2"], s["w"], s["ids"], kw["w13_scale"], kw["w2_scale"],
            kw.get("a13_scale"), kw.get("a2_scale"), kw.get("block_shape"), off, None)
    launch = op._Launch(*args)
    pick = dict(launch.cfg)
    launch.prep(s["x"])
    launch.gate_up(wts["w13"], launch.inter, launch.inter_s, 0, 1)
    flops, _ = op.flops_and_bytes(s["ids"], e, h, i, off, wts["block"])
    down_flops = flops / 3

    def timed(cfg):
        launch.cfg = cfg
        launch.y.fill_(float("nan"))
        launch.down(wts["w2"], 1.0)
        y = launch.y.clone()
        us = time_cuda(lambda: launch.down(wts["w2"], 1.0), inner=4, reps=12).p50
        return us, y

    st, wp = pick["DN_STAGES"], pick["DN_WARPS"]
    variants = [tuple(int(x) for x in v.split(":")) for v in sys.argv[2].split(",") if v] or [
        (st, wp), (st - 1, wp), (st + 1, wp), (st, 4)]
    tri_us, y_tri = timed(pick)
    for stages, warps in variants:
        cfg = dict(pick, DN_GLUON=1, DN_STAGES=stages, DN_WARPS=warps)
        try:
            op.check_forms(op.check_config(dict(cfg), False, False), False, False, False, h, i)
            us, y = timed(cfg)
        except Exception as exc:
            print(f"T={t} gluon stages {stages} warps {warps}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        same = bool(torch.equal(y, y_tri))
        diff = float((y.float() - y_tri.float()).abs().max())
        row = dict(shape="hy3", T=t, form="gluon", stages=stages, warps=warps, us=us,
                   tflops=down_flops / us / 1e6, bitwise=same, max_abs_diff=diff, pick=pick)
        print(json.dumps(row)); rows.append(row)
    again, _ = timed(pick)
    for us, when in ((tri_us, "first"), (again, "last")):
        row = dict(shape="hy3", T=t, form=f"triton ({when})", stages=st, warps=wp, us=us,
                   tflops=down_flops / us / 1e6, pick=pick)
        print(json.dumps(row)); rows.append(row)
    del launch
    torch.cuda.empty_cache()
with open(os.path.join("/tmp/res", "launch.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
print("DOWN LAUNCH ALONE (Hy3 per-tensor, graph replay)")
for r in rows:
    print(f"T={r['T']:>5} {r['form']:<15} stages {r['stages']} warps {r['warps']}: {r['us']:8.1f} us "
          f"{r['tflops']:6.0f} TF/s" + (f"  bitwise {r['bitwise']} max|d| {r['max_abs_diff']:.2e}" if 'bitwise' in r else ""))
PY
echo "launch rc $?" >> "$RES/launch.log"
tail -14 "$RES/launch.log" | cut -c1-220
pack "stage 2 (launch alone)"

if [ "${TUNE_S:-80}" -gt 0 ]; then
  cp hpc_advise/kernels/fused_moe/configs.json "$RES/fused_moe_configs.json"
  timeout "${TUNE_S:-80}" python3 benchmarks/tune_fused_moe.py --gluon-down --shapes hy3 --ts "${TS:-4096,16384}" \
    --out "$RES/fused_moe_configs.json" > "$RES/tune.log" 2>&1
  echo "tune rc $?" >> "$RES/tune.log"
  grep -E "cand|hy3 tensor|precompiled|Error|dropped|rc " "$RES/tune.log" | cut -c1-260 | tail -16
  pack "stage 3 (tune, whole call)"
fi
stamp "done"
