"""Language detection for IFEval's language and English-case instructions: ``langdetect``, as in the
reference, seeded so the same text always gets the same answer (langdetect samples at random; the
reference does not seed it, so a borderline text can flip between runs there).

Cost: langdetect is pure Python and by far the slowest check, several ms to tens of ms per response on a
loaded CPU (every other check is well under a millisecond). Only final verdicts of the three
language-dependent types call it (partial verdicts leave language open), and each text is detected once.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=4096)
def detect(text: str) -> str | None:
    """ISO 639-1 code of the text's language, or None when langdetect finds no feature in it (the
    reference counts that as following the instruction). Cached: final responses are checked by
    several instructions and several times."""
    import langdetect
    from langdetect import DetectorFactory

    DetectorFactory.seed = 0
    try:
        return langdetect.detect(text)
    except langdetect.LangDetectException:
        return None
