"""The CLI under hostile input (issue 30): every number is validated at parse time, bad files are one
clear line, nothing is half-logged, and a property test drives every command with hostile values.

Each ``test_*`` below names the case of the issue it covers; the property test at the end asserts,
for any hostile option value or file: exit code 1 or 2, at most three lines on stderr, no traceback,
the knowledge base unchanged.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpc_advise.cli import main

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "examples" / "traces" / "chat_uniform.csv"
LLAMA = REPO / "hpc_advise" / "profiles" / "models" / "llama-3.1-8b.json"
BASE = ["--model", "llama-3.1-8b", "--gpu", "h200"]


def run(*args: str, env: dict | None = None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def assert_clean_failure(res, code: int | None = None) -> None:
    """Exit 1 or 2 (or ``code``), one to three lines on stderr, no traceback."""
    assert res.exit_code in ((code,) if code else (1, 2)), (res.exit_code, res.output)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = res.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 3, res.stderr
    assert "Traceback" not in res.output


def _config(tmp_path: Path, **change) -> Path:
    cfg = dict(json.loads(LLAMA.read_text())["config"], **change)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def _zstd_cut(tmp_path: Path) -> Path:
    import zstandard

    text = "".join(json.dumps({"t": i * 0.1, "in": 100 + i, "out": 50}) + "\n" for i in range(20_000))
    data = zstandard.ZstdCompressor().compress(text.encode())
    path = tmp_path / "cut.jsonl.zst"
    path.write_bytes(data[: len(data) // 2])
    return path


# ---- nonsense numbers: refused at parse time -------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-1", "100000"])
def test_gpus_zero_negative_or_huge_is_refused(value, tmp_path):
    res = run("recommend", "--trace", TRACE, *BASE, "--gpus", value, "--db", tmp_path / "kb.db")
    assert_clean_failure(res, 2)
    assert "--gpus" in res.stderr and "1<=x<=64" in res.stderr
    assert not (tmp_path / "kb.db").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "1e9"])
@pytest.mark.parametrize("command", ["recommend", "predict"])
def test_concurrency_must_be_a_finite_count_in_range(command, value, tmp_path):
    args = ["--trace", TRACE] if command == "recommend" else ["--isl", "100", "--osl", "100"]
    res = run(command, *args, *BASE, "--gpus", "1", "--concurrency", value, "--db", tmp_path / "kb.db")
    assert_clean_failure(res, 2)
    assert "--concurrency" in res.stderr


@pytest.mark.parametrize("flag", ["--slo-tpot-ms", "--slo-ttft-ms"])
@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_slo_must_be_positive(flag, value, tmp_path):
    res = run("recommend", "--trace", TRACE, *BASE, "--gpus", "1", flag, value, "--db", tmp_path / "kb.db")
    assert_clean_failure(res, 2)
    assert flag in res.stderr


@pytest.mark.parametrize("value", ["0", "-3"])
def test_top_must_be_positive(value, tmp_path):
    res = run("recommend", "--trace", TRACE, *BASE, "--gpus", "1", "--top", value, "--db", tmp_path / "kb.db")
    assert_clean_failure(res, 2)
    assert "--top" in res.stderr


@pytest.mark.parametrize("flag", ["--isl", "--osl"])
def test_predict_lengths_must_be_positive(flag):
    args = {"--isl": "100", "--osl": "100", flag: "-5"}
    res = run("predict", *BASE, "--gpus", "1", "--concurrency", "4", *[x for kv in args.items() for x in kv])
    assert_clean_failure(res, 2)
    assert flag in res.stderr


def test_trace_summarize_decode_batch_is_capped():
    res = run("trace", "summarize", TRACE, "--no-store", "--concurrency", "1000000000")
    assert_clean_failure(res, 2)
    assert "1<=x<=4096" in res.stderr


@pytest.mark.parametrize(("field", "value"), [("num_hidden_layers", 0), ("hidden_size", -4096)])
def test_config_json_with_a_nonpositive_shape_names_file_and_field(field, value, tmp_path):
    path = _config(tmp_path, **{field: value})
    res = run("predict", "--model", path, "--gpu", "h200", "--gpus", "1", "--isl", "100", "--osl", "100",
              "--concurrency", "4")  # fmt: skip
    assert_clean_failure(res, 1)
    assert str(path) in res.stderr and field in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("extra", [["--moe-runner-backend", "banana"], ["--moe-runner-backend", "deep_gemm"],
                                   ["--ep-size", "8"], ["--ep", "8"]])  # fmt: skip
def test_dense_model_refuses_moe_flags(extra):
    res = run("predict", *BASE, "--gpus", "8", "--isl", "100", "--osl", "100", "--concurrency", "4", *extra)
    assert_clean_failure(res)
    assert extra[0].split("-size")[0] in res.stderr or "dense" in res.stderr


# ---- output files and the data folder ----------------------------------------------------------------


@pytest.mark.parametrize("target", ["missing/dir/out.png", "out.txt"])
def test_bad_plot_path_is_refused_before_the_work_and_logs_nothing(target, tmp_path):
    db = tmp_path / "kb.db"
    res = run("recommend", "--trace", TRACE, *BASE, "--gpus", "1", "--plot", tmp_path / target, "--db", db)
    assert_clean_failure(res, 2)
    assert "--plot" in res.stderr
    assert not db.exists()


def test_read_only_data_folder_recommend_uses_no_cache(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "cache").write_text("not a folder")  # the cache cannot be written (root ignores chmod)
    db = tmp_path / "kb.db"
    res = run("recommend", "--trace", TRACE, *BASE, "--gpus", "1", "--db", db, "--json",
              env={"HPC_ADVISE_HOME": str(home)})  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["recommendation_id"] == 1
    assert (home / "cache").is_file()


# ---- wrong results -------------------------------------------------------------------------------------


@pytest.mark.parametrize("skip_bad", [False, True])
def test_truncated_zstd_is_a_truncated_file_even_with_skip_bad(skip_bad, tmp_path):
    path = _zstd_cut(tmp_path)
    res = run("trace", "summarize", path, "--no-store", *(["--skip-bad"] if skip_bad else []))
    assert_clean_failure(res, 1)
    assert "truncated compressed file" in res.stderr and "invalid JSON" not in res.stderr


def test_zstd_of_several_frames_reads_whole(tmp_path):
    import zstandard

    lines = [json.dumps({"t": i * 0.1, "in": 10, "out": 5}) + "\n" for i in range(3000)]
    comp = zstandard.ZstdCompressor()
    path = tmp_path / "frames.jsonl.zst"
    path.write_bytes(
        comp.compress("".join(lines[:1000]).encode()) + comp.compress("".join(lines[1000:]).encode())
    )
    res = run("trace", "summarize", path, "--no-store", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["n_requests"] == 3000


def test_convert_onto_its_own_input_is_refused(tmp_path):
    path = tmp_path / "c.csv"
    path.write_bytes(TRACE.read_bytes())
    res = run("trace", "convert", path, "-o", path)
    assert_clean_failure(res, 2)
    assert "input trace" in res.stderr
    assert path.read_bytes() == TRACE.read_bytes()


def test_output_into_a_closed_pipe_exits_zero(tmp_path):
    trace = tmp_path / "big.jsonl"
    trace.write_text("".join(json.dumps({"t": i * 0.01, "in": 100, "out": 10}) + "\n" for i in range(50_000)))
    code = f"{sys.executable} -m hpc_advise trace convert {trace} | head -1; echo rc=${{PIPESTATUS[0]}}"
    out = subprocess.run(["bash", "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.stdout.strip().endswith("rc=0"), out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr


# ---- misleading output ----------------------------------------------------------------------------------


def _row(flags=(), meets=True, tpot=10.0, tok=100.0, ttft=100.0, label="TP1"):
    return SimpleNamespace(flags=list(flags), meets_slo=meets, tpot_p99=tpot, tpot_p50=tpot, ttft_p99=ttft,
                           max_tok_s_per_gpu=tok, candidate=SimpleNamespace(label=lambda: label))  # fmt: skip


def test_confidence_only_for_flags_about_the_chosen_backends():
    from hpc_advise.advisor.report import confidence

    assert confidence(_row(["unmeasured alternatives predicted the same: attn=fa3, attn=triton"])) == "ok"
    assert confidence(_row(["no kernel comparison for MoE runner hpc_ops in the knowledge base"])) == "low"
    assert confidence(_row()) == "ok"


def test_slo_column_is_a_dash_without_an_slo():
    from hpc_advise.advisor.report import slo_cell

    assert slo_cell(_row(meets=True), None, None) == "-"
    assert slo_cell(_row(meets=True), 30.0, None) == "yes"
    assert slo_cell(_row(meets=False), None, 500.0) == "no"


def test_pareto_front_leaves_out_zero_capacity_and_the_chart_draws_both_slos(tmp_path):
    pytest.importorskip("matplotlib")
    from hpc_advise.advisor.plot import pareto_front, pareto_png

    rows = [_row(tpot=5.0, tok=0.0, label="dead"), _row(tpot=8.0, tok=50.0, label="a"),
            _row(tpot=12.0, tok=90.0, ttft=900.0, label="b"), _row(tpot=15.0, tok=60.0, label="c")]  # fmt: skip
    assert [r.candidate.label() for r in pareto_front(rows)] == ["a", "b"]
    out = pareto_png(rows, tmp_path / "p.png", slo_tpot_ms=10.0, slo_ttft_ms=500.0)
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_unknown_format_hint_names_the_flag_recommend_has(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("# not a trace\nhello\n")
    res = run("recommend", "--trace", bad, *BASE, "--gpus", "1", "--db", tmp_path / "kb.db")
    assert_clean_failure(res, 1)
    assert "--trace-format" in res.stderr and "use --format" not in res.stderr


def test_show_excluded_is_grouped_by_reason_with_counts():
    from hpc_advise.advisor.report import excluded_lines

    ex = [SimpleNamespace(candidate=SimpleNamespace(label=lambda i=i: f"TP{i}"), reason=r)
          for i, r in enumerate(["no fit"] * 5 + ["needs SM90"] * 2)]  # fmt: skip
    lines = excluded_lines(ex)
    assert lines[0].strip() == "excluded: 7 configuration(s), 2 reason(s)"
    assert lines[1].split() == ["5", "x", "no", "fit"] and "(+2 more)" in lines[2]
    assert len(lines) == 5


def test_profile_bench_rows_print_under_their_own_header():
    from hpc_advise.runtime.measure.cli import _print_rows

    rows = [{"kind": k, "subject": s, "provider": "p", "config": {"T": 1}, "metric": "latency_us",
             "p20": 1.0, "p50": 2.0, "p80": 3.0, "unit": "us"}
            for k, s in (("microbench", "copy"), ("kernel", "fused_moe"), ("kernel", "fused_moe"))]  # fmt: skip

    @click.command()
    def show():
        _print_rows(rows)

    out = CliRunner().invoke(show).output
    moe = out[out.index("kernel fused_moe: 2 row(s)") :]
    assert moe.splitlines()[1].split()[:3] == ["kind", "subject", "provider"]


# ---- progress, help and names ---------------------------------------------------------------------------


def test_progress_only_when_asked_or_on_a_terminal(tmp_path):
    args = ["trace", "summarize", str(TRACE), "--no-store", "--json"]
    res = run("recommend", "--trace", TRACE, *BASE, "--gpus", "1", "--db", tmp_path / "kb.db", "--json")
    assert res.exit_code == 0 and "…" not in res.stderr
    json.loads(res.stdout)
    res = run("--progress", "recommend", "--trace", TRACE, *BASE, "--gpus", "1", "--db", tmp_path / "kb.db",
              "--json", env={"HPC_ADVISE_PROGRESS": None})  # fmt: skip
    assert res.exit_code == 0 and "… ranking" in res.stderr
    json.loads(res.stdout)  # stdout stays JSON
    os.environ.pop("HPC_ADVISE_PROGRESS", None)  # --progress set it for this process
    assert run(*args).exit_code == 0


def _walk(cmd: click.Command, path: list[str]):
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(click.Context(cmd)):
            yield from _walk(cmd.get_command(click.Context(cmd), name), [*path, name])


def test_every_help_page_has_an_example():
    missing = []
    for path, _cmd in _walk(main, []):
        res = run(*path, "--help")
        if res.exit_code != 0 or not re.search(r"Example:\n +hpc-advise \S", res.output):
            missing.append(" ".join(path) or "(root)")
    assert missing == []


def test_sglang_flag_names_with_old_spellings_hidden():
    text = run("predict", "--help").output
    for name in ("--tp-size", "--ep-size", "--kv-cache-dtype", "--attn-dp-size"):
        assert name in text
    for old in ("--tp ", "--ep ", "--kv-dtype", "--tp,", "--ep,"):
        assert old not in text
    assert "--trace-format" in run("trace", "summarize", "--help").output
    res = run("predict", *BASE, "--gpus", "2", "--tp", "2", "--kv-dtype", "fp8_e4m3", "--isl", "100",
              "--osl", "100", "--concurrency", "4", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["config"].startswith("TP2")


def test_two_concurrency_meanings_and_profile_vs_profiles_are_told_apart():
    assert "--decode-batch" in run("trace", "summarize", "--help").output
    assert "requests in flight" in run("recommend", "--help").output.lower()
    assert "THIS machine" in run("profile", "--help").output
    assert "shipped" in run("profiles", "--help").output and "profile`" in run("profiles", "--help").output
    root = run("--help").output
    assert "Measure THIS machine" in root and "Browse the GPU and model profiles" in root


def test_usage_error_is_two_lines():
    res = run("recommend", "--gpus", "0")
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 2


# ---- the property test -----------------------------------------------------------------------------------

NUMBERS = ["0", "-1", "-0.5", "nan", "inf", "-inf", "1e9", "1e400", "abc", "", "0x10", "1,5"]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """Hostile files, a knowledge base with content, and its dump (to check nothing changes)."""
    d = tmp_path_factory.mktemp("hostile")
    files = {
        "missing": d / "nope" / "trace.jsonl",
        "folder": d,
        "empty": d / "empty.jsonl",
        "garbage": d / "garbage.bin",
        "cut_gzip": d / "cut.jsonl.gz",
        "cut_zstd": _zstd_cut(d),
        "header_only": d / "header.csv",
        "bad_json": d / "bad.jsonl",
    }
    files["empty"].write_bytes(b"")
    files["garbage"].write_bytes(bytes(range(256)) * 64)
    files["cut_gzip"].write_bytes(gzip.compress(b'{"t": 0, "in": 5, "out": 5}\n' * 5000)[:300])
    files["header_only"].write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    files["bad_json"].write_text('{"t": 0, "in": 5, "out":\n')
    cfg_dir = d / "cfg"
    cfg_dir.mkdir()
    configs = {"zero_layers": _config(cfg_dir, num_hidden_layers=0)}
    neg = d / "neg"
    neg.mkdir()
    configs["neg_hidden"] = _config(neg, hidden_size=-1)
    db = d / "kb.db"
    assert run("notes", "add", "flashinfer at TP8", "--title", "kept", "--db", db).exit_code == 0
    from hpc_advise.knowledge_base.export import to_json
    from hpc_advise.knowledge_base.store import KnowledgeBase

    def dump() -> str:
        kb = KnowledgeBase(db)
        try:
            return to_json(kb)
        finally:
            kb.close()

    return SimpleNamespace(files=files, configs=configs, db=db, dump=dump, before=dump(), dir=d)


def _cases(h) -> list[st.SearchStrategy]:
    """Strategies of argument lists, each with exactly one hostile value."""
    db = ["--db", str(h.db)]
    rec = ["recommend", "--trace", str(TRACE), *BASE, "--gpus", "1", *db]
    pred = ["predict", *BASE, "--gpus", "1", "--isl", "100", "--osl", "100", "--concurrency", "4", *db]
    trace_files = st.sampled_from([str(p) for p in h.files.values()])
    num = st.sampled_from(NUMBERS)
    out = []

    def swap(base: list[str], flag: str, value: str) -> list[str]:
        args = list(base)
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
        return args

    for flag in ("--gpus", "--concurrency", "--slo-tpot-ms", "--slo-ttft-ms", "--top"):
        out.append(num.map(lambda v, f=flag: swap(rec, f, v)))
    out.append(trace_files.map(lambda v: swap(rec, "--trace", v)))
    out.append(st.sampled_from([str(p) for p in h.configs.values()] + [str(h.files["missing"])]).map(
        lambda v: swap(rec, "--model", v)))  # fmt: skip
    out.append(
        st.sampled_from(["x.txt", str(h.files["missing"]), str(h.dir)]).map(lambda v: swap(rec, "--plot", v))
    )
    for flag in ("--gpus", "--tp-size", "--ep-size", "--attn-dp-size", "--isl", "--osl", "--concurrency"):
        out.append(num.map(lambda v, f=flag: swap(pred, f, v)))
    out.append(st.sampled_from(["banana", "deep_gemm"]).map(lambda v: swap(pred, "--moe-runner-backend", v)))
    out.append(st.sampled_from([str(p) for p in h.configs.values()]).map(lambda v: swap(pred, "--model", v)))
    out.append(trace_files.map(lambda v: ["trace", "summarize", v, "--no-store"]))
    out.append(trace_files.map(lambda v: ["trace", "summarize", v, "--skip-bad", *db]))
    out.append(trace_files.map(lambda v: ["trace", "convert", v, "-o", str(h.dir / "out.jsonl")]))
    for flag in ("--decode-batch", "--latency", "--window", "--sample"):
        out.append(num.map(lambda v, f=flag: ["trace", "summarize", str(TRACE), "--no-store", f, v]))
    out.append(num.map(lambda v: ["launch", "--recommendation", v, "--dry-run", *db]))
    out.append(st.sampled_from(["99999"]).map(lambda v: ["launch", "--recommendation", v, "--dry-run", *db]))
    for cmd in (["notes", "search", "flashinfer"], ["notes", "list"], ["runs", "list"]):
        out.append(num.map(lambda v, c=cmd: [*c, "--limit", v, *db]))
    for cmd in (["notes", "show"], ["runs", "show"], ["notes", "rm"]):
        out.append(st.sampled_from(["-1", "99999", "abc", "1e9"]).map(lambda v, c=cmd: [*c, v, *db]))
    out.append(st.sampled_from(["0", "-2", "x"]).map(lambda v: ["notes", "add", "t", "--run", v, *db]))
    out.append(trace_files.map(lambda v: ["runs", "import", v, *db]))
    out.append(
        st.sampled_from(["nosuch", "runs; DROP TABLE notes"]).map(
            lambda v: ["kb", "export", "--table", v, *db]
        )
    )
    # an empty file is a valid empty SQLite database: only files that cannot be one
    kb_files = [str(h.files[k]) for k in ("missing", "folder", "garbage", "cut_gzip", "header_only")]
    out.append(st.sampled_from(kb_files).map(lambda v: ["kb", "stats", "--db", v]))
    out.append(st.sampled_from(["banana", ""]).map(lambda v: ["model", "eval", "--by", v, *db]))
    out.append(
        st.sampled_from(["nosuch-gpu", str(h.files["garbage"])]).map(lambda v: ["profiles", "show", v])
    )
    out.append(st.sampled_from(["nosuch-gpu"]).map(lambda v: ["profile", "--gpu", v, *db]))
    return out


def test_every_command_fails_cleanly_on_hostile_input(hostile):
    cases = st.one_of(_cases(hostile))

    @settings(max_examples=300, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
    @given(cases)
    def check(args):
        res = run(*args)
        assert_clean_failure(res)

    check()
    assert hostile.dump() == hostile.before
