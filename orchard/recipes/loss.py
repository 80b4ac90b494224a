"""Token-level losses shared by the recipes: the SFT negative log-likelihood and the GRPO/PPO
clipped policy loss, both on the log-probs of ``token_logprobs``.

Alignment. A sample is given per input token (length T, as the proxy's samples give it):
``loss_mask[i]`` and the engine's ``logprobs[i]`` are about ``input_ids[i]``. A causal model
predicts token i from the logits at position i - 1, so its log-probs live on a prediction grid
of length T - 1 whose slot j is about ``input_ids[j + 1]``. ``shift`` moves per-input-token
tensors onto that grid (it drops position 0, which nothing predicts):

    logprobs, entropy = token_logprobs(model, input_ids, attention_mask,   # [B, T-1]
                                       mask=shift(loss_mask))
    loss, stats = ppo_clip_loss(logprobs, shift(old_logprobs), advantages, shift(loss_mask),
                                entropy=entropy)

Aggregation is a token-level mean over every masked token of the batch (DAPO's choice, whose
asymmetric clip the recipe uses): each trained token weighs the same, so long responses are not
down-weighted per token. Masked (observation, padding) tokens contribute nothing, even when
their inputs are NaN or inf.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


def shift(x: Tensor) -> Tensor:
    """A per-input-token tensor [..., T] on the prediction grid [..., T - 1] (drops position 0)."""
    if x.shape[-1] < 2:
        raise ValueError(f"need at least 2 tokens to shift, got shape {tuple(x.shape)}")
    return x[..., 1:]


def pad_right(rows: Sequence[Sequence[Any]], fill: Any, dtype: torch.dtype) -> Tensor:
    """Rows of different lengths as one [len(rows), longest] tensor, padded on the right (the
    side ``token_logprobs`` wants)."""
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([list(r) + [fill] * (width - len(r)) for r in rows], dtype=dtype)


def pad_id_of(model: torch.nn.Module) -> int:
    """The id batches are padded with: the model's pad token, else its (first) eos token."""
    config = model.config
    pad = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
    if isinstance(pad, list):
        pad = pad[0]
    if pad is None:
        raise ValueError("the model's config has neither pad_token_id nor eos_token_id; set "
                         "one so batches can be padded")
    return pad


def token_logprobs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None,
                   *, mask: Tensor | None = None, entropy: bool = True
                   ) -> tuple[Tensor, Tensor | None]:
    """(log-prob of input_ids[:, 1:] under logits[:, :-1], entropy of each of those predictive
    distributions), both [B, T-1] float32 with gradients.

    ``model`` is a causal LM returning an object with ``.logits`` (Hugging Face style). Pad on
    the right (and give the padding mask 0): position ids count from the first column, so left
    padding would shift them. Memory: one float32 log-softmax over the vocabulary; the entropy
    is computed from it, not from a second softmax.

    ``mask`` ([B, T-1], the loss's mask on the prediction grid) limits the vocabulary
    projection to the slots the loss reads; the others hold 0. For small models the
    projection is a large share of the work (~40% of the forward FLOPs of the demo's tiny
    Llama, ~20% of SmolLM2-135M's), and the trained tokens of a conversation are a fraction of
    it (about a quarter in the demo)."""
    if input_ids.dim() != 2 or input_ids.shape[1] < 2:
        raise ValueError(f"input_ids must be [batch, tokens] with at least 2 tokens, got shape "
                         f"{tuple(input_ids.shape)}")
    targets = input_ids[:, 1:]
    head = _plain_head(model) if mask is not None else None
    if head is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        return _logprobs_of(logits[:, :-1], targets, entropy)
    mask = _token_mask(mask, targets.shape)
    base, lm_head = head
    hidden = base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    picked = _logprobs_of(lm_head(hidden[:, :-1][mask]), targets[mask], entropy)
    return tuple(None if x is None else x.new_zeros(targets.shape).masked_scatter(mask, x)
                 for x in picked)  # type: ignore[return-value]


def _logprobs_of(logits: Tensor, targets: Tensor, entropy: bool) -> tuple[Tensor, Tensor | None]:
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    logprobs = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not entropy:  # SFT needs none: skip a second pass over the vocabulary
        return logprobs, None
    return logprobs, -(log_probs.exp() * log_probs).sum(-1)


# Architectures whose logits are not just the output projection of the last hidden state
# (Gemma 2/3 soft-cap them, Cohere and Granite scale them): those take the full forward.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def _plain_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(backbone, output projection) when logits = projection(backbone's last hidden state)."""
    # A LoRA (peft) model: its adapters sit inside the wrapped model's layers.
    unwrap = getattr(model, "get_base_model", None)
    if callable(unwrap):
        model = unwrap()
    config = getattr(model, "config", None)
    base = getattr(model, "base_model", None)
    get_head = getattr(model, "get_output_embeddings", None)
    if config is None or base is None or base is model or get_head is None:
        return None
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return None
    head = get_head()
    return (base, head) if isinstance(head, torch.nn.Linear) else None


