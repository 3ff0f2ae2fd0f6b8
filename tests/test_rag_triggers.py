"""Triggers and query formulation on hand-made probabilities and attention maps with known right answers."""
from __future__ import annotations

import numpy as np
import pytest

from ragserve.rag.dragin import (attention_received, group_tokens, qfs_select, qfs_word_attention, rind_detect,
                                 rind_scores)
from ragserve.rag.flare import flare_fires, masked_query
from ragserve.rag.text import is_content_word, split_sentences, words


def spans_of(text: str, pieces: list[str]) -> list[tuple[int, int]]:
    """Token spans for ``pieces`` that concatenate to ``text``."""
    assert "".join(pieces) == text
    out, pos = [], 0
    for p in pieces:
        out.append((pos, pos + len(p)))
        pos += len(p)
    return out


# -- FLARE -------------------------------------------------------------------------------------

def test_flare_fires_only_below_theta():
    assert not flare_fires(np.array([0.95, 0.81, 0.99]), 0.8)
    assert flare_fires(np.array([0.95, 0.79, 0.99]), 0.8)
    assert not flare_fires(np.array([0.8, 0.8]), 0.8)  # "below" is strict
    assert not flare_fires(np.array([]), 0.8)
    assert flare_fires(np.array([0.5]), 1.0) and not flare_fires(np.array([0.5]), 0.0)


def test_masked_query_drops_low_probability_words_whole():
    text = " Paris is the capital of Franconia."
    pieces = [" Paris", " is", " the", " capital", " of", " Fran", "con", "ia", "."]
    probs = np.array([0.9, 0.95, 0.99, 0.3, 0.97, 0.9, 0.2, 0.9, 0.99])
    q = masked_query(text, spans_of(text, pieces), probs, beta=0.4)
    # "capital" (0.3) and "Franconia" (one sub-token at 0.2) are masked; punctuation never enters the query
    assert q == "Paris is the of"
    assert masked_query(text, spans_of(text, pieces), probs, beta=0.0) == "Paris is the capital of Franconia"
    assert masked_query(text, spans_of(text, pieces), probs, beta=1.0) == ""


# -- DRAGIN: RIND ------------------------------------------------------------------------------

def test_attention_received_is_max_over_later_positions():
    a = np.array([[1.0, 0, 0, 0],
                  [0.6, 0.4, 0, 0],
                  [0.1, 0.7, 0.2, 0],
                  [0.3, 0.1, 0.5, 0.1]])
    np.testing.assert_allclose(attention_received(a), [0.6, 0.7, 0.5, 0.0])


def test_group_tokens_maps_subword_tokens_to_words():
    text = " Marie Curie won."
    pieces = [" Mar", "ie", " Cur", "ie", " won", "."]
    spans, members = group_tokens(text, spans_of(text, pieces))
    assert [text[s:e] for s, e in spans] == ["Marie", "Curie", "won", "."]
    assert members == [[0, 1], [2, 3], [4], [5]]


def test_rind_scores_entropy_times_scaled_attention():
    # two words in one sentence: attention mass 0.3 vs 0.1 -> scaled to 1.5 and 0.5 (mean 1)
    ent = np.array([2.0, 4.0, 1.0])
    att = np.array([0.1, 0.2, 0.1])
    scores = rind_scores(ent, att, [[0, 1], [2]], [0, 0])
    np.testing.assert_allclose(scores, [3.0 * 1.5, 1.0 * 0.5])


def test_rind_scaling_is_per_sentence():
    ent = np.ones(4)
    att = np.array([0.5, 0.5, 0.1, 0.3])
    scores = rind_scores(ent, att, [[0], [1], [2], [3]], [0, 0, 1, 1])
    np.testing.assert_allclose(scores, [1.0, 1.0, 0.5, 1.5])


