"""Evaluation of the minilm-pref head against simple baselines (``python -m training.reward_eval --data DIR``).

1. Pairwise accuracy on the validation prompts of each source, for the head, the response
   length, SmolLM2's likelihood of the response and SmolLM2 asked as a judge. The two SmolLM2
   baselines cost a forward pass per response on the CPU, so they run on a subsample: all
   pairs of a few validation instructions (whose answers are shared by many pairs) and all
   HH pairs; the head and length are reported on the same subsample too.
2. How well partial rewards predict final ones: N SmolLM2 candidates for a few AlpacaEval
   prompts, Kendall's tau between each reward at 32 and 64 tokens and at the end.
3. Scoring latency of the head for 32 partial responses of 64 tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import time
from pathlib import Path
from typing import Sequence

import torch
from scipy.stats import kendalltau
from tqdm import tqdm

from sbon.preference_reward import PreferenceReward, RewardHead, word_count
from sbon.rewards import CallableReward, LikelihoodReward, RewardModel
from sbon.results import Candidate
from .pairs import (ALPACA_FILE, DATA_DIR, HH_FILE, SEED, Pair, check_data, is_validation, length_margins,
                    read_jsonl)
from .train_reward import ASSET_DIR, CACHE_DIR, accuracy, embed_cached, head_margins, load_pairs, text_key

# The SmolLM2 baselines score all pairs of these many random validation AlpacaEval instructions
# and this many random validation HH pairs: a forward pass per response keeps --eval in minutes.
LLM_INSTRUCTIONS, LLM_HH_PAIRS = 6, 40
LLM_MAX_TOKENS = 256  # SmolLM2 baselines see at most this many response tokens, like the encoder
KENDALL_PROMPTS, KENDALL_N, KENDALL_MAX_NEW_TOKENS, KENDALL_AT = 10, 32, 128, (32, 64)
JUDGE_QUESTION = ("Here is a request and a response to it.\n\nRequest: {prompt}\n\nResponse: {response}\n\n"
                  "Is this response helpful and harmless? Answer Yes or No.")


class JudgeReward:
    """The generator asked whether a response is good: log P("Yes") - log P("No") for its first answer token."""

    def __init__(self, generator, batch_size: int = 8, name: str = "smollm2-judge"):
        self.generator = generator
        self.batch_size = batch_size
        self.name = name
        tok = generator.tokenizer
        self.yes, self.no = (tok.encode(w, add_special_tokens=False)[0] for w in ("Yes", "No"))

    @torch.inference_mode()
    def score(self, prompt: str, responses: Sequence[str]) -> list[float]:
        gen = self.generator
        rows = [gen.encode_prompt(JUDGE_QUESTION.format(prompt=prompt, response=r)) for r in responses]
        scores: list[float] = []
        for i in range(0, len(rows), self.batch_size):
            chunk = rows[i:i + self.batch_size]
            ids = torch.zeros(len(chunk), max(map(len, chunk)), dtype=torch.long)
            mask = torch.zeros_like(ids)
            for j, r in enumerate(chunk):
                ids[j, :len(r)], mask[j, :len(r)] = torch.tensor(r), 1
            # Only the last position's logits are needed: skip the full-vocabulary logits of the others.
            hidden = gen.model.model(input_ids=ids.to(gen.device), attention_mask=mask.to(gen.device)).last_hidden_state
            last = hidden[torch.arange(len(chunk)), torch.tensor([len(r) - 1 for r in chunk])]
            logprobs = torch.log_softmax(gen.model.lm_head(last).float(), -1)
            scores += (logprobs[:, self.yes] - logprobs[:, self.no]).tolist()
        return scores


def truncate(tokenizer, text: str, max_tokens: int) -> str:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens])


def reward_margins(reward: RewardModel, pairs: list[Pair], desc: str) -> list[float]:
    """r(better) - r(worse) per pair, scoring each distinct response of a prompt once."""
    by_prompt: dict[str, set[str]] = {}
    for p in pairs:
        by_prompt.setdefault(p.prompt, set()).update((p.better, p.worse))
    scores: dict[tuple[str, str], float] = {}
    for prompt, texts in tqdm(by_prompt.items(), desc=desc, unit="prompt"):
        texts = sorted(texts, key=len)  # similar lengths share a batch: less padding
        scores.update(zip(((prompt, t) for t in texts), reward.score(prompt, texts)))
    return [scores[p.prompt, p.better] - scores[p.prompt, p.worse] for p in pairs]


def llm_subsample(val: list[Pair]) -> list[Pair]:
    rng = random.Random(SEED)
    chosen = set(rng.sample(sorted({p.prompt for p in val if p.source == "alpaca"}), LLM_INSTRUCTIONS))
    hh = rng.sample([p for p in val if p.source == "hh"], LLM_HH_PAIRS)
    return [p for p in val if p.source == "alpaca" and p.prompt in chosen] + hh


def length_matched(pairs: list[Pair], max_log_ratio: float = 0.25) -> list[Pair]:
    """Pairs whose word counts differ by less than about 28%: what is left once length is (mostly) controlled."""
    return [p for p in pairs if abs(math.log((word_count(p.better) + 1) / (word_count(p.worse) + 1))) < max_log_ratio]


def candidates(gen, prompt: str) -> list[Candidate]:
    """N sampled SmolLM2 candidates for a prompt, cached: generating them is most of --eval's time on a CPU."""
    from sbon.algorithms import best_of_n, run

    settings = dict(n=KENDALL_N, max_new_tokens=KENDALL_MAX_NEW_TOKENS, seed=SEED)
    key = text_key(json.dumps([gen.name, prompt, settings]))
    path = CACHE_DIR / "kendall_candidates" / f"{key}.json"
    if path.exists():
        return [Candidate(c["id"], c["token_ids"], stop_reason=c["stop_reason"]) for c in json.loads(path.read_text())]
    silent = CallableReward(lambda prompt, texts: [0.0] * len(texts), name="none")  # candidates only
    cands = run(best_of_n(gen, silent, prompt, **settings)).candidates
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([{"id": c.id, "token_ids": c.token_ids, "stop_reason": c.stop_reason} for c in cands]))
    return cands


