"""The ``hpc_advise`` attention backend against SGLang's own ``torch_native`` backend.

Both backends run on the same real SGLang objects: ``MHATokenToKVPool`` (bf16, and fp8 stored as
uint8 the way SGLang stores it), ``ReqToTokenPool`` with scattered pages, ``RadixAttention`` layers
and a DECODE ``ForwardBatch``. A ``ModelRunner`` cannot be built on CPU (it loads weights and
initialises CUDA/NCCL), so the runner passed to the backends is a namespace holding exactly what their
constructors read: the two real pools, device, page size, KV dtype and the model config. The model
config is SGLang's real ``ModelConfig`` (from a tiny local config.json, through ``prepare_server_args``
and a published runtime context) in the end-to-end tests, and a namespace with the same four fields in
the unit tests, which set the attention-TP width with SGLang's own ``get_parallel().override``. Our
kernel runs under the Triton interpreter on CPU (small shapes).
"""

from __future__ import annotations

import math
import types

import pytest
import torch

from tests.runtime.sglang.helpers import assert_close_seeded, fresh_seed, import_sglang, tiny_model_dir

PAGE = 64
HEAD_DIM = 64
# bf16 inputs, fp32 accumulation in both backends; output rounded to bf16 (2^-8 relative)
ATOL, RTOL = 2e-2, 2e-2


def _sglang():
    mp = import_sglang("sglang.srt.mem_cache.memory_pool")
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return types.SimpleNamespace(
        mp=mp,
        TorchNative=TorchNativeAttnBackend,
        RadixAttention=RadixAttention,
        ForwardBatch=ForwardBatch,
        ForwardMode=ForwardMode,
        get_parallel=get_parallel,
        Spec=SpeculativeAlgorithm,
    )


def _runner(
    sg,
    *,
    q_heads,
    kv_heads,
    kv_dtype,
    pages,
    reqs,
    context,
    page_size=PAGE,
    prefill=None,
    head_dim=HEAD_DIM,
    device="cpu",
):
    kv_pool = sg.mp.MHATokenToKVPool(
        head_num=kv_heads, head_dim=head_dim, **pool_args(pages, page_size, kv_dtype, device)
    )
    cfg = model_config(q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, context=context)
    return runner_of(sg, kv_pool, cfg, reqs=reqs, prefill=prefill)


def pool_args(pages, page_size, kv_dtype, device) -> dict:
    """The arguments every SGLang KV pool takes: ``pages`` pages of ``page_size`` tokens, two layers."""
    return dict(
        size=pages * page_size,
        page_size=page_size,
        dtype=kv_dtype,
        layer_num=2,
        device=device,
        enable_memory_saver=False,
    )


