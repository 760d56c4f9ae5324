"""The ``hpc_advise`` attention backend on SGLang's MLA pool (DeepSeek-V2/V3), against SGLang's own
``torch_native`` backend reading the same pool.

The objects are SGLang's real ones: ``MLATokenToKVPool`` (one ``[512 latent | 64 rope]`` row per token),
``ReqToTokenPool`` with scattered pages, ``RadixAttention`` layers shaped as ``DeepseekV2AttentionMLA``'s
``attn_mqa`` (``qk_head_dim`` 576, ``v_head_dim`` 512, one KV head) and a DECODE ``ForwardBatch``; the
runner is a namespace of what the backends' constructors read (a ``ModelRunner`` cannot be built on
CPU). The decode step is the one the model runs for a triton-like backend: q and k concatenated (latent,
then rope), v the latent part of k, ``save_kv_cache=True``. Our kernel runs under the Triton interpreter
(small shapes: 16 heads, a few requests, lengths up to 150).
"""

from __future__ import annotations

import math
import types

import pytest
import torch

from tests.runtime.sglang.helpers import assert_close_seeded, fresh_seed
from tests.runtime.sglang.test_attention import (
    _batch,
    _sglang,
    graph_path_decode,
    graph_replays_match_eager,
    model_config,
    pool_args,
    runner_of,
)

LORA, ROPE = 512, 64
WIDTH = LORA + ROPE
HEADS = 16
SCALE = 192**-0.5  # DeepSeek-V3's softmax scale over qk_nope 128 + rope 64 (before YaRN's mscale)
# bf16 inputs, fp32 accumulation in both backends; output rounded to bf16 (2^-8 relative)
ATOL, RTOL = 2e-2, 2e-2


def _parallel(sg):
    """One attention-TP rank, no decode context parallelism (the MLA pool's store asks for both)."""
    return sg.get_parallel().override(attn_tp_size=1, attn_dcp_size=1, dcp_enabled=False)


def _mla_runner(
    sg, *, pages, page_size, reqs, context, kv_dtype=torch.bfloat16, heads=HEADS, pool_cls=None, device="cpu"
):
    pool = (pool_cls or sg.mp.MLATokenToKVPool)(
        kv_lora_rank=LORA, qk_rope_head_dim=ROPE, **pool_args(pages, page_size, kv_dtype, device)
    )
    # head_dim: qk_nope 128 + rope 64, as SGLang's ModelConfig has it for DeepSeek-V3
    cfg = model_config(
        q_heads=heads, kv_heads=heads, head_dim=192, context=context, kv_lora_rank=LORA, qk_rope_head_dim=ROPE
    )
    return runner_of(sg, pool, cfg, reqs=reqs, mla=True)


def _mla_layers(sg, n=2, heads=HEADS):
    """``attn_mqa`` of DeepseekV2AttentionMLA: heads x 576 against one latent row, output 512 per head."""
    return [sg.RadixAttention(heads, WIDTH, SCALE, 1, layer_id=i, v_head_dim=LORA) for i in range(n)]


