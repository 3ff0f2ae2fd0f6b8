"""Dataset readers on the real files in ../shared/data and on small fixtures in the published formats of
2WikiMultihopQA, MuSiQue and IIRC; prompt exemplar files."""
from __future__ import annotations

import json

import pytest

from ragserve.rag.corpus import dataset_passages
from ragserve.rag.datasets import DatasetError, read_dataset, sniff_format
from ragserve.rag.prompts import PROMPTS_DIR, PromptBuilder, PromptError, load_exemplars, parse_exemplars
from ragserve.retrieval.searcher import Hit
from tests.conftest import shared


# Small records in the published formats of 2WikiMultihopQA, MuSiQue and IIRC.
TWOWIKI = [{"_id": "a1b2", "type": "compositional", "question": "Who is the father of the director of film X?",
           "context": [["Film X", ["Film X is a 1950 film.", " It was directed by Jane Doe."]],
                       ["Jane Doe", ["Jane Doe is a director.", " Her father is John Doe."]],
                       ["Other", ["Unrelated."]]],
           "supporting_facts": [["Film X", 1], ["Jane Doe", 1]],
           "evidences": [["Film X", "director", "Jane Doe"], ["Jane Doe", "father", "John Doe"]],
           "answer": "John Doe", "answer_id": "Q42"}]
MUSIQUE = [{"id": "2hop__1_2", "question": "Where was the author of Book born?", "answer": "Springfield",
            "answer_aliases": ["Springfield, IL"], "answerable": True,
            "question_decomposition": [{"id": 1, "question": "author of Book", "answer": "A. Writer"}],
            "paragraphs": [{"idx": 0, "title": "Book", "paragraph_text": "Book was written by A. Writer.",
                            "is_supporting": True},
                           {"idx": 1, "title": "A. Writer", "paragraph_text": "A. Writer was born in Springfield.",
                            "is_supporting": True},
                           {"idx": 2, "title": "Noise", "paragraph_text": "Nothing here.", "is_supporting": False}]},
           {"id": "2hop__3_4", "question": "Unanswerable?", "answer": "x", "answer_aliases": [],
            "answerable": False, "paragraphs": []}]
IIRC = [{"title": "Main Article", "text": "Main text linking to Linked Page.",
         "links": [{"target": "Linked Page", "indices": [20, 31]}],
         "questions": [
             {"qid": "q1", "question": "How old was he?",
              "answer": {"type": "value", "answer_value": "53", "answer_unit": "years"},
              "context": [{"passage": "main", "text": "Main text", "indices": [0, 9]},
                          {"passage": "Linked Page", "text": "born 1811", "indices": [0, 9]}]},
             {"qid": "q2", "question": "Who?", "answer": {"type": "span", "answer_spans": [
                 {"text": " Bob Rock ", "passage": "linked page", "type": "answer", "start": 0, "end": 8}]},
              "context": [{"passage": "Linked Page", "text": "Bob Rock", "indices": [0, 8]}]},
             {"qid": "q3", "question": "Did it?", "answer": {"type": "binary", "answer_value": "yes"},
              "context": []},
             {"qid": "q4", "question": "Unknown?", "answer": {"type": "none"}, "context": []}]}]


def test_hotpotqa_original():
    ex = read_dataset(shared("hotpotqa-train100-original", "hotpotqa_train.json"))
    assert len(ex) == 100
    e = ex[0]
    assert e.id == "5a77ec115542992a6e59dff7" and e.answers == ["a spirit"]
    assert e.supporting == ["Alû", "Lilu (mythology)"]
    assert len(e.paragraphs) == 10 and e.paragraphs[0].title == "Demon Dice"
    assert e.paragraphs[0].text.startswith("Demon Dice, originally published as Chaos Progenitus")
    assert sum(len(x.paragraphs) for x in ex) == 99 * 10 + 4


def test_hotpotqa_ircot_and_limit():
    path = shared("hotpotqa-dev500-ircot", "dev_subsampled.jsonl")
    assert sniff_format(path) == "hotpotqa-ircot"
    ex = read_dataset(path, limit=3)
    assert len(ex) == 3
    assert ex[0].answers == ["Chief of Protocol"]
    assert set(ex[0].supporting) == {"Shirley Temple", "Kiss and Tell (1945 film)"}
    all_ex = read_dataset(path)
    assert len(all_ex) == 500 and sum(len(e.supporting) for e in all_ex) == 1000


