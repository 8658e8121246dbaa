"""The prefix value head: its features, its training step, and the shipped heads on the real generator."""

import warnings

import pytest
import torch
from scipy.stats import kendalltau

from sbon.errors import SBoNError
from sbon.value_head import ASSETS, PrefixFeatures, ValueHead, feature_dim, prefix_features
from training import train_value_head
from training.value_data import decode_prompts, prompt_record

PROMPTS = ["Give three tips for staying healthy.", "What is the capital of France?"]
SHIPPED = sorted(p.name for p in ASSETS.glob("smollm2_value*") if (p / "head.safetensors").is_file())


@pytest.fixture(scope="module")
def gen(gen_fp32):
    """Float32 (tests/conftest.py): these tests hold the decode step's states and draws to a full
    forward pass and to Best-of-N's own run, which bfloat16 rounds differently."""
    return gen_fp32


@pytest.fixture(scope="module")
def likelihood(likelihood_fp32):
    return likelihood_fp32


@pytest.fixture(scope="module")
def sampled(gen):
    """4 candidates of 20 tokens for each of two prompts, decoded together, with their hidden states."""
    return decode_prompts(gen, PROMPTS, n=4, max_new_tokens=20)


def test_batched_sampling_draws_the_candidates_best_of_n_draws(gen, sampled):
    from sbon.algorithms import best_of_n, run
    from sbon.rewards import CallableReward

    silent = CallableReward(lambda prompt, texts: [0.0] * len(texts), name="none")
    reference = run(best_of_n(gen, silent, PROMPTS[1], n=4, max_new_tokens=20, seed=0)).candidates
    assert [c.token_ids for c in sampled[1]] == [c.token_ids for c in reference]
    assert [c.stop_reason for c in sampled[1]] == [c.stop_reason for c in reference]


def test_decoding_training_samples_passes_the_cache_by_the_name_transformers_expects(gen):
    """transformers renamed a forward's past_key_values to cache (warning until 5.40 drops the old name)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        decode_prompts(gen, PROMPTS[:1], n=2, max_new_tokens=3)


def test_decode_states_are_the_final_layer_post_norm_states_of_a_full_forward_pass(gen, sampled):
    prompt_ids = gen.encode_prompt(PROMPTS[1])
    cand = sampled[1][0]
    ids = torch.tensor([prompt_ids + cand.token_ids])
    with torch.inference_mode():
        states = gen.model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
        assert torch.allclose(states, gen.model.model(input_ids=ids).last_hidden_state)
    fed = states[0, len(prompt_ids):len(prompt_ids) + len(cand.hidden)]
    assert torch.allclose(fed, cand.hidden, atol=1e-3)


def test_streaming_features_equal_features_recomputed_from_the_whole_prefix(sampled):
    cands = sampled[0]
    steps = min(len(c.hidden) for c in cands)
    stream = PrefixFeatures(len(cands), cands[0].hidden.shape[1], uses_logprob=True)
    with pytest.raises(SBoNError):
        stream.read()
    for t in range(steps):
        stream.update(torch.stack([c.hidden[t] for c in cands]), torch.stack([c.logprobs[t] for c in cands]))
        if t + 1 in (1, 8, steps):
            full = torch.stack([prefix_features(c.hidden[:t + 1], c.logprobs[:t + 1]) for c in cands])
            assert stream.read().shape == (len(cands), feature_dim(cands[0].hidden.shape[1], uses_logprob=True))
            assert torch.allclose(stream.read(), full, atol=1e-5)
    stream.keep([2, 0])  # rows follow the batch when candidates are pruned
    expected = torch.stack([prefix_features(cands[k].hidden[:steps], cands[k].logprobs[:steps]) for k in (2, 0)])
    assert torch.allclose(stream.read(), expected, atol=1e-5)
    with pytest.raises(SBoNError, match="logprob"):
        stream.update(cands[0].hidden[:1].expand(2, -1))


def test_training_step_on_a_tiny_set_fits_the_final_rewards(gen, sampled):
    from sbon.preference_reward import PreferenceReward

    pref = PreferenceReward.load("cpu")
    records = [prompt_record(gen, pref, p, c, "train") for p, c in zip(PROMPTS, sampled)]
    x, y, groups = train_value_head.training_rows(records, "likelihood", at=(8, 16, "full"))
    assert len(y) == len(groups) > len(PROMPTS) * 4  # prefixes and complete responses
    head = train_value_head.fit(x, y, l2=1.0)
    baseline = float(((y - y.mean()) ** 2).mean())  # the best constant prediction
    assert train_value_head.mse(head, x, y) < 0.5 * baseline
    report = train_value_head.evaluate(records, "likelihood", head, at=(8,))
    assert -1 <= report["8_tokens"]["kendall"] <= 1


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_head_loads_and_scores_candidates_of_the_real_generator(gen, sampled, name):
    head, config = ValueHead.load(name)
    assert (ASSETS / name / "head.safetensors").stat().st_size < 1_000_000
    assert config["feature_dim"] == feature_dim(gen.model.config.hidden_size, config["uses_logprob"])
    taus = []
    for cands in sampled:
        steps = min(len(c.hidden) for c in cands)  # a decision point once every candidate has this many
        stream = PrefixFeatures(len(cands), gen.model.config.hidden_size, uses_logprob=config["uses_logprob"])
        for t in range(steps):
            stream.update(torch.stack([c.hidden[t] for c in cands]), torch.stack([c.logprobs[t] for c in cands]))
        scores = head.score(stream.read())
        assert scores.shape == (len(cands),) and torch.isfinite(scores).all()
        assert scores.std() > 0  # it tells the candidates apart
        if config["reward"] == "likelihood":  # a prediction of the final likelihood follows the partial one
            partial = torch.stack([c.logprobs[:steps].mean() for c in cands])
            taus.append(kendalltau(scores, partial).statistic)
    assert not taus or sum(taus) / len(taus) > 0.3


def test_an_unknown_head_is_one_clear_error():
    with pytest.raises(SBoNError, match="no value head"):
        ValueHead.load("no-such-head")


def test_the_head_on_another_generator_s_hidden_states_is_one_clear_error_before_anything_is_generated(gen, likelihood,
                                                                                                       tmp_path):
    """The shipped head reads the embedded generator's states; a generator of another width stops the run in one
    line, where it used to fail on a shape deep inside the decode loop."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from sbon.algorithms import run, speculative_rejection
    from sbon.models import load_generator

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(gen.tokenizer), hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                 eos_token_id=gen.tokenizer.eos_token_id)).save_pretrained(tmp_path)
    gen.tokenizer.save_pretrained(tmp_path)
    other = load_generator(str(tmp_path), weights="fp32")
    with pytest.raises(SBoNError, match=r"reads the hidden states of smollm2-135m \(576 wide\), and generator .* has 32"):
        run(speculative_rejection(other, likelihood, PROMPTS[0], n=4, max_new_tokens=8, prune_by="value-head"))
    result = run(speculative_rejection(gen, likelihood, PROMPTS[0], n=4, max_new_tokens=8, prune_by="value-head"))
    assert result.decision_points  # the generator it was trained on still prunes by it
