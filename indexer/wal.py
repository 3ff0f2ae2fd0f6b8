"""An append-only log of checksummed records: each record is on disk (fsynced) before ``append`` returns, and
reading the log back stops at a torn tail, which is cut off, never half applied.

Layout: an 8-byte file header (``MAGIC``), then records of ``<u32 payload length><u32 CRC-32 of the payload>``
followed by the payload. A crash can leave only the last record incomplete (appends are sequential and each is
fsynced before the next starts), so the first record whose header is short, whose length runs past the end of
the file or whose checksum fails is the torn tail: it and everything after it are dropped when the log is read,
and the file is truncated there before the next append. A record was acknowledged only after its fsync, so a
torn record was never acknowledged. ``rewrite`` replaces the whole log atomically (a compacted copy written
beside it, fsynced and renamed over it).
"""
from __future__ import annotations

import os
import struct
import threading
import zlib
from pathlib import Path
from typing import Iterable, Iterator

MAGIC = b"RSWAL1\n\0"
HEADER = struct.Struct("<II")
MAX_RECORD = 1 << 30  # a length above this is garbage, not a record


class LogError(OSError):
    """The log cannot be used: not a log file, or an append that failed and could not be undone."""


def fsync_dir(path: str | Path) -> None:
    """Make a file's creation, rename or removal in ``path`` durable (the directory entry, not the data)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync(fd: int) -> None:
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


def _record(payload: bytes) -> bytes:
    if len(payload) > MAX_RECORD:
        raise ValueError(f"a log record holds at most {MAX_RECORD} bytes, got {len(payload)}")
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def _scan(path: Path) -> Iterator[tuple[bytes, int]]:
    """(payload, offset after it) of each whole record, up to the torn tail if there is one."""
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise LogError(f"{path} is not a ragserve log (bad file header)")
        pos = len(MAGIC)
        while True:
            head = f.read(HEADER.size)
            if len(head) < HEADER.size:
                return
            length, crc = HEADER.unpack(head)
            if length > MAX_RECORD:
                return
            payload = f.read(length)
            if len(payload) < length or zlib.crc32(payload) != crc:
                return
            pos += HEADER.size + length
            yield payload, pos


def read_records(path: str | Path) -> Iterator[bytes]:
    """The whole records of a log file, read-only (a torn tail is skipped, not cut off)."""
    for payload, _ in _scan(Path(path)):
        yield payload


class AppendLog:
    """One log file. ``replay()`` reads its records (once, first); then ``append`` adds more. Not for two
    processes at once: the caller holds a lock on the directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.dropped_bytes = 0  # the torn tail cut off when the log was read
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0  # bytes of whole records (and the header): where the next append goes
        self._broken = False
        # a new log or a rewrite that crashed before its rename: never the live log
        self._tmp.unlink(missing_ok=True)
        if not self.path.exists():
            self._write_whole([])

    @property
    def _tmp(self) -> Path:
        return self.path.with_name(self.path.name + ".new")

    def _write_whole(self, payloads: Iterable[bytes]) -> None:
        """The log file with these records, atomically (written beside it, fsynced, renamed over it)."""
        tmp = self._tmp
        try:
            with open(tmp, "wb") as f:
                f.write(MAGIC)
                for p in payloads:
                    f.write(_record(p))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(self.path.parent)

    def replay(self) -> Iterator[bytes]:
        """Each whole record's payload in order; when exhausted, a torn tail has been cut off and the log is
        open for appends."""
        if self._fd is not None:
            raise LogError(f"{self.path} has been read already")
        good = len(MAGIC)
        for payload, good in _scan(self.path):
            yield payload
        self._open_for_append(good, self.path.stat().st_size)

    def _open_for_append(self, good: int, end: int) -> None:
        fd = os.open(self.path, os.O_WRONLY)
        if end > good:  # the torn tail: cut it off now, so the next record follows the last whole one
            os.ftruncate(fd, good)
            _sync(fd)
        self.dropped_bytes = end - good
        self._fd, self._size = fd, good

    def append(self, payload: bytes) -> None:
        """Write one record and fsync it: once this returns, the record survives a crash. A failed write is
        undone (the file cut back), so it never leaves half a record for later ones to follow."""
        rec = _record(payload)
        with self._lock:
            if self._broken:
                raise LogError(f"{self.path}: an earlier write failed and could not be undone; reopen the log")
            if self._fd is None:
                raise LogError(f"{self.path}: read the log (replay) before appending, and not after close")
            try:
                os.lseek(self._fd, self._size, os.SEEK_SET)
                view = memoryview(rec)
                while view:
                    view = view[os.write(self._fd, view):]
                _sync(self._fd)
            except BaseException:
                try:
                    os.ftruncate(self._fd, self._size)
                    _sync(self._fd)
                except OSError:
                    self._broken = True  # the state on disk is unknown: refuse more appends (a replay cuts it)
                raise
            self._size += len(rec)

    @property
    def size(self) -> int:
        return self._size

    def rewrite(self, payloads: Iterable[bytes]) -> None:
        """Replace the log with these records, atomically: a crash leaves either the old log or the new one."""
        with self._lock:
            if self._fd is None:
                raise LogError(f"{self.path}: read the log (replay) before rewriting it")
            self._write_whole(payloads)
            os.close(self._fd)
            self._fd = os.open(self.path, os.O_WRONLY)
            self._size = os.fstat(self._fd).st_size

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