def _check_shape(name: str, x: Tensor, shape: torch.Size) -> None:
    if x.shape != shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)} but the log-probs have "
                         f"{tuple(shape)}: shift per-input-token tensors with shift()")


def _token_mask(mask: Tensor, shape: torch.Size) -> Tensor:
    _check_shape("mask", mask, shape)
    if mask.dtype != torch.bool:
        if ((mask != 0) & (mask != 1)).any():
            raise ValueError("mask must hold only 0 and 1 (or be a bool tensor)")
        mask = mask != 0
    if not mask.any():
        raise ValueError("mask selects no tokens: the batch has nothing to train on")
    return mask


def _masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    # where, not multiply: 0 * nan is nan, and masked slots may hold anything
    return torch.where(mask, x, 0.0).sum()


def masked_nll(logprobs: Tensor, mask: Tensor, *, num_tokens: float | None = None) -> Tensor:
    """The SFT loss: mean negative log-likelihood over the masked tokens.

    ``num_tokens`` (default: the mask's count) is what the sum is divided by: pass the token
    count of the whole batch when accumulating gradients over micro-batches."""
    mask = _token_mask(mask, logprobs.shape)
    count = mask.sum() if num_tokens is None else num_tokens
    return -_masked_sum(logprobs, mask) / count


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    entropy: Tensor | None = None,
    entropy_coef: float = 1e-4,
    num_tokens: float | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """The PPO clipped surrogate with an entropy bonus and, with ``ref_logprobs``, GRPO's KL
    penalty to a reference policy.

    ratio = exp(logprobs - old_logprobs); per token min(ratio * A, clip(ratio, 1 - clip_low,
    1 + clip_high) * A); loss = -(token mean of that) - entropy_coef * (token mean of entropy)
    + kl_coef * (token mean of exp(d) - d - 1, d = ref_logprobs - logprobs: the k3 estimate
    of KL(new || ref), as DeepSeekMath's GRPO). ``logprobs``, ``old_logprobs``, ``mask`` (and
    ``entropy``, ``ref_logprobs``) are [B, T] on the same grid; ``advantages`` is [B] (one per
    sequence, broadcast over its tokens, as GRPO does) or [B, T]. ``num_tokens`` as in
    ``masked_nll``.

    Stats (floats, over the masked tokens): clip_fraction (share of tokens whose objective the
    clip cut, so they get no gradient), ratio_mean, approx_kl (mean of (ratio - 1) - log ratio,
    the k3 estimator of KL(old || new)), ratio_sq_mean (the ratio's second moment: its spread
    is sqrt(ratio_sq_mean - ratio_mean ** 2), pooled exactly across micro-batches), entropy
    when given, and ref_kl (that KL estimate) with ``ref_logprobs``."""
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [batch, tokens], got shape {tuple(logprobs.shape)}")
    if not 0 <= clip_low < 1 or clip_high < 0:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, "
                         f"{clip_high}")
    mask = _token_mask(mask, logprobs.shape)
    _check_shape("old_logprobs", old_logprobs, logprobs.shape)
    if entropy is not None:
        _check_shape("entropy", entropy, logprobs.shape)
    if ref_logprobs is not None:
        _check_shape("ref_logprobs", ref_logprobs, logprobs.shape)
    if advantages.shape == logprobs.shape[:1]:
        advantages = advantages.unsqueeze(1)
    elif advantages.shape != logprobs.shape:
        raise ValueError(f"advantages must be [batch] or [batch, tokens] = "
                         f"{tuple(logprobs.shape)}, got shape {tuple(advantages.shape)}")
    # Masked slots are neutralised before any arithmetic, so that neither the loss nor the
    # gradient sees what they hold (old log-probs of observations are often missing).
    log_ratio = torch.where(mask, logprobs - old_logprobs.detach().to(logprobs.dtype), 0.0)
    adv = torch.where(mask, advantages.detach().to(logprobs.dtype), 0.0)
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high)
    objective = torch.minimum(ratio * adv, clipped * adv)
    count = mask.sum() if num_tokens is None else num_tokens
    loss = -_masked_sum(objective, mask) / count
    if entropy is not None:
        loss = loss - entropy_coef * _masked_sum(entropy, mask) / count
    ref_kl = None
    if ref_logprobs is not None:
        to_ref = torch.where(mask, ref_logprobs.detach().to(logprobs.dtype) - logprobs, 0.0)
        ref_kl = to_ref.exp() - to_ref - 1
        loss = loss + kl_coef * _masked_sum(ref_kl, mask) / count

    with torch.no_grad():
        stats = {
            "clip_fraction": (clipped * adv < ratio * adv)[mask].float().mean().item(),
            "ratio_mean": ratio[mask].mean().item(),
            "approx_kl": ((ratio - 1) - log_ratio)[mask].mean().item(),
            "ratio_sq_mean": (ratio * ratio)[mask].mean().item(),
        }
        if entropy is not None:
            stats["entropy"] = entropy[mask].mean().item()
        if ref_kl is not None:
            stats["ref_kl"] = ref_kl[mask].mean().item()
    return loss, stats
