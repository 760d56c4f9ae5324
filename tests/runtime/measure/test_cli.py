"""``hpc-advise profile``. NVML is the hardware boundary: tests named ``*_fake_nvml`` put a stand-in
``pynvml`` module in ``sys.modules`` (nothing else is faked: real knowledge-base files, real CLI).
Benchmarks need CUDA: the ``gpu`` test runs them on the H200 machine."""

from __future__ import annotations

import json
import sys

import pynvml
import pytest
from click.testing import CliRunner

from hpc_advise.cli import main
from hpc_advise.knowledge_base.store import KnowledgeBase
from hpc_advise.runtime.measure import microbench
from hpc_advise.runtime.measure import profile as measure_profile
from tests.advisor.nvml_fake import FakeGpu, FakeNvml


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HPC_ADVISE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _runner():
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:  # click >= 8.2 keeps stderr apart by default
        return CliRunner()


@pytest.mark.parametrize("error", [pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded])
def test_no_driver_one_line_hint_exit_2_nothing_written_fake_nvml(error, home, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(init_error=error))
    db = tmp_path / "kb.db"
    for args in (["profile"], ["profile", "--db", str(db)], ["profile", "--bench", "--db", str(db)]):
        res = _runner().invoke(main, args)
        assert res.exit_code == 2, res.output
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 2 and lines[0].startswith("hpc-advise profile: ") and "--gpu h200" in lines[1]
        assert not db.exists() and not home.exists()


def test_no_gpu_fake_nvml(home, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus=[]))
    res = _runner().invoke(main, ["profile"])
    assert res.exit_code == 2 and "reports no GPU" in res.stderr and not home.exists()


def test_real_nvml_without_gpu(home):
    """No fake: on CI (no driver) the real NVML failure gives exit 2 and writes nothing."""
    res = _runner().invoke(main, ["profile", "--json"])
    if res.exit_code == 0:
        pytest.skip("this machine has a working NVML")
    assert res.exit_code == 2 and "hint:" in res.stderr and not home.exists()


def test_profile_stores_facts_fake_nvml(home, tmp_path, monkeypatch):
    fake = FakeNvml(
        gpus=[FakeGpu(processes=[(7, 1 << 30)]), FakeGpu(), FakeGpu(name="NVIDIA L40S", links=None)]
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    db = tmp_path / "kb.db"
    res = _runner().invoke(main, ["profile", "--json", "--db", str(db)])
    assert res.exit_code == 0, res.output + res.stderr
    out = json.loads(res.stdout)
    assert [g["profile"] for g in out["host"]["gpus"]] == ["h200", "h200", "l40s"]
    assert len(out["gpu_row_ids"]) == 2 and out["kb"] == str(db)
    with KnowledgeBase(db) as kb:
        rows = kb.gpus()
    h200 = next(r for r in rows if r["name"] == "NVIDIA H200")
    assert h200["count"] == 2 and h200["facts"]["profile"] == "h200"
    assert h200["facts"]["devices"][0]["processes"][0]["pid"] == 7
    assert h200["facts"]["topology"][0][1] == "NV18" and "measured" not in h200["facts"]
    # the table form
    res = _runner().invoke(main, ["profile", "--db", str(db)])
    assert res.exit_code == 0 and "NVIDIA L40S" in res.stdout and "topology" in res.stdout


def test_unusable_knowledge_base_is_a_clear_error_fake_nvml(tmp_path, home, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus=[FakeGpu()]))
    bad = tmp_path / "not_a_db"
    bad.write_text("this is not sqlite\n" * 100)
    res = _runner().invoke(main, ["profile", "--db", str(bad)])
    assert res.exit_code == 1 and "knowledge base:" in res.stderr and "Traceback" not in res.output


