#!/usr/bin/env bash
# Fused MoE T = 1 work on the H200 machine (the `run` device tool): the one-launch persistent decode path
# (kernel_persistent.py). Stages chosen by STAGES (default "smoke tests tune bench"), each under its own
# time limit and skipped when less than that is left of CALL_S (the call's timeout_s minus a margin);
# results re-packed into $OUT/results_t1.tgz after every stage, so a timeout keeps what finished:
#   smoke  one persistent call per scale mode at a real shape, timed (a hang here skips tune and bench,
#          which would hang the same way)
#   tests  GPU tests of tests/kernels/test_fused_moe_persistent.py (-n 2)
#   tune   tune_fused_moe.py --persistent over T1_SHAPES x T1_TS: the config op.get_config picks now
#          against the persistent candidates in one process; merged into a copy of configs.json
#          ($RES/fused_moe_configs.json), which the bench then uses (copied over the package's)
#   bench  bench_fused_moe.py at T1_TS with the torch / fbgemm peers (carry .whl_moe for fbgemm)
# Carry .whl_profile (sqlite-utils & co.) always, .whl_moe for the bench's fbgemm peer.
# The call of 2026-11-29 15:59 UTC (CALL_S=232, timeout_s 240) took 185 s: smoke 22 s, tests 36 s, tune 101 s
# (its 60 s timing budget ended after 3 of 10 points: every persistent candidate compiled inside it, since the
# precompile at H = 256 does not cover the kernel's H-dependent G_PAD), bench 26 s.
set -o pipefail
T0=$SECONDS
RES=/tmp/res_t1
CALL_S=${CALL_S:-232}
STAGES=" ${STAGES:-smoke tests tune bench} "
T1_SHAPES=${T1_SHAPES:-qwen3-30b-a3b,deepseek-v3-ep8,qwen3-235b,hy3-tp8,hy3}
T1_TS=${T1_TS:-1,4}
mkdir -p "$RES"
stamp() { echo "[$((SECONDS - T0))s] $*"; }
pack() { tar czf "$OUT/results_t1.tgz.tmp" -C "$RES" . && mv "$OUT/results_t1.tgz.tmp" "$OUT/results_t1.tgz"; stamp "$1"; }
want() { [[ "$STAGES" == *" $1 "* ]]; }
left() { echo $((CALL_S - (SECONDS - T0))); }
room() { [ "$(left)" -ge "$1" ] || { stamp "skip $2: $(left)s left < $1"; return 1; }; }

WHEELS=".whl_profile/*.whl"
[ -d .whl_moe ] && WHEELS="$WHEELS .whl_moe/*.whl"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $WHEELS || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HPC_ADVISE_HOME=$RES/home HPC_ADVISE_RESULTS=$RES
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"

healthy=1
if want smoke && room "${SMOKE_S:-45}" smoke; then
  timeout "${SMOKE_S:-45}" python3 - > "$RES/smoke.log" 2>&1 <<'EOF'
import time, torch
from hpc_advise.kernels.fused_moe import op, op_persistent
from hpc_advise.runtime.benches import fused_moe as fb
for shape in ("qwen3-30b-a3b", "hy3-tp8"):
    e, h, i, k, eg, off = fb.SHAPES[shape]
    mode = fb.MODES[shape][0]
    wts = fb.make_weights(e, h, i, mode)
    kw = fb._kwargs(wts, mode, off)
    s = fb.make_routings(1, k, eg, h, 1)[0]
    cfg = dict(op_persistent.default_persistent_config(mode.endswith("dynamic")), PDL=1, PREFETCH=1)
    call = lambda: op.fused_moe(s["x"], wts["w13"], wts["w2"], s["w"], s["ids"], config=cfg, **kw)
    out = call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        call()
    torch.cuda.synchronize()
    us = 1e6 * (time.perf_counter() - t0) / 50
    ref = op.fused_moe(s["x"], wts["w13"], wts["w2"], s["w"], s["ids"], **kw)
    diff = float((out.float() - ref.float()).norm() / ref.float().norm())
    print(f"smoke {shape} {mode} T=1: {us:.1f} us/call eager (launch-bound), rel diff vs the tuned path "
          f"{diff:.2e}", flush=True)
EOF
  rc=$?
  cat "$RES/smoke.log" | tail -5
  [ $rc -eq 0 ] || { healthy=0; stamp "smoke failed (rc $rc): tune and bench skipped"; }
  pack "smoke done"
fi
if want tests && room "${TESTS_S:-50}" tests; then
  timeout "${TESTS_S:-50}" python3 -m pytest -v -m gpu tests/kernels/test_fused_moe_persistent.py -n 2 \
    -p no:cacheprovider -o addopts="" -rfEs -s > "$RES/gpu_tests_persistent.log" 2>&1
  grep -E "^(FAILED|ERROR)|persistent .* rel err" "$RES/gpu_tests_persistent.log" | head -30
  stamp "tests: $(grep -c PASSED "$RES/gpu_tests_persistent.log") passed; $(tail -1 "$RES/gpu_tests_persistent.log")"
  pack "tests done"
fi
if want tune && [ $healthy = 1 ] && room "${TUNE_S:-110}" tune; then
  cp hpc_advise/kernels/fused_moe/configs.json "$RES/fused_moe_configs.json"
  timeout "${TUNE_S:-110}" python3 benchmarks/tune_fused_moe.py --persistent --shapes "$T1_SHAPES" \
    --ts "$T1_TS" --budget "${TUNE_BUDGET:-60}" --out "$RES/fused_moe_configs.json" > "$RES/tune_t1.log" 2>&1
  grep -E "^  [a-z0-9-]+ [a-z-]+ T=[0-9]+: |re-timed|dropped|Error|budget" "$RES/tune_t1.log" | tail -24
  python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$RES/fused_moe_configs.json" \
    && cp "$RES/fused_moe_configs.json" hpc_advise/kernels/fused_moe/configs.json
  pack "tune done"
fi
if want bench && [ $healthy = 1 ] && room "${BENCH_S:-60}" bench; then
  timeout "$(( $(left) - 3 ))" python3 benchmarks/bench_fused_moe.py --shapes "$T1_SHAPES" --ts "$T1_TS" \
    > "$RES/bench_t1.log" 2>&1
  grep -E "^\| (shape|[A-Za-z0-9-]+ \|)" "$RES/fused_moe.md" 2>/dev/null | cut -c1-160 | head -14
  pack "bench done"
fi
stamp end