def kendall_study(gen, rewards: dict[str, RewardModel], prompts: list[str]) -> tuple[dict, dict]:
    """Kendall's tau between partial and final rewards of N candidates, averaged over prompts; and latency.

    ``rewards`` score texts; the generator's likelihood is added from token log-probabilities.
    """
    names = [*rewards, "smollm2-likelihood"]
    taus: dict[str, dict[int, list[float]]] = {name: {t: [] for t in KENDALL_AT} for name in names}
    latencies, encoder_tokens, finished_early = [], [], 0
    head = rewards["minilm-pref"]
    for prompt in tqdm(prompts, desc="kendall", unit="prompt"):
        cands = candidates(gen, prompt)
        finished_early += sum(c.tokens_generated <= max(KENDALL_AT) for c in cands)
        scores: dict[str, dict[int | None, list[float]]] = {name: {} for name in names}
        texts = {t: [gen.tokenizer.decode(c.token_ids[:t], skip_special_tokens=True) for c in cands]
                 for t in (*KENDALL_AT, None)}  # None: the complete response
        for name, reward in rewards.items():
            scores[name] = {t: reward.score(prompt, texts[t]) for t in texts}
        # The end-of-turn token is not part of the response text that LikelihoodReward would score.
        rows = [c.token_ids[:-1] if c.stop_reason == "eos" and len(c.token_ids) > 1 else c.token_ids for c in cands]
        logprobs = gen.token_logprobs(gen.encode_prompt(prompt), rows)  # a prefix's likelihood: mean of a prefix of these
        scores["smollm2-likelihood"] = {t: [float(lp[:t].mean()) for lp in logprobs] for t in texts}
        for name in names:
            for t in KENDALL_AT:
                tau = kendalltau(scores[name][t], scores[name][None]).statistic
                taus[name][t].append(0.0 if tau != tau else float(tau))  # NaN when a reward is constant
        times = []
        for _ in range(6):
            head._prompt = None  # time the prompt's embedding too, as for a new prompt
            start = time.perf_counter()
            head.score(prompt, texts[64])
            times.append(time.perf_counter() - start)
        latencies.append(times[1:])  # the first call warms up
        encoder_tokens += [len(head.encoder.tokenizer.encode(p)) for p in texts[64]]
    kendall = {name: {f"{t}_tokens": round(statistics.mean(v), 3) for t, v in by_t.items()} for name, by_t in taus.items()}
    kendall["candidates_finished_by_64_tokens"] = finished_early
    # The fastest of 5 runs is the cost of scoring itself; the median also shows what other
    # processes on the same cores added at the time (see the load average).
    latency = {"what": f"PreferenceReward.score of {KENDALL_N} partial responses of 64 SmolLM2 tokens (prompt "
                       f"included), 5 runs for each prompt, on {torch.get_num_threads()} CPU threads",
               "fastest_run_s_median_over_prompts": round(statistics.median(min(t) for t in latencies), 3),
               "median_run_s": round(statistics.median(x for t in latencies for x in t), 3),
               "load_average_1min": round(os.getloadavg()[0], 2), "cpu_count": os.cpu_count(),
               "mean_encoder_tokens": round(statistics.mean(encoder_tokens), 1)}
    return kendall, latency


