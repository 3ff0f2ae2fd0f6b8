"""Broken corpus input: each problem is reported with its file (and line), per the on_error policy."""
from __future__ import annotations

import bz2
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from indexer.readers import CorpusError, Document, ReadStats, iter_documents
from indexer.readers.model import MAX_ERRORS
from tests.conftest import shared

XML_DUMP = ("enwiki-xml-dump-sample", "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")


def read(paths: list[Path], **kw) -> tuple[list[Document], ReadStats]:
    stats = ReadStats()
    return list(iter_documents(paths, stats=stats, **kw)), stats


def read_until_error(paths: list[Path], **kw) -> tuple[list[Document], CorpusError]:
    """Documents yielded before the CorpusError that must end the reading."""
    docs = []
    with pytest.raises(CorpusError) as exc:
        for d in iter_documents(paths, **kw):
            docs.append(d)
    return docs, exc.value


@pytest.fixture
def broken_jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"id": "1", "text": "one"}\n'
                    '{"id": "2", "text": "two"\n'  # line 2: unterminated object
                    '{"text": "no id"}\n'  # line 3: no id
                    '{"id": "4", "contents": null}\n'  # line 4: no text
                    '["not", "an", "object"]\n'  # line 5
                    '{"id": "6", "text": "six"}\n', encoding="utf-8")
    return path


def test_jsonl_skip_records_errors(broken_jsonl: Path) -> None:
    docs, stats = read([broken_jsonl], on_error="skip")
    assert [d.id for d in docs] == ["1", "6"]
    assert stats.records == 2 and stats.skipped == stats.error_count == 4
    assert [(e.file, e.line) for e in stats.errors] == [(str(broken_jsonl), n) for n in (2, 3, 4, 5)]
    assert "broken JSON" in stats.errors[0].message
    assert "no document id" in stats.errors[1].message and "text" in stats.errors[2].message


def test_jsonl_fail_names_file_and_line(broken_jsonl: Path) -> None:
    docs, err = read_until_error([broken_jsonl], on_error="fail")
    assert [d.id for d in docs] == ["1"]
    assert f"{broken_jsonl}:2:" in str(err) and "broken JSON" in str(err)
    assert isinstance(err, ValueError)


def test_error_list_is_capped_but_all_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "many.jsonl"
    path.write_text("{broken\n" * (MAX_ERRORS + 50) + '{"id": "ok", "text": "t"}\n', encoding="utf-8")
    docs, stats = read([path])
    assert [d.id for d in docs] == ["ok"]
    assert stats.error_count == stats.skipped == MAX_ERRORS + 50 and len(stats.errors) == MAX_ERRORS
    assert stats.errors[-1].line == MAX_ERRORS


