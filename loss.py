"""
The ScaleRL objective in plain functions (Khatri et al. 2025, arXiv 2510.13786, sec. 3-4); top to
bottom, one training step's math:

  zero_variance_mask  drop prompt groups whose G rewards are all equal
  group_advantages    centre by the group mean, normalise (batch | prompt | none)
  collate             the kept groups' rows as right-padded tensors, aligned as below
  token_weights       the aggregation (prompt | sample | token) as one weight per token
  policy_loss         CISPO (default) | DAPO | GSPO | GRPO (LOSSES), and the log's diagnostics

Its inputs: the trainer's log-probs of the sampled tokens (head.token_logprobs: the fp32 LM head,
/ temperature) and the sampler's, recorded as each token was drawn. Shapes: P prompt groups, G
completions each, N rows of a (micro-)batch, T tokens a row, right-padded (a causal model needs no
attention mask). A per-token tensor is aligned with the *predicted* token: position t holds
log p(x[t+1] | x[:t+1]).
"""

import inspect
import math

import torch

# -----------------------------------------------------------------------------
# advantages

def zero_variance_mask(rewards):
    """(P, G) rewards -> (P,) bool: True for groups that carry signal (not all G rewards equal);
    ScaleRL drops the others from the loss and does not resample to refill the batch."""
    return (rewards != rewards[:, :1]).any(dim=1)


def group_advantages(rewards, adv_norm="batch", eps=1e-6):
    """(P, G) rewards of the groups that survived filtering -> (P, G) advantages: each reward less
    its group's mean (GRPO's baseline), divided by
      batch  (ScaleRL default): the population std of all the centred rewards + eps (ours);
      prompt (GRPO): its group's std + eps;
      none   (Dr. GRPO): nothing."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if adv_norm == "batch":
        return centred / (centred.std(correction=0) + eps)
    if adv_norm == "prompt":
        return centred / (rewards.std(dim=1, keepdim=True, correction=0) + eps)
    if adv_norm == "none":
        return centred
    raise ValueError(f"adv_norm must be 'batch', 'prompt' or 'none', got {adv_norm!r}")

# -----------------------------------------------------------------------------
# the batch as tensors

def collate(groups, advantages, pad_id, train_truncated=False):
    """Completion rows of the kept groups, (P', G) advantages -> (ids (N, T), lengths, behaviour
    log-probs and mask (N, T-1), each row's group, each row's advantage), right-padded."""
    rows = [(g.prompt_ids, c) for g in groups for c in g.completions]
    lengths = torch.tensor([len(p) + len(c.token_ids) for p, c in rows])
    T = int(lengths.max())
    # padding: never attended, never trained
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    # (N, T-1): position t predicts token t+1: completion token j of a row sits at len(prompt)-1+j
    behaviour, mask = torch.zeros(2, len(rows), T - 1)
    prompt_index = torch.tensor([i for i, g in enumerate(groups) for _ in g.completions])
    for r, (prompt_ids, c) in enumerate(rows):
        n, k = len(prompt_ids), len(c.token_ids)
        ids[r, :n + k] = torch.tensor(prompt_ids + c.token_ids)
        span = slice(n - 1, n - 1 + k)
        behaviour[r, span] = torch.tensor(c.logprobs)  # NaN on forced tokens
        # cut at the answer budget: not trained unless train_truncated (paper, A.16)
        if train_truncated or c.finish_reason != "truncated":
            mask[r, span] = torch.tensor(c.policy_mask)
    return ids, lengths, behaviour, mask, prompt_index, advantages.flatten()

# -----------------------------------------------------------------------------
# aggregation: one weight per token, summing to 1 over the whole batch

def token_weights(mask, prompt_index, agg="prompt"):
    """(N, T) loss mask, (N,) prompt index of each row -> (N, T) weights that sum to 1 over the
    whole batch (the loss is sum(per_token_loss * weights)), so micro-batches and trainer ranks
    just add up their parts:
      prompt (ScaleRL): each of the P prompts weighs 1/P, shared equally by its group's tokens;
      sample (GRPO): each of the N completions weighs 1/N, shared equally by its tokens;
      token  (DAPO): every unmasked token of the batch weighs the same."""
    mask = mask.float()
    if agg == "token":
        return mask / mask.sum().clamp(min=1)
    if agg == "sample":
        return mask / mask.sum(dim=1, keepdim=True).clamp(min=1) / mask.shape[0]
    if agg == "prompt":
        prompts, row_prompt = torch.unique(prompt_index, return_inverse=True)  # row -> 0..P-1
        # (P,)
        group_tokens = mask.new_zeros(len(prompts)).index_add_(0, row_prompt, mask.sum(dim=1))
        return mask / group_tokens[row_prompt, None].clamp(min=1) / len(prompts)
    raise ValueError(f"agg must be 'prompt', 'sample' or 'token', got {agg!r}")

# -----------------------------------------------------------------------------
# policy losses: (ratio, log_ratio, logprobs, A, mask, its knobs) -> the (N, T) loss per token and
# the tokens whose gradient a clip or truncation changed. LOSSES names them for the loss_type config
# key; a loss's knobs are the config keys of its parameters' names. A new loss: one function here
# and one entry in LOSSES.

def cispo(ratio, log_ratio, logprobs, A, mask, eps_max=4.0):
    """ScaleRL's: J = sum w * sg(min(rho, eps_max)) * A * log pi (MiniMax-M1)."""
    # the detached ratio clamped from above only (no lower clip); the gradient flows through log pi
    # for every token, truncated ones included: what CISPO adds over PPO-style clipping
    return -torch.clamp(ratio.detach(), max=eps_max) * A * logprobs, ratio.detach() > eps_max


