"""The radix (prefix) cache of one SGLang replica, at the trace's block granularity.

Modelled on ``sglang/srt/mem_cache/radix_cache.py``: a tree whose nodes hold KV tokens; a request
locks the deepest node it uses (``inc_lock_ref`` walks to the root, moving the path from evictable to
protected); ``evictable`` counts the tokens of unlocked nodes, and the scheduler treats them as free
(``available_size() + evictable_size()``); eviction removes unlocked leaves, least recently used first
(``last_access_time``, refreshed when a match walks through a node), and a parent left childless and
unlocked becomes a candidate in turn.

What differs: SGLang's tree is keyed by token ids and splits nodes anywhere; here a node is one block
of the trace (Mooncake ``hash_ids``, 512 tokens; the last block of a prompt may be shorter), keyed by
(parent, hash), so a match ends at a block boundary. A shared block is stored once, as in SGLang.
Output tokens inserted when a request finishes are one leaf that nothing matches (a later turn's
prompt carries its own block hashes).
"""

from __future__ import annotations

import heapq


class BlockRadixCache:
    """Block-level radix tree with lock counts and LRU eviction of unlocked leaves. Node 0 is the
    root (always present, holds nothing). Token counts: ``total`` (all nodes), ``evictable``
    (nodes with no lock)."""

    def __init__(self) -> None:
        self.parent: list[int] = [-1]
        self.length: list[int] = [0]
        self.lock: list[int] = [1]
        self.atime: list[float] = [0.0]
        self.nchild: list[int] = [0]
        self.key: list[tuple | None] = [None]
        self.alive: list[bool] = [True]
        self.child: dict[tuple[int, int], int] = {}
        self._free: list[int] = []
        self._heap: list[tuple[float, int]] = []
        self.total = 0
        self.evictable = 0

    # -- queries ---------------------------------------------------------------------------------

    def match(self, hashes, now: float, limit: int | None = None) -> tuple[int, int]:
        """Longest cached prefix of ``hashes`` (at most ``limit`` blocks): (node, tokens). Refreshes
        the access time of every matched node, as SGLang's ``match_prefix`` does."""
        node = 0
        tokens = 0
        child = self.child
        atime = self.atime
        length = self.length
        n = len(hashes) if limit is None else min(limit, len(hashes))
        for i in range(n):
            nxt = child.get((node, hashes[i]))
            if nxt is None:
                break
            node = nxt
            atime[node] = now
            tokens += length[node]
        return node, tokens

    def depth_tokens(self, node: int) -> int:
        """Tokens on the path from the root to ``node``."""
        t = 0
        parent, length = self.parent, self.length
        while node > 0:
            t += length[node]
            node = parent[node]
        return t

    # -- locks -----------------------------------------------------------------------------------

    def inc_lock(self, node: int) -> int:
        """Lock the path root..node; returns the tokens that stopped being evictable."""
        moved = 0
        lock, length, parent = self.lock, self.length, self.parent
        while node > 0:
            if lock[node] == 0:
                moved += length[node]
            lock[node] += 1
            node = parent[node]
        self.evictable -= moved
        return moved

    def dec_lock(self, node: int, now: float) -> int:
        """Unlock the path root..node; returns the tokens that became evictable."""
        moved = 0
        lock, length, parent, nchild = self.lock, self.length, self.parent, self.nchild
        while node > 0:
            lock[node] -= 1
            if lock[node] == 0:
                moved += length[node]
                if nchild[node] == 0:
                    heapq.heappush(self._heap, (self.atime[node], node))
            node = parent[node]
        self.evictable += moved
        return moved

    # -- insert / evict --------------------------------------------------------------------------

    def _new_node(self, parent: int, key, length: int, now: float) -> int:
        if self._free:
            n = self._free.pop()
            self.parent[n] = parent
            self.length[n] = length
            self.lock[n] = 0
            self.atime[n] = now
            self.nchild[n] = 0
            self.key[n] = key
            self.alive[n] = True
        else:
            n = len(self.parent)
            self.parent.append(parent)
            self.length.append(length)
            self.lock.append(0)
            self.atime.append(now)
            self.nchild.append(0)
            self.key.append(key)
            self.alive.append(True)
        self.child[key] = n
        self.nchild[parent] += 1
        self.total += length
        self.evictable += length
        return n

    def insert(self, hashes, lengths, n_blocks: int, now: float) -> tuple[int, int, int]:
        """Insert the first ``n_blocks`` blocks of a chain (``lengths[i]`` tokens each), unlocked.
        Returns (deepest node, tokens covered, tokens newly stored): the caller's own copy of the
        covered tokens is no longer its private KV (new blocks move into the tree; blocks another
        request stored meanwhile are duplicates and are freed, as SGLang's ``insert`` frees them)."""
        node = 0
        covered = 0
        added = 0
        child = self.child
        for i in range(n_blocks):
            key = (node, hashes[i])
            nxt = child.get(key)
            if nxt is None:
                nxt = self._new_node(node, key, lengths[i], now)
                added += lengths[i]
            else:
                self.atime[nxt] = now
            covered += self.length[nxt]
            node = nxt
        if added and node > 0 and self.lock[node] == 0 and self.nchild[node] == 0:
            heapq.heappush(self._heap, (self.atime[node], node))
        return node, covered, added

    def add_leaf(self, parent: int, key, length: int, now: float) -> int:
        """A leaf nothing matches (a finished request's output tokens), unlocked and evictable."""
        n = self._new_node(parent, key, length, now)
        heapq.heappush(self._heap, (now, n))
        return n

    def evict(self, n_tokens: int) -> int:
        """Evict unlocked leaves, least recently used first, until ``n_tokens`` are freed or none is
        left; returns the tokens freed."""
        freed = 0
        heap = self._heap
        lock, nchild, atime, alive = self.lock, self.nchild, self.atime, self.alive
        while freed < n_tokens and heap:
            t, n = heapq.heappop(heap)
            if not alive[n] or lock[n] != 0 or nchild[n] != 0:
                continue
            if atime[n] != t:  # touched since it was queued: requeue at its access time
                heapq.heappush(heap, (atime[n], n))
                continue
            freed += self.length[n]
            p = self.parent[n]
            del self.child[self.key[n]]
            alive[n] = False
            self.total -= self.length[n]
            self.evictable -= self.length[n]
            self._free.append(n)
            nchild[p] -= 1
            if p > 0 and nchild[p] == 0 and lock[p] == 0:
                heapq.heappush(heap, (atime[p], p))
        return freed
