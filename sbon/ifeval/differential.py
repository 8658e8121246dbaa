"""Differential check of our checkers against IFEval's reference checkers (a development tool, not a test:
the reference needs NLTK and is not a dependency of this project).

Set-up, once, outside the repository (lm-eval ships a copy of Google's ``instructions*.py``):

    pip download lm-eval --no-deps -d /tmp/lmeval && python -m zipfile -e /tmp/lmeval/lm_eval-*.whl /tmp/lmeval/x
    pip install --no-deps --target /tmp/refdeps nltk immutabledict joblib
    mkdir -p /tmp/refeval && cp /tmp/lmeval/x/lm_eval/tasks/ifeval/instructions*.py /tmp/refeval/
    sed -i 's/from lm_eval.tasks.ifeval import /import /' /tmp/refeval/*.py

Then ``python -m sbon.ifeval.differential --reference /tmp/refeval --deps /tmp/refdeps`` checks every
instruction of the shipped prompts on the responses of ``evaluation.json`` and variants of them (lowercased,
uppercased, commas removed, quoted, JSON-wrapped, bulleted, with a postscript or dividers), and prints per type
how many verdicts agree. Types whose reference needs NLTK's punkt data are skipped when it is not installed.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

from .checkers import build
from .data import load_prompts

LANGUAGE = {"language:response_language", "change_case:english_capital", "change_case:english_lowercase"}
NEEDS_PUNKT = {"length_constraints:number_sentences", "change_case:capital_word_frequency"}


def responses(path: Path) -> list[str]:
    base = [t for row in json.loads(path.read_text())["per_prompt"] for t in row["responses"]]
    variants = []
    for t in base[:60]:
        variants += [t.lower(), t.upper(), t.replace(",", ""), '"' + t.strip() + '"',
                     "```json\n" + json.dumps({"a": t}) + "\n```", t.replace("\n", "\n\n"),
                     "* " + t.replace("\n", "\n* "), t + "\nP.S. bye", t.replace(". ", " *** ")]
    return base + variants


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m sbon.ifeval.differential", description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", type=Path, required=True, help="folder with the reference's instructions*.py")
    p.add_argument("--deps", type=Path, required=True, help="folder with nltk, immutabledict, joblib")
    p.add_argument("--responses", type=Path, default=Path(__file__).with_name("evaluation.json"))
    args = p.parse_args(argv)
    sys.path[:0] = [str(args.reference), str(args.deps)]
    import instructions_registry
    import nltk
    from langdetect import DetectorFactory

    DetectorFactory.seed = 0  # both sides detect with the same seed
    try:
        nltk.data.find("tokenizers/punkt_tab")
        punkt = True
    except LookupError:
        punkt = False
    texts = responses(args.responses)
    agree, differ, first = collections.Counter(), collections.Counter(), {}
    for row in load_prompts():
        for iid, kwargs in zip(row.instruction_ids, row.kwargs):
            if iid in NEEDS_PUNKT and not punkt:
                continue
            reference = instructions_registry.INSTRUCTION_DICT[iid](iid)
            reference.build_description(**{k: v for k, v in kwargs.items() if v is not None})
            ours = build(iid, kwargs)
            for text in texts[::8] if iid in LANGUAGE else texts:  # langdetect is slow
                same = bool(reference.check_following(text)) == ours.check(text)
                (agree if same else differ)[iid] += 1
                if not same:
                    first.setdefault(iid, (row.key, kwargs, text[:120]))
    for iid in sorted(set(agree) | set(differ)):
        print(f"{iid:46s} agree {agree[iid]:6d}  differ {differ[iid]:4d}")
    print(f"skipped (punkt data missing): {sorted(NEEDS_PUNKT)}" if not punkt else "punkt available")
    for iid, example in first.items():
        print("first difference:", iid, example)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