def _fill_mla(runner, layers, seq_lens, gen):
    """Scatter each request's pages over the pool and store random rows for all but its last token
    through the pool's ``set_kv_buffer``; returns (req_pool_indices, out_cache_loc of the new tokens)."""
    pool, req, page, dev = runner.token_to_kv_pool, runner.req_to_token_pool, runner.page_size, runner.device
    perm = torch.randperm(pool.size // page - 1, generator=gen) + 1  # page 0 holds the padding slot
    rows, used = [], 0
    for b, n in enumerate(seq_lens):
        npages = math.ceil(n / page)
        pages = perm[used : used + npages]
        used += npages
        slots = (pages[:, None] * page + torch.arange(page)[None, :]).reshape(-1)[:n]
        req.req_to_token[b + 1, :n] = slots.to(torch.int32).to(dev)
        rows.append(b + 1)
        for layer in layers:
            rows_kv = torch.randn(n - 1, 1, WIDTH, generator=gen).to(torch.bfloat16).to(dev)
            pool.set_kv_buffer(layer, slots[: n - 1].to(torch.int64).to(dev), rows_kv, rows_kv[..., :LORA])
    idx = torch.tensor(rows, dtype=torch.int64, device=dev)
    last = torch.stack([req.req_to_token[r, n - 1] for r, n in zip(rows, seq_lens, strict=True)]).to(
        torch.int64
    )
    return idx, last


def _step_inputs(n, gen, heads=HEADS, device="cpu"):
    """q ``[n, heads * 576]`` (absorbed q_nope, then q_pe) and the new token's row k ``[n, 1, 576]``."""
    q = torch.randn(n, heads * WIDTH, generator=gen).to(torch.bfloat16)
    k = torch.randn(n, 1, WIDTH, generator=gen).to(torch.bfloat16)
    return q.to(device), k.to(device)


@pytest.mark.parametrize(
    ("page_size", "seq_lens"), [(16, [1, 70, 150]), (64, [129, 2, 64])], ids=["p16", "p64"]
)
def test_mla_decode_step_matches_torch_native_and_stores_the_new_row(page_size, seq_lens):
    sg = _sglang()
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend

    seed, gen = fresh_seed()
    pages = sum(math.ceil(n / page_size) for n in seq_lens) + 2
    with _parallel(sg):
        runner = _mla_runner(sg, pages=pages, page_size=page_size, reqs=4, context=256)
        layers = _mla_layers(sg)
        idx, out_loc = _fill_mla(runner, layers, seq_lens, gen)
        fb = _batch(sg, idx, seq_lens, out_loc)
        ours, ref = HpcAdviseAttnBackend(runner), sg.TorchNative(runner)
        ours.init_forward_metadata(fb)
        ref.init_forward_metadata(fb)
        pool = runner.token_to_kv_pool
        others = torch.ones(pool.get_key_buffer(0).shape[0], dtype=torch.bool)
        others[out_loc] = False
        for layer in layers:
            q, k = _step_inputs(len(seq_lens), gen)
            before = pool.get_key_buffer(layer.layer_id).clone()
            got = ours.forward_decode(q, k.clone(), k[..., :LORA].clone(), layer, fb).float()
            after = pool.get_key_buffer(layer.layer_id)
            assert torch.equal(after[out_loc], k), (layer.layer_id, seed)  # the new row, latent and rope
            assert torch.equal(after[others], before[others]), (layer.layer_id, seed)
            want = ref.forward_decode(q, None, None, layer, fb, save_kv_cache=False).float()
            assert got.shape == want.shape == (len(seq_lens), HEADS * LORA)
            assert torch.isfinite(got).all(), seed
            assert_close_seeded(got, want, atol=ATOL, rtol=RTOL, seed=seed)


def test_mla_graph_metadata_and_chunked_eager_paths_match_eager():
    """The graph path (one plan_mla sized for the largest captured batch, refilled in the graph) on a
    batch padded as SGLang's decode graph runner pads it, and an eager batch above one plan's batch limit
    (run in chunks of plans; 2 here so the test stays small): the real rows equal the one-plan eager step's."""
    sg = _sglang()
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend

    seed, gen = fresh_seed()
    seq_lens = [40, 100, 7]
    with _parallel(sg):
        runner = _mla_runner(sg, pages=12, page_size=16, reqs=4, context=256)
        (layer,) = _mla_layers(sg, n=1)
        idx, out_loc = _fill_mla(runner, [layer], seq_lens, gen)
        q, _ = _step_inputs(len(seq_lens) + 1, gen)
        eager = HpcAdviseAttnBackend(runner)
        fb = _batch(sg, idx, seq_lens, out_loc)
        eager.init_forward_metadata(fb)
        want = eager.forward_decode(q[:3], None, None, layer, fb, save_kv_cache=False).float()
        got = graph_path_decode(sg, runner, layer, idx, seq_lens, out_loc, q, pad=1)
        chunked = HpcAdviseAttnBackend(runner)
        chunked.max_plan_batch = 2
        chunked.init_forward_metadata(fb)
        assert [(a, b) for a, b, _ in chunked.forward_metadata] == [(0, 2), (2, 3)]
        parts = chunked.forward_decode(q[:3], None, None, layer, fb, save_kv_cache=False).float()
    assert got.shape == (4, HEADS * LORA) and torch.isfinite(got).all(), seed
    assert_close_seeded(got[:3], want, atol=ATOL, rtol=RTOL, seed=seed)
    assert_close_seeded(parts, want, atol=ATOL, rtol=RTOL, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("heads", "page_size"), [(16, 64), (128, 64), (16, 1)], ids=["tp8-p64", "tp1-p64", "tp8-p1"]
)
def test_mla_decode_step_matches_torch_native_at_deepseek_shapes_on_gpu(heads, page_size):
    """Real sizes on the GPU: DeepSeek-V3's rank at TP8 (16 heads) and TP1 (128), lengths up to 8K, pages of
    64 and of 1 token; the step stores the new row through the pool (SGLang's CUDA pool) and must match
    torch_native reading the pool afterwards. SGLang's triton backend needs a full ModelRunner: the real
    DeepseekV2 layer against it is test_deepseek_layer_gpu.py."""
    sg = _sglang()
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend

    seed, gen = fresh_seed()
    seq_lens = [8192, 17, 1000, 64 * 30 + 1, 4096, 1]
    pages = sum(math.ceil(n / page_size) for n in seq_lens) + 4
    with _parallel(sg):
        runner = _mla_runner(
            sg, pages=pages, page_size=page_size, reqs=8, context=8192, heads=heads, device="cuda"
        )
        layers = _mla_layers(sg, heads=heads)
        idx, out_loc = _fill_mla(runner, layers, seq_lens, gen)
        fb = _batch(sg, idx, seq_lens, out_loc)
        ours, ref = HpcAdviseAttnBackend(runner), sg.TorchNative(runner)
        ours.init_forward_metadata(fb)
        ref.init_forward_metadata(fb)
        for layer in layers:
            q, k = _step_inputs(len(seq_lens), gen, heads=heads, device="cuda")
            got = ours.forward_decode(q, k.clone(), k[..., :LORA].clone(), layer, fb).float()
            assert torch.equal(runner.token_to_kv_pool.get_key_buffer(layer.layer_id)[out_loc], k), seed
            want = ref.forward_decode(q, None, None, layer, fb, save_kv_cache=False).float()
            assert torch.isfinite(got).all(), seed
            assert_close_seeded(got, want, atol=ATOL, rtol=RTOL, seed=seed)


@pytest.mark.gpu
def test_mla_cuda_graph_capture_and_replay_on_gpu():
    """Metadata-in-graph + one MLA layer's decode captured in a CUDA graph, replayed with other lengths and
    requests (as SGLang's decode graph runner does), against eager steps."""
    sg = _sglang()
    seed, gen = fresh_seed()
    with _parallel(sg):
        runner = _mla_runner(sg, pages=200, page_size=64, reqs=8, context=4096, device="cuda")
        (layer,) = _mla_layers(sg, n=1)
        lens_a = [3000, 5, 700, 64]
        idx_a, loc_a = _fill_mla(runner, [layer], lens_a, gen)
        graph_replays_match_eager(sg, runner, layer, idx_a, lens_a, loc_a, HEADS * WIDTH, seed)


def test_fp8_mla_kv_is_refused_with_the_dispatch_reason():
    sg = _sglang()
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend, HpcAdviseBackendError

    with _parallel(sg):
        runner = _mla_runner(sg, pages=4, page_size=64, reqs=2, context=128, kv_dtype=torch.float8_e4m3fn)
        with pytest.raises(HpcAdviseBackendError, match="fp8_e4m3 KV on MLA: our MLA decode reads bf16"):
            HpcAdviseAttnBackend(runner)


def test_unsupported_mla_variants_are_refused():
    """Heads per rank the MLA form cannot plan, the DSA / fp4 pools (subclasses of the MLA pool) and
    page sizes the kernel has no form for: each fails when the backend is built, with its reason."""
    sg = _sglang()
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend, HpcAdviseBackendError

    class DsaLike(sg.mp.MLATokenToKVPool):
        pass

    with _parallel(sg):
        with pytest.raises(HpcAdviseBackendError, match="MLA with 24 query heads per rank"):
            HpcAdviseAttnBackend(_mla_runner(sg, pages=4, page_size=64, reqs=2, context=128, heads=24))
        with pytest.raises(HpcAdviseBackendError, match="DsaLike is not SGLang's plain MLATokenToKVPool"):
            HpcAdviseAttnBackend(
                _mla_runner(sg, pages=4, page_size=64, reqs=2, context=128, pool_cls=DsaLike)
            )
        with pytest.raises(HpcAdviseBackendError, match="page size 32: our MLA decode takes"):
            HpcAdviseAttnBackend(_mla_runner(sg, pages=4, page_size=32, reqs=2, context=128))
        runner = _mla_runner(sg, pages=4, page_size=64, reqs=2, context=128)
        runner.model_config.qk_rope_head_dim = 32
        with pytest.raises(HpcAdviseBackendError, match="MLA latent 512 \\+ rope 32"):
            HpcAdviseAttnBackend(runner)


def test_mla_layer_kwargs_of_other_backends_are_refused():
    """The split rope part (``q_rope``/``k_rope``, what the model passes to fa3/flashinfer) and sparse
    indices never reach a triton-like backend; if they do, the step fails instead of attending wrong."""
    sg = _sglang()
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend, HpcAdviseBackendError

    _, gen = fresh_seed()
    with _parallel(sg):
        runner = _mla_runner(sg, pages=4, page_size=64, reqs=2, context=128)
        (layer,) = _mla_layers(sg, n=1)
        idx, out_loc = _fill_mla(runner, [layer], [5], gen)
        fb = _batch(sg, idx, [5], out_loc)
        ours = HpcAdviseAttnBackend(runner)
        ours.init_forward_metadata(fb)
        q, k = _step_inputs(1, gen)
        with pytest.raises(HpcAdviseBackendError, match="passes q_rope, k_rope"):
            ours.forward_decode(q, k, k[..., :LORA], layer, fb, q_rope=q, k_rope=k)
        layer.k_scale_float = 0.5
        with pytest.raises(HpcAdviseBackendError, match="KV scale k = 0.5"):
            ours.forward_decode(q, k, k[..., :LORA], layer, fb)


def test_deepseek_dispatch_takes_the_absorbed_triton_path_for_our_name():
    """The facts the MLA path rests on, in SGLang 0.5.23's DeepseekV2 code: ``dispatch_attn_forward_method``
    names a decode batch's backend by the decode name the hybrid backend carries (ours), the registry
    gives a name it does not know the triton handler, which sends decode to the absorbed MLA method, and
    our name is not one of the backends the model hands the rope part separately (q_rope/k_rope)."""
    sg = _sglang()
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.models.deepseek_common import attention_backend_handler as H
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod
    from sglang.srt.models.deepseek_common.utils import FORWARD_ABSORB_CORE_ATTENTION_BACKENDS
    from sglang.srt.models.deepseek_v2 import DeepseekV2AttentionMLA
    from sglang.srt.runtime_context import create_context, use_context
    from sglang.srt.server_args import ServerArgs

    from hpc_advise.runtime.sglang.attention import NAME

    assert H.AttentionBackendRegistry.get_handler(NAME) is H.handle_attention_triton
    assert NAME not in FORWARD_ABSORB_CORE_ATTENTION_BACKENDS
    hybrid = types.SimpleNamespace(prefill_attention_backend_str="triton", decode_attention_backend_str=NAME)
    attn = types.SimpleNamespace(current_attention_backend=None)
    fb = _batch(sg, torch.tensor([1]), [5], torch.tensor([5]))
    ctx = create_context(ServerArgs(model_path="dummy", device="cpu"), role="scheduler")
    with use_context(ctx), forward_context(ForwardContext(attn_backend=hybrid)):
        method = DeepseekV2AttentionMLA.dispatch_attn_forward_method(attn, fb)
    assert method == AttnForwardMethod.MLA
    assert attn.current_attention_backend == NAME
