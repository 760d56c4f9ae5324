"""Serving model: roofline physics, CSV parsing with reasons, fit, the trees as arrays, the shipped fit
and the cache, range flags, grouped CV."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hpc_advise.advisor import roofline as F
from hpc_advise.advisor import serving_data as sd
from hpc_advise.advisor import serving_model as pm
from hpc_advise.profiles import get_gpu, get_model
from tests.advisor.advisor_helpers import advisor_home, serving_model  # noqa: F401

HEADER = ",".join(sd.CSV_COLUMNS)


def _row(**kw) -> dict:
    base = dict(
        id="r",
        backend="sglang",
        backend_version="0.5",
        model_path="Qwen/Qwen3-32B",
        system="h200_sxm",
        precision="fp8",
        mode="agg",
        isl="1024",
        osl="1024",
        gemm_quant_mode="fp8",
        moe_quant_mode="fp8",
        batch_size="16",
        tp_size="2",
        pp_size="1",
        attention_dp_size="1",
        moe_tp_size="2",
        moe_ep_size="1",
        silicon_ttft_ms="100",
        silicon_tpot_ms="20",
    )
    base.update(kw)
    return base


def test_decode_step_kv_term_matches_profile_bytes():
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h200")
    s, r = F.shapes_of(model), F.Rates.of(gpu)
    dep = F.Deployment(1, kv_bytes=2.0)
    step = F.decode_step(s, r, dep, ctx_sum=64 * 4096, batch=64)
    expect = 64 * 4096 * model.kv_bytes_per_token(2) / (gpu.mem_bw_tbps * 1e6)
    assert step["attn_kv"] == pytest.approx(expect, rel=1e-9)
    # weights are read once per step: 8B bf16 params over the bandwidth, within the embedding's share
    weights = step["attn_proj"] + step["dense_ffn"] + step["lm_head"]
    assert 0.85 < weights / (model.weight_bytes() / (gpu.mem_bw_tbps * 1e6)) < 1.05
    # TP2 halves the KV heads per rank and the weights per rank
    step2 = F.decode_step(s, r, F.Deployment(2, kv_bytes=2.0), ctx_sum=64 * 4096, batch=64)
    assert step2["attn_kv"] == pytest.approx(step["attn_kv"] / 2)
    assert step2["comm"] > 0 and step["comm"] == 0


def test_rates_use_datasheet_basis_for_every_gpu():
    # the H200 profile carries a measured copy bandwidth; the roofline must not mix it with the other
    # GPUs' datasheet figures, or the calibration's efficiency would not transfer between GPUs
    h200, b200 = get_gpu("h200"), get_gpu("b200")
    assert h200.rate("copy_bw_tbps") < h200.mem_bw_tbps
    for gpu in (h200, b200):
        r = F.Rates.of(gpu)
        assert r.bw == pytest.approx(gpu.mem_bw_tbps * 1e6)
        assert r.peak("bf16") == pytest.approx(gpu.bf16_tflops * 1e6)


def test_mixed_prefill_shares_the_decode_steps_weight_reads():
    s, r = F.shapes_of(get_model("qwen3-235b-a22b")), F.Rates.of(get_gpu("h100"))
    dep = F.Deployment(4, moe_ep=4, dense_quant="fp8", moe_quant="fp8", kv_bytes=1.0)
    rf = F.roofline_serving(s, r, dep, F.ClosedLoopLoad(isl=128, osl=128, concurrency=64))
    # one 128-token prompt per step: timed alone it re-reads the experts, mixed in it mostly adds FLOPs
    assert 0 < rf["interference_us"] < 0.5 * rf["interference_alone_us"]
    step = F.decode_step(s, r, dep, ctx_sum=64 * 192, batch=64)
    mixed = F.decode_step(s, r, dep, ctx_sum=64 * 192, batch=64, extra_tokens=64)
    assert mixed["lm_head"] == step["lm_head"] and F.total_us(mixed) > F.total_us(step)


def test_linear_attention_state_is_read_and_written_every_step():
    model, gpu = get_model("qwen3.5-397b-a17b"), get_gpu("b200")
    s, r = F.shapes_of(model), F.Rates.of(gpu)
    lin = model.linear_attention
    assert s.state_bytes_per_seq == model.num_linear_attention_layers * lin.state_bytes()
    step = F.decode_step(s, r, F.Deployment(8), ctx_sum=0.0, batch=16)
    expect = 16 * 2 * s.state_bytes_per_seq / 8 / (gpu.mem_bw_tbps * 1e6)
    assert step["attn_kv"] == pytest.approx(expect, rel=1e-9)
    assert F.shapes_of(get_model("llama-3.1-8b")).state_bytes_per_seq == 0


def test_moe_experts_touched_grows_with_tokens():
    lo = F.expected_experts_touched(24, 192, 8, 1)
    hi = F.expected_experts_touched(24, 192, 8, 256)
    assert lo == pytest.approx(24 * 8 / 192)
    assert lo < hi <= 24


def test_routed_activations_by_hand_and_outside_the_step_total():
    """Qwen3-235B (94 MoE layers, hidden 4096, top-8 of 128) on 4 x H100 at EP 4, 64 tokens: each rank
    holds a quarter of the 64 x 8 (token, expert) pairs, each gathered in and scattered out as bf16
    hidden vectors (4 bytes per hidden element) over the bandwidth; a dense model has none; the term
    is the serving model's, not part of the decode roofline's total."""
    model, gpu = get_model("qwen3-235b-a22b"), get_gpu("h100")
    s, r = F.shapes_of(model), F.Rates.of(gpu)
    step = F.decode_step(s, r, F.Deployment(4, moe_ep=4), ctx_sum=0.0, batch=64)
    expect = 94 * (64 * 8 / 4) * 4 * 4096 / (gpu.mem_bw_tbps * 1e6)
    assert step["moe_routed"] == pytest.approx(expect, rel=1e-12)
    tp = F.decode_step(s, r, F.Deployment(4), ctx_sum=0.0, batch=64)  # experts split by TP: all pairs
    assert tp["moe_routed"] == pytest.approx(4 * expect, rel=1e-12)
    assert "moe_routed" not in F.TIME_KEYS
    dense = F.decode_step(F.shapes_of(get_model("qwen3-32b")), r, F.Deployment(4), ctx_sum=0.0, batch=64)
    assert dense["moe_routed"] == 0.0


def test_csv_rows_parse_or_give_reasons(tmp_path):
    good = sd.point_from_csv_row(
        _row(attention_dp_size="4", batch_size="8", tp_size="2", moe_ep_size="8"), "f:2"
    )
    assert (good.n_gpus, good.attn_dp, good.concurrency, good.moe_ep) == (8, 4, 32.0, 8)
    # attention_dp_size blank: the MoE group (moe_tp x moe_ep) spans the replica, so tp 1 with a MoE
    # group of 2 is attention DP 2 on 2 GPUs; the recorded client concurrency is the concurrency
    src = "source_file=x.csv; silicon_concurrency=8"
    inferred = sd.point_from_csv_row(
        _row(attention_dp_size="", tp_size="1", moe_tp_size="2", batch_size="8", silicon_data_source=src),
        "f:6",
    )
    assert (inferred.n_gpus, inferred.attn_dp, inferred.concurrency) == (2, 2, 8.0)
    dense = sd.point_from_csv_row(_row(attention_dp_size="", tp_size="2", moe_tp_size="1"), "f:7")
    assert (dense.n_gpus, dense.attn_dp, dense.concurrency) == (2, 1, 16.0)
    with pytest.raises(sd.RowError, match="silicon_concurrency 224 matches neither"):
        sd.point_from_csv_row(
            _row(
                batch_size="56",
                tp_size="4",
                moe_tp_size="1",
                moe_ep_size="4",
                silicon_data_source="a; silicon_concurrency=224; b",
            ),
            "f:8",
        )
    with pytest.raises(sd.RowError, match="disaggregated"):
        sd.point_from_csv_row(_row(mode="disagg"), "f:3")
    with pytest.raises(sd.RowError, match="pipeline"):
        sd.point_from_csv_row(_row(pp_size="2"), "f:4")
    with pytest.raises(sd.RowError, match="isl"):
        sd.point_from_csv_row(_row(isl="abc"), "f:5")
    path = tmp_path / "m.csv"
    path.write_text("model_path,system\nx,h200\n")
    with pytest.raises(sd.RowError, match=r"m.csv:1: missing columns"):
        list(sd.read_csv_rows(path))


def test_seed_data_parses_and_cites_source():
    points, bad = sd.seed_points()
    assert len(points) > 2500
    assert {p.engine for p in points} == {"sglang", "vllm", "trtllm"}
    # the held-out source (SGLang on H100/H200) must not be in the seed
    assert not [p for p in points if p.engine == "sglang" and p.gpu in ("h100", "h200")]
    assert all(":" in where for where, _ in bad)
    assert "AIConfigurator" in sd.SEED_CITATION


def test_four_bit_label_on_expert_only_checkpoint_keeps_dense_gemms_bf16():
    # gpt-oss (MXFP4) and Kimi-K2.5 (INT4) quantize only their experts; a fully 4-bit checkpoint
    # label (DeepSeek-R1-NVFP4) keeps the row's dense quantization
    cases = (
        ("openai/gpt-oss-120b", "nvfp4", "bf16"),
        ("moonshotai/Kimi-K2.5", "int4", "bf16"),
        ("nvidia/DeepSeek-R1-NVFP4", "nvfp4", "nvfp4"),
    )
    for model, quant, dense in cases:
        p = sd.point_from_csv_row(
            _row(
                model_path=model,
                system="b200_sxm",
                gemm_quant_mode=quant,
                moe_quant_mode=quant,
                tp_size="8",
                moe_tp_size="1",
                moe_ep_size="8",
            ),
            "f:1",
        )
        dep = pm.prepare(p).dep
        assert (dep.dense_quant, dep.moe_quant) == (dense, F.normalize_quant(quant)), model


def test_rows_are_sized_at_their_own_precision_by_the_memory_check():
    # Llama-3.1-70B (a bf16 profile) on 2 x H100, 1024 / 1024 tokens: 70,553,706,496 parameters, of
    # which embedding + LM head (2 x 128256 x 8192) and norms (161 x 8192) = 2,102,665,216 stay bf16
    weights = {"fp8": (68_451_041_280 * 1 + 2_102_665_216 * 2) / 2, "bf16": 70_553_706_496 * 2 / 2}
    assert weights["fp8"] == 36_328_185_856
    static = 80 * 2**30 * 0.829  # SGLang's mem_fraction_static at TP2 on 80 GiB
    cell = 80 * 8 // 2 * 128 * 2 * 2  # 80 layers, 4 of 8 KV heads per rank, K and V of 128, bf16
    for quant, expected in (("fp8", 138), ("bf16", 2)):
        free = static - weights[quant] - cell * 2048  # one request at its full 2048 tokens
        assert 1 + math.floor(free / (cell * 1536)) == expected  # the rest at the mean 1536
        row = _row(model_path="meta-llama/Llama-3.1-70B", system="h100_sxm", gemm_quant_mode=quant,
                   moe_quant_mode=quant, precision=quant)  # fmt: skip
        pr = pm.prepare(sd.point_from_csv_row(row, "f:1"))
        assert pr.kv_limit == expected, quant
    # the planner's memory check gives the same for the same deployment
    from hpc_advise.advisor.candidates import Candidate, kv_limit

    llama = get_model("llama-3.1-70b")
    assert kv_limit(Candidate(2), llama, get_gpu("h100"), 1536, 2048, ("fp8", "fp8")) == 138
    assert kv_limit(Candidate(2), llama, get_gpu("h100"), 1536, 2048) == 2  # the profile plans bf16


def test_admission_wait_of_a_closed_loop_by_hand():
    # 16 clients on 4 KV slots: each admitted request holds its slot 100 + 1024 x 10 = 10,340 ms,
    # 4 complete per 10,340 ms, so a request waits (16 / 4 - 1) x 10,340 ms for one
    assert pm.admission_wait_ms(16, 4, 100.0, 10.0, 1024) == 3 * 10_340 == 31_020


def test_requests_over_the_kv_pool_wait_for_admission(serving_model):  # noqa: F811
    # Llama-3.1-70B bf16 on 2 x H100, 16 clients of 1024 / 1024: the weights leave 657,276,600 B of
    # SGLang's static memory; at an FP8 KV cell (81,920 B) one request at 2048 tokens and
    # floor(489,504,440 / (1536 x 81,920)) = 3 more at the mean context fit: 4 slots
    row = _row(model_path="meta-llama/Llama-3.1-70B", system="h100_sxm", gemm_quant_mode="bf16",
               moe_quant_mode="bf16", precision="bf16")  # fmt: skip
    p = sd.point_from_csv_row(row, "f:1")
    assert not p.kv_stated  # the CSV does not say its KV dtype: the largest pool it could have had
    pr = pm.prepare(p)
    assert pr.kv_limit == 2 and pr.admitted is not None and pr.admitted.point.concurrency == 4
    held = serving_model._predict_held([pr.admitted])
    got = serving_model.predict([pr])
    wait = (16 / 4 - 1) * (held["ttft_ms"][0] + 1024 * held["tpot_ms"][0])
    assert got["admission_ms"][0] == pytest.approx(wait, rel=1e-12)
    assert got["ttft_ms"][0] == pytest.approx(held["ttft_ms"][0] + wait, rel=1e-12)
    assert got["tpot_ms"][0] == held["tpot_ms"][0]  # the server decodes the 4 it holds
    # a stated bf16 KV (a user's deployment, a knowledge-base run) holds 2
    from dataclasses import replace

    assert pm.prepare(replace(p, kv_stated=True)).admitted.point.concurrency == 2
    # other engines' pools are not SGLang's: no admission modelled; within the pool: none needed
    assert pm.prepare(replace(p, engine="vllm")).admitted is None
    small = pm.prepare(replace(p, concurrency=4.0))
    assert small.admitted is None and serving_model.predict([small])["admission_ms"][0] == 0.0


def test_tensorrt_llm_admits_at_each_requests_whole_length(serving_model):  # noqa: F811
    # the same 16 clients on TensorRT-LLM: its scheduler reserves each request's isl + osl = 2048
    # tokens, so of the 657,276,600 B one request at 2048 and floor(489,504,440 / (2048 x 81,920))
    # = 2 more fit (3 slots, where SGLang's mean context 1536 gives 4)
    from dataclasses import replace

    row = _row(model_path="meta-llama/Llama-3.1-70B", system="h100_sxm", gemm_quant_mode="bf16",
               moe_quant_mode="bf16", precision="bf16")  # fmt: skip
    p = replace(sd.point_from_csv_row(row, "f:1"), engine="trtllm")
    assert 1 + math.floor((657_276_600 - 2048 * 81_920) / (2048 * 81_920)) == 3
    model, gpu = get_model("llama-3.1-70b"), get_gpu("h100")
    fp8 = replace(p, kv_bytes=1.0)
    assert pm.kv_limit(model, gpu, fp8, reserved=True) == 3 and pm.kv_limit(model, gpu, fp8) == 4
    pr = pm.prepare(p)
    assert pr.admitted is not None and pr.admitted.point.concurrency == 3
    held = serving_model._predict_held([pr.admitted])
    got = serving_model.predict([pr])
    wait = (16 / 3 - 1) * (held["ttft_ms"][0] + 1024 * held["tpot_ms"][0])
    assert got["ttft_ms"][0] == pytest.approx(held["ttft_ms"][0] + wait, rel=1e-12)
    # within the reserved pool: no wait
    assert pm.prepare(replace(p, concurrency=3.0)).admitted is None


def test_quantized_reuploads_resolve_to_base_architecture():
    assert pm.resolve_model("Qwen/Qwen3-235B-A22B-FP8").key == "qwen3-235b-a22b"
    assert pm.resolve_model("nvidia/DeepSeek-R1-NVFP4").key == "deepseek-v3"
    with pytest.raises(sd.RowError, match="no model profile"):
        pm.resolve_model("acme/NotAModel-7B")


def test_fitted_model_in_sample_accuracy_and_the_shipped_fit(advisor_home, serving_model):  # noqa: F811
    points, _ = pm.training_points()
    preps, _ = pm.prepare_all(points[::7])
    pred = serving_model.predict(preps)
    meas = np.array([p.point.tpot_ms for p in preps])
    ape = np.abs(pred["tpot_ms"] / meas - 1)
    assert np.median(ape) < 0.25  # in-sample; the held-out numbers come from `model eval`
    # without serving runs in the KB the shipped fit serves: nothing is fitted or written
    again, info = pm.load_or_fit()
    assert info["shipped"] and info["cached"] and again.key == serving_model.key
    assert (
        info["path"].endswith(pm.SHIPPED_MODEL) and not pm.cache_path(pm.data_key(pm.SETTINGS, [])).exists()
    )
    # other settings are another model: fitted, not the shipped one
    assert pm.data_key(dict(pm.SETTINGS, use_gbm=False), []) != pm.data_key(pm.SETTINGS, [])
    assert pm.data_key(pm.SETTINGS, [{"id": 1, "kind": "serving"}]) != pm.data_key(pm.SETTINGS, [])
    other, info = pm.load_or_fit(settings=dict(pm.SETTINGS, use_gbm=False))
    assert not info["shipped"] and not info["cached"] and other.key != serving_model.key
    assert info["path"] == str(pm.cache_path(pm.data_key(dict(pm.SETTINGS, use_gbm=False), [])))


def test_tree_ensemble_predicts_what_sklearn_predicts_to_the_bit():
    """The stored trees, evaluated with numpy, give scikit-learn's predictions exactly: on the rows it
    was fitted on, on values lying exactly on a split threshold (``<=`` goes left), on NaNs
    (seen in training, so both NaN directions occur) and on values outside the training range."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    rng = np.random.default_rng(int(rng_seed()))
    X = rng.lognormal(size=(900, 6)) * [1.0, 1e-3, 1e3, 7.0, 1.0, 0.1]
    X[rng.random(X.shape) < 0.05] = np.nan
    y = np.log1p(np.nan_to_num(X[:, 0])) - 0.3 * np.nan_to_num(X[:, 3]) + rng.normal(0, 0.1, 900)
    est = HistGradientBoostingRegressor(**pm.SETTINGS["gbm"]).fit(X, y)
    trees = pm.TreeEnsemble.from_sklearn(est)
    splits = np.flatnonzero(~trees.is_leaf)  # one row per split, its feature set to the threshold
    on_split = X[rng.integers(0, len(X), size=len(splits))]
    on_split[np.arange(len(splits)), trees.feature[splits]] = trees.threshold[splits]
    wide = rng.normal(0, 1e4, size=(50, 6))
    for Z in (X, on_split, wide, X[:1]):
        np.testing.assert_array_equal(trees.predict(Z), est.predict(Z))
    assert trees.predict(X[:0]).shape == (0,)
    again = pm.TreeEnsemble(trees.baseline, **trees.arrays())
    np.testing.assert_array_equal(again.predict(X), est.predict(X))


