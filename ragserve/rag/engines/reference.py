"""The reference decode engine: any transformers causal LM, one ``DynamicCache`` per slot.

``step`` runs one forward pass per slot, so a row is exactly what that request alone would get (batch-invariant by
construction) but concurrent requests share no weight reads: the fast engines batch the step. Caches hold every
position (no sliding-window layers; the model's masks still apply its windows), so any prefix can be kept.
"""
from __future__ import annotations

import inspect
from typing import Sequence

import torch

from ragserve.rag.decoding import GeneratorError

DEFAULT_MAX_LENGTH = 1 << 20  # a model without max_position_embeddings


class ReferenceEngine:
    prefill_chunk = 0  # a prefill is one forward pass

    def __init__(self, model: torch.nn.Module, device: str, max_slots: int = 32, max_length: int | None = None) -> None:
        from transformers import DynamicCache

        if max_slots < 1:
            raise GeneratorError("max_slots must be >= 1")
        limit = int(getattr(model.config, "max_position_embeddings", 0) or 0) or DEFAULT_MAX_LENGTH
        self.model, self.device = model, device
        self.max_slots = max_slots
        self.max_length = min(max_length, limit) if max_length else limit
        self._cache_cls = DynamicCache
        self._caches: dict[int, object] = {}
        # Only the last position's logits are needed: a prefill then skips the [tokens, vocab] LM-head product.
        self._keep_last = "logits_to_keep" in inspect.signature(model.forward).parameters

    def open(self) -> int:
        slot = next((s for s in range(self.max_slots) if s not in self._caches), None)
        if slot is None:
            raise GeneratorError(f"all {self.max_slots} decode slots are in use")
        self._caches[slot] = self._cache_cls()
        return slot

    def _forward(self, slot: int, ids: Sequence[int]) -> torch.Tensor:
        cache = self._caches[slot]
        if not ids:
            raise GeneratorError("nothing to prefill")
        if cache.get_seq_length() + len(ids) > self.max_length:
            raise GeneratorError(f"slot {slot} would exceed the model's {self.max_length} positions")
        kw = {"logits_to_keep": 1} if self._keep_last else {}
        out = self.model(input_ids=torch.tensor([list(ids)], device=self.device), past_key_values=cache,
                         use_cache=True, **kw)
        return out.logits[0, -1].float()

    def warm(self) -> None:
        pass  # transformers' eager forward: nothing to compile

    @torch.inference_mode()
    def prefill(self, slot: int, ids: Sequence[int], logits: bool = True) -> torch.Tensor | None:
        row = self._forward(slot, ids)
        return row if logits else None

    def reusable(self, slot: int, ids: Sequence[int]) -> int:
        return 0  # no cache of other prompts' prefixes

    @torch.inference_mode()
    def step(self, slots: Sequence[int], ids: Sequence[int]) -> torch.Tensor:
        if len(slots) != len(ids):
            raise GeneratorError("step needs one token per slot")
        return torch.stack([self._forward(s, [t]) for s, t in zip(slots, ids)])

    def length(self, slot: int) -> int:
        return self._caches[slot].get_seq_length()

    def truncate(self, slot: int, length: int) -> None:
        drop = self.length(slot) - length
        if length < 0 or drop < 0:
            raise GeneratorError(f"cannot truncate slot {slot} of {self.length(slot)} positions to {length}")
        if drop:
            self._caches[slot].crop(-drop)

    def close(self, slot: int) -> None:
        self._caches.pop(slot, None)
