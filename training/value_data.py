"""The generator's own samples, their prefix features and their rewards, cached for value heads.

    python -m training.value_data --data DIR --split train --prompts 200 --n 8 --batch-prompts 8
    python -m training.value_data --data DIR --split eval --prompts 24 --n 16 --batch-prompts 4

For each prompt: N SmolLM2 candidates, sampled as ``best_of_n`` samples them (the engine's
sampler and coupled random streams, so reproducible from the seed), several prompts to a batch.
The decode loop keeps the final-layer hidden state of every token it feeds back, as the engine's
decode step does, hence the features of every prefix (``sbon.value_head``), and every token's
log-probability. Cached per prompt under ``--cache`` (outside the repository):
features at t in PREFIX_TOKENS and of the full response, and each reward's score of the partial
text at t and of the full response. A rerun skips prompts already cached, so an interrupted run
resumes.

Split (fixed, documented in the model cards): the held-out instructions are the first 20 of
alpaca_eval_prompts.jsonl (the benchmarks' prompts) and every instruction in minilm-pref's
validation fold (``sha1(instruction) % 100 < 20``); none of them is ever used in training.
``--split eval`` samples held-out instructions other than the first 20 (so that nothing is tuned
to the benchmarks' prompts); ``--split bench`` the first 20 themselves.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from transformers import DynamicCache

from sbon.engine import CACHE_KEYWORD, SamplingConfig, coupled_uniforms, sample
from sbon.preference_reward import PreferenceReward, word_count
from sbon.value_head import prefix_features
from .pairs import SEED, check_data, is_validation, read_jsonl
from .train_reward import text_key

PROMPTS_FILE = "alpaca_eval_prompts.jsonl"
SHIPPED_DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"  # it ships there (benchmarks/data/README.md)
BENCH_PROMPTS = 20  # the benchmarks' prompts: held out, and not used to choose anything either
PREFIX_TOKENS = (8, 16, 32, 64, 128)
MAX_NEW_TOKENS = 128
CACHE = Path(os.environ.get("VALUE_CACHE", "/work/cache-value13"))


def split_prompts(data_dir: Path) -> dict[str, list[str]]:
    """train / eval / bench instructions, each list in a seeded random order."""
    prompts = [r["instruction"] for r in read_jsonl(data_dir / PROMPTS_FILE)]
    bench = prompts[:BENCH_PROMPTS]
    held = [p for p in prompts[BENCH_PROMPTS:] if is_validation(p) and p not in bench]
    train = [p for p in prompts[BENCH_PROMPTS:] if not is_validation(p) and p not in bench]
    rng = random.Random(SEED)
    rng.shuffle(held)
    rng.shuffle(train)
    return {"train": train, "eval": held, "bench": bench}


@dataclass
class Sampled:
    """One candidate, with what decoding computed on the way: no second forward pass."""
    token_ids: list[int]
    stop_reason: str  # "eos" or "length"
    hidden: torch.Tensor  # (fed tokens, d) final-layer states at the response tokens the decoder fed back
    logprobs: torch.Tensor  # (fed tokens,) their log-probabilities under the generator


@torch.inference_mode()
def decode_prompts(gen, prompts: list[str], n: int, max_new_tokens: int, seed: int = SEED,
                   sampling: SamplingConfig = SamplingConfig()) -> list[list[Sampled]]:
    """N candidates for each of several prompts in ONE batch (left-padded), as the engine samples them.

    Each prompt's rows use the engine's coupled uniform streams for (seed, candidate id), so the
    samples are the ones ``best_of_n`` draws, up to float rounding from the padding. The hidden
    state of every token fed back is kept, exactly what the decode step hands a pruning signal.
    A response token is fed back unless it ends the candidate (end of turn, or the last allowed
    token), so those have no state: features of the full response cover the fed tokens.
    """
    model = gen.model
    prompt_ids = [gen.encode_prompt(p) for p in prompts]
    width = max(map(len, prompt_ids))
    rows = len(prompts) * n
    ids = torch.zeros(rows, width, dtype=torch.long)
    mask = torch.zeros(rows, width, dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        ids[i * n:(i + 1) * n, width - len(p):], mask[i * n:(i + 1) * n, width - len(p):] = torch.tensor(p), 1
    position = (mask.cumsum(-1) - 1).clamp_min(0)
    uniforms = torch.cat([coupled_uniforms(seed, range(n), max_new_tokens) for _ in prompts])
    cache = DynamicCache()
    h = model.model(input_ids=ids, attention_mask=mask, position_ids=position, **{CACHE_KEYWORD: cache},
                    use_cache=True).last_hidden_state[:, -1]
    logits = model.lm_head(h).float()
    position = position[:, -1]
    tokens, states, logprobs = [], [], []
    stopped = torch.full((rows,), max_new_tokens)  # tokens each row generated
    for t in range(max_new_tokens):
        tok = sample(logits, uniforms[:, t], sampling)
        tokens.append(tok)
        ends = gen.is_stop(tok) & (stopped == max_new_tokens)
        stopped[ends] = t + 1
        if t + 1 == max_new_tokens or (stopped < max_new_tokens).all():
            break
        logprobs.append(torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1))
        mask = torch.cat([mask, torch.ones(rows, 1, dtype=torch.long)], dim=-1)
        position = position + 1
        h = model.model(input_ids=tok[:, None], attention_mask=mask, position_ids=position[:, None],
                        **{CACHE_KEYWORD: cache}, use_cache=True).last_hidden_state[:, -1]
        states.append(h.float())
        logits = model.lm_head(h).float()
    tokens_, states_, logprobs_ = torch.stack(tokens, 1), torch.stack(states, 1), torch.stack(logprobs, 1)
    out: list[list[Sampled]] = []
    for i in range(len(prompts)):
        cands = []
        for r in range(i * n, (i + 1) * n):
            k = int(stopped[r])
            eos = bool(gen.is_stop(tokens_[r, k - 1:k]).item())
            fed = max(1, k - 1)  # the last token is never fed back (a 1-token response keeps its own state)
            cands.append(Sampled(tokens_[r, :k].tolist(), "eos" if eos else "length",
                                 states_[r, :fed].clone(), logprobs_[r, :fed].clone()))
        out.append(cands)
    return out


def prompt_record(gen, pref: PreferenceReward, prompt: str, cands: list[Sampled], split: str) -> dict:
    """Features and rewards of one prompt's candidates at every prefix length."""
    lengths = [len(c.hidden) for c in cands]
    cuts = {**{t: [min(t, n) for n in lengths] for t in PREFIX_TOKENS}, "full": lengths}
    feats = {t: torch.stack([prefix_features(c.hidden[:k]) for c, k in zip(cands, ks)]) for t, ks in cuts.items()}
    # The reward sees the text: the partial text at t, and the whole response (end of turn aside) at the end.
    texts = {t: [gen.decode(c.token_ids[:k]) for c, k in zip(cands, ks)] for t, ks in cuts.items()}
    texts["full"] = [gen.decode(c.token_ids) for c in cands]
    e_p = pref.encoder.embed([prompt])
    scores: dict[str, dict] = {"minilm-pref": {}, "minilm-pref-nolength": {}, "likelihood": {}}
    for t, ts in texts.items():
        e_r = pref.encoder.embed(ts)  # minilm-pref with and without its length term from one embedding
        words = torch.tensor([word_count(x) for x in ts])
        scores["minilm-pref"][t] = pref.head(e_p, e_r, words, use_length=True)
        scores["minilm-pref-nolength"][t] = pref.head(e_p, e_r, words, use_length=False)
        scores["likelihood"][t] = torch.stack([c.logprobs[:k].mean() for c, k in zip(cands, cuts[t])])
    return {"prompt": prompt, "split": split, "token_ids": [c.token_ids for c in cands],
            "stop_reason": [c.stop_reason for c in cands], "lengths": lengths,
            "logprobs": [c.logprobs for c in cands], "features": feats, "scores": scores,
            "settings": dict(n=len(cands), max_new_tokens=MAX_NEW_TOKENS, seed=SEED, generator=gen.name,
                             temperature=SamplingConfig().temperature, top_p=SamplingConfig().top_p)}


