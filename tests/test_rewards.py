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


def test_sequence_classifier_uses_the_chat_template(tiny_reward_dir):
    reward = load_reward(str(tiny_reward_dir), device="cpu")
    batch = reward._encode(PROMPT, ["Paris."])
    text = reward.tokenizer.decode(batch["input_ids"][0])
    assert "<|im_start|>user" in text and "<|im_start|>assistant" in text and PROMPT in text


def test_likelihood_prefers_fluent_text(likelihood):
    fluent = "The capital of France is Paris."
    scrambled = "Paris France capital the is of The."
    fluent_score, scrambled_score = likelihood.score(PROMPT, [fluent, scrambled])
    assert fluent_score > scrambled_score
    assert likelihood.score(PROMPT, [""]) == [0.0]


def test_likelihood_batches_like_single_calls(likelihood):
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
