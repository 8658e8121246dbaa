"""Reward models: anything that scores (prompt, response) pairs.

Every reward has the same small interface, ``score(prompt, responses) -> list[float]``,
and sees responses as *text*. Partial responses are scored exactly like complete ones,
which is what lets the generator and the reward model use different tokenizers.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class RewardModel(Protocol):
    name: str

    def score(self, prompt: str, responses: Sequence[str]) -> list[float]:
        """One reward per response; higher is better."""
        ...


class CallableReward:
    """Wrap any ``fn(prompt, responses) -> list[float]`` as a reward model."""

    def __init__(self, fn: Callable[[str, Sequence[str]], Sequence[float]], name: str | None = None):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "callable")

    def score(self, prompt: str, responses: Sequence[str]) -> list[float]:
        scores = [float(s) for s in self.fn(prompt, list(responses))]
        if len(scores) != len(responses):
            raise ValueError(f"reward '{self.name}' returned {len(scores)} scores for {len(responses)} responses")
        return scores


class SequenceClassifierReward:
    """A Hugging Face sequence-classification reward model (e.g. an RLHF reward model).

    The reward is the first logit. The (prompt, response) pair is formatted with the reward
    model's own chat template when it has one, otherwise as a text pair.
    """

    def __init__(self, model, tokenizer, name: str = "reward-model", batch_size: int = 16):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.batch_size = batch_size
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if getattr(self.model.config, "pad_token_id", None) is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id

    @classmethod
    def from_pretrained(cls, name_or_path: str, device: str | torch.device = "cpu",
                        dtype: torch.dtype | None = None, batch_size: int = 16) -> "SequenceClassifierReward":
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForSequenceClassification.from_pretrained(name_or_path, dtype=dtype).to(device)
        return cls(model, tokenizer, name=str(name_or_path), batch_size=batch_size)

    def _encode(self, prompt: str, responses: Sequence[str]):
        tok = self.tokenizer
        if tok.chat_template:
            texts = [tok.apply_chat_template([{"role": "user", "content": prompt},
                                              {"role": "assistant", "content": r}], tokenize=False)
                     for r in responses]
            return tok(texts, padding=True, truncation=True, return_tensors="pt", add_special_tokens=False)
        return tok([prompt] * len(responses), list(responses), padding=True, truncation=True, return_tensors="pt")

    @torch.inference_mode()
    def score(self, prompt: str, responses: Sequence[str]) -> list[float]:
        scores: list[float] = []
        for i in range(0, len(responses), self.batch_size):
            batch = self._encode(prompt, responses[i:i + self.batch_size]).to(self.model.device)
            logits = self.model(**batch).logits
            scores += logits[:, 0].float().tolist()
        return scores


class LikelihoodReward:
    """Mean log-probability of the response under a causal LM (the paper's perplexity experiment).

    ``generator`` is a :class:`sbon.engine.Generator`; its chat template formats the prompt.
    An empty response scores 0.0 (no evidence either way).
    """

    def __init__(self, generator, batch_size: int = 16, name: str = "likelihood"):
        self.generator = generator
        self.batch_size = batch_size
        self.name = name

    @torch.inference_mode()
    def score(self, prompt: str, responses: Sequence[str]) -> list[float]:
        gen = self.generator
        prompt_ids = gen.encode_prompt(prompt)
        scores: list[float] = []
        for i in range(0, len(responses), self.batch_size):
            chunk = [gen.tokenizer.encode(r, add_special_tokens=False) for r in responses[i:i + self.batch_size]]
            scores += gen.mean_logprob(prompt_ids, chunk)
        return scores
