"""The radix (prefix) cache of one SGLang replica, at the trace's block granularity.

Modelled on ``sglang/srt/mem_cache/radix_cache.py``: a path-compressed tree whose nodes hold runs of
KV tokens, split where two prompts diverge (``_split_node``; the new upper node inherits the lock
count); a request locks the deepest node it uses (``inc_lock_ref`` walks to the root, moving the path
from evictable to protected); ``evictable`` counts the tokens of unlocked nodes, and the scheduler
treats them as free (``available_size() + evictable_size()``); eviction removes whole unlocked leaf
nodes, least recently used first (``last_access_time``, refreshed for every node a match walks
through), and a parent left childless and unlocked becomes a candidate in turn.

What differs: SGLang's edges are token ids; here they are the trace's block hashes (Mooncake
``hash_ids``, 512 tokens a block; only the last block of a prompt may be shorter), so a match ends on
a block boundary. A shared block is stored once, as in SGLang. A finished request's output tokens are
one leaf that nothing matches (a later turn's prompt carries its own block hashes).
"""

from __future__ import annotations

import heapq


class BlockRadixCache:
    """Path-compressed block radix tree with lock counts and LRU eviction of unlocked leaves. Node 0
    is the root (holds nothing, never evicted). ``block_size``: tokens of a full block (an edge's
    blocks are full but for its last). Token counts: ``total`` (all nodes), ``evictable`` (nodes
    no request locks)."""

    def __init__(self, block_size: int = 1) -> None:
        self.block = block_size
        self.parent: list[int] = [-1]
        self.key: list[list] = [[]]
        self.tokens: list[int] = [0]
        self.lock: list[int] = [1]
        self.atime: list[float] = [0.0]
        self.children: list[dict] = [{}]
        self.alive: list[bool] = [True]
        self._free: list[int] = []
        self._heap: list[tuple[float, int]] = []
        self.total = 0
        self.evictable = 0

    # -- nodes -----------------------------------------------------------------------------------

    def _new(self, parent: int, key: list, tokens: int, lock: int, now: float) -> int:
        if self._free:
            n = self._free.pop()
            self.parent[n] = parent
            self.key[n] = key
            self.tokens[n] = tokens
            self.lock[n] = lock
            self.atime[n] = now
            self.children[n] = {}
            self.alive[n] = True
        else:
            n = len(self.parent)
            self.parent.append(parent)
            self.key.append(key)
            self.tokens.append(tokens)
            self.lock.append(lock)
            self.atime.append(now)
            self.children.append({})
            self.alive.append(True)
        return n

    def _split(self, c: int, m: int) -> int:
        """Cut node c after its first m blocks: a new node takes them (and c's place under its
        parent), c keeps the rest below it. Returns the new upper node."""
        key = self.key[c]
        upper_tokens = m * self.block
        p = self._new(self.parent[c], key[:m], upper_tokens, self.lock[c], self.atime[c])
        self.children[self.parent[c]][key[0]] = p
        rest = key[m:]
        self.children[p][rest[0]] = c
        self.parent[c] = p
        self.key[c] = rest
        self.tokens[c] -= upper_tokens
        return p

    @staticmethod
    def _common(a: list, i: int, b: list, end: int) -> int:
        """Blocks a[i:end] and b have in common from their start."""
        m = 0
        top = min(len(b), end - i)
        while m < top and a[i + m] == b[m]:
            m += 1
        return m

    # -- queries ---------------------------------------------------------------------------------

    def match(self, hashes: list, now: float) -> tuple[int, int]:
        """Longest cached prefix of ``hashes``: (deepest node, tokens). Splits a node the match ends
        inside and refreshes the access time of every matched node, as SGLang's ``match_prefix``."""
        node, i, tokens, n = 0, 0, 0, len(hashes)
        children, keys, atime = self.children, self.key, self.atime
        while i < n:
            c = children[node].get(hashes[i])
            if c is None:
                break
            key = keys[c]
            size = len(key)
            if hashes[i : i + size] == key:
                i += size
                tokens += self.tokens[c]
                atime[c] = now
                node = c
                continue
            m = self._common(hashes, i, key, n)
            p = self._split(c, m)
            atime[p] = now
            tokens += self.tokens[p]
            node = p
            break
        return node, tokens

    # -- locks -----------------------------------------------------------------------------------

    def inc_lock(self, node: int) -> int:
        """Lock the path root..node; returns the tokens that stopped being evictable."""
        moved = 0
        lock, tokens, parent = self.lock, self.tokens, self.parent
        while node > 0:
            if lock[node] == 0:
                moved += tokens[node]
            lock[node] += 1
            node = parent[node]
        self.evictable -= moved
        return moved

    def dec_lock(self, node: int, now: float) -> int:
        """Unlock the path root..node; returns the tokens that became evictable."""
        moved = 0
        lock, tokens, parent, children = self.lock, self.tokens, self.parent, self.children
        while node > 0:
            lock[node] -= 1
            if lock[node] == 0:
                moved += tokens[node]
                if not children[node]:
                    heapq.heappush(self._heap, (self.atime[node], node))
            node = parent[node]
        self.evictable += moved
        return moved

    # -- insert / evict --------------------------------------------------------------------------

    def insert(self, hashes: list, cum: list, n_blocks: int, now: float) -> tuple[int, int, int]:
        """Insert the first ``n_blocks`` blocks of a chain, unlocked (``cum[i]``: tokens of its first
        i blocks). Returns (deepest node, tokens covered, tokens newly stored): the caller's own copy
        of the covered tokens stops being its private KV (new blocks move into the tree; blocks another
        request stored meanwhile are duplicates, freed as SGLang's ``insert`` frees them)."""
        node, i = 0, 0
        children, keys, atime = self.children, self.key, self.atime
        while i < n_blocks:
            c = children[node].get(hashes[i])
            if c is None:
                break
            key = keys[c]
            size = len(key)
            if i + size <= n_blocks and hashes[i : i + size] == key:
                i += size
                atime[c] = now
                node = c
                continue
            m = self._common(hashes, i, key, n_blocks)
            node = self._split(c, m)
            atime[node] = now
            i += m
        added = 0
        if i < n_blocks:
            added = cum[n_blocks] - cum[i]
            leaf = self._new(node, hashes[i:n_blocks], added, 0, now)
            children[node][hashes[i]] = leaf
            self.total += added
            self.evictable += added
            heapq.heappush(self._heap, (now, leaf))
            node = leaf
        return node, cum[n_blocks], added

    def add_leaf(self, parent: int, key, tokens: int, now: float) -> int:
        """A leaf nothing matches (a finished request's output tokens), unlocked and evictable."""
        n = self._new(parent, [key], tokens, 0, now)
        self.children[parent][key] = n
        self.total += tokens
        self.evictable += tokens
        heapq.heappush(self._heap, (now, n))
        return n

    def evict(self, n_tokens: int) -> int:
        """Evict unlocked leaves, least recently used first, until ``n_tokens`` are freed or none is
        left; returns the tokens freed."""
        freed = 0
        heap = self._heap
        lock, children, atime, alive = self.lock, self.children, self.atime, self.alive
        while freed < n_tokens and heap:
            t, n = heapq.heappop(heap)
            if not alive[n] or lock[n] != 0 or children[n]:
                continue
            if atime[n] != t:  # touched since it was queued: requeue at its access time
                heapq.heappush(heap, (atime[n], n))
                continue
            size = self.tokens[n]
            freed += size
            p = self.parent[n]
            del children[p][self.key[n][0]]
            alive[n] = False
            self.total -= size
            self.evictable -= size
            self._free.append(n)
            if p > 0 and not children[p] and lock[p] == 0:
                heapq.heappush(heap, (atime[p], p))
        return freed
