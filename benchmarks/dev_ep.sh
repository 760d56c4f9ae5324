#!/usr/bin/env bash
# Device-call script of issue 10 (communication and expert parallelism), on nvidia-h200-x2 (2 H200s).
# Carry .whl_profile (sqlite-utils & co.: the knowledge base). Stages, each under its own `timeout`,
# results re-packed into $OUT/results.tgz after every stage (a timeout keeps what finished):
#   comm   `hpc-advise profile --bench comm` (world size 2 on this host) into a fresh knowledge base,
#          table + rows as comm_h200x2.md/.jsonl; then `runs list --kind comm`
#   commg  the same collectives at world size 2 timed as CUDA-graph replays (comm_h200x2_graph.jsonl)
#   ep     benchmarks/bench_ep_moe.py: EP1 / EP2 / TP2 for Hy3 and DeepSeek-V3 at T = 1..4096 per rank
#   tests  GPU tests of tests/runtime/test_ep_moe.py and test_comm_bench.py (-n 1; after the benchmark,
#          whose parallel precompile leaves most of the fused op's kernels in Triton's disk cache)
#   comm1  the collectives at world size 1, eager and graph (one GPU: the per-call floor, no link bytes)
set -o pipefail
T0=$SECONDS
RES=/tmp/res_ep
mkdir -p "$RES"
pack() { tar czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null; echo "[$((SECONDS - T0))s] $1"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl_profile/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HPC_ADVISE_HOME=$RES/home HPC_ADVISE_RESULTS=$RES
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
  nvidia-smi --query-gpu=index,name,clocks.sm,clocks.mem,memory.used,driver_version --format=csv
  nvidia-smi topo -m
  nvidia-smi nvlink --status 2>&1 | head -40
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"
} > "$RES/machine.txt" 2>&1
head -8 "$RES/machine.txt"
pack "machine facts"

timeout "${COMM_S:-70}" python3 -m hpc_advise profile --bench comm --write-results comm_h200x2 > "$RES/comm.log" 2>&1
echo "comm rc=$?"; tail -5 "$RES/comm.log"
python3 -m hpc_advise runs list --kind comm --limit 200 > "$RES/comm_runs_list.txt" 2>&1
pack "comm done"

measure() {  # world size, graph (True/False), output file
  python3 -c "
import json, os
from hpc_advise.runtime import comm_bench
rows = comm_bench.measure($1, device='cuda', graph=$2)
with open(os.path.join(os.environ['HPC_ADVISE_RESULTS'], '$3'), 'w') as fh:
    for r in rows:
        fh.write(json.dumps(r, sort_keys=True) + '\\n')
print(len(rows), 'rows, world size $1, graph $2, timings', sorted({r['config']['timing'][:40] for r in rows}))
"
}
timeout "${COMMG_S:-40}" bash -c "$(declare -f measure); measure 2 True comm_h200x2_graph.jsonl" > "$RES/commg.log" 2>&1
echo "comm graph rc=$?"; tail -2 "$RES/commg.log"
pack "comm graph done"

timeout "${EP_S:-110}" python3 benchmarks/bench_ep_moe.py > "$RES/ep.log" 2>&1
echo "ep rc=$?"; grep -E "^\| |precompiled|stored|Error|error" "$RES/ep.log" | tail -16
pack "ep bench done"

timeout "${TEST_S:-75}" python3 -m pytest -q -m gpu tests/runtime/test_ep_moe.py tests/runtime/test_comm_bench.py \
  -n 1 -p no:cacheprovider -o addopts="" -rfEs -s > "$RES/gpu_tests.log" 2>&1
echo "tests rc=$?"; grep -E "rel err|passed|failed|Error" "$RES/gpu_tests.log" | tail -8
pack "gpu tests done"

timeout "${COMM1_S:-25}" bash -c "$(declare -f measure); measure 1 False comm_h200x2_ws1.jsonl; measure 1 True comm_h200x2_ws1_graph.jsonl" > "$RES/comm1.log" 2>&1
echo "comm1 rc=$?"; tail -2 "$RES/comm1.log"
pack "comm world size 1 done"
