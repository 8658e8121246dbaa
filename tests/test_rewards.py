"""Reward models: a sequence classifier built offline, the likelihood reward, plain callables."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from sbon.errors import SBoNError
from sbon.models import load_reward
from sbon.rewards import CallableReward, SequenceClassifierReward

PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def tiny_reward_dir(gen, tmp_path_factory):
    """A tiny, randomly initialized Llama reward model saved to disk, with the generator's tokenizer
    (and so its chat template): the same files a hub reward model has."""
    folder = tmp_path_factory.mktemp("tiny-rm")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(gen.tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=1,
                         pad_token_id=gen.tokenizer.pad_token_id or gen.tokenizer.eos_token_id)
    LlamaForSequenceClassification(config).save_pretrained(folder)
    gen.tokenizer.save_pretrained(folder)
    return folder


def test_sequence_classifier_loads_from_a_folder(tiny_reward_dir):
    reward = load_reward(str(tiny_reward_dir), device="cpu")
    assert isinstance(reward, SequenceClassifierReward)
    responses = ["Paris.", "The capital of France is Paris, a city on the Seine.", "", "I like trains."]
    scores = reward.score(PROMPT, responses)
    assert len(scores) == 4 and all(isinstance(s, float) for s in scores)
    assert len(set(scores)) > 1  # the text changes the score
    # Batching and padding do not change a response's score, and order is preserved.
    one_by_one = [reward.score(PROMPT, [r])[0] for r in responses]
    assert scores == pytest.approx(one_by_one, abs=1e-4)
    reward.batch_size = 3
    assert reward.score(PROMPT, responses[::-1]) == pytest.approx(scores[::-1], abs=1e-4)


@pytest.mark.parametrize("template", [None, "{prompt}\n{response}<|im_end|>"])
def test_a_response_scores_as_alone_in_a_batch_padded_with_another_token_than_its_config_names(gen, template):
    """A sequence classifier scores at the last token that is not its config's pad id. Here the config names
    another one (id 0, as Gemma's config does by default) than the tokenizer pads with (its end-of-turn token):
    padded with the tokenizer's, a shorter response was scored at a padding token. Each response scores as alone,
    at its text's last token, also where that token is the one the tokenizer pads with (the second template)."""
    torch.manual_seed(0)
    tokenizer = gen.tokenizer
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=1, initializer_range=0.3,
                         pad_token_id=0)
    assert tokenizer.pad_token_id not in (None, 0)
    model = LlamaForSequenceClassification(config).eval()
    reward = SequenceClassifierReward(model, tokenizer, template=template)
    responses = ["Paris.", "The capital of France is Paris, a city on the Seine.", "Lyon, I think."]
    with torch.inference_mode():
        alone = [model(**reward._encode(PROMPT, [r])).logits[0, -1].item() for r in responses]
    assert reward._encode(PROMPT, ["Paris."])["input_ids"][0, -1] == (
        tokenizer.pad_token_id if template else tokenizer.encode("\n")[0])
    assert reward.score(PROMPT, responses) == pytest.approx(alone, abs=1e-4)
    assert len(set(round(a, 3) for a in alone)) == 3 and model.config.pad_token_id == 0


def test_sequence_classifier_uses_the_chat_template(tiny_reward_dir):
    reward = load_reward(str(tiny_reward_dir), device="cpu")
    batch = reward._encode(PROMPT, ["Paris."])
    text = reward.tokenizer.decode(batch["input_ids"][0])
    assert "<|im_start|>user" in text and "<|im_start|>assistant" in text and PROMPT in text


