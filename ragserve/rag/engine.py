"""The decode-engine contract: one causal LM's decode state for many requests at once.

Each request holds a slot (its own KV cache). ``step`` advances several slots by one token in one forward pass, so
concurrent answers share the weight reads; a row's logits never depend on which other slots share the step
(batch-invariant), so an answer is the same token for token whatever else is decoding. Implementations: the
reference over any transformers model, and fast ones per architecture, chosen by ``engine_for``.

A prefill may run in chunks of ``prefill_chunk`` positions aligned to multiples of it (0: whole, in one pass). The
chunks are the same whichever call feeds them, so a prompt prefilled in several calls that end on chunk boundaries,
or from a cached prefix that ends on one, gets the same bits as one call over the whole prompt.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch


@dataclass(frozen=True)
class PrefillSettings:
    """How an engine prefills. ``chunk``: positions computed in one pass, aligned to multiples of it (the unit
    of the prefix cache; small enough to interleave with decode steps, large enough for efficient matmuls).
    ``prefix_cache_bytes``: KV of whole prompt chunks kept for later prompts that start with the same tokens
    (least recently used dropped first; 0: no cache)."""
    chunk: int = 64
    prefix_cache_bytes: int = 128 << 20


@dataclass(frozen=True)
class StepSettings:
    """How an engine runs its static decode step (the one a CUDA graph replays). ``compile``: wrap it in
    ``torch.compile`` (one fused kernel where eager torch launches several: a norm, a rotary, a softmax with its
    mask): ``auto`` on CUDA when Triton imports, off elsewhere; ``on``; ``off``. A step that fails to compile
    runs eagerly (one logged line). ``backend`` and ``mode``: ``torch.compile``'s (inductor's default mode, not
    ``reduce-overhead``: the engine captures its own graph of the compiled step).

    ``shapes``: ``bucketed`` (the default) runs the step over the slots up to the highest one stepping and the
    cache columns up to the longest, each rounded up to a power of two (columns from ``span``), one graph a
    bucket: a step reads the weights and about the live KV, not every slot's whole cache. ``fixed`` always runs
    every slot over every column (``max_slots`` x ``max_length`` of KV a step): one graph, and a row's bits never
    depend on what steps beside it; bucketed, the matmuls' shapes follow the bucket, so a row's last bits may."""
    compile: str = "auto"
    backend: str | Callable = "inductor"
    mode: str | None = None
    shapes: str = "bucketed"
    span: int = 256


def engine_options(step_compile: str = "auto", step_shapes: str = "bucketed") -> dict | None:
    """A fast engine's options from the command line's ``--step-compile`` and ``--step-shapes``: None for the
    defaults (an engine without options, such as the reference one, takes none)."""
    if (step_compile, step_shapes) == ("auto", "bucketed"):
        return None
    return {"step": StepSettings(compile=step_compile, shapes=step_shapes)}


class DecodeEngine(Protocol):
    max_slots: int  # slots open at once
    max_length: int  # positions a slot's cache holds
    prefill_chunk: int  # a prefill's chunks are aligned to multiples of this (0: one pass)

    def warm(self) -> None:
        """Compile what the decode steps will run (a no-op for an engine that compiles nothing), so that no
        request waits for it: the generator calls it once it is built."""

    def open(self) -> int:
        """A free slot with an empty cache (raises ``GeneratorError`` when all are taken)."""

    def prefill(self, slot: int, ids: Sequence[int], logits: bool = True) -> torch.Tensor | None:
        """Append ``ids`` to the slot's cache; the fp32 logits after the last of them, shape [vocab] (None when
        ``logits`` is false: a part of a prompt whose logits nobody reads)."""

    def reusable(self, slot: int, ids: Sequence[int]) -> int:
        """How many leading ``ids`` a prefill appending them to the slot would copy from a cache of earlier
        prompts' prefixes rather than compute (0 for an engine without one)."""

    def step(self, slots: Sequence[int], ids: Sequence[int]) -> torch.Tensor:
        """One token for each slot in one forward pass: fp32 logits, shape [len(slots), vocab]."""

    def length(self, slot: int) -> int:
        """Positions cached in the slot."""

    def truncate(self, slot: int, length: int) -> None:
        """Drop the cached positions from ``length`` on (a prompt prefix reused across retrieval rounds)."""

    def close(self, slot: int) -> None:
        """Free the slot."""