def model_config(*, q_heads, kv_heads, head_dim, context, **extra):
    """The four fields of SGLang's ``ModelConfig`` the backends read (plus ``extra``, e.g. MLA's widths)."""
    return types.SimpleNamespace(
        num_attention_heads=q_heads,
        head_dim=head_dim,
        context_len=context,
        model_path="test",
        get_num_kv_heads=lambda tp: max(1, kv_heads // tp),
        **extra,
    )


def runner_of(sg, kv_pool, model_config, *, reqs, mla=False, prefill=None):
    """The runner namespace the backends' constructors read, around a real KV pool and a real
    ``ReqToTokenPool`` of ``reqs`` requests on the pool's device (context: ``model_config.context_len``)."""
    req_pool = sg.mp.ReqToTokenPool(
        size=reqs, max_context_len=model_config.context_len, device=kv_pool.device, enable_memory_saver=False
    )
    return types.SimpleNamespace(
        device=kv_pool.device,
        page_size=kv_pool.page_size,
        kv_cache_dtype=kv_pool.dtype,
        token_to_kv_pool=kv_pool,
        req_to_token_pool=req_pool,
        model_config=model_config,
        use_mla_backend=mla,
        spec_algorithm=sg.Spec.NONE,
        prefill_attention_backend_str=prefill,
    )


def _fill(sg, runner, layers, seq_lens, gen, *, direct=False):
    """Scatter every request's pages over the pool, write random K/V for all but the last token through
    SGLang's set_kv_buffer (``direct``: into the pool's buffers, as set_kv_buffer's CUDA path would,
    without its JIT store kernel), and return (req_pool_indices, out_cache_loc of the new tokens)."""
    pool, req = runner.token_to_kv_pool, runner.req_to_token_pool
    num_pages = pool.size // PAGE
    perm = torch.randperm(num_pages - 1, generator=gen) + 1  # page 0 holds the padding slot
    next_page = 0
    rows = []
    for b, n in enumerate(seq_lens):
        row = b + 1
        npages = math.ceil(n / PAGE)
        pages = perm[next_page : next_page + npages]
        next_page += npages
        slots = (pages[:, None] * PAGE + torch.arange(PAGE)[None, :]).reshape(-1)[:n]
        req.req_to_token[row, :n] = slots.to(torch.int32).to(req.req_to_token.device)
        rows.append(row)
        for layer in layers:
            shape = (n - 1, layer.tp_k_head_num, layer.head_dim)
            k = torch.randn(*shape, generator=gen).to(torch.bfloat16).to(runner.device)
            v = torch.randn(*shape, generator=gen).to(torch.bfloat16).to(runner.device)
            loc = slots[: n - 1].to(torch.int64).to(runner.device)
            if direct:
                for buf, x in ((pool.k_buffer, k), (pool.v_buffer, v)):
                    buf[layer.layer_id][loc] = x.to(pool.dtype).view(pool.store_dtype)
            else:
                pool.set_kv_buffer(layer, loc, k, v)
    idx = torch.tensor(rows, dtype=torch.int64, device=runner.device)
    last = torch.stack([req.req_to_token[r, n - 1] for r, n in zip(rows, seq_lens, strict=True)]).to(
        torch.int64
    )
    return idx, last


def _batch(sg, idx, seq_lens, out_loc):
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    return sg.ForwardBatch(
        forward_mode=sg.ForwardMode.DECODE,
        batch_size=len(seq_lens),
        input_ids=torch.zeros(len(seq_lens), dtype=torch.int64, device=idx.device),
        req_pool_indices=idx,
        seq_lens=lens.to(idx.device),
        out_cache_loc=out_loc,
        seq_lens_sum=int(lens.sum()),
        seq_lens_cpu=lens,
    )


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_decode_matches_torch_native_on_real_pool(kv_dtype):
    sg = _sglang()
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend

    seed, gen = fresh_seed()
    q_heads, kv_heads = 8, 2
    seq_lens = [1, 70, 129, 5]
    with sg.get_parallel().override(attn_tp_size=1):
        runner = _runner(
            sg, q_heads=q_heads, kv_heads=kv_heads, kv_dtype=kv_dtype, pages=12, reqs=6, context=512
        )
        layers = [
            sg.RadixAttention(q_heads, HEAD_DIM, HEAD_DIM**-0.5, kv_heads, layer_id=i) for i in range(2)
        ]
        idx, out_loc = _fill(sg, runner, layers, seq_lens, gen)
        fb = _batch(sg, idx, seq_lens, out_loc)
        ours = HpcAdviseAttnBackend(runner)
        ref = sg.TorchNative(runner)
        ours.init_forward_metadata(fb)
        ref.init_forward_metadata(fb)
        for layer in layers:
            q = torch.randn(len(seq_lens), q_heads * HEAD_DIM, generator=gen).to(torch.bfloat16)
            k = torch.randn(len(seq_lens), kv_heads, HEAD_DIM, generator=gen).to(torch.bfloat16)
            v = torch.randn(len(seq_lens), kv_heads, HEAD_DIM, generator=gen).to(torch.bfloat16)
            want = ref.forward_decode(q, k.clone(), v.clone(), layer, fb).float()
            got = ours.forward_decode(q, k.clone(), v.clone(), layer, fb).float()
            assert got.shape == want.shape == (len(seq_lens), q_heads * HEAD_DIM)
            assert torch.isfinite(got).all(), seed
            assert_close_seeded(got, want, atol=ATOL, rtol=RTOL, seed=seed)


def test_fp8_kv_scale_is_applied():
    """torch_native ignores fp8 KV scales, so a layer scale != 1 is checked against our reference."""
    sg = _sglang()
    from hpc_advise.kernels.decode_attention.reference import decode_attention_reference
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend

    seed, gen = fresh_seed()
    seq_lens = [65, 3]
    with sg.get_parallel().override(attn_tp_size=1):
        runner = _runner(
            sg, q_heads=4, kv_heads=1, kv_dtype=torch.float8_e4m3fn, pages=5, reqs=3, context=256
        )
        layer = sg.RadixAttention(4, HEAD_DIM, HEAD_DIM**-0.5, 1, layer_id=0)
        layer.k_scale = torch.tensor(0.5)
        layer.v_scale = torch.tensor(2.0)
        idx, out_loc = _fill(sg, runner, [layer], seq_lens, gen)
        fb = _batch(sg, idx, seq_lens, out_loc)
        ours = HpcAdviseAttnBackend(runner)
        ours.init_forward_metadata(fb)
        q = torch.randn(2, 4 * HEAD_DIM, generator=gen).to(torch.bfloat16)
        got = ours.forward_decode(q, None, None, layer, fb, save_kv_cache=False).float()
        k_buf, v_buf = runner.token_to_kv_pool.get_kv_buffer(0)
        ((_, _, plan),) = ours.forward_metadata
        want = (
            decode_attention_reference(
                q.view(2, 4, HEAD_DIM),
                k_buf.view(-1, PAGE, 1, HEAD_DIM),
                v_buf.view(-1, PAGE, 1, HEAD_DIM),
                plan.page_table[:2],
                plan.seq_lens[:2],
                page_size=PAGE,
                k_scale=0.5,
                v_scale=2.0,
            )
            .float()
            .reshape(2, -1)
        )
        # v_scale 2 doubles the output's magnitude, so its bf16 rounding: twice ATOL
        assert_close_seeded(got, want, atol=2 * ATOL, rtol=RTOL, seed=seed)


def test_wrong_page_size_fails_clearly():
    sg = _sglang()
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend, HpcAdviseBackendError

    with sg.get_parallel().override(attn_tp_size=1):
        runner = _runner(
            sg, q_heads=8, kv_heads=2, kv_dtype=torch.bfloat16, pages=4, reqs=2, context=128, page_size=16
        )
        with pytest.raises(HpcAdviseBackendError, match="--page-size 64"):
            HpcAdviseAttnBackend(runner)


def test_decode_only_backend_refuses_prefill_role():
    sg = _sglang()
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend, HpcAdviseBackendError

    with sg.get_parallel().override(attn_tp_size=1):
        runner = _runner(
            sg,
            q_heads=8,
            kv_heads=2,
            kv_dtype=torch.bfloat16,
            pages=4,
            reqs=2,
            context=128,
            prefill="hpc_advise",
        )
        with pytest.raises(HpcAdviseBackendError, match="decode-only"):
            HpcAdviseAttnBackend(runner)


def test_unsupported_group_fails_with_dispatch_reason():
    sg = _sglang()
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend, HpcAdviseBackendError

    with sg.get_parallel().override(attn_tp_size=1):
        runner = _runner(sg, q_heads=64, kv_heads=2, kv_dtype=torch.bfloat16, pages=4, reqs=2, context=128)
        with pytest.raises(HpcAdviseBackendError, match="GQA group 64/2"):
            HpcAdviseAttnBackend(runner)


def _published_runner(sg, tmp_path, *, page_size=PAGE):
    """SGLang's own path from the command line to the attention backend: ``prepare_server_args`` (the
    plugin's names accepted), the published runtime context, the real ``ModelConfig`` of a tiny local
    config.json, then SGLang's ``_build_resolved_backend``. Only the ModelRunner itself is a namespace
    (it would load weights and initialise CUDA/NCCL)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.model_runner_components import attention_backend_setup as setup
    from sglang.srt.runtime_context import attention_backends, create_context
    from sglang.srt.server_args import prepare_server_args

    from hpc_advise.runtime.sglang import plugin

    plugin.register()
    args = prepare_server_args(
        [
            "--model-path",
            tiny_model_dir(tmp_path),
            "--decode-attention-backend",
            "hpc_advise",
            "--prefill-attention-backend",
            "torch_native",
            "--page-size",
            str(page_size),
            "--device",
            "cpu",
            "--skip-tokenizer-init",
        ]
    )
    ctx = create_context(args, role="scheduler")
    return args, ctx, setup, attention_backends, ModelConfig


def test_sglang_composes_our_decode_with_its_prefill(tmp_path):
    sg = _sglang()
    from sglang.srt.runtime_context import use_context

    args, ctx, setup, attention_backends, ModelConfig = _published_runner(sg, tmp_path)
    seed, gen = fresh_seed()
    seq_lens = [33, 130, 64]
    with use_context(ctx):
        assert attention_backends() == ("torch_native", "hpc_advise")
        runner = _runner(sg, q_heads=8, kv_heads=2, kv_dtype=torch.bfloat16, pages=8, reqs=4, context=512)
        runner.model_config = ModelConfig.from_server_args(args)
        runner.prefill_attention_backend_str, runner.decode_attention_backend_str = attention_backends()
        runner.is_draft_worker, runner.draft_attention_backend, runner.kv_index_translator = False, None, None
        hybrid = setup._build_resolved_backend(
            model_runner=runner,
            resolved=setup.resolve_attention_backend_strs(model_runner=runner),
            init_new_workspace=False,
        )
        assert type(hybrid).__name__ == "HybridAttnBackend"
        assert type(hybrid.decode_backend).__name__ == "HpcAdviseAttnBackend"
        assert hybrid._select_backend(sg.ForwardMode.EXTEND) is hybrid.prefill_backend  # prefill delegated
        assert type(hybrid.prefill_backend).__name__ == "TorchNativeAttnBackend"
        layer = sg.RadixAttention(8, HEAD_DIM, HEAD_DIM**-0.5, 2, layer_id=1)
        idx, out_loc = _fill(sg, runner, [layer], seq_lens, gen)
        fb = _batch(sg, idx, seq_lens, out_loc)
        hybrid.init_forward_metadata(fb)
        q = torch.randn(3, 8 * HEAD_DIM, generator=gen).to(torch.bfloat16)
        got = hybrid.forward(q, None, None, layer, fb, save_kv_cache=False).float()
        ref = sg.TorchNative(runner)
        ref.init_forward_metadata(fb)
        want = ref.forward_decode(q, None, None, layer, fb, save_kv_cache=False).float()
        assert_close_seeded(got, want, atol=ATOL, rtol=RTOL, seed=seed)


def test_wrong_page_size_is_refused_at_resolution(tmp_path):
    """SGLang resolves the arguments (``create_context``) before any model or weight: our plugin's
    resolution check refuses page 16 there, with the line saying what to use. (The backend's own
    check, reached only without the plugin's hooks, is tested on the runner above.)"""
    _sglang()
    from hpc_advise.runtime.sglang.resolution import SetupRefused

    with pytest.raises(SetupRefused, match="page size 16: the backend needs --page-size 64"):
        _published_runner(_sglang(), tmp_path, page_size=16)


def _eager_decode(sg, seq_lens, gen, *, pages, pad):
    """A filled 8/2-head bf16 pool with one layer, queries for the real rows plus ``pad`` padding rows,
    and our backend's eager decode of the real rows (the reference of the graph-path tests)."""
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend

    runner = _runner(sg, q_heads=8, kv_heads=2, kv_dtype=torch.bfloat16, pages=pages, reqs=4, context=256)
    layer = sg.RadixAttention(8, HEAD_DIM, HEAD_DIM**-0.5, 2, layer_id=0)
    idx, out_loc = _fill(sg, runner, [layer], seq_lens, gen)
    q = torch.randn(len(seq_lens) + pad, 8 * HEAD_DIM, generator=gen).to(torch.bfloat16)
    eager = HpcAdviseAttnBackend(runner)
    fb = _batch(sg, idx, seq_lens, out_loc)
    eager.init_forward_metadata(fb)
    want = eager.forward_decode(q[: len(seq_lens)], None, None, layer, fb, save_kv_cache=False).float()
    return runner, layer, idx, out_loc, q, want


def test_cuda_graph_metadata_path_matches_eager():
    """The graph path (one plan sized for the largest captured batch, refilled by
    init_forward_metadata_in_graph) on a padded batch, as SGLang's decode graph runner pads it: the
    padding row has req_pool_index 0 and the backend's seq_len fill value; real rows must equal eager."""
    sg = _sglang()
    seed, gen = fresh_seed()
    seq_lens = [40, 100, 7]
    with sg.get_parallel().override(attn_tp_size=1):
        runner, layer, idx, out_loc, q, want = _eager_decode(sg, seq_lens, gen, pages=8, pad=1)
        got = graph_path_decode(sg, runner, layer, idx, seq_lens, out_loc, q, pad=1)
        assert got.shape == (4, 8 * HEAD_DIM) and torch.isfinite(got).all(), seed
        # the padding row changes how work is split over the grid, so merge order may differ: same tolerance
        assert_close_seeded(got[:3], want, atol=ATOL, rtol=RTOL, seed=seed)



def graph_path_decode(sg, runner, layer, idx, seq_lens, out_loc, q, *, pad):
    """``layer``'s decode on the CUDA-graph metadata path, outside a capture: a backend with one plan sized
    for the largest captured batch, the batch padded by ``pad`` rows as SGLang's decode graph runner pads
    it, the page table and plan refilled by init_forward_metadata_in_graph; float32 output of all rows."""
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend

    graph = HpcAdviseAttnBackend(runner)
    graph.init_cuda_graph_state(max_bs=8, max_num_tokens=8)
    padded = _graph_batch(sg, graph, idx, seq_lens, out_loc, pad=pad)
    graph.init_forward_metadata_out_graph(padded, in_capture=True)
    graph.init_forward_metadata_in_graph(padded)
    return graph.forward_decode(q, None, None, layer, padded, save_kv_cache=False).float()


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_decode_matches_torch_native_at_hy3_tp8_shape_on_gpu(kv_dtype):
    """Real sizes on the GPU: ours against SGLang's torch_native backend on the same CUDA pool, at Hy3's
    TP8 shard (8 query heads, 1 KV head, head_dim 128) with mixed lengths up to 8K. SGLang's triton
    backend needs a full ModelRunner (CUDA graphs, NCCL), so torch_native (the same math, no kernel of
    its own) is the reference here too. On a GPU machine with sgl-kernel missing: SGLang's module-level imports of it are met by tests/runtime/sglang/sgl_kernel_stand_in.py (import-only; nothing here calls it)."""
    sg = _sglang()
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend

    seed, gen = fresh_seed()
    seq_lens = [8192, 17, 1000, 64 * 30 + 1, 4096, 1]
    hd = 128
    with sg.get_parallel().override(attn_tp_size=1):
        runner = _runner(
            sg,
            q_heads=8,
            kv_heads=1,
            kv_dtype=kv_dtype,
            pages=260,
            reqs=8,
            context=8192,
            head_dim=hd,
            device="cuda",
        )
        layer = sg.RadixAttention(8, hd, hd**-0.5, 1, layer_id=0)
        idx, out_loc = _fill(sg, runner, [layer], seq_lens, gen, direct=True)
        fb = _batch(sg, idx, seq_lens, out_loc)
        q = torch.randn(len(seq_lens), 8 * hd, generator=gen).to(torch.bfloat16).cuda()
        ref = sg.TorchNative(runner)
        ref.init_forward_metadata(fb)
        want = ref.forward_decode(q, None, None, layer, fb, save_kv_cache=False).float()
        ours = HpcAdviseAttnBackend(runner)
        ours.init_forward_metadata(fb)
        got = ours.forward_decode(q, None, None, layer, fb, save_kv_cache=False).float()
        assert_close_seeded(got, want, atol=ATOL, rtol=RTOL, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_decode_step_stores_new_token_through_sglang_on_gpu(kv_dtype):
    """A whole decode step on the GPU as SGLang runs it (save_kv_cache=True): our forward_decode stores
    the new token's K/V through the pool's set_kv_buffer (SGLang's CUDA store path), then attends over
    it. The pool must hold exactly the new K/V cast to the KV dtype at out_cache_loc and nothing else
    may change; the output must match torch_native reading the same pool afterwards. On a GPU machine
    with sgl-kernel missing: SGLang's module-level imports of it are met by
    tests/runtime/sglang/sgl_kernel_stand_in.py (import-only; nothing here calls it)."""
    sg = _sglang()
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend

    seed, gen = fresh_seed()
    seq_lens = [3000, 1, 64, 65, 129]
    hd, q_heads, kv_heads = 128, 8, 1
    with sg.get_parallel().override(attn_tp_size=1):
        runner = _runner(
            sg,
            q_heads=q_heads,
            kv_heads=kv_heads,
            kv_dtype=kv_dtype,
            pages=64,
            reqs=8,
            context=4096,
            head_dim=hd,
            device="cuda",
        )
        layers = [sg.RadixAttention(q_heads, hd, hd**-0.5, kv_heads, layer_id=i) for i in range(2)]
        idx, out_loc = _fill(sg, runner, layers, seq_lens, gen, direct=True)
        fb = _batch(sg, idx, seq_lens, out_loc)
        ours, ref = HpcAdviseAttnBackend(runner), sg.TorchNative(runner)
        ours.init_forward_metadata(fb)
        ref.init_forward_metadata(fb)
        pool = runner.token_to_kv_pool
        others = torch.ones(pool.get_kv_buffer(0)[0].shape[0], dtype=torch.bool, device="cuda")
        others[out_loc] = False  # every slot but the new tokens'
        for layer in layers:
            q = torch.randn(len(seq_lens), q_heads * hd, generator=gen).to(torch.bfloat16).cuda()
            k = torch.randn(len(seq_lens), kv_heads, hd, generator=gen).to(torch.bfloat16).cuda()
            v = torch.randn(len(seq_lens), kv_heads, hd, generator=gen).to(torch.bfloat16).cuda()
            before = [b.clone() for b in pool.get_kv_buffer(layer.layer_id)]
            got = ours.forward_decode(q, k.clone(), v.clone(), layer, fb).float()
            after = pool.get_kv_buffer(layer.layer_id)
            for new, old, buf in zip((k, v), before, after, strict=True):
                assert torch.equal(buf[out_loc].float(), new.to(kv_dtype).float()), (layer.layer_id, seed)
                assert torch.equal(buf[others].float(), old[others].float()), (layer.layer_id, seed)
            want = ref.forward_decode(q, None, None, layer, fb, save_kv_cache=False).float()
            assert torch.isfinite(got).all(), seed
            assert_close_seeded(got, want, atol=ATOL, rtol=RTOL, seed=seed)


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay_on_gpu():
    """Capture metadata-in-graph + one layer's decode in a CUDA graph, replay it with other lengths and
    other requests (as SGLang's decode graph runner does), and compare with eager steps. On a GPU machine
    with sgl-kernel missing: SGLang's module-level imports of it are met by tests/runtime/sglang/sgl_kernel_stand_in.py (import-only; nothing here calls it)."""
    sg = _sglang()
    seed, gen = fresh_seed()
    hd = 128
    with sg.get_parallel().override(attn_tp_size=1):
        runner = _runner(
            sg,
            q_heads=16,
            kv_heads=2,
            kv_dtype=torch.bfloat16,
            pages=200,
            reqs=8,
            context=4096,
            head_dim=hd,
            device="cuda",
        )
        layer = sg.RadixAttention(16, hd, hd**-0.5, 2, layer_id=0)
        lens_a = [3000, 5, 700, 64]
        idx_a, loc_a = _fill(sg, runner, [layer], lens_a, gen, direct=True)
        graph_replays_match_eager(sg, runner, layer, idx_a, lens_a, loc_a, 16 * hd, seed)


def graph_replays_match_eager(sg, runner, layer, idx_a, lens_a, loc_a, q_width, seed):
    """Capture metadata-in-graph + ``layer``'s decode of a batch of four in a CUDA graph, replay it for the
    filled requests ``idx_a`` at lengths ``lens_a`` and again in reverse order at other lengths (within their
    filled KV), as SGLang's decode graph runner does, and compare each replay with an eager step."""
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend

    bs = len(lens_a)
    idx_b = idx_a.flip(0)
    lens_b = [min(a, b) for a, b in zip(reversed(lens_a), [1, 4000, 129, 2048], strict=True)]
    static = _batch(sg, idx_a.clone(), lens_a, loc_a)
    q = torch.randn(bs, q_width, device="cuda", dtype=torch.bfloat16)
    graph_be = HpcAdviseAttnBackend(runner)
    graph_be.init_cuda_graph_state(max_bs=8, max_num_tokens=8)
    graph_be.init_forward_metadata_out_graph(static, in_capture=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside capture (Triton compiles here)
        graph_be.init_forward_metadata_in_graph(static)
        graph_be.forward_decode(q, None, None, layer, static, save_kv_cache=False)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graph_be.init_forward_metadata_in_graph(static)
        out = graph_be.forward_decode(q, None, None, layer, static, save_kv_cache=False)
    eager_be = HpcAdviseAttnBackend(runner)
    for lens, idx in ((lens_a, idx_a), (lens_b, idx_b)):
        static.seq_lens.copy_(torch.tensor(lens, device="cuda"))
        static.req_pool_indices.copy_(idx)
        q.copy_(torch.randn(bs, q_width, device="cuda", dtype=torch.bfloat16))
        graph_be.init_forward_metadata_out_graph(static)
        g.replay()
        fb = _batch(sg, idx, lens, loc_a)
        eager_be.init_forward_metadata(fb)
        want = eager_be.forward_decode(q, None, None, layer, fb, save_kv_cache=False)
        assert_close_seeded(out.float(), want.float(), atol=ATOL, rtol=RTOL, seed=seed)


def test_context_limit_checked_at_start():
    """A longer context than the kernel takes fails when the backend is built (server start)."""
    sg = _sglang()
    from hpc_advise.kernels.decode_attention import op as decode_op
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend, HpcAdviseBackendError

    with sg.get_parallel().override(attn_tp_size=1):
        runner = _runner(sg, q_heads=8, kv_heads=2, kv_dtype=torch.bfloat16, pages=4, reqs=2, context=64)
        runner.model_config.context_len = decode_op.MAX_SEQ_LEN + 1
        with pytest.raises(HpcAdviseBackendError, match="--context-length"):
            HpcAdviseAttnBackend(runner)


def test_eager_batch_larger_than_one_plan_runs_in_chunks():
    """Eager decode batches above the kernel's per-plan batch limit (1024; 2 here so the test stays small)
    are planned and run in chunks, with the same result as one plan."""
    sg = _sglang()
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend

    seed, gen = fresh_seed()
    seq_lens = [9, 66, 1, 130, 20]
    with sg.get_parallel().override(attn_tp_size=1):
        runner = _runner(sg, q_heads=8, kv_heads=2, kv_dtype=torch.bfloat16, pages=10, reqs=6, context=256)
        layer = sg.RadixAttention(8, HEAD_DIM, HEAD_DIM**-0.5, 2, layer_id=0)
        idx, out_loc = _fill(sg, runner, [layer], seq_lens, gen)
        fb = _batch(sg, idx, seq_lens, out_loc)
        q = torch.randn(5, 8 * HEAD_DIM, generator=gen).to(torch.bfloat16)
        whole = HpcAdviseAttnBackend(runner)
        whole.init_forward_metadata(fb)
        want = whole.forward_decode(q, None, None, layer, fb, save_kv_cache=False).float()
        chunked = HpcAdviseAttnBackend(runner)
        chunked.max_plan_batch = 2
        chunked.init_forward_metadata(fb)
        assert [(a, b) for a, b, _ in chunked.forward_metadata] == [(0, 2), (2, 4), (4, 5)]
        got = chunked.forward_decode(q, None, None, layer, fb, save_kv_cache=False).float()
        assert_close_seeded(got, want, atol=ATOL, rtol=RTOL, seed=seed)


def test_eager_plans_are_sized_by_the_planners_batch_bucket():
    """Eager plans grow by the planner's power-of-two batch bucket (one compiled planner each), and the
    start-up compile walks every bucket up to the server's running-request limit, each once."""
    sg = _sglang()
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend

    seed, gen = fresh_seed()
    with sg.get_parallel().override(attn_tp_size=1):
        runner = _runner(sg, q_heads=8, kv_heads=2, kv_dtype=torch.bfloat16, pages=40, reqs=37, context=128)
        layer = sg.RadixAttention(8, HEAD_DIM, HEAD_DIM**-0.5, 2, layer_id=0)
        backend = HpcAdviseAttnBackend(runner)
        sizes = []
        for n in (5, 16, 17, 33):
            lens = [int(x) for x in torch.randint(1, 65, (n,), generator=gen)]
            idx, out_loc = _fill(sg, runner, [layer], lens, gen)
            backend.init_forward_metadata(_batch(sg, idx, lens, out_loc))
            sizes.append(backend.forward_metadata[0][2].max_batch)
        assert sizes == [16, 16, 32, 64], seed
        made = []
        backend._new_plan = lambda size, max_pages=None: made.append((size, max_pages))
        backend._compile_planners()  # 38 rows of req_to_token: batches up to 38 reach the 64 bucket
        assert made == [(16, 1), (32, 1), (64, 1)]
        backend.max_plan_batch = 24
        made.clear()
        backend._compile_planners()
        assert made == [(16, 1), (24, 1)]


def planner_compiles() -> int:
    """Compiled variants of the decode planner in this process (Triton's per-device kernel cache)."""
    from hpc_advise.kernels.decode_attention import kernel

    caches = kernel.plan_kernel.device_caches
    return sum(len(entry[0]) for entry in caches.values())


@pytest.mark.gpu
def test_no_planner_compile_while_serving_on_gpu():
    """After the backend is built, eager decode steps of every batch size up to the running-request limit
    (1, multiples of 16, odd sizes, each bucket's edges) compile nothing more: a compile there stalls a
    serving engine ~2 s. Also checks the results at a few of those sizes against one plan per batch."""
    sg = _sglang()
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend

    seed, gen = fresh_seed()
    with sg.get_parallel().override(attn_tp_size=1):
        runner = _runner(
            sg, q_heads=8, kv_heads=1, kv_dtype=torch.bfloat16, pages=700, reqs=300, context=2048,
            head_dim=128, device="cuda",
        )
        layer = sg.RadixAttention(8, 128, 128**-0.5, 1, layer_id=0)
        lens = [int(x) for x in torch.randint(1, 129, (300,), generator=gen)]
        idx, out_loc = _fill(sg, runner, [layer], lens, gen, direct=True)
        backend = HpcAdviseAttnBackend(runner)
        q = torch.randn(300, 8 * 128, generator=gen).to(torch.bfloat16).cuda()
        ref = sg.TorchNative(runner)
        first = _batch(sg, idx[:3], lens[:3], out_loc[:3])
        backend.init_forward_metadata(first)
        backend.forward_decode(q[:3], None, None, layer, first, save_kv_cache=False)
        before = planner_compiles()
        assert before >= 1
        for n in (1, 2, 15, 16, 17, 21, 32, 50, 63, 64, 65, 100, 128, 129, 200, 255, 256, 257, 300):
            fb = _batch(sg, idx[:n], lens[:n], out_loc[:n])
            backend.init_forward_metadata(fb)
            got = backend.forward_decode(q[:n], None, None, layer, fb, save_kv_cache=False).float()
            if n in (17, 129, 300):
                ref.init_forward_metadata(fb)
                want = ref.forward_decode(q[:n], None, None, layer, fb, save_kv_cache=False).float()
                assert_close_seeded(got, want, atol=ATOL, rtol=RTOL, seed=seed)
        torch.cuda.synchronize()
        assert planner_compiles() == before, f"the planner compiled while serving (seed {seed})"


def test_other_kv_pool_classes_are_refused():
    """Subclasses of MHATokenToKVPool (page-major, fp4, mxfp8, no-op) lay the pool out differently."""
    sg = _sglang()
    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend, HpcAdviseBackendError

    class PageMajorLike(sg.mp.MHATokenToKVPool):
        pass

    with sg.get_parallel().override(attn_tp_size=1):
        runner = _runner(sg, q_heads=8, kv_heads=2, kv_dtype=torch.bfloat16, pages=4, reqs=2, context=128)
        runner.token_to_kv_pool = PageMajorLike(
            size=4 * PAGE,
            page_size=PAGE,
            dtype=torch.bfloat16,
            head_num=2,
            head_dim=HEAD_DIM,
            layer_num=1,
            device="cpu",
            enable_memory_saver=False,
        )
        with pytest.raises(
            HpcAdviseBackendError, match="PageMajorLike is not SGLang's plain MHATokenToKVPool"
        ):
            HpcAdviseAttnBackend(runner)


def _graph_batch(sg, backend, idx, seq_lens, out_loc, pad):
    """A decode batch padded by ``pad`` rows as SGLang's decode graph runner pads it (req_pool_index 0,
    the backend's seq_len fill value), its metadata set up the way capture and replay do."""
    fill = backend.get_cuda_graph_seq_len_fill_value()
    fb = _batch(
        sg,
        torch.cat([idx, torch.zeros(pad, dtype=torch.int64)]),
        seq_lens + [fill] * pad,
        torch.cat([out_loc, torch.zeros(pad, dtype=torch.int64)]),
    )
    return fb


def test_breakable_decode_graph_routes_decode_through_our_graph_path():
    """Under SGLang's breakable CUDA-graph scope (``--cuda-graph-backend-decode breakable``), a DECODE
    batch reaches our backend through RadixAttention.forward unchanged: only extend batches of prefill
    graphs run attention as an eager break on the real rows. So the breakable decode graph captures
    our backend exactly as the full graph does (init_forward_metadata_out_graph + _in_graph)."""
    sg = _sglang()
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
        enable_breakable_cuda_graph,
    )

    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend

    seed, gen = fresh_seed()
    seq_lens = [70, 9, 130]
    with sg.get_parallel().override(attn_tp_size=1):
        runner, layer, idx, out_loc, q, want = _eager_decode(sg, seq_lens, gen, pages=10, pad=2)
        graph = HpcAdviseAttnBackend(runner)
        graph.init_cuda_graph_state(max_bs=8, max_num_tokens=8)
        padded = _graph_batch(sg, graph, idx, seq_lens, out_loc, pad=2)
        seen = []
        real_forward = graph.forward_decode
        graph.forward_decode = lambda q_, *a, **k: seen.append(q_.shape[0]) or real_forward(q_, *a, **k)
        with enable_breakable_cuda_graph(), forward_context(ForwardContext(attn_backend=graph)):
            graph.init_forward_metadata_out_graph(padded, in_capture=True)
            graph.init_forward_metadata_in_graph(padded)
            got = layer.forward(q, None, None, padded, save_kv_cache=False).float()
    assert seen == [5], seen  # the whole padded batch, as under the full graph
    assert got.reshape(5, -1).shape == (5, 8 * HEAD_DIM) and torch.isfinite(got).all(), seed
    assert_close_seeded(got.reshape(5, -1)[:3], want, atol=ATOL, rtol=RTOL, seed=seed)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "cuda-graph-metadata"])
def test_two_batch_overlap_children_plan_their_own_halves(graph):
    """``--enable-two-batch-overlap`` wraps three instances of the backend in SGLang's TboAttnBackend
    (the full batch and two micro-batches, each with its own forward batch); each child must plan and
    attend over its own rows only, eager and on the CUDA-graph metadata path, and match the full batch."""
    sg = _sglang()
    from sglang.srt.layers.attention.tbo_backend import TboAttnBackend

    from hpc_advise.runtime.sglang.attention import HpcAdviseAttnBackend

    seed, gen = fresh_seed()
    seq_lens = [40, 100, 7, 65, 128]
    split = 2
    with sg.get_parallel().override(attn_tp_size=1):
        runner = _runner(sg, q_heads=8, kv_heads=2, kv_dtype=torch.bfloat16, pages=16, reqs=6, context=256)
        layer = sg.RadixAttention(8, HEAD_DIM, HEAD_DIM**-0.5, 2, layer_id=0)
        idx, out_loc = _fill(sg, runner, [layer], seq_lens, gen)
        q = torch.randn(len(seq_lens), 8 * HEAD_DIM, generator=gen).to(torch.bfloat16)
        tbo = TboAttnBackend.init_new(lambda: HpcAdviseAttnBackend(runner))
        fb = _batch(sg, idx, seq_lens, out_loc)
        fb.tbo_children = [
            _batch(sg, idx[:split], seq_lens[:split], out_loc[:split]),
            _batch(sg, idx[split:], seq_lens[split:], out_loc[split:]),
        ]
        if graph:
            tbo.init_cuda_graph_state(max_bs=8, max_num_tokens=8)
            tbo.init_forward_metadata_out_graph(fb, in_capture=True)
            tbo.init_forward_metadata_in_graph(fb)
        else:
            tbo.init_forward_metadata(fb)
        full = tbo.forward_decode(q, None, None, layer, fb, save_kv_cache=False).float()
        halves = [
            child.forward_decode(q[s], None, None, layer, cfb, save_kv_cache=False).float()
            for child, cfb, s in zip(
                tbo.children, fb.tbo_children, (slice(0, split), slice(split, None)), strict=True
            )
        ]
    assert torch.isfinite(full).all(), seed
    assert_close_seeded(torch.cat(halves), full, atol=ATOL, rtol=RTOL, seed=seed)
