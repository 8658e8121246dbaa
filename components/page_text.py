"""The page's prose: the introduction, the notes beside the settings and the tabs, the API's how-to, and the
description of what `/compare` returns (generated from the saved-run dataclasses, so it cannot fall behind
them). Plain strings; app.py places them."""

from __future__ import annotations

from dataclasses import fields

from sbon.analysis.comparison import FORMAT, Comparison
from sbon.results import Candidate, DecisionPoint, PartialReward, RunResult

DOCS_URL = "/gradio_api/file=docs/"  # the docs folder, served beside the page (app.py's static paths)

INTRO = """# SBoN Explorer: Speculative Rejection vs Best-of-N
**Best-of-N** samples N complete responses and returns the one the reward model likes best.
**Speculative Rejection** ([Sun et al., NeurIPS 2024](https://arxiv.org/abs/2410.20290)) starts the same N
*candidates* but, at each *decision point*, scores the unfinished ones with the reward model (their *partial reward*)
and *prunes* the lowest fraction α, so the *survivors* finish with far fewer tokens generated.
Both runs below use the same seed, so candidate k is the same text in both: a pruned candidate is a prefix
of its Best-of-N twin, whose *final reward* tells what pruning it cost."""

REWARD_TITLE = "The default reward is a small model of which answer people prefer, not a judge of quality: why"
REWARD_NOTE = f"""**The default reward is a small model trained on which of two answers people preferred (its name in the API: `minilm-pref`); among answers of one model it mostly rewards length.**
It is the default because, on held-out prompts, its partial rewards beat pruning at random by the widest margin of the page's scenarios and never tie;
pick *Follow instructions* for verdicts you can check, or *Fluency* for the generator's own likelihood ([what the embedded rewards can judge]({DOCS_URL}usage.md), [why this default]({DOCS_URL}method.md))."""

CONTENT_NOTE = ("⚠ marks prompts that deliberately ask for harmful or offensive things (from Anthropic's HH-RLHF "
                "red-teaming set), to show a reward model steering generation away from harmful completions. "
                "The small model may still write something offensive.")

TRADEOFF_NOTE = ("Speculative Rejection with one decision token τ and rejection rate α, **replayed on the "
                 "Best-of-N candidates** (no new generation): what each setting would have returned "
                 "and how many tokens it would have generated.")

GALLERY_NOTE = "Recorded runs that open at once, without generating: pick one."


def device_words(device: object) -> str:
    """Where the models run, as the page says it: 'this machine's processor (CPU)', 'the GPU'."""
    kind = getattr(device, "type", str(device))
    return {"cpu": "this machine's processor (CPU)", "cuda": "the GPU", "mps": "the Mac's GPU"}.get(kind, str(device))


def machine_words(machine: str | None) -> str | None:
    """A run's machine class (``RunResult.machine``) as the page names it: the processor or GPU by its name, without
    the instruction set a CPU's class adds ('AMD EPYC 9B14 (AVX-512 with BF16)' → 'AMD EPYC 9B14'; 'NVIDIA H200
    (GPU)' stays). The saved run, the command line and the docs keep the whole class."""
    name, bracket, kind = (machine or "").rpartition(" (")
    return machine if not bracket or kind == "GPU)" else name


def models_note(device: str, threads: int | None) -> str:
    """Where the models run, under Models and sampling (the CPU threads only on a CPU)."""
    cores = f" ({threads} of its cores at work)" if threads != 1 else " (one of its cores at work)"
    on = f"**{device_words(device)}**" + (cores if device == "cpu" and threads else "")
    return (f"Models run on {on}; the defaults load when the app starts, others on the Run that asks for them, "
            "and they stay loaded.")


LOCAL_ADDRESS = "http://127.0.0.1:7860/"  # where `python app.py` serves the page unless GRADIO_SERVER_PORT says


def api_doc(address: str = LOCAL_ADDRESS) -> str:
    """How to call the app from Python, with ``address``: the page's own, where a client reaches this app."""
    return f"""### Call it from Python
Every comparison the Run button makes is also an API endpoint, `/compare`, returning the run as JSON
(the same file as the download above):
```python
from gradio_client import Client
from sbon.analysis.comparison import Comparison

client = Client("{address}")   # this page's address; a Space's id works too
text = client.predict(prompt="What is Atlantis?", n=8, max_new_tokens=32, api_name="/compare")
comparison = Comparison.from_json(text)
print(comparison.metrics["speedup"], comparison.speculative.best.text)
```
Other arguments: `method` (`"sbon"` or `"sbon-tau"`), `prune_by` (a pruning signal), `undecided` (what a decision point
does with candidates its signal cannot tell apart from the cut: `"paper"`, `"prune"`, `"defer"` or `"random"`), `alpha`, `tau`, `kv_budget`
and `first_decision` (0 = automatic), `temperature`, `top_p`, `seed`, `generator`, `reward`, `bon_same_memory`;
`client.view_api()` lists each with its meaning, type and range, and describes the returned JSON (format
`{FORMAT}`). Requests wait in the same one-at-a-time queue as the Run button."""


# -- what /compare returns: the saved run's keys, level by level ------------------------------------

# The top level's keys (Comparison.to_dict) with their meaning; a Comparison field missing here fails
# tests/test_app_handlers.py.
COMPARISON_KEYS = {
    "format": f"'{FORMAT}'",
    "headline": "the page's headline, as text",
    "wall_time": "the wall-time line, as text",
    "bon": "the Best-of-N run",
    "sbon": "the Speculative Rejection run",
    "partials": "Best-of-N's partial rewards by decision token",
    "metrics": "speedup, normalized_score ≤ 100, token_rate, ...",
    "signal_scores": "each pruning signal's scores of Best-of-N's candidates by token count",
    "uncertainties": "the half-width of each partial reward, where the reward knows it (undecided cuts)",
}
# Keys a run, a candidate carries beyond its dataclass fields: derived for readers of the file, recomputed on load.
RUN_DERIVED = ("decode_steps",)
CANDIDATE_DERIVED = ("tokens_generated",)


def keys_of(cls: type, derived: tuple[str, ...] = ()) -> list[str]:
    """The JSON keys of one saved dataclass: its fields, then what its to_dict adds."""
    return [f.name for f in fields(cls)] + list(derived)


def api_returns() -> str:
    """What `/compare` returns, for view_api() and the API page."""
    top = ", ".join(f"{key} ({meaning})" for key, meaning in COMPARISON_KEYS.items())
    return (f"the comparison as JSON text in the saved-run format '{FORMAT}' (the Download button's file): an object "
            f"with {top}. Each run has {', '.join(keys_of(RunResult, RUN_DERIVED))}; each of its candidates "
            f"{', '.join(keys_of(Candidate, CANDIDATE_DERIVED))} (each partial reward "
            f"{', '.join(keys_of(PartialReward))}); each decision point {', '.join(keys_of(DecisionPoint))}. "
            f"Load it with sbon.analysis.comparison.{Comparison.__name__}.from_json.")