def rng_seed() -> int:
    import os

    seed = int(os.environ.get("HPC_ADVISE_TEST_SEED", np.random.SeedSequence().entropy % 2**32))
    print(f"HPC_ADVISE_TEST_SEED={seed}")
    return seed


def test_out_of_range_is_flagged(serving_model):  # noqa: F811
    p = sd.point_from_csv_row(_row(isl="200000", model_path="hy3"), "x:1")
    notes = serving_model.out_of_range(pm.prepare(p))
    assert any(n.startswith("isl 200000 outside training range") for n in notes)
    assert any("hy3 not in training data" in n for n in notes)


def test_grouped_cv_holds_out_whole_groups():
    points, _ = pm.training_points()
    preps, _ = pm.prepare_all(points[::3])
    settings = dict(pm.SETTINGS, gbm=dict(pm.SETTINGS["gbm"], max_iter=20))
    rows = pm.evaluate(preps, settings, by=("gpu",))
    groups = {r["group"] for r in rows}
    assert {"h100", "h200", "b200", "all"} <= groups
    for r in rows:
        assert (
            r["n"] > 0 and math.isfinite(r["tpot_median_ape"]) and r["tpot_p90_ape"] >= r["tpot_median_ape"]
        )
    assert sum(r["n"] for r in rows if r["group"] != "all") == next(
        r["n"] for r in rows if r["group"] == "all"
    )