def test_bench_without_cuda_fails_before_writing_fake_nvml(home, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    if measure_profile.torch_cuda_problem() is None:
        pytest.skip("this machine has CUDA")
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus=[FakeGpu()]))
    db = tmp_path / "kb.db"
    res = _runner().invoke(main, ["profile", "--bench", "--db", str(db)])
    assert res.exit_code == 2 and "needs a CUDA GPU" in res.stderr and not db.exists()
    res = _runner().invoke(main, ["profile", "--bench", "nonsense", "--db", str(db)])
    assert res.exit_code == 2 and "unknown stage" in res.stderr


def test_offline_gpu_writes_nothing_and_overlays_kb(tmp_path, home):
    db = tmp_path / "kb.db"
    res = _runner().invoke(main, ["profile", "--gpu", "h100", "--db", str(db)])
    assert res.exit_code == 0 and "3.35  (vendor)" in res.stdout and not db.exists()
    with KnowledgeBase(db) as kb:
        kb.add_gpu({"name": "NVIDIA H100 80GB HBM3", "count": 8, "profile": "h100",
                    "measured": {"copy_bw_tbps": 2.9}, "measured_source": "test rig"})  # fmt: skip
    res = _runner().invoke(main, ["profile", "--gpu", "H100", "--db", str(db), "--json"])
    data = json.loads(res.stdout)
    assert data["measured"] == {"copy_bw_tbps": 2.9} and data["measured_source"] == "test rig"
    res = _runner().invoke(main, ["profile", "--gpu", "h9000"])
    assert res.exit_code == 2 and "no GPU profile" in res.stderr


def test_parse_stages():
    assert measure_profile.parse_stages("default") == ("micro", "kernels")
    assert measure_profile.parse_stages("all") == ("micro", "kernels", "comm")
    assert measure_profile.parse_stages("comm,micro") == ("micro", "comm")


def test_kernel_bench_discovery_and_failures(monkeypatch, capsys):
    """Missing bench modules are skipped with the reason; a bench that exists runs; a failing step is
    recorded while the others still run and store their rows."""
    import types

    good = types.ModuleType("hpc_advise.runtime.measure.cases.fake_ok")

    def good_bench(grid="full", peers=True):
        print("bench chatter")  # must not reach stdout (it would break --json)
        return [{"kind": "kernel", "grid": grid}], [], []

    good.bench = good_bench
    bad = types.ModuleType("hpc_advise.runtime.measure.cases.fake_bad")

    def boom(grid="full", peers=True):
        raise RuntimeError("kernel exploded")

    bad.bench = boom
    monkeypatch.setitem(sys.modules, "hpc_advise.runtime.measure.cases.fake_ok", good)
    monkeypatch.setitem(sys.modules, "hpc_advise.runtime.measure.cases.fake_bad", bad)
    monkeypatch.setattr(measure_profile, "KERNEL_BENCHES", ("fake_missing", "fake_ok", "fake_bad"))
    report = measure_profile.BenchReport()
    steps = measure_profile._kernel_steps(None, report)
    assert [s.label for s in steps] == ["kernel fake_ok", "kernel fake_bad"]
    assert report.skipped[0][0] == "fake_missing" and "no benchmark module" in report.skipped[0][1]
    stored = []
    measure_profile.run_steps(steps, report, lambda rows: stored.extend(rows) or [len(stored)])
    assert stored == [{"kind": "kernel", "grid": "small"}] and report.run_ids == [1]
    captured = capsys.readouterr()
    assert "bench chatter" not in captured.out and "bench chatter" in captured.err
    assert report.failed == [("kernel fake_bad", "RuntimeError: kernel exploded")]


