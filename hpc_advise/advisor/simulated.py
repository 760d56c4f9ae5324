"""``recommend``'s simulated stage: the surviving candidates' figures replayed through the simulator.

``recommend`` screens every candidate analytically (``recommend.Ranker``: the two-stage serving model's
point predictions, Little's law, M/G/1 prefill queueing); the first ``N_SIMULATED`` rows of that ranking
are then simulated, and what the table prints for them comes out of the simulation:

1. **Levels** (``step_model.solve_levels``): the candidate's step cost is the physics of its steps
   (``roofline``'s terms) levelled on the two-stage model at its operating point: the decode factor so
   that a simulated closed loop of its requests in flight (the trace's mean lengths, its prefix reuse)
   gives the two-stage mean TPOT; the prefill occupies the serving model's ``prefill_occupancy`` x its
   roofline of GPU; the rest of the two-stage TTFT is latency that occupies no GPU, scaled so that the
   same closed loop gives the two-stage mean TTFT. The attention backend's and MoE runner's per-step
   difference to the reference (``kernel_models``, as the screen computes it) is added to every decode
   step.
2. **Windows** (``simulate.select_windows``): the busiest stretch of the trace (most prompt + output
   tokens arriving) and one sampled stretch, each with a warm-up; ``WINDOW_S`` long, shortened in
   proportion so the busiest holds about ``MAX_WINDOW_REQUESTS`` measured requests, not below
   ``MIN_WINDOW_S`` (the run's cost grows with them).
   Without arrival times (or with ``--concurrency``), a closed loop of the concurrency over the
   trace's first requests instead.
3. **Replay** (``simulate.replicas.simulate_replicas``): every attention group of every replica is one
   simulated scheduler with SGLang's KV pool (``rules.kv_pool_tokens``), chunked prefill default,
   admission and retraction, and the radix cache replayed from the trace's ``hash_ids`` (or its
   ``cached_tokens``), requests split by sgl-router's cache-aware policy (round robin without hashes).
   The table's TPOT / TTFT percentiles, throughput and SLO verdict are the busiest window's at the
   trace's load; the sampled window's figures (``add_samples``, for the rows the report details) are
   in the details and the JSON (``simulated``).
4. **Capacity** (``simulate.search.capacity_search``): the largest load factor at which the busiest
   window still meets the SLOs (p99; a request unfinished when the run stops, the window's end plus
   a drain, has infinite latencies) with nothing rejected, at most ``BACKLOG_FRACTION`` of its
   requests still waiting for their first prefill at its end (the queue does not grow) and as many
   at most unfinished when the run stops (without SLOs only these), by bisection on log load to ``RESOLUTION``; max tok/s/GPU is the simulated output
   throughput per GPU there. Rows that differ only by attention backend or MoE runner first try the
   edge found for the first of them (two runs); a search starts from that edge, or from the screen's
   capacity, bracketing by ``WARM_STEP``.

What the simulation adds over the screen: queueing behind the other requests' prefills and decode
(bursts included), admission into the KV pool and retraction, the per-pool prefix cache, and the
distribution of each request's latency. What it does not add: its levels come from the two-stage
model, so its mean TPOT / TTFT at the candidate's closed-loop point are the model's, and its error
there is the model's (``model eval``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hpc_advise.advisor import calibration
from hpc_advise.advisor import step_model as sm
from hpc_advise.advisor.capacity import MEMORY, Capacity
from hpc_advise.advisor.simulate import SimResult, Window, Workload, WorkloadError, select_windows
from hpc_advise.advisor.simulate.replicas import Split, run_split, split_for
from hpc_advise.advisor.simulate.search import CapacityResult, capacity_search

N_SIMULATED = 3  # rows of the screen's ranking that are simulated
N_SHAPES = 2  # deployment shapes whose best row is simulated (``survivors``); a third cost as much as
# the other rows together on the README example (33 vs 17 scheduler replays), past the 2 s budget
WINDOW_S = 300.0
WARMUP_S = 60.0
N_SAMPLES = 1
MAX_WINDOW_REQUESTS = 1000
MIN_WINDOW_S = 20.0
LIFETIMES = 2.0  # request lifetimes of arrivals before the measured window (``CandidateSim.copies``)
MAX_COPIES = 12
MAX_TILED_REQUESTS = 24000
BACKLOG_FRACTION = 0.05  # of the window's requests still waiting for their prefill at its end
RESOLUTION = 0.1  # the serving model it is levelled on errs by more (TPOT 16 % median held out)
WARM_STEP = 1.5  # bracketing step of a search started from a guess (``_start``)
LOAD_BOUND = 64.0
MAX_HASHES = 1 << 24  # hash ids kept from the trace (128 MiB); beyond, the prefix cache is not replayed
CLOSED_LOOP_REQUESTS = 2000  # requests a closed-loop replay sends at most (at least 3x the clients)
UNFINISHED = "queue growth"  # the capacity limit when requests do not finish within the drain


class TraceRequests:
    """Every request of the trace as arrays, kept from ``summarize``'s one pass (``keep=self.add``)."""

    def __init__(self) -> None:
        self._parts: list[tuple] = []
        self._hashes: list[np.ndarray] = []
        self.n_hashes = 0
        self.hashes_dropped = False
        self.block_sizes: set = set()
        self._workload: Workload | None = None

    def add(self, cols) -> None:
        keep = ~np.asarray(cols.failed, dtype=bool) & (cols.n_out >= 1) & (cols.n_in >= 1)
        counts = np.asarray(cols.hash_counts, dtype=np.int64)
        self._parts.append((cols.t[keep], cols.n_in[keep], cols.n_out[keep], cols.cached[keep], counts[keep]))
        if cols.hashes.size and not self.hashes_dropped:
            if self.n_hashes + cols.hashes.size > MAX_HASHES or cols.each_block_size is not None:
                self.hashes_dropped = True
                self._hashes.clear()
            else:
                self._hashes.append(cols.hashes[np.repeat(keep, counts)].view(np.int64))
                self.n_hashes += int(cols.hashes.size)
                self.block_sizes |= set(cols.block_sizes)
        self._workload = None

    def workload(self) -> Workload:
        """The kept requests sorted by arrival (untimed ones at 0: closed-loop replays use no times)."""
        if self._workload is not None:
            return self._workload
        cat = lambda i: np.concatenate([p[i] for p in self._parts]) if self._parts else np.zeros(0)  # noqa: E731
        t = np.nan_to_num(cat(0).astype(np.float64), nan=0.0)
        cached = cat(3).astype(np.float64)
        counts = cat(4).astype(np.int64)
        hashed = bool(self._hashes) and not self.hashes_dropped and len(self.block_sizes) == 1
        hashes = np.concatenate(self._hashes) if hashed else np.zeros(0, dtype=np.int64)
        if not hashed:
            counts = np.zeros_like(counts)
        off = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=off[1:])
        w = Workload(
            t,
            cat(1).astype(np.int64),
            cat(2).astype(np.int64),
            np.where(np.isnan(cached), -1, cached).astype(np.int64),
            off,
            hashes,
            next(iter(self.block_sizes)) if hashed else None,
        )
        order = np.argsort(t, kind="stable")
        self._workload = w if np.all(order[1:] > order[:-1]) else w.select(order)
        self._parts.clear()
        self._hashes.clear()
        return self._workload


