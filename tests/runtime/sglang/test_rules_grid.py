"""Every candidate the advisor can emit, for every shipped model profile on H100, H200, H20, B200 and
A100 (8 GPUs), goes through real SGLang's ``prepare_server_args`` + ``resolve_once`` with our plugin's
resolution checks, SGLang seeing the profile's compute capability and memory: none is refused. The same
for what ``recommend`` emits on each example trace (``examples/traces``), after the advisor's memory
check: none is refused, and the weights + KV the advisor planned fit in the static memory SGLang
resolves for that command (``mem_fraction_static``, ``arg_groups/memory_hook.py``), which the advisor's
``rules.static_memory_fraction`` must equal for every command. Each distinct
command is resolved once per GPU and shared by both grids. Plus the refusals themselves, one per wrong
set-up, at resolution (before any weight would load)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_advise import rules
from hpc_advise.advisor.candidates import check_all, enumerate_candidates, setup_of, support_reason
from hpc_advise.advisor.launch import build_command
from hpc_advise.profiles import get_gpu, get_model, list_models
from tests.advisor.advisor_helpers import advisor_home  # noqa: F401 - fixture
from tests.runtime.sglang import rules_helpers as RH

GPUS = ("h100", "h200", "h20", "b200", "a100")
N_GPUS = 8
TRACES = Path(__file__).resolve().parents[3] / "examples" / "traces"
EXAMPLE_TRACES = ("agentic_coding.jsonl", "chat_uniform.csv", "bursty.csv")
# SGLang 0.5.23 registers its mxfp4 method only with CUDA kernels present: gpt-oss's checkpoint cannot
# be resolved on a CPU-only machine whatever the flags (checked below, so the skip cannot go stale).
CPU_UNRESOLVABLE = {"gpt-oss-120b": "Unknown quantization method: mxfp4"}
# (compute capability, memory GiB, argv) -> SGLang's resolved mem_fraction_static, or the refusal line
_RESOLVED: dict[tuple, float | str] = {}


@pytest.fixture(scope="module")
def sglang(tmp_path_factory):
    import logging

    prepare = RH.load()
    from hpc_advise.runtime.sglang import plugin

    assert "checks" in plugin.status()["features"], plugin.status()
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # SGLang's INFO/WARNING lines, once for the module
    yield prepare, tmp_path_factory.mktemp("models")
    logging.disable(previous)


def _emitted(model, gpu):
    return [c for c in enumerate_candidates(model, N_GPUS) if support_reason(c, model, gpu) is None]


def _resolution(prepare, gpu, args: list[str]) -> float | str:
    """SGLang's ``mem_fraction_static`` for ``args`` on ``gpu``, or why SGLang / our plugin refused."""
    from sglang.srt.arg_groups.model_override_base import resolved_view

    sm = tuple(gpu.compute_capability)
    key = (sm, gpu.memory_gib, tuple(args))
    if key not in _RESOLVED:
        with RH.gpu(sm, gpu.memory_gib):
            try:
                sa = RH.resolve(prepare, args, fast=True)
                _RESOLVED[key] = float(resolved_view(sa).mem_fraction_static)
            except Exception as exc:  # noqa: BLE001 - every refusal is collected, then reported
                _RESOLVED[key] = f"{type(exc).__name__}: {exc}"
    return _RESOLVED[key]


def _skip_unresolvable(prepare, path, key):
    if key in CPU_UNRESOLVABLE:
        with RH.gpu((9, 0)), pytest.raises(ValueError, match=CPU_UNRESOLVABLE[key]):
            RH.resolve(prepare, ["--model-path", path])
        pytest.skip(f"{key}: {CPU_UNRESOLVABLE[key]} on CPU-only SGLang")


def _report(refused: list[str], n: int) -> str:
    kinds = sorted({r.split(": ", 1)[1] for r in refused})
    return f"{len(refused)} of {n} refused; causes: {kinds[:6]}; first: {refused[:2]}"


