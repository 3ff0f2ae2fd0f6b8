"""Download a file to ``DEST.part`` (resuming it with an HTTP Range request), verify its checksum, rename it.

Errors are ``FetchError`` with the URL and the reason in one line (the CLI prints it without a traceback).
"""
from __future__ import annotations

import hashlib
import http.client
import os
import re
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable

CHUNK = 1 << 20
USER_AGENT = "ragserve-fetch/1"


class FetchError(Exception):
    """A download that failed: network error, HTTP error, checksum mismatch, bad archive."""


def file_digest(path: Path, algo: str) -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


ProgressFactory = Callable[[int | None, int, str], Callable[[int], None]]


def download(url: str, dest: Path, algo: str | None = None, expected: str | None = None, timeout: float = 60.0,
             progress: ProgressFactory | None = None) -> Path:
    """Fetch ``url`` into ``dest``. An existing ``dest.part`` is resumed; a complete file is checked against
    ``expected`` (hex digest of ``algo``: md5, sha256) when given, and a mismatch deletes it.
    ``progress(total_bytes or None, already_have, label)`` returns a callback taking byte counts."""
    dest = Path(dest)
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            append = have > 0 and response.status == 206 and _range_start(response.headers.get("Content-Range")) == have
            if not append:
                have = 0  # the server sent the whole file: start over
            length = response.headers.get("Content-Length")
            total = have + int(length) if length and length.isdigit() else None
            step = progress(total, have, dest.name) if progress else None
            got = have
            with open(part, "ab" if append else "wb") as f:
                while block := response.read(CHUNK):
                    f.write(block)
                    got += len(block)
                    if step:
                        step(len(block))
            if total is not None and got != total:
                # http.client ends a body cut short without an error: compare with Content-Length
                raise FetchError(f"{url}: connection closed after {got:,} of {total:,} bytes; "
                                 f"run again to resume from {part.name}")
    except urllib.error.HTTPError as e:
        if not (e.code == 416 and have):  # 416 with a .part: it is already complete, verify it below
            raise FetchError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:  # HTTPException: connection cut
        reason = getattr(e, "reason", None) or repr(e)
        raise FetchError(f"{url}: download failed ({reason}); run again to resume from {part.name}") from None
    if expected:
        got = file_digest(part, algo or "sha256")
        if got != expected.lower():
            part.unlink()
            raise FetchError(f"{url}: {algo} mismatch (expected {expected}, got {got}); deleted {part.name}")
    os.replace(part, dest)
    return dest


def _range_start(content_range: str | None) -> int | None:
    m = re.match(r"bytes (\d+)-", content_range or "")
    return int(m.group(1)) if m else None


def unzip(archive: Path, dest_dir: Path) -> list[str]:
    """Extract ``archive`` into ``dest_dir``; refuses members that would land outside it."""
    dest_dir = Path(dest_dir).resolve()
    try:
        with zipfile.ZipFile(archive) as z:
            names = z.namelist()
            for name in names:
                target = (dest_dir / name).resolve()
                if target != dest_dir and dest_dir not in target.parents:
                    raise FetchError(f"{archive}: member {name!r} would extract outside {dest_dir}")
            z.extractall(dest_dir)
    except zipfile.BadZipFile as e:
        raise FetchError(f"{archive}: not a valid zip archive ({e})") from None
    return names
