import pytest

from memfit.spec import ModelSpec

ALL7 = ("q", "k", "v", "o", "gate", "up", "down")


def small_llama(**changes) -> ModelSpec:
    """The shape used for the byte-exact autograd checks in research/memory-physics.md §9.1."""
    config = dict(model_type="llama", hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=64, vocab_size=32000,
                  tie_word_embeddings=False, torch_dtype="bfloat16")
    config.update(changes)
    return ModelSpec.from_hf_config(config, name="small-llama", source="test")


@pytest.fixture
def llama_small():
    return small_llama()
