"""
The ScaleRL objective, in plain functions (ScaleRL = Khatri et al. 2025, arXiv 2510.13786, sec. 3-4).

Read top to bottom, this is one training step's math:

    token_logprobs      trainer log-probs of the sampled tokens, fp32 LM head, / temperature
    zero_variance_mask  drop prompt groups whose G rewards are all equal
    group_advantages    centre by the group mean, normalise (batch | prompt | none)
    token_weights       the aggregation (prompt | sample | token) as one weight per token
    policy_loss         CISPO (default) | DAPO | GSPO | GRPO (LOSSES), plus the diagnostics the log needs

Shapes: P prompt groups, G completions each, N = rows of a (micro-)batch, T = tokens per row.
Completion rows are right-padded, so a causal model needs no attention mask for them.
Every per-token tensor is aligned with the *predicted* token: position t holds log p(x[t+1] | x[:t+1]).
"""

import inspect
from contextlib import contextmanager

import torch
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# log-probs with an fp32 LM head

@contextmanager
def _bf16_products():
    """CPU: fp32 matmuls through oneDNN (its bf16 math allowed), summing in fp32."""
    # torch 2.13 on this CPU (avx512_bf16, no AMX): the results are IEEE fp32's (fp32 operands that
    # are not bf16 values came out unrounded: 4e-6 from the exact sums), 1.4x faster than without
    # (the Qwen head at 192 rows: 312 against 428 ms; a bf16 matmul 156). No CPU op multiplies bf16
    # into fp32 outputs (mm / addmm / bmm out_dtype are CUDA-only, _grouped_mm and oneDNN's linear
    # keep the input's dtype): fp32 logits cost an fp32 matmul here (benchmarks/decode_roofline.py)
    before = torch.backends.mkldnn.matmul.fp32_precision
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    try:
        yield
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = before


def head_weight(model, fp32_head=True):
    """The LM head's weight as _head takes it: on CPUs upcast to fp32 once a decode step or micro-batch."""
    weight = model.get_output_embeddings().weight
    return weight.float() if fp32_head and not weight.is_cuda else weight


def _head(hidden, weight, weight32, bias, temperature, fp32_head=True):
    """(n, H) final hidden states -> (n, V) fp32 logits / temperature (the FP32 head, ScaleRL sec. 3.3)."""
    # An fp32 weight in IEEE fp32; a bf16 one as the exact products of its bf16 operands summed in fp32
    # (vLLM's head_dtype=float32 on tensor cores): torch.mm(..., out_dtype=float32) on GPUs, oneDNN on
    # weight32 (its fp32 upcast) on CPUs. fp32_head=False, the ablation: logits rounded to the weight's dtype
    if not fp32_head:
        return F.linear(hidden.to(weight.dtype), weight, bias).float() / temperature
    if weight.dtype == torch.float32:
        logits = F.linear(hidden.float(), weight, None if bias is None else bias.float())
    elif weight32 is None:
        logits = torch.mm(hidden.to(weight.dtype), weight.t(), out_dtype=torch.float32)
    else:
        with _bf16_products():
            logits = torch.mm(hidden.float(), weight32.t())
    logits = logits if bias is None or weight.dtype == torch.float32 else logits + bias.float()
    # the temperature sits right before the log-softmax; in place: a fresh (n, V) fp32 tensor cost
    # ~25 ms of page faults at 192 rows here (x / 1 is x: nothing to do)
    return logits if temperature == 1 else logits.div_(temperature)


def lm_head_logits(model, hidden, temperature=1.0, fp32_head=True, weight=None):
    """(..., H) final hidden states -> (..., V) fp32 logits / temperature, without gradient."""
    # the trainer's logits go through _HeadLogprobs; weight: head_weight(model, fp32_head), if already cast.
    # The FP32 head removed most of the paper's generator/trainer mismatch (A 0.52 -> 0.61)
    head = model.get_output_embeddings()
    weight = head_weight(model, fp32_head) if weight is None else weight
    upcast = weight if weight.dtype != head.weight.dtype else None  # CPU: a bf16 head's fp32 copy
    flat = hidden.reshape(-1, hidden.shape[-1])
    with torch.autocast(hidden.device.type, enabled=False):  # an enclosing autocast would undo the upcast
        logits = _head(flat, head.weight, upcast, getattr(head, "bias", None), temperature, fp32_head)
    return logits.view(*hidden.shape[:-1], -1)


