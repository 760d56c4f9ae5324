"""Output consistency of a candidate server against a baseline, on fixed prompts, greedy decoding.

Both through SGLang's native ``POST /generate``:

1. Greedy token agreement: each prompt (token ids from the run's ``PromptBuilder``, the same on both
   sides) is decoded ``max_new_tokens`` greedily (``temperature 0``, ``ignore_eos``) by both servers;
   agreement is the share of positions, up to the shorter output, where the token ids are equal; the
   first divergence is the first position where they differ (``None`` when they never do).
2. Teacher-forced logprobs: prompt + the *baseline's* greedy output is sent back to both servers with
   ``return_logprob``, ``logprob_start_len = 0`` and ``top_logprobs_num = K``, so both score the same
   tokens. Over the output positions: top-1 agreement (the two servers' most likely next token is the
   same) and the mean KL(baseline || candidate), computed on the baseline's top-K tokens plus one
   "rest" bucket holding the remaining probability mass; a token missing from the candidate's top-K
   gets the candidate's smallest listed probability (an upper bound on its true value, so the KL is
   an underestimate when the lists differ much). Positions where either side lists nothing are
   skipped.

Why not a task metric here: see docs/bench.md for lm-eval's ``local-completions`` against both URLs.
"""

from __future__ import annotations

import asyncio
import math

import aiohttp
import orjson

from hpc_advise.advisor.bench.client import ServerError, session


async def _generate(s: aiohttp.ClientSession, url: str, payload: dict) -> dict:
    async with s.post(
        url + "/generate", data=orjson.dumps(payload), headers={"Content-Type": "application/json"}
    ) as r:
        body = await r.read()
        if r.status == 404:
            raise ServerError(
                f"{url}: no /generate endpoint (HTTP 404): output consistency needs SGLang's native API"
            )
        if r.status != 200:
            raise ServerError(
                f"{url}/generate answered HTTP {r.status}: {body[:200].decode('utf-8', 'replace')}"
            )
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise ServerError(f"{url}/generate did not answer JSON") from None


def _greedy_payload(prompt: list[int] | str, n: int) -> dict:
    payload: dict = {"sampling_params": {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True}}
    if isinstance(prompt, str):
        # a text prompt: the server's input logprobs carry the prompt's token ids for step 2
        payload.update(text=prompt, return_logprob=True, logprob_start_len=0, top_logprobs_num=0)
    else:
        payload["input_ids"] = prompt
    return payload


def _scored_payload(ids: list[int], k: int) -> dict:
    return {
        "input_ids": ids,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 1},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": k,
        "return_text_in_logprobs": False,
    }


def agreement(a: list[int], b: list[int]) -> tuple[float, int | None]:
    """(share of equal positions up to the shorter list, first differing position or None)."""
    n = min(len(a), len(b))
    if n == 0:
        return (1.0 if len(a) == len(b) else 0.0), (None if len(a) == len(b) else 0)
    same = [x == y for x, y in zip(a[:n], b[:n], strict=True)]
    first = next((i for i, s in enumerate(same) if not s), None)
    if first is None and len(a) != len(b):
        first = n
    return sum(same) / n, first


def _top(entry) -> dict[int, float]:
    """{token id: logprob} of one position's top list (SGLang: [[logprob, token_id, text], ...])."""
    if not entry:
        return {}
    return {int(t[1]): float(t[0]) for t in entry if t and t[0] is not None}


def kl_top(p_lp: dict[int, float], q_lp: dict[int, float]) -> float:
    """KL(p || q) on p's top tokens + a rest bucket (see the module docstring)."""
    q_floor = min(q_lp.values())
    p = {t: math.exp(lp) for t, lp in p_lp.items()}
    q = {t: math.exp(q_lp.get(t, q_floor)) for t in p}
    p_rest, q_rest = max(0.0, 1.0 - sum(p.values())), max(0.0, 1.0 - sum(q.values()))
    kl = sum(pv * math.log(pv / max(q[t], 1e-30)) for t, pv in p.items() if pv > 0)
    if p_rest > 1e-12:
        kl += p_rest * math.log(p_rest / max(q_rest, 1e-30))
    return max(0.0, kl)


async def check(candidate: str, baseline: str, prompts: list, max_new_tokens: int = 64,
                top_k: int = 20, timeout_s: float = 600.0) -> dict:  # fmt: skip
    """Consistency of ``candidate`` against ``baseline`` on ``prompts`` (token-id lists, or texts: then the
    prompt's ids are the ones the baseline reports in its input logprobs)."""
    per_prompt = []
    kls, top1 = [], []
    async with session(timeout_s) as s:
        for prompt in prompts:
            ga, gb = await asyncio.gather(
                _generate(s, candidate, _greedy_payload(prompt, max_new_tokens)),
                _generate(s, baseline, _greedy_payload(prompt, max_new_tokens)),
            )
            if isinstance(prompt, str):
                listed = (gb.get("meta_info") or {}).get("input_token_logprobs") or []
                ids = [int(e[1]) for e in listed]
                if not ids:
                    raise ServerError(f"{baseline}/generate returned no input token ids for a text prompt")
            else:
                ids = list(prompt)
            out_a, out_b = list(ga.get("output_ids") or []), list(gb.get("output_ids") or [])
            agree, first = agreement(out_a, out_b)
            forced = ids + out_b
            sa, sb = await asyncio.gather(
                _generate(s, candidate, _scored_payload(forced, top_k)),
                _generate(s, baseline, _scored_payload(forced, top_k)),
            )
            ta = (sa.get("meta_info") or {}).get("input_top_logprobs") or []
            tb = (sb.get("meta_info") or {}).get("input_top_logprobs") or []
            # position j's list predicts token j; the output tokens sit at len(ids) .. len(forced)-1
            for j in range(len(ids), min(len(forced), len(ta), len(tb))):
                pa, pb = _top(ta[j]), _top(tb[j])
                if not pa or not pb:
                    continue
                kls.append(kl_top(pb, pa))
                top1.append(max(pa, key=pa.get) == max(pb, key=pb.get))
            per_prompt.append({"prompt_tokens": len(ids), "agreement": agree, "first_divergence": first,
                               "candidate_tokens": len(out_a), "baseline_tokens": len(out_b)})  # fmt: skip
    firsts = [p["first_divergence"] for p in per_prompt if p["first_divergence"] is not None]
    return {
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "token_agreement": sum(p["agreement"] for p in per_prompt) / len(per_prompt) if per_prompt else None,
        "identical_outputs": sum(p["first_divergence"] is None for p in per_prompt),
        "first_divergence_min": min(firsts) if firsts else None,
        "first_divergence_median": sorted(firsts)[len(firsts) // 2] if firsts else None,
        "teacher_forced_positions": len(kls),
        "mean_kl": sum(kls) / len(kls) if kls else None,
        "top1_agreement": sum(top1) / len(top1) if top1 else None,
        "top_k": top_k,
        "per_prompt": per_prompt,
    }
