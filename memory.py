"""
What fits on a GPU: a memory plan per role, estimated from the model's config.json before any work; train.py
prints it and, on CUDA, stops with one line naming the biggest term and its knob when a role cannot fit.
For a model you have not downloaded (also --tie_word_embeddings, --gpu_gib, --micro_batch_tokens, --max_len):

    python memory.py --hidden_size=4096 --num_hidden_layers=36 --intermediate_size=12288 \\
        --vocab_size=151936 --num_attention_heads=32 --num_key_value_heads=8 --gpus=8 --n_samplers=6

Estimates (ours; good to ~20%): the trainer holds 16 bytes a parameter (fp32 weights, gradients, AdamW's two
moments) over the FSDP2 trainers; in one process in bf16, a bf16 copy and its gradients; under FSDP2 the
gathered bf16 layers (two at a time) and root. Activations per token and layer: (8 H + 5 I + 2 KV) values
(SDPA: no T x T), with activation checkpointing each layer's input plus one layer; the fp32 head ~3 chunks of
256 MB. vLLM takes its share of the *total* GPU memory: bf16 weights, ~2 GiB, and the KV cache in the rest.
"""
import sys
from collections import namedtuple

import torch

import configurator

GiB = 1 << 30
Shape = namedtuple("Shape", "hidden layers intermediate vocab kv_dim tied params")


def shape_of(config):
    """A transformers config (or a dict of its fields) -> Shape, with the parameter count it implies."""
    get = (lambda k, d=None: config.get(k, d)) if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    H, L, I, V = get("hidden_size"), get("num_hidden_layers"), get("intermediate_size"), get("vocab_size")
    heads = get("num_attention_heads")
    head_dim = get("head_dim") or H // heads
    kv_dim = (get("num_key_value_heads") or heads) * head_dim
    tied = bool(get("tie_word_embeddings", False))
    layer = H * heads * head_dim * 2 + H * kv_dim * 2 + 3 * H * I + 2 * H  # q, o, k, v, the MLP, two norms
    params = L * layer + V * H * (1 if tied else 2) + H
    return Shape(H, L, I, V, kv_dim, tied, params)


def plan(shape, trainers, sharded, n_samplers, one_gpu, dtype_bytes, tokens_per_micro_batch, checkpoint,
         max_len, vllm_share, bucket_bytes, gpu_bytes):
    """-> {role: [(term, bytes, the knob that shrinks it)]} for 'trainer' and, with vLLM, 'sampler' (its
    own GPU) or 'vLLM beside the trainer' (one process, one GPU). gpu_bytes: the device's total memory."""
    N, H, L = shape.params, shape.hidden, shape.layers
    shards = trainers if sharded else 1
    more_trainers = "more trainer ranks (fewer --n_samplers, or more GPUs)"
    trainer = [("fp32 parameters", 4 * N / shards, more_trainers), ("fp32 gradients", 4 * N / shards, more_trainers),
               ("AdamW moments", 8 * N / shards, more_trainers)]
    root = shape.vocab * H * (1 if shape.tied else 2)
    if sharded:
        trainer.append(("gathered bf16 layers and root", dtype_bytes * (2 * (N - root) / L + root) + 4 * root,
                        "weight tying or a smaller vocabulary"))
    elif dtype_bytes < 4:
        trainer.append(("bf16 compute copy and its gradients", 2 * dtype_bytes * N, "FSDP2 (separate sampler ranks)"))
    per_token_layer = (8 * H + 5 * shape.intermediate + 2 * shape.kv_dim) * dtype_bytes
    saved = tokens_per_micro_batch * (L * H * dtype_bytes + per_token_layer if checkpoint else L * per_token_layer)
    trainer.append(("activations per micro-batch", saved,
                    "micro_batch_tokens" + ("" if checkpoint else " or checkpoint_activations=True")))
    trainer.append(("fp32 head logits", 3 * (1 << 26) * 4, "(fixed: 256 MB chunks)"))
    roles = dict(trainer=trainer)
    if vllm_share:
        weights = 2 * N
        kv = vllm_share * gpu_bytes - weights - 2 * GiB
        knob = "vllm_gpu_memory" if one_gpu else "vllm_gpu_memory_own"
        roles["vLLM beside the trainer" if one_gpu else "sampler"] = [
            (f"vLLM's share ({vllm_share:.2f} of the GPU): bf16 weights", weights, knob),
            (f"KV cache: {max(kv, 0) / (2 * L * shape.kv_dim * 2) / 1e3:,.0f}k tokens, "
             f"{max(kv, 0) / (2 * L * shape.kv_dim * 2 * max_len):,.0f} sequences of {max_len}", max(kv, 0), knob),
            ("activations and graphs", 2 * GiB, knob)] + ([] if one_gpu else [("weight bucket in flight", bucket_bytes, "weight_bucket_mb")])
    return roles