@dataclass
class Plan:
    """What is simulated for every candidate of one trace: the windows (open loop) or the closed loop."""

    workload: Workload
    windows: list[Window]  # busiest first; empty: closed loop
    closed_requests: Workload | None = None

    def __post_init__(self) -> None:
        self._splits: dict = {}

    def split(self, window: int, groups: int, copies: int = 1) -> Split:
        """The requests of window ``window`` (``copies`` times, ``simulate.workload.tiled``; or the
        closed loop's) over ``groups`` schedulers, split once per trace, group count and copies: the
        router's split does not depend on the load or the cost."""
        key = (window, groups, copies)
        if key not in self._splits:
            if self.windows:
                self._splits[key] = split_for(
                    self.workload, groups, window=self.windows[window], copies=copies
                )
            else:
                self._splits[key] = split_for(self.closed_requests, groups)
        return self._splits[key]

    def describe(self, concurrency: float | None = None) -> str:
        if not self.windows:
            n = len(self.closed_requests) if self.closed_requests is not None else 0
            return f"closed loop of {concurrency:.0f} clients over the trace's first {n} requests"
        return "; ".join(self.window_lines())

    def window_lines(self) -> list[str]:
        t0 = float(self.workload.arrival_s[0]) if len(self.workload) else 0.0
        return [w.describe(t0) for w in self.windows]


