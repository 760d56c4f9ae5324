"""The ``hpc_advise`` MoE runner inside real SGLang: ``Fp8MoEMethod`` (hooked) -> SGLang's ``MoeRunner``
-> our runner core -> ``fused_moe`` (Triton interpreter on CPU, small shapes).

The expert layer is a ``torch.nn.Module`` holding the weights in the form ``Fp8MoEMethod`` leaves them
after ``process_weights_after_loading`` (fp8 ``[E, 2I, H]`` / ``[E, H, I]``, per-tensor ``[E]`` scales
and scalar static input scales, or 128x128 block scales): building a real ``FusedMoE`` needs
initialised process groups, and SGLang's own post-load step calls CUDA kernels. Everything else is
SGLang's: ``Fp8Config``, ``Fp8MoEMethod``, ``MoeRunnerConfig``, ``MoeRunner``, ``StandardTopKOutput``,
``StandardDispatchOutput``, and the global MoE runner flag set the way ``initialize_moe_config`` sets it.

Two references: ``fused_moe_reference`` is the triton path's quantized math (static per-tensor
activation quantization with the layer's input scales, or dynamic 1x128 groups for block weights;
SiLU(gate)*up; weighted top-k sum; routed scaling factor), compared tightly; SGLang's own
``fused_moe_forward_native`` on the dequantized weights and on x rounded to fp8 as SGLang's fp8 path
rounds it (``_sglang_fp8_x``, written from SGLang's convention, not with our reference's quantizer)
is compared loosely: it does not re-quantize h = SiLU(gate)*up, so h's fp8 rounding separates the two.
Static input scales are calibrated on the batch (amax / 448, as a calibrated checkpoint's are): with a
fixed h scale (6/448) some fresh draws saturated an h element, which alone moved the output past the
loose bound (at least 3 of 3300 torch-only draws, up to 0.124).
"""

from __future__ import annotations

import logging

import pytest
import torch

from tests.kernels.fp8_midpoint import reference_with_flips
from tests.runtime.sglang.helpers import fresh_seed, import_sglang, record_ratio, tiny_model_dir

E, H, I, T, K = 4, 256, 128, 5, 2  # noqa: E741
FP8 = torch.float8_e4m3fn
REL_TOL_QUANT_REF = 2e-2  # the kernel's bound against its reference (hpc_advise/kernels/fused_moe/README.md)
# vs SGLang's native math on the same fp8 x: h's fp8 rounding (concentrated: 2000 torch-only draws per
# mode, mean 2.6 / 2.3 %, sd 0.23 / 0.17, worst 3.7 / 2.9 % per-tensor / block); a wrong scale or
# activation is far outside it
REL_TOL_NATIVE = 8e-2


@pytest.fixture
def sglang_moe(tmp_path):
    """``--moe-runner-backend hpc_advise`` through SGLang's own path: ``prepare_server_args`` on a tiny
    local config.json, a runtime context built from it, and ``initialize_moe_config`` (what the scheduler
    calls) resolving our registered name."""
    import_sglang("sglang.srt.layers.quantization.fp8")
    from sglang.srt.layers.moe.utils import get_moe_runner_backend, initialize_moe_config
    from sglang.srt.runtime_context import create_context, use_context
    from sglang.srt.server_args import prepare_server_args

    from hpc_advise.runtime.sglang import plugin

    plugin.register()
    args = prepare_server_args(
        [
            "--model-path",
            tiny_model_dir(tmp_path),
            "--moe-runner-backend",
            "hpc_advise",
            "--device",
            "cpu",
            "--skip-tokenizer-init",
        ]
    )
    with use_context(create_context(args, role="scheduler")):
        initialize_moe_config()
        assert get_moe_runner_backend().value == "hpc_advise"
        yield


def _config(**kw):
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig

    base = dict(
        num_experts=E,
        num_local_experts=E,
        hidden_size=H,
        intermediate_size_per_partition=I,
        top_k=K,
        num_fused_shared_experts=0,
        params_dtype=torch.bfloat16,
        activation="silu",
        is_gated=True,
    )
    base.update(kw)
    return MoeRunnerConfig(**base)


