"""Per-deployment calibration on measured runs (``advisor.calibration``), through a real SQLite
knowledge base: the correction, the runs left out with their reasons, its use in predict / recommend's
Ranker for that deployment only, ``model fit`` / ``validate`` output and ``runs import --model``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from hpc_advise.advisor import calibration as cal
from hpc_advise.advisor.candidates import Candidate, Checked, memory_check
from hpc_advise.cli import main
from hpc_advise.knowledge_base.importers import to_row
from hpc_advise.knowledge_base.store import KnowledgeBase
from tests.advisor.advisor_helpers import advisor_home, serving_model  # noqa: F401

TPOT_RATIO, TTFT_RATIO = 1.5, 0.8
CONCURRENCY = (4, 8, 16)


def record(conc, ttft=100.0, tpot=20.0, server=True, **server_args):
    rec = {
        "backend": "sglang-oai", "duration": 10.0, "completed": 50, "request_throughput": 5.0,
        "output_throughput": 1000.0, "mean_ttft_ms": ttft, "median_ttft_ms": ttft, "p99_ttft_ms": 2 * ttft,
        "mean_tpot_ms": tpot, "median_tpot_ms": tpot, "median_itl_ms": tpot, "median_e2e_latency_ms": 5000.0,
        "max_concurrency": conc, "input_lens": [1024] * 4, "output_lens": [256] * 4,
    }  # fmt: skip
    if server:
        rec["server_info"] = {"model_path": "Qwen/Qwen3-32B", "tp_size": 2, "attention_backend": "flashinfer",
                              "version": "0.5.23", **server_args}  # fmt: skip
    return rec


def row(rec, i, gpu="h200", **config):
    r = to_row(rec, path=Path("runs.jsonl"), lineno=i, mtime="2000-01-01T00:00:00+00:00", gpu=gpu)
    r["config"].update(config)
    return r


def predicted(serving, conc):
    """The serving model's mean TPOT / TTFT for the calibrated deployment at ``conc``."""
    obs, dropped = cal.observe([dict(row(record(conc), 0), id=0)], serving)
    assert not dropped, dropped
    return obs[0].predicted


@pytest.fixture(scope="module")
def kb_file(tmp_path_factory, serving_model):  # noqa: F811
    """A KB with three runs of one deployment measured at 1.5x / 0.8x the model's TPOT / TTFT, and
    runs that calibration must leave out."""
    path = tmp_path_factory.mktemp("calib") / "kb.sqlite"
    rows = []
    for i, conc in enumerate(CONCURRENCY):
        p = predicted(serving_model, conc)
        rows.append(row(record(conc, ttft=p["ttft"] * TTFT_RATIO, tpot=p["tpot"] * TPOT_RATIO), i + 1))
    rows.append(row(record(8, ttft=1.0, tpot=1.0), 10, partial=True, partial_reasons=["dropped_stream 3"]))
    rows.append(row(record(8, server=False), 11))  # no server_info: no model
    rows.append(row(record(8, pp_size=2), 12))
    rows.append(row(record(8, speculative_algorithm="EAGLE"), 13))
    rows.append(row(record(8), 14, gpu=None))
    rows.append(row(record(8, attention_backend=None), 15))
    with KnowledgeBase(path) as kb:
        kb.import_runs(rows)
    return path


def kb_runs(path):
    with KnowledgeBase(path) as kb:
        return kb.runs(kind="serving")


def test_correction_is_the_shrunk_median_log_ratio_and_dropped_runs_say_why(kb_file, serving_model):  # noqa: F811
    c = cal.calibrate(kb_runs(kb_file), serving_model)
    assert len(c.corrections) == 1
    (corr,) = c.corrections.values()
    assert corr.n == 3
    shrink = 3 / (3 + cal.SHRINK_RUNS)
    assert corr.factor["tpot"] == pytest.approx(TPOT_RATIO**shrink, rel=1e-6)
    assert corr.factor["ttft"] == pytest.approx(TTFT_RATIO**shrink, rel=1e-6)
    assert corr.median_ratio["tpot"] == pytest.approx(TPOT_RATIO, rel=1e-6)
    assert corr.note().startswith("calibrated on 3 runs")
    reasons = [why for _, why in c.dropped]
    assert len(reasons) == 6, reasons
    for want in ("partial run (dropped_stream 3)", "no model", "pipeline parallelism", "speculative decoding",
                 "no GPU", "attention backend"):  # fmt: skip
        assert sum(want in r for r in reasons) == 1, (want, reasons)


