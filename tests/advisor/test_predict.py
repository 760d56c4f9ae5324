"""predict: one configuration, and --batch over a CSV in the training data's format."""

from __future__ import annotations

import csv
import json

from click.testing import CliRunner

from hpc_advise.advisor import serving_data as sd
from hpc_advise.advisor.cli import predict
from tests.advisor.advisor_helpers import advisor_home  # noqa: F401


def _run(args):
    res = CliRunner().invoke(predict, args)
    assert res.exit_code == 0, res.output
    return res.output


def test_predict_one_config_json(advisor_home):  # noqa: F811
    base = [
        "--model",
        "qwen3-32b",
        "--gpu",
        "h200",
        "--gpus",
        "2",
        "--tp",
        "2",
        "--isl",
        "1024",
        "--osl",
        "512",
        "--json",
    ]
    lo = json.loads(_run(base + ["--concurrency", "4"]))
    hi = json.loads(_run(base + ["--concurrency", "128"]))
    for out in (lo, hi):
        assert out["ttft_ms"]["p50"] > 0 and out["tpot_ms"]["p50"] > 0 and out["output_tok_s"] > 0
        assert out["tpot_ms"]["p99"] >= out["tpot_ms"]["p50"]
    assert hi["tpot_ms"]["p50"] > lo["tpot_ms"]["p50"]  # bigger decode batches take longer per step
    assert hi["output_tok_s"] > lo["output_tok_s"]  # ... but serve more tokens
    text = _run(base[:-1] + ["--concurrency", "4"])
    assert "TPOT p50" in text and "TTFT p50" in text and "tok/s" in text


def test_predict_needs_workload():
    res = CliRunner().invoke(predict, ["--model", "qwen3-32b", "--gpu", "h200"])
    assert res.exit_code != 0 and "--isl" in res.output


def test_batch_predicts_in_order_with_reasons(advisor_home, tmp_path):  # noqa: F811
    rows = [r for _, r in sd.read_csv_rows(None)]
    good = next(r for r in rows if r["mode"] == "agg" and r["system"] == "h200_sxm")
    disagg = next(r for r in rows if r["mode"] == "disagg")
    unknown = dict(good, id="unknown-model", model_path="acme/Nope-7B")
    path = tmp_path / "eval.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(good))
        w.writeheader()
        for r in (disagg, good, unknown):
            w.writerow(r)
    out = json.loads(_run(["--batch", str(path), "--json"]))
    assert [o["id"] for o in out] == [disagg["id"], good["id"], "unknown-model"]
    assert out[0]["tpot_ms"] is None and "disaggregated" in out[0]["reason"]
    assert out[1]["tpot_ms"] > 0 and out[1]["ttft_ms"] > 0 and out[1]["reason"] is None
    assert out[2]["tpot_ms"] is None and "no model profile" in out[2]["reason"]
    written = list(csv.DictReader((tmp_path / "eval.predictions.csv").open()))
    assert [r["id"] for r in written] == [o["id"] for o in out]
    assert float(written[1]["tpot_ms"]) == out[1]["tpot_ms"]


def test_nic_bandwidth_enters_only_beyond_one_node(advisor_home):  # noqa: F811
    """TP16 on two 8-GPU H200 nodes: its all-reduces cross the NIC (the profile's 50 GB/s per GPU, or
    --nic-gbps), so a slower NIC slows it; TP8 inside one node does not move. --nic-gbps is refused
    at parse time when it is not a positive finite number."""
    from hpc_advise.advisor import roofline as F
    from hpc_advise.profiles.resolve import resolve_gpu

    def tpot(gpus, nic=()):
        args = ["--model", "deepseek-v3", "--gpu", "h200", "--gpus", str(gpus), "--tp", str(gpus)]
        args += ["--isl", "2000", "--osl", "500", "--concurrency", "64", "--json", *nic]
        return json.loads(_run(args))["tpot_ms"]["p50"]

    assert tpot(16, ("--nic-gbps", "5")) > 1.2 * tpot(16) and tpot(16, ("--nic-gbps", "50")) == tpot(16)
    assert tpot(8, ("--nic-gbps", "5")) == tpot(8)
    r = F.Rates.of(resolve_gpu("h200"))
    assert (r.node, r.nic) == (8, 50e3)
    # hierarchical all-reduce over 2 nodes: the in-node one plus each GPU's 1/8 share over its NIC
    nbytes = 64 * 7168 * 2.0
    inter = F.comm_model.BUSBW_FACTOR["allreduce"](2) * nbytes / 8 / r.nic
    assert F._collective(nbytes, 16, r, "allreduce") == F._collective(nbytes, 8, r, "allreduce") + inter
    for bad in ("0", "-1", "nan", "inf", "fast", "2000"):
        res = CliRunner().invoke(
            predict,
            ["--model", "qwen3-32b", "--isl", "1", "--osl", "1", "--concurrency", "1", "--nic-gbps", bad],
        )
        assert res.exit_code == 2 and "--nic-gbps" in res.output and "Traceback" not in res.output, res.output
