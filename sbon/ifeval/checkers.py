"""IFEval's 25 verifiable instructions: a final check that agrees with Google's reference checker,
and a partial verdict on an unfinished response.

The final check re-implements ``check_following`` of google-research ``instruction_following_eval/
instructions.py`` (Zhou et al. 2023, Apache-2.0), rule for rule; tests/test_ifeval_reference.py holds
the reference's own test cases. Each check also says why, and where: a short reason and the character
span that decided it, so a person can verify the reward.

The partial verdict is for a response still being generated; the final text will be this text with more
appended. ``violated``: no continuation can pass (a comma is already written); ``satisfied``: no
continuation can fail (the keyword is already there); ``open``: it depends on what comes next. Only
facts that appending cannot undo are used: counts that can only grow ("at least N" is settled once
reached, "less than N" is lost once reached, "exactly N" is lost once passed), characters already
written, and structure before the last separator. A match that touches the end of the text is not
settled (``house`` may still become ``houses``).
"""

from __future__ import annotations

import collections
import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from ..errors import SBoNError
from . import text as T

SATISFIED, VIOLATED, OPEN = "satisfied", "violated", "open"
PASS, FAIL = "pass", "fail"
RELATIONS = ("less than", "at least")  # IFEval's two comparisons


@dataclass(frozen=True)
class Outcome:
    """One checker's answer before it becomes a Verdict."""
    status: str = field(metadata={"help": "pass/fail (final) or satisfied/violated/open (partial)"})
    reason: str = field(metadata={"help": "a short human reason, e.g. 'comma at ‘sea, the’'"})
    span: tuple[int, int] | None = field(default=None, metadata={"help": "(start, end) of the deciding text"})


def snippet(text: str, start: int, end: int, context: int = 1) -> str:
    """The deciding text with ``context`` words either side, quoted, on one line: ‘sea, the’."""
    left = re.search(r"(?:\S*\s*){0,%d}$" % context, text[:start]).group() if context else ""
    right = re.match(r"(?:\s*\S*){0,%d}" % context, text[end:]).group() if context else ""
    quoted = " ".join((left + text[start:end] + right).split())
    return "‘" + (quoted if len(quoted) <= 60 else quoted[:57] + "...") + "’"


def _compile(pattern: str) -> re.Pattern:
    """IFEval searches keywords as regular expressions (case-insensitive); a keyword that is not a valid
    expression is searched literally instead of failing."""
    try:
        return re.compile(pattern, re.IGNORECASE)
    except re.error:
        return re.compile(re.escape(pattern), re.IGNORECASE)


EXACTLY = "exactly"


@dataclass(frozen=True)
class Count:
    """A count an unfinished response has reached, and what its complete response needs."""
    count: int = field(metadata={"help": "events so far that appending cannot undo (words, commas, bullets ...)"})
    relation: str = field(metadata={"help": "'at least', 'less than' or 'exactly'"})
    n: int = field(metadata={"help": "the target of the complete response's count"})


def _compare(count: int, relation: str, n: int) -> bool:
    return count < n if relation == RELATIONS[0] else count >= n


def _count_partial(count: int, relation: str, n: int, what: str, span=None) -> Outcome:
    """A count that can only grow as text is appended: 'at least n' is settled once reached,
    'less than n' is lost once reached, both are open before."""
    if count >= n:
        status = SATISFIED if relation == RELATIONS[1] else VIOLATED
        return Outcome(status, f"{what} {count}, {relation} {n} required", span)
    return Outcome(OPEN, f"{what} {count} so far, {relation} {n} required", span)


def _count_final(count: int, relation: str, n: int, what: str, span=None) -> Outcome:
    ok = _compare(count, relation, n)
    return Outcome(PASS if ok else FAIL, f"{what} {count}, {relation} {n} required", span)


def _complete_lines(text: str) -> str:
    """The text up to its last line break: lines before it are complete."""
    return text[:max(0, text.rfind("\n"))]


