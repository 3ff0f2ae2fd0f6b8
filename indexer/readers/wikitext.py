"""Wikitext -> plain text, as much of it as a reader would see as prose.

Removed: comments, templates ``{{...}}`` and tables ``{|...|}`` (both nested), ``<ref>`` and other non-prose
elements (math, gallery, ...), file/image/category and interlanguage links, magic words, list/heading/bold/italic
markup and all other HTML tags (their content kept). Kept: link labels, external link labels, heading text.
HTML entities are unescaped last, so text that the wiki shows literally (``&lt;ref&gt;``) stays literal.
"""
from __future__ import annotations

import html
import re
from collections.abc import Iterable

# Link prefixes whose links are not prose (MediaWiki's English names; dumps add their localised ones).
DEFAULT_DROP_PREFIXES = frozenset({"file", "image", "category"})

_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
# Elements whose content is not prose; a self-closing tag (<ref name="x"/>) is not an opening tag.
_NON_PROSE = ("ref", "references", "math", "chem", "ce", "gallery", "timeline", "imagemap", "score", "graph",
              "mapframe", "maplink", "templatedata", "templatestyles", "syntaxhighlight", "source", "hiero")
_NON_PROSE_ELEMENT = re.compile(
    r"<(%s)\b(?:[^>]*[^/>])?>.*?</\1\s*>" % "|".join(_NON_PROSE), re.S | re.I)
_TEMPLATE_TOKEN = re.compile(r"\{\{|\}\}")
# Tables open with "{|" and close with "|}" at the start of a line ("{|" may be indented with ':').
_TABLE_TOKEN = re.compile(r"^[ \t:]*\{\||^[ \t]*\|\}", re.M)
# The label may hold simple wikilinks: "[http://x talk at [[UC Berkeley]]]".
_EXTERNAL_LINK = re.compile(
    r"\[(?:https?:|ftp:|mailto:|news:|irc:|//)[^\s\]\[]*(?:[ \t]+((?:[^\]\[\n]|\[\[[^\[\]\n]*\]\])*))?\]", re.I)
_LINK_TOKEN = re.compile(r"\[\[|\]\]")
_INTERLANGUAGE = re.compile(r"[a-z]{2,3}(?:-[a-z]{2,8})*|simple")
# Removals can bring single braces together ("{{{x}}}" leaves "}"); no markup pair may survive.
_STRAY_BRACKETS = re.compile(r"\[\[|\]\]|\{\{|\}\}")
_BR = re.compile(r"<br\s*/?>", re.I)
_TAG = re.compile(r"</?[a-zA-Z][\w:-]*(?:\s[^<>]*)?/?>")
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_BOLD_ITALIC = re.compile(r"'{2,}")
_HEADING = re.compile(r"^[ \t]*=+[ \t]*(.*?)[ \t]*=+[ \t]*$", re.M)
_LIST_MARKER = re.compile(r"^[ \t]*[*#:;]+[ \t]*", re.M)
_RULE = re.compile(r"^[ \t]*-{4,}[ \t]*$", re.M)


def _remove_nested(text: str, tokens: re.Pattern[str], unclosed_to_end: bool) -> str:
    """``text`` without its balanced opener...closer spans (outermost wins). An unmatched closer is removed;
    an unmatched opener is removed alone, or with everything after it when ``unclosed_to_end``."""
    spans: list[tuple[int, int]] = []
    openers: list[int] = []
    for m in tokens.finditer(text):
        if m.group().lstrip(" \t:").startswith("{"):
            openers.append(m.start())
        elif openers:
            spans.append((openers.pop(), m.end()))
        else:
            spans.append((m.start(), m.end()))
    if not spans and not openers:
        return text
    for start in openers:
        end = len(text) if unclosed_to_end else start + len(tokens.match(text, start).group())  # type: ignore[union-attr]
        spans.append((start, end))
    spans.sort()
    out: list[str] = []
    pos = 0
    for start, end in spans:
        if start > pos:
            out.append(text[pos:start])
        pos = max(pos, end)
    out.append(text[pos:])
    return "".join(out)


def _link_text(target: str, label: str | None, drop_prefixes: frozenset[str]) -> str:
    """What a reader sees of ``[[target|label]]``: nothing for files, categories and interlanguage links."""
    target = target.strip()
    if target.startswith(":"):  # [[:Category:X]] is a visible link to the page, not a categorisation
        target = target[1:].lstrip()
    else:
        prefix, colon, _ = target.partition(":")
        if colon and (prefix.strip().lower() in drop_prefixes
                      or (label is None and _INTERLANGUAGE.fullmatch(prefix.strip()))):
            return ""
    if label is None:
        return target
    if label.strip():
        return label
    # pipe trick: [[Help:Foo (bar)|]] shows "Foo"
    return re.sub(r"\s*\([^()]*\)$", "", target.partition(":")[2] or target)


def _resolve_links(text: str, drop_prefixes: frozenset[str]) -> str:
    """Every ``[[...]]`` replaced by what it shows, innermost first (so a file caption's own links are resolved
    before the file link itself is dropped); single brackets inside are plain text; unmatched ``[[`` or ``]]``
    are removed."""
    levels: list[list[str]] = [[]]  # text parts of each open link, outermost (the page) first
    pos = 0
    for m in _LINK_TOKEN.finditer(text):
        levels[-1].append(text[pos:m.start()])
        pos = m.end()
        if m.group() == "[[":
            levels.append([])
        elif len(levels) > 1:
            target, pipe, label = "".join(levels.pop()).partition("|")
            levels[-1].append(_link_text(target, label if pipe else None, drop_prefixes))
    levels[-1].append(text[pos:])
    while len(levels) > 1:
        inner = "".join(levels.pop())
        levels[-1].append(inner)
    return "".join(levels[0])


def _external_label(m: re.Match[str]) -> str:
    return m.group(1) or ""


def clean_wikitext(text: str, drop_prefixes: Iterable[str] = DEFAULT_DROP_PREFIXES) -> str:
    """Plain text of one article's wikitext: lines of single-spaced words, no empty lines."""
    prefixes = frozenset(p.lower() for p in drop_prefixes) | DEFAULT_DROP_PREFIXES
    text = _COMMENT.sub("", text)
    text = _NON_PROSE_ELEMENT.sub("", text)
    text = _remove_nested(text, _TEMPLATE_TOKEN, unclosed_to_end=False)
    text = _remove_nested(text, _TABLE_TOKEN, unclosed_to_end=True)
    text = _EXTERNAL_LINK.sub(_external_label, text)
    text = _resolve_links(text, prefixes)
    text = _STRAY_BRACKETS.sub("", text)
    text = _BR.sub("\n", text)
    text = _TAG.sub("", text)
    text = _MAGIC_WORD.sub("", text)
    text = _BOLD_ITALIC.sub("", text)
    text = _HEADING.sub(r"\1", text)
    text = _RULE.sub("", text)
    text = _LIST_MARKER.sub("", text)
    text = html.unescape(text)
    lines = (" ".join(line.split()) for line in text.split("\n"))
    return "\n".join(line for line in lines if line)
