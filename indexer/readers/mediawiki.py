"""MediaWiki XML dumps (``pages-articles*.xml[.bz2]``, any export schema version): main-namespace,
non-redirect pages, their latest revision's wikitext cleaned to plain text and cut into passages.

The XML is parsed incrementally (``xml.etree`` pull parser), each page dropped from the tree once handled, so
memory is bounded by the largest page. Lines are fed to the parser in batches that end at a ``</page>``, so
the line where each page starts is known exactly for error messages.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import Iterator

from indexer.readers.model import Document, MalformedRecord, ReadContext
from indexer.readers.passages import split_passages
from indexer.readers.source import iter_lines
from indexer.readers.wikitext import clean_wikitext

_PAGE_START = re.compile(r"<(?:[\w.-]+:)?page[\s>]")
_PAGE_END = "page>"
_FEED_BYTES = 1 << 20
_REDIRECT = re.compile(r"\s*#redirect", re.I)
_FILE_NS, _CATEGORY_NS = 6, 14


def _local(tag: str) -> str:
    """Tag name without its namespace: the export schema version (export-0.10, ...) does not matter."""
    return tag.rpartition("}")[2]


def _child(elem: ET.Element, name: str) -> ET.Element | None:
    return next((c for c in elem if _local(c.tag) == name), None)


def _child_text(elem: ET.Element, name: str) -> str | None:
    c = _child(elem, name)
    return None if c is None else (c.text or "")


class _Namespaces:
    """Namespace names from ``<siteinfo>``: localised file/category link prefixes, and the namespace of
    a page in old export schemas that have no ``<ns>`` element."""

    def __init__(self) -> None:
        self.by_name: dict[str, int] = {}

    def read_siteinfo(self, siteinfo: ET.Element) -> None:
        namespaces = _child(siteinfo, "namespaces")
        for ns in namespaces if namespaces is not None else ():
            if ns.text and ns.get("key", "").lstrip("-").isdigit():
                self.by_name[ns.text.strip().lower()] = int(ns.get("key", "0"))

    def link_prefixes(self) -> set[str]:
        return {name for name, key in self.by_name.items() if key in (_FILE_NS, _CATEGORY_NS)}

    def of_title(self, title: str) -> int:
        prefix, colon, _ = title.partition(":")
        return self.by_name.get(prefix.strip().lower(), 0) if colon else 0


def _page_fields(page: ET.Element, namespaces: _Namespaces) -> tuple[str, str, int, bool, str]:
    """(page id, title, namespace, is_redirect, wikitext) of a ``<page>``; MalformedRecord if incomplete."""
    title = _child_text(page, "title")
    if not title:
        raise MalformedRecord("<page> without a <title>")
    page_id = (_child_text(page, "id") or "").strip()
    if not page_id.isdigit():
        raise MalformedRecord(f"page {title!r}: missing or non-numeric <id> {page_id!r}")
    ns_text = _child_text(page, "ns")
    if ns_text is None:
        ns = namespaces.of_title(title)
    elif ns_text.strip().lstrip("-").isdigit():
        ns = int(ns_text)
    else:
        raise MalformedRecord(f"page {title!r}: non-numeric <ns> {ns_text!r}")
    revisions = [c for c in page if _local(c.tag) == "revision"]
    if not revisions:
        raise MalformedRecord(f"page {title!r}: no <revision>")
    text = _child_text(revisions[-1], "text")  # the latest revision (history dumps hold several)
    if text is None:
        raise MalformedRecord(f"page {title!r}: its revision has no <text>")
    redirect = _child(page, "redirect") is not None or _REDIRECT.match(text) is not None
    return page_id, title, ns, redirect, text


def read_mediawiki(ctx: ReadContext, compression: str | None, passage_words: int) -> Iterator[Document]:
    parser = ET.XMLPullParser(events=("start", "end"))
    namespaces = _Namespaces()
    prefixes: set[str] = set()
    root: ET.Element | None = None
    page_lines: deque[int] = deque()  # start lines of the pages not yet handled, in order
    batch: list[str] = []
    batch_chars = 0
    line = 0

    def events() -> Iterator[tuple[str, ET.Element]]:
        try:
            parser.feed("".join(batch))
            yield from parser.read_events()
        except ET.ParseError as e:
            raise ctx.fatal(f"XML not well-formed: {e}", e.position[0]) from e

    def drain() -> Iterator[Document]:
        nonlocal root, prefixes
        for event, elem in events():
            name = _local(elem.tag)
            if event == "start":
                if root is None:
                    if name != "mediawiki":
                        raise ctx.fatal(f"not a MediaWiki XML dump: the root element is <{name}>, not <mediawiki>")
                    root = elem
                continue
            if name == "siteinfo":
                namespaces.read_siteinfo(elem)
                prefixes = namespaces.link_prefixes()
            elif name == "page":
                start = page_lines.popleft() if page_lines else line
                yield from _page_documents(ctx, elem, start, namespaces, prefixes, passage_words)
            else:
                continue
            assert root is not None
            root.clear()  # drop handled pages (and siteinfo) so the tree never grows

    for line, text in iter_lines(ctx, compression):
        if "page" in text:
            page_lines.extend(line for _ in _PAGE_START.finditer(text))
        batch.append(text)
        batch_chars += len(text)
        if _PAGE_END in text or batch_chars >= _FEED_BYTES:
            yield from drain()
            batch.clear()
            batch_chars = 0
    yield from drain()
    if ctx.truncated:
        return  # already reported; the document is incomplete by definition
    if root is None:
        raise ctx.fatal("not a MediaWiki XML dump: no XML element found")
    try:
        parser.close()
    except ET.ParseError as e:
        raise ctx.fatal(f"XML not well-formed: {e}", e.position[0]) from e


def _page_documents(ctx: ReadContext, page: ET.Element, line: int, namespaces: _Namespaces,
                    prefixes: set[str], passage_words: int) -> Iterator[Document]:
    try:
        page_id, title, ns, redirect, wikitext = _page_fields(page, namespaces)
    except MalformedRecord as e:
        ctx.malformed(line, str(e))
        return
    ctx.stats.records += 1
    if ns != 0 or redirect:
        ctx.stats.filtered += 1
        return
    produced = 0
    for doc in split_passages(page_id, title, clean_wikitext(wikitext, prefixes), passage_words):
        produced += 1
        yield doc
    if not produced:
        ctx.stats.filtered += 1
