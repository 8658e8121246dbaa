"""Reward models: anything that scores (prompt, response) pairs.

Every reward has the same small interface, ``score(prompt, responses) -> list[float]``,
and sees responses as *text*. Partial responses are scored exactly like complete ones,
which is what lets the generator and the reward model use different tokenizers.

Capabilities beyond ``score``, found by name: ``score_partial`` (unfinished responses, scored otherwise than
complete ones), ``explain`` (why a response scored what it did), ``with_instructions(prompt, instructions)``
(a copy that judges the prompt by the instructions one run brings: ``bind_instructions``),
``instructions_of(prompt)`` (those instructions, as a saved run records them) and ``check_prompt(prompt)`` (a
one-line SBoNError on a prompt it cannot judge, asked before anything is generated: sbon.algorithms.events).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import torch

from .errors import SBoNError

log = logging.getLogger(__name__)


@runtime_checkable
class RewardModel(Protocol):
    name: str

    def score(self, prompt: str, responses: Sequence[str]) -> list[float]:
        """One reward per response; higher is better."""
        ...


def bind_instructions(reward: Any, prompt: str, instructions: Any) -> Any:
    """The reward one run uses: a reward that judges by instructions bound to this run's own (checked: a
    one-line SBoNError), so that a run of the same prompt text with other instructions never sees them; any
    other reward, or no instructions (None, empty, blank), as it is. ``reward`` may be None (not loaded)."""
    if not instructions or (isinstance(instructions, str) and not instructions.strip()):
        return reward
    bind = getattr(reward, "with_instructions", None)
    return reward if bind is None else bind(prompt, instructions)


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
    """A Hugging Face reward model scored the way its model card (and the paper's code) scores it.

    ``scoring`` says which output is the reward:

    - ``"logits"``: a sequence classifier's first logit (RM-Mistral-7B, FsfairX-LLaMA3-RM: what the
      paper's code reads from a ``sentiment-analysis`` pipeline with ``function_to_apply="none"``);
    - ``"score"``: the ``score`` field of the model's output (ArmoRM-Llama3-8B, whose remote code
      returns the gated preference score beside its 19 objective rewards);
    - ``"tensor"``: the model returns the rewards themselves (Eurus-RM-7B's remote code).

    The (prompt, response) pair is formatted with ``template`` when given (a format string with
    ``{prompt}`` and ``{response}``, e.g. Eurus-RM's ``[INST] {prompt} [/INST]{response}``),
    otherwise with the reward model's own chat template, otherwise as a text pair.
    """

    SCORINGS = ("logits", "score", "tensor")

    def __init__(self, model, tokenizer, name: str = "reward-model", batch_size: int = 16,
                 scoring: str = "logits", template: str | None = None):
        if scoring not in self.SCORINGS:
            raise ValueError(f"scoring must be one of {self.SCORINGS}, got {scoring!r}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.batch_size = batch_size
        self.scoring = scoring
        self.template = template
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # A sequence classifier scores at the last token that is not its config's pad id, so a batch's padding must
        # be that id: padded with another (a config and a tokenizer that name different pad tokens), a shorter
        # response was scored at a padding token, not as it scores alone. Where the config names a pad id of the
        # model's vocabulary, padding takes it (``_pad_id``), and a text's own last token, an end-of-turn token the
        # tokenizer also pads with, still counts; elsewhere the config takes the tokenizer's pad id.
        config = getattr(self.model, "config", None)
        pad = getattr(config, "pad_token_id", None) if config is not None else None
        vocab = getattr(config, "vocab_size", None) if config is not None else None
        self._pad_id = pad if isinstance(pad, int) and pad != self.tokenizer.pad_token_id \
            and 0 <= pad < (vocab or len(self.tokenizer)) else None
        if config is not None and self._pad_id is None:
            config.pad_token_id = self.tokenizer.pad_token_id
        self._rooms: dict[str, int] = {}  # response_room, per prompt
        self._cut: set[str] = set()  # prompts whose responses were cut (said once each)

    @classmethod
    def from_pretrained(cls, name_or_path: str, device: str | torch.device = "cpu",
                        dtype: torch.dtype | None = None, batch_size: int = 16, scoring: str = "logits",
                        template: str | None = None, trust_remote_code: bool = False) -> "SequenceClassifierReward":
        """Load a hub id or folder. Models whose scoring lives in their own code (ArmoRM, Eurus-RM)
        need ``trust_remote_code=True``; Eurus-RM is not a sequence classifier (``scoring="tensor"``
        loads it with ``AutoModel``)."""
        from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

        auto = AutoModel if scoring == "tensor" else AutoModelForSequenceClassification
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        model = auto.from_pretrained(name_or_path, dtype=dtype, trust_remote_code=trust_remote_code).to(device)
        return cls(model, tokenizer, name=str(name_or_path), batch_size=batch_size, scoring=scoring, template=template)

    @property
    def max_tokens(self) -> int | None:
        """The most tokens the reward model reads at once (its tokenizer's ``model_max_length``; None where the
        tokenizer sets no limit)."""
        limit = getattr(self.tokenizer, "model_max_length", None)
        return limit if isinstance(limit, int) and 0 < limit < 1_000_000 else None  # unset: about 1e30

    def _encode(self, prompt: str, responses: Sequence[str], truncation: bool = True, tensors: bool = True):
        """The model's inputs, padded with ``_pad_id`` where it is set; ``truncation`` cuts each to :attr:`max_tokens`
        the tokenizer's way: a formatted text loses its end (the response's), a text pair the longer text's end
        first."""
        tok = self.tokenizer
        kwargs = dict(padding=tensors, truncation=truncation, return_tensors="pt" if tensors else None, verbose=False)
        if self.template is not None:
            enc = tok([self.template.format(prompt=prompt, response=r) for r in responses], **kwargs)
        elif tok.chat_template:
            texts = [tok.apply_chat_template([{"role": "user", "content": prompt},
                                              {"role": "assistant", "content": r}], tokenize=False)
                     for r in responses]
            enc = tok(texts, add_special_tokens=False, **kwargs)
        else:
            enc = tok([prompt] * len(responses), list(responses), **kwargs)
        if tensors and self._pad_id is not None:
            enc["input_ids"][enc["attention_mask"] == 0] = self._pad_id
        return enc

    def response_room(self, prompt: str) -> int | None:
        """How many tokens of a response the model reads after ``prompt`` (None: no limit). Where the prompt's
        formatted text leaves none, every response would be cut away and score the same: a one-line SBoNError.
        A text pair is cut the longer text first, so a response keeps at least half the limit."""
        limit = self.max_tokens
        if limit is None:
            return None
        room = self._rooms.get(prompt)
        if room is None:
            used = len(self._encode(prompt, [""], truncation=False, tensors=False)["input_ids"][0])
            if self.template is None and not self.tokenizer.chat_template:
                room = max(limit - used, limit // 2)
            elif used >= limit:
                raise SBoNError(f"reward '{self.name}' reads at most {limit} tokens, and this prompt takes {used} of "
                                "them: no response would be read, so every one would score the same; shorten the "
                                "prompt or use a reward model that reads more")
            else:
                room = limit - used
            if len(self._rooms) >= 1024:  # a long-lived server sees many prompts: keep the memory bounded
                self._rooms.clear()
                self._cut.clear()
            self._rooms[prompt] = room
        return room

    def check_prompt(self, prompt: str) -> None:
        """Before anything is generated (sbon.algorithms.events): a one-line SBoNError where no response would be
        read after this prompt."""
        self.response_room(prompt)

    def _rewards(self, output) -> torch.Tensor:
        """One reward per row from the model's output, the way its card reads it."""
        if self.scoring == "score":
            values = output.score
        elif self.scoring == "tensor":
            values = output if torch.is_tensor(output) else output[0]
        else:
            values = output.logits[:, 0]
        return values.reshape(-1).float()

    @torch.inference_mode()
    def score(self, prompt: str, responses: Sequence[str]) -> list[float]:
        room = self.response_room(prompt)
        scores: list[float] = []
        for i in range(0, len(responses), self.batch_size):
            batch = self._encode(prompt, responses[i:i + self.batch_size])
            if room is not None and batch["input_ids"].shape[1] >= self.max_tokens and prompt not in self._cut:
                longest = max(len(ids) for ids in self._encode(prompt, responses[i:i + self.batch_size],
                                                               truncation=False, tensors=False)["input_ids"])
                if longest > self.max_tokens:
                    self._cut.add(prompt)
                    log.warning("reward '%s' reads at most %d tokens of prompt and response: a response longer "
                                "than %d tokens here is judged on its beginning", self.name, self.max_tokens, room)
            scores += self._rewards(self.model(**batch.to(self.model.device))).tolist()
        return scores


class LikelihoodReward:
    """The generator's own likelihood as a reward; ``kind`` says which:

    - ``"mean-logprob"``: the mean log-probability of the response's tokens after the (chat-
      templated) prompt. An empty response scores 0.0 (no evidence either way).
    - ``"neg-perplexity"``: minus the perplexity of prompt + response, as the paper's perplexity
      experiment (NeurIPS 2024, Table 2) computes it in its official code
      (``postprocess/eval_ppl.py``): the prompt and the response are joined as one text, put in
      the chat template as a single user turn with the generation prompt (or after the BOS token
      when the generator has no template), and the perplexity is exp of the mean next-token loss
      over the whole sequence, template tokens included.

    ``generator`` is a :class:`sbon.engine.Generator`.
    """

    KINDS = ("mean-logprob", "neg-perplexity")

    def __init__(self, generator, batch_size: int = 16, name: str | None = None, kind: str = "mean-logprob"):
        if kind not in self.KINDS:
            raise ValueError(f"kind must be one of {self.KINDS}, got {kind!r}")
        self.generator = generator
        self.batch_size = batch_size
        self.kind = kind
        self.name = name or ("likelihood" if kind == "mean-logprob" else kind)

    @torch.inference_mode()
    def score(self, prompt: str, responses: Sequence[str]) -> list[float]:
        scorer = self._mean_logprob if self.kind == "mean-logprob" else self._neg_perplexity
        scores: list[float] = []
        for i in range(0, len(responses), self.batch_size):
            scores += scorer(prompt, responses[i:i + self.batch_size])
        return scores

    def _mean_logprob(self, prompt: str, responses: Sequence[str]) -> list[float]:
        gen = self.generator
        chunk = [gen.tokenizer.encode(r, add_special_tokens=False) for r in responses]
        return gen.mean_logprob(gen.encode_prompt(prompt), chunk)

    @torch.inference_mode()
    def score_prefixes(self, prompt: str, prefixes: Sequence[Sequence[str]]) -> list[list[float]]:
        """``score`` of several prefixes of each response (``prefixes[i]``: prefixes of response i, the
        longest last), from one pass per response over its longest prefix. The generator is causal, so
        a prefix whose tokens begin the longest one's has the mean of that pass's first log-probabilities;
        a prefix cut inside what the longest one tokenizes as one token is scored on its own."""
        if self.kind != "mean-logprob":  # the perplexity wraps the text in a template: no shared pass
            return [self.score(prompt, list(group)) for group in prefixes]
        gen = self.generator
        prompt_ids = gen.encode_prompt(prompt)
        ids = [[gen.tokenizer.encode(text, add_special_tokens=False) for text in group] for group in prefixes]
        longest = [group[-1] if group else [] for group in ids]
        logprobs = []
        for i in range(0, len(longest), self.batch_size):
            logprobs += gen.token_logprobs(prompt_ids, longest[i:i + self.batch_size])
        scores, own = [], []
        for i, group in enumerate(ids):
            row = []
            for j, tokens in enumerate(group):
                if not tokens:
                    row.append(0.0)
                elif tokens == longest[i][:len(tokens)]:
                    row.append(float(logprobs[i][:len(tokens)].mean()))
                else:
                    row.append(None)
                    own.append((i, j))
            scores.append(row)
        for (i, j), score in zip(own, self.score(prompt, [prefixes[i][j] for i, j in own])):
            scores[i][j] = score
        return scores

    def perplexity_ids(self, prompt: str, response: str) -> list[int]:
        """The token ids the perplexity is computed over (see the class docstring)."""
        tok = self.generator.tokenizer
        text = prompt + response
        if tok.chat_template:
            text = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False)
        elif tok.bos_token:
            text = tok.bos_token + text
        return tok(text, add_special_tokens=False)["input_ids"]

    @torch.inference_mode()
    def perplexity(self, prompt: str, responses: Sequence[str]) -> list[float]:
        """Perplexity of prompt + response for each response, in one padded batch."""
        model = self.generator.model
        rows = [self.perplexity_ids(prompt, r) for r in responses]
        width = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = torch.tensor(row)
            mask[i, :len(row)] = 1
        ids, mask = ids.to(model.device), mask.to(model.device)
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
        # the loss of the labels = input ids: position p predicts token p + 1; padding is not counted
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
        counted = mask[:, 1:].float()
        return torch.exp((nll * counted).sum(1) / counted.sum(1)).tolist()

    def _neg_perplexity(self, prompt: str, responses: Sequence[str]) -> list[float]:
        return [-p for p in self.perplexity(prompt, responses)]
