"""recommend's simulated stage (``advisor/simulated.py``) and the level solve it rests on
(``step_model.solve_levels``): the solve reproduces its targets, the simulated closed loop at a
training row's point reproduces the two-stage prediction, and what recommend prints for the
simulated rows comes out of the replay (a burst the analytic queue cannot see, the window named)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from hpc_advise.advisor import roofline as F
from hpc_advise.advisor import simulated
from hpc_advise.advisor import step_model as sm
from hpc_advise.advisor.cli import recommend
from hpc_advise.advisor.simulate import simulate
from hpc_advise.profiles.resolve import resolve_gpu, resolve_model
from tests.advisor.advisor_helpers import advisor_home, serving_model  # noqa: F401

CLOSED_LOOP_TOL = 0.03  # "within a few %": the replayed closed loop is the solve's own, so float rounding


def _deployed(model="qwen3-235b-a22b", tp=8, kv=1.0):
    mdl = resolve_model(model)
    q = F.normalize_quant(mdl.quantization)
    return sm.deployed(mdl, resolve_gpu("h200"), F.Deployment(tp, 1, 1, q, q, kv))


def _closed_loop_means(d, cost, levels, isl, osl, conc, reuse=0.0):
    """Mean TTFT / TPOT (ms) of the staggered closed loop, simulated with ``cost`` (not recorded), the
    latency that occupies no GPU added as recommend adds it."""
    cached = int(round(isl * reuse)) if reuse > 0 else -1
    w = sm.closed_loop_workload(isl, osl, conc, cached, stagger=True)
    res = simulate(w, cost, d.config, concurrency=conc)
    c = np.maximum(res.cached_tokens, 0)
    res = res.delayed(levels.latency_ms(cost.roofline_prefill_ms(res.input_len - c, c)) / 1e3)
    later = np.arange(len(w)) >= conc  # the solve averages the requests after the first round
    return float(res.ttft_s[later].mean() * 1e3), float(res.tpot_s[later].mean() * 1e3)


@pytest.mark.parametrize("isl,osl,conc", [(1024, 256, 1), (3000, 400, 12), (8000, 150, 40)])
def test_level_solve_reproduces_its_targets_in_a_simulated_closed_loop(isl, osl, conc):
    """Targets above what the physics gives alone (TPOT 1.6x the closed loop's at factor 1, TTFT 3 s):
    the solve's decode factor and latency scale, simulated step by step (no recorder), give both back;
    the decode factor is linear in the TPOT target (the prefills beside the decode stay as they are)."""
    d = _deployed()
    shape = sm.decode_shape_of([0.0, 3.2, 2.0, 1.2, 1.4, 1.2, 8.4, 0.15, 1.57, 3.5, 20.0])
    occ, split = 1.7, (200.0, 11.0, 1.2)
    _, tpot_row, _ = sm.design_rows(d, isl, osl, conc, stagger=True)
    pd, pp = tpot_row[: sm.N_D] @ shape / 1e3, tpot_row[sm.N_D :] @ sm.PHYSICS_PREFILL / 1e3
    tpot_t = 1.6 * (pd + occ * pp)
    cost, lv = sm.solve_levels(d, isl, osl, conc, tpot_t, 3000.0, split, occ, 0.0, shape)
    assert lv.decode_factor > 1.0 and lv.latency_scale > 0
    assert lv.closed_loop_tpot_ms == pytest.approx(tpot_t, rel=1e-9)
    assert lv.closed_loop_ttft_ms == pytest.approx(3000.0, rel=1e-9)
    ttft, tpot = _closed_loop_means(d, cost, lv, isl, osl, conc)
    assert tpot == pytest.approx(tpot_t, rel=CLOSED_LOOP_TOL)
    assert ttft == pytest.approx(3000.0, rel=CLOSED_LOOP_TOL)
    _, lv2 = sm.solve_levels(d, isl, osl, conc, 2 * tpot_t, 3000.0, split, occ, 0.0, shape)
    assert (lv2.decode_factor - lv.decode_factor) * pd == pytest.approx(tpot_t, rel=1e-9)


def test_level_solve_clamps_instead_of_going_negative():
    """A TTFT target below what the simulated queue and prefill already take gives no latency (not a
    negative one), and the idle TTFT caps the latency at what one request per group leaves over."""
    d = _deployed()
    _, lv = sm.solve_levels(d, 4000, 200, 16, 30.0, 1.0, (100.0, 10.0, 1.0), 1.7)
    assert lv.latency_scale == 0.0 and lv.closed_loop_ttft_ms > 1.0
    _, free = sm.solve_levels(d, 4000, 200, 16, 30.0, 20_000.0, (100.0, 10.0, 1.0), 1.7)
    _, capped = sm.solve_levels(d, 4000, 200, 16, 30.0, 20_000.0, (100.0, 10.0, 1.0), 1.7, idle_ttft_ms=500.0)
    assert capped.latency_scale < free.latency_scale
    assert capped.closed_loop_ttft_ms < 20_000.0 == pytest.approx(free.closed_loop_ttft_ms, rel=1e-9)


def test_closed_loop_at_a_training_rows_point_reproduces_the_two_stage_prediction(serving_model):  # noqa: F811
    """An SGLang training row of the shipped data (its model, GPU, layout, isl / osl, concurrency):
    the levels solved on the two-stage model's prediction there, replayed as that closed loop, give
    the two-stage mean TPOT and TTFT within a few %. ``model eval`` scores that prediction; the
    simulation keeps it at the rows' own points."""
    from hpc_advise.advisor.serving_data import RowError, seed_points
    from hpc_advise.advisor.serving_model import prepare

    points, _ = seed_points()
    rows = [p for p in points if p.engine == "sglang" and p.attn_dp == 1 and 4 <= p.concurrency <= 64]
    rows = sorted(rows, key=lambda p: (p.model, p.gpu, p.isl, p.osl, p.concurrency))
    assert rows, "no SGLang row to check against"
    for p in rows[len(rows) // 2 :]:  # the first from the middle that the profiles resolve
        try:
            pr = prepare(p)
            break
        except RowError:
            continue
    pred = serving_model.predict([pr])
    split = serving_model.ttft_split([pr], pred)
    tpot, ttft = float(pred["tpot_ms"][0]), float(pred["ttft_ms"][0])
    d = sm.deployed(resolve_model(p.model), resolve_gpu(p.gpu), pr.dep)
    conc = int(round(p.concurrency))
    shape = sm.decode_shape_of(serving_model.theta["tpot"].get("sglang", serving_model.theta["tpot"]["*"]))
    parts = tuple(float(split[k][0]) for k in ("overhead_ms", "prefill_coef", "correction"))
    occ = serving_model.prefill_occupancy("sglang")
    cost, lv = sm.solve_levels(d, p.isl, p.osl, conc, tpot, ttft, parts, occ, 0.0, shape)
    got_ttft, got_tpot = _closed_loop_means(d, cost, lv, int(round(p.isl)), int(round(p.osl)), conc)
    assert got_tpot == pytest.approx(tpot, rel=CLOSED_LOOP_TOL), (p.where, lv)
    if lv.latency_scale > 0:  # the solve reached its TTFT target (no clamp)
        assert got_ttft == pytest.approx(ttft, rel=CLOSED_LOOP_TOL), (p.where, lv)


def _mooncake(path: Path, records) -> Path:
    path.write_text(
        "".join(
            json.dumps({"timestamp": int(t * 1000), "input_length": i, "output_length": o}) + "\n"
            for t, i, o in records
        )
    )
    return path


def _run(trace: Path, db: Path, *extra) -> dict:
    args = ["--trace", str(trace), "--model", "qwen3-235b-a22b", "--gpu", "h200", "--gpus", "8"]
    res = CliRunner().invoke(recommend, [*args, "--db", str(db), "--json", "--top", "500", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_a_burst_puts_the_simulated_ttft_tail_above_the_analytic_one(advisor_home, tmp_path):  # noqa: F811
    """A quiet trace (one 4K-token prompt every 2 s) with one burst: 150 requests within one second.
    The screen's M/G/1 queue sees the mean rate only; the replay queues the burst's prefills, so the
    simulated TTFT p99 is far above the screen's for the same layout (a twin row the screen alone
    predicts: its TTFT does not depend on the decode backend), and the busiest window, named in the
    output, holds the burst."""
    rng = np.random.default_rng(3)
    quiet = [(2.0 * k, 4096, 128) for k in range(400)]
    burst = [(400.0 + float(x), 4096, 128) for x in np.sort(rng.uniform(0, 1.0, 150))]
    trace = _mooncake(tmp_path / "burst.jsonl", sorted(quiet + burst))
    out = _run(trace, tmp_path / "kb.db")
    window = out["simulation"]["windows"][0]
    assert window.startswith("busiest window ")
    start, end = (float(x) for x in window.split()[2].split("-"))
    assert start <= 400.0 and end >= 401.0, window
    sim = [r for r in out["ranked"] if r["source"] == "simulation"]
    top = sim[0]
    b = top["simulated"]["busiest"]
    assert top["ttft_ms"]["p99"] == b["ttft_ms"]["p99"] and top["tpot_ms"]["p50"] == b["tpot_ms"]["p50"]
    assert b["queue_ms"]["p99"] > 1000.0  # the burst waited for the prefills ahead of it

    def layout(r):
        c = r["candidate"]
        return (c["tp"], c["replicas"], c["ep"], c["attn_dp"], c["kv_dtype"])

    twins = [r for r in out["ranked"] if r["source"] == "analytic screen" and layout(r) == layout(top)]
    assert twins, "no screened row of the pick's layout to compare with"
    assert top["ttft_ms"]["p99"] > 3.0 * twins[0]["ttft_ms"]["p99"], (top["ttft_ms"], twins[0]["ttft_ms"])


def test_the_text_names_the_window_and_prints_the_distributions(advisor_home, tmp_path):  # noqa: F811
    trace = Path(__file__).resolve().parents[2] / "examples" / "traces" / "agentic_coding.jsonl"
    args = [f"--trace={trace}", "--model=hy3", "--gpu=h200", "--gpus=8", f"--db={tmp_path / 'kb.db'}"]
    res = CliRunner().invoke(recommend, [*args, "--slo-tpot-ms=50", "--slo-ttft-ms=2000", "--top=3"])
    assert res.exit_code == 0, res.output
    text = res.output
    assert "from sim: " in text and "busiest window 294-594 s of the trace" in text
    header = next(line for line in text.splitlines() if line.startswith("|") and "config" in line)
    assert header.rstrip("| ").endswith("from")
    assert "  ~ busiest window: TTFT p50/p90/p99 " in text and "ITL " in text and "queue " in text
    assert "goodput " in text and "prefix cache hit " in text and "KV " in text
    rows = [line for line in text.splitlines() if line.startswith("|   ") and "config" not in line]
    assert rows and all(line.rstrip(" |").endswith(("sim", "screen")) for line in rows)


def test_capacity_named_by_the_simulation_holds_at_90_percent_of_it(advisor_home, tmp_path):  # noqa: F811
    """The highest simulated capacity of an overloaded trace, checked by replaying the same
    configuration on the same trace slowed to 90 % of that rate: it meets the SLOs there."""
    from hpc_advise.advisor import cli
    from hpc_advise.advisor.kernel_models import load_attention_model
    from hpc_advise.advisor.recommend import Ranker, TraceLoad, rank_candidates
    from hpc_advise.advisor.traces import summarize
    from tests.advisor.test_recommend import _poisson_trace

    def ranked_on(trace):
        req = simulated.TraceRequests()
        s = summarize(str(trace), keep=req.add)
        s.requests = req
        serving, _ = cli._load_model(None)
        r = Ranker("hy3", resolve_model("hy3"), resolve_gpu("h200"), TraceLoad.from_summary(s), serving,
                   load_attention_model(None))  # fmt: skip
        return r, rank_candidates(r, 8, 60.0, 2000.0, None)[0]

    hi = _poisson_trace(tmp_path / "hi.jsonl", 2000, 300, rate=30.0)
    _, ranked = ranked_on(hi)
    best = max((r for r in ranked if r.simulated), key=lambda r: r.capacity.x)
    assert 0 < best.capacity.x < 1 and best.capacity.fail_at > best.capacity.x
    lower = _poisson_trace(tmp_path / "lower.jsonl", 2000, 300, rate=0.9 * 30.0 * best.capacity.x)
    ranker, again = ranked_on(lower)
    row = next(r for r in again if r.candidate == best.candidate)
    if not row.simulated:  # the screen ranked it below the simulated shapes there: simulate it alone
        simulated.simulate_ranked(ranker, [row], ranker.sim_plan(None), 60.0, 2000.0, None)
    assert row.meets_slo, (row.candidate.label(), row.tpot_p99, row.ttft_p99, row.sim_failure)
