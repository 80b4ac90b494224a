"""The policy and SFT losses: the PPO clipped surrogate against hand computations, clipping and
masking behaviour (values and gradients), and token_logprobs on a tiny real Llama, including
the alignment of per-input-token masks and engine log-probs with the prediction grid."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from orchard.recipes.loss import masked_nll, ppo_clip_loss, shift, token_logprobs


def tensor(rows: list[list[float]], grad: bool = False) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64, requires_grad=grad)


# Two sequences of three tokens; the last token of the first is an observation (mask 0).
LOGPROBS = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]]
OLD = [[-1.5, -0.2, -9.0], [-0.5, -1.2, -0.1]]
MASK = [[1, 1, 0], [1, 1, 1]]
ADV = [1.0, -0.5]
ENTROPY = [[0.5, 0.6, 0.7], [0.8, 0.9, 1.0]]


def test_ppo_clip_loss_matches_hand_computation() -> None:
    logprobs, entropy = tensor(LOGPROBS, grad=True), tensor(ENTROPY, grad=True)
    loss, stats = ppo_clip_loss(logprobs, tensor(OLD), torch.tensor(ADV, dtype=torch.float64),
                                torch.tensor(MASK), entropy=entropy)
    ratios = [math.exp(0.5), math.exp(-0.3), math.exp(0.2), 1.0, math.exp(-0.6)]
    # A=+1: 1.65 is clipped to 1.28, 0.74 stays (the min keeps the pessimistic side);
    # A=-0.5: 1.22 and 1.0 are inside, 0.55 is clipped to 0.8
    objective = [1.28, ratios[1], -0.5 * ratios[2], -0.5, -0.5 * 0.8]
    entropies = [0.5, 0.6, 0.8, 0.9, 1.0]
    expected = -sum(objective) / 5 - 1e-4 * sum(entropies) / 5
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert stats["clip_fraction"] == pytest.approx(2 / 5)
    assert stats["ratio_mean"] == pytest.approx(sum(ratios) / 5)
    assert stats["approx_kl"] == pytest.approx(sum(r - 1 - math.log(r) for r in ratios) / 5)
    assert stats["ratio_sq_mean"] == pytest.approx(sum(r * r for r in ratios) / 5)
    assert stats["entropy"] == pytest.approx(sum(entropies) / 5)

    loss.backward()
    # d/dlogprob of ratio * A is ratio * A; clipped tokens and the observation get nothing
    expected_grad = [[0.0, -ratios[1] / 5, 0.0],
                     [0.5 * ratios[2] / 5, 0.5 * 1.0 / 5, 0.0]]
    torch.testing.assert_close(logprobs.grad, tensor(expected_grad))
    torch.testing.assert_close(entropy.grad, tensor([[-1e-4 / 5] * 2 + [0.0], [-1e-4 / 5] * 3]))


def test_per_sequence_advantages_broadcast_over_tokens() -> None:
    per_token = torch.tensor(ADV, dtype=torch.float64)[:, None].expand(2, 3)
    a, _ = ppo_clip_loss(tensor(LOGPROBS), tensor(OLD), torch.tensor(ADV, dtype=torch.float64),
                         torch.tensor(MASK))
    b, _ = ppo_clip_loss(tensor(LOGPROBS), tensor(OLD), per_token, torch.tensor(MASK))
    assert a.item() == b.item()


def one_token_each(ratios: list[float], advantages: list[float],
                   ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Loss and gradient for a batch of one-token sequences with these ratios."""
    logprobs = torch.tensor([[math.log(r)] for r in ratios], dtype=torch.float64,
                            requires_grad=True)
    loss, stats = ppo_clip_loss(logprobs, torch.zeros_like(logprobs),
                                torch.tensor(advantages, dtype=torch.float64),
                                torch.ones(len(ratios), 1))
    loss.backward()
    return loss, logprobs.grad[:, 0], stats


