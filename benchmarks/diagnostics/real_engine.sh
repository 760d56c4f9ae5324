#!/usr/bin/env bash
# `hpc-advise bench` against SGLang 0.5.23's real HTTP server on one GPU (issue 28): a tiny random-weight
# Qwen3-MoE (benchmarks/diagnostics/real_engine.py), two servers on the one GPU, SGLang's Triton decode
# attention (baseline, :30000) and ours (candidate, :30001), both page 64 + FP8 KV, Triton prefill and
# Triton MoE; recommend -> bench A/B with output consistency -> validate, then a table.
# Run on the device machine through gpu.sh's SGLang environment (docs/gpu.md):
#   LIMIT_S=400 START_S=150 bash benchmarks/gpu.sh sglang run bash benchmarks/diagnostics/real_engine.sh
# carry: .whl_profile .whl_sglang .whl_bench_extra (a carried tree as well: TREE_DIR=..., + that folder).
# Results: $HPC_ADVISE_RESULTS (gpu.sh's archive). Knobs: WARMUP, SOLO_RUN, OVERHEAD (0 = skip), GRAPH_BS.
set -o pipefail
RES=${HPC_ADVISE_RESULTS:?run through gpu.sh (sglang run)}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
W=$(mktemp -d /tmp/real_engine.XXXX)
START_S=${START_S:-150}   # seconds a server gets to answer /v1/models
T0=$SECONDS
say() { echo "[$((SECONDS - T0))s] $*"; }
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null; done; }
trap cleanup EXIT

cd "$ROOT" || exit 1
MODEL=$W/tiny-qwen3-moe
EXTRA=${CARRY:-$ROOT}/.whl_bench_extra  # `real_engine.py carry` builds it: wheels + the model folder
if [ -d "$EXTRA/tiny-qwen3-moe" ]; then
  cp -r "$EXTRA/tiny-qwen3-moe" "$MODEL" && echo '{"carried": true}' > "$RES/model.json"
else
  python3 "$HERE/real_engine.py" model "$MODEL" > "$RES/model.json" || { cat "$RES/model.json"; exit 1; }
fi
cp "$MODEL/config.json" "$RES/model_config.json"
# the carried tree holds no examples/: the sent checkout ($CARRY) does
SRC=$ROOT/examples/traces/agentic_coding.jsonl
[ -f "$SRC" ] || SRC=${CARRY:-.}/examples/traces/agentic_coding.jsonl
python3 "$HERE/real_engine.py" trace "$W/tiny.jsonl" --src "$SRC" --requests "${REQUESTS:-160}" > "$RES/trace.json" || exit 1
cp "$W/tiny.jsonl" "$RES/tiny.jsonl"
say "model $(cat "$RES/model.json")"
say "trace $(cat "$RES/trace.json")"

# our plugin reaches SGLang through its entry point: hpc-advise's dist-info beside the tree (the tree wins)
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$W/hpc" . \
  > "$RES/hpc_dist.log" 2>&1 || { tail -5 "$RES/hpc_dist.log"; exit 1; }
SERVER_PP=$HERE/sglang_site:$PYTHONPATH:$W/hpc
# what SGLang's HTTP server imports that the device image lacks (jsonschema, xgrammar, python-multipart,
# soundfile and their dependencies): found by importing its entry points with only the image's packages
if ls "$EXTRA"/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$W/extra" "$EXTRA"/*.whl \
    > "$RES/extra_install.log" 2>&1 || { tail -5 "$RES/extra_install.log"; exit 1; }
  SERVER_PP=$SERVER_PP:$W/extra
fi
say "hpc-advise dist-info installed"

serve() {  # $1 decode backend, $2 port, $3 extra flags...; sets the server's pid in PIDS
  local dec=$1 port=$2
  shift 2
  local log="$RES/server_$dec.log"
  echo "python3 -m sglang.launch_server ${SERVER_ARGS[*]} --decode-attention-backend $dec --port $port $*" > "$RES/server_$dec.cmd"
  setsid env PYTHONPATH="$SERVER_PP" HPC_ADVISE_SGLANG_STAND_INS=1 SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python \
    python3 -m sglang.launch_server "${SERVER_ARGS[@]}" --decode-attention-backend "$dec" --port "$port" "$@" \
    >> "$log" 2>&1 &
  PIDS+=($!)
  eval "PID_$dec=$!"
}

