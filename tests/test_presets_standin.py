"""The current GPU presets, tested offline: each hub model is replaced by a random-initialised stand-in
of the same architecture class, built from the values of its published config.json (only the layer
count and the widths shrunk, the attention-head ratio kept) with a tokenizer that has its family's chat
format, saved to a folder, and loaded through the preset itself (load_reward / load_generator with the
preset's hub id pointed at the folder). What is checked is the path a GPU user's run takes: the
architecture's loader, the chat template, the score read-out, batching with padding, partial and
empty responses, stop tokens and coupled sampling. The weights are random: no quality is tested."""

import re
from dataclasses import replace

import pytest
import torch
import transformers
from transformers import AutoConfig, AutoTokenizer

from sbon import models
from sbon.algorithms import best_of_n, run, speculative_rejection
from sbon.models import load_generator, load_reward

LLAMA3_ROPE = dict(rope_type="llama3", low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)

# preset -> (model_type, architecture, the published config.json values that shape the model)
PUBLISHED = {
    "skywork-v2-qwen3-0.6b": ("qwen3", "Qwen3ForSequenceClassification", dict(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, hidden_act="silu", attention_bias=False)),
    "skywork-v2-qwen3-1.7b": ("qwen3", "Qwen3ForSequenceClassification", dict(
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, hidden_act="silu", attention_bias=False)),
    "skywork-v2-qwen3-8b": ("qwen3", "Qwen3ForSequenceClassification", dict(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, hidden_act="silu", attention_bias=False)),
    "skywork-v2-llama-3.1-8b": ("llama", "LlamaForSequenceClassification", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
        hidden_act="silu", rope_theta=500000.0, rope_scaling=dict(LLAMA3_ROPE, factor=8.0))),
    "grm-gemma2-2b": ("gemma2", "Gemma2ForSequenceClassification", dict(
        hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
        head_dim=256, vocab_size=256000, max_position_embeddings=8192, rope_theta=10000.0, rms_norm_eps=1e-6,
        hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=256, sliding_window=4096,
        final_logit_softcapping=30.0, attn_logit_softcapping=50.0, tie_word_embeddings=True)),
    "llama-3.2-1b-instruct": ("llama", "LlamaForCausalLM", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        head_dim=64, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
        hidden_act="silu", rope_theta=500000.0, rope_scaling=dict(LLAMA3_ROPE, factor=32.0))),
}
REWARD_PRESETS = [name for name, (_, arch, _) in PUBLISHED.items() if arch.endswith("SequenceClassification")]

# Each family's chat format, as a minimal template over the SmolLM2 tokenizer (the one available
# offline) with the family's special tokens added: (special tokens, bos, eos, pad, template).
FAMILIES = {
    "qwen3": ([], None, "<|im_end|>", "<|endoftext|>",
              "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    "llama": (["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], "<|begin_of_text|>",
              "<|eot_id|>", None,
              "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
              "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
              "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"),
    "gemma2": (["<bos>", "<start_of_turn>", "<end_of_turn>"], "<bos>", "<end_of_turn>", "<pad>",
               "{{ bos_token }}{% for m in messages %}<start_of_turn>"
               "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] | trim }}<end_of_turn>\n"
               "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"),
}
# The only values the stand-in changes: two layers and small widths, the query/key-value head ratio kept.
HEADS, HEAD_DIM, HIDDEN = 4, 16, 64

PROMPT = "What is the capital of France?"
RESPONSES = ["Paris.", "The capital of France is Paris, on the Seine.", "", "The capital of Fr", "Lyon, I think"]


def family_tokenizer(gen, folder, model_type: str):
    """SmolLM2's tokenizer with the family's special tokens and chat template, saved and reloaded."""
    specials, bos, eos, pad, template = FAMILIES[model_type]
    gen.tokenizer.save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    if specials or pad:
        tok.add_special_tokens({"additional_special_tokens": specials, **({"pad_token": pad} if pad else {})})
    tok.bos_token, tok.eos_token = bos or tok.bos_token, eos
    if pad is None:
        tok.pad_token = None  # as the Llama 3 tokenizers ship: the reward falls back to the EOS token
    tok.chat_template = template
    return tok


