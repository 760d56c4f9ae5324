"""Launch plans of the FP8 fused MoE: one eager call's host work done once per call signature.

An eager ``op.fused_moe`` call spends far more host time than GPU time at decode and small extend sizes
(H200: 220-455 µs of host time against 27-58 µs of GPU time in graph replay; the kernel
README's decisions table has the evidence): input checks, the config lookup, a
workspace allocation per buffer, and Triton's per-launch dispatch (argument binding, specialization,
cache key, launch metadata) on each of its one to five launches. Everything but the tensors' addresses
is fixed by the call's signature (device, stream, every input's shape / stride / dtype / 16-byte
alignment, config, scaling factor, expert offset), so the first call of a signature is *recorded* and
later calls *replay* it:

- ``Recorder``: while one is active (``recording``), every launch that goes through ``launch(kernel,
  grid)(*args, **kwargs)`` runs normally (Triton's ``JITFunction.run``, which compiles if needed) and is
  kept as a ``_Step``: the ``CompiledKernel`` it returned, the grid, the launch options and the full
  argument list in the kernel's parameter order (what ``JITFunction.run`` hands the launcher). Each
  tensor argument is bound to a *slot*: one of the call's tensors (``set_io``), one of the workspace
  buffers the call made through ``empty`` (by allocation order), or a buffer that lives for the
  process (``keep``: the unit scale, the arrival counters). A tensor that is none of these (a per-call
  temporary the plan could not rebuild) makes the call unplannable: it is never replayed.
- ``Plan.run``: fills the slots with this call's tensors and launches each compiled kernel through
  its launcher (``CompiledKernel.run``, Triton 3.6's ``CudaLauncher``: grid, stream, function, packed
  metadata, launch metadata / enter and exit hooks (None: ``usable`` refuses plans while Triton launch
  hooks are installed), then the bound arguments). Host tensor descriptors (TMA) over a slot are rebuilt
  per call (the launcher encodes them at launch). Under the Triton interpreter (``TRITON_INTERPRET=1``,
  the CPU tests) there is no compiled kernel: each step is relaunched through ``kernel[grid]`` with the
  same bound arguments, so the slot binding is what the CPU tests check.

Workspaces: a plan keeps the recording call's workspace buffers (allocated on the plan's stream, the
key holds the stream) if they take at most ``WS_PLAN_BYTES``, within ``WS_TOTAL_BYTES`` for all plans
(least recently used plans are dropped first, with their buffers; the caching allocator may then hand
the memory to later work of that stream only, which runs after the dropped plan's last use). Two calls
on one stream share them safely: the second call's kernels start after the first call's finished.
Other streams have other plans. Larger workspaces are allocated per call from the recorded shapes. A
call inside a CUDA-graph capture never uses the kept buffers: it allocates its own from the graph's
pool (the graph keeps them) and is never recorded.
"""

from __future__ import annotations

import inspect
import threading
from collections import OrderedDict

import torch
from triton import knobs

WS_PLAN_BYTES = 64 << 20  # a plan keeps its workspace up to this size (else allocates per call)
WS_TOTAL_BYTES = 256 << 20  # workspace kept by all plans of the process together
MAX_PLANS = 512
ENABLED = True  # False: every call takes the unplanned path (the benchmark's "cache off")

_TLS = threading.local()
_KEPT: set[int] = set()  # storage addresses of buffers that live as long as the process
_SIGS: dict[int, tuple] = {}  # id(kernel) -> (parameter names, defaults)


def keep(tensor: torch.Tensor) -> torch.Tensor:
    """Mark ``tensor``'s storage as living for the process: plans may hold it as a fixed argument."""
    _KEPT.add(tensor.untyped_storage().data_ptr())
    return tensor


def empty(*shape, dtype, device) -> torch.Tensor:
    """``torch.empty`` for a workspace buffer of one call (recorded while a plan is recorded)."""
    t = torch.empty(*shape, dtype=dtype, device=device)
    rec = getattr(_TLS, "rec", None)
    if rec is not None:
        rec.ws.append(t)
    return t


