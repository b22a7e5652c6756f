"""
The fp32 LM head: logits and per-token log-probs of sampled tokens (ScaleRL sec. 3.3), the same
numerics in the trainer and the samplers.

    head_weight     the head's weight as the others take it: on CPUs a bf16 head upcast to fp32 once
    lm_head_logits  (..., H) final hidden states -> (..., V) fp32 logits / temperature (samplers)
    token_logprobs  (B, T) ids -> (B, T-1) fp32 log-probs of the tokens, with gradient (trainer)
    TokenLogprobs   token_logprobs as a module's forward: policy.py's (the FSDP2 root)

Every per-token tensor is aligned with the *predicted* token: position t holds
log p(x[t+1] | x[:t+1]).
"""

import torch
import torch.nn.functional as F

from infra.speed import bf16_products

# -----------------------------------------------------------------------------
# logits

def head_weight(model, fp32_head=True):
    """The LM head's weight as _head takes it: on CPUs upcast to fp32 once a decode step or
    micro-batch."""
    weight = model.get_output_embeddings().weight
    return weight.float() if fp32_head and not weight.is_cuda else weight


def _head(hidden, weight, weight32, bias, temperature, fp32_head=True):
    """(n, H) final hidden states -> (n, V) fp32 logits / temperature (the FP32 head, ScaleRL
    sec. 3.3)."""
    # An fp32 weight in IEEE fp32; a bf16 one as the exact products of its bf16 operands summed in
    # fp32 (vLLM's head_dtype=float32 on tensor cores): torch.mm(..., out_dtype=float32) on GPUs,
    # oneDNN on weight32 (its fp32 upcast) on CPUs. fp32_head=False, the ablation: logits rounded to
    # the weight's dtype
    if not fp32_head:
        return F.linear(hidden.to(weight.dtype), weight, bias).float() / temperature
    if weight.dtype == torch.float32:
        logits = F.linear(hidden.float(), weight, None if bias is None else bias.float())
    elif weight32 is None:
        logits = torch.mm(hidden.to(weight.dtype), weight.t(), out_dtype=torch.float32)
    else:
        with bf16_products():
            logits = torch.mm(hidden.float(), weight32.t())
    logits = logits if bias is None or weight.dtype == torch.float32 else logits + bias.float()
    # the temperature sits right before the log-softmax; in place: a fresh (n, V) fp32 tensor cost
    # ~25 ms of page faults at 192 rows here (x / 1 is x: nothing to do)
    return logits if temperature == 1 else logits.div_(temperature)


def _operands(model, fp32_head, weight=None):
    """_head's (weight, weight32, bias) of the model; weight: head_weight's, if already cast."""
    head = model.get_output_embeddings()
    weight = head_weight(model, fp32_head) if weight is None else weight
    upcast = weight if weight.dtype != head.weight.dtype else None  # CPU: a bf16 head's fp32 copy
    return head.weight, upcast, getattr(head, "bias", None)


def lm_head_logits(model, hidden, temperature=1.0, fp32_head=True, weight=None):
    """(..., H) final hidden states -> (..., V) fp32 logits / temperature, without gradient."""
    # the trainer's logits go through _HeadLogprobs. The FP32 head removed most of the paper's
    # generator/trainer mismatch (A 0.52 -> 0.61)
    operands = _operands(model, fp32_head, weight)
    # an enclosing autocast would undo the upcast
    with torch.autocast(hidden.device.type, enabled=False):
        logits = _head(hidden.reshape(-1, hidden.shape[-1]), *operands, temperature, fp32_head)
    return logits.view(*hidden.shape[:-1], -1)

# -----------------------------------------------------------------------------
# log-probs of the sampled tokens

class _HeadLogprobs(torch.autograd.Function):
    """A chunk's (n,) log p(target) from its (n, H) final hidden states through the head."""
    # Never an (n, V) log-softmax; with_entropy the (n,) entropy lse - sum(p * logit) too (no
    # gradient), in one pass over the logits each way: the forward keeps none and the backward
    # recomputes them (as activation checkpointing would) into softmax - one-hot, in place. Its
    # matmuls take the gradient in the head's dtype: a bf16 model's as bf16 operands with fp32
    # accumulation, as in its body's backward (so autograd sums the weight's gradient over a
    # micro-batch's chunks in bf16: measured, 37 chunks, 0.7% relative error)

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
        # d log p(y) / d logits: one-hot - p
        d_logits = logits.sub_(lse[:, None]).exp_().mul_(-grad[:, None])
        d_logits.scatter_add_(1, targets[:, None], grad[:, None])
        d_logits = (d_logits / ctx.temperature).to(weight.dtype)
        d_bias = None if bias is None else d_logits.sum(0).to(bias.dtype)
        # a frozen head (LoRA) gets no (V, H) gradient: a matmul as big as the head's forward, saved
        d_weight = d_logits.t() @ hidden.to(weight.dtype) if ctx.needs_input_grad[1] else None
        return d_logits @ weight, d_weight, None, d_bias, None, None, None, None


def token_logprobs(model, input_ids, temperature=1.0, fp32_head=True, attention_mask=None,
                   with_entropy=False, chunk_tokens=None):
    """Log-probs of input_ids[:, 1:] under a transformers causal LM: (B, T) ids -> (B, T-1) fp32."""
    # with_entropy, the policy's entropy at each position too (no gradient: a diagnostic). The head
    # runs over chunks of positions (_HeadLogprobs): no (B, T, V) fp32 tensor is ever held
    # (V = 152k for Qwen)
    body = model.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    # (B*(T-1), H): the positions that predict a token
    hidden = body.last_hidden_state[:, :-1].flatten(0, 1)
    targets = input_ids[:, 1:].reshape(-1)  # (B*(T-1),)
    operands = _operands(model, fp32_head)  # cast once for every chunk (and its recompute)
    n = chunk_tokens or max(1, (1 << 26) // len(operands[0]))  # ~256 MB of fp32 logits (ours)
    # an enclosing autocast would undo the upcast
    with torch.autocast(hidden.device.type, enabled=False):
        # (logprobs, entropy) per chunk
        chunks = [_HeadLogprobs.apply(hidden[i:i + n], *operands, targets[i:i + n], temperature,
                                      fp32_head, with_entropy) for i in range(0, len(hidden), n)]
    logprobs, entropies = (torch.cat(x).view(len(input_ids), -1) for x in zip(*chunks))
    return (logprobs, entropies) if with_entropy else logprobs


class TokenLogprobs(torch.nn.Module):
    """token_logprobs as the forward of a module holding the causal LM: under FSDP2 the root, whose
    forward uses the embeddings, the final norm and the head (fully_shard's hooks run on a module's
    forward)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, temperature=1.0, fp32_head=True, with_entropy=False):
        out = token_logprobs(self.model, input_ids, temperature, fp32_head,
                             with_entropy=with_entropy)
        # not views (FSDP2 warns of in-place ops on a root's view outputs): (B, T-1) floats, a small
        # copy
        return tuple(x.clone() for x in out) if with_entropy else out.clone()