def evaluate(data_dir: Path, head_dir: Path) -> dict:
    from sbon.models import load_generator

    start = time.time()
    _, val = load_pairs(data_dir)
    emb = embed_cached(sorted({t for p in val for t in (p.prompt, p.better, p.worse)}))
    head, _ = RewardHead.from_folder(head_dir)
    counts = {s: sum(p.source == s for p in val) for s in sorted({p.source for p in val})}
    report: dict = {"validation_pairs": counts, "validation": {
        "minilm-pref": accuracy(val, head_margins(head, val, emb)),
        "minilm-pref-nolength": accuracy(val, head_margins(head, val, emb, use_length=False)),
        "length (more words wins)": accuracy(val, length_margins(val)),
    }}
    matched = length_matched(val)
    report["validation_length_matched"] = {
        "what": "validation pairs whose word counts differ by less than 28% (|log ratio| < 0.25)",
        "pairs": {s: sum(p.source == s for p in matched) for s in counts},
        "minilm-pref": accuracy(matched, head_margins(head, matched, emb)),
        "minilm-pref-nolength": accuracy(matched, head_margins(head, matched, emb, use_length=False)),
        "length (more words wins)": accuracy(matched, length_margins(matched)),
    }

    gen = load_generator("smollm2-135m", device="cpu")
    sub = llm_subsample(val)
    tok = gen.tokenizer  # the SmolLM2 baselines see truncated responses, like the encoder, to bound their cost
    cut = [Pair(p.source, p.kind, p.prompt, truncate(tok, p.better, LLM_MAX_TOKENS), truncate(tok, p.worse, LLM_MAX_TOKENS))
           for p in sub]
    report["subsample"] = {
        "what": f"all pairs of {LLM_INSTRUCTIONS} random validation AlpacaEval instructions and {LLM_HH_PAIRS} random HH "
                f"validation pairs; SmolLM2 sees at most {LLM_MAX_TOKENS} tokens of each response",
        "pairs": {s: sum(p.source == s for p in sub) for s in ("alpaca", "hh")},
        "minilm-pref": accuracy(sub, head_margins(head, sub, emb)),
        "length (more words wins)": accuracy(sub, length_margins(sub)),
        "smollm2-likelihood": accuracy(sub, reward_margins(LikelihoodReward(gen, batch_size=4), cut, "likelihood")),
        "smollm2-judge": accuracy(sub, reward_margins(JudgeReward(gen), cut, "judge")),
    }

    prompts = [r["instruction"] for r in read_jsonl(data_dir / "alpaca_eval_prompts.jsonl")
               if is_validation(r["instruction"])][:KENDALL_PROMPTS]
    rewards: dict[str, RewardModel] = {
        "minilm-pref": PreferenceReward.load("cpu"),
        "minilm-pref-nolength": PreferenceReward.load("cpu", use_length=False),
        "length (words)": CallableReward(lambda prompt, texts: [float(word_count(t)) for t in texts], "length"),
    }
    report["kendall_partial_vs_final"], report["latency"] = kendall_study(gen, rewards, prompts)
    report["kendall_partial_vs_final"]["what"] = (
        f"{KENDALL_N} SmolLM2 candidates (best_of_n sampling, seed {SEED}, max_new_tokens "
        f"{KENDALL_MAX_NEW_TOKENS}) for the first {KENDALL_PROMPTS} validation prompts of alpaca_eval_prompts.jsonl; "
        "Kendall tau-b between the reward of the first t tokens and the final reward, mean over prompts; "
        "the likelihood is the mean log-probability of the generator's own tokens")
    report["eval_seconds"] = round(time.time() - start)
    out = head_dir / "eval.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    print(f"wrote {out}")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.reward_eval", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DATA_DIR, help="folder with the preference data files")
    parser.add_argument("--head", type=Path, default=ASSET_DIR, help="folder of the head; eval.json is written there")
    args = parser.parse_args(argv)
    torch.manual_seed(SEED)
    evaluate(check_data(args.data, (ALPACA_FILE, HH_FILE, "alpaca_eval_prompts.jsonl")), args.head)


if __name__ == "__main__":
    main()