def test_lookup_matches_that_deployment_only(kb_file, serving_model):  # noqa: F811
    c = cal.calibrate(kb_runs(kb_file), serving_model)
    hit = Candidate(2, 1, 1, 1, "flashinfer", None, "auto")
    assert c.lookup("qwen3-32b", "h200", hit) is not None
    for other in (Candidate(2, 1, 1, 1, "flashinfer", None, "fp8_e4m3"), Candidate(2, 1, 1, 1, "fa3", None, "auto"),
                  Candidate(2, 2, 1, 1, "flashinfer", None, "auto"), Candidate(1, 1, 1, 1, "flashinfer", None, "auto")):  # fmt: skip
        assert c.lookup("qwen3-32b", "h200", other) is None
    assert c.lookup("qwen3-32b", "h100", hit) is None
    assert not cal.Calibration() and cal.Calibration().lookup("qwen3-32b", "h200", hit) is None


def test_leave_one_out_errors_before_and_after(kb_file, serving_model):  # noqa: F811
    c = cal.calibrate(kb_runs(kb_file), serving_model)
    loo = cal.leave_one_out(c.observations)
    f_two = TPOT_RATIO ** (2 / (2 + cal.SHRINK_RUNS))  # fitted on the two other runs
    assert loo["tpot"]["median_abs_before"] == pytest.approx(1 - 1 / TPOT_RATIO, rel=1e-6)
    assert loo["tpot"]["median_abs_after"] == pytest.approx(1 - f_two / TPOT_RATIO, rel=1e-6)
    assert loo["ttft"]["median_abs_after"] < loo["ttft"]["median_abs_before"]
    assert all(r["n_fit"] == 2 for r in loo["runs"])


def _ranked(serving, calibration, cand, conc=8.0):
    from hpc_advise.advisor.kernel_models import load_attention_model
    from hpc_advise.advisor.recommend import Ranker, TraceLoad
    from hpc_advise.advisor.serving_model import resolve_gpu, resolve_model

    mdl, gpu = resolve_model("qwen3-32b"), resolve_gpu("h200")
    w = TraceLoad(1024.0, 256.0, np.array([[1024.0, 256.0]]), None, 0.0, 1024 + 128, 1024 + 256, int(conc))
    ranker = Ranker("qwen3-32b", mdl, gpu, w, serving, load_attention_model(None), calibration)
    ok, why, mem = memory_check(cand, mdl, gpu, conc, w.ctx_mean, w.ctx_p99)
    pred = next(iter(ranker.serving_predictions([cand], {cand: conc}).values()))
    return ranker.rank_one(Checked(cand, ok, why, mem), conc, pred, None, None)


def test_ranker_applies_the_correction_to_its_deployment_only(kb_file, serving_model):  # noqa: F811
    c = cal.calibrate(kb_runs(kb_file), serving_model)
    (corr,) = c.corrections.values()
    hit = Candidate(2, 1, 1, 1, "flashinfer", None, "auto")
    other = Candidate(2, 1, 1, 1, "flashinfer", None, "fp8_e4m3")
    plain, fixed = _ranked(serving_model, None, hit), _ranked(serving_model, c, hit)
    # the reference attention backend adds no kernel delta: TPOT scales exactly by the factor
    assert fixed.tpot_p50 == pytest.approx(plain.tpot_p50 * corr.factor["tpot"], rel=1e-9)
    assert fixed.ttft_p50 == pytest.approx(plain.ttft_p50 * corr.factor["ttft"], rel=1e-9)
    assert fixed.calibration == corr.note() and fixed.to_dict()["calibration"] == corr.note()
    assert plain.calibration is None and "calibration" not in plain.to_dict()
    a, b = _ranked(serving_model, None, other), _ranked(serving_model, c, other)
    assert a.to_dict() == b.to_dict()


