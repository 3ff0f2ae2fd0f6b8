"""The write-ahead log of a live index (``indexer/FORMAT.md``, "Live index"): append-only, checksummed, fsynced.

A record is one acknowledged request (a batch of document operations): ``length u32 | crc32 u32 | payload``,
little-endian, the CRC-32 covering the length and the payload, the payload UTF-8 JSON. ``append`` returns only
after the record is on disk (``fdatasync``): the caller acknowledges the request then. A crash can leave only the
last record torn (records are written in order, each synced before the next starts), so ``read`` stops at the
first record that is short or fails its checksum and ``open`` cuts the file there: a torn request is dropped
whole, never half applied.
"""
from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

HEADER = struct.Struct("<II")
MAX_RECORD = 1 << 30  # a length beyond this is garbage, not a record


class WalError(RuntimeError):
    """The log cannot be written (disk full, I/O error): the request was not acknowledged."""


def fsync_dir(path: str | Path) -> None:
    """Make a rename or a new file in ``path`` durable (the directory entry itself)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode(payload: dict) -> bytes:
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    head = struct.pack("<I", len(body))
    return head + struct.pack("<I", zlib.crc32(head + body)) + body


def read(path: str | Path) -> tuple[list[dict], int]:
    """The complete records of the log, and the byte length they span (a torn tail lies beyond it)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return [], 0
    out, pos = [], 0
    while pos + HEADER.size <= len(data):
        n, crc = HEADER.unpack_from(data, pos)
        end = pos + HEADER.size + n
        if n > MAX_RECORD or end > len(data):
            break
        body = data[pos + HEADER.size:end]
        if zlib.crc32(data[pos:pos + 4] + body) != crc:
            break
        try:
            out.append(json.loads(body.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError):
            break  # a checksum collision on garbage: treated as the torn tail it is
        pos = end
    return out, pos


class WriteAheadLog:
    """One log file, opened for appending after its torn tail (if any) is cut off."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.records, good = read(self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        if os.fstat(self._fd).st_size != good:
            os.ftruncate(self._fd, good)  # the torn tail: never acknowledged, dropped
            os.fsync(self._fd)
        os.lseek(self._fd, good, os.SEEK_SET)
        fsync_dir(self.path.parent)

    def append(self, payload: dict) -> None:
        """Write one record and wait until it is on disk."""
        rec = encode(payload)
        try:
            view = memoryview(rec)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            os.fdatasync(self._fd)
        except OSError as e:
            # A partial record may be in the file: cut it, so later records are not hidden behind it.
            try:
                pos = os.lseek(self._fd, 0, os.SEEK_CUR) - (len(rec) - len(view))
                os.ftruncate(self._fd, pos)
                os.lseek(self._fd, pos, os.SEEK_SET)
            except OSError:
                pass
            raise WalError(f"cannot write the write-ahead log {self.path}: {e}") from e

    def reset(self) -> None:
        """Empty the log (every record is in a durable commit now)."""
        os.ftruncate(self._fd, 0)
        os.lseek(self._fd, 0, os.SEEK_SET)
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