def test_rind_detect_first_sentence_with_content_word_over_threshold():
    scores = np.array([0.2, 3.0, 0.1, 0.5, 2.0, 1.5])
    content = [True, False, True, True, True, True]  # word 1 is a stopword: its 3.0 must not fire
    sentence = [0, 0, 0, 1, 1, 1]
    assert rind_detect(scores, content, sentence, 1.0, set()) == (1, [4, 5])
    assert rind_detect(scores, content, sentence, 2.5, set()) is None
    # scanning stops at the sentence stating the answer
    assert rind_detect(scores, content, sentence, 1.0, {1}) is None
    assert rind_detect(scores, [True] * 6, sentence, 1.0, set()) == (0, [1])


def test_rind_end_to_end_on_handmade_attention_picks_uncertain_content_word():
    text = "The river is the Danube. It flows east."
    pieces = ["The", " river", " is", " the", " Dan", "ube", ".", " It", " flows", " east", "."]
    tok_spans = spans_of(text, pieces)
    spans, members = group_tokens(text, tok_spans)
    sents = split_sentences(text)
    word_sentence = [next(i for i, (a, b) in enumerate(sents) if a <= s < b) for s, _ in spans]
    n = len(pieces)
    attn = np.tril(np.full((n, n), 0.05))
    attn[6:, 4] = 0.6  # later tokens look back at "Dan"
    ent = np.full(n, 0.5)
    ent[4], ent[5] = 3.0, 2.0  # the model was unsure while writing "Danube"
    content = [is_content_word(text[s:e]) for s, e in spans]
    scores = rind_scores(ent, attention_received(attn), members, word_sentence)
    s_idx, hits = rind_detect(scores, content, word_sentence, 1.0, set())
    assert s_idx == 0 and [text[spans[w][0]:spans[w][1]] for w in hits] == ["Danube"]


# -- DRAGIN: QFS -------------------------------------------------------------------------------

def test_qfs_word_attention_reads_rows_that_produced_the_uncertain_word():
    # tokens: 0 "Who" 1 " founded" 2 " Apple" 3 "?" 4 " Steve" ; uncertain word = token 4
    attn = np.zeros((5, 5))
    attn[3, :4] = [0.1, 0.2, 0.6, 0.1]  # the state that produced token 4 looks mostly at "Apple"
    attn[4, :5] = [0.9, 0.0, 0.0, 0.0, 0.1]  # the uncertain token's own row must not be used
    members = [[0], [1], [2], [3], [4]]
    w = qfs_word_attention(attn, members, [4])
    np.testing.assert_allclose(w, [0.1, 0.2, 0.6, 0.1, 0.0])


def test_qfs_select_keeps_top_n_content_words_in_text_order():
    texts = ["Who", "founded", "the", "company", "Apple", "in", "1976", "?"]
    scores = np.array([0.9, 0.3, 0.8, 0.1, 0.5, 0.7, 0.4, 0.6])
    cand = [is_content_word(t) for t in texts]
    assert cand == [False, True, False, True, True, False, True, False]
    assert qfs_select(texts, scores, cand, 2) == "Apple 1976"
    assert qfs_select(texts, scores, cand, 3) == "founded Apple 1976"
    assert qfs_select(texts, scores, cand, 10) == "founded company Apple 1976"


def test_sentence_split_and_words():
    text = " Dr. Smith met J. R. R. Tolkien in 1950. He was 3.5 m tall! Was he? yes."
    sents = [text[a:b] for a, b in split_sentences(text)]
    assert sents == ["Dr. Smith met J. R. R. Tolkien in 1950.", "He was 3.5 m tall!", "Was he? yes."]
    t2 = "It's a stop-gap, isn't it?"
    assert [t2[s:e] for s, e in words(t2)] == ["It's", "a", "stop-gap", ",", "isn't", "it", "?"]


@pytest.mark.parametrize("word,expected", [("Paris", True), ("the", False), ("1976", True), ("The", False),
                                           (",", False), ("isn't", False), ("founded", True)])
def test_content_words(word, expected):
    assert is_content_word(word) is expected
