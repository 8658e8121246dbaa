"""One run's settings: a plain dataclass built once (by the CLI, the app, the benchmarks) and taken
by every method, and the table of methods with the settings each one reads.

A new setting is one field here (with its check in ``validate``) and, if only some methods read
it, its name in those methods' ``params``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from .cut import UNDECIDED, check_undecided
from .decoders import DECODE_PATHS, check_decode
from .engine import SamplingConfig, check_prompt
from .errors import SBoNError

# Tokens each candidate generates before the first decision point when the budget is derived
# from N (or N from the budget): the budget then holds N candidates of this length. Chosen as the
# smallest decision token at which one cut keeps a mean normalized score >= 98 in the `minilm-pref`
# (the default reward) counterfactual data (python -m benchmarks counterfactual); docs/method.md
# shows it beside the other rewards, from their result files. `first_decision` overrides it.
FIRST_DECISION_TOKENS = 32
GPU_DECODE_CHUNK = 8  # decode_chunk's default on a GPU (RunConfig.chunk_on)


@dataclass(frozen=True)
class MethodSpec:
    name: str
    label: str  # how the page, the tables and the docs name it
    params: tuple[str, ...]  # the RunConfig fields it reads beside the common ones
    prunes: bool  # a Speculative Rejection variant (has decision points)
    short: str  # its name without the variant, where a phone's width holds no more (the race a running page shows)


METHOD_SPECS = {
    "sbon": MethodSpec("sbon", "Speculative Rejection (memory-budget rounds)",
                       ("alpha", "kv_budget", "first_decision", "prune_by", "undecided"), True,
                       "Speculative Rejection"),
    "sbon-tau": MethodSpec("sbon-tau", "Speculative Rejection (one decision token τ)",
                           ("alpha", "tau", "prune_by", "undecided"), True,
                           "Speculative Rejection"),
    "bon": MethodSpec("bon", "Best-of-N", ("batch_size",), False, "Best-of-N"),
}
PRUNING_METHODS = tuple(name for name, spec in METHOD_SPECS.items() if spec.prunes)
COMMON_PARAMS = ("n", "max_new_tokens", "temperature", "top_p", "top_k", "seed")


# A setting's name in a message, as the page labels it and as validate's messages say it ("max new tokens", not
# max_new_tokens); a setting not listed is named as it is.
IN_WORDS = {"n": "N", "alpha": "α", "tau": "τ", "kv_budget": "the KV budget", "first_decision": "the first decision point",
            "max_new_tokens": "max new tokens", "top_p": "top-p", "top_k": "top-k", "seed": "the seed"}


def resolve_first_decision(first_decision: int | None, max_new_tokens: int) -> int:
    """The first decision point in tokens: the given one (checked), else the default, or half of
    ``max_new_tokens`` for shorter responses."""
    if first_decision is None:
        if max_new_tokens < 2:
            raise SBoNError(f"max new tokens={max_new_tokens} leaves no room for a decision point: Speculative "
                            "Rejection needs at least 2")
        return max(1, min(FIRST_DECISION_TOKENS, max_new_tokens // 2))
    if first_decision < 1:
        raise SBoNError(f"the first decision point must be at least 1 token, got {first_decision}")
    if first_decision >= max_new_tokens:
        raise SBoNError(f"the first decision point ({first_decision} tokens) must come before max new tokens "
                        f"({max_new_tokens}), or no candidate is ever pruned")
    return first_decision


def setting(default: Any, help: str, choices: Callable[[], list[str]] | None = None) -> Any:
    """A RunConfig field with the help text (and choices) that every front end shows for it: the CLI
    and the recording script build their options from these (sbon.options), so a new setting is
    written once, here."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


def _signal_names() -> list[str]:
    from .signals import SIGNALS  # signals import the engine's types only; imported when asked, no cycle
    return list(SIGNALS)


