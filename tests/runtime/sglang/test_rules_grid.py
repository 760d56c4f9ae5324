"""Every candidate the advisor can emit, for every shipped model profile on H100, H200, H20, B200 and
A100 (8 GPUs), goes through real SGLang's ``prepare_server_args`` + ``resolve_once`` with our plugin's
resolution checks: none is refused. Plus the refusals themselves, one per wrong set-up, at resolution
(before any weight would load)."""

from __future__ import annotations

import pytest

from hpc_advise.advisor.candidates import enumerate_candidates, support_reason
from hpc_advise.advisor.launch import build_command
from hpc_advise.profiles import get_gpu, get_model, list_models
from tests.runtime.sglang import rules_helpers as RH

GPUS = ("h100", "h200", "h20", "b200", "a100")
# SGLang 0.5.23 registers its mxfp4 method only with CUDA kernels present: gpt-oss's checkpoint cannot
# be resolved on a CPU-only machine whatever the flags (checked below, so the skip cannot go stale).
CPU_UNRESOLVABLE = {"gpt-oss-120b": "Unknown quantization method: mxfp4"}


@pytest.fixture(scope="module")
def sglang(tmp_path_factory):
    prepare = RH.load()
    from hpc_advise.runtime.sglang import plugin

    assert "checks" in plugin.status()["features"], plugin.status()
    return prepare, tmp_path_factory.mktemp("models")


def _emitted(model, gpu):
    return [c for c in enumerate_candidates(model, 8) if support_reason(c, model, gpu) is None]


@pytest.mark.parametrize("key", sorted(m.key for m in list_models()))
def test_every_emitted_candidate_resolves(sglang, key):
    prepare, root = sglang
    model = get_model(key)
    path = RH.model_dir(root, key)
    if key in CPU_UNRESOLVABLE:
        with RH.gpu((9, 0)), pytest.raises(ValueError, match=CPU_UNRESOLVABLE[key]):
            RH.resolve(prepare, ["--model-path", path])
        pytest.skip(f"{key}: {CPU_UNRESOLVABLE[key]} on CPU-only SGLang")
    seen: set[tuple] = set()
    refused = []
    n = 0
    for g in GPUS:
        gpu = get_gpu(g)
        sm = tuple(gpu.compute_capability)
        for c in _emitted(model, gpu):
            args = build_command(c, path, model=model).argv[3:]
            if (sm, tuple(args)) in seen:  # H100/H200/H20 are one SGLang platform: same resolution
                continue
            seen.add((sm, tuple(args)))
            n += 1
            with RH.gpu(sm):
                try:
                    RH.resolve(prepare, args, fast=True)
                except Exception as exc:  # noqa: BLE001 - every refusal is collected, then reported
                    refused.append(f"{g} {c.label()}: {type(exc).__name__}: {exc}")
    assert n > 0
    kinds = sorted({r.split(": ", 1)[1] for r in refused})
    assert refused == [], f"{len(refused)} of {n} refused; causes: {kinds[:6]}; first: {refused[:2]}"


def test_parse_fast_is_prepare_server_args(sglang):
    prepare, root = sglang
    args = [
        "--model-path",
        RH.model_dir(root, "qwen3-30b-a3b"),
        "--tp-size",
        "8",
        "--ep-size",
        "8",
        *RH.FIXED,
    ]
    from sglang.srt.arg_groups.arg_utils import record_fields

    a, b = prepare(args), RH.parse_fast(args)
    names = [f.name for f in record_fields(type(a))]
    assert [getattr(a, n) for n in names] == [getattr(b, n) for n in names]


def _refused(sglang, key, args, sm=(9, 0)):
    prepare, root = sglang
    from hpc_advise.runtime.sglang.resolution import SetupRefused

    with RH.gpu(sm), pytest.raises(SetupRefused) as exc:
        RH.resolve(prepare, ["--model-path", RH.model_dir(root, key), *args], fast=True)
    assert "\n" not in str(exc.value)
    return str(exc.value)


OURS = ["--decode-attention-backend", "hpc_advise", "--page-size", "64"]


def test_resolution_refuses_mla_with_our_decode(sglang):
    assert "MLA" in _refused(sglang, "deepseek-v3", ["--tp-size", "8", *OURS])


def test_resolution_refuses_missing_page_size(sglang):
    why = _refused(sglang, "qwen3-32b", ["--tp-size", "8", "--decode-attention-backend", "hpc_advise"])
    assert "--page-size 64" in why


def test_resolution_refuses_ours_as_prefill_and_other_gpus(sglang):
    why = _refused(sglang, "qwen3-32b", ["--attention-backend", "hpc_advise", "--page-size", "64"])
    assert "decode-only" in why and "--decode-attention-backend hpc_advise" in why
    assert "sm100" in _refused(sglang, "qwen3-32b", ["--attention-backend", "flashinfer", *OURS], sm=(10, 0))


def test_resolution_refuses_ray_with_our_backends(sglang):
    assert "--use-ray" in _refused(sglang, "qwen3-32b", [*OURS, "--use-ray"])


def test_moe_runner_falls_back_to_auto_for_other_quant_methods(sglang):
    """Kimi-K2.5's compressed-tensors experts are not Fp8MoEMethod: our runner name becomes SGLang's auto
    at resolution (before, the layer got no runner and failed at the first forward)."""
    prepare, root = sglang
    from sglang.srt.arg_groups.model_override_base import resolved_view

    path = RH.model_dir(root, "kimi-k2.5")
    with RH.gpu((9, 0)):
        sa = RH.resolve(
            prepare, ["--model-path", path, "--tp-size", "8", "--moe-runner-backend", "hpc_advise"], fast=True
        )
    assert resolved_view(sa).moe_runner_backend == "auto"
    with RH.gpu((9, 0)):  # FP8 block experts (DeepSeek-V3) keep ours
        sa = RH.resolve(prepare, ["--model-path", RH.model_dir(root, "deepseek-v3"), "--tp-size", "8",
                                  "--moe-runner-backend", "hpc_advise"], fast=True)  # fmt: skip
    assert resolved_view(sa).moe_runner_backend == "hpc_advise"
