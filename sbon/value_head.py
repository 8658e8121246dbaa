"""A prefix value head: a free partial reward from the generator's own hidden states.

At a decision point every live candidate has just fed its t-th response token, so the
generator's final-layer (post-norm) hidden state at that position is already computed. A small
linear head over features of these states predicts what a reward model will say of the
*complete* response (distilled from the reward model on the generator's own samples, see
``training/train_value_head.py`` and the model cards under ``sbon/assets/``). Scoring costs a
dot product per candidate: no second forward pass, no reward model call.

Features of a prefix of t response tokens with hidden states h_1..h_t:
``[mean(h_1..h_t), h_t, log(t)]``, and for heads whose config says ``"uses_logprob": true`` also
the mean log-probability of those t tokens under the generator (the likelihood reward of the
prefix; the decode step has the logits it comes from). :class:`PrefixFeatures` keeps them up
to date one decode step at a time; :func:`prefix_features` computes the same from a whole
(t, d) sequence.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from .errors import SBoNError

ASSETS = Path(__file__).resolve().parent / "assets"


def feature_dim(hidden_size: int, uses_logprob: bool = False) -> int:
    return 2 * hidden_size + 1 + uses_logprob


def hidden_size_of(features: int, uses_logprob: bool = False) -> int:
    """The hidden width a head of ``features`` features reads: feature_dim's inverse."""
    return (features - 1 - uses_logprob) // 2


def prefix_features(hidden: torch.Tensor, logprobs: torch.Tensor | None = None) -> torch.Tensor:
    """Features of one prefix from its (t, d) hidden states (and (t,) token log-probabilities):
    [mean, last, log t(, mean log-probability)]."""
    t = hidden.shape[0]
    if t == 0:
        raise SBoNError("a prefix needs at least one response token to have features")
    h = hidden.float()
    parts = [h.mean(0), h[-1], torch.tensor([math.log(t)], device=h.device)]
    if logprobs is not None:
        parts.append(logprobs.float().mean().reshape(1).to(h.device))
    return torch.cat(parts)


class PrefixFeatures:
    """Running features of many candidates, updated with one (rows, d) hidden state per step.

    Rows follow the decode batch: call :meth:`keep` with the row indices the batch keeps when
    candidates finish or are pruned.
    """

    def __init__(self, rows: int, hidden_size: int, uses_logprob: bool = False, device: str | torch.device = "cpu"):
        self.sum = torch.zeros(rows, hidden_size, device=device)
        self.last = torch.zeros(rows, hidden_size, device=device)
        self.count = torch.zeros(rows, device=device)
        self.logprob_sum = torch.zeros(rows, device=device) if uses_logprob else None

    def update(self, hidden: torch.Tensor, logprob: torch.Tensor | None = None) -> None:
        """Add the (rows, d) hidden state of the token each row has just fed (and that token's
        (rows,) log-probability, which heads with ``uses_logprob`` need)."""
        h = hidden.float()
        self.sum += h
        self.last = h.clone()
        self.count += 1
        if self.logprob_sum is not None:
            if logprob is None:
                raise SBoNError("this value head uses token log-probabilities: pass logprob= to update")
            self.logprob_sum += logprob.float().to(self.logprob_sum.device)

    def keep(self, rows: torch.Tensor | list[int]) -> None:
        """Keep these rows, in this order (the decode batch's rows after pruning)."""
        index = torch.as_tensor(rows, dtype=torch.long, device=self.sum.device)
        self.sum, self.last, self.count = self.sum[index], self.last[index], self.count[index]
        if self.logprob_sum is not None:
            self.logprob_sum = self.logprob_sum[index]

    def read(self) -> torch.Tensor:
        """(rows, f) features, as :func:`prefix_features` of each row's prefix."""
        if (self.count == 0).any():
            raise SBoNError("read before any update: a prefix needs at least one response token")
        parts = [self.sum / self.count[:, None], self.last, self.count.log()[:, None]]
        if self.logprob_sum is not None:
            parts.append((self.logprob_sum / self.count)[:, None])
        return torch.cat(parts, dim=-1)


class ValueHead(nn.Module):
    """score = standardised(features) . w + b: a prediction of the reward of the complete response."""

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("scale", torch.ones(dim))
        self.linear = nn.Linear(dim, 1)

    @torch.no_grad()
    def set_standardisation(self, features: torch.Tensor) -> None:
        self.mean.copy_(features.mean(0))
        self.scale.copy_(features.std(0).clamp_min(1e-6))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear((features.float() - self.mean) / self.scale).squeeze(-1)

    def score(self, features: torch.Tensor) -> torch.Tensor:
        """(rows,) predicted final rewards from (rows, f) features."""
        with torch.inference_mode():
            return self(features.to(self.mean.device))

    def save(self, folder: Path, config: dict) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().float().contiguous() for k, v in self.state_dict().items()},
                  str(folder / "head.safetensors"))
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    @classmethod
    def load(cls, name_or_folder: str | Path) -> tuple["ValueHead", dict]:
        """A head from ``sbon/assets/<name>/`` or any folder with head.safetensors and config.json."""
        from safetensors.torch import load_file

        folder = Path(name_or_folder)
        if not (folder / "config.json").is_file():
            folder = ASSETS / str(name_or_folder).replace("-", "_")
        if not (folder / "config.json").is_file():
            raise SBoNError(f"no value head '{name_or_folder}': expected head.safetensors and config.json in {folder}")
        config = json.loads((folder / "config.json").read_text())
        head = cls(config["feature_dim"])
        config.setdefault("uses_logprob", False)
        head.load_state_dict(load_file(str(folder / "head.safetensors")))
        return head.requires_grad_(False).eval(), config
