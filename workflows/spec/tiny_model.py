"""A tiny HF-format Llama built on the spot (no downloads), for the local target and e2e tests.

Byte-level BPE tokenizer trained on the Python standard library's sources, a chat template, and
random weights with untied, zeroed special-token rows in lm_head: with tied embeddings a random
model emits a special token forever (empty text). Cached by the content of its recipe.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sysconfig
from pathlib import Path

from workflows.errors import InputError

SCHEME = "tiny-model://"
# One path component: the model is built under cache_root(), never anywhere a name could point.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RECIPE = {
    "vocab_size": 4096, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "max_position_embeddings": 2048, "seed": 1234, "corpus_files": 60,
}
SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def cache_root() -> Path:
    return Path(os.environ.get("PDOPS_HOME", Path(__file__).resolve().parents[2] / ".pdops")) / "models"


def recipe_hash() -> str:
    return hashlib.sha256(json.dumps([RECIPE, SPECIALS, CHAT_TEMPLATE], sort_keys=True).encode()).hexdigest()[:12]


def check_name(name: str) -> str:
    """NAME of tiny-model://NAME, or ValueError: a name with `/` or `..` would leave the cache."""
    if not NAME.fullmatch(name):
        raise ValueError(f"tiny-model name {name!r} must be 1-64 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return name


def model_dir(name: str) -> Path:
    try:
        check_name(name)
    except ValueError as exc:
        raise InputError(SCHEME + name, "", str(exc), "use a plain name such as pdops-tiny") from None
    return cache_root() / f"{name}-{recipe_hash()}"


def resolve_source(source: str) -> str:
    """A `tiny-model://NAME` source -> the built directory (building it if needed); others unchanged."""
    if not source.startswith(SCHEME):
        return source
    return str(build(source.removeprefix(SCHEME)))


def _corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))[: RECIPE["corpus_files"]]
    return [str(f) for f in files]


def build(name: str = "pdops-tiny") -> Path:
    out = model_dir(name)
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tmp = out.with_name(out.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # show_progress=False: the trainer's progress bars (written by Rust to the terminal) would land
    # in the middle of `pdops release` output when the release builds the model.
    trainer = trainers.BpeTrainer(vocab_size=RECIPE["vocab_size"], special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>",
                                   pad_token="<|pad|>", model_max_length=RECIPE["max_position_embeddings"])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(tmp)
    cfg_path = tmp / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, indent=2))

    torch.manual_seed(RECIPE["seed"])
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=RECIPE["hidden_size"], intermediate_size=RECIPE["intermediate_size"],
        num_hidden_layers=RECIPE["num_hidden_layers"], num_attention_heads=RECIPE["num_attention_heads"],
        num_key_value_heads=RECIPE["num_key_value_heads"], head_dim=RECIPE["head_dim"],
        max_position_embeddings=RECIPE["max_position_embeddings"], tie_word_embeddings=False,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for token_id in fast.all_special_ids:
            model.lm_head.weight[token_id].zero_()
    # transformers draws a per-shard progress bar on a terminal (modeling_utils.save_pretrained,
    # logging.tqdm); for one small shard it leaves a blank line in the release output.
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(tmp, safe_serialization=True)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    tmp.rename(out)
    return out
