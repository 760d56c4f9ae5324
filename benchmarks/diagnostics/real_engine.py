"""`hpc-advise bench` against SGLang 0.5.23's real HTTP server with a tiny random-weight MoE (issue 28).

The pieces ``real_engine.sh`` runs on the GPU machine, each also runnable here on CPU:

- ``model DIR``: a tiny ``Qwen3MoeForCausalLM`` made offline: ``config.json`` (2 layers, hidden 1024,
  16 / 4 heads x 128, 32 experts top-4 of width 256; the shapes SGLang's model runner ran on one H200
  without sgl-kernel, /work/shared/notes/sglang-model-on-h200.md), weights left to ``--load-format
  dummy``, and a tokenizer trained here with the ``tokenizers`` library and saved in Hugging Face form
  (``tokenizer.json`` + ``tokenizer_config.json``) so SGLang's tokenizer manager, detokenizer and
  OpenAI endpoints work and ``bench --tokenizer DIR`` builds exact-length prompts. The vocabulary is
  ASCII pieces joined by a Metaspace pre-tokenizer, so every token id decodes to printable text on its
  own: random-weight outputs stream one text chunk per token (a byte-level vocabulary would hold back
  chunks that end inside a UTF-8 sequence and change the ITL count).
- ``trace SRC OUT``: the shipped agentic-coding trace scaled to the tiny model: input lengths and the
  prefix block size divided by ``--len-div`` (512-token blocks become 16-token blocks, the same
  ``hash_ids``), output lengths clipped, arrival times divided by ``--time-div``.
- ``carry DIR``: the folder the device call carries (``.whl_bench_extra`` in the sent checkout): the
  model folder built here, and cp312 wheels of what SGLang's HTTP server imports at start that the
  device image lacks (``EXTRA_WHEELS``);
- ``table DIR``: the Markdown table of one device call's outputs (``ab.json``, ``validate.json``,
  ``machine.txt``, the server logs).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AGENTIC = ROOT / "examples" / "traces" / "agentic_coding.jsonl"

CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 1024,
    "num_hidden_layers": 2,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 2048,
    "moe_intermediate_size": 256,
    "num_experts": 32,
    "num_experts_per_tok": 4,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
VOCAB = 1024
# imported by sglang.srt.entrypoints.http_server's chain (serving_chat, the function-call detectors, FastAPI
# form routes, audio endpoints) and absent from the device image; xgrammar at SGLang 0.5.23's pin
EXTRA_WHEELS = ("jsonschema==4.26.0", "jsonschema-specifications==2025.9.1", "referencing==0.37.0",
                "rpds-py==2026.9.1", "xgrammar==0.2.7", "python-multipart", "soundfile", "cffi", "pycparser")
SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2: unk, bos, eos


def _corpus(seed: int, n: int = 6000) -> list[str]:
    """Training text: sentences of common English words (bench's approximate-prompt words) and short
    random letter strings, so merges cover both."""
    from hpc_advise.advisor.bench.prompts import WORDS

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    lines = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
        words += ["".join(rng.choice(letters) for _ in range(rng.randint(2, 6))) for _ in range(rng.randint(0, 3))]
        rng.shuffle(words)
        lines.append(" ".join(words) + rng.choice((".", ",", "?", "!", ";")))
    return lines


def build_tokenizer(seed: int = 0):
    """A BPE tokenizer of exactly ``VOCAB`` ids over printable ASCII (Metaspace words)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    alphabet = [chr(c) for c in range(32, 127)] + ["\u2581"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIALS, initial_alphabet=alphabet, limit_alphabet=len(alphabet),
        min_frequency=1, show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    if tok.get_vocab_size() != VOCAB:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} ids, wanted {VOCAB}: enlarge the corpus")
    return tok


def make_model(out: Path, seed: int = 0) -> dict:
    """Write the model folder; return what was checked (transformers loads the tokenizer)."""
    from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(CONFIG, vocab_size=VOCAB)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}) + "\n")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(seed), unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        model_max_length=cfg["max_position_embeddings"],
    )  # fmt: skip
    fast.save_pretrained(str(out))
    # what SGLang's tokenizer manager does with the folder: AutoTokenizer / AutoConfig from the path
    loaded = AutoTokenizer.from_pretrained(str(out))
    AutoConfig.from_pretrained(str(out))
    ids = loaded.encode("the state of the world", add_special_tokens=False)
    text = loaded.decode(list(range(len(SPECIALS), VOCAB)), skip_special_tokens=True)
    if not text.isascii() or len(loaded) != VOCAB:
        raise SystemExit(f"tokenizer check failed: {len(loaded)} ids, ascii={text.isascii()}")
    return {"dir": str(out), "vocab": len(loaded), "class": type(loaded).__name__, "sample_ids": ids}


