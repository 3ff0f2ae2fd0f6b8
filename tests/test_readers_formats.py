"""Each corpus reader on the real samples in ../shared/data and on small files in the formats without one."""
from __future__ import annotations

import bz2
import gzip
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from indexer.readers import ALIASES, FORMATS, Document, ReadStats, iter_documents
from indexer.readers.wikitext import clean_wikitext
from tests.conftest import shared

XML_DUMP = ("enwiki-xml-dump-sample", "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
XML_TABLES = ("enwiki-xml-dump-sample", "enwiki-table-markup.xml.bz2")


def read(paths: list[Path], **kw) -> tuple[list[Document], ReadStats]:
    stats = ReadStats()
    return list(iter_documents(paths, stats=stats, **kw)), stats


def test_formats_listed_under_the_readme_names() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## Input formats"):].split("\n\n")[1]
    names = [row.split("|")[1].strip().strip("`") for row in table.splitlines()[2:]]
    assert names == list(FORMATS) == ["dpr-tsv", "jsonl", "hf", "mediawiki", "wikiextractor"]


def _one_record_file(tmp_path: Path, name: str) -> Path:
    """A file with the record ("1", "T", "alpha beta") in the layout of the reader ``name``."""
    table = pa.table({"id": ["1"], "title": ["T"], "text": ["alpha beta"]})
    path = tmp_path / f"c.{name}"
    if name == "jsonl":
        path.write_text('{"id": "1", "title": "T", "text": "alpha beta"}\n', encoding="utf-8")
    elif name == "mediawiki":
        path.write_text("<mediawiki><page><title>T</title><ns>0</ns><id>1</id><revision><text>alpha beta</text>"
                        "</revision></page></mediawiki>\n", encoding="utf-8")
    elif name == "hf":
        pq.write_table(table, path)
    else:  # an Arrow IPC file
        with ipc.new_file(path, table.schema) as w:
            w.write_table(table)
    return path


@pytest.mark.parametrize("alias, name", [("json", "jsonl"), ("parquet", "hf"), ("arrow", "hf"),
                                         ("mediawiki-xml", "mediawiki")])
def test_earlier_names_are_aliases(tmp_path: Path, alias: str, name: str) -> None:
    assert ALIASES[alias] == name
    path = _one_record_file(tmp_path, "arrow" if alias == "arrow" else name)
    docs = [(d.id, d.title, d.text) for d in iter_documents([path], fmt=alias)]
    assert docs == [(d.id, d.title, d.text) for d in iter_documents([path], fmt=name)]
    assert docs in ([("1", "T", "alpha beta")], [("1_0", "T", "alpha beta")])  # mediawiki pages are articles


def test_wikiextractor_format_splits_every_record(tmp_path: Path) -> None:
    path = tmp_path / "wiki_00"  # a WikiExtractor record without the url key jsonl would infer articles from
    path.write_text(json.dumps({"id": "7", "title": "T", "text": "T\none two three four five"}) + "\n")
    as_articles = [(d.id, d.text) for d in iter_documents([path], fmt="wikiextractor", passage_words=3)]
    assert as_articles == [("7_0", "one two three"), ("7_1", "four five")]
    assert [(d.id, d.text) for d in iter_documents([path], fmt="jsonl", passage_words=3)] == \
        [("7", "T\none two three four five")]


def test_beir_arguana_gzip() -> None:
    path = shared("beir-arguana", "corpus.jsonl.gz")
    docs, stats = read([path])
    assert len(docs) == stats.records == stats.documents == 8674
    assert docs[0] == Document("test-environment-aeghhgwpe-pro02b",
                               "animals environment general health health general weight philosophy ethics",
                               docs[0].text)
    assert docs[0].text.startswith("You don\u2019t have to be vegetarian to be green.")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        expected = [json.loads(line) for line in f]
    assert [(d.id, d.title, d.text) for d in docs] == [(r["_id"], r["title"], r["text"]) for r in expected]
    assert stats.bytes_read == stats.bytes_total == path.stat().st_size
    assert stats.skipped == stats.error_count == stats.invalid_utf8 == 0


def test_flashrag_wiki18_titles_split_off() -> None:
    path = shared("wiki18-100w-passages-sample", "sample_data.jsonl")
    docs, stats = read([path])
    assert len(docs) == 1000 and stats.records == 1000
    assert (docs[0].id, docs[0].title) == ("0", "Evan Morris")
    assert docs[0].text.startswith("Evan Morris Evan L. Morris (January 26, 1977")
    for d, line in zip(docs, path.read_text(encoding="utf-8").splitlines()):
        first, _, rest = json.loads(line)["contents"].partition("\n")
        assert first in (d.title, f'"{d.title}"') and rest == d.text  # multi-word titles are CSV-quoted
        assert d.title and not d.title.startswith('"')


def test_wikiextractor_articles_become_passages() -> None:
    path = shared("enwiki-wikiextractor-json-sample", "wiki_00")  # no extension: detected from content
    docs, stats = read([path])
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert stats.records == len(records) == 35
    assert (docs[0].id, docs[0].title) == ("12_0", "Anarchism")
    assert not docs[0].text.startswith("Anarchism Anarchism")  # the repeated title line is dropped
    assert all(1 <= len(d.text.split()) <= 100 for d in docs)
    for r in records:
        passages = [d for d in docs if d.id.rsplit("_", 1)[0] == r["id"]]
        assert [d.id for d in passages] == [f"{r['id']}_{n}" for n in range(len(passages))]
        assert {d.title for d in passages} == {r["title"]}
        first, _, body = r["text"].partition("\n")
        assert first == r["title"]
        assert " ".join(d.text for d in passages).split() == body.split()
    whole, _ = read([path], passage_words=0, fmt="jsonl")
    assert [d.id for d in whole] == [r["id"] for r in records]
    assert whole[0].text.startswith("Anarchism is a radical political movement")


def _xml_articles(path: Path) -> dict[str, tuple[str, str]]:
    """page id -> (title, wikitext) of the ns-0 non-redirect pages, by a plain whole-tree reading."""
    out = {}
    for _, el in ET.iterparse(bz2.open(path)):
        if el.tag.endswith("}page") and el.find("{*}ns").text == "0" and el.find("{*}redirect") is None:
            out[el.find("{*}id").text] = (el.find("{*}title").text, el.find("{*}revision/{*}text").text or "")
    return out


@pytest.mark.parametrize("sample, pages, articles", [(XML_DUMP, 206, 106), (XML_TABLES, 5, 5)])
def test_mediawiki_dump(sample: tuple[str, str], pages: int, articles: int) -> None:
    path = shared(*sample)
    docs, stats = read([path])
    expected = _xml_articles(path)
    assert len(expected) == articles
    assert stats.records == pages and stats.filtered == pages - articles and stats.skipped == 0
    by_page: dict[str, list[Document]] = {}
    for d in docs:
        by_page.setdefault(d.id.rsplit("_", 1)[0], []).append(d)
    assert list(by_page) == list(expected)  # only ns-0 non-redirect pages, in dump order
    for page_id, passages in by_page.items():
        title, wikitext = expected[page_id]
        assert [d.id for d in passages] == [f"{page_id}_{n}" for n in range(len(passages))]
        assert {d.title for d in passages} == {title}
        assert all(1 <= len(d.text.split()) <= 100 for d in passages)
        assert all(len(d.text.split()) == 100 for d in passages[:-1])
        plain = clean_wikitext(wikitext)
        assert " ".join(d.text for d in passages).split() == plain.split()
        for marker in ("{{", "}}", "[[", "]]", "<ref", "{|", "|}"):
            assert marker not in plain, (title, marker)
    titles = {d.title for d in docs}
    assert "AccessibleComputing" not in titles  # a redirect
    assert not any(t.startswith("Wikipedia:") for t in titles)  # namespace 4


def test_mediawiki_first_article_text() -> None:
    anarchism = next(iter_documents([shared(*XML_DUMP)], passage_words=0))
    assert (anarchism.id, anarchism.title) == ("12", "Anarchism")
    assert anarchism.text.startswith("Anarchism is a political philosophy that advocates self-governed societies")
    assert "Proudhon" in anarchism.text and "'''" not in anarchism.text


def test_dpr_tsv_with_quoted_fields(tmp_path: Path) -> None:
    path = tmp_path / "psgs_w100.tsv"
    path.write_text('id\ttext\ttitle\n'
                    '1\t"Aaron Aaron ( or ; ""Ahärôn"") is a prophet, high priest"\tAaron\n'
                    '2\tplain text with a "quote" inside\t"Title, quoted"\n'
                    '3\t"spans\ntwo lines"\tT3\n', encoding="utf-8")
    docs, stats = read([path])
    assert docs == [Document("1", "Aaron", 'Aaron Aaron ( or ; "Ahärôn") is a prophet, high priest'),
                    Document("2", "Title, quoted", 'plain text with a "quote" inside'),
                    Document("3", "T3", "spans\ntwo lines")]
    assert stats.records == 3
    gz = tmp_path / "psgs.tsv.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert read([gz])[0] == docs


def test_dpr_tsv_detected_by_header_without_extension(tmp_path: Path) -> None:
    path = tmp_path / "passages"
    path.write_bytes(bz2.compress(b"id\ttext\ttitle\n9\tsome text\tT\n"))
    assert read([path])[0] == [Document("9", "T", "some text")]


def test_jsonl_layouts(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    records = [{"id": "p1", "contents": "pyserini contents"},
               {"_id": "b1", "title": "BEIR", "text": "beir text", "metadata": {}},
               {"docid": 7, "title": "Generic", "contents": "generic contents"},
               {"id": "f1", "contents": '"Quoted ""Title"""\nflashrag text'},
               {"id": "f2", "contents": 'Plain\nsecond line'}]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n", encoding="utf-8")
    docs, stats = read([path])
    assert docs == [Document("p1", "", "pyserini contents"), Document("b1", "BEIR", "beir text"),
                    Document("7", "Generic", "generic contents"), Document("f1", 'Quoted "Title"', "flashrag text"),
                    Document("f2", "Plain", "second line")]
    assert stats.records == 5


def test_json_array_and_json_lines(tmp_path: Path) -> None:
    array = tmp_path / "corpus.json"
    array.write_text(json.dumps([{"id": "a", "text": "x ] }, y"}, {"id": "b", "title": "B", "text": "z"}],
                                indent=2), encoding="utf-8")
    lines = tmp_path / "lines.json"
    lines.write_text('{"id": "a", "text": "x ] }, y"}\n{"id": "b", "title": "B", "text": "z"}\n', encoding="utf-8")
    expected = [Document("a", "", "x ] }, y"), Document("b", "B", "z")]
    assert read([array])[0] == expected
    assert read([lines])[0] == expected
    compact = tmp_path / "compact.json"
    compact.write_text('[{"id":"a","text":"x ] }, y"},{"id":"b","title":"B","text":"z"}]', encoding="utf-8")
    assert read([compact])[0] == expected


def _wiki_table() -> pa.Table:
    return pa.table({"id": ["10", "11"], "url": ["https://en.wikipedia.org/wiki?curid=10", "u11"],
                     "title": ["Ten", "Eleven"], "text": [" ".join(f"w{i}" for i in range(130)), "short text"]})


def test_parquet_wikipedia_articles_split(tmp_path: Path) -> None:
    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(_wiki_table(), path, row_group_size=1)
    docs, stats = read([path])
    assert [(d.id, d.title, len(d.text.split())) for d in docs] == [
        ("10_0", "Ten", 100), ("10_1", "Ten", 30), ("11_0", "Eleven", 2)]
    assert stats.records == 2 and stats.bytes_read > 0
    whole, _ = read([path], passage_words=0)
    assert [d.id for d in whole] == ["10", "11"]


def test_parquet_passage_rows_not_split(tmp_path: Path) -> None:
    path = tmp_path / "corpus"  # no extension: detected by the PAR1 magic
    table = pa.table({"_id": ["d1", "d2"], "title": ["T1", None], "text": [" ".join(["w"] * 150), "t2"],
                      "extra": [1, 2]})
    pq.write_table(table, path)
    docs, _ = read([path])
    assert [(d.id, d.title, len(d.text.split())) for d in docs] == [("d1", "T1", 150), ("d2", "", 1)]


def test_arrow_ipc_file_and_stream(tmp_path: Path) -> None:
    table = pa.table({"docid": ["x", "y"], "contents": ["first", "second"]})
    file_path, stream_path = tmp_path / "c.arrow", tmp_path / "c-stream"
    with ipc.new_file(file_path, table.schema) as w:
        w.write_table(table)
    with ipc.new_stream(stream_path, table.schema) as w:
        w.write_table(table, max_chunksize=1)
    expected = [Document("x", "", "first"), Document("y", "", "second")]
    assert read([file_path])[0] == expected
    assert read([stream_path])[0] == expected


def test_files_written_by_hf_datasets(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"_id": ["a", "b"], "title": ["A", "B"], "text": ["alpha", "beta"]})
    ds.to_parquet(str(tmp_path / "x.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    expected = [Document("a", "A", "alpha"), Document("b", "B", "beta")]
    assert read([tmp_path / "x.parquet"])[0] == expected
    assert read(sorted((tmp_path / "saved").glob("*.arrow")))[0] == expected


def test_several_inputs_in_order(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"id": "1", "text": "one"}\n', encoding="utf-8")
    b.write_text('{"id": "2", "text": "two"}\n', encoding="utf-8")
    docs, stats = read([a, str(b)])
    assert [d.id for d in docs] == ["1", "2"] and stats.documents == 2
    assert stats.bytes_total == a.stat().st_size + b.stat().st_size


def test_reading_is_lazy() -> None:
    path = shared("beir-arguana", "corpus.jsonl.gz")
    stats = ReadStats()
    it = iter_documents([path], stats=stats)
    assert stats.bytes_read == 0 and stats.bytes_total == path.stat().st_size
    first = next(it)
    assert first.id == "test-environment-aeghhgwpe-pro02b"
    assert 0 < stats.bytes_read < stats.bytes_total / 2
    dump_stats = ReadStats()
    dump = iter_documents([shared(*XML_DUMP)], stats=dump_stats)
    assert next(dump).id == "12_0"
    assert 0 < dump_stats.bytes_read < dump_stats.bytes_total / 2