def _layer(block: bool, gen: torch.Generator) -> torch.nn.Module:
    from hpc_advise.kernels.fused_moe.reference import quantize_weight

    layer = torch.nn.Module()
    w13 = torch.randn(E, 2 * I, H, generator=gen) * 0.05
    w2 = torch.randn(E, H, I, generator=gen) * 0.05
    mode = "block" if block else "tensor"
    q13, s13 = quantize_weight(w13, mode)
    q2, s2 = quantize_weight(w2, mode)
    layer.w13_weight = torch.nn.Parameter(q13, requires_grad=False)
    layer.w2_weight = torch.nn.Parameter(q2, requires_grad=False)
    if block:
        layer.w13_weight_scale_inv = torch.nn.Parameter(s13, requires_grad=False)
        layer.w2_weight_scale_inv = torch.nn.Parameter(s2, requires_grad=False)
        layer.w13_input_scale = layer.w2_input_scale = None
    else:
        layer.w13_weight_scale = torch.nn.Parameter(s13, requires_grad=False)
        layer.w2_weight_scale = torch.nn.Parameter(s2, requires_grad=False)
        layer.w13_input_scale = torch.nn.Parameter(torch.tensor(5.0 / 448), requires_grad=False)
        layer.w2_input_scale = torch.nn.Parameter(torch.tensor(6.0 / 448), requires_grad=False)
    return layer


def _calibrate_static_scales(layer: torch.nn.Module, x: torch.Tensor) -> None:
    """Per-tensor static input scales from this batch: amax / 448 of x and of h over every expert."""
    from hpc_advise.kernels.fused_moe.reference import dequantize_weight

    gu = torch.einsum("th,eoh->teo", x.float(), dequantize_weight(layer.w13_weight, layer.w13_weight_scale))
    h = torch.nn.functional.silu(gu[..., :I]) * gu[..., I:]
    layer.w13_input_scale.data = x.float().abs().max() / 448
    layer.w2_input_scale.data = h.abs().max() / 448


def _sglang_fp8_x(x: torch.Tensor, layer: torch.nn.Module, block: bool) -> torch.Tensor:
    """x as SGLang's fp8 MoE path feeds it to the first GEMM, dequantized: divided by the static input
    scale and saturated to ±448, or per 1x128 group scaled by its amax / 448."""
    x = x.float()
    if not block:
        s = layer.w13_input_scale.float()
        return (x / s).clamp(-448, 448).to(FP8).float() * s
    g = x.view(len(x), -1, 128)
    s = g.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 448
    return ((g / s).to(FP8).float() * s).view(x.shape)


def _method(block: bool):
    from sglang.srt.layers.quantization.fp8 import Fp8Config, Fp8MoEMethod

    cfg = Fp8Config(
        is_checkpoint_fp8_serialized=True,
        activation_scheme="dynamic" if block else "static",
        weight_block_size=[128, 128] if block else None,
    )
    return Fp8MoEMethod(cfg)


def _dispatch(gen: torch.Generator, *, nonlocal_slot: bool):
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    x = torch.randn(T, H, generator=gen).to(torch.bfloat16)
    logits = torch.randn(T, E, generator=gen)
    w, ids = torch.topk(torch.softmax(logits, -1), K, dim=-1)
    ids = ids.to(torch.int32)
    if nonlocal_slot:
        ids[0, 1] = -1  # an expert of another EP rank, as SGLang's dispatcher marks it
    return StandardDispatchOutput(
        hidden_states=x, hidden_states_scale=None, topk_output=StandardTopKOutput(w, ids, logits)
    )


