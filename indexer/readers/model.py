"""Data types of the corpus readers and the per-file error policy (``on_error``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# Only the first errors are kept (with file and line); all are counted.
MAX_ERRORS = 100

ON_ERROR = ("skip", "fail")


class CorpusError(ValueError):
    """Bad corpus input: a malformed record under ``on_error="fail"``, or a file that cannot be read at all."""


class MalformedRecord(Exception):
    """Raised by record parsers; the caller turns it into a skip or a CorpusError with file and line."""


@dataclass
class Document:
    id: str
    title: str
    text: str


@dataclass
class ReadError:
    file: str
    line: int  # 1-based line (for Parquet/Arrow: row) where the bad record starts; 0 if the file as a whole
    message: str


@dataclass
class ReadStats:
    """Counters updated while documents are read; shared across all input files of one call."""

    records: int = 0  # well-formed input records read (lines, rows, pages), including filtered ones
    skipped: int = 0  # malformed records skipped under on_error="skip"
    filtered: int = 0  # well-formed records deliberately not indexed: redirects, non-article pages, empty articles
    documents: int = 0  # Documents yielded (each passage counts one)
    invalid_utf8: int = 0  # invalid UTF-8 bytes replaced by U+FFFD
    error_count: int = 0  # all errors, including those beyond the MAX_ERRORS kept in `errors`
    errors: list[ReadError] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)  # inputs whose compressed stream ended early ("skip")
    bytes_read: int = 0  # on-disk (compressed) bytes consumed so far, for progress
    bytes_total: int = 0  # on-disk size of all inputs

    def add_error(self, error: ReadError) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(error)


class ReadContext:
    """One input file being read: its path, the shared stats and what to do with a bad record."""

    def __init__(self, path: Path, stats: ReadStats, on_error: str, unit: str = "line") -> None:
        self.path = path
        self.stats = stats
        self.on_error = on_error
        self.unit = unit  # how positions are named in messages: "line" or "row"
        self.truncated = False

    def malformed(self, line: int, message: str) -> None:
        """A bad record: raise under "fail", else count it and let the reader go on."""
        if self.on_error == "fail":
            raise CorpusError(f"{self.path}:{line}: malformed record ({self.unit} {line}): {message}")
        self.stats.skipped += 1
        self.stats.add_error(ReadError(str(self.path), line, message))

    def stream_truncated(self, line: int, what: str) -> None:
        """The compressed stream ended before its end marker. Everything decoded before the cut was already
        yielded; the partial record at the cut is lost, so this is never silent: it raises under "fail" and is
        recorded (errors + ``truncated``) under "skip"."""
        self.truncated = True
        message = f"{what} stream ends before its end-of-stream marker (truncated file?) at line {line}"
        if self.on_error == "fail":  # nothing read is kept: the caller stops here
            raise CorpusError(f"{self.path}:{line}: {message}")
        message += f"; records before line {line} were read, the rest of the file is lost"
        self.stats.truncated.append(str(self.path))
        self.stats.add_error(ReadError(str(self.path), line, message))

    def fatal(self, message: str, line: int = 0) -> CorpusError:
        """A file-level problem, fatal under both policies."""
        where = f"{self.path}:{line}" if line else f"{self.path}"
        return CorpusError(f"{where}: {message}")