class Instruction:
    """One instruction with its arguments. Subclasses set ``id``, ``args`` (kwarg name -> type) and
    implement ``final`` (the reference check) and ``partial``."""
    id: ClassVar[str]
    args: ClassVar[dict[str, type]] = {}
    optional: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, **kwargs: Any):
        self.kwargs = kwargs
        self.setup(**kwargs)

    def setup(self, **kwargs: Any) -> None:
        """Normalize arguments the way the reference's build_description does."""

    def final(self, text: str) -> Outcome:
        raise NotImplementedError

    def partial(self, text: str) -> Outcome:
        return Outcome(OPEN, "decided by the complete response")

    def progress(self, text: str) -> list[Count] | None:
        """How far an unfinished response has come, as counts that can only grow, each with the target
        its complete response must meet (all of them); None where no count tells (JSON, language).
        ``sbon.ifeval.progress`` turns them into the probability of following the instruction."""
        return None

    def evidence(self, text: str) -> str | None:
        """For an instruction without a count: a label of what an unfinished response shows about it (the
        language it is written in so far, say), or None where it shows nothing. ``sbon.ifeval.progress``
        values an open instruction by the calibrated pass rate of its type with that label."""
        return None

    def check(self, text: str) -> bool:
        """The reference's ``check_following``: True when the complete response follows it."""
        return self.final(text).status == PASS


class KeywordExistence(Instruction):
    id = "keywords:existence"
    args = {"keywords": list}

    def setup(self, keywords):
        self.keywords = sorted(keywords)

    def _found(self, text):
        """Each keyword with its first match, or None: a match already written stays a match."""
        return [(k, _compile(k).search(text)) for k in self.keywords]

    def final(self, text):
        return self._outcome(text, PASS, FAIL, "missing")

    def progress(self, text):
        return [Count(0, RELATIONS[1], 1) for _, m in self._found(text) if m is None]

    def partial(self, text):
        return self._outcome(text, SATISFIED, OPEN, "not written yet")

    def _outcome(self, text, done, missing, why):
        found = self._found(text)
        absent = [k for k, m in found if m is None]
        if absent:
            return Outcome(missing, f"keyword ‘{absent[0]}’ {why}")
        last = max((m for _, m in found), key=lambda m: m.start())
        return Outcome(done, f"all keywords present (last: {snippet(text, *last.span())})", last.span())


class KeywordFrequency(Instruction):
    id = "keywords:frequency"
    args = {"keyword": str, "frequency": int, "relation": str}

    def setup(self, keyword, frequency, relation):
        self.keyword, self.n, self.relation = keyword.strip(), frequency, relation

    def _matches(self, text):
        return list(_compile(self.keyword).finditer(text))

    def final(self, text):
        ms = self._matches(text)
        return _count_final(len(ms), self.relation, self.n, f"‘{self.keyword}’ ×", ms[-1].span() if ms else None)

    def partial(self, text):
        ms = self._matches(text)
        return _count_partial(len(ms), self.relation, self.n, f"‘{self.keyword}’ ×", ms[-1].span() if ms else None)

    def progress(self, text):
        return [Count(len(self._matches(text)), self.relation, self.n)]


class ForbiddenWords(Instruction):
    id = "keywords:forbidden_words"
    args = {"forbidden_words": list}

    def setup(self, forbidden_words):
        self.words = sorted(set(forbidden_words))

    def _first(self, text, settled: bool):
        for w in self.words:
            for m in _compile(r"\b" + w + r"\b").finditer(text):
                if not settled or m.end() < len(text):  # 'house' at the very end may still become 'houses'
                    return w, m
        return None

    def final(self, text):
        hit = self._first(text, False)
        if hit:
            return Outcome(FAIL, f"forbidden ‘{hit[0]}’ at {snippet(text, *hit[1].span())}", hit[1].span())
        return Outcome(PASS, "no forbidden word")

    def partial(self, text):
        hit = self._first(text, True)
        if hit:
            return Outcome(VIOLATED, f"forbidden ‘{hit[0]}’ at {snippet(text, *hit[1].span())}", hit[1].span())
        return Outcome(OPEN, "no forbidden word so far")

    def progress(self, text):
        return [Count(0, RELATIONS[0], 1)]