def _truncated(tmp_path: Path, source: Path, name: str) -> Path:
    data = source.read_bytes()
    out = tmp_path / name
    out.write_bytes(data[: len(data) // 2])
    return out


def test_truncated_bz2_xml(tmp_path: Path) -> None:
    source = shared(*XML_DUMP)
    cut = _truncated(tmp_path, source, "pages-articles-cut.xml.bz2")
    full = [d.id for d in iter_documents([source])]
    docs, stats = read([cut], on_error="skip")
    assert 0 < len(docs) < len(full) and [d.id for d in docs] == full[: len(docs)]
    assert stats.truncated == [str(cut)] and stats.error_count == 1
    assert stats.errors[0].file == str(cut) and stats.errors[0].line > 1000
    assert "truncated" in stats.errors[0].message
    failed_docs, err = read_until_error([cut], on_error="fail")
    assert [d.id for d in failed_docs] == [d.id for d in docs]  # what was read is kept, then it raises
    assert str(cut) in str(err) and "truncated" in str(err)


@pytest.mark.parametrize("on_error", ["skip", "fail"])
def test_cut_before_the_first_bz2_block_is_truncated_not_empty(tmp_path: Path, on_error: str) -> None:
    cut = tmp_path / "pages-articles-100k.xml.bz2"  # `head -c 100000`: less than one bzip2 block
    cut.write_bytes(shared(*XML_DUMP).read_bytes()[:100_000])
    with pytest.raises(CorpusError) as exc:
        iter_documents([cut], on_error=on_error)
    assert f"{cut}: truncated bzip2 stream" in str(exc.value) and "empty" not in str(exc.value)
    empty = tmp_path / "empty.xml.bz2"
    empty.write_bytes(bz2.compress(b""))
    with pytest.raises(CorpusError, match="empty file"):
        iter_documents([empty], on_error=on_error)


def test_truncated_gzip_jsonl_then_next_file(tmp_path: Path) -> None:
    source = shared("beir-arguana", "corpus.jsonl.gz")
    cut = _truncated(tmp_path, source, "corpus-cut.jsonl.gz")
    after = tmp_path / "after.jsonl"
    after.write_text('{"id": "after", "text": "t"}\n', encoding="utf-8")
    docs, stats = read([cut, after], on_error="skip")
    assert docs[-1].id == "after" and 1000 < len(docs) - 1 < 8674
    assert stats.truncated == [str(cut)]
    expected = [d.id for d in iter_documents([source])][: len(docs) - 1]
    assert [d.id for d in docs[:-1]] == expected
    _, err = read_until_error([cut, after], on_error="fail")
    assert str(cut) in str(err)


def test_corrupt_compressed_data_is_fatal(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(b'{"id": "1", "text": "x"}\n' * 50000))
    data[len(data) // 2: len(data) // 2 + 64] = b"\x00" * 64
    path = tmp_path / "corrupt.jsonl.gz"
    path.write_bytes(bytes(data))
    for mode in ("skip", "fail"):
        _, err = read_until_error([path], on_error=mode)
        assert str(path) in str(err) and "gzip" in str(err)


@pytest.mark.parametrize("mode", ["skip", "fail"])
def test_xml_not_well_formed(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "bad.xml"
    path.write_text('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/">\n'
                    '<page><title>A</title><ns>0</ns><id>1</id><revision><text>alpha beta</text></revision></page>\n'
                    '<page><title>B</title><ns>0</ns><id>2</id>\n'
                    '<revision><text>oops</revison>\n'
                    '</page></mediawiki>\n', encoding="utf-8")
    docs, err = read_until_error([path], on_error=mode)
    assert docs == [Document("1_0", "A", "alpha beta")]
    assert f"{path}:4:" in str(err) and "not well-formed" in str(err)


def test_not_a_mediawiki_dump(tmp_path: Path) -> None:
    path = tmp_path / "other.xml"
    path.write_text("<rss><item>x</item></rss>\n", encoding="utf-8")
    _, err = read_until_error([path])
    assert str(path) in str(err) and "<rss>" in str(err)


def _page(title: str, page_id: str, text: str, ns: str = "0", extra: str = "") -> str:
    return (f"  <page>\n    <title>{title}</title>\n    <ns>{ns}</ns>\n    <id>{page_id}</id>\n{extra}"
            f"    <revision>\n      <id>9{page_id}</id>\n      <text>{text}</text>\n    </revision>\n  </page>\n")


def test_xml_bad_page_reported_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "dump.xml"
    pages = [_page("Good", "1", "one two"),  # lines 2-10
             _page("No id", "", "x"),  # lines 11-19
             _page("Talk:T", "3", "talk", ns="1"),
             _page("R", "4", "#REDIRECT [[Good]]"),
             _page("R2", "5", "x", extra='    <redirect title="Good" />\n'),
             _page("Last", "6", "{{stub}} three")]
    path.write_text("<mediawiki xmlns='http://www.mediawiki.org/xml/export-0.10/'>\n" + "".join(pages)
                    + "</mediawiki>\n", encoding="utf-8")
    docs, stats = read([path])
    assert docs == [Document("1_0", "Good", "one two"), Document("6_0", "Last", "three")]
    assert stats.records == 5 and stats.filtered == 3 and stats.skipped == 1
    assert (stats.errors[0].line, stats.errors[0].file) == (11, str(path))
    assert "No id" in stats.errors[0].message
    _, err = read_until_error([path], on_error="fail")
    assert f"{path}:11:" in str(err)


def test_xml_old_schema_without_ns_uses_siteinfo(tmp_path: Path) -> None:
    path = tmp_path / "old.xml"
    path.write_text('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.3/"><siteinfo><namespaces>'
                    '<namespace key="0" /><namespace key="1">Talk</namespace><namespace key="6">Datei</namespace>'
                    '</namespaces></siteinfo>'
                    '<page><title>Talk:X</title><id>1</id><revision><text>t</text></revision></page>'
                    '<page><title>Y</title><id>2</id><revision><text>a [[Datei:p.png|cap]] b</text></revision>'
                    '</page></mediawiki>', encoding="utf-8")  # one single line
    assert read([path])[0] == [Document("2_0", "Y", "a b")]


def test_parquet_missing_columns(tmp_path: Path) -> None:
    path = tmp_path / "cols.parquet"
    pq.write_table(pa.table({"doc": ["1"], "body": ["x"], "title": ["t"]}), path)
    for mode in ("skip", "fail"):
        with pytest.raises(CorpusError) as exc:
            list(iter_documents([path], on_error=mode))
        msg = str(exc.value)
        assert str(path) in msg and "doc, body, title" in msg and "id" in msg and "text" in msg


def test_parquet_null_values_are_bad_rows(tmp_path: Path) -> None:
    path = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"id": ["1", None, "3"], "text": ["a", "b", None]}), path)
    docs, stats = read([path])
    assert docs == [Document("1", "", "a")]
    assert [(e.line, e.file) for e in stats.errors] == [(2, str(path)), (3, str(path))]
    _, err = read_until_error([path], on_error="fail")
    assert f"{path}:2:" in str(err) and "row 2" in str(err)


def test_not_parquet_content(tmp_path: Path) -> None:
    path = tmp_path / "fake.parquet"
    path.write_text("not parquet\n", encoding="utf-8")
    _, err = read_until_error([path])
    assert str(path) in str(err) and "Parquet" in str(err)


@pytest.mark.parametrize("content", [b"", gzip.compress(b""), bz2.compress(b"")], ids=["plain", "gzip", "bz2"])
def test_empty_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(content)
    for mode in ("skip", "fail"):
        with pytest.raises(CorpusError, match="empty file") as exc:
            iter_documents([path], on_error=mode)
        assert str(path) in str(exc.value)


def test_file_without_records(tmp_path: Path) -> None:
    path = tmp_path / "header-only.tsv"
    path.write_text("id\ttext\ttitle\n", encoding="utf-8")
    _, err = read_until_error([path])
    assert str(path) in str(err) and "no records" in str(err)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="no such file") as exc:
        iter_documents([tmp_path / "nope.jsonl"])
    assert "nope.jsonl" in str(exc.value)
    with pytest.raises(CorpusError, match="not a regular file"):
        iter_documents([tmp_path])
    with pytest.raises(CorpusError, match="no corpus files"):
        iter_documents([])


