"""Which reader a file needs: its extension (after .gz/.bz2), else its first decompressed bytes."""
from __future__ import annotations

from pathlib import Path

from indexer.readers.model import CorpusError
from indexer.readers.source import sniff
from indexer.readers.table import ARROW_FILE_MAGIC

# Reader names accepted by iter_documents(fmt=...), besides "auto".
FORMATS = ("dpr-tsv", "jsonl", "json", "parquet", "arrow", "mediawiki-xml")
RANDOM_ACCESS = ("parquet", "arrow")  # read by pyarrow from the file itself: cannot be gzip/bzip2-compressed

_EXTENSIONS = {".tsv": "dpr-tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet",
               ".arrow": "arrow", ".feather": "arrow", ".xml": "mediawiki-xml"}
_ARROW_STREAM_MAGIC = b"\xff\xff\xff\xff"  # continuation marker that starts every IPC stream message


def detect_format(path: Path, compression: str | None) -> str:
    """The reader for ``path``; CorpusError if neither its name nor its content says."""
    name = path.name.lower()
    for suffix in (".gz", ".bz2"):
        name = name.removesuffix(suffix)
    ext = Path(name).suffix
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    head = sniff(path, compression)
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(ARROW_FILE_MAGIC) or head.startswith(_ARROW_STREAM_MAGIC):
        return "arrow"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith(b"<"):
        return "mediawiki-xml"
    if text.startswith(b"{"):
        return "jsonl"
    if text.startswith(b"["):
        return "json"
    if head.split(b"\n", 1)[0].rstrip(b"\r").lstrip(b"\xef\xbb\xbf") == b"id\ttext\ttitle":
        return "dpr-tsv"
    raise CorpusError(f"{path}: cannot tell the corpus format from its name or content; "
                      f"name it explicitly (one of {', '.join(FORMATS)})")