@pytest.mark.parametrize(("ratio", "advantage", "has_gradient"), [
    (1.28 + 1e-3, 1.0, False),  # above 1 + clip_high, pushing further up: clipped
    (1.28 - 1e-3, 1.0, True),
    (0.8 - 1e-3, 1.0, True),  # below 1 - clip_low with A > 0: the unclipped side is lower
    (0.8 + 1e-3, -1.0, True),
    (0.8 - 1e-3, -1.0, False),  # below 1 - clip_low, pushing further down: clipped
    (1.28 + 1e-3, -1.0, True),  # above 1 + clip_high with A < 0: never clipped
    (1.0, 1.0, True),
])
def test_clip_region(ratio: float, advantage: float, has_gradient: bool) -> None:
    loss, grad, stats = one_token_each([ratio], [advantage])
    bound = min(max(ratio, 0.8), 1.28)
    assert loss.item() == pytest.approx(-min(ratio * advantage, bound * advantage))
    assert (grad.item() != 0) == has_gradient
    if has_gradient:
        assert grad.item() == pytest.approx(-ratio * advantage)
    assert stats["clip_fraction"] == (0.0 if has_gradient else 1.0)


def test_clip_bounds_are_configurable() -> None:
    logprobs = torch.tensor([[math.log(1.2)], [math.log(0.85)]], requires_grad=True)
    loss, stats = ppo_clip_loss(logprobs, torch.zeros(2, 1), torch.tensor([1.0, -1.0]),
                                torch.ones(2, 1), clip_low=0.1, clip_high=0.1)
    assert loss.item() == pytest.approx(-(1.1 - 0.9) / 2)
    assert stats["clip_fraction"] == 1.0
    loss.backward()
    assert logprobs.grad.abs().sum().item() == 0.0


def test_entropy_bonus_lowers_the_loss() -> None:
    args = (tensor(LOGPROBS), tensor(OLD), torch.tensor(ADV, dtype=torch.float64),
            torch.tensor(MASK))
    base, stats = ppo_clip_loss(*args)
    assert "entropy" not in stats
    low, _ = ppo_clip_loss(*args, entropy=tensor(ENTROPY))
    high, _ = ppo_clip_loss(*args, entropy=tensor(ENTROPY) * 2)
    off, _ = ppo_clip_loss(*args, entropy=tensor(ENTROPY), entropy_coef=0.0)
    assert high.item() < low.item() < base.item() == off.item()
    assert base.item() - low.item() == pytest.approx(1e-4 * 3.8 / 5)


def test_kl_penalty_to_the_reference_matches_hand_computation() -> None:
    logprobs = tensor(LOGPROBS, grad=True)
    ref = [[-1.2, -0.5, -5.0], [-0.1, -1.0, -0.9]]
    args = (tensor(OLD), torch.tensor(ADV, dtype=torch.float64), torch.tensor(MASK))
    base, stats = ppo_clip_loss(tensor(LOGPROBS), *args)
    loss, with_ref = ppo_clip_loss(logprobs, *args, ref_logprobs=tensor(ref), kl_coef=0.5)
    # k3 of KL(new || ref) per trained token: exp(d) - d - 1, d = ref - new.
    ds = [-0.2, 0.0, 0.2, 0.2, -0.2]
    k3 = [math.exp(d) - d - 1 for d in ds]
    assert "ref_kl" not in stats and with_ref["ref_kl"] == pytest.approx(sum(k3) / 5)
    assert loss.item() == pytest.approx(base.item() + 0.5 * sum(k3) / 5, rel=1e-12)
    # Without a coefficient the penalty is measured but costs nothing.
    free, measured = ppo_clip_loss(tensor(LOGPROBS), *args, ref_logprobs=tensor(ref))
    assert free.item() == base.item() and measured["ref_kl"] == with_ref["ref_kl"]
    # Its gradient pulls each trained log-prob toward the reference's: d/dnew = 1 - exp(d).
    penalty_only, _ = ppo_clip_loss(logprobs, tensor(LOGPROBS), torch.zeros(2, dtype=torch.float64),
                                    torch.tensor(MASK), ref_logprobs=tensor(ref), kl_coef=1.0)
    penalty_only.backward()
    grads = [g for g, m in zip(logprobs.grad.flatten().tolist(), sum(MASK, []), strict=True) if m]
    assert grads == pytest.approx([(1 - math.exp(d)) / 5 for d in ds])
    assert logprobs.grad[0, 2].item() == 0.0  # the observation still gets nothing