def test_unknown_format(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("just some prose\n", encoding="utf-8")
    with pytest.raises(CorpusError, match="cannot tell the corpus format") as exc:
        iter_documents([path])
    assert str(path) in str(exc.value)
    with pytest.raises(CorpusError, match="unknown corpus format 'csv'"):
        iter_documents([path], fmt="csv")
    xz = tmp_path / "c.jsonl.xz"
    xz.write_bytes(b"\xfd7zXZ\x00\x00rest")
    with pytest.raises(CorpusError, match="xz"):
        iter_documents([xz])
    gz_parquet = tmp_path / "c.parquet.gz"
    gz_parquet.write_bytes(gzip.compress(b"PAR1"))
    with pytest.raises(CorpusError, match="cannot be gzip-compressed"):
        iter_documents([gz_parquet])


def test_bad_arguments(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"id": "1", "text": "x"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="on_error"):
        iter_documents([path], on_error="ignore")
    with pytest.raises(ValueError, match="passage_words"):
        iter_documents([path], passage_words=-1)


def test_explicit_format_overrides_detection(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text('{"id": "1", "text": "x"}\n', encoding="utf-8")
    assert read([path], fmt="jsonl")[0] == [Document("1", "", "x")]
    _, err = read_until_error([path], fmt="dpr-tsv")
    assert "not a DPR passage TSV" in str(err) and f"{path}:1:" in str(err)


def test_invalid_utf8_is_replaced_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl.gz"
    lines = [b'{"id": "1", "text": "caf\xe9 cr\xe8me"}\n', '{"id": "2", "text": "ok \u00e9"}\n'.encode()]
    path.write_bytes(gzip.compress(b"".join(lines)))
    docs, stats = read([path])
    assert docs == [Document("1", "", "caf\ufffd cr\ufffdme"), Document("2", "", "ok \u00e9")]
    assert stats.invalid_utf8 == 2 and stats.error_count == 0
    xml = tmp_path / "dump.xml"
    xml.write_bytes(b"<mediawiki>\n" + _page("T", "1", "na\xefve text").encode("latin-1") + b"</mediawiki>\n")
    docs, stats = read([xml])
    assert docs == [Document("1_0", "T", "na\ufffdve text")] and stats.invalid_utf8 == 1


def test_dpr_tsv_bad_rows(tmp_path: Path) -> None:
    path = tmp_path / "psgs.tsv"
    path.write_text("id\ttext\ttitle\n1\tgood\tT\n2\tonly two\n3\ta\tb\textra\n\t no id\tT\n5\tfine\tT\n",
                    encoding="utf-8")
    docs, stats = read([path])
    assert [d.id for d in docs] == ["1", "5"]
    assert [e.line for e in stats.errors] == [3, 4, 5]
    assert "found 2" in stats.errors[0].message
    _, err = read_until_error([path], on_error="fail")
    assert f"{path}:3:" in str(err)


def test_dpr_tsv_unterminated_quote_reports_the_lines_it_swallowed(tmp_path: Path) -> None:
    path = tmp_path / "psgs.tsv"
    rows = "".join(f"{i}\t{'x' * 100}\tT\n" for i in range(3, 3000))
    path.write_text(f'id\ttext\ttitle\n1\tgood\tT\n2\t"unterminated\tT\n{rows}', encoding="utf-8")
    docs, stats = read([path])
    assert docs[0].id == "1" and stats.skipped == 1
    err = stats.errors[0]
    assert err.line == 3 and "field larger than field limit" in err.message
    first_kept = int(docs[1].id)
    assert f"(lines 3-{first_kept} form this one record)" in err.message


def test_broken_json_array_is_fatal(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('[\n{"id": "1", "text": "a"},\n{"id": "2", "text": "b"}\n{"id": "3"}\n]\n', encoding="utf-8")
    for mode in ("skip", "fail"):
        docs, err = read_until_error([path], on_error=mode)
        assert [d.id for d in docs] == ["1", "2"] and f"{path}:4:" in str(err)
    bad_element = tmp_path / "d.json"
    bad_element.write_text(json.dumps([{"id": "1", "text": "a"}, {"id": "2"}, {"id": "3", "text": "c"}]),
                           encoding="utf-8")
    docs, stats = read([bad_element])
    assert [d.id for d in docs] == ["1", "3"] and stats.skipped == 1