def make_trace(src: Path, out: Path, requests: int, len_div: int, time_div: float, max_out: int) -> dict:
    """The scaled Mooncake trace; returns its sizes."""
    rows = []
    with src.open() as fh:
        for line in fh:
            if not line.strip():
                continue
            r = json.loads(line)
            block = int(r.get("block_size", 512)) // len_div
            rows.append({
                "timestamp": round(r["timestamp"] / time_div, 3),
                "input_length": max(8, r["input_length"] // len_div),
                "output_length": min(max_out, max(4, r["output_length"] // 2)),
                "hash_ids": r.get("hash_ids", []),
                "block_size": block,
            })  # fmt: skip
            if len(rows) >= requests:
                break
    t0 = rows[0]["timestamp"]
    for r in rows:
        r["timestamp"] = round(r["timestamp"] - t0, 3)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ins = [r["input_length"] for r in rows]
    outs = [r["output_length"] for r in rows]
    return {"requests": len(rows), "span_s": rows[-1]["timestamp"] / 1000.0, "isl_max": max(ins),
            "isl_mean": sum(ins) / len(ins), "osl_mean": sum(outs) / len(outs)}  # fmt: skip


# ------------------------------------------------------------------------------------------- table


def _fmt(x, d=1):
    return "-" if x is None else f"{x:.{d}f}"


def _server_line(log: Path) -> str:
    """What the server log says it ran with (graphs or eager; the MoE / attention lines)."""
    if not log.is_file():
        return "no log"
    text = log.read_text(errors="replace")
    last = text.rsplit("=== retry eager ===", 1)[-1]  # the attempt that served
    # SGLang 0.5.23 logs "Capture target decode CUDA graph end. bs=[1, 2, ...]"; older ones "Capture cuda graph end"
    cap = re.search(r"capture (?:[\w-]+ )*cuda graph end\.?(?: bs=(\[[\d, ]*\]))?", last, re.IGNORECASE)
    if "fired up and ready" not in last and "Uvicorn running" not in last and not cap:
        return "did not start (see its log)"
    if not cap:
        return "eager (--disable-cuda-graph)"
    # the scheduler's periodic decode lines say whether that step replayed a graph (batches past the largest
    # captured size run eager)
    steps = re.findall(r"Decode batch.*?cuda graph: (True|False)", last)
    return (
        f"CUDA graphs (decode bs {cap.group(1) or '?'} captured; {steps.count('True')} of {len(steps)} "
        "logged decode batches replayed a graph)"
    )


def render_table(d: Path) -> str:
    ab = json.loads((d / "ab.json").read_text())
    lines = []
    machine = (d / "machine.txt").read_text().splitlines() if (d / "machine.txt").is_file() else []
    lines.append("| metric | candidate (hpc_advise decode) | baseline (triton decode) | diff [95% CI] | verdict |")
    lines.append("|---|---|---|---|---|")
    for r in ab.get("ab") or []:
        ci = r.get("ci")
        lines.append(
            f"| {r['metric']} | {_fmt(r.get('candidate'), 2)} | {_fmt(r.get('baseline'), 2)} | "
            f"{_fmt(r.get('diff'), 2)} [{_fmt(ci[0], 2) if ci else '-'}, {_fmt(ci[1], 2) if ci else '-'}] | "
            f"{r.get('verdict')} |"
        )
    out = ["\n".join(lines), ""]
    for t in ab.get("targets") or []:
        s = t["summary"]
        out.append(
            f"- {t['role'] or 'server'} {t['url']}: completed {s['completed']}/{s['requests']} in "
            f"{s['duration_s']:.1f} s, {s['request_throughput']:.2f} req/s, {s['output_throughput']:.0f} "
            f"output tok/s, TTFT p50 {_fmt((s.get('ttft_ms') or {}).get('median'))} ms, TPOT p50 "
            f"{_fmt((s.get('tpot_ms') or {}).get('median'), 2)} ms, failures {s['failures'] or 'none'}"
            + (f", PARTIAL: {'; '.join(t['partial_reasons'])}" if t.get("partial") else "")
        )
    c = ab.get("consistency")
    if c:
        out.append(
            f"- consistency ({c['prompts']} prompts x {c['max_new_tokens']} greedy tokens, `/generate`): token "
            f"agreement {100 * c['token_agreement']:.1f} %, identical outputs {c['identical_outputs']}, first "
            f"divergence {c['first_divergence_min']}; teacher-forced mean KL {_fmt(c.get('mean_kl'), 4)}, top-1 "
            f"agreement {_fmt(100 * c['top1_agreement'] if c.get('top1_agreement') is not None else None)} %"
        )
    out.append(f"- prompt lengths: {ab.get('prompt_lengths')} ({ab.get('tokenizer')})")
    for name in ("triton", "hpc_advise"):
        out.append(f"- server {name}: {_server_line(d / f'server_{name}.log')}")
    v = d / "validate.json"
    if v.is_file():
        try:
            val = json.loads(v.read_text())
        except json.JSONDecodeError:
            val = {}
        if val.get("rows"):
            out += ["", "| validate: metric | predicted | measured | error |", "|---|---|---|---|"]
            for r in val["rows"]:
                err = "-" if r.get("error") is None else f"{100 * r['error']:+.1f} %"
                out.append(f"| {r['label']} | {_fmt(r.get('predicted'), 2)} | {_fmt(r.get('measured'), 2)} | {err} |")
        cal = val.get("calibration") or {}
        for m in cal.get("metrics") or []:
            out.append(
                f"- calibration {cal['deployment']} ({cal['n_runs']} runs, base fitted without "
                f"{len(cal.get('held_out_of_base') or [])}): {m['label']} median |error| before "
                f"{_fmt(100 * m['median_abs_before'] if m['median_abs_before'] is not None else None)} %, after "
                f"{_fmt(100 * m['median_abs_after'] if m['median_abs_after'] is not None else None)} %"
            )
    c = d / "client_overhead.jsonl"
    if c.is_file():
        for line in c.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            out.append(
                f"- client ({r.get('mode')}, {r.get('requests')} requests, cores {r.get('client_cpus')}): "
                f"{r.get('cpu_ms_per_request')} ms CPU/request, dispatch lag median/p99 "
                f"{(r.get('dispatch_lag_ms') or {}).get('median')}/{(r.get('dispatch_lag_ms') or {}).get('p99')} ms, "
                f"E2E median/p99 {(r.get('e2e_ms') or {}).get('median')}/{(r.get('e2e_ms') or {}).get('p99')} ms, "
                f"{r.get('rate_req_s')} req/s"
            )
    if machine:
        out.append("- machine: " + " / ".join(x.strip() for x in machine[:4]))
    return "\n".join(out) + "\n"


def make_carry(out: Path) -> dict:
    """The model folder and the extra wheels (cp312 manylinux, no dependencies) in ``out``."""
    import subprocess

    out.mkdir(parents=True, exist_ok=True)
    info = make_model(out / "tiny-qwen3-moe")
    plat = [a for p in ("manylinux_2_34", "manylinux_2_28", "manylinux_2_27", "manylinux_2_17", "manylinux2014")
            for a in ("--platform", f"{p}_x86_64")]  # fmt: skip
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *plat, "-d", str(out), *EXTRA_WHEELS],
                   check=True)  # fmt: skip
    return {"model": info, "wheels": sorted(p.name for p in out.glob("*.whl"))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model")
    m.add_argument("dir", type=Path)
    t = sub.add_parser("trace")
    t.add_argument("out", type=Path)
    t.add_argument("--src", type=Path, default=AGENTIC)
    t.add_argument("--requests", type=int, default=240)
    t.add_argument("--len-div", type=int, default=32)
    t.add_argument("--time-div", type=float, default=8.0)
    t.add_argument("--max-out", type=int, default=64)
    c = sub.add_parser("carry")
    c.add_argument("dir", type=Path)
    tb = sub.add_parser("table")
    tb.add_argument("dir", type=Path)
    a = ap.parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if a.cmd == "model":
        print(json.dumps(make_model(a.dir)))
    elif a.cmd == "carry":
        print(json.dumps(make_carry(a.dir)))
    elif a.cmd == "trace":
        print(json.dumps(make_trace(a.src, a.out, a.requests, a.len_div, a.time_div, a.max_out)))
    else:
        sys.stdout.write(render_table(a.dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