class _HeadLogprobs(torch.autograd.Function):
    """A chunk's (n,) log p(target) from its (n, H) final hidden states through the head."""
    # Never an (n, V) log-softmax; with_entropy the (n,) entropy lse - sum(p * logit) too (no gradient), in
    # one pass over the logits each way: the forward keeps none and the backward recomputes them (as
    # activation checkpointing would) into softmax - one-hot, in place. Its matmuls take the gradient in the
    # head's dtype: a bf16 model's as bf16 operands with fp32 accumulation, as in its body's backward (so
    # autograd sums the weight's gradient over a micro-batch's chunks in bf16: measured, 37 chunks, 0.7%
    # relative error)

    @staticmethod
    def forward(ctx, hidden, weight, weight32, bias, targets, temperature, fp32_head, with_entropy):
        logits = _head(hidden, weight, weight32, bias, temperature, fp32_head)  # (n, V) fp32
        top = logits.amax(-1, keepdim=True)
        exp = (logits - top).exp_()
        total = exp.sum(-1, keepdim=True)
        lse = (top + total.log()).squeeze(-1)  # logsumexp
        logprobs = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
        ctx.save_for_backward(hidden, weight, weight32, bias, targets, lse)
        ctx.temperature, ctx.fp32_head = temperature, fp32_head
        entropy = lse - (exp * logits).sum(-1) / total.squeeze(-1) if with_entropy else lse[:0]
        ctx.mark_non_differentiable(entropy)  # a diagnostic
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad, _):
        hidden, weight, weight32, bias, targets, lse = ctx.saved_tensors
        logits = _head(hidden, weight, weight32, bias, ctx.temperature, ctx.fp32_head)
        d_logits = logits.sub_(lse[:, None]).exp_().mul_(-grad[:, None])  # d log p(y) / d logits: one-hot - p
        d_logits.scatter_add_(1, targets[:, None], grad[:, None])
        d_logits = (d_logits / ctx.temperature).to(weight.dtype)
        d_bias = None if bias is None else d_logits.sum(0).to(bias.dtype)
        return d_logits @ weight, d_logits.t() @ hidden.to(weight.dtype), None, d_bias, None, None, None, None


def token_logprobs(model, input_ids, temperature=1.0, fp32_head=True, attention_mask=None,
                   with_entropy=False, chunk_tokens=None):
    """Log-probs of input_ids[:, 1:] under a transformers causal LM: (B, T) ids -> (B, T-1) fp32."""
    # with_entropy, the policy's entropy at each position too (no gradient: a diagnostic). The head runs over
    # chunks of positions (_HeadLogprobs): no (B, T, V) fp32 tensor is ever held (V = 152k for Qwen)
    body = model.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    B, T = input_ids.shape
    hidden = body.last_hidden_state[:, :-1].flatten(0, 1)  # (B*(T-1), H): the positions that predict a token
    targets = input_ids[:, 1:].reshape(-1)  # (B*(T-1),)
    head = model.get_output_embeddings()
    weight = head_weight(model, fp32_head)  # cast once for every chunk (and its recompute)
    upcast = weight if weight.dtype != head.weight.dtype else None  # CPU: a bf16 head's fp32 copy
    chunk_tokens = chunk_tokens or max(1, (1 << 26) // weight.shape[0])  # ~256 MB of fp32 logits (ours)
    with torch.autocast(hidden.device.type, enabled=False):  # an enclosing autocast would undo the upcast
        chunks = [_HeadLogprobs.apply(hidden[start:start + chunk_tokens], head.weight, upcast,
                                      getattr(head, "bias", None), targets[start:start + chunk_tokens],
                                      temperature, fp32_head, with_entropy)
                  for start in range(0, hidden.shape[0], chunk_tokens)]  # (logprobs, entropy) per chunk
    logprobs, entropies = torch.cat([out for out, _ in chunks]), torch.cat([ent for _, ent in chunks])
    return (logprobs.view(B, T - 1), entropies.view(B, T - 1)) if with_entropy else logprobs.view(B, T - 1)


class TokenLogprobs(torch.nn.Module):
    """token_logprobs as the forward of a module holding the causal LM: under FSDP2 the root, whose forward
    uses the embeddings, the final norm and the head (fully_shard's hooks run on a module's forward)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, temperature=1.0, fp32_head=True, with_entropy=False):
        out = token_logprobs(self.model, input_ids, temperature, fp32_head, with_entropy=with_entropy)
        # not views (FSDP2 warns of in-place ops on a root's view outputs): (B, T-1) floats, a small copy
        return tuple(x.clone() for x in out) if with_entropy else out.clone()

# -----------------------------------------------------------------------------
# advantages

def zero_variance_mask(rewards):
    """(P, G) rewards -> (P,) bool: True for groups that carry signal (not all G rewards equal).
    ScaleRL drops the others from the loss and does not resample to refill the batch."""
    return (rewards != rewards[:, :1]).any(dim=1)


def group_advantages(rewards, adv_norm="batch", eps=1e-6):
    """(P, G) rewards of the groups that survived filtering -> (P, G) advantages.

    Centre each reward by its group's mean (GRPO's baseline), then normalise:
      batch  (ScaleRL default): divide by the std of all centred advantages in the batch, taken
             after zero-variance filtering, + 1e-6 (ours: population std, eps added to the std);
      prompt (GRPO): divide by the group's own std + eps;
      none   (Dr. GRPO): leave them centred."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if adv_norm == "batch":
        return centred / (centred.std(correction=0) + eps)
    if adv_norm == "prompt":
        return centred / (rewards.std(dim=1, keepdim=True, correction=0) + eps)
    if adv_norm == "none":
        return centred
    raise ValueError(f"adv_norm must be 'batch', 'prompt' or 'none', got {adv_norm!r}")