def plan(requests: TraceRequests, closed: bool, concurrency: float | None = None) -> Plan:
    w = requests.workload()
    if len(w) == 0:
        raise WorkloadError("no requests to simulate")
    if closed:
        n = min(len(w), max(CLOSED_LOOP_REQUESTS, 3 * int(math.ceil(concurrency or 1))))
        return Plan(w, [], w.select(np.arange(n)))
    tokens = (w.input_len + w.output_len).astype(np.float64)
    first = select_windows(w.arrival_s, tokens, WINDOW_S, 0, WARMUP_S)[0]
    length = WINDOW_S
    if first.n_requests > MAX_WINDOW_REQUESTS:
        length = max(WINDOW_S * MAX_WINDOW_REQUESTS / first.n_requests, MIN_WINDOW_S)
    windows = select_windows(w.arrival_s, tokens, length, N_SAMPLES, min(WARMUP_S, length))
    return Plan(w, windows)


def _stats(res: SimResult, slo_ttft_s, slo_tpot_s) -> dict:
    s = res.summary(slo_ttft_s, slo_tpot_s)
    ms = lambda d: {k: (round(v * 1e3, 2) if math.isfinite(v) else None) for k, v in d.items()}  # noqa: E731
    out = {k: s[k] for k in ("requests", "finished", "unfinished", "rejected", "retractions")}
    for name in ("ttft", "tpot", "itl", "queue", "e2e"):
        out[f"{name}_ms"] = ms(s[f"{name}_s"])
    for k in ("request_throughput", "output_throughput", "goodput_req_s"):
        out[k] = round(s[k], 4)
    for k in ("good_fraction", "kv_used_mean", "kv_used_peak", "cache_hit_rate"):
        out[k] = round(s[k], 4)
    return out


