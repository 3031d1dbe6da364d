"""Tiny Hugging Face language models, randomly initialised from a config (no download).

They need ``transformers`` (``pip install transformers``). Each takes token ids
``Nx128:int64`` and, for training as people train them, ``labels=Nx128:int64``: the
model then returns its own loss (``.loss``), which the estimator uses::

    python -m gpu_mem_track estimate gpu_mem_track.examples.hf:tiny_gpt2 \\
        --input 8x128:int64 --input labels=8x128:int64

Sizes are small so tests and checks run fast on a CPU; the configs are the usual
training ones (no key/value cache, dropout as configured, SDPA attention).
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["tiny_bert", "tiny_gpt2", "tiny_llama"]

#: Vocabulary size of the tiny models; token ids and labels must lie below it.
VOCAB = 1000


def tiny_gpt2(
    layers: int = 2, width: int = 64, positions: int = 128, checkpointing: bool = False
) -> nn.Module:
    """``GPT2LMHeadModel``: ``layers`` blocks of width ``width``, 4 heads, no cache; with
    ``checkpointing``, activations are recomputed in backward (gradient checkpointing)."""
    transformers = _transformers()
    config = transformers.GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=4,
        n_positions=positions,
        vocab_size=VOCAB,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return _checkpointed(transformers.GPT2LMHeadModel(config), checkpointing)


def tiny_llama(
    layers: int = 2, width: int = 64, positions: int = 128, checkpointing: bool = False
) -> nn.Module:
    """``LlamaForCausalLM``: RMSNorm, rotary positions, SwiGLU, grouped-query attention
    (4 heads sharing 2 key/value heads), no cache; ``checkpointing`` as for :func:`tiny_gpt2`."""
    transformers = _transformers()
    config = transformers.LlamaConfig(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        vocab_size=VOCAB,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return _checkpointed(transformers.LlamaForCausalLM(config), checkpointing)


def tiny_bert(layers: int = 2, width: int = 64, positions: int = 128) -> nn.Module:
    """``BertForMaskedLM``: ``layers`` encoder blocks of width ``width``, 4 heads."""
    transformers = _transformers()
    config = transformers.BertConfig(
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=2 * width,
        max_position_embeddings=positions,
        vocab_size=VOCAB,
    )
    return transformers.BertForMaskedLM(config)


def _checkpointed(model: Any, checkpointing: bool) -> nn.Module:
    if checkpointing:  # the newer name first: the older one warns in transformers 5
        enable = getattr(model, "activation_checkpointing_enable", None)
        (enable or model.gradient_checkpointing_enable)()
    return model


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ImportError("the Hugging Face examples need transformers: pip install transformers") from None
    return transformers