def set_io(tensors: tuple, meta=None) -> None:
    """The call's own tensors (None entries allowed), in the order ``Plan.run`` gets them, and the
    caller's replay data ``meta`` (``Plan.meta``); ignored when nothing is recorded."""
    rec = getattr(_TLS, "rec", None)
    if rec is not None:
        rec.io, rec.meta = tensors, meta


def launch(kernel, grid):
    """``kernel[grid]`` that also records the launch while a plan is recorded."""

    def run(*args, **kwargs):
        compiled = kernel[grid](*args, **kwargs)
        rec = getattr(_TLS, "rec", None)
        if rec is not None:
            rec.add(kernel, grid, compiled, args, kwargs)
        return compiled

    return run


def _signature(kernel) -> tuple:
    sig = _SIGS.get(id(kernel))
    if sig is None:
        params = inspect.signature(kernel.fn).parameters.values()
        sig = (tuple(p.name for p in params), tuple(p.default for p in params))
        _SIGS[id(kernel)] = sig
    return sig


def _hooks_installed() -> bool:
    rt = knobs.runtime
    return bool(getattr(rt.launch_enter_hook, "calls", rt.launch_enter_hook)) or bool(
        getattr(rt.launch_exit_hook, "calls", rt.launch_exit_hook)
    )


class _Step:
    """One recorded launch: compiled kernel (None under the interpreter), grid, options, arguments."""

    __slots__ = ("kernel", "grid", "compiled", "options", "fixed", "slots", "descs")

    def __init__(self, kernel, grid, compiled, options, fixed, slots, descs):
        self.kernel, self.grid, self.compiled, self.options = kernel, grid, compiled, options
        self.fixed, self.slots, self.descs = fixed, slots, descs

    def __call__(self, src: tuple, stream: int) -> None:
        vals = self.fixed.copy()
        for pos, slot in self.slots:
            vals[pos] = src[slot]
        if self.descs:
            from triton.tools.tensor_descriptor import TensorDescriptor

            for pos, slot, shape, strides, block, padding in self.descs:
                vals[pos] = TensorDescriptor(src[slot], shape, strides, block, padding)
        c = self.compiled
        if c is None:
            self.kernel[self.grid](*vals, **self.options)
        else:
            g = self.grid
            c.run(g[0], g[1], g[2], stream, c.function, c.packed_metadata, None, None, None, *vals)


class Plan:
    """The recorded launches of one call signature and their workspace (see the module docstring)."""

    def __init__(self, steps, io_len, ws, meta):
        self.steps, self.io_len, self.meta = steps, io_len, meta
        self.spec = [(tuple(t.shape), t.dtype, t.device) for t in ws]
        self.ws_bytes = sum(t.numel() * t.element_size() for t in ws)
        self.ws = tuple(ws) if self.ws_bytes <= WS_PLAN_BYTES else None

    def run(self, io: tuple, stream: int, capturing: bool) -> None:
        ws = self.ws
        if ws is None or capturing:
            ws = tuple(torch.empty(s, dtype=d, device=dev) for s, d, dev in self.spec)
        src = io + ws
        for step in self.steps:
            step(src, stream)


