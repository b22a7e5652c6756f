"""The memory plan per role from a model's config.json (docs/many_gpus.md: "What fits"), and the heap handed
back to the OS after each step (release). Without the model:

    python -m infra.memory --hidden_size=4096 --num_hidden_layers=36 --intermediate_size=12288 \\
        --vocab_size=151936 --num_attention_heads=32 --num_key_value_heads=8 --gpus=8 --n_samplers=6
"""
import ctypes
import os
import sys
from ast import literal_eval
from collections import namedtuple
from contextlib import suppress

import torch

from infra import lora

GiB = 1 << 30
Shape = namedtuple("Shape", "hidden layers intermediate vocab kv_dim tied params")
# the config.json fields a plan needs (head_dim, tie_word_embeddings: optional), memory.py's flags
FIELDS = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size",
          "num_attention_heads", "num_key_value_heads")

# looked up once, not every step
_malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", lambda _: 0)


def release():
    """The heap's free pages back to the OS: glibc's malloc_trim, a no-op under another libc."""
    # glibc keeps memory freed below the heap's last block in use: over a sitting a CPU trainer's
    # resident memory grew from 12.8 to 18.7 GiB, 7.1 GiB of it free (docs/real_model.md)
    _malloc_trim(0)


def shape_of(config):
    """A transformers config (or a dict of its fields) -> Shape, and the parameters it implies."""
    get = config.get if isinstance(config, dict) else lambda key: getattr(config, key, None)
    H, L, I, V, heads, kv_heads = map(get, FIELDS)
    head_dim = get("head_dim") or H // heads
    kv_dim = (kv_heads or heads) * head_dim
    tied = bool(get("tie_word_embeddings"))
    # a decoder layer: q and o, k and v, the MLP, two norms
    layer = H * heads * head_dim * 2 + H * kv_dim * 2 + 3 * H * I + 2 * H
    # the parameters: the layers, the embeddings and the head (one matrix when tied), the final norm
    return Shape(H, L, I, V, kv_dim, tied, L * layer + V * H * (2 - tied) + H)


def total(terms):
    return sum(size for _, size, _ in terms)