def test_rows_the_knowledge_base_rejects_are_reported(tmp_path):
    """A step whose rows the real knowledge base refuses is a failed step; nothing half-stored."""
    good = {"kind": "kernel", "subject": "k", "provider": "p", "config": {}, "metric": "latency", "unit": "us",
            "p20": 1.0, "p50": 2.0, "p80": 3.0, "gpu": None, "versions": {}, "git_sha": None, "command": "x",
            "created_at": "2026-11-29T00:00:00+00:00"}  # fmt: skip
    bad = dict(good, p50=float("nan"))
    steps = [
        measure_profile.Step("kernels", "bad", lambda: [good, bad]),
        measure_profile.Step("kernels", "ok", lambda: [good]),
    ]
    report = measure_profile.BenchReport()
    with KnowledgeBase(tmp_path / "kb.db") as kb:
        measure_profile.run_steps(steps, report, kb.add_runs)
        assert len(kb.runs()) == 1
    assert (
        report.done == ["ok"]
        and report.failed[0][0] == "bad"
        and "storing its rows failed" in report.failed[0][1]
    )


def test_measured_figures_from_rows():
    rows = [
        {"kind": "microbench", "config": {"op": "copy"}, "p50": 4.0},
        {"kind": "microbench", "config": {"op": "copy"}, "p50": 4.2},
        {"kind": "microbench", "config": {"op": "gemm", "dtype": "fp8"}, "p50": 1300.0},
        {
            "kind": "comm",
            "subject": "all_reduce",
            "config": {"op": "all_reduce", "bytes": 1 << 20, "world_size": 2, "busbw_gbps": 300.0},
            "p50": 1.0,
        },
        {
            "kind": "comm",
            "subject": "all_reduce",
            "config": {"op": "all_reduce", "bytes": 1 << 20, "world_size": 1, "busbw_gbps": 0.0},
            "p50": 1.0,
        },
    ]
    assert measure_profile.measured_figures(rows) == {
        "copy_bw_tbps": 4.2, "fp8_tflops": 1300.0, "allreduce_busbw_gbps": 300.0, "comm_world_size": 2.0,
    }  # fmt: skip


def test_results_table_keeps_defining_config():
    row = {
        "kind": "comm", "subject": "all_reduce", "provider": "torch.distributed.nccl", "metric": "latency",
        "unit": "us", "p20": 1.0, "p50": 2.0, "p80": 3.0,
        "config": {"op": "all_reduce", "bytes": 4096, "world_size": 2, "busbw_gbps": 12.3456, "env": {"X": "1"}},
    }  # fmt: skip
    (line,) = measure_profile.results_table([row])
    assert line[3] == "op=all_reduce bytes=4096 world_size=2 busbw_gbps=12.35"
    assert line[5:8] == [1.0, 2.0, 3.0] and len(line) == len(measure_profile.RESULT_HEADERS)


def test_help_does_not_import_torch():
    import subprocess

    code = (
        "import sys; from click.testing import CliRunner; from hpc_advise.cli import main; "
        "r = CliRunner().invoke(main, ['profile', '--help']); assert r.exit_code == 0, r.output; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.gpu
def test_profile_bench_micro_and_comm_on_gpu(tmp_path, monkeypatch):
    """Real NVML, real GPU: microbenchmarks + comm at world size 1, rows and measured figures stored."""
    db = tmp_path / "kb.db"
    monkeypatch.setenv("HPC_ADVISE_RESULTS", str(tmp_path / "results"))
    args = ["profile", "--bench", "micro,comm", "--json", "--db", str(db), "--write-results", "t"]
    res = _runner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "results" / "t.md").is_file() and (tmp_path / "results" / "t.jsonl").is_file()
    out = json.loads(res.stdout)
    measured = out["bench"]["measured"]
    assert {"copy_bw_tbps", "bf16_tflops", "fp8_tflops", "tf32_tflops", "fp32_tflops"} <= set(measured)
    with KnowledgeBase(db) as kb:
        assert (
            len(kb.runs(kind="microbench")) == len(microbench.cases("small")) == 8
            and len(kb.runs(kind="comm")) == 4 * 19
        )
        facts = kb.gpus()[-1]["facts"]
    assert facts["measured"] == measured