# -----------------------------------------------------------------------------
# aggregation: one weight per token, summing to 1 over the whole batch

def token_weights(mask, prompt_index, agg="prompt"):
    """(N, T) loss mask, (N,) prompt index of each row -> (N, T) weights that sum to 1.

    The loss is sum(per_token_loss * weights). Building the weights once for the whole batch
    keeps every denominator global, so micro-batches (and trainer ranks) just add up their parts:
      prompt (ScaleRL): each of the P prompts weighs 1/P; inside a prompt, every unmasked token of
              its G completions weighs the same: 1 / (P * tokens of the prompt's group);
      sample: each of the N completions weighs 1/N; its tokens share that equally (GRPO);
      token:  every unmasked token of the batch weighs the same (DAPO)."""
    mask = mask.float()
    if agg == "token":
        return mask / mask.sum().clamp(min=1)
    if agg == "sample":
        return mask / mask.sum(dim=1, keepdim=True).clamp(min=1) / mask.shape[0]
    if agg == "prompt":
        prompts, row_prompt = torch.unique(prompt_index, return_inverse=True)  # row -> 0..P-1
        group_tokens = mask.new_zeros(len(prompts)).index_add_(0, row_prompt, mask.sum(dim=1))  # (P,)
        return mask / group_tokens[row_prompt, None].clamp(min=1) / len(prompts)
    raise ValueError(f"agg must be 'prompt', 'sample' or 'token', got {agg!r}")

# -----------------------------------------------------------------------------
# policy losses: (ratio, log_ratio, logprobs, A, mask, its knobs) -> the (N, T) loss per token and the
# tokens whose gradient a clip or truncation changed. LOSSES names them for the loss_type config key; a loss's
# knobs are the config keys of its parameters' names. A new loss: one function here and one entry in LOSSES.

def cispo(ratio, log_ratio, logprobs, A, mask, eps_max=4.0):
    """ScaleRL's: J = sum w * sg(min(rho, eps_max)) * A * log pi (MiniMax-M1)."""
    # the detached ratio clamped from above only (no lower clip); the gradient flows through log pi for every
    # token, truncated ones included: what CISPO adds over PPO-style clipping
    return -torch.clamp(ratio.detach(), max=eps_max) * A * logprobs, ratio.detach() > eps_max


def dapo(ratio, log_ratio, logprobs, A, mask, clip_low=0.2, clip_high=0.28):
    """PPO's surrogate min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A), clipped asymmetrically (DAPO)."""
    per_token = -torch.min(ratio * A, torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * A)
    # the tokens whose gradient the clip zeroes: rho above 1 + high with A > 0, below 1 - low with A < 0
    return per_token, ((ratio > 1 + clip_high) & (A > 0)) | ((ratio < 1 - clip_low) & (A < 0))


def grpo(ratio, log_ratio, logprobs, A, mask, clip_low=0.2):
    """GRPO: the same surrogate, clipped symmetrically."""
    return dapo(ratio, log_ratio, logprobs, A, mask, clip_low, clip_low)