def test_no_change_means_no_kl_and_unit_ratio() -> None:
    _, stats = ppo_clip_loss(tensor(LOGPROBS), tensor(LOGPROBS), torch.tensor([1.0, -1.0]),
                             torch.tensor(MASK))
    assert stats == {"clip_fraction": 0.0, "ratio_mean": 1.0, "approx_kl": 0.0,
                     "ratio_sq_mean": 1.0}


def test_num_tokens_makes_micro_batches_add_up() -> None:
    args = dict(old_logprobs=tensor(OLD), advantages=torch.tensor(ADV, dtype=torch.float64),
                mask=torch.tensor(MASK), entropy=tensor(ENTROPY))
    full_logprobs = tensor(LOGPROBS, grad=True)
    full, _ = ppo_clip_loss(full_logprobs, **args)
    full.backward()
    parts = tensor(LOGPROBS, grad=True)
    total = 0.0
    for rows in (slice(0, 1), slice(1, 2)):
        part, _ = ppo_clip_loss(parts[rows], **{k: v[rows] for k, v in args.items()},
                                num_tokens=5)
        part.backward()
        total += part.item()
    assert total == pytest.approx(full.item(), rel=1e-12)
    torch.testing.assert_close(parts.grad, full_logprobs.grad)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 2**32 - 1), st.data())
def test_masked_tokens_contribute_nothing(batch: int, tokens: int, seed: int,
                                          data: st.DataObject) -> None:
    flags = data.draw(st.lists(st.booleans(), min_size=batch * tokens,
                               max_size=batch * tokens).filter(any))
    mask = torch.tensor(flags).reshape(batch, tokens)
    gen = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(batch, tokens, generator=gen, dtype=torch.float64) * 3
    old = logprobs + torch.randn(batch, tokens, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(batch, tokens, generator=gen, dtype=torch.float64)
    entropy = torch.rand(batch, tokens, generator=gen, dtype=torch.float64)

    def run(garbage: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        def fill(x: torch.Tensor) -> torch.Tensor:
            return x if garbage is None else torch.where(mask, x, garbage)
        lp = fill(logprobs).detach().requires_grad_()
        ent = fill(entropy).detach().requires_grad_()
        loss, _ = ppo_clip_loss(lp, fill(old), fill(adv), mask.int(), entropy=ent)
        loss.backward()
        return loss, lp.grad, ent.grad

    # a reference on the selected tokens only
    ratio = (logprobs - old)[mask].exp()
    a = adv[mask]
    expected = -(torch.minimum(ratio * a, ratio.clamp(0.8, 1.28) * a).mean()
                 + 1e-4 * entropy[mask].mean())
    loss, lp_grad, ent_grad = run(None)
    torch.testing.assert_close(loss, expected)
    for garbage in (float("nan"), float("inf"), -float("inf"), 123.0):
        other, other_lp_grad, other_ent_grad = run(garbage)
        assert other.item() == loss.item()
        torch.testing.assert_close(other_lp_grad, lp_grad)
        torch.testing.assert_close(other_ent_grad, ent_grad)
        assert (other_lp_grad[~mask] == 0).all() and (other_ent_grad[~mask] == 0).all()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(-20, 0), st.booleans()), min_size=1, max_size=12)
       .filter(lambda xs: any(m for _, m in xs)))