class LetterFrequency(Instruction):
    """How often a letter appears (case-insensitive). The reference replaces an argument that is not one
    ASCII letter by a *random* letter, so its verdict on such prompts (two shipped ones ask for '#' and '!')
    changes from run to run; here the given character is counted as it is, deterministically."""
    id = "keywords:letter_frequency"
    args = {"letter": str, "let_frequency": int, "let_relation": str}

    def setup(self, letter, let_frequency, let_relation):
        self.letter, self.n, self.relation = letter.strip().lower(), let_frequency, let_relation

    def _count(self, text):
        return collections.Counter(text.lower())[self.letter]

    def final(self, text):
        return _count_final(self._count(text), self.relation, self.n, f"letter ‘{self.letter}’ ×")

    def partial(self, text):
        return _count_partial(self._count(text), self.relation, self.n, f"letter ‘{self.letter}’ ×")

    def progress(self, text):
        return [Count(self._count(text), self.relation, self.n)]


class ResponseLanguage(Instruction):
    id = "language:response_language"
    args = {"language": str}

    def setup(self, language):
        self.language = language

    def final(self, text):
        from .language import detect

        found = detect(text)
        if found is None:  # the reference counts an undetectable text as following the instruction
            return Outcome(PASS, "language not detectable (counted as followed, as in IFEval)")
        ok = found == self.language
        return Outcome(PASS if ok else FAIL, f"detected language ‘{found}’, ‘{self.language}’ required")

    def partial(self, text):
        return Outcome(OPEN, f"language ‘{self.language}’ is judged on the complete response")

    def evidence(self, text):
        """'required' when the text so far is detected as the required language, 'other' when it is detected as
        another, None when nothing is detectable yet."""
        from .language import detect

        found = detect(text) if text.strip() else None
        return None if found is None else "required" if found == self.language else "other"


class NumberOfSentences(Instruction):
    id = "length_constraints:number_sentences"
    args = {"num_sentences": int, "relation": str}

    def setup(self, num_sentences, relation):
        self.n, self.relation = num_sentences, relation

    def final(self, text):
        return _count_final(T.count_sentences(text), self.relation, self.n, "sentences:")

    @staticmethod
    def _ended(text):
        return [e for e in T.sentence_ends(text) if e < len(text)]

    def progress(self, text):
        return [Count(len(self._ended(text)), self.relation, self.n)]

    def partial(self, text):
        # Only sentences already ended and followed by a space are settled: the last one may go on.
        ends = self._ended(text)
        start = ends[-2] if len(ends) > 1 else 0
        span = (start + len(text[start:]) - len(text[start:].lstrip()), ends[-1]) if ends else None
        return _count_partial(len(ends), self.relation, self.n, "ended sentences:", span)


class NumberOfParagraphs(Instruction):
    id = "length_constraints:number_paragraphs"
    args = {"num_paragraphs": int}
    SEPARATOR = re.compile(r"\s?\*\*\*\s?")

    def setup(self, num_paragraphs):
        self.n = num_paragraphs

    def final(self, text):
        paragraphs = self.SEPARATOR.split(text)
        count = len(paragraphs)
        for i, p in enumerate(paragraphs):
            if not p.strip():
                if i in (0, len(paragraphs) - 1):
                    count -= 1
                else:
                    return Outcome(FAIL, "empty paragraph between two *** dividers")
        return Outcome(PASS if count == self.n else FAIL, f"{count} paragraphs, exactly {self.n} required")

    def partial(self, text):
        closed = self.SEPARATOR.split(text)[:-1]  # the piece after the last divider may still grow
        if any(not p.strip() for p in closed[1:]):
            return Outcome(VIOLATED, "empty paragraph between two *** dividers")
        done = sum(1 for p in closed if p.strip())
        if done > self.n:
            return Outcome(VIOLATED, f"{done} paragraphs already, exactly {self.n} required")
        return Outcome(OPEN, f"{done} paragraphs ended so far, exactly {self.n} required")

    def progress(self, text):  # n paragraphs: n - 1 dividers
        return [Count(len(self.SEPARATOR.findall(text)), EXACTLY, self.n - 1)]