def test_a_reward_that_reads_too_few_tokens_for_the_prompt_stops_the_run_before_it_generates(tiny_reward_dir, gen,
                                                                                            caplog):
    """A reward model reads at most its tokenizer's model_max_length tokens, and a formatted text loses its end
    first: a prompt that fills them leaves every response unread (every score the same), one that nearly fills
    them has long responses judged on their beginning, said once."""
    from sbon.algorithms import events, run
    from sbon.config import RunConfig

    reward = load_reward(str(tiny_reward_dir), device="cpu")
    assert reward.max_tokens is None and reward.response_room(PROMPT) is None  # this tokenizer sets no limit
    reward = load_reward(str(tiny_reward_dir), device="cpu")
    reward.tokenizer.model_max_length = 48
    long_prompt = "Describe the sea, please. " * 8
    stream = events(gen, reward, long_prompt, RunConfig("bon", n=2, max_new_tokens=4))
    with pytest.raises(SBoNError, match=r"reads at most 48 tokens, and this prompt takes \d+ of them"):
        next(stream)  # before any token is generated
    room = reward.response_room(PROMPT)
    assert 0 < room < 48
    caplog.set_level("WARNING", logger="sbon.rewards")
    short, long_a, long_b = "Paris.", "Paris " * 2 * room, "Lyon " * 2 * room
    first = reward.score(PROMPT, [short, long_a, long_b])
    assert len(set(first)) == 3  # the beginnings differ
    reward.score(PROMPT, [long_a])
    cut = [r.getMessage() for r in caplog.records if "judged on its beginning" in r.getMessage()]
    assert cut == [f"reward '{tiny_reward_dir}' reads at most 48 tokens of prompt and response: a response longer "
                   f"than {room} tokens here is judged on its beginning"]
    result = run(events(gen, reward, PROMPT, RunConfig("bon", n=2, max_new_tokens=4)))
    assert len(result.candidates) == 2


def test_likelihood_prefers_fluent_text(likelihood):
    fluent = "The capital of France is Paris."
    scrambled = "Paris France capital the is of The."
    fluent_score, scrambled_score = likelihood.score(PROMPT, [fluent, scrambled])
    assert fluent_score > scrambled_score
    assert likelihood.score(PROMPT, [""]) == [0.0]


def test_likelihood_batches_like_single_calls(likelihood_fp32):
    """In float32: bfloat16 rounds a padded batch's rows differently from a row alone."""
    likelihood = likelihood_fp32
    responses = ["Paris.", "It is Paris, of course, the largest city in France.", "Lyon"]
    likelihood.batch_size = 2
    try:
        batched = likelihood.score(PROMPT, responses)
    finally:
        likelihood.batch_size = 16
    assert batched == pytest.approx([likelihood.score(PROMPT, [r])[0] for r in responses], abs=1e-4)


def test_callable_reward():
    reward = CallableReward(lambda prompt, responses: [len(r) for r in responses], name="length")
    assert reward.score("p", ["a", "abc"]) == [1.0, 3.0]
    bad = CallableReward(lambda prompt, responses: [1.0])
    with pytest.raises(ValueError):
        bad.score("p", ["a", "b"])


def test_unknown_reward_name_fails_fast():
    with pytest.raises(SBoNError, match="unknown reward 'no-such-reward'"):
        load_reward("no-such-reward")
    with pytest.raises(SBoNError, match="likelihood reward needs the generator"):
        load_reward("likelihood")


# -- -perplexity over prompt + response (the paper's Table 2 reward) ------------------------------

@pytest.fixture(scope="module")
def neg_ppl(gen):
    return load_reward("neg-perplexity", generator=gen)


def test_neg_perplexity_is_the_official_loss_over_prompt_and_response(gen, neg_ppl):
    # The official code: perplexity = exp(model(ids, labels=ids).loss) over the templated prompt + output.
    response = "The capital of France is Paris."
    ids = neg_ppl.perplexity_ids(PROMPT, response)
    text = gen.tokenizer.decode(ids)
    assert "<|im_start|>user" in text and PROMPT + response in text and text.rstrip().endswith("assistant")
    with torch.inference_mode():
        t = torch.tensor([ids])
        official = float(torch.exp(gen.model(input_ids=t, labels=t).loss))
    assert neg_ppl.score(PROMPT, [response]) == pytest.approx([-official], rel=1e-4)
    assert neg_ppl.name == "neg-perplexity" and neg_ppl.kind == "neg-perplexity"


def test_neg_perplexity_prefers_fluent_text_and_batches_like_single_calls(neg_ppl):
    responses = ["The capital of France is Paris.", "Paris France capital the is of The.", "", "Lyon"]
    scores = neg_ppl.score(PROMPT, responses)
    assert scores[0] > scores[1] and all(s < -1 for s in scores)  # a perplexity is at least 1
    neg_ppl.batch_size = 3
    try:
        assert neg_ppl.score(PROMPT, responses) == pytest.approx(scores, rel=1e-4)
    finally:
        neg_ppl.batch_size = 16
    assert scores == pytest.approx([neg_ppl.score(PROMPT, [r])[0] for r in responses], rel=1e-4)