@pytest.mark.parametrize("key", sorted(m.key for m in list_models()))
def test_every_emitted_candidate_resolves(sglang, key):
    prepare, root = sglang
    model = get_model(key)
    path = RH.model_dir(root, key)
    _skip_unresolvable(prepare, path, key)
    refused, fractions = [], []
    n = 0
    for g in GPUS:
        gpu = get_gpu(g)
        for c in _emitted(model, gpu):
            n += 1
            got = _resolution(prepare, gpu, build_command(c, path, model=model).argv[3:])
            if isinstance(got, str):
                refused.append(f"{g} {c.label()}: {got}")
                continue
            # the advisor's memory check counts on the static memory SGLang resolves for this command
            mine = rules.static_memory_fraction(
                setup_of(c), gpu.memory_gib, mla=model.attention == "mla", vision=rules.vision_tower(model)
            )
            if abs(mine - got) > 1e-9:
                fractions.append(f"{g} {c.label()}: advisor {mine}, SGLang {got}")
    assert n > 0
    assert refused == [], _report(refused, n)
    assert fractions == [], f"{len(fractions)} of {n}: mem_fraction_static differs: {fractions[:3]}"


@pytest.fixture(scope="module")
def rankers(advisor_home):  # noqa: F811
    from hpc_advise.advisor import serving_model as pm
    from hpc_advise.advisor.kernel_models import load_attention_model

    serving, _ = pm.load_or_fit()
    return serving, load_attention_model()


@pytest.mark.parametrize("trace", EXAMPLE_TRACES)
def test_every_candidate_emitted_for_an_example_trace_resolves_and_fits(sglang, rankers, trace):
    """What ``recommend --trace <example> --gpus 8`` can rank (support rules and the memory check at
    the most requests it places on a replica for that trace) for every model and GPU profile."""
    from hpc_advise.advisor.recommend import Ranker, TraceLoad
    from hpc_advise.advisor.traces import summarize

    prepare, root = sglang
    serving, attn = rankers
    w = TraceLoad.from_summary(summarize(str(TRACES / trace)))
    refused, unfit = [], []
    n = 0
    for model in list_models():
        if model.key in CPU_UNRESOLVABLE:
            continue
        path = RH.model_dir(root, model.key)
        for g in GPUS:
            gpu = get_gpu(g)
            ranker = Ranker(model.key, model, gpu, w, serving, attn)
            # Ranker.concurrency holds every candidate at or below its KV limit (1 when even one request
            # per group does not fit) at any load the capacity search tries: the memory check at that
            # limit is the largest plan it can print for this trace
            conc = {c: max(ranker.kv_limit(c), 1.0) for c in _emitted(model, gpu)}
            checked = check_all(model, gpu, N_GPUS, conc.__getitem__, w.ctx_mean, w.ctx_p99)
            for chk in (chk for chk in checked if chk.ok):
                n += 1
                label = f"{model.key} {g} {chk.candidate.label()}"
                got = _resolution(prepare, gpu, build_command(chk.candidate, path, model=model).argv[3:])
                if isinstance(got, str):
                    refused.append(f"{label}: {got}")
                    continue
                planned = chk.memory["weights_gib"] + chk.memory["kv_gib"]
                if planned > got * gpu.memory_gib:
                    unfit.append(f"{label}: {planned:.1f} GiB planned, SGLang's static {got * gpu.memory_gib:.1f}")
    assert n > 100  # every model that fits 8 GPUs of some profile contributes
    assert refused == [], _report(refused, n)
    assert unfit == [], f"{len(unfit)} of {n} do not fit SGLang's static memory: {unfit[:3]}"


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


def test_resolution_keeps_our_mla_decode_and_refuses_its_unsupported_forms(sglang):
    """DeepSeek-V3 with bf16 KV resolves with our decode backend (its MLA form) beside SGLang's triton
    prefill; fp8 KV, DSA (GLM-5) and decode context parallelism are refused at resolution, with why."""
    from sglang.srt.arg_groups.model_override_base import attention_backends_of, resolved_view

    prepare, root = sglang
    args = ["--model-path", RH.model_dir(root, "deepseek-v3"), "--tp-size", "8", *OURS,
            "--prefill-attention-backend", "triton"]  # fmt: skip
    with RH.gpu((9, 0), 141):
        sa = RH.resolve(prepare, args, fast=True)
    assert attention_backends_of(resolved_view(sa)) == ("triton", "hpc_advise")
    fp8 = _refused(sglang, "deepseek-v3", ["--tp-size", "8", *OURS, "--kv-cache-dtype", "fp8_e4m3"])
    assert "fp8_e4m3 KV on MLA" in fp8
    assert "DSA sparse MLA" in _refused(sglang, "glm-5", ["--tp-size", "8", *OURS])
    assert "--dcp-size 2" in _refused(sglang, "deepseek-v3", ["--tp-size", "8", *OURS, "--dcp-size", "2"])


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


