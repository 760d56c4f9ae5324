"""Event-level simulation of one SGLang 0.5.23 replica (the scheduler's loop, step by step).

Modelled from SGLang's source (``python/sglang/srt/managers/``):

- ``scheduler.py`` ``get_next_batch_to_run``: requests whose prefill ended join the running batch; a
  new prefill batch, when one can be formed, runs before decode (prefill batches run apart from decode
  unless ``enable_mixed_chunk``, then the running requests ride in the extend pass, one token each);
  the chunked request is continued first, so a long prompt's chunks run back to back and the decode
  batch waits; with nothing to run the new-token ratio resets to its initial value (idle check).
- ``get_new_batch_prefill``: no prefill while ``batch_is_full`` (set when admission ran out of KV or
  of ``max_running_requests``; cleared when the batch shrinks), FCFS over the waiting queue (or
  longest prefix first, ``lpm``, while the queue is at most 128 long).
- ``schedule_policy.py`` ``PrefillAdder``: the budget is ``available + evictable`` KV tokens minus,
  for every running request, ``min(max_new_tokens - generated, CLIP_MAX_NEW_TOKENS) * new_token_ratio``
  and, for every request admitted in this batch, its page-rounded extend plus
  ``min(max_new_tokens, CLIP)``; a request is refused (NO_TOKEN) when ``extend + min(max_new, CLIP)``
  reaches it, checked again after its matched prefix is locked; ``max_prefill_tokens`` and
  ``chunked_prefill_size`` bound the pass (a request over the chunk budget is cut to it, page-floored,
  and becomes the one chunked request); ``budget_state`` stops the batch.
- ``schedule_batch.py``: before each decode step the batch needs one KV slot per request (evicting
  from the cache first); short of it, ``retract_decode`` removes the requests with the fewest output
  tokens (longest prompt on ties) until the rest fit, frees their KV (nothing inserted), puts them
  back in the queue with their output kept (re-prefilled later as prompt + output), and sets the
  ratio to ``(decoded + 20 * n) / (sum max_new + 1)``; otherwise the ratio decays one step.
- the radix cache (``radix.py`` of this package): prompts are matched at admission (at most
  ``len - 1`` tokens, page-floored), inserted when their prefill ends (``cache_unfinished_req``, also
  after each chunk, so concurrent requests share them), outputs inserted when the request finishes.

Not modelled: the overlap scheduler's one-step lag, speculative decoding, PD disaggregation,
hierarchical cache, priority scheduling, LoRA, grammar, the tokenizer/detokenizer processes (their
time belongs in the step cost), page rounding of the decode growth (decode takes one token per
request per step; admission rounds extends to pages as SGLang does), the per-request page slack
(``page_size - 1`` at most), abort on OOM. A request whose prompt plus ``min(max_new, CLIP)`` cannot
fit an empty pool is rejected on arrival (SGLang refuses prompts longer than the pool). OpenAI-log
``cached_tokens`` count as a hit of that many tokens on every prefill of the request, their KV is
counted as the request's own.

Speed: a decode step costs O(1) Python work however large the batch (every running request gains one
token per step, so per-request state is kept relative to a global decode-step counter: finishes and
``CLIP`` crossings sit in heaps keyed by it); prefill work is per admitted request and per prefix
block.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from hpc_advise.advisor.simulate.config import SchedulerConfig
from hpc_advise.advisor.simulate.cost import PrefillShape, StepCost
from hpc_advise.advisor.simulate.metrics import SimResult
from hpc_advise.advisor.simulate.radix import BlockRadixCache
from hpc_advise.advisor.simulate.workload import Workload, WorkloadError

_NAN = float("nan")
_LPM_QUEUE_LIMIT = 128  # SGLang turns LPM into FCFS above this queue length
_MAX_RUN = 1 << 16  # decode steps one vectorised burst computes at most
_MIN_RUN = 24  # shorter stretches run step by step: numpy's per-call cost exceeds the loop's there


def simulate(
    workload: Workload,
    cost: StepCost,
    config: SchedulerConfig,
    *,
    load: float = 1.0,
    concurrency: int | None = None,
    measure_from_s: float | None = None,
    measure_until_s: float | None = None,
    horizon_s: float | None = None,
    origin_s: float | None = None,
) -> SimResult:
    """Replay ``workload`` through one replica.

    Open loop (``concurrency`` None): request i arrives at ``(arrival_i - arrival_0) / load``
    seconds. Closed loop (``concurrency`` N, what ``bench_serving --max-concurrency N`` does): N
    clients send the requests in trace order, each the next one when its previous one finished;
    arrivals and ``load`` are not used.

    Measured requests: those arriving in [``measure_from_s``, ``measure_until_s``) of the trace's
    time (all when not given); the others are simulated (warm-up, drain) but not reported.
    ``horizon_s`` stops the simulation at that simulated time: requests not finished by then are
    reported as such (their latencies are infinite). Simulated time 0 is the trace time
    ``origin_s`` (default: the first arrival), so replicas of one deployment share a clock.
    """
    if load <= 0 or not math.isfinite(load):
        raise WorkloadError(f"load factor must be a positive number, not {load}")
    if concurrency is not None and concurrency < 1:
        raise WorkloadError(f"concurrency must be at least 1, not {concurrency}")
    return _Replica(workload, cost, config).run(
        load, concurrency, measure_from_s, measure_until_s, horizon_s, origin_s
    )


class _Replica:
    def __init__(
        self, workload: Workload, cost: StepCost, config: SchedulerConfig, bursts: bool = True
    ) -> None:
        self.w = workload
        self.cost = cost
        self.cfg = config
        self.bursts = bursts  # False: every decode step through the full loop (tests compare both)

    def run(self, load, concurrency, measure_from_s, measure_until_s, horizon_s, origin_s) -> SimResult:  # noqa: C901
        w, cfg, cost = self.w, self.cfg, self.cost
        n = len(w)
        pool = cfg.max_total_tokens
        ps = cfg.page_size
        clip = cfg.clip_max_new_tokens
        chunk_size = cfg.chunked_prefill_size
        max_prefill = cfg.max_prefill_tokens
        max_run = cfg.running_limit
        mixed = cfg.enable_mixed_chunk
        lpm = cfg.schedule_policy == "lpm"
        use_radix = cfg.radix_cache
        retract_steps = cfg.retract_decode_steps
        init_ratio, min_ratio, decay = cfg.new_token_ratios
        ratio = init_ratio
        horizon = math.inf if horizon_s is None else float(horizon_s)
        bursts = self.bursts

        inp = w.input_len.tolist()
        out = w.output_len.tolist()
        max_new = (
            w.output_len if w.max_new_tokens is None else np.maximum(w.max_new_tokens, w.output_len)
        ).tolist()
        cached_tr = w.cached.tolist() if use_radix else [-1] * n
        hashed = use_radix and w.has_hashes
        hoff = w.hash_offsets.tolist()
        hashes = w.hashes
        bsize = w.block_size or 0
        t0 = origin_s if origin_s is not None else (float(w.arrival_s[0]) if n else 0.0)

        # Per-request state.
        send_t = [_NAN] * n
        sched_t = [_NAN] * n
        first_t = [_NAN] * n
        fin_t = [_NAN] * n
        hit_first = [0] * n  # cached prompt tokens on the first prefill
        gen = [0] * n  # output tokens generated (valid while not running; running: g0 + D - d0)
        g0 = [0] * n
        d0 = [0] * n
        priv0 = [0] * n  # private KV tokens at join (running: priv0 + D - d0)
        priv = [0] * n  # private KV tokens while not running
        shared = [0] * n  # tokens of the request's KV held in the tree (its locked path)
        filled = [0] * n  # tokens of the current fill (prompt + kept output) in KV
        node = [0] * n  # deepest tree node the request locks (0: none)
        epoch = [0] * n
        unclipped = [False] * n
        last_tok = [_NAN] * n
        rejected = [False] * n
        shared_chains = w.prompt_chains()
        chains: dict[int, tuple[list, list]] = {} if shared_chains is None else shared_chains

        def chain(r: int) -> tuple[list, list]:
            """(block hashes, cum) of request r's prompt, cum[i] = tokens of its first i blocks;
            kept while the request is in flight, or for the next replays of the workload (never
            modified: the tree copies what it keeps)."""
            c = chains.get(r)
            if c is None:
                h = hashes[hoff[r] : hoff[r + 1]].tolist()
                nb = -(-inp[r] // bsize)
                if len(h) > nb:
                    h = h[:nb]
                cum = list(range(0, (len(h) + 1) * bsize, bsize))
                if len(h) == nb and nb:
                    cum[-1] = inp[r]
                c = (h, cum)
                chains[r] = c
            return c

        cache = BlockRadixCache(bsize or 1)
        D = 0  # decode steps taken by the running batch
        n_run = 0
        running: set[int] = set()
        seq_base = 0  # sum over running of inp + g0 - d0: context tokens = seq_base + n_run * D
        run_priv = 0  # private KV tokens of the running requests
        other_priv = 0  # private KV tokens of requests in prefill (the chunked one between chunks)
        sum_c_unc = 0  # sum over running with remaining <= CLIP of (max_new - g0 + d0)
        n_unc = 0
        n_clip = 0
        fin_heap: list[tuple[int, int, int]] = []
        clip_heap: list[tuple[int, int, int]] = []
        joiners: list[int] = []  # joined since the last decode step (their last token time differs)
        last_decode_t = _NAN

        waiting: deque[int] = deque()
        chunked = -1
        batch_full = False
        pending_finished = 0  # finished in the last decode step, not yet filtered out of the batch

        # Statistics.
        n_retract = 0
        n_prefill_steps = 0
        n_decode_steps = 0
        itl_gap: list[float] = []
        itl_w: list[int] = []
        itl_chunks: list[np.ndarray] = []  # from vectorised bursts (``decode_run_s``)
        itl_wchunks: list[np.ndarray] = []
        run_s = getattr(cost, "decode_run_s", None) if bursts else None
        meas_lo = -math.inf if measure_from_s is None else (measure_from_s - t0) / load
        meas_hi = math.inf if measure_until_s is None else (measure_until_s - t0) / load
        kv_used_area = 0.0
        cache_area = 0.0
        area_t = 0.0
        kv_peak = 0

        # Arrivals.
        closed = concurrency is not None
        if closed:
            arr = [0.0] * n
            incoming: deque[tuple[float, int]] = deque((0.0, i) for i in range(min(concurrency, n)))
            next_send = min(concurrency, n)
        else:
            arr = ((w.arrival_s - t0) / load).tolist()
            next_arr = 0
        t = 0.0

        def free_tokens() -> int:
            return pool - cache.total - run_priv - other_priv

        def ensure_free(need: int) -> bool:
            f = free_tokens()
            if f < need:
                cache.evict(need - f)
                f = free_tokens()
            return f >= need

        def send_next(now: float) -> None:
            nonlocal next_send
            if closed and next_send < n:
                incoming.append((now, next_send))
                next_send += 1

        def receive(r: int, now: float) -> None:
            send_t[r] = now
            if inp[r] >= pool - 1 or inp[r] + min(max_new[r], clip) >= pool:
                rejected[r] = True
                send_next(now)
                return
            waiting.append(r)

        def leave(r: int) -> int:
            """Take r out of the running aggregates; returns its private KV tokens."""
            nonlocal n_run, seq_base, run_priv, sum_c_unc, n_unc, n_clip
            running.discard(r)
            n_run -= 1
            seq_base -= inp[r] + g0[r] - d0[r]
            p = priv0[r] + D - d0[r]
            run_priv -= p
            if unclipped[r]:
                sum_c_unc -= max_new[r] - g0[r] + d0[r]
                n_unc -= 1
            else:
                n_clip -= 1
            gen[r] = g0[r] + D - d0[r]
            epoch[r] += 1
            return p

        def join(r: int, now: float) -> None:
            nonlocal n_run, seq_base, run_priv, other_priv, sum_c_unc, n_unc, n_clip
            running.add(r)
            n_run += 1
            g0[r] = gen[r]
            d0[r] = D
            priv0[r] = priv[r]
            other_priv -= priv[r]
            run_priv += priv[r]
            priv[r] = 0
            seq_base += inp[r] + gen[r] - D
            c = max_new[r] - gen[r] + D
            if c - D <= clip:
                unclipped[r] = True
                sum_c_unc += c
                n_unc += 1
            else:
                unclipped[r] = False
                n_clip += 1
                heapq.heappush(clip_heap, (c - clip, epoch[r], r))
            heapq.heappush(fin_heap, (D + out[r] - gen[r], epoch[r], r))
            joiners.append(r)

        def finish(r: int, now: float, private: int) -> None:
            """r generated its last token at ``now`` holding ``private`` KV tokens of its own."""
            fin_t[r] = now
            nd = node[r]
            if hashed and private > 0 and nd > 0:
                cache.add_leaf(nd, ("out", r), private, now)  # output tokens stay cached, evictable
            if nd:
                cache.dec_lock(nd, now)
                node[r] = 0
            if shared_chains is None:
                chains.pop(r, None)
            send_next(now)

        def insert_prompt(r: int, now: float) -> None:
            """cache_unfinished_req: the blocks of r's prompt its KV now covers go into the tree and
            r's lock moves to the deepest of them."""
            nonlocal other_priv
            h, cum = chain(r)
            f = filled[r]
            nb = len(h)
            if f < inp[r]:
                nb = min(nb, f // bsize)
            if nb == 0:
                return
            nd, covered, _ = cache.insert(h, cum, nb, now)
            if covered > shared[r]:
                if nd != node[r]:
                    cache.inc_lock(nd)
                    if node[r]:
                        cache.dec_lock(node[r], now)
                    node[r] = nd
                shared[r] = covered
                p = max(0, f - covered)
                other_priv += p - priv[r]
                priv[r] = p

        def clip_and_finish_after_step(now: float) -> None:
            nonlocal sum_c_unc, n_unc, n_clip, pending_finished
            while clip_heap and clip_heap[0][0] <= D:
                _, ep, r = heapq.heappop(clip_heap)
                if ep == epoch[r] and not unclipped[r]:
                    unclipped[r] = True
                    sum_c_unc += max_new[r] - g0[r] + d0[r]
                    n_unc += 1
                    n_clip -= 1
            while fin_heap and fin_heap[0][0] <= D:
                _, ep, r = heapq.heappop(fin_heap)
                if ep != epoch[r]:
                    continue
                p = leave(r)
                pending_finished += 1
                finish(r, now, p)

        def decode_tokens(now: float) -> None:
            """Every running request got one token at ``now`` (a decode step, or a mixed pass)."""
            nonlocal D, run_priv, last_decode_t
            n_new = 0
            for r in joiners:
                if r in running:
                    itl_gap.append(now - last_tok[r])
                    itl_w.append(1)
                    n_new += 1
            joiners.clear()
            cont = n_run - n_new
            if cont > 0:
                itl_gap.append(now - last_decode_t)
                itl_w.append(cont)
            last_decode_t = now
            run_priv += n_run
            D += 1
            clip_and_finish_after_step(now)

        def burst() -> None:
            """Decode steps while nothing but time can change: no finish or CLIP crossing due, no
            arrival yet, the pool (with evictable cache) covering every step, and no prefill that
            could be admitted (empty queue, or the batch marked full). Same per-step cost calls,
            ratio decay, ITL samples and KV statistics as the loop, without its overhead."""
            nonlocal t, D, run_priv, last_decode_t, ratio, n_decode_steps, kv_used_area, cache_area, area_t
            nonlocal kv_peak
            while fin_heap and fin_heap[0][1] != epoch[fin_heap[0][2]]:
                heapq.heappop(fin_heap)
            while clip_heap and clip_heap[0][1] != epoch[clip_heap[0][2]]:
                heapq.heappop(clip_heap)
            stop_d = (
                min(fin_heap[0][0] if fin_heap else math.inf, clip_heap[0][0] if clip_heap else math.inf) - 1
            )
            if closed:
                stop_t = incoming[0][0] if incoming else math.inf
            else:
                stop_t = arr[next_arr] if next_arr < n else math.inf
            stop_t = min(stop_t, horizon)
            room = free_tokens() + cache.evictable
            locked = cache.total - cache.evictable + other_priv
            total = cache.total
            bs = n_run
            vector = run_s is not None and min(stop_d - D, room // bs) >= _MIN_RUN
            if vector and stop_t < math.inf:  # steps until the next arrival, at the first step's time
                vector = stop_t - t >= _MIN_RUN * cost.decode_s(bs, seq_base + bs * D)
            if vector:
                k = int(min(stop_d - D, room // bs, _MAX_RUN)) if D < stop_d and t < stop_t else 0
                if k <= 0:
                    ensure_free(0)
                    return
                dts = np.asarray(run_s(bs, seq_base + bs * D, k), dtype=np.float64)
                ends = np.cumsum(np.concatenate(([t], dts)))[1:]  # summed from t, as the loop adds
                if stop_t < math.inf:  # a step starts only before the next arrival
                    k = 1 + int(np.searchsorted(ends[:-1], stop_t, side="left"))
                    ends = ends[:k]
                prev = np.empty(k)
                prev[0] = t
                prev[1:] = ends[:-1]
                if itl_gap:  # keep the samples in time order
                    itl_chunks.append(np.asarray(itl_gap, dtype=np.float64))
                    itl_wchunks.append(np.asarray(itl_w, dtype=np.int64))
                    itl_gap.clear()
                    itl_w.clear()
                itl_chunks.append(ends - np.concatenate(([last_decode_t], ends[:-1])))
                itl_wchunks.append(np.full(k, bs, dtype=np.int64))
                ratio = max(ratio - k * decay, min_ratio)
                lo = np.maximum(prev, meas_lo)
                hi = np.minimum(ends, meas_hi)
                dt = np.where(hi > lo, hi - lo, 0.0)
                if dt.any():
                    used = locked + run_priv + bs * np.arange(1, k + 1, dtype=np.float64)  # after the step
                    kv_used_area += float(used @ dt)
                    cache_area += total * float(dt.sum())
                    area_t += float(dt.sum())
                    peak = int(used[np.flatnonzero(dt > 0)[-1]])
                    if peak > kv_peak:
                        kv_peak = peak
                t = float(ends[-1])
                last_decode_t = t
                run_priv += bs * k
                D += k
                n_decode_steps += k
                ensure_free(0)
                return
            decode_s = cost.decode_s
            gap, weight = itl_gap.append, itl_w.append
            # the loop's state in locals (the closure's cells cost more per step), written back after
            now, last, d, held, rt = t, last_decode_t, D, run_priv, ratio
            kv_area, c_area, span, peak = kv_used_area, cache_area, area_t, kv_peak
            while d < stop_d and now < stop_t and room >= bs:
                rt -= decay
                if min_ratio > rt:  # max(rt, min_ratio)
                    rt = min_ratio
                t_prev = now
                now = now + decode_s(bs, seq_base + bs * d)
                gap(now - last)
                weight(bs)
                last = now
                held += bs
                d += 1
                room -= bs
                if now > meas_lo and t_prev < meas_hi:
                    dt = (now if now <= meas_hi else meas_hi) - (meas_lo if meas_lo > t_prev else t_prev)
                    used = locked + held
                    kv_area += used * dt
                    c_area += total * dt
                    span += dt
                    if used > peak:
                        peak = used
            n_decode_steps += d - D
            t, last_decode_t, D, run_priv, ratio = now, last, d, held, rt
            kv_used_area, cache_area, area_t, kv_peak = kv_area, c_area, span, peak
            ensure_free(0)  # the steps took free slots first, then evictable ones: evict those now

        def retract() -> None:
            nonlocal ratio, n_retract
            order = sorted(running, key=lambda r: (g0[r] + D - d0[r], -inp[r]), reverse=True)
            first = True
            while first or not ensure_free(len(order)):
                if len(order) == 1:
                    break
                first = False
                r = order.pop()
                leave(r)  # its private KV is freed, nothing goes into the tree
                if node[r]:
                    cache.dec_lock(node[r], t)
                    node[r] = 0
                shared[r] = 0
                filled[r] = 0
                if last_decode_t > last_tok[r]:  # a joiner keeps its prefill's time
                    last_tok[r] = last_decode_t
                n_retract += 1
                waiting.append(r)
                ensure_free(len(order) * retract_steps)
            decoded = sum(g0[r] + D - d0[r] for r in running)
            total_new = sum(max_new[r] for r in running)
            ratio = min(1.0, (decoded + retract_steps * len(running)) / (total_new + 1))

        def match(r: int) -> tuple[int, int, int]:
            """(cached tokens usable, tree tokens matched, node) for r's next fill."""
            fill = inp[r] + gen[r]
            if hashed and hoff[r + 1] > hoff[r]:
                h, _ = chain(r)
                nd, tokens = cache.match(h, t)
                c = min(tokens, fill - 1)
            else:
                nd, tokens = 0, 0
                c = min(cached_tr[r], fill - 1) if cached_tr[r] > 0 else 0
            if ps > 1:
                c = c // ps * ps
            return c, tokens, nd

        def ceil_page(x: int) -> int:
            return -(-x // ps) * ps

        def try_prefill() -> list | None:
            """get_new_batch_prefill + PrefillAdder: the requests of the next prefill batch as
            (r, tokens already in KV, extend), or None. Called only with a chunk in flight or a waiting
            queue not already found full (the event loop tests that before the call)."""
            nonlocal batch_full, chunked, other_priv
            running_bs = n_run + pending_finished
            if running_bs >= max_run and chunked < 0:
                batch_full = True
                return None
            if lpm and 1 < len(waiting) <= _LPM_QUEUE_LIMIT:
                ordered = sorted(waiting, key=lambda r: -match(r)[0])
                waiting.clear()
                waiting.extend(ordered)
            mix = running_bs if mixed else 0
            rem_input = max_prefill - mix
            rem_chunk = None if chunk_size is None else chunk_size - mix
            tot_off = mix + ratio * (sum_c_unc - n_unc * D + clip * n_clip)
            cur_off = mix
            avail = free_tokens() + cache.evictable
            batch: list[tuple[int, int, int]] = []

            if chunked >= 0:  # add_chunked_req
                r = chunked
                need = inp[r] + gen[r] - filled[r]
                rem = need if rem_chunk is None else min(rem_chunk, int(avail - tot_off))
                if rem > 0:
                    truncated = need > rem
                    ext = rem // ps * ps if truncated else need
                    if ext > 0:
                        batch.append((r, filled[r], ext))
                        e = ceil_page(ext)
                        tot_off += e + (0 if truncated else min(max_new[r], clip))
                        cur_off += e
                        rem_input -= e
                        if rem_chunk is not None:
                            rem_chunk -= e
                        if not truncated:
                            chunked = -1

            admitted = 0
            new_chunked = -1
            no_token = False
            for r in waiting:
                if len(batch) >= max_run - (n_run + pending_finished):
                    batch_full = True
                if batch_full:
                    break
                c, tokens, nd = match(r)
                fill = inp[r] + gen[r]
                ext = fill - c
                total = ext + min(max_new[r], clip)
                if total >= avail - tot_off:
                    no_token = True
                    break
                e = ceil_page(ext)
                if e >= rem_input and batch:
                    break
                moved = cache.inc_lock(nd) if nd else 0
                avail -= moved
                if total >= avail - tot_off:
                    if nd:
                        avail += cache.dec_lock(nd, t)
                    no_token = True
                    break
                if rem_chunk is None or e <= rem_chunk:
                    tot_off += e + min(max_new[r], clip)
                    cur_off += e
                    rem_input -= e
                    if rem_chunk is not None:
                        rem_chunk -= e
                else:
                    trunc = rem_chunk // ps * ps
                    if trunc <= 0:
                        if nd:
                            avail += cache.dec_lock(nd, t)
                        break
                    ext = trunc
                    new_chunked = r
                    tot_off += trunc
                    cur_off += trunc
                    rem_input -= trunc
                    rem_chunk -= trunc
                node[r] = nd
                shared[r] = tokens if nd else 0
                filled[r] = c
                if first_t[r] != first_t[r] and gen[r] == 0:  # first prefill (NaN first_t)
                    hit_first[r] = c
                batch.append((r, c, ext))
                admitted += 1
                if avail - tot_off <= 0 or avail - cur_off <= 0:
                    no_token = True
                    break
                if rem_input <= 0 or (rem_chunk is not None and rem_chunk <= 0):
                    break
            if no_token:
                batch_full = True
            for _ in range(admitted):
                waiting.popleft()
            if new_chunked >= 0:
                chunked = new_chunked
            return batch or None

        # ------------------------------------------------------------------ the loop
        stuck = False
        min_free = pool
        while True:
            if closed:
                while incoming and incoming[0][0] <= t:
                    st, r = incoming.popleft()
                    receive(r, st)
            else:
                while next_arr < n and arr[next_arr] <= t:
                    receive(next_arr, arr[next_arr])
                    next_arr += 1
            if t >= horizon:
                break
            t_start = t
            may_burst = False
            free = pool - cache.total - run_priv - other_priv  # free_tokens(), inlined in the hot loop
            if free < min_free:
                min_free = free

            # nothing to admit in most iterations: test it before the call
            batch = try_prefill() if chunked >= 0 or (waiting and not batch_full) else None
            if batch is not None:
                stuck = False
                new_tok = 0
                ctx = 0
                pairs = 0.0
                for r, pre, ext in batch:
                    new_tok += ext
                    ctx += pre
                    pairs += ext * (pre + (ext + 1) / 2)
                    if sched_t[r] != sched_t[r]:
                        sched_t[r] = t
                nseq = len(batch)
                ride = mixed and n_run > 0 and ensure_free(new_tok + n_run)
                if ride:
                    sctx = seq_base + n_run * D
                    new_tok += n_run
                    ctx += sctx
                    pairs += sctx + n_run
                    nseq += n_run
                ensure_free(new_tok)
                for r, pre, ext in batch:
                    filled[r] = pre + ext
                    p = max(0, filled[r] - shared[r])
                    other_priv += p - priv[r]
                    priv[r] = p
                t = t + cost.prefill_s(PrefillShape(new_tok, ctx, nseq, pairs))
                n_prefill_steps += 1
                if ride:
                    pending_finished = 0
                    decode_tokens(t)
                for r, _, _ in batch:
                    if hashed and hoff[r + 1] > hoff[r]:
                        insert_prompt(r, t)
                    if r == chunked:
                        continue
                    gen[r] += 1
                    if first_t[r] != first_t[r]:
                        first_t[r] = t
                    else:  # re-prefill after a retraction: the gap since its last token
                        itl_gap.append(t - last_tok[r])
                        itl_w.append(1)
                    last_tok[r] = t
                    if gen[r] >= out[r]:
                        p = priv[r]
                        other_priv -= p
                        priv[r] = 0
                        finish(r, t, p)
                        batch_full = False  # the finished request leaves the last batch
                    else:
                        join(r, t)
            elif n_run > 0 or pending_finished:
                # update_running_batch
                if pending_finished:
                    pending_finished = 0
                    batch_full = False
                if n_run == 0:
                    batch_full = False
                    continue
                if not ensure_free(n_run):
                    retract()
                    batch_full = False  # the batch shrank
                else:
                    ratio = max(ratio - decay, min_ratio)
                stuck = False
                t = t + cost.decode_s(n_run, seq_base + n_run * D)
                n_decode_steps += 1
                decode_tokens(t)
                may_burst = bursts
            else:
                # Idle: SGLang resets the new-token ratio; wait for the next arrival.
                ratio = init_ratio
                if waiting and (stuck or not batch_full):
                    # Nothing runs and the head of the queue cannot be admitted into an empty
                    # replica (a retracted request grown past the pool): SGLang cannot serve it.
                    r = waiting.popleft()
                    rejected[r] = True
                    send_next(t)
                    stuck = False
                    continue
                batch_full = False
                stuck = bool(waiting)
                if stuck:
                    continue
                if closed:
                    if not incoming:
                        break
                    t = max(t, incoming[0][0])
                else:
                    if next_arr >= n:
                        break
                    t = max(t, arr[next_arr])
                continue

            # KV statistics over the measured span (time-weighted).
            if t > meas_lo and t_start < meas_hi:
                dt = min(t, meas_hi) - max(t_start, meas_lo)
                used = pool - free_tokens() - cache.evictable
                kv_used_area += used * dt
                cache_area += cache.total * dt
                area_t += dt
                if used > kv_peak:
                    kv_peak = used
            if may_burst and not pending_finished and chunked < 0 and n_run and (batch_full or not waiting):
                burst()

        # Bookkeeping checks: the pool never over-committed; a finished run holds nothing but cache.
        if min_free < 0:
            raise RuntimeError(f"simulator bookkeeping: KV pool over-committed by {-min_free} tokens")
        if t < horizon and not waiting and chunked < 0 and n_run == 0:
            if run_priv or other_priv or cache.evictable != cache.total:
                raise RuntimeError(
                    f"simulator bookkeeping: {run_priv + other_priv} private and "
                    f"{cache.total - cache.evictable} locked tokens left after the last request"
                )
        send = np.asarray(send_t)
        if closed:
            measured = np.ones(n, dtype=bool)
        else:
            a = np.asarray(arr)
            measured = (a >= meas_lo) & (a < meas_hi)
        return SimResult.from_requests(
            send_s=send[measured],
            sched_s=np.asarray(sched_t)[measured],
            first_s=np.asarray(first_t)[measured],
            finish_s=np.asarray(fin_t)[measured],
            input_len=w.input_len[measured],
            output_len=w.output_len[measured],
            cached_tokens=np.asarray(hit_first)[measured],
            rejected=np.asarray(rejected)[measured],
            itl_s=np.concatenate([*itl_chunks, np.asarray(itl_gap, dtype=np.float64)]),
            itl_weight=np.concatenate([*itl_wchunks, np.asarray(itl_w, dtype=np.int64)]),
            retractions=n_retract,
            prefill_steps=n_prefill_steps,
            decode_steps=n_decode_steps,
            sim_end_s=t,
            pool_tokens=pool,
            kv_used_mean=kv_used_area / area_t if area_t > 0 else 0.0,
            kv_used_peak=kv_peak,
            cache_tokens_mean=cache_area / area_t if area_t > 0 else 0.0,
        )