def stand_in(gen, tmp_path, preset: str):
    """The preset's stand-in: its architecture from its published config, shrunk; saved with its tokenizer."""
    model_type, arch, published = PUBLISHED[preset]
    folder = tmp_path / preset
    tok = family_tokenizer(gen, folder, model_type)
    kv_heads = max(1, HEADS * published["num_key_value_heads"] // published["num_attention_heads"])
    values = {**published, "num_hidden_layers": 2, "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN,
              "num_attention_heads": HEADS, "num_key_value_heads": kv_heads, "head_dim": HEAD_DIM,
              "vocab_size": len(tok), "num_labels": 1, "bos_token_id": tok.bos_token_id,
              "eos_token_id": tok.convert_tokens_to_ids(FAMILIES[model_type][2]), "pad_token_id": tok.pad_token_id}
    if "query_pre_attn_scalar" in values:
        values["query_pre_attn_scalar"] = HEAD_DIM
    config = AutoConfig.for_model(model_type, **values)
    torch.manual_seed(0)
    model = getattr(transformers, arch)(config)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, tok


@pytest.fixture
def point_preset_at(monkeypatch):
    def point(presets: dict, name: str, folder) -> None:
        monkeypatch.setitem(presets, name, replace(presets[name], hub_id=str(folder)))
    return point


@pytest.mark.parametrize("presets,name", [*((models.REWARDS, n) for n in REWARD_PRESETS),
                                          (models.GENERATORS, "llama-3.2-1b-instruct")])
def test_new_presets_say_their_size_and_that_they_need_the_network(presets, name):
    description = presets[name].description
    assert "B parameters" in description and re.search(r"needs (the )?network", description)
    assert presets[name].hub_id.count("/") == 1 and not presets[name].offline


@pytest.mark.parametrize("preset", REWARD_PRESETS)
def test_reward_preset_scores_like_its_model_card_over_its_chat_template(gen, tmp_path, point_preset_at, preset):
    """load_reward(preset) on the stand-in: the architecture's class, the chat template, the first logit
    as the reward, the same score in a padded batch as alone, partial and empty responses scored."""
    model_type, arch, _ = PUBLISHED[preset]
    folder, tok = stand_in(gen, tmp_path, preset)
    point_preset_at(models.REWARDS, preset, folder)
    reward = load_reward(preset, device="cpu")
    assert type(reward.model).__name__ == arch and reward.name == preset
    reward.batch_size = 2  # several batches, each padded to its longest response
    scores = reward.score(PROMPT, RESPONSES)

    alone = []
    for response in RESPONSES:
        text = tok.apply_chat_template([{"role": "user", "content": PROMPT}, {"role": "assistant", "content": response}],
                                       tokenize=False)
        assert FAMILIES[model_type][2] in text  # the family's end-of-turn token closes the response
        ids = tok(text, return_tensors="pt", add_special_tokens=False)
        with torch.inference_mode():
            alone.append(float(reward.model(**ids).logits[0, 0]))
    assert scores == pytest.approx(alone, abs=1e-4)
    assert len(set(round(s, 6) for s in scores)) == len(RESPONSES)  # the read-out depends on the response


def test_generator_preset_runs_coupled_speculative_rejection(gen, tmp_path, point_preset_at):
    """load_generator('llama-3.2-1b-instruct') on its stand-in: the Llama 3 chat template, <|eot_id|> as a
    stop token, the long context from its config, and Speculative Rejection's survivors equal to
    Best-of-N's candidates of the same ids (float32 coupling)."""
    folder, tok = stand_in(gen, tmp_path, "llama-3.2-1b-instruct")
    point_preset_at(models.GENERATORS, "llama-3.2-1b-instruct", folder)
    llama = load_generator("llama-3.2-1b-instruct", device="cpu", dtype=torch.float32)
    assert type(llama.model).__name__ == "LlamaForCausalLM" and llama.max_context == 131072
    assert tok.convert_tokens_to_ids("<|eot_id|>") in llama.stop_ids
    ids = llama.encode_prompt(PROMPT)
    assert ids[0] == tok.convert_tokens_to_ids("<|begin_of_text|>")
    assert tok.decode(ids).endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")

    reward = load_reward("likelihood", generator=llama)
    sbon = run(speculative_rejection(llama, reward, PROMPT, 4, alpha=0.5, max_new_tokens=12, seed=5))
    bon = {c.id: c for c in run(best_of_n(llama, reward, PROMPT, 4, max_new_tokens=12, seed=5)).candidates}
    assert any(c.pruned_round is not None for c in sbon.candidates)
    for c in sbon.candidates:
        if c.pruned_round is None:
            assert c.token_ids == bon[c.id].token_ids
        else:
            assert c.token_ids == bon[c.id].token_ids[:len(c.token_ids)]
