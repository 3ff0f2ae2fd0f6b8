"""Opening corpus files: gzip/bzip2 decompression chosen by magic bytes, accounting of the on-disk bytes
consumed (progress), and UTF-8 decoding that replaces and counts invalid bytes instead of failing."""
from __future__ import annotations

import bz2
import codecs
import gzip
import io
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from indexer.readers.model import CorpusError, ReadContext, ReadStats

_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2"}
_UNSUPPORTED_MAGIC = {b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd", b"PK\x03\x04": "zip"}
_READ_BUFFER = 1 << 20
SNIFF_BYTES = 64 << 10

# Errors a decompressor raises for corrupt (not merely truncated) data.
_CORRUPT = (OSError, zlib.error)


def compression_of(path: Path) -> str | None:
    """"gzip", "bzip2" or None (plain), from the file's first bytes; other compressors are refused."""
    with open(path, "rb") as f:
        head = f.read(8)
    for magic, name in _MAGIC.items():
        if head.startswith(magic):
            return name
    for magic, name in _UNSUPPORTED_MAGIC.items():
        if head.startswith(magic):
            raise CorpusError(f"{path}: {name}-compressed input is not supported (use gzip, bzip2 or plain files)")
    return None


class _CountingFile(io.RawIOBase):
    """Raw file that adds every byte read to ``stats.bytes_read``."""

    def __init__(self, path: Path, stats: ReadStats | None) -> None:
        self._f = open(path, "rb", buffering=0)
        self._stats = stats

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def readinto(self, b) -> int:  # type: ignore[override]
        n = self._f.readinto(b)
        if self._stats is not None and n:
            self._stats.bytes_read += n
        return n

    def close(self) -> None:
        self._f.close()
        super().close()


def open_raw(path: Path, stats: ReadStats | None) -> BinaryIO:
    """The file's bytes as stored (for Parquet/Arrow, which need random access), with byte accounting."""
    return io.BufferedReader(_CountingFile(path, stats), _READ_BUFFER)  # type: ignore[return-value]


def _decompressed(raw: BinaryIO | io.RawIOBase, compression: str | None) -> BinaryIO:
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[arg-type]
    if compression == "bzip2":
        return bz2.BZ2File(raw, mode="rb")  # type: ignore[return-value]
    return raw  # type: ignore[return-value]


def open_binary(path: Path, stats: ReadStats | None, compression: str | None) -> BinaryIO:
    """The file's decompressed bytes as a buffered stream; ``stats.bytes_read`` counts on-disk bytes."""
    return io.BufferedReader(_decompressed(_CountingFile(path, stats), compression), _READ_BUFFER)  # type: ignore


def sniff(path: Path, compression: str | None) -> bytes:
    """The first decompressed bytes of a file (at most SNIFF_BYTES), for format detection; b"" if none."""
    head = b""
    with open(path, "rb") as raw, _decompressed(raw, compression) as f:
        try:
            while len(head) < SNIFF_BYTES:
                chunk = f.read(4096)
                if not chunk:
                    break
                head += chunk
        except EOFError:  # truncated: the start is enough to detect, the reader reports the truncation
            if not head:  # not an empty file: the cut came before the first block could be decompressed
                raise CorpusError(f"{path}: truncated {compression} stream: it ends before its first block is "
                                  f"complete, so nothing can be read") from None
        except _CORRUPT as e:
            raise CorpusError(f"{path}: unreadable {compression} data: {e}") from e
    return head


_bad = threading.local()


def _count_and_replace(e: UnicodeDecodeError) -> tuple[str, int]:
    _bad.count += e.end - e.start
    return "\ufffd", e.end


_HANDLER = "indexer.readers.count-replace"
codecs.register_error(_HANDLER, _count_and_replace)


def decode_utf8(data: bytes) -> tuple[str, int]:
    """``data`` decoded as UTF-8, each invalid sequence replaced by U+FFFD, and the number of invalid bytes."""
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        pass
    _bad.count = 0
    text = data.decode("utf-8", _HANDLER)
    return text, _bad.count


def iter_lines(ctx: ReadContext, compression: str | None) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line with its newline) for each line of the decompressed file.

    Memory is bounded by the longest line. A truncated compressed stream ends the iteration through
    ``ctx.stream_truncated``; corrupt data is fatal."""
    n = 0
    with open_binary(ctx.path, ctx.stats, compression) as f:
        try:
            for raw in f:
                n += 1
                text, bad = decode_utf8(raw)
                if bad:
                    ctx.stats.invalid_utf8 += bad
                if n == 1 and text.startswith("\ufeff"):
                    text = text[1:]
                yield n, text
        except EOFError:
            ctx.stream_truncated(n + 1, compression or "input")
        except _CORRUPT as e:
            raise ctx.fatal(f"unreadable {compression or 'file'} data after line {n}: {e}", n + 1) from e
