"""A memory bank of segment embeddings resident on one device: insert, top-k recall by inner product, and
eviction by size (the oldest entry leaves first once ``capacity`` entries are held).

Recall is the kernel library's dense relevancy + selection on the bank's device: ``cpu`` (numpy / BLAS inner
product, ``cpu.selection.topk_rows``), ``gpu`` (torch on a CUDA device, or any torch device given: the chunked
``gpu.ip_topk``), ``fpga-sim`` (the ``attn_topk`` HLS kernel in C simulation, one key a unit: inner products
streamed past an on-chip top-k, only ids and scores back). All are exact with one tie rule: equal scores go to the
lower slot. The FPGA kernel holds at most ``MAX_DIM`` (256) query lanes on chip, so 384-dimensional MiniLM
embeddings do not fit it; asking for that says so.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BACKENDS = ("cpu", "gpu", "fpga-sim")


class MemoryBankError(ValueError):
    """Bad bank settings or input (dimension, capacity, backend)."""


@dataclass
class Recall:
    """One query's recalled entries, best first: the ids given at insert time and their inner products."""

    ids: np.ndarray  # int64
    scores: np.ndarray  # float32


class MemoryBank:
    def __init__(self, dim: int, capacity: int, backend: str = "cpu", device: str | None = None) -> None:
        if dim < 1 or capacity < 1:
            raise MemoryBankError(f"a memory bank needs dim >= 1 and capacity >= 1, got {dim} and {capacity}")
        if backend not in BACKENDS:
            raise MemoryBankError(f"memory backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if backend == "fpga-sim":
            from ragserve.kernels.fpga.attention import MAX_DIM

            if dim > MAX_DIM:
                raise MemoryBankError(f"the fpga-sim memory bank runs the attn_topk kernel, which holds at most "
                                      f"{MAX_DIM} dimensions on chip; these embeddings have {dim} (use cpu or gpu)")
        self.dim, self.capacity, self.backend = dim, capacity, backend
        self.count = 0  # entries ever inserted; slot of entry j is j % capacity
        if backend == "gpu":
            import torch

            dev = torch.device(device or "cuda")
            if dev.type == "cuda" and not torch.cuda.is_available():
                raise MemoryBankError("the gpu memory bank needs a CUDA device; none is usable here")
            self.device = dev
        self.ids = np.zeros(0, dtype=np.int64)
        self.keys = self._alloc(0)

    def _alloc(self, rows: int):
        if self.backend != "gpu":  # host memory (the FPGA host copies it to the card's HBM per launch)
            return np.zeros((rows, self.dim), dtype=np.float32)
        import torch

        # fp16 on a GPU (half the bytes each recall reads); f32 on torch's CPU device
        dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        return torch.zeros((rows, self.dim), dtype=dtype, device=self.device)

    def _reserve(self, rows: int) -> None:
        """Room for ``rows`` slots (at most ``capacity``): storage grows by doubling, so a bank sized for a
        million segments costs only what it holds."""
        rows = min(rows, self.capacity)
        if rows <= self.ids.size:
            return
        size = min(self.capacity, max(rows, 2 * self.ids.size, 1024))
        keys, ids = self._alloc(size), np.full(size, -1, dtype=np.int64)
        keys[:self.ids.size] = self.keys
        ids[:self.ids.size] = self.ids
        self.keys, self.ids = keys, ids

    def __len__(self) -> int:
        return min(self.count, self.capacity)

    def _check(self, v: np.ndarray, what: str) -> np.ndarray:
        v = np.asarray(v, dtype=np.float32)
        v = v[None] if v.ndim == 1 else v
        if v.ndim != 2 or v.shape[1] != self.dim:
            raise MemoryBankError(f"the memory bank holds {self.dim}-dimensional embeddings; {what} have "
                                  f"{v.shape[-1]} dimensions")
        return v

    def insert(self, vectors: np.ndarray, ids) -> list[int]:
        """Store each vector under its id (the order given); returns the ids evicted to make room, oldest first."""
        v = self._check(vectors, "the inserted vectors")
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size != v.shape[0]:
            raise MemoryBankError(f"{v.shape[0]} vectors but {ids.size} ids")
        if v.shape[0] > self.capacity:  # only the last `capacity` would survive their own insert
            evicted = self.insert(v[:-self.capacity], ids[:-self.capacity])
            return evicted + self.insert(v[-self.capacity:], ids[-self.capacity:])
        self._reserve(self.count + v.shape[0])
        slots = (self.count + np.arange(v.shape[0])) % self.capacity
        evicted = [int(i) for i in self.ids[slots] if i >= 0]  # empty slots hold -1
        self.ids[slots] = ids
        if self.backend != "gpu":
            self.keys[slots] = v
        else:
            import torch

            self.keys[torch.from_numpy(slots).to(self.device)] = torch.from_numpy(v).to(self.device, self.keys.dtype)
        self.count += v.shape[0]
        return evicted

    def slots_by_age(self) -> np.ndarray:
        """The slots of the entries held, oldest entry first."""
        n = len(self)
        return (self.count - n + np.arange(n)) % self.capacity

    def remove(self, ids) -> list[int]:
        """Drop the entries held under ``ids``; returns those found, oldest first. The rest move to slots 0..
        in age order, so the bank afterwards (its recall, ties, the next eviction) is the one that inserting the
        remaining entries oldest first into an empty bank builds; ``remove([])`` only does that reordering."""
        n = len(self)
        if n == 0:
            return []
        order = self.slots_by_age()
        gone = np.isin(self.ids[order], np.asarray(ids, dtype=np.int64).reshape(-1))
        keep = order[~gone]
        m = keep.size
        if self.backend != "gpu":
            self.keys[:m] = self.keys[keep]
            self.keys[m:n] = 0
        else:
            import torch

            self.keys[:m] = self.keys[torch.from_numpy(keep).to(self.device)]
            self.keys[m:n] = 0
        removed = [int(i) for i in self.ids[order[gone]]]
        self.ids[:m] = self.ids[keep]
        self.ids[m:n] = -1
        self.count = m
        return removed

    def recall(self, queries: np.ndarray, k: int) -> list[Recall]:
        """Top-k entries of each query by inner product (fewer while the bank holds fewer), best first."""
        q = self._check(queries, "the queries")
        n = len(self)
        if k < 1:
            raise MemoryBankError(f"k must be >= 1, got {k}")
        if n == 0:
            return [Recall(np.zeros(0, np.int64), np.zeros(0, np.float32)) for _ in range(q.shape[0])]
        if self.backend == "cpu":
            from ragserve.kernels.cpu import relevancy, selection

            pos, vals = selection.topk_rows(relevancy.inner_product(q, self.keys[:n]), k)
        elif self.backend == "fpga-sim":
            pos, vals = self._recall_fpga(q, min(k, n), n)
        else:
            import torch

            from ragserve.kernels.gpu.ip_topk import ip_topk

            p, v = ip_topk(torch.from_numpy(q).to(self.device), self.keys[:n], k)
            pos, vals = p.cpu().numpy(), v.cpu().numpy()
        return [Recall(self.ids[pos[i]], vals[i].astype(np.float32)) for i in range(q.shape[0])]

    def _recall_fpga(self, q: np.ndarray, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """One kernel launch per query: one head, one key per unit, units [0, n) offered to the top-k."""
        from ragserve.kernels.fpga.attention import MAX_K, attn_topk

        if k > MAX_K:
            raise MemoryBankError(f"the fpga-sim kernel's top-k holds at most {MAX_K} entries, asked for {k}")
        keys = self.keys[None, :n]
        out = [attn_topk("dots_max", q[i][None, None], keys, 1, 0, n, k) for i in range(q.shape[0])]
        return np.stack([o["ids"][0] for o in out]), np.stack([o["top"][0] for o in out])