class NumberOfWords(Instruction):
    id = "length_constraints:number_words"
    args = {"num_words": int, "relation": str}

    def setup(self, num_words, relation):
        self.n, self.relation = num_words, relation

    def _outcome(self, text, counter):
        spans = T.word_spans(text)
        if spans and len(spans) >= self.n:
            span = spans[self.n - 1]
            word = f"word {self.n} is {snippet(text, *span, context=0)}"
            if self.relation == RELATIONS[0]:
                return Outcome(VIOLATED if counter is _count_partial else FAIL,
                               f"{len(spans)} words, fewer than {self.n} required ({word})", span)
        return counter(len(spans), self.relation, self.n, "words:", spans[-1] if spans else None)

    def final(self, text):
        return self._outcome(text, _count_final)

    def partial(self, text):
        return self._outcome(text, _count_partial)

    def progress(self, text):
        return [Count(T.count_words(text), self.relation, self.n)]


class ParagraphFirstWord(Instruction):
    id = "length_constraints:nth_paragraph_first_word"
    args = {"num_paragraphs": int, "nth_paragraph": int, "first_word": str}

    def setup(self, num_paragraphs, nth_paragraph, first_word):
        self.n, self.nth, self.word = num_paragraphs, nth_paragraph, first_word.lower()

    @staticmethod
    def first_word(paragraph: str) -> str:
        word = paragraph.split()[0].strip().lstrip("'").lstrip('"')
        out = ""
        for letter in word:
            if letter in {".", ",", "?", "!", "'", '"'}:
                break
            out += letter.lower()
        return out

    def final(self, text):
        paragraphs = text.split("\n\n")
        count = sum(1 for p in paragraphs if p.strip())
        if self.nth > count:
            return Outcome(FAIL, f"{count} paragraphs, paragraph {self.nth} missing")
        paragraph = paragraphs[self.nth - 1].strip()
        if not paragraph:
            return Outcome(FAIL, f"paragraph {self.nth} is empty")
        first = self.first_word(paragraph)
        ok = count == self.n and first == self.word
        return Outcome(PASS if ok else FAIL, f"{count} paragraphs (exactly {self.n} required), "
                                             f"paragraph {self.nth} starts with ‘{first}’ (‘{self.word}’ required)")

    def partial(self, text):
        paragraphs = text.split("\n\n")
        closed = paragraphs[:-1]  # the last one may still grow, or a blank line may still split it
        done = sum(1 for p in closed if p.strip())
        if done > self.n:
            return Outcome(VIOLATED, f"{done} paragraphs already, exactly {self.n} required")
        if len(closed) >= self.nth:
            paragraph = closed[self.nth - 1].strip()
            if not paragraph:
                return Outcome(VIOLATED, f"paragraph {self.nth} is empty")
            first = self.first_word(paragraph)
            if first != self.word:
                return Outcome(VIOLATED, f"paragraph {self.nth} starts with ‘{first}’, ‘{self.word}’ required")
        return Outcome(OPEN, f"{done} paragraphs ended so far, exactly {self.n} required")

    def progress(self, text):  # n paragraphs: n - 1 blank-line breaks
        return [Count(text.count("\n\n"), EXACTLY, self.n - 1)]


class Placeholders(Instruction):
    id = "detectable_content:number_placeholders"
    args = {"num_placeholders": int}

    def setup(self, num_placeholders):
        self.n = num_placeholders

    def _spans(self, text):
        return [m.span() for m in re.finditer(r"\[.*?\]", text)]

    def final(self, text):
        s = self._spans(text)
        return _count_final(len(s), RELATIONS[1], self.n, "[placeholders]:", s[-1] if s else None)

    def partial(self, text):
        s = self._spans(text)
        return _count_partial(len(s), RELATIONS[1], self.n, "[placeholders]:", s[-1] if s else None)

    def progress(self, text):
        return [Count(len(self._spans(text)), RELATIONS[1], self.n)]