@dataclass
class RunConfig:
    """Everything that defines a run but the models and the prompt."""
    method: str = setting("sbon", "; ".join(f"{s.name}: {s.label}" for s in METHOD_SPECS.values()),
                          choices=lambda: list(METHOD_SPECS))
    n: int | None = setting(16, "candidates to start with (sbon: none = as many as the KV budget holds)")
    alpha: float = setting(0.5, "rejection rate at each decision point: the fraction of candidates in "
                                "contention that is halted")
    tau: int = setting(32, "sbon-tau: the decision token")
    kv_budget: int | None = setting(None, "sbon: KV cache budget in tokens (none: N candidates of prompt + "
                                          "first-decision tokens)")
    first_decision: int | None = setting(None, f"sbon: tokens before the first decision point when the budget "
                                               f"comes from N (none: {FIRST_DECISION_TOKENS}, or half of the "
                                               f"max new tokens if shorter)")
    batch_size: int | None = setting(None, "bon: candidates per batch (none: all at once)")
    prune_by: str = setting("reward", "sbon, sbon-tau: the pruning signal that scores live candidates at a decision "
                                      "point (the final choice is always by the reward model)", choices=_signal_names)
    undecided: str = setting("paper", "sbon, sbon-tau: what a decision point does with the candidates its pruning "
                                      "signal cannot tell apart from the cut (by the signal's own uncertainty): paper "
                                      "(rank them anyway, the paper's rule), prune (halt only the decided ones below "
                                      "the cut), defer (keep them for one more decision point, which catches up on the "
                                      "pruning and draws among those still undecided) "
                                      "or random (fill the survivors' places by a seeded draw); a signal without an "
                                      "uncertainty keeps the paper's rule", choices=lambda: list(UNDECIDED))
    max_new_tokens: int = setting(128, "tokens each candidate may generate")
    temperature: float = setting(0.8, "sampling temperature")
    top_p: float = setting(0.95, "nucleus sampling: keep the smallest set of tokens with this much probability")
    top_k: int = setting(0, "keep only the k most likely tokens (0 = off)")
    seed: int = setting(0, "seed of the coupled sampling: candidate k is the same text in every method")
    # How every method decodes, not what it gives (the same candidates, events and decision points): in no
    # method's params, so not among the settings() a result records.
    decode_chunk: int | None = setting(None, "tokens decoded per check for finished candidates: the tokens stay on "
                                             "the device and finished rows leave the batch once per chunk; a chunk "
                                             "never crosses a decision point or the max new tokens, so the run is the "
                                             "same (1 = check after every token; none: 8 on a GPU, where each check "
                                             "is a device-to-host sync, and 1 elsewhere)")
    decode: str = setting("auto", "how the decode step runs: eager (transformers' forward op by op), compiled (one "
                                  "torch.compile'd step over a static KV slab; CUDA graphs on a GPU) or auto (the "
                                  "path python -m sbon machine measured fastest here, exact on a CPU; before anything "
                                  "is measured, eager on a CPU and CUDA graphs on a GPU; SBON_DECODE overrides it)",
                          choices=lambda: list(DECODE_PATHS))

    @classmethod
    def build(cls, sampling: SamplingConfig | None = None, **settings: Any) -> "RunConfig":
        """A RunConfig from keyword settings, with the sampling given as a SamplingConfig if at all
        (the form the keyword shortcuts of the algorithms and comparison take)."""
        if sampling is not None:
            settings.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
        return cls(**settings)

    @property
    def spec(self) -> MethodSpec:
        return METHOD_SPECS[self.method]

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_p, self.top_k)

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    def validate(self, prompt: str | None = None) -> "RunConfig":
        """Check every setting that needs no model (and the prompt, if given), so that bad input fails
        in one line before anything loads or runs. Returns self, so calls chain."""
        if self.method not in METHOD_SPECS:
            raise SBoNError(f"unknown method {self.method!r}: use one of {', '.join(METHOD_SPECS)}")
        if prompt is not None:
            check_prompt(prompt)
        if self.n is not None and self.n < 1:
            raise SBoNError(f"N must be at least 1, got {self.n}")
        if self.max_new_tokens < 1:
            raise SBoNError(f"max new tokens must be at least 1, got {self.max_new_tokens}")
        if self.seed < 0:
            raise SBoNError(f"the seed must be a whole number of at least 0, got {self.seed}")
        if not 0 <= self.alpha < 1:
            raise SBoNError(f"alpha (the rejection rate) must be in [0, 1), got {self.alpha}")
        if self.method == "sbon-tau":
            if self.tau < 1:
                raise SBoNError(f"τ (the decision token) must be at least 1, got {self.tau}")
            if self.tau >= self.max_new_tokens:
                raise SBoNError(f"τ={self.tau} (the decision token) must be below max new tokens={self.max_new_tokens}, "
                                "or no candidate is ever pruned")
        if self.kv_budget is not None and self.kv_budget < 1:
            raise SBoNError(f"the KV budget must be a positive number of tokens, got {self.kv_budget}")
        if self.decode_chunk is not None and self.decode_chunk < 1:
            raise SBoNError(f"the decode chunk must be at least 1 token (1 = check for finished candidates after "
                            f"every token), got {self.decode_chunk}")
        check_decode(self.decode)
        if self.batch_size is not None and self.batch_size < 1:
            raise SBoNError(f"the batch size must be at least 1, got {self.batch_size}")
        if self.method == "sbon":
            resolve_first_decision(self.first_decision, self.max_new_tokens)
        if self.spec.prunes:
            from .signals import check_signal  # as in _signal_names: no cycle at import time
            check_signal(self.prune_by)
            check_undecided(self.undecided)
        self.sampling.validate()
        return self

    def chunk_on(self, device: Any) -> int:
        """The decode chunk on this device (a torch.device): the one set, or by default GPU_DECODE_CHUNK on a GPU,
        where checking for finished candidates after every token costs a device-to-host sync that stalls the
        queued kernels (benchmarks/results/gpu-h100: decode_chunk 8 against 1), and 1 elsewhere, where finished
        rows carried to a chunk's end would only cost compute."""
        if self.decode_chunk is not None:
            return self.decode_chunk
        return GPU_DECODE_CHUNK if device.type == "cuda" else 1

    def settings(self) -> dict[str, Any]:
        """The settings this method reads, by name: what a result records."""
        return {name: getattr(self, name) for name in COMMON_PARAMS + self.spec.params}
