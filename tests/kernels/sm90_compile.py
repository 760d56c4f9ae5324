"""Offline sm_90a compile of Triton kernels for CPU tests (no GPU): what Triton builds for an H200.

The Triton interpreter runs kernels without compiling them, so a CPU test can pass while the kernel
fails to build, or builds with fewer pipelined loads or more registers than intended. ``compile_sm90``
compiles kernels for sm_90a in a subprocess (the interpreter flag removed) with the ptxas that ships with
triton and reports, per job: async copies and wgmma ops in the TTGIR, shared memory (bytes), registers per
thread and stack bytes (spills; read from the cubin with the bundled cuobjdump) and the CTAs per SM those two allow,
and for the smallest loop of the SASS that holds a warpgroup MMA: its instructions, barriers and local-memory
accesses (``loop``: ``{"instructions", "barriers", "local"}``; None where no loop has one).

A job is ``(module, kernel, types, constexprs, num_warps, num_stages, aligned)``: ``types`` lists the
Triton types of the non-constexpr arguments in order (``"*bf16 i32 fp32 ..."``); pointers and the int
arguments named in ``aligned`` get the divisibility-by-16 hint the launcher gives them at run time. An eighth
element, where given, caps the registers per thread (``maxnreg``, as op.py passes it at launch).
Constexpr parameters with a default that ``constexprs`` does not name build with that default.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_SCRIPT = r"""
import importlib, json, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
out = []
for module, name, types, consts, warps, stages, aligned, *cap in json.loads(sys.argv[1]):
    fn = getattr(importlib.import_module(module), name)
    types = iter(types.split())
    sig, attrs = {}, {}
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}
    for i, arg in enumerate(fn.arg_names):
        if arg not in consts and arg in defaults:  # a constexpr the job does not name: its default
            consts[arg] = defaults[arg]
        if arg in consts:
            sig[arg] = "constexpr"
            continue
        sig[arg] = next(types)
        if sig[arg].startswith("*") or arg in aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    k = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=warps, num_stages=stages, **({"maxnreg": cap[0]} if cap else {})))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        res = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name],
                             capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name],
                              capture_output=True, text=True, check=True).stdout
    ins = re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)
    at = {int(a, 16): i for i, (a, _) in enumerate(ins)}
    loops = []  # the body of each backward branch (a loop) that holds a warpgroup MMA
    for j, (_, text) in enumerate(ins):
        m = re.search(r"BRA\s+0x([0-9a-f]+)", text)
        i = at.get(int(m.group(1), 16), j + 1) if m else j + 1
        if i <= j and any("HGMMA" in t for _, t in ins[i:j + 1]):
            loops.append([t for _, t in ins[i:j + 1]])
    body = min(loops, key=len) if loops else None
    loop = body and {"instructions": len(body), "barriers": sum(bool(re.search(r"\bBAR\.", t)) for t in body),
                     "local": sum(bool(re.search(r"\b(LDL|STL)\b", t)) for t in body)}
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    stack = int(re.search(r"STACK:(\d+)", res).group(1))  # > 0: registers spilled to local memory
    ttgir = k.asm["ttgir"]
    shared = k.metadata.shared
    threads = 32 * warps
    by_regs = 65536 // (threads * ((regs + 7) // 8 * 8))
    by_smem = (228 * 1024) // (shared + 1024) if shared else 32
    out.append({"kernel": name, "async_copies": ttgir.count("async_copy_global_to_local"),
                "wgmma": ttgir.count("warp_group_dot "), "shared": shared, "registers": regs, "stack": stack,
                "ctas_per_sm": min(by_regs, by_smem, 2048 // threads, 32), "loop": loop})
print(json.dumps(out))
"""


def compile_sm90(jobs: list) -> list[dict]:
    """Compile ``jobs`` (see module docstring) for sm_90a; skips the test when triton's ptxas is missing."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(jobs)],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=900,
    )
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("triton's bundled ptxas is missing")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