@pytest.mark.parametrize("path", ["regular", "small-T"])
@pytest.mark.parametrize("block", [False, True], ids=["per-tensor-static", "block128-dynamic"])
def test_fp8_method_runs_our_runner_and_matches_triton_math(sglang_moe, block, path, monkeypatch):
    from sglang.srt.layers.moe.fused_moe_native import fused_moe_forward_native

    from hpc_advise.kernels.fused_moe import op as moe_op
    from hpc_advise.kernels.fused_moe.reference import dequantize_weight, fused_moe_reference

    small_calls = []
    if path == "small-T":  # the path the tuned table picks for Hy3 / Qwen3 at decode T (op_small.py)
        monkeypatch.setattr(moe_op, "SMALL_T_DEFAULT", moe_op.SMALL_T_MAX)
        run_small = moe_op.fused_moe_small
        monkeypatch.setattr(
            moe_op, "fused_moe_small", lambda *a, **kw: small_calls.append(1) or run_small(*a, **kw)
        )
    seed, gen = fresh_seed()
    method, layer = _method(block), _layer(block, gen)
    dispatch_output = _dispatch(gen, nonlocal_slot=True)
    if not block:
        _calibrate_static_scales(layer, dispatch_output.hidden_states)
    method.create_moe_runner(layer, _config(routed_scaling_factor=1.5))
    assert method.runner.runner_backend.value == "hpc_advise"
    got = method.apply(layer, dispatch_output).hidden_states
    assert got.dtype == torch.bfloat16 and got.shape == (T, H) and torch.isfinite(got).all(), seed
    assert bool(small_calls) == (path == "small-T"), seed

    w, ids, _ = dispatch_output.topk_output
    info = dict(
        w13_scale=layer.w13_weight_scale_inv if block else layer.w13_weight_scale,
        w2_scale=layer.w2_weight_scale_inv if block else layer.w2_weight_scale,
        a13_scale=layer.w13_input_scale,
        a2_scale=layer.w2_input_scale,
        block_shape=(128, 128) if block else None,
        routed_scaling_factor=1.5,
    )
    want = fused_moe_reference(
        dispatch_output.hidden_states, layer.w13_weight, layer.w2_weight, w, ids, **info
    )
    # the kernel's declared tolerance against this reference (hpc_advise/kernels/fused_moe/README.md): an
    # accumulation-order difference may flip an fp8 rounding of an intermediate, so the bound is on the
    # relative Frobenius error, not element-wise
    rel = float((got.double() - want.double()).norm() / want.double().norm())
    if rel > REL_TOL_QUANT_REF:  # the kernel test's second look (tests/kernels/fp8_midpoint.py)
        kw = {k: v for k, v in info.items() if k not in ("block_shape", "routed_scaling_factor")}
        problem = dict(x=dispatch_output.hidden_states, w13=layer.w13_weight, w2=layer.w2_weight)
        problem.update(weights=w, ids=ids, kw=dict(kw, expert_offset=0))
        flipped = reference_with_flips(got, want, problem, 1.5, seed)
        rel = float((got.double() - flipped.double()).norm() / flipped.double().norm())
    record_ratio(rel, REL_TOL_QUANT_REF)
    assert rel <= REL_TOL_QUANT_REF, f"relative error {rel:.2e} against the triton path's math (seed {seed})"

    # SGLang's own torch-native MoE math on the dequantized weights and fp8 x (h is not re-quantized)
    ref_layer = torch.nn.Module()
    ref_layer.w13_weight = dequantize_weight(layer.w13_weight, info["w13_scale"])
    ref_layer.w2_weight = dequantize_weight(layer.w2_weight, info["w2_scale"])
    ref_layer.moe_runner_config = _config()
    keep_w = torch.where(ids < 0, torch.zeros_like(w), w)
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    native = (
        fused_moe_forward_native(
            ref_layer,
            dispatch_output._replace(
                hidden_states=_sglang_fp8_x(dispatch_output.hidden_states, layer, block),
                topk_output=StandardTopKOutput(keep_w, ids.clamp(min=0).long(), None),
            ),
        ).hidden_states
        * 1.5
    )
    rel = float((got.float() - native).norm() / native.norm())
    record_ratio(rel, REL_TOL_NATIVE)
    assert rel < REL_TOL_NATIVE, f"relative error {rel:.3f} against SGLang's native MoE math (seed {seed})"


def test_uncovered_config_falls_back_to_triton_once(sglang_moe, caplog):
    _, gen = fresh_seed()
    with caplog.at_level(logging.WARNING, logger="hpc_advise.runtime.sglang.moe"):
        for _ in range(2):
            method, layer = _method(False), _layer(False, gen)
            method.create_moe_runner(layer, _config(activation="gelu"))
            assert method.runner.runner_backend.value == "triton"
    assert caplog.text.count("activation gelu") == 1  # logged once per (layer type, reason)


