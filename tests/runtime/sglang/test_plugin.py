"""The plugin inside real SGLang 0.5.23: discovery, argument parsing, hooks, version gate, withdrawal,
and the opt-in router GEMM hooks on SGLang's real gate modules (kernel under the Triton interpreter)."""

from __future__ import annotations

import argparse
import logging
import types

import pytest
import torch

from tests.runtime.sglang.helpers import assert_close_seeded, fresh_seed, import_sglang

ARGS = [
    "--model-path",
    "dummy",
    "--decode-attention-backend",
    "hpc_advise",
    "--moe-runner-backend",
    "hpc_advise",
    "--page-size",
    "64",
]


@pytest.fixture(autouse=True)
def _sglang_importable():
    """Every test here may reach SGLang modules through our plugin: install the CPU stand-ins first
    (tests/runtime/sglang/helpers.py), so each test passes alone too, not only after another one did it."""
    import_sglang("sglang.srt.plugins")


def _parser():
    import_sglang("sglang.srt.server_args")
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


def test_entry_point_discovered_and_run_by_load_plugins():
    plugins = import_sglang("sglang.srt.plugins")
    found = plugins.load_plugins_by_group(plugins.GENERAL_PLUGINS_GROUP)
    assert "hpc_advise" in found, "entry point missing: pip install -e . (pyproject's sglang.srt.plugins)"
    func, dist = found["hpc_advise"]
    from hpc_advise.runtime.sglang import plugin

    assert func is plugin.register and dist == "hpc-advise"
    plugins.load_plugins()  # SGLang's own loader: runs register(), then applies hooks
    st = plugin.status()
    assert st["sglang"] == "0.5.23" and st["registered"] and st["errors"] == {}
    assert set(st["features"]) >= {"attention", "moe"}


def test_sglang_parser_accepts_our_names():
    from hpc_advise.runtime.sglang import plugin

    plugin.register()
    args = _parser().parse_args(ARGS)
    assert (args.decode_attention_backend, args.moe_runner_backend, args.page_size) == (
        "hpc_advise",
        "hpc_advise",
        64,
    )
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.layers.moe.utils import RegisteredMoeRunnerBackend, resolve_moe_runner_backend

    assert ATTENTION_BACKENDS["hpc_advise"] is plugin.create_attention_backend
    assert resolve_moe_runner_backend("hpc_advise") == RegisteredMoeRunnerBackend("hpc_advise")


def test_moe_hooks_applied_to_fp8_method():
    from hpc_advise.runtime.sglang import moe, plugin

    plugin.register()
    from sglang.srt.layers.quantization.fp8 import Fp8MoEMethod

    for target, hook in (
        (plugin.MOE_HOOKS[0][0], moe.create_moe_runner_hook),
        (plugin.MOE_HOOKS[1][0], moe.apply_hook),
    ):
        assert plugin._runs_hook(target, hook), target
    assert hasattr(Fp8MoEMethod.apply, "__wrapped__")
    # the checker is not vacuous: an unhooked SGLang method does not run our hook
    assert not plugin._runs_hook(f"{plugin.FP8_METHOD}.create_weights", moe.apply_hook)


def test_unsupported_sglang_version_is_a_noop(monkeypatch, caplog):
    from hpc_advise.runtime.sglang import plugin

    monkeypatch.setattr(plugin, "sglang_version", lambda: "0.5.22")

    def boom():
        raise AssertionError("must not register on an unsupported version")

    monkeypatch.setattr(plugin, "_register_attention", boom)
    with caplog.at_level(logging.WARNING, logger=plugin.__name__):
        plugin.register()
    assert "0.5.22 is not supported" in caplog.text
    assert plugin.status()["sglang"] == "0.5.22"
    monkeypatch.undo()
    plugin.register()  # restore this process's state for the other tests


def test_hooks_that_do_not_take_withdraw_the_backend(monkeypatch):
    """A hook target SGLang no longer has: register() raises, and SGLang's parser then rejects the name."""
    import_sglang("sglang.srt.plugins.hook_registry")
    from sglang.srt.plugins.hook_registry import HookRegistry

    from hpc_advise.runtime.sglang import plugin

    bogus = f"{plugin.FP8_METHOD}.no_such_method"
    monkeypatch.setattr(plugin, "MOE_HOOKS", plugin.MOE_HOOKS + ((bogus, "apply_hook"),))
    try:
        with pytest.raises(plugin.PluginInstallError, match="no_such_method"):
            plugin.register()
        assert "moe" in plugin.status()["errors"]
        with pytest.raises(SystemExit):
            _parser().parse_args(ARGS)  # argparse: invalid choice 'hpc_advise'
        from sglang.srt.layers.moe.utils import resolve_moe_runner_backend

        with pytest.raises(ValueError, match="neither built in nor registered"):
            resolve_moe_runner_backend("hpc_advise")
    finally:
        HookRegistry._hooks.pop(bogus, None)
        monkeypatch.undo()
        plugin.register()
    assert _parser().parse_args(ARGS).moe_runner_backend == "hpc_advise"