def record_path(cache: Path, prompt: str) -> Path:
    return cache / "samples" / f"{text_key(prompt)}.pt"


def load_records(cache: Path, split: str) -> list[dict]:
    """Every cached record of a split (whatever number of prompts was sampled)."""
    records = [torch.load(p, weights_only=False) for p in sorted((cache / "samples").glob("*.pt"))]
    return [r for r in records if r["split"] == split]


def collect(data_dir: Path, split: str, prompts: int, n: int, cache: Path = CACHE, batch_prompts: int = 4) -> None:
    from sbon.models import load_generator

    torch.manual_seed(SEED)
    gen = load_generator()
    pref = PreferenceReward.load("cpu")
    todo = split_prompts(data_dir)[split][:prompts]
    start = time.time()
    todo = [p for p in todo if not record_path(cache, p).exists()]
    for first in tqdm(range(0, len(todo), batch_prompts), desc=f"sampling {split}", unit="batch"):
        group = todo[first:first + batch_prompts]
        for prompt, cands in zip(group, decode_prompts(gen, group, n, MAX_NEW_TOKENS)):
            path = record_path(cache, prompt)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            torch.save(prompt_record(gen, pref, prompt, cands, split), tmp)
            tmp.rename(path)  # atomic: an interrupted run never leaves half a record
    print(f"{split}: {len(todo)} prompts in {time.time() - start:.0f} s, load average {os.getloadavg()[0]:.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.value_data", description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=SHIPPED_DATA, help="folder with alpaca_eval_prompts.jsonl")
    parser.add_argument("--split", choices=("train", "eval", "bench"), default="train")
    parser.add_argument("--prompts", type=int, default=100, help="how many prompts of the split to sample")
    parser.add_argument("--n", type=int, default=16, help="candidates per prompt")
    parser.add_argument("--batch-prompts", type=int, default=4, help="prompts decoded together in one batch")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where the records go (outside the repository)")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    collect(check_data(args.data, (PROMPTS_FILE,)), args.split, args.prompts, args.n, args.cache, args.batch_prompts)


if __name__ == "__main__":
    main()
