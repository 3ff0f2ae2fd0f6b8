"""What a build is told: ``BuildOptions``, the one settings object every stage of a build reads, and
``BuildError``, what any stage raises when the build cannot proceed."""
from __future__ import annotations

from dataclasses import dataclass, field

from indexer import layout as L
from indexer.analyzer import AnalyzerConfig


class BuildError(ValueError):
    """The build cannot proceed (bad parameters, output exists, no documents)."""


@dataclass
class BuildOptions:
    block_size: int = L.DEFAULT_BLOCK_SIZE
    bank_bytes: int = L.DEFAULT_BANK_BYTES
    k1: float = 0.9
    b: float = 0.4
    workers: int = 0  # 0: one per core
    run_postings: int = 32_000_000  # postings buffered in memory before a run is flushed (~300 MB)
    fine_block: int = L.DEFAULT_FINE_BLOCK  # postings per fine block (the CPU's block-max bounds)
    overwrite: bool = False
    progress: bool = True
    analyzer: AnalyzerConfig = field(default_factory=AnalyzerConfig)