def test_strategyqa_yes_no():
    ex = read_dataset(shared("strategyqa-train", "strategyqa_train.json"))
    assert len(ex) == 2290 and all(e.yes_no for e in ex)
    assert sum(e.answers == ["yes"] for e in ex) == 1071
    assert ex[0].id == "b8677742616fef051f00"
    # the facts are the question's own untitled paragraphs and its supporting ones (matched by text)
    assert [p.text for p in ex[0].paragraphs] == ex[0].supporting == [
        "Julius Caesar had three children.", "Genghis Khan had sixteen children.",
        "Modern geneticists have determined that out of every 200 men today has DNA that can be traced to "
        "Genghis Khan."]
    assert all(p.title == "" for p in ex[0].paragraphs) and ex[0].gold_paragraphs() == ex[0].paragraphs
    assert sum(len(e.paragraphs) for e in ex) == 6120


def test_nq_open_tsv_with_csv_quoting():
    path = shared("nq-open", "topics.dpr.nq.dev.txt")
    assert sniff_format(path) == "nq-open"
    ex = read_dataset(path)
    assert len(ex) == 8757
    assert ex[0].question == "who sings does he love me with reba" and ex[0].answers == ["Linda Davis"]
    assert len({e.id for e in ex}) == len(ex)


def test_2wiki_with_aliases(tmp_path):
    data = TWOWIKI
    (tmp_path / "dev.json").write_text(json.dumps(data))
    (tmp_path / "id_aliases.json").write_text(
        json.dumps({"Q_id": "Q42", "aliases": ["J. Doe", "Johnny Doe"], "demonyms": []}) + "\n")
    assert sniff_format(tmp_path / "dev.json") == "2wiki"
    (e,) = read_dataset(tmp_path / "dev.json")
    assert e.answers == ["John Doe", "J. Doe", "Johnny Doe"]
    assert e.supporting == ["Film X", "Jane Doe"]
    assert e.paragraphs[0].text == "Film X is a 1950 film. It was directed by Jane Doe."


def test_musique_skips_unanswerable(tmp_path):
    rows = MUSIQUE
    p = tmp_path / "musique_ans_v1.0_dev.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert sniff_format(p) == "musique"
    (e,) = read_dataset(p)
    assert e.answers == ["Springfield", "Springfield, IL"] and e.supporting == ["Book", "A. Writer"]
    assert len(e.paragraphs) == 3


def test_iirc_answer_types(tmp_path):
    data = IIRC
    p = tmp_path / "iirc_dev.json"
    p.write_text(json.dumps(data))
    assert sniff_format(p) == "iirc"
    ex = read_dataset(p)
    assert [e.id for e in ex] == ["q1", "q2", "q3"]
    assert ex[0].answers == ["53", "53 years"] and ex[0].supporting == ["Main Article", "Linked Page"]
    assert ex[1].answers == ["Bob Rock"] and ex[2].yes_no and ex[2].answers == ["yes"]


def test_bad_inputs(tmp_path):
    with pytest.raises(DatasetError, match="not found"):
        read_dataset(tmp_path / "missing.json")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": "1", "question_text": "q"}\n')
    with pytest.raises(DatasetError, match="missing field"):
        read_dataset(bad, "hotpotqa-ircot")
    tsv = tmp_path / "q.tsv"
    tsv.write_text("who\tnot a list\n")
    with pytest.raises(DatasetError, match=r"q.tsv:1"):
        read_dataset(tsv, "nq-open")
    with pytest.raises(DatasetError, match="unknown dataset format"):
        read_dataset(tsv, "squad")
    odd = tmp_path / "odd.txt"
    odd.write_text("just text\n")
    with pytest.raises(DatasetError, match="cannot tell"):
        read_dataset(odd)