def dapo(ratio, log_ratio, logprobs, A, mask, clip_low=0.2, clip_high=0.28):
    """DAPO: PPO's surrogate min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A), asymmetric."""
    per_token = -torch.min(ratio * A, torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * A)
    # the tokens whose gradient the clip zeroes: rho above 1 + high with A > 0, below 1 - low
    # with A < 0
    return per_token, ((ratio > 1 + clip_high) & (A > 0)) | ((ratio < 1 - clip_low) & (A < 0))


def grpo(ratio, log_ratio, logprobs, A, mask, clip_low=0.2):
    """GRPO: the same surrogate, clipped symmetrically."""
    return dapo(ratio, log_ratio, logprobs, A, mask, clip_low, clip_low)


def gspo(ratio, log_ratio, logprobs, A, mask, gspo_low=3e-3, gspo_high=5e-3):
    """GSPO: the surrogate on the sequence ratio exp(mean_t log rho), clipping a sequence whole."""
    # (N, 1); grad: the tokens' mean
    seq_ratio = (log_ratio.sum(1) / mask.sum(1).clamp(min=1)).exp()[:, None]
    per_token, clipped = dapo(seq_ratio, None, logprobs, A, mask, gspo_low, gspo_high)
    return per_token.expand_as(logprobs), clipped.expand_as(mask)


LOSSES = dict(cispo=cispo, dapo=dapo, gspo=gspo, grpo=grpo)
# A loss may also return a third value, {name: (N, T) per-token values} (a KL to the sampler, say):
# each reaches the log as its mean over the step's tokens, or its maximum for a name ending in _max,
# with no other edit.

# -----------------------------------------------------------------------------
# corrections of the sampler's mismatch, beside any loss: (log rho (N, T), mask, knobs) -> a
# detached log-weight <= 0 per token that lowers the ratio the loss sees (its gradient kept), -inf
# to drop the token. The trainer recomputes no pi_old, so rho = pi / pi_gen holds both the lag of
# stale tokens and the numerics of the two engines. IS_CORRECTIONS names them for the is_correction
# config key; 'none' is ScaleRL as the paper runs it.

def tis(log_ratio, mask, tis_cap=2.0):
    """Token-level truncated IS: a ratio counts at most tis_cap (CISPO: min(rho, cap, eps_max))."""
    return -torch.relu(log_ratio - math.log(tis_cap))


def icepop(log_ratio, mask, icepop_low=0.5, icepop_high=2.0):
    """IcePop: a token whose ratio leaves [icepop_low, icepop_high] is dropped."""
    out = (log_ratio < math.log(icepop_low)) | (log_ratio > math.log(icepop_high))
    return torch.where(out, -math.inf, 0.0)


def geo_mask(log_ratio, mask, geo_low=0.99, geo_high=1.01):
    """A sequence whose ratio exp(mean_t log rho) leaves [geo_low, geo_high] is dropped whole."""
    mean = log_ratio.sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)
    out = (mean < math.log(geo_low)) | (mean > math.log(geo_high))
    return torch.where(out, -math.inf, 0.0).expand_as(log_ratio)


IS_CORRECTIONS = dict(none=None, tis=tis, icepop=icepop, geo_mask=geo_mask)


def _knobs(fn, knobs):
    own = inspect.signature(fn).parameters
    return {k: v for k, v in knobs.items() if k in own}


def knobs_of(config):
    """A config's values that the chosen loss and correction take, by their parameters' names,
    with loss_type and is_correction: what train.py hands policy_loss."""
    chosen = [LOSSES.get(config["loss_type"]), IS_CORRECTIONS.get(config["is_correction"])]
    return dict(loss_type=config["loss_type"], is_correction=config["is_correction"],
                **{k: v for fn in chosen if fn for k, v in _knobs(fn, config).items()})


