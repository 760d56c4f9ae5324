#!/usr/bin/env bash
# The Gluon down GEMM of the fused MoE's prefill path (config DN_GLUON, kernel_gluon_down.py) on the H200 (the
# `device` tool; carry .whl_profile). One call:
#   stage 1: the GPU tests of tests/kernels/test_fused_moe_gluon.py (-n 1, <= TEST_S, default 60 s);
#   stage 2: the down launch alone, Gluon (DN_GLUON 1 and 2 at 3-6 stages, 8 warps, 4 warps at 4-5 stages, those
#            op.check_forms takes and <= 200 KB of ring) vs ``_down_kernel`` under the shipped Hy3 per-tensor
#            prefill pick at T = $TS (default 4096,16384): one prepared op._Launch (routing, quantization,
#            gate/up run once), the same inputs for every kernel, y compared bitwise, CUDA-graph replay
#            (runtime.benchmarking.time_cuda), $ROUNDS (default 3) interleaved rounds (the Triton pick first
#            and last in each), medians; then the whole fused_moe call, pick vs the fastest Gluon launch,
#            ROUNDS + 2 interleaved rounds (the first call's drift was up to 14% between two timings);
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

timeout "${LAUNCH_S:-70}" python3 - "${TS:-4096,16384}" "${ROUNDS:-3}" > "$RES/launch.log" 2>&1 <<'PY'
import json, os, statistics, sys
import torch
from hpc_advise.kernels.fused_moe import op
from hpc_advise.kernels.fused_moe.op import fused_moe
from hpc_advise.runtime.benches import fused_moe as fb
from hpc_advise.runtime.benchmarking import time_cuda

ts, rounds = [int(t) for t in sys.argv[1].split(",")], int(sys.argv[2])
e, h, i, k, eg, off = fb.SHAPES["hy3"]
mode = "tensor-static"
wts = fb.make_weights(e, h, i, mode)
kw = fb._kwargs(wts, mode, off)
rows = []


def name(c):
    return f"gluon{c['DN_GLUON']} st{c['DN_STAGES']} w{c['DN_WARPS']}" if c.get("DN_GLUON") else f"triton st{c['DN_STAGES']} w{c['DN_WARPS']}"


for t in ts:
    s = fb.make_routings(t, k, eg, h, 1)[0]
    args = (s["x"], wts["w13"], wts["w2"], s["w"], s["ids"], kw["w13_scale"], kw["w2_scale"],
            kw.get("a13_scale"), kw.get("a2_scale"), kw.get("block_shape"), off, None)
    launch = op._Launch(*args)
    pick = dict(launch.cfg)
    launch.prep(s["x"])
    launch.gate_up(wts["w13"], launch.inter, launch.inter_s, 0, 1)
    flops, _ = op.flops_and_bytes(s["ids"], e, h, i, off, wts["block"])
    bm = pick["BLOCK_M"]
    cands = [pick]
    for g in (1, 2):
        for st in (3, 4, 5, 6):
            for w in (8, 4):
                c = dict(pick, DN_GLUON=g, DN_STAGES=st, DN_WARPS=w)
                if st * (bm + pick["DN_N"]) * 128 > 200 * 1024 or (w == 4 and st not in (4, 5)):
                    continue
                try:
                    op.check_forms(op.check_config(dict(c), False, False), False, False, False, h, i)
                except op.FusedMoEError:
                    continue
                cands.append(c)
    launch.cfg = pick
    launch.down(wts["w2"], 1.0)
    y_ref = launch.y.clone()
    ok = {}
    for c in cands[1:]:  # compile + bitwise check
        launch.cfg = c
        launch.y.fill_(float("nan"))
        try:
            launch.down(wts["w2"], 1.0)
            torch.cuda.synchronize()
            ok[name(c)] = bool(torch.equal(launch.y, y_ref))
        except Exception as exc:
            print(f"T={t} {name(c)}: {type(exc).__name__}: {str(exc)[:300]}")
    cands = [cands[0]] + [c for c in cands[1:] if name(c) in ok]
    times = {name(c): [] for c in cands}
    for r in range(rounds):  # interleaved: every candidate once per round, the Triton pick first and last
        for c in cands + [pick]:
            launch.cfg = c
            times[name(c)].append(time_cuda(lambda: launch.down(wts["w2"], 1.0), inner=4, reps=8).p50)
    for c in cands:
        us = statistics.median(times[name(c)])
        row = dict(shape="hy3", T=t, stage="down launch", form=name(c), us=us, tflops=flops / 3 / us / 1e6,
                   rounds=[round(x, 1) for x in times[name(c)]], bitwise=ok.get(name(c)), config=c)
        print(json.dumps(row)); rows.append(row)
    tri = statistics.median(times[name(pick)])
    best = min(cands[1:], key=lambda c: statistics.median(times[name(c)]))
    del launch
    torch.cuda.empty_cache()
    # the whole call, pick vs the fastest Gluon launch, interleaved rounds (graph replay)
    out = torch.empty_like(s["x"])
    calls = {}
    for c in (pick, best):
        calls[name(c)] = (c, [])
        fused_moe(s["x"], wts["w13"], wts["w2"], s["w"], s["ids"], out=out, config=c, **kw)
    for r in range(rounds + 2):
        for nm, (c, xs) in calls.items():
            fn = lambda c=c: fused_moe(s["x"], wts["w13"], wts["w2"], s["w"], s["ids"], out=out, config=c, **kw)
            xs.append(time_cuda(fn, inner=2, reps=6).p50)
    for nm, (c, xs) in calls.items():
        us = statistics.median(xs)
        row = dict(shape="hy3", T=t, stage="whole call", form=nm, us=us, tflops=flops / us / 1e6,
                   rounds=[round(x, 1) for x in xs], config=c)
        print(json.dumps(row)); rows.append(row)
    torch.cuda.empty_cache()
with open(os.path.join("/tmp/res", "launch.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
print(f"HY3 PER-TENSOR, GRAPH REPLAY, MEDIAN OF {rounds} INTERLEAVED ROUNDS (whole call: {rounds + 2})")
for r in rows:
    extra = f"  bitwise {r['bitwise']}" if r.get("bitwise") is not None else ""
    print(f"T={r['T']:>5} {r['stage']:<11} {r['form']:<17} {r['us']:8.1f} us {r['tflops']:5.0f} TF/s "
          f"[{min(r['rounds']):.0f}-{max(r['rounds']):.0f}]{extra}")
PY
echo "launch rc $?" >> "$RES/launch.log"
grep -v "^{" "$RES/launch.log" | tail -30 | cut -c1-200
pack "stage 2 (launch alone)"

if [ "${TUNE_S:-80}" -gt 0 ]; then
  cp hpc_advise/kernels/fused_moe/configs.json "$RES/fused_moe_configs.json"
  timeout "${TUNE_S:-80}" python3 benchmarks/tune_fused_moe.py --gluon-down --shapes hy3 --ts "${TS:-4096,16384}" \
    --budget "${TUNE_BUDGET:-35}" --out "$RES/fused_moe_configs.json" > "$RES/tune.log" 2>&1
  echo "tune rc $?" >> "$RES/tune.log"
  grep -E "cand|hy3 tensor|precompiled|Error|dropped|rc " "$RES/tune.log" | cut -c1-260 | tail -16
  pack "stage 3 (tune, whole call)"
fi
stamp "done"
