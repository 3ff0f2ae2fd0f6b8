"""The ragserve CLI end to end through real processes: index, info, search, batch runs, and its errors."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ragserve.cli import main
from tests.conftest import shared
from tests.serverproc import run_main


def ragserve(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ragserve", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


@pytest.fixture(scope="module")
def wiki_index(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "wiki"
    r = ragserve("index", str(shared("wiki18-100w-passages-sample", "sample_data.jsonl")), "--out", str(out),
                 "--block-size", "256", "--bank-bytes", "400000", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "indexed 1,000 documents" in r.stdout
    return out


def test_info_reports_layout(wiki_index):
    r = ragserve("info", str(wiki_index), "--verify")
    assert r.returncode == 0, r.stderr
    assert "1,000" in r.stdout and "shard_0001" in r.stdout and "checksums verified" in r.stdout
    m = json.loads(ragserve("info", str(wiki_index), "--json").stdout)
    assert m["stats"]["num_docs"] == 1000 and m["layout"]["num_shards"] >= 2


def test_search_prints_and_emits_json(wiki_index):
    r = ragserve("search", "--index", str(wiki_index), "history of the united states", "-k", "3", "--json")
    assert r.returncode == 0, r.stderr
    hits = json.loads(r.stdout)
    assert len(hits) == 3 and hits[0]["score"] >= hits[1]["score"] >= hits[2]["score"]
    assert all(h["text"] and h["id"] for h in hits)
    r = ragserve("search", "--index", str(wiki_index), "zzzzqqq")
    assert r.returncode == 0 and "no document matches" in r.stdout


def test_batch_search_writes_trec_run_matching_single_queries(wiki_index, tmp_path):
    topics = tmp_path / "q.tsv"
    topics.write_text("q1\thistory of the united states\nq2\tfootball club\nq3\tthe\n")
    run = tmp_path / "run.trec"
    r = ragserve("search", "--index", str(wiki_index), "--queries", str(topics), "-k", "5", "--output", str(run))
    assert r.returncode == 0, r.stderr
    lines = [line.split() for line in run.read_text().splitlines()]
    assert {ln[0] for ln in lines} == {"q1", "q2"}  # "the" is all stopwords: no hits
    single = json.loads(ragserve("search", "--index", str(wiki_index), "football club", "-k", "5", "--json").stdout)
    q2 = [ln for ln in lines if ln[0] == "q2"]
    assert [ln[2] for ln in q2] == [h["id"] for h in single]
    assert [ln[3] for ln in q2] == ["1", "2", "3", "4", "5"]
    assert all(float(a[4]) == pytest.approx(h["score"], rel=1e-6) for a, h in zip(q2, single))


def test_output_paths_get_their_folders_or_a_one_line_error(wiki_index, tmp_path):
    # Through the CLI's main in this process: the paths are handled there, and the other tests here prove the
    # real process (seven interpreters importing torch cost ~20 s of the suite on two cores).
    topics = tmp_path / "q.tsv"
    topics.write_text("q1\tfootball club\n")
    run = tmp_path / "runs" / "deep" / "run.trec"  # folders that do not exist yet
    r = run_main("search", "--index", str(wiki_index), "--queries", str(topics), "-k", "3", "--output", str(run))
    assert r.returncode == 0, r.stderr
    assert len(run.read_text().splitlines()) == 3
    synth = tmp_path / "corpora" / "new" / "s.jsonl"
    r = run_main("corpus", "synth", "--docs", "20", "--out", str(synth))
    assert r.returncode == 0, r.stderr
    assert len(synth.read_text().splitlines()) == 20
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for args, message in [
        (["search", "--index", str(wiki_index), "--queries", str(topics), "--output", str(tmp_path)], "is a directory"),
        (["search", "--index", str(wiki_index), "--queries", str(topics), "--output", f"{blocker}/r.trec"],
         "cannot create the folder"),
        (["corpus", "synth", "--docs", "5", "--out", str(tmp_path)], "is a directory"),
        (["corpus", "synth", "--docs", "5", "--out", f"{blocker}/s.jsonl"], "cannot create the folder"),
        (["index", str(synth), "--out", f"{blocker}/idx", "--quiet"], "cannot write the index"),
    ]:
        r = run_main(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


@pytest.mark.parametrize("args, message", [
    (["index", "/no/such/file.jsonl", "--out", "X"], "does not exist"),
    (["search", "--index", "/no/such/index", "q"], "no such index"),
    (["search", "--index", "{idx}", "q", "-k", "0"], "-k must be between"),
    (["search", "--index", "{idx}", "q", "-k", "10001"], "-k must be between"),
    (["search", "--index", "{idx}", "   "], "empty"),
    (["search", "--index", "{idx}"], "either a QUERY or --queries"),
    (["search", "--index", "{idx}", "q", "--backend", "quantum"], "unknown backend"),
    (["search", "--index", "{idx}", "q", "--b", "2"], "b must be between"),
    (["info", "{tmp}"], "not an index"),
    (["search", "--index", "{bad}", "q"], "is a file, not an index directory"),
    (["index", "{bad}", "--out", "{tmp}/o", "--on-error", "fail", "--quiet"], "bad.jsonl"),
])
def test_errors_are_one_clear_line_and_exit_2(wiki_index, tmp_path, args, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "contents": "fine"}\n{not json\n')
    args = [a.format(idx=wiki_index, tmp=tmp_path, bad=bad) for a in args]
    r = ragserve(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_index_skips_malformed_records_and_reports_them(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "contents": "fine words"}\n{not json\n{"id": "3", "contents": "more words"}\n')
    r = ragserve("index", str(bad), "--out", str(tmp_path / "o"), "--quiet")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("indexed 2 documents into")
    assert lines[1] == "1 input problem(s): 1 malformed record(s) skipped, 0 truncated file(s)"
    assert lines[2].startswith(f"  {bad}:2: broken JSON") and len(lines) == 3


def test_truncated_dump_indexes_what_was_read_and_warns(tmp_path):
    data = shared("enwiki-xml-dump-sample", "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2").read_bytes()
    cut = tmp_path / "cut-pages-articles.xml.bz2"
    cut.write_bytes(data[: len(data) // 2])
    r = ragserve("index", str(cut), "--out", str(tmp_path / "o"), "--quiet")
    assert r.returncode == 0, r.stderr
    assert "ends early" in r.stderr
    lines = r.stdout.splitlines()  # the count line says what the listed line is: no "0 skipped" then a skip
    assert lines[1] == "1 input problem(s): 0 malformed record(s) skipped, 1 truncated file(s)"
    assert lines[2].startswith(f"  {cut}:") and "truncated" in lines[2] and len(lines) == 3
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["source"]["truncated"] == [str(cut)] and m["stats"]["num_docs"] > 100
    r = ragserve("index", str(cut), "--out", str(tmp_path / "o2"), "--quiet", "--on-error", "fail")
    assert r.returncode == 2 and "cut-pages-articles.xml.bz2" in r.stderr and "truncated" in r.stderr
    assert "were read" not in r.stderr  # nothing is kept under --on-error fail
    assert not (tmp_path / "o2").exists()


def test_hits_without_a_title_print_no_empty_title_column(tmp_path, capsys):
    corpus = tmp_path / "untitled.jsonl"  # BEIR ArguAna's layout: an empty title on every record
    corpus.write_text('{"_id": "d1", "title": "", "text": "nuclear power is dangerous"}\n'
                      '{"_id": "d2", "title": "Wind", "text": "wind power is clean"}\n')
    assert main(["index", str(corpus), "--out", str(tmp_path / "i"), "--quiet", "--workers", "1"]) == 0
    capsys.readouterr()
    assert main(["search", "--index", str(tmp_path / "i"), "power"]) == 0
    out = capsys.readouterr().out
    heads = {line.split()[2]: line for line in out.splitlines() if not line.startswith(" " * 6)}
    assert heads["d1"].endswith("  d1") and heads["d2"].endswith("  d2  Wind")


def test_gpu_backend_without_a_gpu_gives_the_command_line_hint(wiki_index):
    r = ragserve("search", "--index", str(wiki_index), "football", "--backend", "gpu")
    if r.returncode == 0:
        pytest.skip("a GPU is usable here")
    assert r.returncode == 2 and "--device cpu" in r.stderr and "device='cpu'" not in r.stderr, r.stderr


def test_indexing_error_is_not_written_onto_the_progress_bar(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "contents": "fine"}\n{not json\n')
    r = ragserve("index", str(bad), "--out", str(tmp_path / "o"), "--on-error", "fail")  # bars on
    assert r.returncode == 2
    at = r.stderr.index("ragserve index: error:")
    before, after = r.stderr[:at], r.stderr[at:]
    # The bar (drawn with carriage returns) is erased first, so the message starts on a clean line...
    assert before == "" or before.endswith("\n") or (before.endswith("\r") and not before.split("\r")[-2].strip())
    # ...and no stale bar is redrawn after it.
    assert after.count("\n") == 1 and after.endswith("\n") and "%|" not in after


def test_format_names_are_the_readmes_and_argparse_errors_are_one_line(capsys):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## Input formats"):].split("\n\n")[1]
    names = [row.split("|")[1].strip().strip("`") for row in table.splitlines()[2:]]
    with pytest.raises(SystemExit):
        main(["index", "--help"])
    assert "{auto," + ",".join(names) + "}" in capsys.readouterr().out
    for name in names:  # accepted: the run gets past argument parsing to the missing input
        assert main(["index", "/no/such/corpus", "--out", "/no/such/x", "--format", name]) == 2
        assert "does not exist" in capsys.readouterr().err, name
    for args in (["index", "c.xml", "--out", "x", "--format", "xml"], ["search", "q"],
                 ["corpus", "synth", "--docs", "x"], ["nosuchcommand"]):
        with pytest.raises(SystemExit) as exit_:
            main(args)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and len(err.splitlines()) == 1, (args, err)
        assert "error:" in err and "--help'" in err and "usage:" not in err
