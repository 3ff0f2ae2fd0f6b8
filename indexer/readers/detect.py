"""Which reader a file needs: its extension (after .gz/.bz2), else its first decompressed bytes."""
from __future__ import annotations

from pathlib import Path

from indexer.readers.model import CorpusError
from indexer.readers.source import sniff
from indexer.readers.table import ARROW_FILE_MAGIC, ARROW_STREAM_MAGIC

# The corpus formats, under the names the README and `ragserve index --help` use; iter_documents(fmt=...) takes
# these or "auto".
FORMAT_HELP = {
    "dpr-tsv": "DPR psgs_w100.tsv: id<TAB>text<TAB>title with a header line",
    "jsonl": "JSON lines or one JSON array of records (pyserini, BEIR, FlashRAG, generic)",
    "hf": "Hugging Face datasets files, Parquet or Arrow (e.g. wikimedia/wikipedia)",
    "mediawiki": "MediaWiki pages-articles XML dumps",
    "wikiextractor": "WikiExtractor --json output: whole articles, split into passages",
}
FORMATS = tuple(FORMAT_HELP)
# Earlier names of the same readers, still accepted.
ALIASES = {"json": "jsonl", "parquet": "hf", "arrow": "hf", "mediawiki-xml": "mediawiki"}
RANDOM_ACCESS = ("hf",)  # read by pyarrow from the file itself: cannot be gzip/bzip2-compressed

_EXTENSIONS = {".tsv": "dpr-tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "hf",
               ".arrow": "hf", ".feather": "hf", ".xml": "mediawiki"}


def canonical_format(name: str) -> str:
    """``name`` with an earlier alias replaced by the format's name (unknown names are returned as they are)."""
    return ALIASES.get(name, name)


def detect_format(path: Path, compression: str | None) -> str:
    """The reader for ``path``; CorpusError if neither its name nor its content says."""
    name = path.name.lower()
    for suffix in (".gz", ".bz2"):
        name = name.removesuffix(suffix)
    ext = Path(name).suffix
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    head = sniff(path, compression)
    if head.startswith(b"PAR1") or head.startswith(ARROW_FILE_MAGIC) or head.startswith(ARROW_STREAM_MAGIC):
        return "hf"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith(b"<"):
        return "mediawiki"
    if text.startswith(b"{") or text.startswith(b"["):
        return "jsonl"
    if head.split(b"\n", 1)[0].rstrip(b"\r").lstrip(b"\xef\xbb\xbf") == b"id\ttext\ttitle":
        return "dpr-tsv"
    raise CorpusError(f"{path}: cannot tell the corpus format from its name or content; "
                      f"name it explicitly (one of {', '.join(FORMATS)})")