get() {  # $1 URL [$2 timeout s]: the body on stdout, status 0 on HTTP 200
  python3 -c "import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=float(sys.argv[2])).read().decode())" \
    "$1" "${2:-3}" 2>/dev/null
}

attempt_log() {  # $1 decode backend: its log since the last restart
  awk '/^=== retry eager ===/{buf=""; next} {buf = buf $0 "\n"} END{printf "%s", buf}' "$RES/server_$1.log"
}

up() {  # $1 port, $2 pid, $3 decode backend: 0 once /v1/models and /health_generate answer, 1 if the
  # process died (or printed a top-level traceback: SGLang's launcher can linger after one) or START_S passed
  local t=$SECONDS
  while [ $((SECONDS - t)) -lt "$START_S" ]; do
    kill -0 "$2" 2>/dev/null || return 1
    attempt_log "$3" | grep -q "^Traceback (most recent call last)" && return 1
    if get "http://127.0.0.1:$1/v1/models" > /dev/null; then
      get "http://127.0.0.1:$1/health_generate" 60 > /dev/null && return 0
    fi
    sleep 2
  done
  return 1
}

SERVER_ARGS=(--model-path "$MODEL" --host 127.0.0.1 --load-format dummy --dtype bfloat16
  --attention-backend triton --prefill-attention-backend triton --moe-runner-backend triton
  --sampling-backend pytorch --disable-custom-all-reduce --kv-cache-dtype fp8_e4m3 --page-size 64
  --mem-fraction-static 0.3 --max-total-tokens 131072 --context-length 4096 --max-running-requests 64
  --grammar-backend none --random-seed 0)
GRAPHS=(--cuda-graph-max-bs-decode "${GRAPH_BS:-16}" --cuda-graph-backend-prefill disabled)
serve triton 30000 "${GRAPHS[@]}"
serve hpc_advise 30001 "${GRAPHS[@]}"

# while the servers start: the recommendation for this model and trace on one H200 (fits the serving model)
export HPC_ADVISE_HOME=$RES/home
python3 -m hpc_advise recommend --trace "$W/tiny.jsonl" --model "$MODEL" --gpu h200 --gpus 1 --top 3 \
  > "$RES/recommend.txt" 2>&1
rc=$?
REC=$(grep -o 'recommendation #[0-9]*' "$RES/recommend.txt" | grep -o '[0-9]*$')
say "recommend rc $rc -> recommendation ${REC:-none}"

overhead() {  # the client's own cost on this idle host: 2 cores for the client, the stand-in on the others
  timeout 60 python3 "$HERE/bench_client_overhead.py" cpu closed --requests 3000 --cpus 0,1 \
    > "$RES/client_overhead.jsonl" 2> "$RES/client_overhead.err"
  say "client overhead rc $?: $(cat "$RES/client_overhead.jsonl")"
}

MODE=graphs
UP=()
for spec in "triton 30000" "hpc_advise 30001"; do
  read -r dec port <<< "$spec"
  pid_var=PID_$dec
  if ! up "$port" "${!pid_var}" "$dec"; then
    say "server $dec did not come up with CUDA graphs: $(grep -E 'Error|error' "$RES/server_$dec.log" | tail -2)"
    kill -- "-${!pid_var}" 2>/dev/null
    # a failure whose traceback does not name graph capture would fail alike in eager mode
    if ! attempt_log "$dec" | awk '/^Traceback/{t=1} t' | grep -qi "graph\|capture"; then
      say "server $dec: not a CUDA-graph failure, no eager retry"
      continue
    fi
    sleep 3
    echo "=== retry eager ===" >> "$RES/server_$dec.log"
    serve "$dec" "$port" --disable-cuda-graph
    if ! up "$port" "${!pid_var}" "$dec"; then
      say "server $dec failed eager too: $(grep -E 'Error|error' "$RES/server_$dec.log" | tail -2)"
      continue
    fi
    MODE=eager
  fi
  UP+=("$dec")
  say "server $dec up on :$port"