def describe(roles, gpu_bytes=None):
    """The plan as a few printable lines, one per role."""
    lines = []
    for role, terms in roles.items():
        total = sum(b for _, b, _ in terms)
        parts = " | ".join(f"{term} {b / GiB:.1f}" for term, b, _ in terms)
        of = f" of {gpu_bytes / GiB:.0f}" if gpu_bytes else ""
        lines.append(f"memory plan, {role}: {parts} | total {total / GiB:.1f} GiB{of}")
    return "\n".join(lines)


def check(roles, gpu_bytes, one_gpu):
    """None if every role fits (one process: trainer + vLLM's share), else a line naming the biggest term's knob."""
    groups = [sum(roles.values(), [])] if one_gpu else list(roles.values())
    names = ["the trainer and vLLM on one GPU"] if one_gpu else list(roles)
    for name, terms in zip(names, groups):
        total = sum(b for _, b, _ in terms)
        if total > gpu_bytes or any(b == 0 and term.startswith("KV") for term, b, _ in terms):
            term, size, knob = max(terms, key=lambda t: t[1])
            return (f"memory plan: {name} needs ~{total / GiB:.1f} GiB of the GPU's {gpu_bytes / GiB:.1f} GiB (or leaves "
                    f"vLLM no KV cache); the biggest term is {term} ({size / GiB:.1f} GiB): {knob}")
    return None


def plan_run(path, layout, dtype_bytes, tokens_per_micro_batch, checkpoint, max_len, vllm_share, bucket_bytes):
    """train.py's plan for the model at `path` and this layout, printed by the master -> check()'s verdict on CUDA."""
    from transformers import AutoConfig
    gpu = torch.cuda.get_device_properties(layout.device).total_memory if layout.device.type == "cuda" else 0
    one_gpu = layout.world == 1
    roles = plan(shape_of(AutoConfig.from_pretrained(path)), layout.trainers, layout.trainers > 1 and layout.samplers > 0,
                 layout.samplers, one_gpu, dtype_bytes, tokens_per_micro_batch, checkpoint, max_len,
                 vllm_share if gpu else 0.0, bucket_bytes, gpu)
    if layout.rank == 0:
        print(describe(roles, gpu or None), flush=True)
    return check(roles, gpu, one_gpu) if gpu else None


if __name__ == "__main__":
    fields = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "num_attention_heads",
              "num_key_value_heads")
    args = configurator.configure(dict(dict.fromkeys(fields, 0), tie_word_embeddings=False, gpus=1, n_samplers=0,
                                       gpu_gib=141.0, micro_batch_tokens=16384, max_len=16384), sys.argv[1:], "memory.py",
                                  dict(dict.fromkeys(fields, 1), gpus=1, n_samplers=0))
    shape = shape_of({k: args[k] for k in fields + ("tie_word_embeddings",)})
    gpus, samplers, gpu = args["gpus"], args["n_samplers"], args["gpu_gib"] * GiB
    one_gpu = gpus == 1
    roles = plan(shape, gpus - samplers, gpus - samplers > 1, samplers, one_gpu, 2, args["micro_batch_tokens"], True,
                 args["max_len"], 0.4 if one_gpu else 0.85, 1 << 30, gpu)
    print(f"{shape.params / 1e9:.2f}B parameters, {gpus} GPU(s) of {gpu / GiB:.0f} GiB, {samplers} sampler(s)")
    print(describe(roles, gpu))
    print(check(roles, gpu, one_gpu) or "fits")
