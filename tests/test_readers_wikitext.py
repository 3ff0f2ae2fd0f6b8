"""Wikitext cleaning and passage splitting on hand-written markup with known rendered text."""
from __future__ import annotations

import pytest

from indexer.readers.passages import split_passages
from indexer.readers.wikitext import clean_wikitext


@pytest.mark.parametrize("wikitext, plain", [
    ("a {{cite|x={{nested|{{deep}}}}}} b", "a b"),
    ("a {{unclosed b", "a unclosed b"),
    ("before\n{| class=wikitable\n|-\n| cell {{x}}\n{|\n| inner\n|}\n| more\n|}\nafter", "before\nafter"),
    ("before\n:{| \n| cell\n|}\nafter", "before\nafter"),
    ("x<ref name=\"a\">cite {{c}}</ref> y<ref name=\"b\" /> z<REF>w</REF>.", "x y z."),
    ("[[File:A.jpg|thumb|A caption with [[Link|label]] and [about] [http://e.org x]]] text", "text"),
    ("[[Image:B.png|right|nested [[a|[[b]]]]]]text", "text"),
    ("[[Category:Anarchism]][[category : Foo|Bar]]end", "end"),
    ("[[a|b]] [[c]] [[d (e)|]] [[:Category:X|cat page]] [[de:Anarchismus]]", "b c d cat page"),
    ("[[bus]]es and [[train|rail]]ways", "buses and railways"),
    ("see [http://x.org/a?b=c the label] and [https://y.org] end", "see the label and end"),
    ("[http://x.org talk at [[UC Berkeley|Berkeley]], 1962]", "talk at Berkeley, 1962"),
    ("'''bold''' and ''italic'' and '''''both'''''", "bold and italic and both"),
    ("== Heading ==\ntext\n=== Sub ===", "Heading\ntext\nSub"),
    ("* one\n** two\n# three\n: indented\n; term", "one\ntwo\nthree\nindented\nterm"),
    ("a &amp; b&nbsp;c &lt;ref&gt; &ndash; d", "a & b c <ref> – d"),
    ("__TOC__\ntext __NOTOC__ more", "text more"),
    ("a <!-- hidden {{x}} --> b <!-- unterminated", "a b"),
    ("H<sub>2</sub>O<br/>next <span style=\"x\">kept</span>", "H2O\nnext kept"),
    ("x <math>\\frac{1}{2}</math> y <gallery>\nFile:a.jpg|c\n</gallery> z", "x y z"),
    ("text\n----\nmore", "text\nmore"),
    ("", ""),
])
def test_clean_wikitext(wikitext: str, plain: str) -> None:
    assert clean_wikitext(wikitext) == plain


def test_localised_prefixes_are_dropped() -> None:
    assert clean_wikitext("a [[Datei:x.png|thumb|c]] [[Kategorie:K]] b", {"datei", "kategorie"}) == "a b"
    assert clean_wikitext("a [[Datei:x.png|c]] b") == "a c b"  # not a file prefix unless the dump says so


def test_split_passages() -> None:
    words = [f"w{i}" for i in range(250)]
    docs = list(split_passages("7", "T", "  ".join(words[:120]) + "\n" + " ".join(words[120:]), 100))
    assert [d.id for d in docs] == ["7_0", "7_1", "7_2"]
    assert [len(d.text.split()) for d in docs] == [100, 100, 50]
    assert " ".join(d.text for d in docs).split() == words
    assert all(d.title == "T" for d in docs)
    whole = list(split_passages("7", "T", "a b\nc", 0))
    assert [(d.id, d.text) for d in whole] == [("7", "a b\nc")]
    assert list(split_passages("7", "T", " \n ", 100)) == [] and list(split_passages("7", "T", "", 0)) == []
    with pytest.raises(ValueError):
        list(split_passages("7", "T", "a", -1))
