#!/usr/bin/env bash
# Prefill forms of the FP8 fused MoE on the H200 (the `device` tool), one call per STAGE:
#   STAGE=sweep  stage 1: GPU tests of tests/kernels/test_fused_moe_prefill.py (W_TMA / wide-K forms at
#                real shapes); stage 2: `tune_fused_moe.py
#                --prefill-variants` at T = 1024/4096/16384 on every shape (old pick vs new forms in one
#                process; entries written to $OUT/prefill_configs.json, not into configs.json).
#   STAGE=bench  stage 1: the GPU tests of $TESTS (shipped configs); stage 2 (RESWEEP=1): the sweep
#                again around the call-1 winners, written into the copy's configs.json (a new form only
#                where >= 2% faster than the current pick); stage 3: bench_fused_moe.py at T >= 1024 with
#                the peers on those configs (carry .whl_moe).
#   STAGE=lag    (carry .whl_profile and .whl_moe) stage 1: the GPU tests of $TESTS selected by -k "$TEST_SEL"
#                (default: scale_lag, <= TEST_S); stage 2: `tune_fused_moe.py --scale-lag` at $TS (default
#                1024,4096,16384) on $SHAPES (current pick vs its lagged forms in one process, current pick timed
#                first and again last, merged into a copy of configs.json only where >= 2% faster; <= TUNE_S,
#                --budget TUNE_BUDGET); stage 3: `--breakdown` (each launch alone) on BD_SHAPES x BD_TS with the
#                shipped picks and with the same picks + SCALE_LAG (<= 2 x BD_S); stage 4, only where a pick
#                changed: bench_fused_moe.py with the peers on the changed shapes and T (<= BENCH_S); last a short
#                table of the tune (µs, % vs the current pick).
#   STAGE=tiles  multi-tile / persistent prefill GEMM programs: PART=tune (GPU tests, `tune_fused_moe.py
#                --prefill-tiles`: whole call and each GEMM launch alone, two tables) or PART=bench (the peers'
#                bench on $SHAPES x $TS with the working tree's configs.json); see the stage's comment below.
#   STAGE=pingpong  the ping-pong Gluon down GEMM (DN_GLUON 3): STAGE=tiles' two parts with the GPU tests of
#                tests/kernels/test_fused_moe_gluon.py, `tune_fused_moe.py --pingpong` (the launch-alone rounds time
#                the whole call too) and SHAPES=hy3 by default.
#   STAGE=retune  (carry .whl_profile and .whl_moe) STAGE=pingpong's PART=tune with `tune_fused_moe.py
#                --prefill-retune` (one-key moves of the pick's gate/up and down tiles, launches alone and the whole
#                call in 5 interleaved rounds, the pick first and last in each; retune_decision ships), TS=16384,4096
#                by default (--budget TUNE_BUDGET skips T = 4096 when T = 16384 took longer); then `--breakdown` at
#                Hy3 BD_TS (default 16384) with the tuner's configs.json (<= BD_S) and, only where a pick changed,
#                bench_fused_moe.py beside the peers on the changed points (<= BENCH_S); the short tables last.
#                H200 2026-11-30 05:23 UTC: 111 s in all (tests 3/3 to 35 s, retune of 29 forms at T = 16384 and 4096
#                to 103 s, breakdown to 111 s; no pick changed, so no bench).
#   STAGE=half   (carry .whl_profile; .whl_moe too for the bench) GU_HALF / DN_HALF, 64-row gate/up / down tiles for
#                the 128-row blocks whose rows 64.. are padding: stage 1 the GPU tests of $TESTS -k half (-n 1, <= TEST_S);
#                stage 2 `tune_fused_moe.py --half-tiles` (pick vs pick + GU_HALF (+ DN_HALF), at BLOCK_M 64 picks the
#                T = 16384 pick without and with them; launches alone + whole call in 5 interleaved rounds, the pick
#                first and last; shipped by
#                retune_decision into a copy of configs.json) at T = 16384 on SHAPES16 and T = 4096 on SHAPES4 (<= TUNE_S
#                each); stage 3 `--breakdown` at Hy3 T = 16384 with the pick and with the pick + GU_HALF (<= BD_S each);
#                stage 4, only where a pick changed and .whl_moe is there: bench_fused_moe.py beside the peers on the
#                changed points (<= BENCH_S); the short tables last. H200 2026-11-30 07:10 / 07:19 UTC: 146 / 152 s
#                (tests to 29-31 s, tune of 6 / 7 points to 84-85 s, breakdowns to 95 s, bench cut by BENCH_S=55 in call 2).
#   STAGE=sustained  the tuner's prefill decisions in sustained windows (--half-tiles on POINTS_HALF, --prefill-retune
#                on POINTS_RETUNE, PART=tune) and the peers' bench of the changed points (PART=bench); see the stage.
# Stage times on the H200 (2026-11-29): sweep call 61 s in all (tests 25 s, 150 candidates compiled +
# timed 28 s); bench call 123 s (tests cut at 45 s after 33 passed, re-sweep of 172 candidates 29 s,
# bench with peers 46 s). Carry .whl_profile (and .whl_moe for the bench). Results: $OUT/prefill.tgz, re-packed after every stage
# (a stage cut by its `timeout` keeps what the earlier ones wrote), and $OUT/log.txt via the caller's tee.
set -o pipefail
T0=$SECONDS
RES=/tmp/res
mkdir -p "$RES" /tmp/site
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tcache
stamp() { echo "[$((SECONDS - T0))s] $*"; }
pack() { tar czf "$OUT/prefill.tgz" -C "$RES" . 2>/dev/null; stamp "packed: $1"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_profile/*.whl \
  && export PYTHONPATH=/tmp/site:$PYTHONPATH
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
SHAPES_SET=${SHAPES:-}  # empty: the stage's default shapes
SHAPES=${SHAPES:-hy3,qwen3-235b,deepseek-v3-ep8,qwen3-30b-a3b,hy3-tp8}
TESTS=${TESTS:-tests/kernels/test_fused_moe_prefill.py}

gpu_tests() {  # $1 = seconds
  timeout "$1" python3 -m pytest -v -m gpu $TESTS -k "${TEST_SEL:-}" -n "${TEST_N:-2}" -p no:cacheprovider -o addopts="" -rA \
    > "$RES/gpu_tests.log" 2>&1
  echo "tests rc $?" >> "$RES/gpu_tests.log"
}

tune_table() {  # the tune's candidates: µs (% vs the pick's better timing), from $RES/tune.log
  python3 - "$RES/tune.log" <<'PY'
import json, re, sys
rows, first = {}, {}
for line in open(sys.argv[1]):
    m = re.match(r"  cand (\S+) \S+ T=(\d+) p50 ([0-9.]+) us (\{.*\})", line)
    if m:
        key, us, cfg = (m.group(1), int(m.group(2))), float(m.group(3)), json.loads(m.group(4))
        first.setdefault(key, cfg)
        diff = {k: v for k, v in cfg.items() if first[key].get(k) != v}
        rows.setdefault(key, []).append((us, diff))
    m = re.match(r"  cand (\S+) \S+ T=(\d+) first re-timed last: ([0-9.]+) -> ([0-9.]+) us", line)
    if m:
        rows[m.group(1), int(m.group(2))].append((float(m.group(4)), "pick again"))
print("| shape | T | pick µs (first / last) | candidates: µs (% vs the pick's better timing) |")
print("|---|---|---|---|")
for (shape, t), r in rows.items():
    pick = min(us for us, d in r if d in ({}, "pick again"))
    again = [us for us, d in r if d == "pick again"]
    cands = "; ".join(f"{json.dumps(d, sort_keys=True)} {us:.1f} ({100 * (us / pick - 1):+.1f}%)" for us, d in r[1:] if d != "pick again")
    print(f"| {shape} | {t} | {r[0][0]:.1f} / {again[0] if again else float('nan'):.1f} | {cands} |")
PY
}

launch_table() {  # the GEMM launches alone (median of the interleaved rounds), % vs the pick, from the jsonl $1
  python3 - "$1" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows.setdefault((r["shape"], r["T"]), []).append(r)
call = "call_us" in next(iter(rows.values()))[0]  # --pingpong: the whole call in the same rounds
print("| shape | T | pick gate/up µs (TF/s) | pick down µs (TF/s) |" + (" pick call µs |" if call else "")
      + " candidates: gate/up %, down %" + (", call %" if call else "") + " vs the pick |")
print("|---|---|---|---|" + ("---|" if call else "") + "---|")
for (shape, t), rs in rows.items():
    p = rs[0]
    cands = "; ".join(
        ("pick again " if r.get("again") else "")
        + f"{json.dumps({k: v for k, v in r['config'].items() if p['config'].get(k) != v}, sort_keys=True)} "
        f"{100 * (r['gate_up_us'] / p['gate_up_us'] - 1):+.1f} / {100 * (r['down_us'] / p['down_us'] - 1):+.1f}"
        + (f" / {100 * (r['call_us'] / p['call_us'] - 1):+.1f}" if call else "")
        for r in rs[1:]
    )
    print(f"| {shape} | {t} | {p['gate_up_us']:.1f} ({p['gate_up_tflops']:.0f}) | {p['down_us']:.1f} "
          f"({p['down_tflops']:.0f}) |" + (f" {p['call_us']:.1f} |" if call else "") + f" {cands} |")
PY
}

changed_points() {  # the (shape, T) points whose pick differs between configs.json files $1 and $2: "s1,s2 T1,T2"
  python3 - "$1" "$2" <<'PY'
import json, sys
from hpc_advise.runtime.benches.fused_moe import SHAPES
old, new = (
    {(x["E"], x["H"], x["I"], x["mode"], x["T"]): x["config"] for x in json.load(open(f))["entries"]}
    for f in sys.argv[1:3]
)
pts = [(n, key[4]) for key, cfg in new.items() if old.get(key) != cfg for n, v in SHAPES.items() if v[:3] == key[:3]]
if pts:
    print(",".join(sorted({n for n, _ in pts})), ",".join(str(t) for t in sorted({t for _, t in pts})))
PY
}

bench_changed() {  # bench_fused_moe.py beside the peers on "$1" = changed_points' output (<= BENCH_S)
  local ch_shapes ch_ts
  read -r ch_shapes ch_ts <<< "$1"
  HPC_ADVISE_RESULTS=$RES timeout "${BENCH_S:-90}" python3 benchmarks/bench_fused_moe.py --shapes "$ch_shapes" \
    --ts "$ch_ts" > "$RES/bench.log" 2>&1
  echo "bench rc $?" >> "$RES/bench.log"
  grep -E "^\| [a-z0-9-]+ +\|" "$RES/fused_moe.md" 2>/dev/null | cut -c1-200
}

if [ "${STAGE:-sweep}" = tiles ] || [ "${STAGE:-sweep}" = pingpong ] || [ "${STAGE:-sweep}" = retune ]; then
  # multi-tile / persistent prefill GEMM programs (GU_TILES, DN_TILES, GU_PERSIST, DN_PERSIST). PART=tune (call 1;
  # carry .whl_profile): stage 1 the GPU tests of $TESTS selected by $TEST_SEL (-n 1, <= TEST_S); stage 2
  # `tune_fused_moe.py --prefill-tiles` on $SHAPES x $TS (whole call: current pick first and again last, the
  # candidates between, merged into a copy of configs.json only where >= 2% faster; then each GEMM launch alone in
  # interleaved rounds, rows in fused_moe_prefill_tiles_launches.jsonl; <= TUNE_S, --budget TUNE_BUDGET for each of
  # the two timing passes); last the two short tables. PART=bench (call 2; carry .whl_profile and .whl_moe):
  # bench_fused_moe.py with the peers on $SHAPES x $TS with the configs.json of the working tree (<= BENCH_S).
  # STAGE=pingpong: the same two parts for the ping-pong Gluon down GEMM (tests, tuner flag, Hy3 by default)
  NAME=tiles FLAG=--prefill-tiles SEL="prefill_tiles or persistent"
  if [ "$STAGE" = pingpong ] || [ "$STAGE" = retune ]; then
    NAME=$STAGE FLAG=--pingpong SEL=gpu TESTS=tests/kernels/test_fused_moe_gluon.py
    [ -n "$SHAPES_SET" ] || SHAPES=hy3
  fi
  [ "$STAGE" = retune ] && FLAG=--prefill-retune TS=${TS:-16384,4096}
  export HPC_ADVISE_HOME=$RES/home
  if [ "${PART:-tune}" = bench ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_moe/*.whl
    HPC_ADVISE_RESULTS=$RES timeout "${BENCH_S:-150}" python3 benchmarks/bench_fused_moe.py --shapes "$SHAPES" \
      --ts "${TS:-4096,16384}" > "$RES/bench.log" 2>&1
    echo "bench rc $?" >> "$RES/bench.log"
    grep -v "^  " "$RES/bench.log" | cut -c1-220 | tail -30
    pack "bench"
  else
    TEST_N=1 TEST_SEL=${TEST_SEL:-$SEL} gpu_tests "${TEST_S:-60}"
    grep -E "PASSED|FAILED|ERROR|rc " "$RES/gpu_tests.log" | cut -c1-220 | tail -12
    pack "stage 1 (GPU tests)"
    cp hpc_advise/kernels/fused_moe/configs.json "$RES/fused_moe_configs.json"
    OUT=$RES timeout "${TUNE_S:-160}" python3 benchmarks/tune_fused_moe.py $FLAG --shapes "$SHAPES" \
      --ts "${TS:-4096,16384}" --budget "${TUNE_BUDGET:-45}" --out "$RES/fused_moe_configs.json" \
      > "$RES/tune.log" 2>&1
    echo "tune rc $?" >> "$RES/tune.log"
    grep -E "precompiled|budget|Error|dropped|failed|rc |: [0-9.]+ us \{" "$RES/tune.log" | cut -c1-200 | tail -16
    pack "stage 2 (tune + launches)"
    if [ "$STAGE" = retune ]; then  # stage 3: each launch of the (new) pick alone; stage 4: the peers' bench
      CFG=hpc_advise/kernels/fused_moe/configs.json
      changed=$(changed_points "$CFG" "$RES/fused_moe_configs.json")
      echo "changed picks: ${changed:-none}"
      [ -n "$changed" ] && cp "$RES/fused_moe_configs.json" "$CFG"
      OUT=$RES timeout "${BD_S:-25}" python3 benchmarks/tune_fused_moe.py --breakdown --shapes "$SHAPES" \
        --ts "${BD_TS:-16384}" > "$RES/breakdown.log" 2>&1
      echo "breakdown rc $?" >> "$RES/breakdown.log"
      grep -o "breakdown.*reduce [0-9.]* us" "$RES/breakdown.log" | cut -c1-220
      pack "stage 3 (breakdown)"
      if [ -n "$changed" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_moe/*.whl
        bench_changed "$changed"
        pack "stage 4 (bench)"
      fi
      grep "  retune " "$RES/tune.log" | cut -c1-300
    fi
    launch_table "$RES/fused_moe_prefill_${NAME}_launches.jsonl"
    [ "$STAGE" = retune ] || tune_table
    pack "all stages"
  fi
elif [ "${STAGE:-sweep}" = half ]; then
  export HPC_ADVISE_HOME=$RES/home
  TEST_N=1 TEST_SEL=${TEST_SEL:-half} gpu_tests "${TEST_S:-60}"
  grep -E "PASSED|FAILED|ERROR|rel err|rc " "$RES/gpu_tests.log" | cut -c1-220 | tail -12
  pack "stage 1 (GPU tests)"
  CFG=hpc_advise/kernels/fused_moe/configs.json
  cp "$CFG" "$RES/fused_moe_configs.json"
  for point in "${SHAPES16:-hy3,qwen3-235b,deepseek-v3-ep8,qwen3-30b-a3b} 16384" "${SHAPES4:-hy3,qwen3-235b} 4096"; do
    read -r pt_shapes pt_t <<< "$point"
    OUT=$RES timeout "${TUNE_S:-75}" python3 benchmarks/tune_fused_moe.py --half-tiles --shapes "$pt_shapes" --ts "$pt_t" \
      --budget "${TUNE_BUDGET:-50}" --out "$RES/fused_moe_configs.json" >> "$RES/tune.log" 2>&1
    echo "tune T=$pt_t rc $?" >> "$RES/tune.log"
    grep -E "precompiled|Error|dropped|rc |  half " "$RES/tune.log" | cut -c1-300 | tail -8
    pack "stage 2 (tune T=$pt_t)"
  done
  changed=$(changed_points "$CFG" "$RES/fused_moe_configs.json")
  echo "changed picks: ${changed:-none}"
  cp "$CFG" "$RES/configs_shipped.json"
  for form in pick half; do  # stage 3: Hy3 T = 16384's launches alone, its pick and the pick + GU_HALF
    if [ $form = half ]; then
      python3 - "$RES/configs_shipped.json" "$CFG" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
for x in data["entries"]:
    if (x["E"], x["H"], x["I"], x["mode"], x["T"]) == (192, 4096, 1536, "tensor-static", 16384):
        x["config"]["GU_HALF"] = 1
json.dump(data, open(sys.argv[2], "w"), indent=1)
PY
    fi
    OUT=$RES timeout "${BD_S:-25}" python3 benchmarks/tune_fused_moe.py --breakdown --shapes hy3 --ts 16384 \
      > "$RES/breakdown_$form.log" 2>&1
    grep -o "breakdown.*padded [0-9]*" "$RES/breakdown_$form.log" | sed "s/^/$form /" | cut -c1-260
  done
  cp "$RES/configs_shipped.json" "$CFG"
  pack "stage 3 (breakdown)"
  if [ -n "$changed" ] && ls .whl_moe/*.whl > /dev/null 2>&1; then
    cp "$RES/fused_moe_configs.json" "$CFG"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_moe/*.whl
    bench_changed "$changed"
    pack "stage 4 (bench)"
  fi
  grep "  half " "$RES/tune.log" | cut -c1-300
  launch_table "$RES/fused_moe_prefill_half_launches.jsonl"
  pack "all stages"
elif [ "${STAGE:-sweep}" = sustained ]; then
  # The tuner's prefill decisions in sustained windows (every whole call timed after fb.PREFILL_SETTLE_S of its own
  # load, fb.SUSTAINED_ROUNDS interleaved rounds): PART=tune runs `--half-tiles` on the points POINTS_HALF and
  # `--prefill-retune` on POINTS_RETUNE ("shapes T" pairs separated by ';'), each merged into the working copy's
  # configs.json as it finishes (so a later point's pick reads an earlier point's result), then the short tables;
  # PART=bench: the GPU tests of $TESTS -k "$TEST_SEL" and bench_fused_moe.py beside the peers on BENCH_POINTS
  # ("shapes T,T") with the working tree's configs.json; PART=tune THEN_BENCH=1 does the same right after the tune
  # on the points whose pick changed. Carry .whl_profile (and .whl_moe for the bench).
  export HPC_ADVISE_HOME=$RES/home
  CFG=hpc_advise/kernels/fused_moe/configs.json
  cp "$CFG" "$RES/configs_shipped.json"
  if [ "${PART:-tune}" = tune ]; then
    run_points() {  # $1 = tuner flag, $2 = "shapes T;shapes T"
      local pt pt_shapes pt_t
      IFS=';' read -ra pts <<< "$2"
      for pt in "${pts[@]}"; do
        read -r pt_shapes pt_t <<< "$pt"
        [ -n "$pt_t" ] || continue
        OUT=$RES timeout "${TUNE_S:-200}" python3 benchmarks/tune_fused_moe.py "$1" --shapes "$pt_shapes" --ts "$pt_t" \
          --out "$CFG" >> "$RES/tune.log" 2>&1
        echo "tune $1 $pt_shapes T=$pt_t rc $?" >> "$RES/tune.log"
        grep -E "precompiled|Error|rc |  (half|retune) " "$RES/tune.log" | cut -c1-300 | tail -4
        cp "$CFG" "$RES/fused_moe_configs.json"
        pack "$1 $pt"
      done
    }
    run_points --half-tiles "${POINTS_HALF:-qwen3-235b 16384;hy3,deepseek-v3-ep8 4096}"
    run_points --prefill-retune "${POINTS_RETUNE:-qwen3-235b 16384;hy3 16384}"
    changed=$(changed_points "$RES/configs_shipped.json" "$CFG")
    echo "changed picks: $changed"
    for f in half retune; do [ -f "$RES/fused_moe_prefill_${f}_launches.jsonl" ] && launch_table "$RES/fused_moe_prefill_${f}_launches.jsonl"; done
    BENCH_POINTS=${THEN_BENCH:+$changed}  # THEN_BENCH=1: PART=bench's steps on the changed points, same call
  fi
  if [ -n "${BENCH_POINTS:-}" ]; then
    TEST_N=1 gpu_tests "${TEST_S:-90}"
    grep -E "PASSED|FAILED|ERROR|rc " "$RES/gpu_tests.log" | cut -c1-220 | tail -12
    pack "GPU tests"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_moe/*.whl
    bench_changed "$BENCH_POINTS"
  fi
  pack "all stages"
elif [ "${STAGE:-sweep}" = lag ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_moe/*.whl
  export HPC_ADVISE_HOME=$RES/home
  TEST_SEL=${TEST_SEL:-scale_lag} gpu_tests "${TEST_S:-60}"
  grep -E "PASSED|FAILED|ERROR|rel err|rc " "$RES/gpu_tests.log" | cut -c1-220 | tail -24
  pack "stage 1 (GPU tests)"
  CFG=hpc_advise/kernels/fused_moe/configs.json
  cp "$CFG" "$RES/fused_moe_configs.json"
  timeout "${TUNE_S:-180}" python3 benchmarks/tune_fused_moe.py --scale-lag --shapes "$SHAPES" \
    --ts "${TS:-1024,4096,16384}" --budget "${TUNE_BUDGET:-110}" --out "$RES/fused_moe_configs.json" \
    > "$RES/tune.log" 2>&1
  echo "tune rc $?" >> "$RES/tune.log"
  grep -E "precompiled|budget|Error|dropped|rc " "$RES/tune.log" | cut -c1-220 | tail -12
  pack "stage 2 (tune)"
  # the (shape, T) points whose pick changed: "shape1,shape2 T1,T2" (empty: none)
  changed=$(changed_points "$CFG" "$RES/fused_moe_configs.json")
  echo "changed picks: ${changed:-none}"
  # stage 3: each launch alone (tune_fused_moe.py --breakdown) on BD_SHAPES x BD_TS, the shipped picks and then
  # the same picks with SCALE_LAG (where the tile's lagged build does not spill: not BLOCK_M 128 x GU_N 128), so
  # the lag's effect on the gate/up GEMM alone shows (the down launch is the control: unchanged)
  cp "$CFG" "$RES/configs_shipped.json"
  for form in pick lag; do
    if [ $form = lag ]; then
      python3 - "$RES/configs_shipped.json" "$CFG" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
for x in data["entries"]:
    c = x["config"]
    if x["T"] >= 1024 and c.get("PATH") is None and not (c["BLOCK_M"] * c["GU_N"] >= 128 * 128 and c["GU_WARPS"] <= 8):
        c["SCALE_LAG"] = 1
json.dump(data, open(sys.argv[2], "w"), indent=1)
PY
    fi
    timeout "${BD_S:-35}" python3 benchmarks/tune_fused_moe.py --breakdown --shapes "${BD_SHAPES:-hy3,qwen3-235b}" \
      --ts "${BD_TS:-1024,4096}" > "$RES/breakdown_$form.log" 2>&1
    grep -o "breakdown.*reduce [0-9.]* us" "$RES/breakdown_$form.log" | sed "s/^/$form /" | cut -c1-200
  done
  cp "$RES/configs_shipped.json" "$CFG"
  pack "stage 3 (breakdown)"
  if [ -n "$changed" ]; then
    cp "$RES/fused_moe_configs.json" "$CFG"
    bench_changed "$changed"
    pack "stage 4 (bench)"
  fi
  tune_table
  pack "all stages"
elif [ "${STAGE:-sweep}" = sweep ]; then
  # sequential: tests running beside the sweep would disturb its timings (the tuner precompiles its
  # candidates in parallel processes first; 15:45 call: 11 tests in 25 s, 42 configs compiled + timed in 28 s)
  gpu_tests "${TEST_S:-75}"
  grep -E "passed|failed|error|rc " "$RES/gpu_tests.log" | tail -20
  pack "stage 1 (GPU tests)"
  timeout "${TUNE_S:-110}" python3 benchmarks/tune_fused_moe.py --prefill-variants --shapes "$SHAPES" \
    --ts 1024,4096,16384 --budget "${TUNE_BUDGET:-80}" --out "$RES/prefill_configs.json" > "$RES/tune.log" 2>&1
  echo "tune rc $?" >> "$RES/tune.log"
  grep -v "^  cand" "$RES/tune.log" | cut -c1-260 | tail -25
  pack "stage 2 (sweep)"
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_moe/*.whl
  gpu_tests "${TEST_S:-50}"
  grep -cE " PASSED" "$RES/gpu_tests.log"; grep -E "FAILED|ERROR|passed|failed|rc " "$RES/gpu_tests.log" | tail -15
  pack "stage 1 (GPU tests)"
  if [ "${RESWEEP:-1}" = 1 ]; then  # stage 2: the sweep around the call-1 winners, into the copy's configs.json
    timeout "${TUNE_S:-55}" python3 benchmarks/tune_fused_moe.py --prefill-variants --shapes "$SHAPES" \
      --ts 1024,4096,16384 --budget "${TUNE_BUDGET:-35}" --out hpc_advise/kernels/fused_moe/configs.json \
      > "$RES/tune.log" 2>&1
    echo "tune rc $?" >> "$RES/tune.log"
    cp hpc_advise/kernels/fused_moe/configs.json "$RES/configs.json"
    grep -v "^  cand" "$RES/tune.log" | cut -c1-200 | tail -18
    pack "stage 2 (sweep)"
  fi
  HPC_ADVISE_RESULTS=$RES timeout "${BENCH_S:-115}" python3 benchmarks/bench_fused_moe.py --shapes "$SHAPES" \
    --ts 1024,4096,16384 > "$RES/bench.log" 2>&1
  echo "bench rc $?" >> "$RES/bench.log"
  grep -v "^  " "$RES/bench.log" | tail -30
  pack "stage 3 (bench)"
fi