def test_likelihood_kinds_differ_and_unknown_kind_fails(gen, likelihood, neg_ppl):
    from sbon.rewards import LikelihoodReward

    response = "The capital of France is Paris."
    assert likelihood.kind == "mean-logprob" and likelihood.score(PROMPT, [response]) != neg_ppl.score(PROMPT, [response])
    with pytest.raises(ValueError, match="kind must be one of"):
        LikelihoodReward(gen, kind="perplexity")
    with pytest.raises(SBoNError, match="neg-perplexity reward needs the generator"):
        load_reward("neg-perplexity")


# -- the paper's reward presets: each scored the way its model card and the official code do -----

class _Out:
    """What a model's forward returns: ArmoRM's output has .score (and .rewards), a classifier .logits."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


class StandIn(torch.nn.Module):
    """A stand-in reward model: reward = number of non-padding tokens of each row, returned the way
    the real model returns it (ArmoRM: output.score of shape (B, 1); Eurus-RM: a (B, 1) tensor;
    a classifier: logits of shape (B, labels) whose first column is the reward)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind, self.seen = kind, []
        self.config = _Out(pad_token_id=None)
        self.register_buffer("anchor", torch.zeros(1))

    @property
    def device(self):
        return self.anchor.device

    def forward(self, input_ids, attention_mask=None, **_):
        self.seen.append(input_ids)
        r = attention_mask.sum(1, keepdim=True).float()
        if self.kind == "score":
            return _Out(score=r, rewards=torch.randn(len(r), 19))
        if self.kind == "tensor":
            return r
        return _Out(logits=torch.cat([r, -r], dim=1))


@pytest.mark.parametrize("kind", ["score", "tensor", "logits"])
def test_each_scoring_reads_the_models_own_reward_output(gen, kind):
    model = StandIn(kind)
    reward = SequenceClassifierReward(model, gen.tokenizer, scoring=kind, batch_size=2)
    responses = ["Paris.", "It is Paris, of course.", "Lyon"]
    scores = reward.score(PROMPT, responses)
    lengths = [len(reward._encode(PROMPT, [r])["input_ids"][0]) for r in responses]
    assert scores == [float(n) for n in lengths]  # not the second logit, not the 19 objectives
    assert len(model.seen) == 2  # two batches of at most 2


def test_eurus_template_formats_the_pair_like_the_official_code(gen):
    reward = SequenceClassifierReward(StandIn("tensor"), gen.tokenizer, scoring="tensor",
                                      template="[INST] {prompt} [/INST]{response}")
    ids = reward._encode(PROMPT, ["Paris."])["input_ids"][0]
    assert gen.tokenizer.decode(ids, skip_special_tokens=True) == f"[INST] {PROMPT} [/INST]Paris."
    with pytest.raises(ValueError, match="scoring must be one of"):
        SequenceClassifierReward(StandIn("tensor"), gen.tokenizer, scoring="logit")


@pytest.mark.parametrize("preset, expected", [
    ("armorm-llama3-8b", dict(scoring="score", template=None, trust_remote_code=True)),
    ("eurus-rm-7b", dict(scoring="tensor", template="[INST] {prompt} [/INST]{response}", trust_remote_code=True)),
    ("rm-mistral-7b", dict(scoring="logits", template=None, trust_remote_code=False)),
    ("fsfairx-llama3-8b", dict(scoring="logits", template=None, trust_remote_code=False)),
])
def test_paper_presets_load_with_their_scoring(monkeypatch, preset, expected):
    from sbon import models

    calls = []

    def fake_from_pretrained(source, **kwargs):
        calls.append((source, kwargs))
        return CallableReward(lambda p, rs: [0.0] * len(rs))

    monkeypatch.setattr(models.SequenceClassifierReward, "from_pretrained", staticmethod(fake_from_pretrained))
    monkeypatch.setattr(models, "check_reachable", lambda *args: None)  # the hub is not what this test asks about
    reward = load_reward(preset, device="cpu")
    (source, kwargs), = calls
    assert source == models.REWARDS[preset].hub_id and reward.name == preset
    assert {k: kwargs[k] for k in expected} == expected