class Postscript(Instruction):
    id = "detectable_content:postscript"
    args = {"postscript_marker": str}

    def setup(self, postscript_marker):
        self.marker = postscript_marker.strip()
        self.pattern = {"P.P.S": r"\s*p\.\s?p\.\s?s.*$", "P.S.": r"\s*p\.\s?s\..*$"}.get(
            self.marker, r"\s*" + self.marker.lower() + r".*$")

    def _match(self, text):
        return re.search(self.pattern, text.lower(), flags=re.MULTILINE)

    def final(self, text):
        m = self._match(text)
        if m:
            return Outcome(PASS, f"postscript {snippet(text, *m.span(), context=0)}", m.span())
        return Outcome(FAIL, f"no postscript starting with ‘{self.marker}’")

    def partial(self, text):
        m = self._match(text)
        if m:
            return Outcome(SATISFIED, f"postscript {snippet(text, *m.span(), context=0)}", m.span())
        return Outcome(OPEN, f"no postscript ‘{self.marker}’ yet")

    def progress(self, text):
        return [Count(0, RELATIONS[1], 1)]


class BulletLists(Instruction):
    id = "detectable_format:number_bullet_lists"
    args = {"num_bullets": int}

    def setup(self, num_bullets):
        self.n = num_bullets

    @staticmethod
    def _bullets(text):
        return ([m.span() for m in re.finditer(r"^\s*\*[^\*].*$", text, flags=re.MULTILINE)]
                + [m.span() for m in re.finditer(r"^\s*-.*$", text, flags=re.MULTILINE)])

    def final(self, text):
        b = self._bullets(text)
        ok = len(b) == self.n
        return Outcome(PASS if ok else FAIL, f"{len(b)} bullet points, exactly {self.n} required",
                       max(b, key=lambda s: s[0]) if b else None)

    def partial(self, text):
        b = self._bullets(_complete_lines(text))
        if len(b) > self.n:
            last = max(b, key=lambda s: s[0])
            return Outcome(VIOLATED, f"{len(b)} bullet points already, exactly {self.n} required", last)
        return Outcome(OPEN, f"{len(b)} bullet points so far, exactly {self.n} required")

    def progress(self, text):
        return [Count(len(self._bullets(_complete_lines(text))), EXACTLY, self.n)]


class ConstrainedResponse(Instruction):
    id = "detectable_format:constrained_response"
    OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")

    def _match(self, text):
        for option in self.OPTIONS:
            i = text.find(option)
            if i >= 0:
                return option, (i, i + len(option))
        return None

    def final(self, text):
        hit = self._match(text.strip())
        if hit:
            start = text.find(hit[0])
            return Outcome(PASS, f"contains ‘{hit[0]}’", (start, start + len(hit[0])))
        return Outcome(FAIL, "none of ‘My answer is yes./no./maybe.’")

    def partial(self, text):
        hit = self._match(text)
        if hit:
            return Outcome(SATISFIED, f"contains ‘{hit[0]}’", hit[1])
        return Outcome(OPEN, "no ‘My answer is yes./no./maybe.’ yet")

    def progress(self, text):
        return [Count(0, RELATIONS[1], 1)]


class Highlights(Instruction):
    id = "detectable_format:number_highlighted_sections"
    args = {"num_highlights": int}

    def setup(self, num_highlights):
        self.n = num_highlights

    @staticmethod
    def _spans(text):
        spans = [m.span() for m in re.finditer(r"\*[^\n\*]*\*", text) if m.group().strip("*").strip()]
        spans += [m.span() for m in re.finditer(r"\*\*[^\n\*]*\*\*", text)
                  if m.group().removeprefix("**").removesuffix("**").strip()]
        return sorted(spans)

    def final(self, text):
        s = self._spans(text)
        return _count_final(len(s), RELATIONS[1], self.n, "*highlighted* sections:", s[-1] if s else None)

    def partial(self, text):
        s = self._spans(text)
        return _count_partial(len(s), RELATIONS[1], self.n, "*highlighted* sections:", s[-1] if s else None)

    def progress(self, text):
        return [Count(len(self._spans(text)), RELATIONS[1], self.n)]