def test_masked_nll_is_the_mean_over_masked_tokens(tokens: list[tuple[float, bool]]) -> None:
    logprobs = torch.tensor([[lp for lp, _ in tokens]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[m for _, m in tokens]])
    loss = masked_nll(logprobs, mask)
    picked = [lp for lp, m in tokens if m]
    assert loss.item() == pytest.approx(-sum(picked) / len(picked))
    loss.backward()
    assert logprobs.grad[0].tolist() == [-1 / len(picked) if m else 0.0 for _, m in tokens]


def test_masked_nll_ignores_masked_garbage_and_scales_by_num_tokens() -> None:
    logprobs = tensor([[-1.0, float("-inf"), -3.0]])
    mask = torch.tensor([[1, 0, 1]])
    assert masked_nll(logprobs, mask).item() == 2.0
    assert masked_nll(logprobs, mask, num_tokens=8).item() == 0.5


def test_bad_inputs_raise_clear_errors() -> None:
    lp, old, adv, mask = tensor(LOGPROBS), tensor(OLD), torch.tensor(ADV), torch.tensor(MASK)
    with pytest.raises(ValueError, match=r"mask has shape \(2, 4\).*shift\(\)"):
        ppo_clip_loss(lp, old, adv, torch.ones(2, 4))
    with pytest.raises(ValueError, match="old_logprobs has shape"):
        ppo_clip_loss(lp, old[:, :2], adv, mask)
    with pytest.raises(ValueError, match="entropy has shape"):
        ppo_clip_loss(lp, old, adv, mask, entropy=torch.zeros(3))
    with pytest.raises(ValueError, match="selects no tokens"):
        ppo_clip_loss(lp, old, adv, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="only 0 and 1"):
        ppo_clip_loss(lp, old, adv, mask * 0.5)
    with pytest.raises(ValueError, match=r"advantages must be \[batch\] or"):
        ppo_clip_loss(lp, old, torch.zeros(3), mask)
    with pytest.raises(ValueError, match="clip_low < 1"):
        ppo_clip_loss(lp, old, adv, mask, clip_low=1.0)
    with pytest.raises(ValueError, match=r"logprobs must be \[batch, tokens\]"):
        ppo_clip_loss(lp[0], old[0], adv, mask[0])
    with pytest.raises(ValueError, match="selects no tokens"):
        masked_nll(lp, torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="at least 2 tokens"):
        shift(torch.zeros(3, 1))


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_hidden_layers=2, vocab_size=100,
                         intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
    return LlamaForCausalLM(config).eval()


def test_token_logprobs_matches_a_manual_gather(model: LlamaForCausalLM) -> None:
    torch.manual_seed(1)
    ids = torch.randint(0, 100, (2, 7))
    logprobs, entropy = token_logprobs(model, ids)
    assert logprobs.shape == entropy.shape == (2, 6)
    logits = model(input_ids=ids).logits
    for b in range(2):
        for j in range(6):
            target = ids[b, j + 1]
            nll = torch.nn.functional.cross_entropy(logits[b, j], target)
            assert logprobs[b, j].item() == pytest.approx(-nll.item(), abs=1e-5)
            dist = torch.distributions.Categorical(logits=logits[b, j])
            assert entropy[b, j].item() == pytest.approx(dist.entropy().item(), abs=1e-5)
    assert (entropy > 0).all() and (entropy <= math.log(100) + 1e-5).all()
    (logprobs.sum() + entropy.sum()).backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
    model.zero_grad()


def test_shift_aligns_per_input_token_samples(model: LlamaForCausalLM) -> None:
    # A proxy sample: 3 prompt tokens, 2 completion tokens, 1 observation, 2 completion tokens;
    # loss_mask and the engine's logprobs are per input token, None where mask is 0.
    torch.manual_seed(2)
    ids = torch.randint(0, 100, (1, 8))
    loss_mask = [0, 0, 0, 1, 1, 0, 1, 1]
    with torch.no_grad():  # what the engine reported: log p(ids[i] | ids[:i]), one by one
        engine = [None if not m else
                  torch.log_softmax(model(input_ids=ids[:, :i]).logits[0, -1], -1)[ids[0, i]]
                  .item() for i, m in enumerate(loss_mask)]
    mask = torch.tensor([loss_mask])
    old = torch.tensor([[float("nan") if x is None else x for x in engine]])

    logprobs, entropy = token_logprobs(model, ids)
    nll = masked_nll(logprobs, shift(mask))
    picked = [x for x in engine if x is not None]
    assert nll.item() == pytest.approx(-sum(picked) / len(picked), abs=1e-5)
    loss, stats = ppo_clip_loss(logprobs, shift(old), torch.tensor([1.0]), shift(mask),
                                entropy=entropy)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert math.isfinite(loss.item())


