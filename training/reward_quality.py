"""Reward quality where Best-of-N operates (``python -m training.reward_quality --data DIR``).

    python -m training.reward_quality --data DIR                    # the table: results/reward_quality.json
    python -m training.reward_quality --data DIR --variants --cv    # step 2: retrained heads, text statistics
    python -m training.reward_quality --finetune-throughput         # can SmolLM2-135M be fine-tuned here?

DIR holds the files of ``pairs.DATA_SOURCES`` (AlpacaEval annotations, the tulu-2 Best-of-N
samples of allenai/reward-bench, Anthropic HH-RLHF harmless pairs); without them the command says
which to put there.

Pairwise accuracy of each reward on the held-out prompts (``pairs.is_validation``), next to
"the longer answer wins", on four kinds of pair:

1. same-model: two tulu-2-dpo-13b samples for one instruction (``alpaca_eval_bon_tulu2``) whose
   judged preferences differ by at least MARGIN -- the situation of Best-of-N; all of them and the
   length-matched ones (|log word-count ratio| < log 1.25), where length cannot help;
2. between-model: answers of two different models to one instruction (both AlpacaEval files,
   33 models), paired through their preferences against the common GPT-4-Turbo reference;
3. HH harmless pairs (human labels): the held-out fold, and all 647 for rewards that never saw HH;
4. against the reference: a model's answer vs. the GPT-4-Turbo reference answer.

Ties count half. Standard errors are clustered by prompt (pairs of one prompt share answers, so
they are not independent). ``likelihood`` costs a SmolLM2 forward pass per response: it runs on a
seeded random subsample of pairs of each set, and length is reported on that subsample beside it.
MiniLM embeddings are cached under ``$SBON_CACHE`` (default ``~/.cache/sbon``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from sbon.preference_reward import word_count

from .pairs import (ALPACA_FILE, DATA_DIR, HH_FILE, MARGIN, MORE_FILE, SEED, TULU_FILE, Pair, between_model_pairs,
                    check_data, held_out, hh_pairs, length_margins, model_answers, pair_outcome, read_rows,
                    reference_pairs, same_model_pairs, training_fold)

LENGTH_MATCH = math.log(1.25)  # |log word-count ratio| below this: length cannot tell the pair apart
RESULTS = Path(__file__).resolve().parent / "results" / "reward_quality.json"
DEFAULT_REWARDS = ("length", "minilm-pref", "minilm-pref-nolength", "likelihood")
# Random pairs per set for the likelihood reward: a SmolLM2 pass per response took 2 to 15 s on the
# 2 shared CPU cores, so between-model pairs (where likelihood was already known to lose, see the
# minilm_pref model card) are left out and the reference set gets fewer.
LIKELIHOOD_PAIRS = {"same-model": 50, "same-model, length-matched": 50, "hh (held-out)": 50, "hh (all 647)": 50,
                    "reference": 25}


# ---------------------------------------------------------------- pairs


def is_length_matched(pair: Pair) -> bool:
    return abs(math.log(max(word_count(pair.better), 1) / max(word_count(pair.worse), 1))) < LENGTH_MATCH


@dataclass
class Data:
    """All pairs of every kind, both folds; ``eval_sets`` picks the held-out ones."""
    same_model: list[Pair]
    between_model: list[Pair]
    reference: list[Pair]
    hh: list[Pair]


def load_data(data_dir: Path) -> Data:
    data_dir = check_data(data_dir, (ALPACA_FILE, HH_FILE, TULU_FILE, MORE_FILE))
    gpt4 = read_rows(data_dir / ALPACA_FILE)
    return Data(same_model_pairs(read_rows(data_dir / TULU_FILE)),
                between_model_pairs(model_answers(gpt4, read_rows(data_dir / MORE_FILE))),
                reference_pairs(gpt4), hh_pairs(data_dir))


def eval_sets(data: Data) -> dict[str, list[Pair]]:
    """The held-out evaluation sets by name (HH also in full, for rewards that never trained on it)."""
    same, between = held_out(data.same_model), held_out(data.between_model)
    return {
        "same-model": same,
        "same-model, length-matched": [p for p in same if is_length_matched(p)],
        "between-model": between,
        "between-model, length-matched": [p for p in between if is_length_matched(p)],
        "hh (held-out)": held_out(data.hh),
        "hh (all 647)": data.hh,
        "reference": held_out(data.reference),
    }


# ---------------------------------------------------------------- accuracy


def clustered_mean(pairs: Sequence[Pair], values: Sequence[float]) -> tuple[float, float, int]:
    """Mean of one value per pair, its standard error clustered by prompt, and the number of prompts.

    The cluster-robust variance sum_g (sum_i (v_i - mean))^2 / n^2 reduces to the usual one when
    every prompt has one pair, and grows when a prompt's pairs succeed or fail together.
    """
    mean = sum(values) / len(values)
    residuals: dict[str, float] = defaultdict(float)
    for p, v in zip(pairs, values):
        residuals[p.prompt] += v - mean
    return mean, math.sqrt(sum(r * r for r in residuals.values())) / len(values), len(residuals)


def accuracy_with_se(pairs: Sequence[Pair], margins: Sequence[float]) -> dict:
    """Accuracy (ties half) and its standard error clustered by prompt."""
    if not pairs:
        return {"n": 0, "accuracy": None, "se": None}
    acc, se, prompts = clustered_mean(pairs, [pair_outcome(m) for m in margins])
    return {"n": len(pairs), "prompts": prompts, "accuracy": round(acc, 4), "se": round(se, 4)}


def difference_with_se(pairs: Sequence[Pair], margins: Sequence[float], baseline: Sequence[float]) -> dict:
    """Accuracy minus a baseline's on the same pairs, with its paired standard error clustered by prompt."""
    if not pairs:
        return {"difference": None, "se": None}
    mean, se, _ = clustered_mean(pairs, [pair_outcome(m) - pair_outcome(b) for m, b in zip(margins, baseline)])
    return {"difference": round(mean, 4), "se": round(se, 4)}