class Sections(Instruction):
    id = "detectable_format:multiple_sections"
    args = {"section_spliter": str, "num_sections": int}

    def setup(self, section_spliter, num_sections):
        self.splitter, self.n = section_spliter.strip(), num_sections
        self.pattern = r"\s?" + self.splitter + r"\s?\d+\s?"

    def _spans(self, text):
        return [m.span() for m in re.finditer(self.pattern, text)]

    def final(self, text):
        count = len(re.split(self.pattern, text)) - 1
        s = self._spans(text)
        return _count_final(count, RELATIONS[1], self.n, f"‘{self.splitter} N’ sections:", s[-1] if s else None)

    def partial(self, text):
        s = self._spans(text)
        return _count_partial(len(s), RELATIONS[1], self.n, f"‘{self.splitter} N’ sections:", s[-1] if s else None)

    def progress(self, text):
        return [Count(len(self._spans(text)), RELATIONS[1], self.n)]


class JsonFormat(Instruction):
    id = "detectable_format:json_format"
    # How a JSON value, or a ``` fence, can begin; Python's parser also takes NaN, Infinity and -Infinity.
    STARTS = set('{["-0123456789tfnNI`')

    @staticmethod
    def _unwrap(text):
        return (text.strip().removeprefix("```json").removeprefix("```Json").removeprefix("```JSON")
                .removeprefix("```").removesuffix("```").strip())

    def final(self, text):
        try:
            json.loads(self._unwrap(text))
        except ValueError as e:
            return Outcome(FAIL, f"not JSON ({str(e).split(':')[0]})")
        return Outcome(PASS, "the whole response parses as JSON")

    def partial(self, text):
        body = text.lstrip()
        if body and body[0] not in self.STARTS:
            i = len(text) - len(body)
            return Outcome(VIOLATED, f"starts with {snippet(text, i, i + 1)}, not JSON", (i, i + 1))
        return Outcome(OPEN, "JSON is judged on the complete response")


class Title(Instruction):
    id = "detectable_format:title"

    @staticmethod
    def _title(text):
        for m in re.finditer(r"<<[^\n]+>>", text):
            if m.group().lstrip("<").rstrip(">").strip():
                return m
        return None

    def final(self, text):
        m = self._title(text)
        if m:
            return Outcome(PASS, f"title {snippet(text, *m.span(), context=0)}", m.span())
        return Outcome(FAIL, "no <<title>>")

    def partial(self, text):
        m = self._title(text)
        if m:
            return Outcome(SATISFIED, f"title {snippet(text, *m.span(), context=0)}", m.span())
        return Outcome(OPEN, "no <<title>> yet")

    def progress(self, text):
        return [Count(0, RELATIONS[1], 1)]


class TwoResponses(Instruction):
    id = "combination:two_responses"

    def final(self, text):
        valid = []
        parts = text.split("******")
        for i, part in enumerate(parts):
            if not part.strip():
                if i not in (0, len(parts) - 1):
                    return Outcome(FAIL, "empty response between two ****** separators")
            else:
                valid.append(part)
        if len(valid) != 2:
            return Outcome(FAIL, f"{len(valid)} responses separated by ******, 2 required")
        if valid[0].strip() == valid[1].strip():
            return Outcome(FAIL, "the two responses are the same")
        return Outcome(PASS, "two different responses separated by ******")

    def partial(self, text):
        closed = text.split("******")[:-1]  # the part after the last separator may still grow
        done = sum(1 for p in closed if p.strip())
        if any(not p.strip() for p in closed[1:]):
            return Outcome(VIOLATED, "empty response between two ****** separators")
        if done > 2:
            return Outcome(VIOLATED, f"{done} responses already, 2 required")
        return Outcome(OPEN, f"{done} responses ended so far, 2 required")

    def progress(self, text):  # two responses: one separator
        return [Count(text.count("******"), EXACTLY, 1)]