def trainer_phases(shape, trainers, sharded, dtype_bytes, tokens, checkpoint, sync_every=True,
                   cpu=False, adapter=0):
    """One trainer's two peaks -> {'backward': [(name, bytes, knob)], 'step': [...]}; adapter: LoRA's
    parameters (0: full fine-tuning)."""
    H, L, I, V, kv_dim, tied, N = shape
    d = dtype_bytes
    T = trainers if sharded else 1
    more = "more trainer ranks (fewer --n_samplers, or more GPUs)"
    # the LM head's weight (the embedding's too when tied); FSDP2's root unit: the embeddings, the
    # final norm, the head
    head = V * H
    root = head * (2 - tied) + H
    layer = (N - root) / L
    # fp32 and split over the trainers: parameters, gradients, AdamW's moments (and in its foreach
    # step a temporary), under the names torch's FSDPMemTracker files them
    params = ("Sharded Param" if sharded else "fp32 parameters", 4 * N / T, more)
    grads = ("Sharded Grad" if sharded else "fp32 gradients", 4 * N / T, more)
    # synced on the last micro-batch only, FSDP2 holds every gradient unsharded in fp32 until then
    no_sync = ("Unsharded Grad", 4 * N, "sync gradients every micro-batch")
    held = [params, no_sync if sharded and not sync_every else grads, ("OptState", 8 * N / T, more)]
    step = [params, grads,
            ("OptState (moments + foreach's temporary, at AdamW's step)", 12 * N / T, more)]
    if adapter:  # LoRA: the base frozen in the compute dtype, fp32 adapters alone trained
        base = ("frozen base in the compute dtype", d * N / T, more)
        adapters = [("fp32 adapters and their gradients", 8 * adapter / T, "lora_rank")]
        held = [base, *adapters, ("OptState (the adapters')", 8 * adapter / T, "lora_rank")]
        step = [base, *adapters, ("OptState (the adapters', at AdamW's step)", 12 * adapter / T,
                                  "lora_rank")]
    # one process in bf16: policy.compute_copy (and its gradients)
    if not sharded and d < 4 and not adapter:
        fsdp2 = "FSDP2 (separate sampler ranks)"
        held.append(("bf16 compute copy and its gradients", 2 * d * N, fsdp2))
        step.append(("bf16 compute copy", d * N, fsdp2))

    # a micro-batch's backward after the first (the earlier ones' gradients held). Saved for it:
    # each layer's input (checkpointing) or its values (SDPA: no T x T), and the final norm's
    per_layer = (8 * H + 5 * I + 2 * kv_dim) * d
    saved = tokens * (L * (H * d if checkpoint else per_layer) + (2 * d + 4) * H)
    # head.py's chunks: ~256 MB of fp32 logits
    chunk, many = min(tokens, (1 << 26) // V) * V * 4, tokens > (1 << 26) // V
    # the head's gradient in the compute dtype (LoRA: none, it is frozen); cpu: head.head_weight's
    # fp32 upcast of a bf16 head too
    grad = d * head * (not adapter)
    # in the head (head._HeadLogprobs): a chunk's logits, turned into their gradient in place, and
    # its bf16 cast; or autograd summing two chunks' gradients of the weight
    head_backward = (4 * head * (cpu and d < 4)
                     + max(2 * chunk + many * grad, (1 + 2 * many) * grad + chunk))
    # in a layer: its recompute (checkpointing) and its gradients
    layer_backward = grad + tokens * (checkpoint * per_layer + 2 * (H + I) * d)
    knob = "micro_batch_tokens" + ("" if checkpoint else " or checkpoint_activations=True")

    # the backward in the head or in a layer, with FSDP2's buffers: the root gathered in the compute
    # dtype from the forward on, the next layer's all-gather and, in a layer, that layer gathered
    # too and its fp32 reduce-scatter input
    def peak(layers, temp):
        one = "(one decoder layer)"
        gathered = [("Unsharded Param", d * (root + layers * layer),
                     "weight tying or a smaller vocabulary"),
                    ("All Gather", d * layer, one)] + [("Reduce Scatter", 4 * layer, one)] * layers
        return held + gathered * sharded + [
            (f"Activation + Temp ({tokens:,} tokens)", saved + temp, knob)]

    return dict(backward=max(peak(0, head_backward), peak(1, layer_backward), key=total), step=step)


def kv_cache(shape, vllm_share, gpu_bytes):
    """The KV cache in vLLM's share of the *total* GPU memory -> (bytes, tokens)."""
    # less the bf16 weights and ~2 GiB of activations and graphs
    kv = max(vllm_share * gpu_bytes - 2 * shape.params - 2 * GiB, 0)
    # its tokens: K and V of every layer, bf16
    return kv, kv / (2 * shape.layers * shape.kv_dim * 2)


def torch_sampler(shape, slots, max_len, dtype_bytes, fp32_head, lora=False):
    """The torch sampler beside a CPU rank's trainer, at its most -> [(term, bytes, knob)]; lora: it
    decodes with its own merged copy (else with the trainer's compute module)."""
    # its KV cache: `slots` rows (validation fills them all) of max_len columns, in GrowingLayer's
    # room, which doubles (and _splice starts at twice the columns); the head that head.head_weight
    # casts to fp32 once a version; a decode step's fp32 logits, their log-softmax and the draw's
    # sums
    kv = 2 * slots * max_len * shape.layers * shape.kv_dim * 2 * dtype_bytes
    return [(f"KV cache ({slots} rows of {max_len} tokens, room to double)", kv, "sampler_slots"),
            ("fp32 head", 4 * shape.vocab * shape.hidden * (fp32_head and dtype_bytes < 4),
             "fp32_head"),
            ("a decode step's logits", 3 * 4 * slots * shape.vocab, "sampler_slots"),
            ("Python, torch, transformers, the tokenizer", GiB // 2, "nothing")] + [
        ("the model, adapters merged (LoRA)", dtype_bytes * shape.params, "lora_rank")] * lora


def plan(shape, trainers, sharded, n_samplers, one_gpu, dtype_bytes, tokens_per_micro_batch,
         checkpoint, max_len, vllm_share, bucket_bytes, gpu_bytes, sync_every=True, cpu=False,
         expected_len=None, torch_slots=0, fp32_head=True, adapter=0):
    """-> {role: [(term, bytes, knob)]}: 'trainer', and its sampler's (vLLM's or torch's); adapter:
    LoRA's parameters."""
    # 'torch sampler beside the trainer': a CPU run's trainer module samples too, torch_slots rows
    # at once
    # the trainer at the larger of its peaks; vLLM on a GPU of its own, or beside the trainer in one
    # process; gpu_bytes: the device's total memory
    phases = trainer_phases(
        shape, trainers, sharded, dtype_bytes, tokens_per_micro_batch, checkpoint, sync_every, cpu,
        adapter)
    roles = dict(trainer=max(phases.values(), key=total))
    if vllm_share:
        kv, tokens = kv_cache(shape, vllm_share, gpu_bytes)
        expected = expected_len or max_len
        knob = "vllm_gpu_memory" if one_gpu else "vllm_gpu_memory_own"
        roles["vLLM beside the trainer" if one_gpu else "sampler"] = [
            (f"vLLM's share ({vllm_share:.2f} of the GPU): bf16 weights", 2 * shape.params, knob),
            (f"KV cache: {tokens / 1e3:,.0f}k tokens, {tokens / max_len:,.0f} sequences of "
             f"{max_len}, {slots_that_fit(tokens, expected)} of the expected {expected}", kv, knob),
            ("activations and graphs", 2 * GiB, knob)
        ] + [("weight bucket in flight", bucket_bytes, "weight_bucket_mb")] * (not one_gpu)
    if torch_slots:
        roles["torch sampler beside the trainer"] = torch_sampler(
            shape, torch_slots, max_len, dtype_bytes, fp32_head, adapter > 0)
    return roles


def slots_that_fit(kv_tokens, expected_len):
    """The sequences to decode at once: those the KV cache holds at the expected length."""
    # past them vLLM preempts the newest request and recomputes it from scratch, silently under LLM,
    # with no swap (docs/vllm.md, "The source lines")
    return int(kv_tokens // max(expected_len, 1))


def slots_warning(kv_tokens, expected_len, slots):
    """A WARNING line when sampler_slots exceeds slots_that_fit, else None."""
    fit = slots_that_fit(kv_tokens, expected_len)
    if slots > fit:
        return (f"WARNING: sampler_slots={slots}, but the KV cache holds {kv_tokens:,.0f} tokens: "
                f"{fit} sequences of the expected {expected_len:,} (vLLM would preempt and "
                f"recompute the rest): set sampler_slots <= {fit}")


def describe(roles, gpu_bytes=None):
    """The plan as printable lines, one per role."""
    of = f" of {gpu_bytes / GiB:.0f}" if gpu_bytes else ""
    parts = lambda terms: " | ".join(f"{term} {size / GiB:.1f}" for term, size, _ in terms)
    return "\n".join(f"memory plan, {role}: {parts(terms)} | total {total(terms) / GiB:.1f} GiB{of}"
                     for role, terms in roles.items())


def check(roles, gpu_bytes, one_gpu):
    """None if all fit, else one line: the biggest term and its knob."""
    groups = {"the trainer and vLLM on one GPU": sum(roles.values(), [])} if one_gpu else roles
    for name, terms in groups.items():
        need = total(terms)
        if need > gpu_bytes or any(size == 0 and term.startswith("KV") for term, size, _ in terms):
            term, size, knob = max(terms, key=lambda t: t[1])
            return (f"memory plan: {name} needs ~{need / GiB:.1f} GiB of the GPU's "
                    f"{gpu_bytes / GiB:.1f} GiB (or leaves vLLM no KV cache); the biggest term is "
                    f"{term} ({size / GiB:.1f} GiB): {knob}")


def plan_run(path, layout, config, max_len):
    """Print the plan and any warning on rank 0 -> check()'s verdict on CUDA, else None."""
    from transformers import AutoConfig
    cpu, one_gpu = layout.device.type == "cpu", layout.world == 1
    gpu = 0 if cpu else torch.cuda.get_device_properties(layout.device).total_memory
    # vLLM's memory is planned on CUDA only
    share = (config["vllm_gpu_memory" if one_gpu else "vllm_gpu_memory_own"]
             if gpu and config["sampler"] == "vllm" else 0.0)
    rows = config["micro_batch"] or config["prompts_per_step"] * config["samples_per_prompt"]
    # a micro-batch's at most
    tokens = min(config["micro_batch_tokens"] or rows * max_len, rows * max_len)
    # slots_that_fit's
    expected = max_len - (config["think_budget_max"] + config["answer_budget"]) // 2
    model_config = AutoConfig.from_pretrained(path)
    shape = shape_of(model_config)
    adapter = config["lora_rank"] and lora.count(model_config, config["lora_rank"],
                                                 config["lora_targets"])
    # sharded by FSDP2 when 2+ trainers sit beside sampler ranks (else data parallel)
    sharded = layout.trainers > 1 and layout.samplers > 0
    dtype_bytes = 2 if config["dtype"] == "bfloat16" else 4
    slots = config["sampler_slots"]
    torch_slots = cpu and config["sampler"] == "torch" and not layout.samplers and slots
    roles = plan(
        shape, layout.trainers, sharded, layout.samplers, one_gpu, dtype_bytes, tokens,
        config["checkpoint_activations"], max_len, share, config["weight_bucket_mb"] << 20, gpu,
        cpu=cpu, expected_len=expected, torch_slots=torch_slots, fp32_head=config["fp32_head"],
        adapter=adapter)
    warning = share and slots_warning(kv_cache(shape, share, gpu)[1], expected, slots)
    # on a CPU: this process's plan for each of the machine's processes (a sampler rank's weights
    # left out)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    need = total(sum(roles.values(), [])) * int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    # the cache's room at its most: a warning, not a stop
    if cpu and need > ram:
        warning = (f"WARNING: the plan needs {need / GiB:.1f} GiB of this machine's "
                   f"{ram / GiB:.1f} GiB: fewer sampler_slots or a smaller micro_batch")
    if layout.rank == 0:
        print(describe(roles, gpu) + (f"\n{warning}" if warning else ""), flush=True)
    return check(roles, gpu, one_gpu) if gpu else None


if __name__ == "__main__":
    # also --tie_word_embeddings; --expected_len: a sequence's tokens on average (for
    # sampler_slots); --sync_every=False: FSDP2 syncs gradients on a step's last micro-batch only
    defaults = dict(dict.fromkeys(FIELDS, 0), tie_word_embeddings=False, gpus=1, n_samplers=0,
                    gpu_gib=141.0, micro_batch_tokens=16384, max_len=16384, expected_len=0,
                    sync_every=True)
    smallest = dict(dict.fromkeys(defaults, 0), **dict.fromkeys(FIELDS, 1), gpus=1)
    args = dict(defaults)
    for arg in sys.argv[1:]:  # --key=value, strict, as train.py's configurator is
        key, _, text = arg.removeprefix("--").partition("=")
        value = None
        with suppress(ValueError, SyntaxError):
            value = literal_eval(text)
        if key not in args or type(value) not in (type(args[key]), int) or value < smallest[key]:
            print(f"infra/memory.py: error: {arg}: expected --key=number (>= "
                  f"{smallest.get(key, 0)}); keys: {', '.join(args)}", file=sys.stderr)
            sys.exit(2)  # bad input, as everywhere
        args[key] = type(args[key])(value)
    shape = shape_of(args)
    gpus, samplers, gpu = args["gpus"], args["n_samplers"], args["gpu_gib"] * GiB
    one_gpu = gpus == 1
    roles = plan(shape, gpus - samplers, gpus - samplers > 1, samplers, one_gpu, 2,
                 args["micro_batch_tokens"], True, args["max_len"], 0.4 if one_gpu else 0.85,
                 GiB, gpu, args["sync_every"], expected_len=args["expected_len"])
    print(f"{shape.params / 1e9:.2f}B parameters, {gpus} GPU(s) of {gpu / GiB:.0f} GiB, "
          f"{samplers} sampler(s)\n{describe(roles, gpu)}\n{check(roles, gpu, one_gpu) or 'fits'}")