def test_imported_serving_runs_join_the_training_data(tmp_path, serving_model):  # noqa: F811
    """An SGLang bench_serving result imported into a real KB becomes a training point and a new
    model key (so the next fit includes it)."""
    import json

    from hpc_advise.knowledge_base.importers import parse_files
    from hpc_advise.knowledge_base.store import KnowledgeBase

    record = {
        "backend": "sglang", "dataset_name": "random", "max_concurrency": 16, "random_input_len": 1024,
        "random_output_len": 512, "duration": 60.0, "completed": 500, "request_throughput": 8.0,
        "output_throughput": 4000.0, "mean_ttft_ms": 120.0, "median_ttft_ms": 110.0, "p99_ttft_ms": 300.0,
        "mean_tpot_ms": 14.0, "median_tpot_ms": 13.5, "median_itl_ms": 13.0, "median_e2e_latency_ms": 7000.0,
        "server_info": {"model_path": "Qwen/Qwen3-32B", "tp_size": 2, "kv_cache_dtype": "fp8_e4m3", "version": "0.5.23"},
    }  # fmt: skip
    src = tmp_path / "bench.jsonl"
    src.write_text(json.dumps(record) + "\n")
    db = tmp_path / "kb.db"
    KnowledgeBase(db).import_runs(parse_files([src], gpu="NVIDIA H200"))
    run = KnowledgeBase(db).runs(kind="serving")[0]
    p = sd.point_from_run(run)
    assert (p.engine, p.n_gpus, p.concurrency, p.isl, p.kv_bytes, p.tpot_ms) == (
        "sglang",
        2,
        16.0,
        1024.0,
        1.0,
        14.0,
    )
    prep = pm.prepare(p)
    assert prep.gpu_key == "h200" and prep.model_key == "qwen3-32b" and prep.point.dense_quant == "bf16"
    points, _ = pm.training_points(db)
    assert any(q.where == f"kb:runs:{run['id']}" for q in points)
    key = pm.data_key(pm.SETTINGS, pm._kb_serving_runs(db))
    assert key != pm.data_key(pm.SETTINGS, [])
    # a KB with serving runs is fitted (not the shipped model), cached under its data hash, and the
    # cached file gives the same model back, to the bit
    fitted, info = pm.load_or_fit(db)
    assert not info["shipped"] and not info["cached"] and info["path"] == str(pm.cache_path(key))
    assert fitted.n_rows == serving_model.n_rows + 1 and fitted.key != serving_model.key
    cached, info = pm.load_or_fit(db)
    assert info["cached"] and not info["shipped"] and cached.key == fitted.key
    assert cached.left_out == fitted.left_out and cached.theta == fitted.theta
    preps, _ = pm.prepare_all(points[::50])
    for k, v in fitted.predict(preps).items():
        np.testing.assert_array_equal(cached.predict(preps)[k], v)