class RepeatPrompt(Instruction):
    id = "combination:repeat_prompt"
    args = {"prompt_to_repeat": str}

    def setup(self, prompt_to_repeat):
        self.target = prompt_to_repeat.strip().lower()

    def final(self, text):
        ok = text.strip().lower().startswith(self.target)
        return Outcome(PASS if ok else FAIL, "starts with the request word for word" if ok
                       else self._mismatch(text).reason, None if ok else self._mismatch(text).span)

    def _mismatch(self, text):
        start = len(text) - len(text.lstrip())
        body = text[start:].lower()
        i = next((k for k, (a, b) in enumerate(zip(body, self.target)) if a != b), min(len(body), len(self.target)))
        return Outcome(VIOLATED, f"differs from the request at {snippet(text, start + i, start + i + 1)}",
                       (start + i, start + i + 1))

    def partial(self, text):
        body = text.lstrip().lower()
        if body.startswith(self.target):
            return Outcome(SATISFIED, "starts with the request word for word", (0, len(text.rstrip())))
        if self.target.startswith(body):
            return Outcome(OPEN, f"repeating the request ({len(body)}/{len(self.target)} characters)")
        return self._mismatch(text)


class EndPhrase(Instruction):
    id = "startend:end_checker"
    args = {"end_phrase": str}

    def setup(self, end_phrase):
        self.phrase = end_phrase.strip()

    def final(self, text):
        ok = text.strip().strip('"').lower().endswith(self.phrase.lower())
        tail = text.rstrip()
        span = (max(0, len(tail) - len(self.phrase)), len(tail))
        required = "" if ok else f", ‘{self.phrase}’ required"
        return Outcome(PASS if ok else FAIL, f"ends with {snippet(tail, *span, context=0)}{required}", span)

    def partial(self, text):
        return Outcome(OPEN, f"must end with ‘{self.phrase}’")

    def progress(self, text):
        return [Count(0, RELATIONS[1], 1)]


class CapitalWordFrequency(Instruction):
    id = "change_case:capital_word_frequency"
    args = {"capital_frequency": int, "capital_relation": str}

    def setup(self, capital_frequency, capital_relation):
        self.n, self.relation = capital_frequency, capital_relation

    def final(self, text):
        words = T.capital_words(text)
        span = words[-1][1:] if words and words[-1][1] >= 0 else None
        return _count_final(len(words), self.relation, self.n, "CAPITAL words:", span)

    @staticmethod
    def _settled(text):
        """Capital words before the last word: the last word may still grow into a non-capital one."""
        cut = len(text) if text[-1:].isspace() or not text.strip() else len(text) - len(text.split()[-1])
        return T.capital_words(text[:cut])

    def partial(self, text):
        words = self._settled(text)
        span = words[-1][1:] if words and words[-1][1] >= 0 else None
        return _count_partial(len(words), self.relation, self.n, "CAPITAL words:", span)

    def progress(self, text):
        return [Count(len(self._settled(text)), self.relation, self.n)]


class _CaseChecker(Instruction):
    """All capitals or all lowercase, and English: one wrong-case letter settles it."""
    wrong: ClassVar[Callable[[str], bool]]
    holds: ClassVar[Callable[[str], bool]]
    case: ClassVar[str]

    def _wrong_letter(self, text):
        return next((i for i, c in enumerate(text) if type(self).wrong(c)), None)

    def final(self, text):
        from .language import detect

        i = self._wrong_letter(text)
        if i is not None or not type(self).holds(text):
            return Outcome(FAIL, f"not all {self.case}" + (f": {snippet(text, i, i + 1)}" if i is not None else ""),
                           (i, i + 1) if i is not None else None)
        found = detect(text)
        if found not in (None, "en"):
            return Outcome(FAIL, f"all {self.case}, but detected language ‘{found}’, English required")
        return Outcome(PASS, f"all {self.case}, English")

    def partial(self, text):
        i = self._wrong_letter(text)
        if i is not None:
            return Outcome(VIOLATED, f"not {self.case}: {snippet(text, i, i + 1)}", (i, i + 1))
        return Outcome(OPEN, f"all {self.case} so far")

    def progress(self, text):  # no letter of the wrong case, ever
        return [Count(0, RELATIONS[0], 1)]


