"""Partial verdicts: what an unfinished response already settles, per IFEval instruction type."""

import pytest

from sbon.ifeval.checkers import OPEN, SATISFIED, VIOLATED, build
from test_ifeval_reference import CASES

LT, AL = "less than", "at least"


def partial(instruction_id, kwargs, text):
    return build(instruction_id, kwargs).partial(text)


@pytest.mark.parametrize("instruction_id,kwargs,response,expected", CASES,
                         ids=[f"{c[0].split(':')[1]}-{i}" for i, c in enumerate(CASES)])
def test_a_settled_prefix_agrees_with_the_final_check(instruction_id, kwargs, response, expected):
    """Soundness on every prefix of every reference case: 'satisfied' only where the full response passes,
    'violated' only where it fails."""
    ins = build(instruction_id, kwargs)
    assert response  # every prefix, from the empty one to the whole response
    for end in range(len(response) + 1):
        status = ins.partial(response[:end]).status
        assert status in (SATISFIED, VIOLATED, OPEN)
        if status != OPEN:
            assert (status == SATISFIED) == expected, (end, response[:end])


def test_reference_cases_settle_early_often():
    """The partial verdicts are not all 'open': many reference cases are settled before their end."""
    settled = sum(build(i, k).partial(r[:len(r) * 3 // 4]).status != OPEN for i, k, r, _ in CASES)
    assert settled >= 20


CASES_PARTIAL = [
    # (id, kwargs, partial text, status, words in the reason, span text)
    ("punctuation:no_comma", {}, "Across the sea, the ship", VIOLATED, "comma at ‘sea, the’", ","),
    ("punctuation:no_comma", {}, "Across the sea the ship", OPEN, "no comma", None),
    ("change_case:english_lowercase", {}, "all fine until Here", VIOLATED, "not lowercase", "H"),
    ("change_case:english_lowercase", {}, "all fine so far", OPEN, "lowercase", None),
    ("change_case:english_capital", {}, "ALL LOUD but", VIOLATED, "not capitals", "b"),
    ("length_constraints:number_words", {"num_words": 3, "relation": LT}, "one two three four", VIOLATED,
     "fewer than 3", "three"),
    ("length_constraints:number_words", {"num_words": 3, "relation": LT}, "one two", OPEN, "words: 2", "two"),
    ("length_constraints:number_words", {"num_words": 3, "relation": AL}, "one two three", SATISFIED, "words: 3",
     "three"),
    ("keywords:forbidden_words", {"forbidden_words": ["house"]}, "a house is", VIOLATED, "forbidden ‘house’", "house"),
    ("keywords:forbidden_words", {"forbidden_words": ["house"]}, "a house", OPEN, "no forbidden", None),  # 'houses'?
    ("keywords:existence", {"keywords": ["sea", "ship"]}, "the ship on the sea", SATISFIED, "all keywords", "sea"),
    ("keywords:existence", {"keywords": ["sea", "ship"]}, "the ship", OPEN, "‘sea’ not written yet", None),
    ("keywords:frequency", {"keyword": "sea", "frequency": 2, "relation": LT}, "sea sea", VIOLATED, "less than 2",
     "sea"),
    ("keywords:frequency", {"keyword": "sea", "frequency": 2, "relation": AL}, "sea sea", SATISFIED, "at least 2",
     "sea"),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": LT}, "zz", VIOLATED, "× 2", None),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": LT}, "One. Two. Thr", VIOLATED,
     "ended sentences: 2", "Two."),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": AL}, "One. Two.", OPEN,
     "ended sentences: 1", "One."),  # 'Two.' may still become 'Two.5'
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "[a] and [b", OPEN, "1 so far", "[a]"),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "[a] and [b]", SATISFIED, "2", "[b]"),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Bye.\nP.S. more", SATISFIED, "postscript",
     "\nP.S. more"),
    ("detectable_format:number_bullet_lists", {"num_bullets": 1}, "* a\n* b\n", VIOLATED, "2 bullet points already",
     "* b"),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* a\n* b", OPEN, "1 bullet points so far", None),
    ("detectable_format:constrained_response", {}, "My answer is yes. Because", SATISFIED, "My answer is yes.",
     "My answer is yes."),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 1}, "a *b* c", SATISFIED, "sections: 1",
     "*b*"),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2},
     "Section 1\nx\nSection 2\ny", SATISFIED, "sections: 2", "\nSection 2\n"),
    ("detectable_format:json_format", {}, "Sure! {", VIOLATED, "not JSON", "S"),
    ("detectable_format:json_format", {}, '  {"a": ', OPEN, "complete response", None),
    ("detectable_format:title", {}, "<<Ode>> to", SATISFIED, "title", "<<Ode>>"),
    ("detectable_format:title", {}, "<<Ode", OPEN, "no <<title>> yet", None),
    ("combination:two_responses", {}, "a\n******\nb\n******\nc\n******", VIOLATED, "3 responses already", None),
    ("combination:two_responses", {}, "a\n******\n\n******\nc", VIOLATED, "empty response", None),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "  Say h", OPEN, "repeating the request", None),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "Say ho", VIOLATED, "differs", "o"),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "say hi. Hi!", SATISFIED, "word for word", None),
    ("startend:end_checker", {"end_phrase": "Bye."}, "Bye.", OPEN, "must end with ‘Bye.’", None),
    ("startend:quotation", {}, ' Hi "', VIOLATED, "not ‘\"’", "H"),
    ("startend:quotation", {}, ' "Hi', OPEN, "must end", None),
    ("language:response_language", {"language": "en"}, "Hello", OPEN, "complete response", None),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": LT}, "NO WAY IS", VIOLATED,
     "CAPITAL words: 2", "WAY"),  # 'IS' may still become 'ISland'
    ("length_constraints:number_paragraphs", {"num_paragraphs": 1}, "a\n***\nb\n***\nc", VIOLATED,
     "2 paragraphs already", None),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 1, "first_word": "so"},
     "Well then.\n\nMore", VIOLATED, "starts with ‘well’", None),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 1, "first_word": "so"},
     "So then.\n\nMore", OPEN, "1 paragraphs ended", None),
]


@pytest.mark.parametrize("instruction_id,kwargs,text,status,reason,span_text", CASES_PARTIAL,
                         ids=[f"{c[0].split(':')[1]}-{c[3]}-{i}" for i, c in enumerate(CASES_PARTIAL)])
def test_partial_verdict(instruction_id, kwargs, text, status, reason, span_text):
    out = partial(instruction_id, kwargs, text)
    assert out.status == status, out
    assert reason in out.reason, out
    if span_text is not None:
        assert out.span is not None and text[out.span[0]:out.span[1]] == span_text, out


def test_every_type_has_a_partial_case():
    from sbon.ifeval.checkers import CHECKERS

    assert {c[0] for c in CASES_PARTIAL} == set(CHECKERS)


def test_letter_frequency_counts_a_non_letter_as_given():
    """The reference draws a random letter for '#' (one IFEval prompt asks for it); we count '#'."""
    ins = build("keywords:letter_frequency", {"letter": "#", "let_frequency": 2, "let_relation": "at least"})
    assert ins.check("# one\n# two") and not ins.check("# one only, no other hash")
