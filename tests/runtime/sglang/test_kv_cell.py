"""``rules.kv_cell_bytes`` equals real SGLang 0.5.23's per-token KV cell size
(``model_executor/pool_configurator.DefaultPoolConfigurator._compute_cell_size``) for every shipped
model profile SGLang can configure on CPU, at attention-TP 1-16, bf16 / FP8 KV, with the DSA backend
SGLang picks for FP8 KV on Hopper and on Blackwell. SGLang's
``ModelConfig`` is built from the profile's config.json; the runtime context it reads (parallel sizes,
memory and kernel options, disaggregation mode) is SGLang's default set-up with DCP, context parallelism,
HiSparse and disaggregation off, given as stand-ins since no server publishes it here. The layer count
is SGLang's own (``mambaish_config``'s full-attention layers for hybrid models)."""

from __future__ import annotations

import contextlib
import types
from unittest import mock

import pytest

from hpc_advise import rules
from hpc_advise.profiles import get_model, list_models
from tests.runtime.sglang import rules_helpers as RH
from tests.runtime.sglang.helpers import import_sglang

# SGLang 0.5.23 registers its mxfp4 method only with CUDA kernels present (see test_rules_grid.py).
CPU_UNRESOLVABLE = {"gpt-oss-120b"}


class _Off:
    """An options bag whose every flag is off (False)."""

    def __getattr__(self, name):
        return False


# SGLang's default DSA backends for FP8 KV (arg_groups/overrides.py): Hopper flashmla_kv, Blackwell trtllm
DSA_FP8_BACKEND = {9: "flashmla_kv", 10: "trtllm"}


def _sglang_cell(mc, attn_tp: int, dtype, sm_major: int) -> int:
    import sglang.srt.layers.cp.utils as CU
    import sglang.srt.mem_cache.kv_cache_configurator as KC
    from sglang.srt.configs.hybrid_arch import mambaish_config
    from sglang.srt.configs.model_config import AttentionArch
    from sglang.srt.model_executor import pool_configurator as PC

    par = types.SimpleNamespace(
        attn_tp_size=attn_tp, attn_dcp_size=1, attn_cp_size=1, enable_dsa_cache_layer_split=False
    )
    backend = DSA_FP8_BACKEND[sm_major]
    kernel = types.SimpleNamespace(dsa_prefill_backend=backend, dsa_decode_backend=backend)
    mambaish = mambaish_config(mc)
    layers = mc.num_hidden_layers if mambaish is None else len(mambaish.full_attention_layer_ids)
    kvc = types.SimpleNamespace(
        model_config=mc,
        kv_cache_dtype=dtype,
        kv_cache_dtype_str="auto",
        use_mla_backend=mc.attention_arch == AttentionArch.MLA,
        is_draft_worker=False,
        mambaish_config=mambaish,
        server_args=_Off(),
        layer_info=types.SimpleNamespace(
            start_layer=0, end_layer=mc.num_hidden_layers, num_effective_layers=mc.num_hidden_layers
        ),
    )
    configurator = object.__new__(PC.DefaultPoolConfigurator)
    configurator.kv_cache_dtype_str = "auto"
    with contextlib.ExitStack() as stack:
        for mod in (PC, CU):
            stack.enter_context(mock.patch.object(mod, "get_parallel", lambda: par))
        stack.enter_context(mock.patch.object(PC, "get_memory", _Off))
        stack.enter_context(mock.patch.object(KC, "get_memory", _Off))
        stack.enter_context(mock.patch.object(KC, "get_exec", lambda: types.SimpleNamespace(kernel=kernel)))
        stack.enter_context(
            mock.patch.object(KC, "get_disagg", lambda: types.SimpleNamespace(disaggregation_mode="null"))
        )
        return configurator._compute_cell_size(kvc, layers)


@pytest.mark.parametrize("key", [m.key for m in list_models() if m.key not in CPU_UNRESOLVABLE])
def test_cell_size_equals_sglangs(key, tmp_path):
    import_sglang("sglang.srt.configs.model_config")
    import torch
    from sglang.srt.configs.model_config import ModelConfig

    mc = ModelConfig(RH.model_dir(tmp_path, key))
    model = get_model(key)
    for sm_major in DSA_FP8_BACKEND:
        for attn_tp in (1, 2, 4, 8, 16):
            for dtype, nbytes in ((torch.bfloat16, 2.0), (torch.float8_e4m3fn, 1.0)):
                want = _sglang_cell(mc, attn_tp, dtype, sm_major)
                got = rules.kv_cell_bytes(model, attn_tp, nbytes, sm_major)
                assert got == want, (sm_major, attn_tp, dtype)


def test_gpt_oss_still_cannot_be_configured_on_cpu(tmp_path):
    import_sglang("sglang.srt.configs.model_config")
    from sglang.srt.configs.model_config import ModelConfig

    with pytest.raises(ValueError, match="mxfp4"):
        ModelConfig(RH.model_dir(tmp_path, "gpt-oss-120b"))