class EnglishCapital(_CaseChecker):
    id = "change_case:english_capital"
    wrong, holds, case = str.islower, str.isupper, "capitals"


class EnglishLowercase(_CaseChecker):
    id = "change_case:english_lowercase"
    wrong, holds, case = (lambda c: c.isupper() or c.istitle()), str.islower, "lowercase"


class NoComma(Instruction):
    id = "punctuation:no_comma"

    def final(self, text):
        i = text.find(",")
        if i >= 0:
            return Outcome(FAIL, f"comma at {snippet(text, i, i + 1)}", (i, i + 1))
        return Outcome(PASS, "no comma")

    def partial(self, text):
        out = self.final(text)
        return Outcome(VIOLATED if out.status == FAIL else OPEN, out.reason + ("" if out.span else " so far"), out.span)

    def progress(self, text):
        return [Count(0, RELATIONS[0], 1)]


class Quotation(Instruction):
    id = "startend:quotation"

    def final(self, text):
        value = text.strip()
        ok = len(value) > 1 and value[0] == '"' and value[-1] == '"'
        return Outcome(PASS if ok else FAIL, "wrapped in double quotes" if ok else "not wrapped in double quotes")

    def partial(self, text):
        start = len(text) - len(text.lstrip())
        if text.strip() and text[start] != '"':
            return Outcome(VIOLATED, f"starts with {snippet(text, start, start + 1)}, not ‘\"’", (start, start + 1))
        return Outcome(OPEN, "must end with ‘\"’")


CHECKERS: dict[str, type[Instruction]] = {c.id: c for c in (
    KeywordExistence, KeywordFrequency, ForbiddenWords, LetterFrequency, ResponseLanguage, NumberOfSentences,
    NumberOfParagraphs, NumberOfWords, ParagraphFirstWord, Placeholders, Postscript, BulletLists,
    ConstrainedResponse, Highlights, Sections, JsonFormat, Title, TwoResponses, RepeatPrompt, EndPhrase,
    CapitalWordFrequency, EnglishCapital, EnglishLowercase, NoComma, Quotation)}


def build(instruction_id: str, kwargs: dict | None) -> Instruction:
    """An instruction from IFEval's id and kwargs (None values dropped, as IFEval's evaluation does);
    a one-line SBoNError on an unknown id or a missing or mistyped argument."""
    cls = CHECKERS.get(instruction_id)
    if cls is None:
        # The part after the colon is what people remember ("no_comma" for "punctuation:no_comma").
        close = [i for i in CHECKERS if i.split(":")[-1] == instruction_id.split(":")[-1]] or \
            difflib.get_close_matches(instruction_id, CHECKERS, n=1, cutoff=0.9)
        raise SBoNError(f"unknown IFEval instruction '{instruction_id}'" +
                        (f": did you mean '{close[0]}'?" if close else ""))
    kwargs = {k: v for k, v in (kwargs or {}).items() if v is not None}
    for name, kind in cls.args.items():
        value = kwargs.get(name)
        if value is None or not isinstance(value, kind) or isinstance(value, bool):
            raise SBoNError(f"{instruction_id} needs '{name}' ({kind.__name__}), got {value!r}")
        if name.endswith("relation") and value not in RELATIONS:
            raise SBoNError(f"{instruction_id}: '{name}' must be one of {RELATIONS}, got {value!r}")
    unknown = set(kwargs) - set(cls.args)
    if unknown:
        raise SBoNError(f"{instruction_id} takes no argument {sorted(unknown)[0]!r}")
    return cls(**kwargs)