def test_unsupported_loaded_weights_fall_back_at_first_apply(sglang_moe, caplog):
    """Per-expert input scales were not reduced to one scale: the layer moves to triton with the reason
    (the triton path itself needs CUDA, so its call is replaced by a marker here)."""
    _, gen = fresh_seed()
    method, layer = _method(False), _layer(False, gen)
    layer.w13_input_scale = torch.nn.Parameter(torch.full((E,), 4.0 / 448), requires_grad=False)
    method.create_moe_runner(layer, _config())
    assert method.runner.runner_backend.value == "hpc_advise"
    from hpc_advise.runtime.sglang import moe

    calls = []
    with caplog.at_level(logging.WARNING, logger="hpc_advise.runtime.sglang.moe"):
        out = moe.apply_hook(
            lambda *a, **k: calls.append(a) or "triton-path",
            method,
            layer,
            _dispatch(gen, nonlocal_slot=False),
        )
    assert out == "triton-path" and len(calls) == 1
    assert method.runner.runner_backend.value == "triton"
    assert "w13_input_scale has 4 values" in caplog.text


def test_backend_not_selected_leaves_sglang_alone(sglang_moe):
    from sglang.srt.layers.moe.utils import MoeRunnerBackend
    from sglang.srt.runtime_context import get_flags

    get_flags().moe.runner_backend = MoeRunnerBackend.TRITON
    method, layer = _method(False), _layer(False, fresh_seed()[1])
    method.create_moe_runner(layer, _config())
    assert method.runner.runner_backend == MoeRunnerBackend.TRITON


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["hy3-tp8-per-tensor", "qwen3-fp8-block128"])
def test_real_shapes_on_gpu(sglang_moe, shape):
    """Model shapes on the H200 through the same hooked Fp8MoEMethod and SGLang MoeRunner, against the
    triton path's math (our fp32 reference; SGLang's triton runner needs its sgl-kernel build). With
    sgl-kernel missing: SGLang's module-level imports of it are met by tests/runtime/sglang/sgl_kernel_stand_in.py (import-only; nothing here calls it)."""
    from hpc_advise.kernels.fused_moe.reference import fused_moe_reference, quantize_weight

    experts, hidden, inter, top_k, block = {
        "hy3-tp8-per-tensor": (192, 4096, 192, 8, False),
        "qwen3-fp8-block128": (128, 4096, 384, 8, True),
    }[shape]
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    seed, _ = fresh_seed()
    dev = "cuda"
    layer = torch.nn.Module()
    q13, s13 = quantize_weight(
        torch.randn(experts, 2 * inter, hidden, device=dev) / hidden**0.5, "block" if block else "tensor"
    )
    q2, s2 = quantize_weight(
        torch.randn(experts, hidden, inter, device=dev) / inter**0.5, "block" if block else "tensor"
    )
    layer.w13_weight, layer.w2_weight = q13, q2
    if block:
        layer.w13_weight_scale_inv, layer.w2_weight_scale_inv = s13, s2
        layer.w13_input_scale = layer.w2_input_scale = None
    else:
        layer.w13_weight_scale, layer.w2_weight_scale = s13, s2
        layer.w13_input_scale = torch.tensor(6.0 / 448, device=dev)
        layer.w2_input_scale = torch.tensor(6.0 / 448, device=dev)
    method = _method(block)
    method.create_moe_runner(
        layer,
        _config(
            num_experts=experts,
            num_local_experts=experts,
            hidden_size=hidden,
            intermediate_size_per_partition=inter,
            top_k=top_k,
            routed_scaling_factor=2.5,
        ),
    )
    for t in (1, 64, 1024):
        x = torch.randn(t, hidden, device=dev).to(torch.bfloat16)
        logits = torch.randn(t, experts, device=dev)
        w, ids = torch.topk(torch.softmax(logits, -1), top_k, dim=-1)
        out = method.apply(layer, StandardDispatchOutput(x, None, StandardTopKOutput(w, ids.int(), logits)))
        ref = fused_moe_reference(
            x,
            q13,
            q2,
            w,
            ids.int(),
            w13_scale=s13,
            w2_scale=s2,
            a13_scale=layer.w13_input_scale,
            a2_scale=layer.w2_input_scale,
            block_shape=(128, 128) if block else None,
            routed_scaling_factor=2.5,
        )
        rel = float((out.hidden_states.double() - ref.double()).norm() / ref.double().norm())
        assert rel <= REL_TOL_QUANT_REF, (shape, t, rel, f"seed {seed}")


def _dispatch_of(gen: torch.Generator, tokens: int):
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    x = torch.randn(tokens, H, generator=gen).to(torch.bfloat16)
    logits = torch.randn(tokens, E, generator=gen)
    w, ids = torch.topk(torch.softmax(logits, -1), K, dim=-1)
    return StandardDispatchOutput(
        hidden_states=x,
        hidden_states_scale=None,
        topk_output=StandardTopKOutput(w, ids.to(torch.int32), logits),
    )