def test_dataset_passages_dedupe():
    ex = read_dataset(shared("hotpotqa-dev500-ircot", "dev_subsampled.jsonl"))
    passages = dataset_passages(ex)
    keys = {(p["title"], p["text"]) for p in passages}
    assert len(keys) == len(passages) == 4858
    assert [p["_id"] for p in passages[:3]] == ["p0", "p1", "p2"]


def test_shipped_exemplars_parse_and_end_with_the_answer():
    for name in ("multihop.txt", "strategyqa.txt", "nq.txt"):
        ex = load_exemplars(name)
        assert len(ex) >= 6
        assert all("So the answer is" in e.answer for e in ex)
    assert {f.name for f in PROMPTS_DIR.glob("*.txt")} >= {"multihop.txt", "strategyqa.txt", "nq.txt"}


def test_bad_exemplar_file(tmp_path):
    with pytest.raises(PromptError, match="'Question:' line"):
        parse_exemplars("Question: a\nAnswer: b. So the answer is b.\nExtra line")
    with pytest.raises(PromptError, match="needs a question and an answer"):
        parse_exemplars("Question: a\nAnswer:")
    # a direct answer (no marker) is its own style; a file mixing the two styles is refused
    assert parse_exemplars("Question: a\nAnswer: no marker")[0].answer == "no marker"
    with pytest.raises(PromptError, match="not found"):
        load_exemplars(tmp_path / "nope.txt")


def test_prompt_numbers_passages_and_continues_the_answer():
    pb = PromptBuilder(parse_exemplars("Question: q1\nAnswer: r. So the answer is a1."), passage_words=3)
    hits = [Hit(0, "p0", 1.0, "Title A", "one two three four"), Hit(1, "p1", 0.5, "Title B", "five")]
    p = pb.build("What?", "First step.", hits)
    assert "Question: q1\nAnswer: r. So the answer is a1.\n\n" in p
    assert "[1] Title A: one two three ...\n[2] Title B: five\n" in p
    assert p.endswith("Question: What?\nAnswer: First step.")
    assert pb.build("What?").endswith("Question: What?\nAnswer:") and "Context:" not in pb.build("What?")


def _other_form(records: list, native_lines: bool, path) -> None:
    """Write ``records`` in the form their format does not natively use: one indented JSON array (as HippoRAG
    and KAG ship them) for a JSON-lines format, JSON lines for an array format."""
    if native_lines:
        path.write_text(json.dumps(records, indent=2, ensure_ascii=False), encoding="utf-8")
    else:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


def _load_records(path) -> list:
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if text.lstrip().startswith("[") else [json.loads(x) for x in text.splitlines() if x]


@pytest.mark.parametrize("fmt, source", [
    ("hotpotqa", ("hotpotqa-train100-original", "hotpotqa_train.json")),
    ("hotpotqa-ircot", ("hotpotqa-dev500-ircot", "dev_subsampled.jsonl")),
    ("strategyqa", ("strategyqa-train", "strategyqa_train.json")),
    ("nq-open", ("nq-open", "flashrag_nq_test_sample.jsonl")),
    ("2wiki", TWOWIKI), ("musique", MUSIQUE), ("iirc", IIRC)])
def test_every_format_reads_json_lines_and_a_json_array_alike(tmp_path, fmt, source):
    if isinstance(source, tuple):
        native = shared(*source)
        records = _load_records(native)
    else:
        records = source
        native = tmp_path / "native.json"
        native.write_text(json.dumps(records) if fmt != "musique" else
                          "".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    native_lines = not native.read_text(encoding="utf-8").lstrip().startswith("[")
    other = tmp_path / "other.json"
    _other_form(records, native_lines, other)
    assert sniff_format(native) == sniff_format(other) == fmt
    expected = read_dataset(native, fmt)
    assert expected and read_dataset(other, fmt) == expected == read_dataset(other)


def test_nq_open_json_records():
    path = shared("nq-open", "flashrag_nq_test_sample.jsonl")
    ex = read_dataset(path)
    assert ex[0].id == "test_0" and ex[0].question == "who got the first nobel prize in physics"
    assert ex[0].answers == ["Wilhelm Conrad R\u00f6ntgen"] and ex[2].answers == ["Olivia", "MFSK"]