done
if [ ${#UP[@]} -eq 0 ]; then
  cleanup; PIDS=(); [ "${OVERHEAD:-1}" = 1 ] && overhead; exit 1
fi
# the other server eager too if one fell back (the A/B compares like with like)
if [ "$MODE" = eager ] && [ ${#UP[@]} -eq 2 ] && ! grep -q "retry eager" "$RES/server_triton.log"; then
  kill -- "-$PID_triton" 2>/dev/null; sleep 3
  echo "=== retry eager ===" >> "$RES/server_triton.log"
  serve triton 30000 --disable-cuda-graph
  up 30000 "$PID_triton" triton || { say "triton eager failed"; UP=(hpc_advise); }
fi
echo "$MODE ${UP[*]}" > "$RES/mode.txt"
get http://127.0.0.1:30001/get_server_info > "$RES/server_info_hpc_advise.json"
get http://127.0.0.1:30000/get_server_info > "$RES/server_info_triton.json"
CAND=http://127.0.0.1:30001
[[ " ${UP[*]} " == *" hpc_advise "* ]] || CAND=http://127.0.0.1:30000

# cold servers JIT-compile Triton kernels on their first requests: in the first run that got this far, the solo
# run below was the candidate's first load (TTFT p50 2.4 s, against 14 ms in the A/B after it; SGLang logged our
# decode plan_kernel compiling three times, 1.7-2.2 s each, on eager decode batches past the largest graph) and
# the baseline's first and third A/B requests were among its three slowest TTFTs. So one unstored pass of the
# trace at twice its rate through both servers first (same requests at the same moments), no consistency prompts
if [ "${WARMUP:-1}" = 1 ]; then
  WARM=(python3 -m hpc_advise bench --url "$CAND" --trace "$W/tiny.jsonl" --tokenizer "$MODEL" --gpu h200
    --rate-scale 2 --no-store --consistency-prompts 0)
  [ ${#UP[@]} -eq 2 ] && WARM+=(--baseline-url http://127.0.0.1:30000)
  echo "${WARM[*]}" > "$RES/warmup.cmd"
  timeout 100 "${WARM[@]}" > "$RES/warmup.txt" 2>&1
  say "warm-up (rate x2, not stored) rc $?"
fi

# a second run of the candidate's deployment (twice the trace's rate) first, so validate's leave-one-out
# has another run to fit the correction on; the A/B's candidate run is then the newest
SOLO=(python3 -m hpc_advise bench --url "$CAND" --trace "$W/tiny.jsonl" --tokenizer "$MODEL"
  --gpu h200 --rate-scale 2 --output "$RES/bench_serving.jsonl" ${REC:+--recommendation "$REC"} --label "mode=$MODE")
echo "${SOLO[*]}" > "$RES/bench_solo.cmd"
if [ "${SOLO_RUN:-1}" = 1 ]; then
  timeout 100 "${SOLO[@]}" > "$RES/solo.txt" 2>&1
  say "bench solo (rate x2) rc $?"
fi
if [ ${#UP[@]} -eq 2 ]; then
  BENCH=(python3 -m hpc_advise bench --url "$CAND" --baseline-url http://127.0.0.1:30000)
else
  BENCH=(python3 -m hpc_advise bench --url "$CAND")
fi
BENCH+=(--trace "$W/tiny.jsonl" --tokenizer "$MODEL" --gpu h200 --details --output "$RES/bench_serving.jsonl"
  ${REC:+--recommendation "$REC"} --label "mode=$MODE")
echo "${BENCH[*]}" > "$RES/bench.cmd"
say "bench: ${BENCH[*]}"
timeout 200 "${BENCH[@]}" --json > "$RES/ab.json" 2> "$RES/ab.err"
say "bench rc $?"
tail -3 "$RES/ab.err"
python3 -m hpc_advise runs list > "$RES/runs_list.txt" 2>&1
if [ -n "$REC" ]; then
  timeout 120 python3 -m hpc_advise validate --recommendation "$REC" --json > "$RES/validate.json" 2>&1
  say "validate rc $?"
  python3 "$HERE/real_engine.py" table "$RES" > "$RES/real_engine.md" 2> "$RES/table.err"
  timeout 60 python3 -m hpc_advise validate --recommendation "$REC" > "$RES/validate.txt" 2>&1
fi
python3 "$HERE/real_engine.py" table "$RES" > "$RES/real_engine.md" 2> "$RES/table.err"
cleanup
PIDS=()
sleep 2
[ "${OVERHEAD:-1}" = 1 ] && overhead
say "done"
cat "$RES/validate.txt" 2>/dev/null | head -30
cat "$RES/real_engine.md"