def subsample(pairs: list[Pair], k: int, seed: int = SEED) -> list[Pair]:
    return pairs if len(pairs) <= k else random.Random(seed).sample(pairs, k)


# ---------------------------------------------------------------- rewards

Scorer = Callable[[list[Pair]], list[float]]
LLM_MAX_TOKENS = 256  # SmolLM2 reads at most this many response tokens, like the MiniLM encoder


def pair_texts(pairs: Sequence[Pair]) -> list[str]:
    return sorted({t for p in pairs for t in (p.prompt, p.better, p.worse)})


def head_scorer(folder: Path, use_length: bool = True) -> Scorer:
    """Margins of a minilm-pref-style head (its folder) over cached MiniLM embeddings."""
    from sbon.preference_reward import RewardHead

    from .train_reward import embed_cached, head_margins

    head, _ = RewardHead.from_folder(folder)
    return lambda pairs: head_margins(head, pairs, embed_cached(pair_texts(pairs)), use_length) if pairs else []


def feature_key(prompt: str, response: str) -> str:
    import hashlib

    return hashlib.sha1(f"{prompt}\0{response}".encode()).hexdigest()


class SmolFeatures:
    """SmolLM2-135M-Instruct read of (prompt, response): the response's mean log-probability (the
    ``likelihood`` reward) and the mean of its final hidden states, from one forward pass.

    The response is cut to its first LLM_MAX_TOKENS tokens. Results are cached on disk, keyed by
    prompt and response, so sets that share answers pay once.
    """

    def __init__(self, cache_dir: Path | None = None):
        from .train_reward import CACHE_DIR

        self.path = (cache_dir or CACHE_DIR) / f"smollm2_features_{LLM_MAX_TOKENS}.pt"
        import torch

        self.cache: dict[str, tuple[float, "torch.Tensor"]] = torch.load(self.path) if self.path.exists() else {}
        self.generator = None

    def save(self) -> None:
        import torch

        self.path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(self.cache, self.path)

    def _forward(self, prompt: str, responses: list[str]) -> None:
        import torch

        if self.generator is None:
            from sbon.models import load_generator

            self.generator = load_generator()
        gen = self.generator
        prompt_ids = gen.encode_prompt(prompt)
        chunks = [gen.tokenizer.encode(r, add_special_tokens=False)[:LLM_MAX_TOKENS] for r in responses]
        width = len(prompt_ids) + max(len(c) for c in chunks)
        ids = torch.zeros(len(chunks), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, c in enumerate(chunks):
            ids[i, :len(prompt_ids) + len(c)] = torch.tensor(prompt_ids + c)
            mask[i, :len(prompt_ids) + len(c)] = 1
        with torch.inference_mode():
            # The body only: the vocabulary projection is needed at the response positions alone.
            hidden = gen.model.model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
            start = len(prompt_ids)
            for i, (r, c) in enumerate(zip(responses, chunks)):
                n = len(c)
                if n:
                    logits = gen.model.lm_head(hidden[i, start - 1:start - 1 + n]).float()
                    lp = -float(torch.nn.functional.cross_entropy(logits, ids[i, start:start + n]))
                    h = hidden[i, start:start + n].mean(0)
                else:
                    lp, h = 0.0, hidden[i, start - 1]
                self.cache[feature_key(prompt, r)] = (lp, h.clone())

    def compute(self, items: Sequence[tuple[str, str]], batch_size: int = 8, desc: str = "SmolLM2") -> None:
        """Fill the cache for (prompt, response) items, a prompt's responses batched together."""
        from tqdm import tqdm

        todo: dict[str, list[str]] = defaultdict(list)
        for prompt, r in dict.fromkeys(items):
            if feature_key(prompt, r) not in self.cache:
                todo[prompt].append(r)
        total = sum(len(v) for v in todo.values())
        last_save = time.time()
        with tqdm(total=total, desc=desc, unit="response", disable=not total) as bar:
            for prompt, responses in todo.items():
                responses = sorted(responses, key=len)  # similar lengths: little padding
                for i in range(0, len(responses), batch_size):
                    self._forward(prompt, responses[i:i + batch_size])
                    bar.update(len(responses[i:i + batch_size]))
                if time.time() - last_save > 60:  # an interrupted run resumes
                    self.save()
                    last_save = time.time()
        if total:
            self.save()

    def logprob(self, prompt: str, response: str) -> float:
        return self.cache[feature_key(prompt, response)][0]

    def hidden(self, prompt: str, response: str):
        return self.cache[feature_key(prompt, response)][1]


def likelihood_scorer(features: SmolFeatures) -> Scorer:
    def score(pairs: list[Pair]) -> list[float]:
        features.compute([(p.prompt, r) for p in pairs for r in (p.better, p.worse)], desc="likelihood")
        return [features.logprob(p.prompt, p.better) - features.logprob(p.prompt, p.worse) for p in pairs]
    return score


# ---------------------------------------------------------------- the table

# Rewards that never trained on HH pairs: their accuracy on all 647 HH pairs is a fair number.
NEVER_SAW_HH = {"length", "likelihood"}


def environment() -> dict:
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(),
            "load_average_1min": round(os.getloadavg()[0], 2),
            "note": "timings on 2 CPU cores shared with other jobs"}