class CandidateSim:
    """One candidate's levelled cost and its replays (cached per load)."""

    def __init__(self, ranker, r, the_plan: Plan, fixed: float | None):
        c = r.candidate
        self.ranker, self.r, self.plan, self.c = ranker, r, the_plan, c
        conc = r.concurrency
        pred = ranker.serving_predictions([c], {c: conc})[ranker.pred_key(c, conc)]
        tpot, ttft, prep, (over, coef, corr, occupancy) = calibration.apply(ranker.correction(c), pred)
        self.deployed = sm.deployed(ranker.model, ranker.gpu, prep.dep, page_size=c.page_size)
        groups = c.replicas * c.attn_dp
        one = float(c.attn_dp)  # one request per attention group
        idle = ranker.serving_predictions([c], {c: one})[ranker.pred_key(c, one)]
        idle_ttft = calibration.apply(ranker.correction(c), idle)[1]
        base, self.levels = sm.solve_levels(
            self.deployed,
            ranker.w.isl_mean,
            ranker.w.osl_mean,
            conc / c.attn_dp,
            tpot,
            ttft,
            (over, coef, corr),
            occupancy,
            ranker.reuse(c),
            sm.decode_shape_of(ranker.serving.theta["tpot"].get("sglang", ranker.serving.theta["tpot"]["*"])),
            idle_ttft,
        )
        batch = max(int(round(conc / c.attn_dp)), 1)
        moe_us, _ = ranker._moe_times(c, batch)
        extra_s = (r.attn_delta_ms * 1e3 + moe_us) / 1e6
        self.cost = sm.LevelledStepCost(
            self.deployed.terms, base.decode_factor, base.prefill_factor, extra_s, base.decode_shape
        )
        self.groups = groups
        self.closed_clients = None if the_plan.windows else max(int(round(fixed or conc * c.replicas)), 1)
        self._runs: dict = {}
        self.backlog: dict = {}  # (load, window): requests still waiting for a prefill at the window's end
        self.served: dict = {}  # (load, window): output tokens/s of the measured requests over the window

    def replay_key(self) -> tuple:
        """Everything a replay depends on: two candidates with equal keys (an attention backend or MoE
        runner whose per-step difference came out the same, e.g. a MoE bucket our runner hands to
        SGLang's) replay identically, so they share one set of runs."""
        cost, c = self.cost, self.c
        return (
            repr(self.deployed.config), repr(self.deployed.terms.dep), self.groups, self.closed_clients,
            c.page_size, cost.decode_factor, cost.prefill_factor, cost.extra_decode_s,
            tuple(cost.decode_shape.tolist()), repr(self.levels.to_dict()), self.r.latency_ms,
        )  # fmt: skip

    def share_runs(self, other: CandidateSim) -> None:
        self._runs, self.backlog, self.served = other._runs, other.backlog, other.served

    def run(self, load: float, window: int = 0) -> SimResult:
        key = (round(load, 9), window)
        got = self._runs.get(key)
        if got is None:
            p = self.plan
            if p.windows:
                copies = self.copies(load, p.windows[window])
                split = p.split(window, self.groups, copies)
                res = run_split(split, self.cost, self.deployed.config, load=load)
                end = (split.window.end_s - split.origin_s) / load  # simulated time 0: the first replayed
                waiting = (res.send_s <= end) & ~(res.send_s + res.queue_s <= end) & ~res.rejected
                self.backlog[key] = int(waiting.sum())
                done = res.finished & ~res.rejected
                span = (split.window.end_s - split.window.start_s) / load
                self.served[key] = float(res.output_len[done].sum()) / span
            else:
                clients = max(int(round(self.closed_clients * load)), 1)
                res = run_split(p.split(0, self.groups), self.cost, self.deployed.config, concurrency=clients)
                self.served[key] = res.summary()["output_throughput"]
            new = np.maximum(res.input_len - res.cached_tokens, 1)
            pf = self.cost.roofline_prefill_ms(new, res.cached_tokens)
            got = res.delayed(self.levels.latency_ms(pf) / 1e3)
            self._runs[key] = got
        return got

    def copies(self, load: float, win: Window) -> int:
        """Copies of the window to replay at ``load`` (``simulate.workload.tiled``): enough that the
        measured one comes after ``LIFETIMES`` request lifetimes of arrivals at that load (warm-up
        included), so a rate the deployment cannot sustain shows as a growing queue instead of one
        burst it absorbs. The lifetime: the screen's mean request latency (the window's length
        where the screen found none)."""
        life = self.r.latency_ms / 1e3 if math.isfinite(self.r.latency_ms) else win.end_s - win.start_s
        need = LIFETIMES * life * load - win.warmup_s
        k = 1 + max(0, math.ceil(need / win.period_s))
        return int(min(k, MAX_COPIES, max(1, MAX_TILED_REQUESTS // max(win.n_requests, 1))))

    def failure(self, load: float, slo_tpot, slo_ttft) -> str | None:
        """The first condition the busiest window (or the closed loop) fails at ``load``, or None."""
        from hpc_advise.advisor.capacity import TPOT_SLO, TTFT_SLO

        res = self.run(load)
        if res.rejected.any():
            return MEMORY
        limit = BACKLOG_FRACTION * max(res.n_requests, 1)
        if self.backlog.get((round(load, 9), 0), 0) > limit or int((~res.finished).sum()) > limit:
            return UNFINISHED
        if slo_tpot is not None and not res.meets(None, slo_tpot / 1e3):
            return TPOT_SLO
        if slo_ttft is not None and not res.meets(slo_ttft / 1e3, None):
            return TTFT_SLO
        return None


def survivors(ranked: list, n: int = N_SIMULATED, shapes: int = N_SHAPES) -> list:
    """The rows to simulate: the screen's first ``n``, plus the best-ranked row of each deployment
    shape (TP, replicas, EP, attention DP) among the screen's first ``shapes`` shapes: the screen and
    the simulation can order shapes differently (bursts, admission), and the reasons compare the pick
    with the best other deployment, simulated too. Twins of a shape cost two runs (``_edge``)."""
    chosen = list(ranked[:n])
    shape = lambda r: (r.candidate.tp, r.candidate.replicas, r.candidate.ep, r.candidate.attn_dp)  # noqa: E731
    seen = {shape(r) for r in chosen}
    for r in ranked[n:]:
        if len(seen) >= shapes:
            break
        if shape(r) not in seen:
            seen.add(shape(r))
            chosen.append(r)
    return chosen


def simulate_ranked(
    ranker, rows: list, the_plan: Plan, slo_tpot, slo_ttft, fixed, search: bool = True
) -> None:
    """Replace the figures of ``rows`` (``survivors``) by their simulation (module docstring). Without
    ``search`` only the trace's load is simulated and the rows keep the screen's capacity (``more_gpus``
    needs only whether the top pick meets the SLOs)."""
    slo_s = (None if slo_ttft is None else slo_ttft / 1e3, None if slo_tpot is None else slo_tpot / 1e3)
    over = "arrival rate" if the_plan.windows else "concurrency"
    edges: dict = {}
    replays: dict = {}
    for r in rows:
        try:
            cs = CandidateSim(ranker, r, the_plan, fixed)
        except (ValueError, WorkloadError) as exc:
            r.flags.insert(0, f"not simulated: {exc}")
            continue
        same = replays.setdefault(cs.replay_key(), cs)
        if same is not cs:
            cs.share_runs(same)
        at_one = cs.run(1.0)
        why: dict[float, str | None] = {}

        def evaluate(x: float, cs=cs, why=why) -> bool:
            why[x] = cs.failure(x, slo_tpot, slo_ttft)
            return why[x] is None

        found = None
        if search:
            shape = (
                r.candidate.tp,
                r.candidate.replicas,
                r.candidate.ep,
                r.candidate.attn_dp,
                r.candidate.kv_dtype,
            )
            twin = edges.get(shape)
            found = _edge(twin, evaluate)
            if found is None:
                # the trace's own load is replayed for the table anyway: a known point of the search
                found = capacity_search(evaluate, 1.0 / LOAD_BOUND, LOAD_BOUND, RESOLUTION, *_start(r, twin),
                                        known=((1.0, evaluate(1.0)),))  # fmt: skip
                edges.setdefault(shape, found)
            tok = cs.served[(round(found.load, 9), 0)] / r.candidate.n_gpus if found.load > 0 else 0.0
            limit = "bound" if found.fail_at is None else (why.get(found.fail_at) or "bound")
            r.capacity = Capacity(found.load, over, tok, limit, found.fail_at)
        busiest = _stats(at_one, *slo_s)
        _apply(r, busiest, cs, slo_tpot, slo_ttft)
        r.sim_state = (cs, slo_s)
        r.simulated = {
            "window": the_plan.describe(cs.closed_clients),
            "windows": the_plan.window_lines(),
            "busiest": dict(busiest, backlog_at_end=cs.backlog.get((1.0, 0))),
            "sampled": [],  # ``add_samples``, for the rows the report details
            "levels": {k: round(v, 6) if isinstance(v, float) else v for k, v in cs.levels.to_dict().items()},
            "pool_tokens": cs.deployed.config.max_total_tokens,
            "schedulers": cs.groups,
            "evaluations": len(found.evaluations) if found else 0,
            "resolution": RESOLUTION,
        }


def add_samples(rows: list) -> None:
    """The sampled windows' figures (at the trace's load) for the simulated ``rows``: run for the rows
    the report details only (the top three after the final ranking), one run per window each."""
    for r in rows:
        state = getattr(r, "sim_state", None)
        if state is None or not r.simulated or r.simulated["sampled"]:
            continue
        cs, slo_s = state
        r.simulated["sampled"] = [_stats(cs.run(1.0, k), *slo_s) for k in range(1, len(cs.plan.windows))]


def _start(r, twin: CapacityResult | None) -> tuple[float, float]:
    """(start, step) of a row's capacity search: warm from its twin's edge, else from the screen's
    capacity (``WARM_STEP`` either side), cold (1, doubling) where neither gives a multiple."""
    guess = twin.load if twin is not None else (r.capacity.x if r.capacity is not None else 0.0)
    if 1.0 / LOAD_BOUND < guess < LOAD_BOUND:
        return guess, WARM_STEP
    return 1.0, 2.0


def _edge(prev, evaluate) -> CapacityResult | None:
    """The edge ``prev`` (a twin's search) when it holds here too: passing at its load and failing at
    its ``fail_at`` (two runs); None when it does not, or there is none."""
    if prev is None:
        return None
    seen = []
    if prev.load > 0:
        ok = evaluate(prev.load)
        seen.append((prev.load, ok))
        if not ok:
            return None
    if prev.fail_at is not None:
        ok = evaluate(prev.fail_at)
        seen.append((prev.fail_at, ok))
        if ok:
            return None
    return CapacityResult(prev.load, prev.fail_at, tuple(seen))


def _apply(r, st: dict, cs: CandidateSim, slo_tpot, slo_ttft) -> None:
    """The row's printed figures from the busiest window at load 1."""
    inf = math.inf
    get = lambda d, k: inf if d.get(k) is None else d[k]  # noqa: E731
    r.tpot_p50, r.tpot_p99 = get(st["tpot_ms"], "p50"), get(st["tpot_ms"], "p99")
    r.ttft_p50, r.ttft_p99 = get(st["ttft_ms"], "p50"), get(st["ttft_ms"], "p99")
    r.tok_s_per_gpu = cs.served[(1.0, 0)] / r.candidate.n_gpus
    r.latency_ms = get(st["ttft_ms"], "mean") + cs.ranker.w.osl_mean * get(st["tpot_ms"], "mean")
    failed = cs.failure(1.0, slo_tpot, slo_ttft)
    # a deployment that does not keep up meets no SLO, and without SLOs it ranks after those that do
    r.meets_slo = (
        failed is None
        if (slo_tpot is not None or slo_ttft is not None)
        else failed
        not in (
            UNFINISHED,
            MEMORY,
        )
    )
    r.sim_failure = failed
    # the screen's queueing verdicts are the analytic model's; the replay has its own
    r.flags = [f for f in r.flags if not f.startswith(("saturated:", "prefill saturated"))]
    r.kv_saturated_rps = None
    waiting = cs.backlog.get((1.0, 0), 0)
    if failed == UNFINISHED:
        k = r.capacity
        keeps = ""
        if k is not None and k.over == "arrival rate" and cs.ranker.w.rate_rps:
            keeps = (
                f"; it keeps up to {k.x:.2f}x the trace's rate ({k.x * cs.ranker.w.rate_rps:.2f} req/s)"
                if k.x > 0
                else f"; it does not keep up even at 1/{LOAD_BOUND:g} of the trace's rate"
            )
        r.flags.insert(
            0,
            f"simulated: {waiting} of {st['requests']} requests of the busiest window still wait for their "
            f"prefill at its end: the queue grows at the trace's load{keeps}",
        )
    if st["rejected"]:
        r.flags.insert(0, f"simulated: {st['rejected']} requests do not fit the KV pool")
