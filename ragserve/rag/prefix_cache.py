"""KV of prompt prefixes kept across requests (automatic prefix caching): every prompt of a RAG method starts with
the same instruction and exemplars, so their KV is computed once and later prompts start from a copy of it.

The unit is a whole prefill chunk: an entry is the KV of positions ``[k*C, (k+1)*C)``, keyed by the chunk's tokens
under the entry of the chunk before it (a trie: an entry stands for every token from position 0 to its end, compared
exactly, no hashes). A prompt finds the longest run of stored chunks it starts with. Because an engine computes the
same aligned chunks whether or not a prefix was cached, a copied chunk holds the very bits the prompt's own prefill
would have written. Entries are dropped least recently used first, leaves before the chunks they extend, once
their bytes pass the limit.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence


class _Entry:
    __slots__ = ("parent", "key", "kv", "nbytes", "children")

    def __init__(self, parent: "_Entry | None", key: tuple, kv: object, nbytes: int) -> None:
        self.parent, self.key, self.kv, self.nbytes = parent, key, kv, nbytes
        self.children: dict[tuple, _Entry] = {}


class PrefixCache:
    """``chunk``: positions an entry covers; ``max_bytes``: the entries' bytes kept at most. ``kv`` values are
    the engine's own (opaque here)."""

    def __init__(self, chunk: int, max_bytes: int) -> None:
        if chunk < 1 or max_bytes < 0:
            raise ValueError("chunk must be >= 1 and max_bytes >= 0")
        self.chunk, self.max_bytes = chunk, max_bytes
        self._root = _Entry(None, (), None, 0)
        self._lru: OrderedDict[int, _Entry] = OrderedDict()  # id(entry) -> entry, least recently used first
        self.nbytes = 0
        self.hits = 0  # chunks handed out
        self.stored = 0  # chunks stored
        self._lock = threading.Lock()  # prompts prefilled at once (the batcher's lanes) share the cache

    def clear(self) -> None:
        """Drop every entry (the counters stay)."""
        with self._lock:
            self._root.children.clear()
            self._lru.clear()
            self.nbytes = 0

    def __len__(self) -> int:
        return len(self._lru)

    def _walk(self, tokens: Sequence[int], chunks: int) -> list[_Entry]:
        """The entries of the first ``chunks`` chunks of ``tokens``, as far as they are stored."""
        c, node, path = self.chunk, self._root, []
        for k in range(chunks):
            node = node.children.get(tuple(tokens[k * c:(k + 1) * c]))
            if node is None:
                break
            path.append(node)
        return path

    def covered(self, tokens: Sequence[int], start: int, end: int) -> int:
        """Positions from ``start`` on that ``lookup(tokens, start, end)`` would hand out (nothing is touched)."""
        if start % self.chunk:
            return 0
        with self._lock:
            return max(0, len(self._walk(tokens, end // self.chunk)) * self.chunk - start)

    def lookup(self, tokens: Sequence[int], start: int, end: int) -> list:
        """KV of the stored chunks covering ``tokens[start:]`` from ``start`` (a chunk boundary) on, each ending at
        or before ``end``, in order; empty when the run does not reach ``start``."""
        if start % self.chunk:
            return []
        with self._lock:
            path = self._walk(tokens, end // self.chunk)
            first = start // self.chunk
            if len(path) <= first:
                return []
            for e in path:  # the chunks before ``start`` are used too: they stay as long as their extensions
                self._lru.move_to_end(id(e))
            self.hits += len(path) - first
            return [e.kv for e in path[first:]]

    def store(self, tokens: Sequence[int], index: int, kv: object, nbytes: int) -> bool:
        """Keep ``kv``, the KV of chunk ``index`` of ``tokens`` (its tokens: ``tokens[index*C:(index+1)*C]``),
        when the chunks before it are stored; whether it was."""
        c = self.chunk
        if nbytes > self.max_bytes or len(tokens) < (index + 1) * c:
            return False
        with self._lock:
            return self._store(tokens, index, kv, nbytes)

    def _store(self, tokens: Sequence[int], index: int, kv: object, nbytes: int) -> bool:
        c = self.chunk
        path = self._walk(tokens, index)
        if len(path) < index:
            return False
        parent = path[-1] if path else self._root
        key = tuple(tokens[index * c:(index + 1) * c])
        if key in parent.children:
            self._lru.move_to_end(id(parent.children[key]))
            return False
        for e in path:
            self._lru.move_to_end(id(e))
        self._evict(self.max_bytes - nbytes, keep=set(map(id, path)))
        if self.nbytes + nbytes > self.max_bytes:
            return False
        entry = _Entry(parent, key, kv, nbytes)
        parent.children[key] = entry
        self._lru[id(entry)] = entry
        self.nbytes += nbytes
        self.stored += 1
        return True

    def _evict(self, budget: int, keep: set[int]) -> None:
        """Drop least recently used leaves (never those in ``keep``) until the bytes fit ``budget``."""
        while self.nbytes > budget:
            victim = next((e for e in self._lru.values() if not e.children and id(e) not in keep), None)
            if victim is None:
                return
            del victim.parent.children[victim.key]
            del self._lru[id(victim)]
            self.nbytes -= victim.nbytes