def evaluate(scorers: dict[str, Scorer], sets: dict[str, list[Pair]],
             likelihood_pairs: dict[str, int] = LIKELIHOOD_PAIRS, subsampled: Sequence[str] = ("likelihood",),
             never_saw_hh: set[str] = NEVER_SAW_HH) -> dict:
    """{set: {reward: accuracy_with_se}}; subsampled rewards get a seeded subsample of the sets named in
    ``likelihood_pairs`` (and none of the others), with length on the same subsample beside them."""
    table: dict[str, dict] = {}
    for set_name, pairs in sets.items():
        row: dict[str, dict] = {"length": accuracy_with_se(pairs, length_margins(pairs))}
        for name, scorer in scorers.items():
            if name == "length" or (set_name == "hh (all 647)" and name not in never_saw_hh):
                continue
            if name in subsampled:
                if set_name not in likelihood_pairs:
                    continue
                sub = subsample(pairs, likelihood_pairs[set_name])
                margins = scorer(sub)
                row[name] = {**accuracy_with_se(sub, margins),
                             "minus_length": difference_with_se(sub, margins, length_margins(sub))}
                row[f"length (on the {name} subsample)"] = accuracy_with_se(sub, length_margins(sub))
            else:
                margins = scorer(pairs)
                row[name] = {**accuracy_with_se(pairs, margins),
                             "minus_length": difference_with_se(pairs, margins, length_margins(pairs))}
        table[set_name] = row
        print(f"{set_name}: " + ", ".join(f"{k} {v['accuracy']}" for k, v in row.items()), flush=True)
    return table


