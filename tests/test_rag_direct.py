"""Direct-answer prompts for small base models, the oracle row, the per-model trigger profile and DRAGIN's
reading of a line up to its newline: the tiny random Llama for the mechanics, gemma-3-270m once (slow) for
answers that really end at the newline and thresholds that really come from the profile."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from ragserve.cli import main
from ragserve.rag.base import MethodError
from ragserve.rag.dragin import Dragin
from ragserve.rag.generator import Generation
from ragserve.rag.methods import METHOD_NAMES, build_method
from ragserve.rag.metrics import first_line_answer
from ragserve.rag.profiles import PROFILES_FILE, load_profiles, model_key, profile_for
from ragserve.rag.prompts import PromptBuilder, PromptError, load_exemplars, parse_exemplars
from ragserve.retrieval.searcher import Hit
from tests import rag_support as S
from tests.conftest import shared

GEMMA_SHAPE = SimpleNamespace(model_type="gemma3_text", hidden_size=640, num_hidden_layers=18)


@pytest.fixture(scope="module", autouse=True)
def _threads():
    with S.one_torch_thread():
        yield


def test_direct_exemplars_make_a_direct_prompt_and_mixed_styles_are_refused():
    for name, yes_no in (("multihop-direct.txt", False), ("strategyqa-direct.txt", True)):
        pb = PromptBuilder(load_exemplars(name), yes_no=yes_no)
        assert pb.direct and pb.source == name
        prompt = pb.build("Who wrote Hamlet?")
        # every exemplar answer is one line, so the model learns to stop at the newline
        assert all("\n" not in e.answer and "answer is" not in e.answer for e in pb.exemplars)
        assert prompt.endswith("Question: Who wrote Hamlet?\nAnswer:") and "step by step" not in prompt
    assert not PromptBuilder(load_exemplars("multihop.txt")).direct
    # exemplars with passages: shown in the layout the question's passages get, and no note is needed
    pb = PromptBuilder(load_exemplars("multihop-direct.txt"))
    assert all(e.context for e in pb.exemplars)
    prompt = pb.build("Q?", passages=[Hit(1, "d1", 1.0, "Some Title", "some text")])
    assert "Context:\n[1] Titanic (1997 film): Titanic is" in prompt
    assert prompt.endswith("Context:\n[1] Some Title: some text\nQuestion: Q?\nAnswer:")
    # a cot file keeps its note between the passages and the question
    cot = PromptBuilder(load_exemplars("multihop.txt")).build("Q?", passages=[Hit(1, "d1", 1.0, "T", "x")])
    assert "[1] T: x\nAnswer in the same format" in cot
    with pytest.raises(PromptError, match="passage lines"):
        parse_exemplars("Context:\nQuestion: a?\nAnswer: b")
    with pytest.raises(PromptError, match="mixes"):
        parse_exemplars("Question: a?\nAnswer: b\n\nQuestion: c?\nAnswer: x. So the answer is d.")


def test_first_line_answer():
    assert first_line_answer(" James Cameron.\nQuestion: next") == "James Cameron"
    assert first_line_answer("\n\n\"Liverpool\"\n") == "Liverpool"
    assert first_line_answer("") == ""


def test_oracle_is_eval_only_and_shows_the_gold_paragraphs(tmp_path, capsys):
    assert "oracle" not in METHOD_NAMES  # the server cannot offer it: a question over HTTP has no gold
    out, summary = tmp_path / "oracle.jsonl", tmp_path / "oracle.json"
    args = ["eval", "--dataset", str(shared(*S.HOTPOT_IRCOT)), "--method", "oracle", "--model", str(S.tiny_lm()),
            "--device", "cpu", "--limit", "2", "--out", str(out), "--max-new-tokens", "8", "--quiet",
            "--prompt-file", "multihop-direct.txt", "--summary-json", str(summary)]
    assert main(args) == 0  # no --index: nothing is retrieved
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    ex = S.hotpot_examples()[:2]
    for row, e in zip(rows, ex):
        assert row["retrievals"] == 0 and row["support_recall"] is None
        (gen,) = [s for s in row["steps"] if s["kind"] == "generate"]
        assert gen["prompt_tokens"] > 200  # two gold paragraphs in the prompt
        # the prediction is the first line of the output, not asked for separately
        assert row["prediction"] == first_line_answer(row["output"])
    s = json.loads(summary.read_text())
    assert s["method"] == "oracle" and s["prompt"] == "multihop-direct.txt" and s["support_recall"] is None

    oracle = build_method("oracle", S.generator(), PromptBuilder(load_exemplars("multihop-direct.txt")),
                          max_new_tokens=4)
    gold = [(p.title, p.text) for p in ex[0].gold_paragraphs()]
    assert {t for t, _ in gold} == set(ex[0].supporting)
    _, trace = oracle.answer(ex[0].question, gold)
    prompt = oracle.prompts.build(ex[0].question, "", [Hit(-1, "g", 1.0, t, x) for t, x in gold])
    assert all(t in prompt for t, _ in gold)
    assert trace.steps[0].prompt_tokens == len(S.generator().tokenizer(prompt).input_ids)
    with pytest.raises(MethodError, match="gold paragraphs"):
        oracle.answer(ex[0].question)


def test_profile_is_keyed_by_model_shape_and_read_by_eval(tmp_path):
    assert model_key(GEMMA_SHAPE) == "gemma3_text-640x18"
    prof = load_profiles()[model_key(GEMMA_SHAPE)]
    for family in ("hotpotqa", "strategyqa"):
        got = profile_for(GEMMA_SHAPE, family)
        assert got["prompt"] == prof[family]["prompt"] and got["prompt"].endswith("-direct.txt")
        assert prof[family]["chosen_on"]  # the values say where they were chosen (or that they were not)
    got = profile_for(GEMMA_SHAPE, "hotpotqa")
    assert 0 < got["flare_theta"] <= 1 and got["dragin_threshold"] == prof["hotpotqa"]["dragin_threshold"]
    sqa = profile_for(GEMMA_SHAPE, "strategyqa")  # tuned on its own slice: the published values held
    assert (sqa["flare_theta"], sqa["dragin_threshold"]) == (0.8, 0.75)
    # another model gets no profile: DRAGIN's published settings apply
    assert profile_for(SimpleNamespace(model_type="llama", hidden_size=64, num_hidden_layers=2), "hotpotqa") == {}
    custom = tmp_path / "p.json"
    custom.write_text(json.dumps({"llama-64x2": {"hotpotqa": {"flare_theta": 0.3, "other": 1}}}))
    assert profile_for(SimpleNamespace(model_type="llama", hidden_size=64, num_hidden_layers=2), "hotpotqa",
                       custom) == {"flare_theta": 0.3}
    assert PROFILES_FILE.is_file()


def test_dragin_reads_a_finished_line_up_to_its_newline(monkeypatch):
    """RIND's attention pass over a line that ended at a newline includes that newline, so the line's last word
    (a one-line direct answer's, often the answer itself) is attended by a later token; without it the last word
    scores 0 and could never trigger retrieval."""
    gen = S.generator()
    ids, text, spans = gen.encode(" Paris London film")
    if ids and ids[0] == gen.bos_id:  # a Generation holds generated tokens only
        ids, spans = ids[1:], spans[1:]
    base = dict(text=text, token_ids=ids, spans=spans, logprobs=np.zeros(len(ids)), entropies=np.ones(len(ids)),
                tokens_generated=len(ids), prompt_tokens=1)
    d = Dragin(gen, PromptBuilder(load_exemplars("multihop-direct.txt")), object(), threshold=-1.0)
    seen = []
    real = gen.attention
    monkeypatch.setattr(gen, "attention", lambda x: seen.append(list(x)) or real(x))
    rec = {stop: d.rind(Generation(stop=stop, **base))[1] for stop in ("length", "newline")}
    newline = gen.tokenizer("\n", add_special_tokens=False).input_ids
    lead = [gen.bos_id] if gen.bos_id is not None else []
    assert seen == [lead + ids, lead + ids + newline]
    for r in rec.values():  # every word is a content word above -1
        assert r["fired"] and r["words"] == text.split()
    if len(gen.tokenizer(" film", add_special_tokens=False).input_ids) == 1:
        assert rec["length"]["scores"][-1] == 0.0  # nothing after the last token attends to it


@pytest.mark.slow
def test_gemma_direct_answers_end_at_newline_with_profile_thresholds(gemma_dir, tmp_path):
    """The real base model: with the profile's direct prompt every answer is one line (generation stops at its
    newline), and FLARE/DRAGIN run with the profile's thresholds when no flag is given."""
    prof = profile_for(GEMMA_SHAPE, "hotpotqa")
    for method, key in (("flare", "flare_theta"), ("dragin", "dragin_threshold")):
        out, summary = tmp_path / f"{method}.jsonl", tmp_path / f"{method}.json"
        assert main(["eval", "--dataset", str(shared(*S.HOTPOT_IRCOT)), "--method", method, "--model",
                     str(gemma_dir), "--index", str(S.hotpot_index()), "--device", "cpu", "--threads", "1",
                     "--limit", "1", "--out", str(out), "--summary-json", str(summary), "--quiet"]) == 0
        s = json.loads(summary.read_text())
        assert s["prompt"] == prof["prompt"] and s[key] == prof[key]
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(rows) == 1  # one question a method; every generation step of its loop is checked
        for row in rows:
            gens = [st for st in row["steps"] if st["kind"] == "generate"]
            assert gens and all(st["stop"] in ("newline", "eos") for st in gens)
            assert row["prediction"] and "\n" not in row["output"]
