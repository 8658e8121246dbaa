"""The GPU check's models: stand-ins with random weights of the embedded models' architectures, with their real
tokenizers (shipped in ``benchmarks/assets``), built on the device directly: nothing to download or stage. Random
weights never choose to stop, so the engine and paper-scale parts force each candidate's length
(``ForcedLengthGenerator``). The app part loads them in place of the packaged models where those are absent
(``app_generator``, ``app_reward``): same architectures, same tokenizers, same code paths, meaningless texts."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from sbon.attention import use_decode_attention
from sbon.engine import DTYPE_FORMATS, DTYPES, Generator, weight_format
from sbon.models import default_weights

ASSETS = Path(__file__).resolve().parent / "assets"

STAND_IN = "random-smollm2-135m"  # the default --generator: SmolLM2-135M's architecture, random weights
TOKENIZER_DIR = ASSETS / "smollm2-135m-tokenizer"
MINILM_DIR = ASSETS / "minilm-l6-v2-tokenizer"  # the reward encoder's tokenizer and sizes

# HuggingFaceTB/SmolLM2-135M-Instruct's config.json, less its vocabulary (the tokenizer's).
SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, head_dim=64, max_position_embeddings=8192, rope_theta=100000.0,
                    rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=True)
# Llama-3-8B's published config.json (meta-llama/Meta-Llama-3-8B), less its vocabulary: the stand-in takes
# SmolLM2's tokenizer (the one shipped here), which trims the embedding and head.
LLAMA_3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                  hidden_act="silu", tie_word_embeddings=False)
TINY_ARCH = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16)

@functools.lru_cache(maxsize=1)
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer and chat template, shipped in the repository (no package, no hub)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


def random_llama(tokenizer, device: torch.device, dtype: torch.dtype, arch: dict, classifier: bool = False):
    """A Llama model of this architecture (SMOLLM2_135M, LLAMA_3_8B, with overrides) with random weights, built
    on the device directly in its dtype: no download, no host copy of an 8B model."""
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    config = LlamaConfig(**arch, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id, num_labels=1)
    cls = LlamaForSequenceClassification if classifier else LlamaForCausalLM
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def force_stops(logits: torch.Tensor, done_rows: Sequence[int], stop_ids: torch.Tensor, stop_id: int) -> torch.Tensor:
    """The logits with every stop token ruled out, except in ``done_rows``, where ``stop_id`` is the only
    token left: the one rule both engines apply to the stand-ins."""
    logits = logits.index_fill(-1, stop_ids.to(logits.device), float("-inf"))
    if done_rows:
        logits[list(done_rows)] = float("-inf")
        logits[list(done_rows), stop_id] = 0.0
    return logits


class ForcedLengthGenerator(Generator):
    """A generator whose candidate k stops after ``lengths[k]`` tokens (a candidate not in ``lengths`` runs to
    the length limit): random weights never choose to stop, and real responses have long-tailed lengths. No
    stop token is drawn by chance; every other token is sampled as usual. ``logits_processor`` applies the same
    rule to ``generate``, whose row k is candidate k."""

    def __init__(self, model, tokenizer, lengths: dict[int, int] | None = None, name: str = "forced-length",
                 weights: str | None = None):
        super().__init__(model, tokenizer, name=name, weights=weights)
        self.lengths = lengths or {}
        self.stop_id = tokenizer.eos_token_id
        self.prompt_tokens = 0

    def done_rows(self, candidate_ids: Sequence[int], generated: int) -> list[int]:
        """Rows whose candidate's next token, the ``generated``-th, is its last."""
        return [i for i, k in enumerate(candidate_ids) if self.lengths.get(k, math.inf) <= generated]

    def prefill(self, prompt_ids):
        self.prompt_tokens = len(prompt_ids)
        prefix = super().prefill(prompt_ids)
        prefix.logits = force_stops(prefix.logits, [], self._stop_tensor, self.stop_id)  # lengths are at least 2
        return prefix

    def forward(self, batch, tokens: torch.Tensor) -> None:
        super().forward(batch, tokens)
        generated = batch.cache.get_seq_length() - self.prompt_tokens + 1  # the token now being chosen
        batch.logits = force_stops(batch.logits, self.done_rows(batch.candidate_ids, generated), self._stop_tensor,
                                   self.stop_id)

    def logits_processor(self, prompt_tokens: int):
        """The same forced lengths for ``model.generate`` on a prompt of this many tokens."""
        from transformers import LogitsProcessor, LogitsProcessorList

        gen = self

        class ForcedLengths(LogitsProcessor):
            def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
                done = gen.done_rows(range(input_ids.shape[0]), input_ids.shape[1] - prompt_tokens + 1)
                return force_stops(scores, done, gen._stop_tensor, gen.stop_id)

        return LogitsProcessorList([ForcedLengths()])


def stand_in(tokenizer, device: torch.device, dtype: str, arch: dict, name: str = STAND_IN,
             cls: type[Generator] = ForcedLengthGenerator) -> Generator:
    """A random model of this architecture, prepared for the device as load_generator prepares a loaded one."""
    weights = DTYPE_FORMATS.get(DTYPES[dtype])  # float16: as it is
    model = random_llama(tokenizer, device, DTYPES[dtype], arch)
    if weights:
        model = weight_format(weights).prepare(model, device)
    return cls(use_decode_attention(model, device), tokenizer, name=name, weights=weights)


def forced_lengths(n: int, median: int, limit: int, seed: int) -> dict[int, int]:
    """Long-tailed response lengths (log-normal around ``median``), between 2 tokens and the limit."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.exp(rng.normal(math.log(median), 0.6, n)).round(), 2, limit).astype(int)
    return {k: int(v) for k, v in enumerate(lengths)}


# -- the app's models ---------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def minilm_tokenizer():
    """all-MiniLM-L6-v2's WordPiece tokenizer, shipped in the repository."""
    from transformers import BertTokenizerFast

    return BertTokenizerFast(str(MINILM_DIR / "vocab.txt"), do_lower_case=True)


def app_generator(arch: dict | None = None):
    """A loader of the app's generator (``ModelCache``'s ``load_gen``): the SmolLM2 stand-in under the preset's
    name, in the weight format the app would load on that device, ``arch`` overriding its sizes."""
    def load(name: str, device=None, weights: str | None = None, **_) -> Generator:
        device = torch.device(device or "cpu")
        fmt = weights or default_weights(device, name)
        dtype = next((d for d, f in DTYPE_FORMATS.items() if f == fmt), torch.float32)
        dtype_name = next(k for k, v in DTYPES.items() if v == dtype)
        return stand_in(smollm2_tokenizer(), device, dtype_name, {**SMOLLM2_135M, **(arch or {})}, name=name,
                        cls=Generator)
    return load


def app_reward():
    """A loader of the app's reward (``ModelCache``'s ``load_rew``): the ``minilm-pref`` reward with its committed
    head over an encoder of all-MiniLM-L6-v2's architecture with random weights."""
    def load(name: str, generator: Generator | None = None, device=None):
        from transformers import BertConfig, BertModel

        from sbon.preference_reward import PreferenceReward, RewardHead, TextEncoder

        head, config = RewardHead.from_folder()
        sizes = json.loads((MINILM_DIR / "architecture.json").read_text())
        with torch.device(device or "cpu"):
            encoder = BertModel(BertConfig(**sizes)).eval()
        return PreferenceReward(TextEncoder(encoder, minilm_tokenizer(), max_tokens=config["max_tokens"]), head,
                                name=name)
    return load
