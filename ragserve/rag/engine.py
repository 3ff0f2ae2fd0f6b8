"""The decode-engine contract: one causal LM's decode state for many requests at once.

Each request holds a slot (its own KV cache). ``step`` advances several slots by one token in one forward pass, so
concurrent answers share the weight reads; a row's logits never depend on which other slots share the step
(batch-invariant), so an answer is the same token for token whatever else is decoding. Implementations: the
reference over any transformers model, and fast ones per architecture, chosen by ``engine_for``.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import torch


class DecodeEngine(Protocol):
    max_slots: int  # slots open at once
    max_length: int  # positions a slot's cache holds

    def open(self) -> int:
        """A free slot with an empty cache (raises ``GeneratorError`` when all are taken)."""

    def prefill(self, slot: int, ids: Sequence[int]) -> torch.Tensor:
        """Append ``ids`` to the slot's cache; the fp32 logits after the last of them, shape [vocab]."""

    def step(self, slots: Sequence[int], ids: Sequence[int]) -> torch.Tensor:
        """One token for each slot in one forward pass: fp32 logits, shape [len(slots), vocab]."""

    def length(self, slot: int) -> int:
        """Positions cached in the slot."""

    def truncate(self, slot: int, length: int) -> None:
        """Drop the cached positions from ``length`` on (a prompt prefix reused across retrieval rounds)."""

    def close(self, slot: int) -> None:
        """Free the slot."""
