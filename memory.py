"""
What fits on a GPU: a memory plan per role, estimated from the model's config.json before any work; train.py
prints it and, on CUDA, stops with one line naming the biggest term and its knob when a role cannot fit.
For a model you have not downloaded (also --tie_word_embeddings, --gpu_gib, --micro_batch_tokens, --max_len,
--expected_len (a sequence's tokens on average: sampler_slots), --sync_every=False for FSDP2 gradient sync on a
step's last micro-batch only):

    python memory.py --hidden_size=4096 --num_hidden_layers=36 --intermediate_size=12288 \\
        --vocab_size=151936 --num_attention_heads=32 --num_key_value_heads=8 --gpus=8 --n_samplers=6

The trainer peaks in a micro-batch's backward or in AdamW's step; its terms carry the names torch's
FSDPMemTracker files them under. Over T FSDP2 trainers: fp32 parameters 4N/T, gradients 4N/T (reduce-
scattered every micro-batch: synced on the last one only, FSDP2 would hold them unsharded in fp32 until
then, 4N on every trainer), AdamW's moments 8N/T and, in its foreach step, an fp32 temporary 4N/T. In the
backward: the root (embeddings, final norm, head) and a decoder layer gathered in the compute dtype, the
next layer's all-gather, a layer's fp32 reduce-scatter input; each layer's input (checkpointing) or its
(8 H + 5 I + 2 KV) saved values (SDPA: no T x T); then the larger of the head's backward (~5 chunks of up
to 256 MB of fp32 logits, or its gradient three times while autograd sums two chunks') and a layer's
recompute and gradients. benchmarks/memory_check.py measures every term (Qwen3-8B on fake tensors,
SmolLM2-135M on real ones): within 20%. vLLM takes its share of the *total* GPU memory: bf16 weights,
~2 GiB, the KV cache in the rest.
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


def trainer_phases(shape, trainers, sharded, dtype_bytes, tokens, checkpoint, sync_every=True, cpu=False):
    """One trainer at its two peaks -> {'backward': terms, 'step': terms}, terms [(name, bytes, knob)]. backward: of a
    micro-batch after the first (the earlier ones' gradients held), in the head's or in a layer's, whichever holds
    more; step: AdamW's. cpu: the head runs in fp32 (loss.head_weight)."""
    N, H, L, I, V, d = shape.params, shape.hidden, shape.layers, shape.intermediate, shape.vocab, dtype_bytes
    T = trainers if sharded else 1
    more = "more trainer ranks (fewer --n_samplers, or more GPUs)"
    head = V * H  # the LM head's weight, the embedding's too when tied
    root = head * (1 if shape.tied else 2) + H  # FSDP2's root unit: embeddings, final norm, head
    layer = (N - root) / L
    params = ("Sharded Param" if sharded else "fp32 parameters", 4 * N / T, more)
    grads = ("Sharded Grad" if sharded else "fp32 gradients", 4 * N / T, more)
    held = [params, grads if sync_every or not sharded else
            ("Unsharded Grad", 4 * N, "sync gradients every micro-batch"), ("OptState", 8 * N / T, more)]
    step = [params, grads, ("OptState (moments + foreach's temporary, at AdamW's step)", 12 * N / T, more)]
    if not sharded and d < 4:  # one process in bf16: policy.compute_copy, and in the backward its gradients
        held.append(("bf16 compute copy and its gradients", 2 * d * N, "FSDP2 (separate sampler ranks)"))
        step.append(("bf16 compute copy", d * N, "FSDP2 (separate sampler ranks)"))
    # FSDP2's buffers: the root gathered from the forward on, the next layer's all-gather; in a layer's backward that
    # layer gathered and its fp32 reduce-scatter input
    gathered = lambda layers: ([("Unsharded Param", d * (root + layers * layer), "weight tying or a smaller vocabulary"),
                                ("All Gather", d * layer, "(one decoder layer)")] +
                               [("Reduce Scatter", 4 * layer, "(one decoder layer)")] * layers) if sharded else []
    per_layer = (8 * H + 5 * I + 2 * shape.kv_dim) * d
    saved = tokens * ((L * H * d if checkpoint else L * per_layer) + (2 * d + 4) * H)  # + the final norm's
    chunk, many = min(tokens, (1 << 26) // V) * V * 4, tokens > (1 << 26) // V  # loss.py: ~256 MB of fp32 logits
    grad = (4 if cpu else d) * head  # the head's gradient (CPUs: of loss.head_weight's fp32 copy of the head)
    # the head's backward: a chunk's logits and their gradients, or autograd summing two chunks' head gradients
    head_backward = (4 * head if cpu and d < 4 else 0) + max(5 * chunk + many * grad, (1 + 2 * many) * grad + chunk)
    layer_backward = d * head + tokens * ((per_layer if checkpoint else 0) + 2 * (H + I) * d)
    work = lambda b: (f"Activation + Temp ({tokens:,} tokens)", saved + b,
                      "micro_batch_tokens" + ("" if checkpoint else " or checkpoint_activations=True"))
    backward = max(held + gathered(0) + [work(head_backward)], held + gathered(1) + [work(layer_backward)],
                   key=lambda terms: sum(b for _, b, _ in terms))
    return dict(backward=backward, step=step)


def plan(shape, trainers, sharded, n_samplers, one_gpu, dtype_bytes, tokens_per_micro_batch, checkpoint,
         max_len, vllm_share, bucket_bytes, gpu_bytes, sync_every=True, cpu=False, expected_len=None):
    """-> {role: [(term, bytes, the knob that shrinks it)]} for 'trainer' (the larger of its two peaks) and, with
    vLLM, 'sampler' (its own GPU) or 'vLLM beside the trainer' (one process, one GPU). gpu_bytes: the device's total
    memory."""
    N, L = shape.params, shape.layers
    phases = trainer_phases(shape, trainers, sharded, dtype_bytes, tokens_per_micro_batch, checkpoint, sync_every, cpu)
    roles = dict(trainer=max(phases.values(), key=lambda terms: sum(b for _, b, _ in terms)))
    if vllm_share:
        weights = 2 * N
        kv = max(vllm_share * gpu_bytes - weights - 2 * GiB, 0)
        kv_tokens = kv / (2 * L * shape.kv_dim * 2)
        knob = "vllm_gpu_memory" if one_gpu else "vllm_gpu_memory_own"
        roles["vLLM beside the trainer" if one_gpu else "sampler"] = [
            (f"vLLM's share ({vllm_share:.2f} of the GPU): bf16 weights", weights, knob),
            (f"KV cache: {kv_tokens / 1e3:,.0f}k tokens, {kv_tokens / max_len:,.0f} sequences of {max_len}, "
             f"{slots_that_fit(kv_tokens, expected_len or max_len)} of the expected {expected_len or max_len}", kv, knob),
            ("activations and graphs", 2 * GiB, knob)] + ([] if one_gpu else [("weight bucket in flight", bucket_bytes, "weight_bucket_mb")])
    return roles


def slots_that_fit(kv_tokens, expected_len):
    """The sequences a sampler should decode at once: as many as its KV cache holds at the expected length (ours: the
    longest prompt and half the completion budget). Past them vLLM's scheduler preempts the newest request and
    recomputes it from scratch, silently under LLM (vllm 0.32 v1/core/sched/scheduler.py:775-848, no swap)."""
    return int(kv_tokens // max(expected_len, 1))


def slots_warning(kv_tokens, expected_len, slots):
    """A WARNING line when sampler_slots exceeds slots_that_fit, else None."""
    fit = slots_that_fit(kv_tokens, expected_len)
    return None if slots <= fit else (f"WARNING: sampler_slots={slots}, but the KV cache holds {kv_tokens:,.0f} tokens: "
                                      f"{fit} sequences of the expected {expected_len:,} (vLLM would preempt and "
                                      f"recompute the rest): set sampler_slots <= {fit}")


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


def plan_run(path, layout, dtype_bytes, tokens_per_micro_batch, checkpoint, max_len, vllm_share, bucket_bytes,
             sync_every=True, expected_len=None, slots=0):
    """train.py's plan for the model at `path` and this layout, printed by the master -> check()'s verdict on CUDA;
    slots_warning() printed too when sampler_slots (`slots`) exceed what the planned KV cache holds."""
    from transformers import AutoConfig
    gpu = torch.cuda.get_device_properties(layout.device).total_memory if layout.device.type == "cuda" else 0
    one_gpu, shape = layout.world == 1, shape_of(AutoConfig.from_pretrained(path))
    roles = plan(shape, layout.trainers, layout.trainers > 1 and layout.samplers > 0, layout.samplers, one_gpu,
                 dtype_bytes, tokens_per_micro_batch, checkpoint, max_len, vllm_share if gpu else 0.0, bucket_bytes,
                 gpu, sync_every, layout.device.type == "cpu", expected_len)
    kv_bytes = [b for terms in roles.values() for term, b, _ in terms if term.startswith("KV cache")]
    warning = kv_bytes and slots_warning(kv_bytes[0] / (2 * shape.layers * shape.kv_dim * 2), expected_len, slots)
    if layout.rank == 0:
        print(describe(roles, gpu or None) + (f"\n{warning}" if warning else ""), flush=True)
    return check(roles, gpu, one_gpu) if gpu else None


if __name__ == "__main__":
    fields = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "num_attention_heads",
              "num_key_value_heads")
    args = configurator.configure(dict(dict.fromkeys(fields, 0), tie_word_embeddings=False, gpus=1, n_samplers=0,
                                       gpu_gib=141.0, micro_batch_tokens=16384, max_len=16384, expected_len=0, sync_every=True),
                                  sys.argv[1:], "memory.py", dict(dict.fromkeys(fields, 1), gpus=1, n_samplers=0))
    shape = shape_of({k: args[k] for k in fields + ("tie_word_embeddings",)})
    gpus, samplers, gpu = args["gpus"], args["n_samplers"], args["gpu_gib"] * GiB
    one_gpu = gpus == 1
    roles = plan(shape, gpus - samplers, gpus - samplers > 1, samplers, one_gpu, 2, args["micro_batch_tokens"], True,
                 args["max_len"], 0.4 if one_gpu else 0.85, 1 << 30, gpu, args["sync_every"],
                 expected_len=args["expected_len"] or args["max_len"])
    print(f"{shape.params / 1e9:.2f}B parameters, {gpus} GPU(s) of {gpu / GiB:.0f} GiB, {samplers} sampler(s)")
    print(describe(roles, gpu))
    print(check(roles, gpu, one_gpu) or "fits")