def gspo(ratio, log_ratio, logprobs, A, mask, gspo_low=3e-3, gspo_high=5e-3):
    """GSPO: the surrogate on the length-normalised sequence ratio s = exp(mean_t log rho); a sequence is
    clipped whole or not at all."""
    seq_ratio = (log_ratio.sum(1) / mask.sum(1).clamp(min=1)).exp()[:, None]  # (N, 1); grad: the tokens' mean
    per_token, clipped = dapo(seq_ratio, None, logprobs, A, mask, gspo_low, gspo_high)
    return per_token.expand_as(logprobs), clipped.expand_as(mask)


LOSSES = dict(cispo=cispo, dapo=dapo, gspo=gspo, grpo=grpo)


def policy_loss(logprobs, behaviour_logprobs, advantages, mask, weights, loss_type="cispo", **knobs):
    """Policy-gradient loss to minimise, and its diagnostics -> (loss, stats)."""
    # logprobs           (N, T) trainer log-probs of the sampled tokens (with grad)
    # behaviour_logprobs (N, T) the log-probs recorded when each token was sampled (pi_gen)
    # advantages         (N,)   one per completion
    # mask               (N, T) 1 where the policy chose the token (not padding, prompt, forced interruption)
    # weights            (N, T) aggregation weights from token_weights (zero where mask is zero)
    # loss_type, knobs   LOSSES' entry, and values by name (a config): each loss takes those it names
    # stats are detached sums and maxima over this (micro-)batch's unmasked tokens, combined across
    # micro-batches with merge_stats
    assert logprobs.shape == behaviour_logprobs.shape == mask.shape == weights.shape, \
        (logprobs.shape, behaviour_logprobs.shape, mask.shape, weights.shape)
    assert logprobs.dtype == behaviour_logprobs.dtype == torch.float32, "log-probs must be fp32"
    if loss_type not in LOSSES:
        raise ValueError(f"loss_type must be one of {', '.join(LOSSES)}, got {loss_type!r}")
    loss_fn, mask = LOSSES[loss_type], mask.bool()
    log_ratio = torch.where(mask, logprobs - behaviour_logprobs, 0.0)  # (N, T); 0 off-mask: no inf * 0
    ratio = log_ratio.exp()
    own = inspect.signature(loss_fn).parameters
    per_token, clipped = loss_fn(ratio, log_ratio, logprobs, advantages[:, None], mask,
                                 **{k: v for k, v in knobs.items() if k in own})
    total = (per_token * weights).sum()
    with torch.no_grad():  # detached tensors: no CPU-GPU sync here; merge_stats syncs once per step
        ratio_on_mask = torch.where(mask, ratio, 0.0)
        return total, dict(tokens=mask.sum(), is_ratio_sum=ratio_on_mask.sum(),
                           is_ratio_max=ratio_on_mask.max(), is_truncated_sum=(clipped & mask).sum(),
                           logprob_mismatch_sum=log_ratio.abs().sum())  # log_ratio is 0 off the mask


def merge_stats(stats_list, entropy_sum=0.0):
    """Combine the policy_loss stats of a step's micro-batches into the log's per-step values."""
    total = lambda key: float(sum(s[key] for s in stats_list))  # the sync point: once per step
    tokens = max(total("tokens"), 1.0)
    return dict(is_ratio_mean=total("is_ratio_sum") / tokens,
                is_ratio_max=max((float(s["is_ratio_max"]) for s in stats_list), default=0.0),
                is_truncated_frac=total("is_truncated_sum") / tokens,
                logprob_mismatch=total("logprob_mismatch_sum") / tokens, entropy=float(entropy_sum) / tokens)


@torch.no_grad()
def sampler_mismatch(logprobs, behaviour_logprobs, mask):
    """The generator/trainer numeric mismatch (what the FP32 head removes, ScaleRL sec. 3.3), at lag 0."""
    # on completions that one version of the weights sampled whole (validation's: no staleness) ->
    # dict(lag0_tokens, logprob_mismatch_lag0: mean |log pi - log pi_gen|, kl_lag0: mean rho - 1 - log rho)
    mask = mask.bool()
    log_ratio = torch.where(mask, logprobs - behaviour_logprobs, 0.0)  # (N, T); NaN (forced tokens) off mask
    n = max(int(mask.sum()), 1)
    return dict(lag0_tokens=int(mask.sum()), logprob_mismatch_lag0=float(log_ratio.abs().sum()) / n,
                kl_lag0=float((log_ratio.exp() - 1 - log_ratio).sum()) / n)