def test_router_hooks_only_with_env(monkeypatch):
    from hpc_advise.runtime.sglang import plugin, router

    monkeypatch.delenv("HPC_ADVISE_ROUTER_GEMM", raising=False)
    plugin.register()
    assert "router" not in plugin.status()["features"]
    monkeypatch.setenv("HPC_ADVISE_ROUTER_GEMM", "1")
    plugin.register()
    assert "router" in plugin.status()["features"]
    for target, fn, _ in plugin.ROUTER_HOOKS:
        assert plugin._runs_hook(target, getattr(router, fn)), target


def _router_tolerance(x, w):
    # fp32-accurate: error of an fp32 GEMM, far below bf16's 2^-8 relative rounding of the logits
    return dict(atol=1e-5 * float(x.abs().max() * w.abs().max()) * x.shape[1] ** 0.5, rtol=1e-5)


def test_replicated_gate_gives_fp32_logits(monkeypatch):
    """SGLang's bf16 ReplicatedLinear gate (qwen3_moe) after our per-instance hook: fp32 logits equal to
    the fp32 product of its bf16 weight, where SGLang's own returns them rounded to bf16."""
    import_sglang("sglang.srt.layers.linear")
    from sglang.srt.layers.linear import ReplicatedLinear

    from hpc_advise.runtime.sglang import router

    seed, gen = fresh_seed()
    gate = ReplicatedLinear(1024, 64, bias=False, params_dtype=torch.bfloat16, quant_config=None)
    gate.weight.data.copy_(torch.randn(64, 1024, generator=gen).to(torch.bfloat16) * 0.02)
    x = torch.randn(3, 1024, generator=gen).to(torch.bfloat16)
    sglang_logits, _ = gate(x)
    assert sglang_logits.dtype == torch.bfloat16
    router.install_on_gate(gate)
    ours, bias = gate(x)
    assert bias is None and ours.dtype == torch.float32
    want = router.gate_reference(gate.weight, x)
    assert_close_seeded(ours, want, **_router_tolerance(x, gate.weight), seed=seed)
    assert (ours - want).abs().max() < (sglang_logits.float() - want).abs().max(), seed


def test_deepseek_fp32_moegate_hooked(monkeypatch):
    """SGLang's real MoEGate with an fp32 weight (router_fp32), through the AROUND hook on its forward."""
    monkeypatch.setenv("HPC_ADVISE_ROUTER_GEMM", "1")
    dv2 = import_sglang("sglang.srt.models.deepseek_v2")
    from hpc_advise.runtime.sglang import plugin, router

    plugin.register()
    seed, gen = fresh_seed()
    cfg = types.SimpleNamespace(n_routed_experts=64, hidden_size=1024, router_fp32=True, topk_method="greedy")
    gate = dv2.MoEGate(cfg, None)
    gate.weight.data.copy_(torch.randn(64, 1024, generator=gen) * 0.02)
    x = torch.randn(4, 1024, generator=gen).to(torch.bfloat16)
    got = gate(x)
    assert getattr(gate, router.MARK)[1] is not None, "our kernel did not serve the fp32 gate"
    assert_close_seeded(
        got, router.gate_reference(gate.weight, x), **_router_tolerance(x, gate.weight), seed=seed
    )


@pytest.mark.gpu
def test_hy3_fp32_gate_on_gpu():
    """Hy3's gate shape (192 experts x 4096, fp32 weight, fp32 input as hunyuan_v3 passes it) on the GPU
    through a real ReplicatedLinear with our forward: fp32-accurate against an fp64 product. With
    sgl-kernel missing: SGLang's module-level imports of it are met by tests/runtime/sglang/sgl_kernel_stand_in.py (import-only; nothing here calls it)."""
    import_sglang("sglang.srt.layers.linear")
    from sglang.srt.layers.linear import ReplicatedLinear

    from hpc_advise.runtime.sglang import router

    seed, _ = fresh_seed()
    gate = ReplicatedLinear(4096, 192, bias=False, params_dtype=torch.float32, quant_config=None).cuda()
    gate.weight.data.copy_(torch.randn(192, 4096, device="cuda") * 0.02)
    router.install_on_gate(gate)
    for m in (1, 128, 2048):
        x = torch.randn(m, 4096, device="cuda").to(torch.bfloat16).to(torch.float32)
        got, _ = gate(x)
        want = x.double() @ gate.weight.double().t()
        err = float(((got.double() - want).abs() / want.abs().clamp(min=1e-3)).median())
        assert err < 1e-5, (m, err, f"seed {seed}")