def test_token_logprobs_right_padding(model: LlamaForCausalLM) -> None:
    torch.manual_seed(3)
    long, short = torch.randint(0, 100, (1, 9)), torch.randint(0, 100, (1, 5))
    ids = torch.cat([long, torch.cat([short, torch.zeros(1, 4, dtype=torch.long)], 1)])
    attention = torch.tensor([[1] * 9, [1] * 5 + [0] * 4])
    padded, _ = token_logprobs(model, ids, attention)
    alone, _ = token_logprobs(model, short)
    torch.testing.assert_close(padded[1, :4], alone[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded[0], token_logprobs(model, long)[0][0], atol=1e-5,
                               rtol=1e-5)


def test_token_logprobs_is_float32_for_bf16_models(model: LlamaForCausalLM) -> None:
    half = LlamaForCausalLM(model.config).to(torch.bfloat16).eval()
    logprobs, entropy = token_logprobs(half, torch.randint(0, 100, (1, 4)))
    assert logprobs.dtype == entropy.dtype == torch.float32
    with pytest.raises(ValueError, match="at least 2 tokens"):
        token_logprobs(model, torch.tensor([1, 2, 3]))


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return grads


def test_token_logprobs_mask_projects_only_the_trained_slots(model: LlamaForCausalLM) -> None:
    torch.manual_seed(4)
    ids = torch.randint(0, 100, (2, 8))
    attention = torch.tensor([[1] * 8, [1] * 6 + [0] * 2])
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1], [1, 0, 0, 1, 1, 0, 0]], dtype=torch.bool)
    full_lp, full_ent = token_logprobs(model, ids, attention)
    (full_lp[mask].sum() + full_ent[mask].sum()).backward()
    expected = _grads(model)

    projected = []
    head = model.lm_head
    hook = head.register_forward_hook(lambda _m, args, _out: projected.append(args[0].shape))
    try:
        lp, ent = token_logprobs(model, ids, attention, mask=mask)
    finally:
        hook.remove()
    assert projected == [torch.Size([int(mask.sum()), 32])]  # 7 rows, not 2 x 7
    torch.testing.assert_close(lp[mask], full_lp[mask].detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[mask], full_ent[mask].detach(), atol=1e-5, rtol=1e-5)
    assert (lp[~mask] == 0).all() and (ent[~mask] == 0).all()
    (lp[mask].sum() + ent[mask].sum()).backward()
    got = _grads(model)
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    with pytest.raises(ValueError, match="selects no tokens"):
        token_logprobs(model, ids, attention, mask=torch.zeros_like(mask))


def test_token_logprobs_mask_keeps_transformed_logits() -> None:
    # Gemma 2 soft-caps its logits: the projection alone would be wrong, so the full forward
    # runs and the masked slots still match it.
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(5)
    config = Gemma2Config(hidden_size=32, num_hidden_layers=1, vocab_size=100,
                          intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                          head_dim=16, final_logit_softcapping=3.0)
    gemma = Gemma2ForCausalLM(config).eval()
    ids = torch.randint(0, 100, (1, 6))
    mask = torch.tensor([[0, 1, 1, 0, 1]], dtype=torch.bool)
    lp, _ = token_logprobs(gemma, ids, mask=mask, entropy=False)
    full, _ = token_logprobs(gemma, ids, entropy=False)
    torch.testing.assert_close(lp[mask], full[mask], atol=1e-5, rtol=1e-5)
