"""The preference pairs both training scripts read: AlpacaEval judgements, HH-RLHF human labels, the
tulu-2 Best-of-N samples and 24 more models' answers, as (prompt, better, worse) pairs, with the held-out
split. ``train_reward`` trains on them, ``reward_quality`` evaluates on them; neither imports the other."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from sbon.preference_reward import word_count

# The preference data is not shipped with the repository (see DATA_SOURCES for where it comes from): the
# training commands read it from the shared data folder beside this checkout when there is one, or from
# --data, and check_data stops them with one line when it is missing.
DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"


ALPACA_FILE = "alpaca_eval_gpt4_preferences.jsonl"


HH_FILE = "hh_harmless_pairs.jsonl"


SEED = 0


VAL_PERCENT = 20


# AlpacaEval answers of two models to one instruction form a pair when their preferences
# against the common GPT-4-Turbo reference differ by at least this much; closer ones are ties.
MARGIN = 0.1


REFERENCE_PREFERENCE = 1.5  # the reference against itself


TULU_FILE = "alpaca_eval_bon_tulu2.jsonl.gz"


MORE_FILE = "alpaca_eval_more_models.jsonl.gz"


@dataclass
class Pair:
    source: str  # "alpaca" | "hh" | "offtopic"
    kind: str  # "ref-vs-model" | "model-vs-model" | "human" | "other-instruction"
    prompt: str
    better: str
    worse: str


DATA_SOURCES = {
    ALPACA_FILE: "tatsu-lab/alpaca_eval, weighted_alpaca_eval_gpt4_turbo annotations of 9 models",
    HH_FILE: "Anthropic/hh-rlhf harmless-base/test.jsonl.gz, single-turn (prompt, chosen, rejected) pairs",
    "alpaca_eval_prompts.jsonl": "tatsu-lab/alpaca_eval, instructions of results/gpt4/model_outputs.json",
    "alpaca_eval_bon_tulu2.jsonl.gz": "allenai/reward-bench bon_eval/alpaca_eval_n=16, tulu-2-dpo-13b samples",
    "alpaca_eval_more_models.jsonl.gz": "tatsu-lab/alpaca_eval results/<model>/ annotations of 24 more models",
}


def check_data(data_dir: Path, files: tuple[str, ...]) -> Path:
    """Exit with one line naming what is missing and where it comes from publicly."""
    missing = [f for f in files if not (Path(data_dir) / f).is_file()]
    if missing:
        raise SystemExit(f"--data {data_dir}: {', '.join(missing)} not found there: get it from "
                         f"{'; '.join(DATA_SOURCES[f] for f in missing)} (format: see the model cards) and pass its "
                         f"folder with --data")
    return Path(data_dir)


def is_validation(prompt: str) -> bool:
    """A stable split: the same prompt always lands in the same fold, whatever the file order."""
    return int(hashlib.sha1(prompt.encode()).hexdigest(), 16) % 100 < VAL_PERCENT


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def alpaca_answers(data_dir: Path) -> dict[str, dict[str, float]]:
    """instruction -> {answer: its preference against the GPT-4-Turbo reference}; the reference scores 1.5."""
    answers: dict[str, dict[str, float]] = defaultdict(dict)
    for row in read_jsonl(data_dir / ALPACA_FILE):
        answers[row["instruction"]][row["output_1"]] = REFERENCE_PREFERENCE
        answers[row["instruction"]].setdefault(row["output_2"], row["preference"])
    return answers


def alpaca_pairs(answers: dict[str, dict[str, float]]) -> list[Pair]:
    """Every two answers to one instruction whose preferences differ by at least MARGIN.

    An answer's preference against the common reference also orders the answers of
    different models to the same instruction.
    """
    pairs = []
    for prompt, scored in answers.items():
        for (a, sa), (b, sb) in itertools.combinations(scored.items(), 2):
            if abs(sa - sb) >= MARGIN:
                kind = "ref-vs-model" if REFERENCE_PREFERENCE in (sa, sb) else "model-vs-model"
                pairs.append(Pair("alpaca", kind, prompt, *((a, b) if sa > sb else (b, a))))
    return pairs


def offtopic_pairs(answers: dict[str, dict[str, float]], per_prompt: int = 2) -> list[Pair]:
    """An instruction's own answers beat answers written for other instructions.

    The preference data never shows an off-topic answer, so without these pairs the head has no
    reason to care whether a response addresses the prompt at all. Negatives come from the same
    fold, so no validation answer is seen in training.
    """
    rng = random.Random(SEED)
    pairs = []
    for fold in (False, True):
        prompts = sorted(p for p in answers if is_validation(p) == fold)
        for prompt in prompts:
            own = rng.sample(sorted(answers[prompt]), per_prompt)
            others = rng.sample([p for p in prompts if p != prompt], per_prompt)
            pairs += [Pair("offtopic", "other-instruction", prompt, a, rng.choice(sorted(answers[o])))
                      for a, o in zip(own, others)]
    return pairs


def hh_pairs(data_dir: Path) -> list[Pair]:
    return [Pair("hh", "human", r["prompt"], r["chosen"], r["rejected"])
            for r in read_jsonl(data_dir / HH_FILE) if r["chosen"] != r["rejected"]]


def pair_outcome(margin: float) -> float:
    """1 when the better answer scored higher, 0 when lower; a tie counts half."""
    return 1.0 if margin > 0 else 0.5 if margin == 0 else 0.0


def length_margins(pairs: list[Pair]) -> list[float]:
    return [word_count(p.better) - word_count(p.worse) for p in pairs]


def read_rows(path: Path) -> list[dict]:
    if path.suffix == ".gz":
        with gzip.open(path, "rt") as f:
            return [json.loads(line) for line in f if line.strip()]
    return read_jsonl(path)


def ordered_pairs(prompt: str, scored: Sequence[tuple[str, float]], source: str, kind: str,
                  margin: float = MARGIN) -> list[Pair]:
    """Every two distinct answers whose preferences differ by at least ``margin``, better first."""
    pairs = []
    for (a, sa), (b, sb) in itertools.combinations(scored, 2):
        if a != b and abs(sa - sb) >= margin:
            pairs.append(Pair(source, kind, prompt, *((a, b) if sa > sb else (b, a))))
    return pairs


def same_model_pairs(tulu_rows: list[dict]) -> list[Pair]:
    """Pairs of samples of one model (tulu-2-dpo-13b) for one instruction: Best-of-N's situation."""
    by_prompt: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for r in tulu_rows:
        by_prompt[r["instruction"]].append((r["output"], r["preference_vs_reference"]))
    return [p for prompt, scored in by_prompt.items() for p in ordered_pairs(prompt, scored, "same-model", "tulu-2")]