def test_sglang_plugins_whitelist_turns_us_off(monkeypatch):
    """SGLANG_PLUGINS is SGLang's whitelist: naming only other plugins keeps ours from being loaded."""
    plugins = import_sglang("sglang.srt.plugins")
    monkeypatch.setenv("SGLANG_PLUGINS", "some_other_plugin")
    assert "hpc_advise" not in plugins.load_plugins_by_group(plugins.GENERAL_PLUGINS_GROUP)
    monkeypatch.setenv("SGLANG_PLUGINS", "some_other_plugin,hpc_advise")
    assert "hpc_advise" in plugins.load_plugins_by_group(plugins.GENERAL_PLUGINS_GROUP)


def test_gates_prepared_after_weight_loading():
    """The loader hook splits every hooked gate's weight once after loading (never inside a capture)."""
    dv2 = import_sglang("sglang.srt.models.deepseek_v2")
    from sglang.srt.layers.linear import ReplicatedLinear

    from hpc_advise.runtime.sglang import router

    model = torch.nn.Module()
    model.qwen_gate = ReplicatedLinear(1024, 64, bias=False, params_dtype=torch.bfloat16, quant_config=None)
    router.install_on_gate(model.qwen_gate)
    cfg = types.SimpleNamespace(n_routed_experts=64, hidden_size=1024, router_fp32=True, topk_method="greedy")
    model.fp32_gate = dv2.MoEGate(cfg, None)
    cfg_bf16 = types.SimpleNamespace(
        n_routed_experts=64, hidden_size=1024, router_fp32=False, topk_method="greedy"
    )
    model.bf16_gate = dv2.MoEGate(cfg_bf16, None).to(
        torch.bfloat16
    )  # built under bf16 default dtype in SGLang
    seed, gen = fresh_seed()
    for p in model.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen))
    router.after_load_hook(None, model)
    for gate in (model.qwen_gate, model.fp32_gate):
        ptr, hi, lo = getattr(gate, router.MARK)
        assert ptr == gate.weight.data_ptr() and hi.dtype == lo.dtype == torch.bfloat16
        assert_close_seeded(
            hi.float() + lo.float() / 256, gate.weight.float(), atol=0, rtol=2**-15, seed=seed
        )
    assert not hasattr(model.bf16_gate, router.MARK)  # SGLang's bf16 MoEGate path is already exact


# A fresh process, in SGLang's order: plugins first (our register() logs its INFO line), then SGLang's
# configure_logger at --log-level info, our runtime's log lines, then again at --log-level warning.
_LOG_ORDER = r"""
import logging
from tests.runtime.sglang.helpers import import_sglang
import_sglang("sglang.srt.plugins", "sglang.srt.utils.common")
from sglang.srt.plugins import load_plugins
from sglang.srt.utils.common import configure_logger
load_plugins()
from hpc_advise.runtime.sglang import moe
for level in ("info", "warning"):
    class Args:
        log_level = level
    configure_logger(Args(), prefix=f" {level}")
    logging.getLogger("hpc_advise.runtime.sglang.moe").info("probe info line")
    moe.log_fallback_once("FusedMoE", f"probe reason at {level}")
    moe.log_fallback_once("FusedMoE", f"probe reason at {level}")
"""


def test_plugin_log_lines_reach_sglangs_log_at_its_level():
    """Before, register()'s INFO line was dropped (SGLang configures logging after loading plugins) and
    warnings before that came out bare."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, "-c", _LOG_ORDER], cwd=root, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    installed = [ln for ln in lines if "hpc_advise plugin: installed" in ln]
    assert len(installed) == 1 and installed[0].startswith("[20"), lines[-20:]  # SGLang's time prefix
    # through SGLang's own handler and format, at its level: the INFO line only at --log-level info
    assert [ln.split("] ")[0][-5:] for ln in lines if "probe info line" in ln] == [" info"], lines[-20:]
    for level in ("info", "warning"):
        fallback = [ln for ln in lines if f"probe reason at {level}" in ln]
        assert len(fallback) == 1 and f" {level}] " in fallback[0], lines[-20:]