def test_model_fit_predict_and_validate_cli(kb_file):
    r = CliRunner().invoke(main, ["model", "fit", "--db", str(kb_file)])
    assert r.exit_code == 0, r.output
    assert "calibration: 1 deployment(s) from 3 measured run(s)" in r.output
    assert "qwen3-32b on h200: TP2 attn=flashinfer kv=auto: calibrated on 3 runs" in r.output
    assert r.output.count("left out kb:runs:") == 6
    assert "partial run" in r.output and "no model (import with `runs import --model NAME`)" in r.output
    args = ["predict", "--model", "qwen3-32b", "--gpu", "h200", "--gpus", "2", "--tp", "2", "--isl", "1024",
            "--osl", "256", "--concurrency", "8", "--db", str(kb_file)]  # fmt: skip
    r = CliRunner().invoke(main, args + ["--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["calibration"].startswith("calibrated on 3 runs")
    r = CliRunner().invoke(main, args + ["--kv-cache-dtype", "fp8_e4m3", "--json"])
    assert r.exit_code == 0 and "calibration" not in json.loads(r.output)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0 and "  = calibrated on 3 runs" in r.output
    r = CliRunner().invoke(main, ["validate", "--run", "1", "--db", str(kb_file), "--json"])
    assert r.exit_code == 0, r.output
    v = json.loads(r.output)["calibration"]
    assert v["n_runs"] == 3
    tpot = next(m for m in v["metrics"] if m["metric"] == "tpot")
    assert v["held_out_of_base"] == [1, 2, 3]
    assert tpot["median_abs_before"] > 0.25 and tpot["median_abs_after"] < tpot["median_abs_before"] - 0.1
    r = CliRunner().invoke(main, ["validate", "--run", "1", "--db", str(kb_file)])
    assert r.exit_code == 0 and "leave-one-out" in r.output and "TPOT mean [ms]" in r.output
    no_model = next(x["id"] for x in kb_runs(kb_file) if not x["config"].get("model"))
    r = CliRunner().invoke(main, ["validate", "--run", str(no_model), "--db", str(kb_file)])
    assert r.exit_code == 1 and "cannot be calibrated" in r.output and "no model" in r.output
    assert "Traceback" not in r.output


def test_validate_holds_the_scored_runs_out_of_the_base_fit_too(tmp_path, serving_model):  # noqa: F811
    """With only the deployment's three runs in the KB, the base under validate's check must be the
    KB-free fit: "before" is then exactly 1 - 1/1.5 on TPOT. A base refitted with the runs among its
    rows would have learnt part of the 1.5x and score itself better than a user without them sees."""
    db = tmp_path / "kb.sqlite"
    rows = []
    for i, conc in enumerate(CONCURRENCY):
        p = predicted(serving_model, conc)
        rows.append(row(record(conc, ttft=p["ttft"] * TTFT_RATIO, tpot=p["tpot"] * TPOT_RATIO), i + 1))
    with KnowledgeBase(db) as kb:
        kb.import_runs(rows)
    ids = sorted(r["id"] for r in kb_runs(db))
    r = CliRunner().invoke(main, ["validate", "--run", str(ids[0]), "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    v = json.loads(r.output)["calibration"]
    assert v["held_out_of_base"] == ids and v["n_runs"] == 3
    tpot = next(m for m in v["metrics"] if m["metric"] == "tpot")
    f_two = TPOT_RATIO ** (2 / (2 + cal.SHRINK_RUNS))
    assert tpot["median_abs_before"] == pytest.approx(1 - 1 / TPOT_RATIO, rel=1e-6)
    assert tpot["median_abs_after"] == pytest.approx(1 - f_two / TPOT_RATIO, rel=1e-6)
    # the fit `model fit` / predict use keeps the runs: its own errors on them are smaller
    from hpc_advise.advisor import serving_model as pm

    with_runs, _ = pm.load_or_fit(db)
    obs, _ = cal.observe(kb_runs(db), with_runs)
    inside = float(np.median([abs(o.predicted["tpot"] / o.measured["tpot"] - 1) for o in obs]))
    assert inside < tpot["median_abs_before"] - 0.005, inside


def test_decode_backend_names_the_deployment():
    base = row(record(8), 1)
    ours = row(record(8, decode_attention_backend="hpc_advise", page_size=64), 2)
    a, b = cal.deployment_of_run(dict(base, id=1)), cal.deployment_of_run(dict(ours, id=2))
    assert a.attention_backend == "flashinfer" and b.attention_backend == "hpc_advise" and a != b


def test_runs_import_model_names_records_without_one(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps(record(8, server=False)) + "\n" + json.dumps(record(4)) + "\n")
    db = tmp_path / "kb.sqlite"
    r = CliRunner().invoke(main, ["runs", "import", str(f), "--model", "Qwen/Qwen3-32B", "--gpu", "h200",
                                  "--db", str(db)])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "model Qwen/Qwen3-32B stored for 1 record(s)" in r.output
    models = sorted(run["config"].get("model") for run in kb_runs(db))
    assert models == ["Qwen/Qwen3-32B", "Qwen/Qwen3-32B"]
    r = CliRunner().invoke(
        main, ["runs", "import", str(f), "--model", " ", "--db", str(tmp_path / "b.sqlite")]
    )
    assert r.exit_code == 1 and "--model must not be empty" in r.output
