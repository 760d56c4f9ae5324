"""Checks every request passes, whatever its format, and the limits behind them.

- lengths are whole numbers in ``[0, MAX_TOKENS]`` (10 M tokens: anything longer is a unit or
  parsing mistake, not a request); ``cached`` in ``[0, input_len]``;
- timestamps are not negative (non-finite ones are refused by the parsers);
- timestamps may be out of order by at most ``REORDER_S`` (10 s): logs written by several workers
  interleave a little, and such requests are re-sorted in a bounded buffer; a request more than 10 s
  earlier than one already read is an error (sort the file first, e.g. ``sort -n`` on the time field).
"""

from __future__ import annotations

MAX_TOKENS = 10_000_000
REORDER_S = 10.0
BAD_EXAMPLES = 5  # skipped bad lines quoted in a summary's notes


def request_problem(t, n_in: int, n_out: int, cached) -> str | None:
    """Why a request is unusable (order aside), or None."""
    if n_in < 0 or n_out < 0:
        return f"negative length (input {n_in}, output {n_out})"
    if n_in > MAX_TOKENS or n_out > MAX_TOKENS:
        return f"absurd length (input {n_in}, output {n_out}; limit {MAX_TOKENS:,} tokens)"
    if cached is not None and not 0 <= cached <= n_in:
        return f"cached tokens {cached} outside [0, input {n_in}]"
    if t is not None and t < 0:
        return f"negative timestamp {t}"
    return None


def order_problem(t: float, max_t: float, max_line: int) -> str:
    return (
        f"timestamp {t:.3f} s is {max_t - t:.3f} s before the one on line {max_line} "
        f"(requests may be at most {REORDER_S:g} s out of order: sort the trace first)"
    )
