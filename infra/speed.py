"""The CPU speed work of the samplers and the fp32 head: skip it on a first read. Each piece does
what a plain torch call does, faster on a CPU, and says which call and by how much (measured on 2 cores;
the decode step part by part: benchmarks/decode_roofline.py, the samplers' tokens/s:
benchmarks/samplers.py).

    GrowingLayer, new_cache   a KV cache that grows in place (plain: transformers' DynamicCache)
    decode_attention          a decode step's query heads grouped by KV head
                              (plain: F.scaled_dot_product_attention, transformers' "sdpa")
    inverse_cdf, sample_tokens, draw_tokens
                              a token drawn from two uniforms
                              (plain: torch.multinomial(torch.softmax(logits, -1), 1))
    bf16_products             the fp32 head's matmul through oneDNN's bf16 path
                              (plain: an fp32 matmul)
"""
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

# -----------------------------------------------------------------------------
# the KV cache and attention of a decode step

class GrowingLayer(DynamicLayer):
    """Keys and values are views of buffers with room to grow (doubling):
    a decode step writes its column."""
    # in place, where DynamicLayer's torch.cat copies the cache
    # (40% of a SmolLM2 decode step, fp32, CPU)

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        T, t = self.get_seq_length(), key_states.shape[-2]
        if T + t > (self.room.shape[-2] if hasattr(self, "room") else 0):  # full: double the room
            room = [x.new_empty(*x.shape[:-2], 2 * (T + t), x.shape[-1])
                    for x in (key_states, value_states)]
            if T:  # the columns so far move in
                room[0][..., :T, :], room[1][..., :T, :] = self.keys, self.values
            self.room, self.room_values = room
        self.keys, self.values = (x[..., :T + t, :] for x in (self.room, self.room_values))
        self.keys[..., T:, :], self.values[..., T:, :] = key_states, value_states
        return self.keys, self.values


def new_cache():
    """A KV cache of GrowingLayers (plain: transformers' DynamicCache)."""
    return Cache(layer_class_to_replicate=GrowingLayer)


def decode_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention;
    a decode step's query heads grouped by the KV head they read."""
    # (B, heads, 1, D) queries -> (B, kv_heads, heads / kv_heads, D): a group stands where positions
    # would, against the cache as it is, (B, kv_heads, T, D), which sdpa copies once per query head.
    # The same sums; Qwen2.5-0.5B, 64 rows, bf16, 2 CPU cores: 0.8 ms a layer against 9
    # (the decode step 2x faster)
    B, heads, length, D = query.shape
    if length > 1:  # a prefill, or the trainer sharing this module: sdpa itself
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    grouped = query.reshape(B, key.shape[1], heads // key.shape[1], D)
    # attention_mask: (B, 1, 1, T) or None; one query a row, so nothing causal to mask
    out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask,
                                         scale=kwargs.get("scaling"))
    # (B, 1, heads, D), as sdpa_attention_forward returns it
    return out.reshape(B, 1, heads, D), None


AttentionInterface.register("sdpa_decode", decode_attention)
AttentionMaskInterface.register("sdpa_decode", sdpa_mask)  # its masks are sdpa's

# -----------------------------------------------------------------------------
# drawing a token

def sample_tokens(logprobs, generator, block=1024):
    """(B, V) log-probs -> (B, 1) tokens, inverse CDF:
    a block of entries by its mass, then a token of it."""
    return inverse_cdf(logprobs.exp(), generator, block)


def inverse_cdf(weights, generator, block=1024):
    """(B, V) weights (probabilities, unnormalised) -> (B, 1) tokens drawn in proportion."""
    # p(block) x p(token) / p(block) = p(token), from two uniforms a row, where torch.multinomial
    # draws an exponential per entry (a quarter of a Qwen decode step on 2 CPU cores: 152k entries
    # a row) and a cumsum of the whole row in fp64 costs a sixth; a block's mass is summed in fp32
    # (relative error ~1e-6)
    B, V = weights.shape
    full = V // block * block  # the whole blocks' entries, then a ragged last block's, if any
    masses = weights[:, :full].view(B, -1, block).sum(-1)  # (B, blocks)
    if full < V:
        masses = torch.cat([masses, weights[:, full:].sum(-1, keepdim=True)], 1)
    u = torch.rand(B, 2, dtype=torch.float64, device=weights.device, generator=generator)

    def draw(weights, u):  # the first entry whose CDF (fp64) passes u x the total
        cdf = weights.cumsum(-1, dtype=torch.float64)
        return (torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True)
                .clamp_(max=cdf.shape[1] - 1))
    index = draw(masses, u[:, 0]) * block + torch.arange(block, device=weights.device)  # (B, block)
    # a ragged last block's overhang weighs 0
    entries = weights.gather(1, index.clamp(max=V - 1)) * (index < V)
    return index.gather(1, draw(entries, u[:, 1]))  # (B, 1)


def draw_tokens(logits, generator):
    """(B, V) fp32 logits / temperature, overwritten -> (B, 1) tokens from their softmax and
    (B,) their log-probs."""
    # exp(logits - max) in the logits' own buffer: a fresh (B, V) fp32 tensor cost ~25 ms of page
    # faults at 192 rows here, a pass ~10 ms (log_softmax, its exp, a slice a block: 34 ms a step;
    # this 29)
    weights = logits.sub_(logits.amax(-1, keepdim=True)).exp_()  # (B, V), the largest 1
    tokens = inverse_cdf(weights, generator)
    # log p = log(w / sum w): the trainer's logit - logsumexp to 1e-6 (log(exp(x)) is x to an ulp
    # of 1; log_softmax's was 4e-5 from it, Qwen's head)
    return tokens, weights.gather(1, tokens)[:, 0].log() - weights.sum(-1).log()

# -----------------------------------------------------------------------------
# the fp32 head's products (head.py)

@contextmanager
def bf16_products():
    """CPU: fp32 matmuls through oneDNN (its bf16 math allowed), summing in fp32 (plain: an fp32
    matmul; for head.py's fp32 head on a bf16 weight)."""
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
