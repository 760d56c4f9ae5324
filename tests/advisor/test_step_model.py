"""The physics step cost and its fit with the simulator in the loop (``advisor/step_model.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from hpc_advise.advisor import roofline as F
from hpc_advise.advisor import step_model as sm
from hpc_advise.advisor.simulate import PrefillShape, Workload, simulate
from hpc_advise.profiles.resolve import resolve_gpu, resolve_model


def _deployed(model="qwen3-235b-a22b", tp=8, dp=1, ep=1, kv=2.0):
    mdl = resolve_model(model)
    q = F.normalize_quant(mdl.quantization)
    return sm.deployed(mdl, resolve_gpu("h200"), F.Deployment(tp, dp, ep, q, q, kv))


def test_decode_cost_is_the_roofline_terms_times_theta():
    d = _deployed()
    th_d = np.arange(1, sm.N_D + 1, dtype=float)
    th_p = np.ones(len(sm.PREFILL_TERMS))
    cost = sm.RooflineStepCost(d.terms, th_d, th_p)
    step = F.decode_step(d.terms.s, d.terms.rates, d.terms.dep, ctx_sum=50_000.0, batch=16.0)
    expect = (
        1 * 1000.0
        + 2 * 10.0 * d.terms.s.layers
        + 3 * step["attn_kv"]
        + 4 * (step["attn_proj"] + step["dense_ffn"] + step["lm_head"])
        + 5 * (step["moe"] + step["router"])
        + 6 * step["comm"]
        + 7 * 10.0 * step["n_collectives"]
        + 8 * 10.0 * d.terms.s.moe_layers
        + 9 * step["moe_routed"]
    ) * 1e-6
    assert cost.decode_s(16, 50_000) == pytest.approx(expect, rel=1e-9)
    run = cost.decode_run_s(16, 50_000, 3)
    assert run[2] == pytest.approx(cost.decode_s(16, 50_032), rel=1e-12)
    pf = cost.prefill_s(PrefillShape(4096, 0, 1, 4096 * 4097 / 2))
    assert pf > cost.prefill_s(PrefillShape(1024, 0, 1, 1024 * 1025 / 2)) > 0


@pytest.mark.parametrize("isl,osl,conc", [(1024, 64, 1), (3000, 40, 12), (9000, 20, 5)])
def test_closed_loop_design_rows_are_exactly_the_simulated_means(isl, osl, conc):
    """In a closed loop the schedule does not depend on step times: simulating with θ gives
    row @ θ for the mean TTFT and TPOT, whatever θ is."""
    d = _deployed()
    ttft_row, tpot_row, _ = sm.design_rows(d, isl, osl, conc)
    rng = np.random.default_rng(0)
    for _ in range(2):
        th = rng.uniform(0.2, 3.0, len(sm.TERMS))
        cost = sm.RooflineStepCost(d.terms, th[: sm.N_D], th[sm.N_D :])
        n = sm.closed_loop_requests(conc)
        w = Workload(
            np.zeros(n),
            np.full(n, isl),
            np.full(n, osl),
            np.full(n, -1),
            np.zeros(n + 1, dtype=np.int64),
            np.zeros(0, dtype=np.int64),
        )
        res = simulate(w, cost, d.config, concurrency=conc)
        assert res.ttft_s.mean() * 1e6 == pytest.approx(ttft_row @ th, rel=1e-6)
        assert res.tpot_s.mean() * 1e6 == pytest.approx(tpot_row @ th, rel=1e-6)


def test_nnls_and_relative_fit_recover_a_known_theta():
    rng = np.random.default_rng(1)
    X = rng.uniform(0.0, 1.0, (200, 5)) * np.array([1.0, 10.0, 1e3, 1e-2, 5.0])
    truth = np.array([2.0, 0.0, 0.5, 30.0, 0.0])
    y = X @ truth
    assert np.allclose(sm.nnls(X, y), truth, atol=1e-8)
    y_noisy = y.copy()
    y_noisy[:10] *= 5.0  # a few rows the physics misdescribes do not pull the fit
    robust = sm.fit_relative(X, y_noisy)
    plain = sm.fit_relative(X, y_noisy, rounds=0)
    assert np.allclose(robust, truth, rtol=1e-2, atol=1e-6)
    assert np.abs(robust - truth).sum() < 0.2 * np.abs(plain - truth).sum()


def test_levels_give_an_unseen_engine_family_cell_its_engine_plus_family():
    eng = np.array(["a"] * 4 + ["b"] * 4 + ["a"] * 4)
    fam = np.array(["x"] * 8 + ["y"] * 4)
    logr = np.array([0.0] * 4 + [1.0] * 4 + [0.5] * 4)
    lv = sm.additive_levels(logr, eng, fam)
    # engine b measured on family x only; family y's level comes from engine a
    assert lv["engine"]["b"] - lv["engine"]["a"] == pytest.approx(1.0)
    assert lv["family"]["y"] - lv["family"]["x"] == pytest.approx(0.5)


def test_mla_under_attention_dp_holds_its_compressed_kv_once_per_group():
    mdl = resolve_model("deepseek-v3")
    gpu = resolve_gpu("h200")
    q = F.normalize_quant(mdl.quantization)
    tp8 = sm.kv_pool_tokens(mdl, gpu, F.Deployment(8, 1, 8, q, q, 2.0), mem_fraction=0.85)
    dp8 = sm.kv_pool_tokens(mdl, gpu, F.Deployment(8, 8, 8, q, q, 2.0), mem_fraction=0.85)
    # the latent is not split by TP: every TP8 rank holds each token's whole KV, so the replica's pool
    # is one rank's; under attention DP8 each GPU is a group with its own requests' KV (less room:
    # the attention weights are replicated), and the replica holds eight such pools
    assert tp8 > 100_000 and dp8 < tp8 and 8 * dp8 > 4 * tp8


def test_training_rows_replay_measured_runs_and_cv_holds_out_groups():
    from hpc_advise.advisor import serving_model as pm

    points, _ = pm.training_points()
    preps, _ = pm.prepare_all(points[::60])
    rows = sm.training_rows(preps)
    assert len(rows.tpot_ms) >= 40 and np.isfinite(rows.tpot).all()
    assert (rows.ttft[:, sm.N_D] >= 1000.0).all()  # every TTFT holds at least its own prefill step
    res = sm.evaluate(rows, by=("gpu",))
    pooled = [r for r in res if r["group"] == "all"][0]
    assert pooled["n"] <= len(rows.tpot_ms) and np.isfinite(pooled["tpot_median_ape"])
