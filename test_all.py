"""The test suite, CPU only: `python -m pytest test_all.py`.

Sections follow the files: loss.py, data.py, sample.py, fit_curve.py, train.py. Numbers in the
loss tests are worked out by hand in the comments beside them."""

import math

import pytest
import torch

import loss as L

# =============================================================================
# loss.py

def tiny_causal_lm(tie, dtype=torch.float32, seed=0, vocab=50):
    from transformers import AutoModelForCausalLM, Qwen2Config
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                      tie_word_embeddings=tie, max_position_embeddings=128)
    return AutoModelForCausalLM.from_config(cfg).to(dtype)


@pytest.mark.parametrize("tie", [True, False])
def test_fp32_head_logprobs_equal_log_softmax_of_model_logits(tie):
    model = tiny_causal_lm(tie)
    ids = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(1))
    T = 0.7
    reference = torch.log_softmax(model(ids).logits.float() / T, dim=-1)[:, :-1]
    reference = reference.gather(-1, ids[:, 1:, None]).squeeze(-1)  # (3, 11)
    logprobs = L.token_logprobs(model, ids, temperature=T)
    assert logprobs.shape == (3, 11) and logprobs.dtype == torch.float32
    assert (logprobs - reference).abs().max() < 1e-5
    if tie:  # the head is the embedding matrix itself
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_chunked_logprobs_and_gradients_equal_unchunked():
    model = tiny_causal_lm(tie=True)
    ids = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(2))
    grads = []
    for chunk in (None, 3):  # 3 positions per chunk: 18 positions -> 6 checkpointed chunks
        model.zero_grad()
        lp, entropy = L.token_logprobs(model, ids, temperature=1.3, with_entropy=True, chunk_tokens=chunk)
        (lp * torch.arange(9.0)).sum().backward()
        grads.append((lp.detach(), entropy, model.model.embed_tokens.weight.grad.clone()))
    (lp0, ent0, g0), (lp1, ent1, g1) = grads
    assert torch.allclose(lp0, lp1, atol=1e-6) and torch.allclose(ent0, ent1, atol=1e-6)
    assert torch.allclose(g0, g1, atol=1e-5) and g0.abs().sum() > 0


def test_entropy_is_the_policy_entropy_at_each_position():
    model = tiny_causal_lm(tie=False)
    ids = torch.randint(0, 50, (1, 6), generator=torch.Generator().manual_seed(3))
    _, entropy = L.token_logprobs(model, ids, temperature=2.0, with_entropy=True)
    p = torch.softmax(model(ids).logits.float() / 2.0, dim=-1)[:, :-1]
    assert torch.allclose(entropy, -(p * p.log()).sum(-1), atol=1e-5)
    assert (entropy <= math.log(50) + 1e-5).all()