def model_answers(gpt4_rows: list[dict], more_rows: list[dict]) -> dict[str, dict[str, tuple[str, float]]]:
    """instruction -> {generator: (answer, preference against the GPT-4-Turbo reference)} over both files."""
    answers: dict[str, dict[str, tuple[str, float]]] = defaultdict(dict)
    for r in gpt4_rows:
        answers[r["instruction"]][r["generator_2"]] = (r["output_2"], r["preference"])
    for r in more_rows:
        answers[r["instruction"]].setdefault(r["generator"], (r["output"], r["preference_vs_reference"]))
    return answers


def between_model_pairs(answers: dict[str, dict[str, tuple[str, float]]]) -> list[Pair]:
    return [p for prompt, by_model in answers.items()
            for p in ordered_pairs(prompt, sorted(by_model.values()), "between-model", "two-models")]


def reference_pairs(gpt4_rows: list[dict]) -> list[Pair]:
    """A model's answer vs. the GPT-4-Turbo reference (which scores REFERENCE_PREFERENCE against itself)."""
    return [p for r in gpt4_rows
            for p in ordered_pairs(r["instruction"], [(r["output_1"], REFERENCE_PREFERENCE), (r["output_2"], r["preference"])],
                                   "reference", "vs-gpt4-turbo")]


def held_out(pairs: list[Pair]) -> list[Pair]:
    return [p for p in pairs if is_validation(p.prompt)]


def training_fold(pairs: list[Pair]) -> list[Pair]:
    return [p for p in pairs if not is_validation(p.prompt)]