def test_model_cli_fit_and_show(advisor_home, serving_model):  # noqa: F811
    import json

    from click.testing import CliRunner

    from hpc_advise.advisor.cli import model

    res = CliRunner().invoke(model, ["fit"])
    assert res.exit_code == 0 and f"shipped: model {serving_model.key}" in res.output
    assert "rows left out" in res.output and "disagg" in res.output
    res = CliRunner().invoke(model, ["show", "--json"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.output)
    assert shown["key"] == serving_model.key and set(shown["theta"]) == {"tpot", "ttft"}
    assert shown["ranges"]["engines"] == ["sglang", "trtllm", "vllm"]


def test_rows_that_multiply_the_replica_by_ep_fold_to_the_deployment_that_ran():
    # tp 64 with moe 8 x 8 (64 GPUs) is the same run as tp 8, moe 1 x 8 on one 8-GPU node
    folded = sd.point_from_csv_row(
        _row(tp_size="64", moe_tp_size="8", moe_ep_size="8", batch_size="16"), "f:1"
    )
    assert (folded.n_gpus, folded.attn_dp, folded.moe_ep, folded.concurrency) == (8, 1, 8, 16.0)
    src = "a; silicon_concurrency=256; b"
    dp = sd.point_from_csv_row(
        _row(tp_size="1", attention_dp_size="64", moe_tp_size="8", moe_ep_size="8", batch_size="4",
             silicon_data_source=src),
        "f:2",
    )  # fmt: skip
    assert (dp.n_gpus, dp.attn_dp, dp.moe_ep, dp.concurrency) == (8, 8, 8, 256.0)
    # a deployment inside one node keeps its columns (tp 4 = moe_tp 2 x moe_ep 2)
    kept = sd.point_from_csv_row(_row(tp_size="4", moe_tp_size="2", moe_ep_size="2"), "f:3")
    assert (kept.n_gpus, kept.moe_ep) == (4, 2)
    # in the seed, such rows repeat measurements of the folded deployment to the last digit
    rows = [r for _, r in sd.read_csv_rows(None) if r["mode"] == "agg" and r["silicon_tpot_ms"]]
    by_meas: dict = {}
    for r in rows:
        by_meas.setdefault((r["silicon_tpot_ms"], r["silicon_ttft_ms"]), []).append(r)
    twins = 0
    for r in rows:
        if r["tp_size"] == "64" and r["moe_tp_size"] == r["moe_ep_size"] == "8":
            p = sd.point_from_csv_row(r, "seed")
            others = [o for o in by_meas[(r["silicon_tpot_ms"], r["silicon_ttft_ms"])] if o["tp_size"] == "8"]
            twins += bool(others)
            assert all(int(o["tp_size"]) * int(o["attention_dp_size"] or 1) == p.n_gpus for o in others)
    assert twins >= 10


def test_ep_without_attention_dp_adds_no_all_to_all():
    s, r = F.shapes_of(get_model("qwen3-235b-a22b")), F.Rates.of(get_gpu("h200"))
    tp8 = F.decode_step(s, r, F.Deployment(8, dense_quant="fp8", moe_quant="fp8"), 64 * 2048, 64)
    ep8 = F.decode_step(s, r, F.Deployment(8, moe_ep=8, dense_quant="fp8", moe_quant="fp8"), 64 * 2048, 64)
    # TP attention + EP experts: the all-reduces after attention and after the MoE are all it needs
    assert ep8["n_collectives"] == tp8["n_collectives"] == 2 * s.layers
    assert ep8["comm"] == pytest.approx(tp8["comm"])
    dep_dp = F.Deployment(8, attn_dp=8, moe_ep=8, dense_quant="fp8", moe_quant="fp8")
    dp8 = F.decode_step(s, r, dep_dp, 8 * 2048, 8)
    assert dp8["n_collectives"] == 2 * s.moe_layers and dp8["comm"] > 0  # gather / scatter per MoE layer
    pf_ep = F.prefill(s, r, F.Deployment(8, moe_ep=8), 2048)
    pf_tp = F.prefill(s, r, F.Deployment(8), 2048)
    assert pf_ep["comm"] == pytest.approx(pf_tp["comm"])


def test_four_bit_weights_compute_at_bf16_without_fp4_tensor_cores():
    h200, b200 = F.Rates.of(get_gpu("h200")), F.Rates.of(get_gpu("b200"))
    assert h200.peak("nvfp4") == h200.peak("mxfp4") == h200.peak("bf16") < h200.peak("fp8")
    assert b200.peak("nvfp4") == pytest.approx(get_gpu("b200").fp4_tflops * 1e6)
    assert b200.peak("nvfp4") > b200.peak("fp8")


def test_stage1_fit_is_not_pulled_by_a_few_wrong_rows():
    rng = np.random.default_rng(0)
    X = rng.uniform(0.1, 1.0, size=(400, 4)) * [1.0, 10.0, 100.0, 5.0]
    theta = np.array([3.0, 0.5, 0.02, 1.0])
    y = X @ theta
    y[:40] *= 3.0  # a tenth of the rows measured something else
    l1, l2 = pm._nnls_rel(X, y, l1=True), pm._nnls_rel(X, y, l1=False)
    assert np.abs(l1 / theta - 1).max() < 0.02
    assert np.abs(l2 / theta - 1).max() > 0.05


def test_correction_learns_within_model_shape_not_each_models_level():
    points, _ = pm.training_points()
    preps, _ = pm.prepare_all(points[::4])
    gbm = dict(pm.SETTINGS["gbm"], max_iter=40)
    models = np.array([p.model_key for p in preps])

    def level_spread(target: str) -> float:
        m = pm.fit(preps, dict(pm.SETTINGS, gbm=gbm, gbm_target=target))
        pred = m.predict(preps)
        corr = np.log(pred["tpot_ms"] / pred["tpot_base_ms"])
        return float(np.ptp([np.median(corr[models == k]) for k in set(models)]))

    # pooled: the correction moves whole models up or down; within-model: it cannot
    assert level_spread("within_model") < 0.5 * level_spread("pooled")
    v = np.array([1.0, 2.0, 9.0, 5.0, 7.0])
    assert pm._group_medians(v, np.array(list("aabbb"))).tolist() == [1.5, 1.5, 7.0, 7.0, 7.0]


def test_engine_family_cv_never_trains_on_the_held_out_group(monkeypatch):
    points, _ = pm.training_points()
    preps, _ = pm.prepare_all(points[::5])
    calls = []
    real_fit = pm.fit

    def spy(train, settings=None):
        calls.append({pm.group_key(p, "engine_family") for p in train})
        return real_fit(train, settings)

    monkeypatch.setattr(pm, "fit", spy)
    out = pm.cv_predictions(preps, "engine_family", dict(pm.SETTINGS, use_gbm=False))
    groups = sorted(set(out["groups"]))
    assert {"vllm@hopper", "trtllm@hopper", "sglang@blackwell", "vllm@blackwell"} <= set(groups)
    assert len(calls) == len(groups)
    for held, seen in zip(groups, calls, strict=True):
        assert held not in seen and len(seen) == len(groups) - 1
    assert np.isfinite(out["tpot_ms"]).all()
    assert pm.gpu_family("h100") == pm.gpu_family("h200") == "hopper"
    assert pm.gpu_family("b300") == "blackwell"


def test_prefill_occupancy_is_the_tpot_fits_gpu_time_not_the_ttft_latency(serving_model):  # noqa: F811
    """recommend's prefill service time comes from the TPOT fit's prefill-interference terms (how
    much decode slowed for the prefills beside it), floored at the roofline; SGLang's TTFT prefill
    coefficient, a latency with the measured runs' queueing in it, is several times larger."""
    import dataclasses

    th = serving_model.theta
    t = th["tpot"].get("sglang", th["tpot"]["*"])
    alone, mixed = t[pm.TPOT_TERMS.index("interference_alone")], t[pm.TPOT_TERMS.index("interference")]
    occ = serving_model.prefill_occupancy("sglang")
    assert occ == pytest.approx(max(alone + mixed, 1.0))
    # the measured-kernel estimate for hy3 TP8 on H200 is 1.9-2.2x the roofline (docstring)
    assert 1.0 <= occ < 3.0
    ttft_coef = th["ttft"].get("sglang", th["ttft"]["*"])[pm.TTFT_TERMS.index("prefill")]
    assert ttft_coef > 3.0 * occ
    # an engine without its own factor uses the pooled terms; a degenerate fit cannot go below the roofline
    assert serving_model.prefill_occupancy("no-such-engine") == pytest.approx(
        max(
            th["tpot"]["*"][pm.TPOT_TERMS.index("interference_alone")]
            + th["tpot"]["*"][pm.TPOT_TERMS.index("interference")],
            1.0,
        )
    )
    zero = dataclasses.replace(serving_model, theta={**th, "tpot": {"*": [0.0] * len(pm.TPOT_TERMS)}})
    assert zero.prefill_occupancy("sglang") == 1.0
