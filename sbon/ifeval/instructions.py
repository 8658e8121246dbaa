"""Instructions for any prompt: IFEval's instruction ids and arguments, given as JSON by the command line
(``--instructions``), the page's Instructions builder and ``/compare``'s ``instructions`` argument; all
three check them with ``parse_instructions`` and bind them to their own run's copy of the ``ifeval`` reward
(``sbon.rewards.bind_instructions``, ``IFEvalReward.with_instructions``): nothing is registered process-wide.

Accepted forms (JSON text, or the path of a JSON file on the command line):

- a list of objects, each with ``id`` and its arguments, flat or under ``kwargs``:
  ``[{"id": "punctuation:no_comma"}, {"id": "length_constraints:number_words", "num_words": 40,
  "relation": "less than"}]``;
- IFEval's own row: ``{"instruction_id_list": [...], "kwargs": [{...}, ...]}``;
- a list of ids, for instructions without arguments: ``["punctuation:no_comma"]``.
"""

from __future__ import annotations

import collections
import functools
import json
from typing import Any

from ..errors import SBoNError
from .checkers import CHECKERS, build
from .data import SHIPPED_FILE, load_prompts

MAX_INSTRUCTIONS = 25  # IFEval's prompts carry at most 6; one of each type is already more than any asks

# One line per type, for the builder and --help: what the complete response must do.
DESCRIPTIONS: dict[str, str] = {
    "keywords:existence": "include every keyword",
    "keywords:frequency": "use a word at least / less than N times",
    "keywords:forbidden_words": "never use these words",
    "keywords:letter_frequency": "use a letter at least / less than N times",
    "language:response_language": "answer in this language (ISO code, e.g. 'fr')",
    "length_constraints:number_sentences": "at least / less than N sentences",
    "length_constraints:number_paragraphs": "exactly N paragraphs separated by ***",
    "length_constraints:number_words": "at least / less than N words",
    "length_constraints:nth_paragraph_first_word": "N paragraphs (blank lines), paragraph i starting with a word",
    "detectable_content:number_placeholders": "at least N [placeholders] in square brackets",
    "detectable_content:postscript": "end with a postscript starting with a marker (P.S.)",
    "detectable_format:number_bullet_lists": "exactly N markdown bullet points",
    "detectable_format:constrained_response": "answer with 'My answer is yes./no./maybe.'",
    "detectable_format:number_highlighted_sections": "highlight at least N sections with *markdown*",
    "detectable_format:multiple_sections": "N sections, each starting with a marker (SECTION 1 ...)",
    "detectable_format:json_format": "the whole answer is JSON",
    "detectable_format:title": "a title in double angle brackets, <<like this>>",
    "combination:two_responses": "two different answers separated by ******",
    "combination:repeat_prompt": "first repeat the request word for word, then answer",
    "startend:end_checker": "end with this exact phrase",
    "change_case:capital_word_frequency": "at least / less than N words in CAPITALS",
    "change_case:english_capital": "all in English capital letters",
    "change_case:english_lowercase": "all in English lowercase letters",
    "punctuation:no_comma": "no commas at all",
    "startend:quotation": "wrap the whole answer in double quotes",
}

# Arguments a new instruction starts with in the builder: typical values of IFEval's prompts.
EXAMPLE_ARGS: dict[str, dict[str, Any]] = {
    "keywords:existence": {"keywords": ["sea", "wave"]},
    "keywords:frequency": {"keyword": "sea", "frequency": 2, "relation": "at least"},
    "keywords:forbidden_words": {"forbidden_words": ["blue"]},
    "keywords:letter_frequency": {"letter": "s", "let_frequency": 5, "let_relation": "at least"},
    "language:response_language": {"language": "en"},
    "length_constraints:number_sentences": {"num_sentences": 3, "relation": "less than"},
    "length_constraints:number_paragraphs": {"num_paragraphs": 2},
    "length_constraints:number_words": {"num_words": 60, "relation": "less than"},
    "length_constraints:nth_paragraph_first_word": {"num_paragraphs": 2, "nth_paragraph": 1, "first_word": "the"},
    "detectable_content:number_placeholders": {"num_placeholders": 2},
    "detectable_content:postscript": {"postscript_marker": "P.S."},
    "detectable_format:number_bullet_lists": {"num_bullets": 3},
    "detectable_format:number_highlighted_sections": {"num_highlights": 2},
    "detectable_format:multiple_sections": {"section_spliter": "SECTION", "num_sections": 2},
    "combination:repeat_prompt": {"prompt_to_repeat": "the request, word for word"},
    "startend:end_checker": {"end_phrase": "Is there anything else I can help with?"},
    "change_case:capital_word_frequency": {"capital_frequency": 3, "capital_relation": "at least"},
}


@functools.lru_cache(maxsize=1)
def by_frequency() -> tuple[str, ...]:
    """Every instruction type, the most frequent in IFEval's prompts (the shipped file) first."""
    counts = collections.Counter(i for p in load_prompts(SHIPPED_FILE) for i in p.instruction_ids)
    return tuple(sorted(CHECKERS, key=lambda i: (-counts[i], i)))


def parse_instructions(value: Any, where: str = "instructions") -> list[tuple[str, dict]]:
    """(id, arguments) of each instruction in one of the accepted forms (module docstring), every one
    checked; a one-line SBoNError naming the field otherwise."""
    if isinstance(value, str):  # JSON text only: a file is read by the command line (never by the page or the API)
        text = value.strip()
        try:
            value = json.loads(text)
        except ValueError as e:
            raise SBoNError(f"{where}: not JSON ({str(e).split(':')[0]}); give a list such as "
                            f'[{{"id": "punctuation:no_comma"}}]') from None
    if isinstance(value, dict) and "instruction_id_list" in value:
        ids, kwargs = value.get("instruction_id_list"), value.get("kwargs") or [{}] * len(value["instruction_id_list"])
        if not isinstance(ids, list) or not isinstance(kwargs, list) or len(ids) != len(kwargs):
            raise SBoNError(f"{where}: instruction_id_list and kwargs must be lists of the same length")
        value = [{"id": i, "kwargs": k} for i, k in zip(ids, kwargs)]
    if not isinstance(value, list):
        raise SBoNError(f"{where}: expected a list of instructions, got {type(value).__name__}")
    if not value:
        raise SBoNError(f"{where}: empty; add at least one instruction")
    if len(value) > MAX_INSTRUCTIONS:
        raise SBoNError(f"{where}: {len(value)} instructions, at most {MAX_INSTRUCTIONS}")
    return [_one(item, f"{where}[{n}]") for n, item in enumerate(value)]


def _one(item: Any, where: str) -> tuple[str, dict]:
    if isinstance(item, str):
        item = {"id": item}
    if not isinstance(item, dict) or not isinstance(item.get("id"), str):
        raise SBoNError(f"{where}: expected an object with an 'id' (e.g. \"punctuation:no_comma\")")
    kwargs = item.get("kwargs", {k: v for k, v in item.items() if k != "id"})
    if not isinstance(kwargs, dict):
        raise SBoNError(f"{where}.kwargs: expected an object of arguments")
    try:
        build(item["id"], kwargs)
    except SBoNError as e:
        raise SBoNError(f"{where}: {e}") from None
    return item["id"], kwargs


def to_json(instructions: list[tuple[str, dict]]) -> str:
    """The flat list form, one instruction a line: what the builder's box shows."""
    return "[\n" + ",\n".join(json.dumps({"id": i, **k}) for i, k in instructions) + "\n]"