class Recorder:
    """Collects the launches, workspace buffers and call tensors of one call (``recording``)."""

    def __init__(self):
        self.steps: list[tuple] = []
        self.ws: list[torch.Tensor] = []
        self.io: tuple | None = None
        self.meta = None
        self.ok = True

    def add(self, kernel, grid, compiled, args, kwargs) -> None:
        names, defaults = _signature(kernel)
        vals = list(args)
        for name, default in zip(names[len(args) :], defaults[len(args) :], strict=True):
            if name in kwargs:
                vals.append(kwargs[name])
            elif default is inspect.Parameter.empty:
                self.ok = False
                return
            else:
                vals.append(default)
        options = {k: v for k, v in kwargs.items() if k not in names}
        grid = tuple(grid) + (1,) * (3 - len(grid))
        if compiled is not None and not hasattr(compiled, "packed_metadata"):
            self.ok = False  # not a CompiledKernel (another Triton API): keep the normal launches
            return
        self.steps.append((kernel, grid, compiled, options, vals))

    def finish(self) -> Plan | None:
        """The plan, or None where a launch took a tensor that is not a slot or kept buffer."""
        if not self.ok or self.io is None:
            return None
        owners = [t for t in (*self.io, *self.ws) if t is not None]
        slot_of = {id(t): i for i, t in enumerate((*self.io, *self.ws)) if t is not None}
        if len(slot_of) != len(owners):
            return None  # one tensor in two slots (aliased inputs): which one a launch meant is unknown
        steps = []
        for kernel, grid, compiled, options, vals in self.steps:
            fixed, slots, descs = list(vals), [], []
            for pos, v in enumerate(vals):
                if isinstance(v, torch.Tensor):
                    slot = slot_of.get(id(v))
                    if slot is not None:
                        slots.append((pos, slot))
                        fixed[pos] = None
                    elif v.untyped_storage().data_ptr() not in _KEPT:
                        return None
                elif type(v).__name__ == "TensorDescriptor":
                    slot = slot_of.get(id(v.base))
                    if slot is not None:
                        spec = (tuple(v.shape), tuple(v.strides), tuple(v.block_shape), v.padding)
                        descs.append((pos, slot, *spec))
                        fixed[pos] = None
                    elif v.base.untyped_storage().data_ptr() not in _KEPT:
                        return None
            steps.append(_Step(kernel, grid, compiled, options, fixed, tuple(slots), tuple(descs)))
        return Plan(tuple(steps), len(self.io), self.ws, self.meta)


class recording:
    """Context manager: record the launches of the enclosed call into ``rec`` (None: record nothing)."""

    def __init__(self, rec: Recorder | None):
        self.rec = rec

    def __enter__(self):
        self.prev = getattr(_TLS, "rec", None)
        _TLS.rec = self.rec
        return self.rec

    def __exit__(self, *exc):
        _TLS.rec = self.prev
        return False


class PlanCache:
    """Plans by call signature, least recently used dropped first (``MAX_PLANS``, ``WS_TOTAL_BYTES``)."""

    def __init__(self):
        self.plans: OrderedDict = OrderedDict()
        self.kept_bytes = 0
        self.hits = 0
        self.records = 0

    def get(self, key) -> Plan | None:
        plan = self.plans.get(key)
        if plan is not None:
            self.plans.move_to_end(key)
            self.hits += 1
        return plan

    def put(self, key, plan: Plan) -> None:
        self.records += 1
        old = self.plans.pop(key, None)
        if old is not None and old.ws is not None:
            self.kept_bytes -= old.ws_bytes
        if plan.ws is not None and plan.ws_bytes > WS_TOTAL_BYTES:
            plan.ws = None
        self.plans[key] = plan
        if plan.ws is not None:
            self.kept_bytes += plan.ws_bytes
        while len(self.plans) > MAX_PLANS or self.kept_bytes > WS_TOTAL_BYTES:
            _, dropped = self.plans.popitem(last=False)
            if dropped.ws is not None:
                self.kept_bytes -= dropped.ws_bytes

    def clear(self) -> None:
        """Drop every plan and reset the counters (hits: replays, records: plans stored)."""
        self.plans.clear()
        self.kept_bytes = 0
        self.hits = self.records = 0


def stream_of(device_index: int) -> tuple[int, int]:
    """(current CUDA device, its current raw stream) as Triton launches on them; (-1, 0) off the GPU."""
    if device_index < 0:
        return -1, 0
    cur = torch.cuda.current_device()
    return cur, torch._C._cuda_getCurrentRawStream(cur)


def usable() -> bool:
    """Plans are on (``ENABLED``) and no Triton launch hook (a profiler) wants to see the launches."""
    return ENABLED and not _hooks_installed()