def policy_loss(logprobs, behaviour_logprobs, advantages, mask, weights, loss_type="cispo",
                is_correction="none", **knobs):
    """Policy-gradient loss to minimise, and its diagnostics -> (loss, stats)."""
    # logprobs           (N, T) trainer log-probs of the sampled tokens (with grad)
    # behaviour_logprobs (N, T) the log-probs recorded when each token was sampled (pi_gen)
    # advantages         (N,)   one per completion
    # mask               (N, T) 1 where the policy chose the token (not padding, prompt, forced
    #                    interruption)
    # weights            (N, T) aggregation weights from token_weights (zero where mask is zero)
    # loss_type, is_correction, knobs: LOSSES' and IS_CORRECTIONS' entries, and values by name (a
    # config): each function takes those its parameters name
    # stats: the log's names -> detached sums over this (micro-)batch's tokens (means once
    # merge_stats has divided by the step's tokens), or maxima for names ending in _max
    shapes = [t.shape for t in (logprobs, behaviour_logprobs, mask, weights)]
    assert len(set(shapes)) == 1, shapes
    assert logprobs.dtype == behaviour_logprobs.dtype == torch.float32, "log-probs must be fp32"
    for name, table, key in (("loss_type", LOSSES, loss_type),
                             ("is_correction", IS_CORRECTIONS, is_correction)):
        if key not in table:
            raise ValueError(f"{name} must be one of {', '.join(table)}, got {key!r}")
    loss_fn, correct, mask = LOSSES[loss_type], IS_CORRECTIONS[is_correction], mask.bool()
    # (N, T); 0 off-mask: no inf * 0
    log_ratio = torch.where(mask, logprobs - behaviour_logprobs, 0.0)
    raw = log_ratio.detach()
    log_weight = (torch.zeros_like(raw) if correct is None
                  else correct(raw, mask, **_knobs(correct, knobs)))
    kept = mask & (log_weight > -math.inf)
    log_ratio = log_ratio + torch.where(kept, log_weight, 0.0)
    ratio = log_ratio.exp()
    per_token, clipped, *extra = loss_fn(ratio, log_ratio, logprobs, advantages[:, None], kept,
                                         **_knobs(loss_fn, knobs))
    total = (per_token * weights * kept).sum()
    with torch.no_grad():  # detached tensors: no CPU-GPU sync here; merge_stats syncs once per step
        rho, size = torch.where(mask, raw.exp(), 0.0), raw.abs()  # raw is 0 off the mask
        stats = dict(tokens=mask.sum(), is_ratio_mean=rho.sum(), is_ratio_max=rho.max(),
                     is_truncated_frac=(clipped & mask).sum(), logprob_mismatch=size.sum(),
                     logprob_mismatch_max=size.max(),
                     is_corrected_frac=(mask & (log_weight < 0)).sum())
        for name, value in (extra[0] if extra else {}).items():
            value = torch.where(mask, value.detach().expand_as(mask), 0.0)
            stats[name] = value.max() if name.endswith("_max") else value.sum()
        return total, stats


def merge_stats(stats_list, entropy_sum=0.0, reduce=None):
    """A step's micro-batches' policy_loss stats -> the log's values: maxima for names ending in
    _max, the other sums divided by the step's tokens. reduce(sums, maxima) -> both as floats, over
    every trainer (distributed.all_reduce_sums); the sums then hold the loss's and the entropy's."""
    if reduce:
        peaks = {k: max(s[k] for s in stats_list) for k in stats_list[0] if k.endswith("_max")}
        sums = reduce({k: sum(s[k] for s in stats_list) for k in stats_list[0] if k not in peaks},
                      peaks)
        entropy, lost = sums.pop("entropy"), sums.pop("loss")
        return dict(merge_stats([sums], entropy), loss=float(lost))
    tokens = max(float(sum(s["tokens"] for s in stats_list)), 1.0)  # the sync point: once per step
    merged = {k: max(float(s[k]) for s in stats_list) if k.endswith("_max") else
              float(sum(s[k] for s in stats_list)) / tokens for k in stats_list[0] if k != "tokens"}
    return dict(merged, entropy=float(entropy_sum) / tokens)


@torch.no_grad()
def sampler_mismatch(logprobs, behaviour_logprobs, mask):
    """The sampler/trainer numeric mismatch at lag 0 (what the FP32 head cuts, ScaleRL sec. 3.3)."""
    # on completions that one version of the weights sampled whole (validation's: no staleness) ->
    # dict(lag0_tokens, logprob_mismatch_lag0: mean |log pi - log pi_gen|,
    # kl_lag0: mean rho - 1 - log rho)
    mask = mask.bool()
    # (N, T); NaN (forced tokens) off mask
    log_ratio = torch.where(mask, logprobs - behaviour_logprobs, 0.0)
    n = max(int(mask.sum()), 1)
    return dict(lag0_tokens=int(mask.sum()), logprob_mismatch_lag0=float(log_ratio.abs().sum()) / n,
                kl_lag0=float((log_ratio.exp() - 1 - log_ratio).sum()) / n)