def test_buckets_measured_slower_run_sglang_triton(sglang_moe, monkeypatch):
    """Measured rows at this layer's shape: ours faster at T = 5, SGLang's triton faster at T = 64. Calls of
    T = 40 (64's bucket) go to SGLang's triton runner with SGLang's own quant info; T = 5 stays on ours;
    with no measured rows the layer gets no second runner. (Both runners' ``run`` are replaced by markers:
    the triton path needs CUDA, and which path runs is what is checked.)"""
    from hpc_advise import measured
    from hpc_advise.runtime.sglang import moe

    _, gen = fresh_seed()
    shape = measured.MoeShape(E, H, I, K, "fp8-per-tensor")
    points = (measured.MoePoint(shape, 5, "hpc_advise", 90.0, 100.0, -10.0, "kernel fused_moe test"),
              measured.MoePoint(shape, 64, "hpc_advise", 110.0, 100.0, 10.0, "kernel fused_moe test"))  # fmt: skip
    monkeypatch.setattr(measured, "shipped_points", lambda: points)
    method, layer = _method(False), _layer(False, gen)
    method.create_moe_runner(layer, _config())
    assert method.runner.runner_backend.value == "hpc_advise"
    assert method._hpc_advise_sglang_runner.runner_backend.value == "triton"
    assert [moe.path_for(method, t) for t in (1, 5, 17, 18, 40, 128, 129)] == [
        "hpc_advise", "hpc_advise", "hpc_advise", "triton", "triton", "triton", "hpc_advise"]  # fmt: skip
    calls = []
    monkeypatch.setattr(
        method._hpc_advise_sglang_runner, "run", lambda d, q: calls.append(("triton", q)) or "triton"
    )
    monkeypatch.setattr(method.runner, "run", lambda d, q: calls.append(("ours", q)) or "ours")
    assert method.apply(layer, _dispatch_of(gen, 40)) == "triton"
    assert method.apply(layer, _dispatch_of(gen, 5)) == "ours"
    (_, q_triton), (_, q_ours) = calls
    assert type(q_triton).__name__ == "TritonMoeQuantInfo" and q_triton.w13_weight is layer.w13_weight
    assert q_triton.use_fp8_w8a8 and q_triton.a13_scale is layer.w13_input_scale
    assert isinstance(q_ours, moe.HpcAdviseMoeQuantInfo)
    monkeypatch.setattr(measured, "shipped_points", lambda: ())
    method, layer = _method(False), _layer(False, gen)
    method.create_moe_runner(layer, _config())
    assert method._hpc_advise_sglang_runner is None and moe.path_for(method, 40) == "hpc_advise"


def test_benchmark_handoff_off_switch_keeps_every_bucket_on_ours(sglang_moe, monkeypatch):
    """benchmarks/bench_layer.py's ``hpc_advise-raw`` worker (``_disable_moe_handoff``): with measured rows
    that hand T = 64's bucket to SGLang's triton, a layer built after the switch gets no triton runner and
    every token count runs our kernel."""
    from hpc_advise import measured
    from hpc_advise.runtime import dispatch
    from hpc_advise.runtime.sglang import moe
    from tests.benchmarks.helpers import load_script

    _, gen = fresh_seed()
    shape = measured.MoeShape(E, H, I, K, "fp8-per-tensor")
    points = (measured.MoePoint(shape, 64, "hpc_advise", 110.0, 100.0, 10.0, "kernel fused_moe test"),)
    monkeypatch.setattr(measured, "shipped_points", lambda: points)
    monkeypatch.setattr(dispatch, "moe_buckets", dispatch.moe_buckets)  # restored after the test
    method, layer = _method(False), _layer(False, gen)
    method.create_moe_runner(layer, _config())
    assert moe.path_for(method, 40) == "triton"  # the hand-off is in effect without the switch
    load_script("bench_layer")._disable_moe_handoff()
    method, layer = _method(False), _layer(False, gen)
    method.create_moe_runner(layer, _config())
    assert method.runner.runner_backend.value == "hpc_advise" and method._hpc_advise_sglang_runner is None
    assert {moe.path_for(method, t) for t in (1, 40, 64, 128)} == {"hpc_advise"}