def test_resolution_refuses_mixed_chunk_with_our_decode(sglang):
    why = _refused(sglang, "qwen3-32b", ["--tp-size", "8", *OURS, "--enable-mixed-chunk"])
    assert "--enable-mixed-chunk" in why and "prefill" in why


def test_mixed_batches_go_to_the_prefill_backend_in_sglang():
    """The fact the mixed-chunk refusal rests on: SGLang's HybridAttnBackend (our decode backend beside
    its prefill backend) hands MIXED batches to the prefill backend, DECODE ones to ours."""
    from sglang.srt.layers.attention.hybrid_attn_backend import HybridAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    hybrid = object.__new__(HybridAttnBackend)
    hybrid.prefill_backend, hybrid.decode_backend = "prefill", "decode"
    hybrid.spec_attn_is_decode = False
    assert hybrid._select_backend(ForwardMode.MIXED) == "prefill"
    assert hybrid._select_backend(ForwardMode.DECODE) == "decode"


def test_resolution_refuses_pdmux_with_our_decode(sglang):
    pdmux = ["--enable-pdmux", "--chunked-prefill-size", "-1", "--disable-overlap-schedule"]
    assert "--enable-pdmux" in _refused(sglang, "qwen3-32b", ["--tp-size", "8", *OURS, *pdmux])


@pytest.mark.parametrize(
    "extra",
    [["--enable-two-batch-overlap"], ["--cuda-graph-backend-decode", "breakable"]],
    ids=["two-batch-overlap", "breakable-decode-graph"],
)
def test_resolution_keeps_our_decode_with(sglang, extra):
    """Two-batch overlap and breakable decode graphs run our backend (tests/runtime/sglang/
    test_attention.py: the TBO children and the breakable decode path); resolution keeps it."""
    from sglang.srt.arg_groups.model_override_base import attention_backends_of, resolved_view

    prepare, root = sglang
    args = ["--model-path", RH.model_dir(root, "qwen3-30b-a3b"), "--tp-size", "8", "--ep-size", "8", *OURS, *extra]
    with RH.gpu((9, 0), 141):
        sa = RH.resolve(prepare, args, fast=True)
    assert attention_backends_of(resolved_view(sa))[1] == "hpc_advise"


@pytest.mark.parametrize("a2a", ["deepep", "mooncake", "nixl"])
def test_moe_runner_falls_back_to_auto_under_all_to_all(sglang, a2a):
    """Our runner takes the standard dispatch only: under an all-to-all backend it becomes SGLang's auto
    (which picks deep_gemm for DeepEP) at resolution, instead of crashing at the first MoE forward."""
    from sglang.srt.arg_groups.model_override_base import resolved_view

    prepare, root = sglang
    args = ["--model-path", RH.model_dir(root, "deepseek-v3"), "--tp-size", "8", "--ep-size", "8",
            "--moe-a2a-backend", a2a, "--moe-runner-backend", "hpc_advise"]  # fmt: skip
    with RH.gpu((9, 0), 141):
        sa = RH.resolve(prepare, args, fast=True)
    assert resolved_view(sa).moe_runner_backend == "auto"


@pytest.mark.parametrize(
    ("name", "qc"),
    [
        ("modelopt-fp8", {"quant_method": "modelopt", "quant_algo": "FP8"}),
        ("modelopt-nvfp4", {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}),
        ("compressed-tensors-fp8", None),
    ],
)
def test_moe_runner_falls_back_to_auto_for_foreign_fp8_and_fp4(sglang, tmp_path, name, qc):
    """ModelOpt FP8 / NVFP4 and compressed-tensors W8A8-FP8 checkpoints (hand-written config.json with
    Qwen3-30B-A3B's shapes): SGLang builds their own MoE methods, so our runner name becomes auto."""
    import json

    from sglang.srt.arg_groups.model_override_base import resolved_view

    from tests.advisor.test_rules_quant import BASE, COMPRESSED

    prepare, _ = sglang
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "quantization_config": qc or COMPRESSED}))
    with RH.gpu((9, 0), 141):
        sa = RH.resolve(prepare, ["--model-path", str(tmp_path), "--tp-size", "8", "--moe-runner-backend",
                                  "hpc_advise"], fast=True)  # fmt: skip
    assert resolved_view(sa).moe_runner_backend == "auto"
