"""The methods: dense (the reference), DSA's indexer, Quest's and LServe's pages, SeerAttention-R's block gate.

Each differs only in its index (prepare) and its unit scores (relevancy); retrieval (sink + local + top-k units)
and apply (attention over the selected tokens) are ``Method``'s.
"""
from __future__ import annotations

import math
from typing import Any, Protocol

from ragserve.attention.base import Method
from ragserve.attention.common import Index, Relevancy, Selection


def grouped(q, groups: int):
    """q [B, Hq, D] -> [B, G, g, D]: the query heads of each KV group (GQA keeps a group's heads adjacent)."""
    b, hq, d = q.shape
    return q.reshape(b, groups, hq // groups, d)


class Dense(Method):
    """Every token: PyTorch SDPA on torch arrays, the same softmax in numpy on the CPU."""

    name = "dense"
    sparse = False

    def relevancy(self, index: Index, q, keys, key_valid=None) -> Relevancy:
        # Nothing to score: every token is selected.
        return Relevancy(None, top=self.ops(q).everything(q.shape[0], keys.shape[-2], getattr(q, "device", None)))

    def retrieval(self, rel: Relevancy, n: int) -> Selection:
        return rel.top

    def apply(self, q, keys, values, sel: Selection, scale: float, key_valid=None):
        return self.ops(q).attend_dense(q, keys, values, scale, key_valid)


class Indexer(Protocol):
    """DSA's lightning indexer: index keys per token (a cache of its own) and index queries with head weights.

    ``index_keys``: keys [B, G, N, D] -> [B, Gi, N, dI]; ``index_queries``: q [B, Hq, D] -> ([B, Gi, hI, dI],
    weights [B, Gi, hI]). Gi = 1 shares one selection among all KV groups (DeepSeek's MLA), Gi = G selects per group.
    A trained indexer projects the layer's hidden states; one that projects its keys and queries plugs in here.
    """

    def index_keys(self, ops, keys) -> Any: ...

    def index_queries(self, ops, q, groups: int) -> tuple[Any, Any]: ...


class OwnKeysIndexer:
    """No trained indexer ships with these models: each KV group's own keys are its index keys and the group's
    query heads its index heads, weighted equally, so I(t, s) = (1/g) sum_h ReLU(q_h . k_s)."""

    def index_keys(self, ops, keys):
        return ops.copy(keys)

    def index_queries(self, ops, q, groups: int):
        qg = grouped(q, groups)
        return qg, ops.full_like(qg[..., 0], 1.0 / qg.shape[2])


class Dsa(Method):
    """DeepSeek Sparse Attention: top-k tokens by the indexer's score, shared by the query heads of a group."""

    name = "dsa"

    def __init__(self, config=None, ops=None, indexer: Indexer | None = None, **options) -> None:
        super().__init__(config, ops, **options)
        self.indexer = indexer or OwnKeysIndexer()

    def build(self, ops, keys, u0: int) -> dict[str, Any]:
        return {"keys": self.indexer.index_keys(ops, keys[..., u0:, :])}

    def relevancy(self, index: Index, q, keys, key_valid=None) -> Relevancy:
        ops = self.ops(q)
        qi, w = self.indexer.index_queries(ops, q, keys.shape[1])
        return ops.relevancy("dots_wrelu", self.plan(index.n), q=qi, w=w, keys=index.arrays["keys"],
                                     key_valid=key_valid)


class Quest(Method):
    """Quest: pages with elementwise min and max keys; a page's score is the largest bound over the group's heads."""

    name = "quest"

    @property
    def unit(self) -> int:
        return self.config.page_size

    def build(self, ops, keys, u0: int) -> dict[str, Any]:
        lo, hi = ops.unit_minmax(keys, self.unit, u0)
        return {"lo": lo, "hi": hi}

    def relevancy(self, index: Index, q, keys, key_valid=None) -> Relevancy:
        return self.ops(q).relevancy("bounds_max", self.plan(index.n), q=grouped(q, keys.shape[1]),
                                     lo=index.arrays["lo"], hi=index.arrays["hi"])


class LServe(Method):
    """LServe's page selection as the issue defines it: a page's score is the largest exact ``q . k`` over its
    tokens and the group's heads (no index: the max reduction reads every key)."""

    name = "lserve"

    @property
    def unit(self) -> int:
        return self.config.page_size

    def relevancy(self, index: Index, q, keys, key_valid=None) -> Relevancy:
        return self.ops(q).relevancy("dots_max", self.plan(index.n), q=grouped(q, keys.shape[1]), keys=keys,
                                     unit=self.unit, key_valid=key_valid)


class Gate(Protocol):
    """SeerAttention-R's block gate: pooled keys per block (prepare) and block scores (relevancy). A trained gate
    (its K and Q projections over pooled keys) implements the same two calls."""

    def pool(self, ops, keys, block: int, u0: int) -> dict[str, Any]: ...

    def relevancy(self, ops, index: Index, q, plan: tuple[int, int, int]) -> Relevancy: ...


class PooledGate:
    """No trained gate weights exist here: the gate score of a block is the largest over the group's heads of
    ``q . mean(keys of the block)``, and its probability the softmax of those over the blocks (scaled 1/sqrt(D))."""

    def pool(self, ops, keys, block: int, u0: int) -> dict[str, Any]:
        return {"pooled": ops.unit_mean(keys, block, u0)}

    def relevancy(self, ops, index: Index, q, plan: tuple[int, int, int]) -> Relevancy:
        pooled = index.arrays["pooled"]
        rel = ops.relevancy("dots_max", plan, q=grouped(q, pooled.shape[1]), keys=pooled, unit=1)
        rel.scale = 1.0 / math.sqrt(q.shape[-1])
        return rel


class SeerTopK(Method):
    """SeerAttention-R, top-k mode: the best blocks by gate score."""

    name = "seer-topk"

    def __init__(self, config=None, ops=None, gate: Gate | None = None, **options) -> None:
        super().__init__(config, ops, **options)
        self.gate = gate or PooledGate()

    @property
    def unit(self) -> int:
        return self.config.block_size

    def build(self, ops, keys, u0: int) -> dict[str, Any]:
        return self.gate.pool(ops, keys, self.unit, u0)

    def relevancy(self, index: Index, q, keys, key_valid=None) -> Relevancy:
        return self.gate.relevancy(self.ops(q), index, q, self.plan(index.n))


class SeerThreshold(SeerTopK):
    """SeerAttention-R, threshold mode: every block whose gate probability reaches ``threshold``, best first up to
    the budget (the cap); threshold 0 keeps the budget's best blocks, as top-k mode does."""

    name = "seer-threshold"

    def keep(self, ops, rel: Relevancy, top):
        return ops.take(ops.gate_probs(rel.scores, rel.scale), top) >= self.config.threshold