def markdown(table: dict) -> str:
    """Accuracy ± SE per set and reward; [+d ± se] is the paired difference from length on the same pairs."""
    rewards = list(dict.fromkeys(r for row in table.values() for r in row))
    lines = ["| set | " + " | ".join(rewards) + " |", "| --- |" + " --- |" * len(rewards)]
    for set_name, row in table.items():
        n = row["length"]["n"]
        cells = []
        for r in rewards:
            v = row.get(r)
            if v is None or v["accuracy"] is None:
                cells.append("")
                continue
            cell = f"{100 * v['accuracy']:.1f} ± {100 * v['se']:.1f}" + (f" (n={v['n']})" if v["n"] != n else "")
            d = v.get("minus_length")
            if d and d["difference"] is not None:
                cell += f" [{100 * d['difference']:+.1f} ± {100 * d['se']:.1f}]"
            cells.append(cell)
        lines.append(f"| {set_name} (n={n}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_scorers(names: Sequence[str]) -> dict[str, Scorer]:
    from sbon.preference_reward import ASSET_DIR

    scorers: dict[str, Scorer] = {}
    for name in names:
        if name == "length":
            scorers[name] = length_margins
        elif name in ("minilm-pref", "minilm-pref-nolength"):
            scorers[name] = head_scorer(ASSET_DIR, use_length=name == "minilm-pref")
        elif name == "likelihood":
            scorers[name] = likelihood_scorer(SmolFeatures())
        elif Path(name).is_dir() and (Path(name) / "head.safetensors").is_file():
            scorers[Path(name).name] = head_scorer(Path(name))
        else:
            raise SystemExit(f"--rewards: unknown reward {name!r} (length, minilm-pref, minilm-pref-nolength, "
                             "likelihood, or a folder with a head.safetensors)")
    return scorers


# ---------------------------------------------------------------- can a backbone be fine-tuned here?


def finetune_throughput(threads: Sequence[int] = (1, 2), batch: int = 4, tokens: int = 384, steps: int = 2,
                        top_layers: Sequence[int | None] = (None, 2)) -> list[dict]:
    """Training tokens/s of SmolLM2-135M as a reward model (forward + backward + AdamW step).

    ``top_layers=None`` trains every weight; ``k`` trains only the last k blocks (the backward
    pass then stops there), a lower bound on what LoRA on the top blocks would cost. The first
    step is a warm-up and is not timed. Sequences are random token ids of a typical pair length.
    """
    import torch

    from sbon.models import load_generator

    model = load_generator().model.train()
    rows = []
    for k in top_layers:
        for n in threads:
            torch.set_num_threads(n)
            for p in model.parameters():
                p.requires_grad_(k is None)
            if k is not None:
                for block in model.model.layers[-k:]:
                    block.requires_grad_(True)
            params = [p for p in model.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(params, lr=1e-5)
            ids = torch.randint(0, model.config.vocab_size, (batch, tokens))
            times = []
            for _ in range(steps + 1):
                t = time.perf_counter()
                hidden = model.model(input_ids=ids).last_hidden_state
                loss = hidden[:, -1].float().pow(2).mean()  # a scalar per sequence, as a reward head reads
                loss.backward()
                opt.step()
                opt.zero_grad()
                times.append(time.perf_counter() - t)
            rows.append({"trained": "all weights" if k is None else f"top {k} blocks", "threads": n,
                         "batch": batch, "tokens": tokens, "load_average_1min": round(os.getloadavg()[0], 2),
                         "tokens_per_s": round(batch * tokens / min(times[1:]), 1)})
            print(rows[-1], flush=True)
    model.eval().requires_grad_(False)
    return rows


# ---------------------------------------------------------------- variants (step 2)

STAT_NAMES = ("log words", "unique-word ratio", "zlib ratio", "non-ascii share", "lines", "list items",
              "ends with punctuation", "mean word length", "sentences", "bold markers")


def text_statistics(text: str) -> list[float]:
    """Cheap surface statistics of a response; no model involved."""
    import re
    import zlib

    words = text.split()
    n = max(len(words), 1)
    raw = text.encode()
    return [math.log1p(len(words)), len(set(words)) / n, len(zlib.compress(raw)) / max(len(raw), 1),
            sum(ord(c) > 127 for c in text) / max(len(text), 1), text.count("\n"),
            len(re.findall(r"^\s*(?:\d+\.|[-*•])\s", text, re.M)),
            float(text.rstrip()[-1:] in ".!?)\"'") if text.strip() else 0.0,
            sum(len(w) for w in words) / n, len(re.findall(r"[.!?](\s|$)", text)), text.count("**")]


def fit_statistics(pairs: list[Pair], l2: float = 1e-4):
    """Bradley-Terry on standardised differences of text_statistics; returns a Scorer."""
    import torch

    def diffs(ps):
        return torch.tensor([[b - w for b, w in zip(text_statistics(p.better), text_statistics(p.worse))] for p in ps],
                            dtype=torch.float64)

    d = diffs(pairs)
    scale = d.std(0) + 1e-9
    weight = torch.zeros(d.shape[1], dtype=torch.float64, requires_grad=True)
    from .train_reward import lbfgs

    lbfgs([weight], lambda: torch.nn.functional.softplus(-(d / scale) @ weight).mean() + l2 * weight.square().sum())
    w = (weight / scale).detach()
    scorer = lambda ps: ((diffs(ps) @ w).tolist() if ps else [])  # noqa: E731
    scorer.weights = dict(zip(STAT_NAMES, [round(float(x), 4) for x in weight.detach()]))
    return scorer


def statistics_cv(pairs: list[Pair], folds: int = 5) -> dict:
    """k-fold accuracy of fit_statistics on training prompts, all and length-matched."""
    from .train_reward import cv_fold

    done, margins = [], []
    for k in range(folds):
        scorer = fit_statistics([p for p in pairs if cv_fold(p, folds) != k])
        held = [p for p in pairs if cv_fold(p, folds) == k]
        done += held
        margins += scorer(held)
    lm = [i for i, p in enumerate(done) if is_length_matched(p)]
    return {"all": accuracy_with_se(done, margins),
            "length-matched": accuracy_with_se([done[i] for i in lm], [margins[i] for i in lm]),
            "length, all": accuracy_with_se(done, length_margins(done)),
            "length, length-matched": accuracy_with_se([done[i] for i in lm], length_margins([done[i] for i in lm]))}


COMBINED_L2 = 1.0  # on the MiniLM weights; 5-fold CV on training prompts: 0.1 -> 62.5 %, 1 -> 63.1 %, 10 -> 62.4 %


def fit_combined(pairs: list[Pair], l2: float = COMBINED_L2, stats_l2: float = 1e-4):
    """Bradley-Terry on [standardised text-statistics differences, MiniLM pair-feature differences]
    (the minilm-pref features without its length term; log words is among the statistics)."""
    import torch

    from sbon.preference_reward import pair_features

    from .train_reward import embed_cached, lbfgs, pair_tensors

    def diffs(ps):
        t = pair_tensors(ps, embed_cached(pair_texts(ps)), torch.float64)
        stats = torch.tensor([[b - w for b, w in zip(text_statistics(p.better), text_statistics(p.worse))]
                              for p in ps], dtype=torch.float64)
        return stats, pair_features(t.e_p, t.e_better) - pair_features(t.e_p, t.e_worse)

    stats, emb = diffs(pairs)
    scale = stats.std(0) + 1e-9
    d = torch.cat([stats / scale, emb], -1)
    penalty = torch.cat([torch.full((stats.shape[1],), stats_l2, dtype=torch.float64),
                         torch.full((emb.shape[1],), l2, dtype=torch.float64)])
    weight = torch.zeros(d.shape[1], dtype=torch.float64, requires_grad=True)
    lbfgs([weight], lambda: torch.nn.functional.softplus(-(d @ weight)).mean() + (penalty * weight.square()).sum())
    w = weight.detach()

    def scorer(ps: list[Pair]) -> list[float]:
        if not ps:
            return []
        s, e = diffs(ps)
        return (torch.cat([s / scale, e], -1) @ w).tolist()
    return scorer


def combined_cv(pairs: list[Pair], l2_values: Sequence[float] = (0.1, 1.0, 10.0), folds: int = 5) -> dict:
    from .train_reward import cv_fold

    out = {}
    for l2 in l2_values:
        done, margins = [], []
        for k in range(folds):
            scorer = fit_combined([p for p in pairs if cv_fold(p, folds) != k], l2)
            held = [p for p in pairs if cv_fold(p, folds) == k]
            done += held
            margins += scorer(held)
        lm = [i for i, p in enumerate(done) if is_length_matched(p)]
        out[f"l2={l2}"] = {"all": accuracy_with_se(done, margins),
                           "length-matched": accuracy_with_se([done[i] for i in lm], [margins[i] for i in lm])}
        print(f"combined l2={l2}:", out[f"l2={l2}"], flush=True)
    return out


@dataclass
class Variant:
    """A minilm-pref-style head retrained with extra sources (python -m training.train_reward --extra ...)."""
    name: str
    extra: tuple[str, ...]
    use_length: bool = True
    l2: float = 3.0  # the shipped head's CV choice; --cv re-checks it for the variants marked cv
    cv: bool = False


VARIANTS = (Variant("minilm-pref+same-model", ("same-model",), cv=True),
            Variant("minilm-pref+same-model, no length", ("same-model",), use_length=False),
            Variant("minilm-pref+same-model+between-model", ("same-model", "between-model")))


def variant_shares(extra: tuple[str, ...]) -> dict[str, float]:
    from .train_reward import SHARES_EXTRA

    return {k: v for k, v in SHARES_EXTRA.items() if k in ("alpaca", "hh", "offtopic") + extra}


def run_variants(data_dir: Path, sets: dict[str, list[Pair]], variants: Sequence[Variant], cv: bool) -> dict:
    """Train each variant on the training prompts, then score it on the held-out sets beside length."""
    from .train_reward import CACHE_DIR, cross_validate, train

    out: dict = {"cv": {}, "weights": {}}
    scorers: dict[str, Scorer] = {"length": length_margins}
    for v in variants:
        if cv and v.cv:  # L2 checked on the training prompts only
            out["cv"][v.name] = cross_validate(data_dir, (1.0, 3.0, 10.0), extra=v.extra,
                                               shares=variant_shares(v.extra), use_length=v.use_length)
        folder = CACHE_DIR / "reward_variants" / v.name.replace(" ", "").replace(",", "_")
        train(data_dir, folder, v.extra, v.l2, variant_shares(v.extra), v.use_length)
        scorers[v.name] = head_scorer(folder)
    same_train = training_fold(load_data(data_dir).same_model)
    stats = fit_statistics(same_train)
    scorers["text statistics (same-model pairs)"] = stats
    out["cv"]["text statistics (same-model pairs)"] = statistics_cv(same_train)
    out["weights"]["text statistics (same-model pairs)"] = stats.weights
    scorers["text statistics + MiniLM (same-model pairs)"] = fit_combined(same_train)
    if cv:
        out["cv"]["text statistics + MiniLM (same-model pairs)"] = combined_cv(same_train)
    never_saw_hh = NEVER_SAW_HH | {"text statistics (same-model pairs)", "text statistics + MiniLM (same-model pairs)"}
    out["accuracy"] = evaluate(scorers, sets, never_saw_hh=never_saw_hh)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.reward_quality", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA_DIR, help="folder with the AlpacaEval and HH data files")
    parser.add_argument("--rewards", default=",".join(DEFAULT_REWARDS),
                        help="comma-separated: length, minilm-pref, minilm-pref-nolength, likelihood, or head folders")
    parser.add_argument("--likelihood-pairs", type=int, default=None,
                        help="random pairs of every set for the likelihood reward (default: "
                             + ", ".join(f"{v} of {k}" for k, v in LIKELIHOOD_PAIRS.items()) + ", none of the rest)")
    parser.add_argument("--variants", action="store_true",
                        help="instead: retrain the head with extra sources and score the variants (step 2)")
    parser.add_argument("--cv", action="store_true", help="with --variants: also cross-validate L2 on training prompts")
    parser.add_argument("--finetune-throughput", action="store_true",
                        help="instead: measure SmolLM2-135M training tokens/s on this machine")
    parser.add_argument("--out", type=Path, default=None, help=f"result file (default {RESULTS.name} in "
                        "training/results/, _variants or _finetune for the other modes)")
    args = parser.parse_args(argv)
    import torch

    torch.manual_seed(SEED)
    start = time.time()
    command = "python -m training.reward_quality " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.finetune_throughput:
        out = args.out or RESULTS.with_name("reward_quality_finetune.json")
        write(out, {"command": command, "environment": environment(), "throughput": finetune_throughput()})
        return
    sets = eval_sets(load_data(args.data))
    if args.variants:
        result = run_variants(args.data, sets, VARIANTS, args.cv)
        out = args.out or RESULTS.with_name("reward_quality_variants.json")
        write(out, {"command": command, "environment": environment(), "pairs": {k: len(v) for k, v in sets.items()},
                    "variants": [v.__dict__ for v in VARIANTS], **result, "seconds": round(time.time() - start)})
        print(markdown(result["accuracy"]))
        out.with_suffix(".md").write_text(markdown(result["accuracy"]) + "\n")
        return
    sizes = {k: args.likelihood_pairs for k in sets} if args.likelihood_pairs else LIKELIHOOD_PAIRS
    table = evaluate(build_scorers(args.rewards.split(",")), sets, sizes)
    result = {
        "command": command,
        "settings": {"margin": MARGIN, "length_matched": "|log word-count ratio| < log 1.25",
                     "split": "held-out = pairs.is_validation(prompt) (sha1 % 100 < 20)",
                     "likelihood_pairs_per_set": sizes, "likelihood_seed": SEED,
                     "llm_max_response_tokens": LLM_MAX_TOKENS,
                     "se": "standard error clustered by prompt; ties count half",
                     "hh_all_647": f"reported only for rewards that never trained on HH: {sorted(NEVER_SAW_HH)}"},
        "environment": environment(),
        "pairs": {k: len(v) for k, v in sets.items()},
        "accuracy": table,
        "seconds": round(time.time() - start),
    }
    out = args.out or RESULTS
    write(out, result)
    print(markdown(table))
    out.with_suffix(".md").write_text(markdown(table) + "\n")


def write(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