def test_fp32_head_switch_changes_the_numerics_of_a_bf16_model():
    model = tiny_causal_lm(tie=False, dtype=torch.bfloat16)
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(4))
    hidden = model.model(ids).last_hidden_state[:, :-1]
    W = model.lm_head.weight
    exact = torch.log_softmax(hidden.float() @ W.float().T, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    fp32 = L.token_logprobs(model, ids, fp32_head=True)
    low = L.token_logprobs(model, ids, fp32_head=False)  # the loo-fp32 ablation: bf16 matmul
    assert fp32.dtype == low.dtype == torch.float32
    assert (fp32 - exact).abs().max() < 1e-5
    assert (low - exact).abs().max() > 1e-4  # bf16 logits lose precision the fp32 head keeps


def test_zero_variance_filter_drops_groups_with_equal_rewards():
    rewards = torch.tensor([[1., 1, 1], [1, -1, 1], [-1, -1, -1], [-1, 1, 1]])
    assert L.zero_variance_mask(rewards).tolist() == [False, True, False, True]


def test_batch_advantage_normalisation_uses_std_of_surviving_groups():
    rewards = torch.tensor([[1., -1, -1, -1], [1, 1, 1, 1], [1, 1, -1, -1]])
    kept = rewards[L.zero_variance_mask(rewards)]  # the all-correct group carries no signal
    adv = L.group_advantages(kept, "batch")
    # centred: [1.5, -.5, -.5, -.5] and [1, 1, -1, -1]; population std over the 8 values:
    # sqrt((2.25 + 3 * .25 + 4 * 1) / 8) = sqrt(7/8) = 0.935414. (Had the zero-variance group's
    # four zeros been included: sqrt(7/12) = 0.763763, and 1.5 would map to 1.963961.)
    expected = torch.tensor([[1.5, -.5, -.5, -.5], [1, 1, -1, -1]]) / (math.sqrt(7 / 8) + 1e-6)
    assert torch.allclose(adv, expected, atol=1e-6)
    assert abs(adv[0, 0].item() - 1.603567) < 1e-5


def test_prompt_and_no_advantage_normalisation():
    rewards = torch.tensor([[1., -1, -1, -1], [1, 1, -1, -1]])
    prompt = L.group_advantages(rewards, "prompt")
    # group stds: sqrt(.75) = 0.866025 and 1.0
    assert torch.allclose(prompt[0], torch.tensor([1.5, -.5, -.5, -.5]) / (math.sqrt(.75) + 1e-6), atol=1e-6)
    assert torch.allclose(prompt[1], torch.tensor([1., 1, -1, -1]) / (1 + 1e-6), atol=1e-6)
    assert torch.equal(L.group_advantages(rewards, "none"), torch.tensor([[1.5, -.5, -.5, -.5], [1, 1, -1, -1]]))
    with pytest.raises(ValueError, match="adv_norm"):
        L.group_advantages(rewards, "group")


# rows 0, 1 belong to prompt 7 (3 and 1 tokens); rows 2, 3 to prompt 9 (1 token each)
AGG_MASK = torch.tensor([[1., 1, 1], [1, 0, 0], [1, 0, 0], [0, 1, 0]])
AGG_PROMPTS = torch.tensor([7, 7, 9, 9])


def test_prompt_average_weighs_each_prompt_equally_whatever_its_lengths():
    w = L.token_weights(AGG_MASK, AGG_PROMPTS, "prompt")
    # prompt 7: 4 tokens share 1/2 -> 1/8 each; prompt 9: 2 tokens share 1/2 -> 1/4 each
    expected = torch.tensor([[1 / 8, 1 / 8, 1 / 8], [1 / 8, 0, 0], [1 / 4, 0, 0], [0, 1 / 4, 0]])
    assert torch.allclose(w, expected)
    assert w[:2].sum() == w[2:].sum() == 0.5


def test_token_average_lets_long_completions_dominate():
    w = L.token_weights(AGG_MASK, AGG_PROMPTS, "token")
    assert torch.allclose(w, AGG_MASK / 6)  # 6 unmasked tokens
    assert abs(w[:2].sum().item() - 4 / 6) < 1e-7 and abs(w[2:].sum().item() - 2 / 6) < 1e-7


def test_sample_average_weighs_each_completion_equally():
    w = L.token_weights(AGG_MASK, AGG_PROMPTS, "sample")
    expected = torch.tensor([[1 / 12, 1 / 12, 1 / 12], [1 / 4, 0, 0], [1 / 4, 0, 0], [0, 1 / 4, 0]])
    assert torch.allclose(w, expected)
    with pytest.raises(ValueError, match="agg"):
        L.token_weights(AGG_MASK, AGG_PROMPTS, "group")


def _loss_inputs(p_trainer, p_behaviour, advantages, mask=None):
    logprobs = torch.tensor(p_trainer).log().requires_grad_()
    behaviour = torch.tensor(p_behaviour).log()
    mask = torch.ones_like(behaviour) if mask is None else torch.tensor(mask)
    return logprobs, behaviour, torch.tensor(advantages), mask


def test_cispo_hand_computed_loss_gradient_and_diagnostics():
    # one completion, two tokens: ratios 0.5/0.25 = 2.0 and 0.2/0.4 = 0.5; A = 2; eps_max = 1.5
    logprobs, behaviour, A, mask = _loss_inputs([[0.5, 0.2]], [[0.25, 0.4]], [2.0])
    weights = torch.tensor([[0.5, 0.5]])
    loss, stats = L.policy_loss(logprobs, behaviour, A, mask, weights, "cispo", eps_max=1.5)
    # -(0.5 * min(2, 1.5) * 2 * log .5 + 0.5 * 0.5 * 2 * log .2) = 1.5 * .693147 + .5 * 1.609438
    assert abs(loss.item() - 1.844440) < 1e-5
    loss.backward()
    # d loss / d logp = -w * sg(min(rho, eps_max)) * A: -1.5 on the truncated token, -0.5 on the other
    assert torch.allclose(logprobs.grad, torch.tensor([[-1.5, -0.5]]))
    merged = L.merge_stats([stats])
    assert abs(merged["is_ratio_mean"] - 1.25) < 1e-6 and abs(merged["is_ratio_max"] - 2.0) < 1e-6
    assert merged["is_truncated_frac"] == 0.5
    assert abs(merged["logprob_mismatch"] - math.log(2)) < 1e-6


def test_cispo_gradient_flows_through_truncated_tokens_while_dapo_is_zero_on_clipped():
    # ratio 5 > eps_max = 4 (CISPO truncates the weight, keeps the gradient);
    # ratio 5 > 1.28 with A > 0 (DAPO's clip removes the token from the gradient)
    grads = {}
    for name in ("cispo", "dapo"):
        logprobs, behaviour, A, mask = _loss_inputs([[0.5]], [[0.1]], [1.0])
        loss, _ = L.policy_loss(logprobs, behaviour, A, mask, torch.ones(1, 1), name)
        loss.backward()
        grads[name] = logprobs.grad.item()
    assert grads["cispo"] == pytest.approx(-4.0)  # -min(5, 4) * A
    assert grads["dapo"] == 0.0


def test_dapo_asymmetric_clip_and_grpo_symmetric_clip():
    # ratio 1.25 with A = 1: inside DAPO's 1 + 0.28, outside GRPO's 1 + 0.2
    out = {}
    for name in ("dapo", "grpo"):
        logprobs, behaviour, A, mask = _loss_inputs([[0.5]], [[0.4]], [1.0])
        loss, stats = L.policy_loss(logprobs, behaviour, A, mask, torch.ones(1, 1), name)
        loss.backward()
        out[name] = (loss.item(), logprobs.grad.item(), L.merge_stats([stats])["is_truncated_frac"])
    assert out["dapo"] == pytest.approx((-1.25, -1.25, 0.0))  # unclipped: d(-rho A)/dlogp = -rho A
    assert out["grpo"] == pytest.approx((-1.2, 0.0, 1.0))  # clipped at 1.2: constant, no gradient
    # negative advantage, ratio 0.5 < 0.8: clipped, loss -(0.8 * -1) = 0.8, no gradient;
    # negative advantage, ratio 2: the pessimistic unclipped branch, gradient -rho A = 2
    logprobs, behaviour, A, mask = _loss_inputs([[0.2, 0.5]], [[0.4, 0.25]], [-1.0])
    loss, _ = L.policy_loss(logprobs, behaviour, A, mask, torch.ones(1, 2), "dapo")
    loss.backward()
    assert loss.item() == pytest.approx(0.8 + 2.0)
    assert torch.allclose(logprobs.grad, torch.tensor([[0.0, 2.0]]))


def test_gspo_clips_whole_sequences_by_the_length_normalised_ratio():
    # row 0: log-ratios (0.004, 0) -> s = exp(0.002) inside [1 - 3e-3, 1 + 5e-3]: gradient flows
    # row 1: log-ratios (0.02, 0)  -> s = exp(0.01) > 1.005 with A > 0: the whole row is clipped,
    #        including its second token whose own ratio is exactly 1
    b = torch.tensor([[0.3, 0.3], [0.3, 0.3]]).log()
    logprobs = (b + torch.tensor([[0.004, 0.0], [0.02, 0.0]])).requires_grad_()
    weights = torch.full((2, 2), 0.25)
    loss, stats = L.policy_loss(logprobs, b, torch.tensor([1.0, 1.0]), torch.ones(2, 2), weights, "gspo")
    loss.backward()
    s0 = math.exp(0.002)
    # loss = -sum_rows (sum of the row's weights) * min(s A, clip(s) A) = -(0.5 s0 + 0.5 * 1.005)
    assert loss.item() == pytest.approx(-(0.5 * s0 + 0.5 * 1.005), abs=1e-6)
    # d/dlogp_t of -0.5 * s0 = -0.5 * s0 * (1/2) for each token of row 0; zero for row 1
    assert torch.allclose(logprobs.grad, torch.tensor([[-0.25 * s0, -0.25 * s0], [0.0, 0.0]]), atol=1e-6)
    assert L.merge_stats([stats])["is_truncated_frac"] == 0.5


@pytest.mark.parametrize("name", ["cispo", "dapo", "gspo", "grpo"])
def test_masked_tokens_contribute_nothing(name):
    # token 2 is masked (padding or the forced interruption phrase) and wildly off-policy
    logprobs, behaviour, A, _ = _loss_inputs([[0.5, 0.2, 0.9]], [[0.45, 0.25, 1e-30]], [1.5])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    weights = L.token_weights(mask, torch.tensor([0]), "prompt")
    loss, stats = L.policy_loss(logprobs, behaviour, A, mask, weights, name)
    loss.backward()
    reference = logprobs.detach()[:, :2].clone().requires_grad_()
    ref_loss, ref_stats = L.policy_loss(reference, behaviour[:, :2], A, torch.ones(1, 2),
                                        weights[:, :2], name)
    ref_loss.backward()
    assert torch.isfinite(loss) and loss.item() == pytest.approx(ref_loss.item(), abs=1e-7)
    assert logprobs.grad[0, 2] == 0 and torch.allclose(logprobs.grad[:, :2], reference.grad)
    assert L.merge_stats([stats]) == pytest.approx(L.merge_stats([ref_stats]))


def test_micro_batches_sum_to_the_full_batch_loss():
    gen = torch.Generator().manual_seed(5)
    logprobs = -torch.rand(6, 5, generator=gen) * 3
    behaviour = logprobs + 0.3 * torch.randn(6, 5, generator=gen)
    mask = (torch.rand(6, 5, generator=gen) < 0.7).float()
    mask[:, 0] = 1
    A = torch.randn(6, generator=gen)
    weights = L.token_weights(mask, torch.tensor([0, 0, 0, 1, 1, 2]), "prompt")
    full, full_stats = L.policy_loss(logprobs, behaviour, A, mask, weights)
    parts = [L.policy_loss(logprobs[i:i + 2], behaviour[i:i + 2], A[i:i + 2], mask[i:i + 2], weights[i:i + 2])
             for i in (0, 2, 4)]
    assert sum(p[0] for p in parts).item() == pytest.approx(full.item(), abs=1e-6)
    assert L.merge_stats([p[1] for p in parts]) == pytest.approx(L.merge_stats([full_stats]))


def test_unknown_loss_is_rejected():
    logprobs, behaviour, A, mask = _loss_inputs([[0.5]], [[0.5]], [1.0])
    with pytest.raises(ValueError, match="loss must be"):
        L.policy_loss(logprobs, behaviour, A, mask, torch.ones(1, 1), "ppo")
