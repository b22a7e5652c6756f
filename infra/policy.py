"""
The trainer's policy: fp32 parameters and AdamW state, computing in `dtype` by FSDP2
(MixedPrecisionPolicy) or by a bf16 copy in one process (the same numerics); with LoRA (lora.py) a
frozen base in `dtype` and fp32 adapters, the only parameters AdamW sees. Its way out (via
distributed.py): the full weights (the adapters) gathered to the master for checkpoints, and cast
buckets of the weights (the adapted ones, merged) for the samplers (no second full copy).
"""
# fp32 masters: an Adam step at the paper's lr 5e-7 is below bf16's resolution for most weights, so
# bf16 master weights would not learn
import copy
import math
import os
import platform
from collections import namedtuple

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                     set_optimizer_state_dict)
from transformers import AutoModelForCausalLM

from infra import lora as lora_adapters
from infra.distributed import RemoteSamplers, bucket_plan, naming_peers

Policy = namedtuple("Policy", "model logprobs optimizer rank ranks sharded lora",
                    defaults=(None,))
# model holds the fp32 parameters (AdamW steps them, checkpoints save them, the samplers get them
# cast); logprobs (head.TokenLogprobs) computes with them, on the model itself or on its bf16 copy,
# and is the FSDP2 root when sharded; rank / ranks: this trainer among the trainers; lora: None
# (full fine-tuning) or {rank, alpha, targets, base: the base model's fingerprint}.


def native_bf16():
    """The instructions this CPU multiplies bf16 with ('avx512_bf16', which every AMX CPU has too;
    Arm's 'BF16'), or '' when it has none and emulates bf16."""
    # emulated: an AVX2 CPU ran a bf16 F.linear at 15 GFLOP/s against fp32's 69, a bf16 a @ b at ~1
    # against ~100. torch reads the flags from cpuinfo: instant and the same every time, unlike a
    # timed probe
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "BF16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else ""  # oneDNN's, on Arm
    return "avx512_bf16" if torch.cpu._is_avx512_bf16_supported() else ""


def resolve_dtype(name, device):
    """A dtype knob -> (the dtype's name, why): 'auto' is bfloat16 on CUDA and on a CPU with native
    bf16, else float32; 'float32' and 'bfloat16' stay themselves."""
    # native bf16: ~4x fp32's matmul speed
    if torch.device(device).type == "cuda":
        return ("bfloat16", "auto: CUDA") if name == "auto" else (name, "as configured")
    native = native_bf16()
    if name == "auto":
        return ("bfloat16", f"auto: this CPU has {native}") if native else \
            ("float32", "auto: this CPU has no avx512_bf16, AMX or Arm BF16")
    # asked for: it runs, and the start says why it crawls
    slow = name == "bfloat16" and not native
    return name, "as configured" + (", though this CPU has no native bf16" if slow else "")


def resolve_dtypes(trainer, sampler, device, saved=None):
    """The trainer's and the sampler's dtype knobs -> (their dtypes, the start's line saying why);
    saved: a resumed checkpoint's config, whose 'auto' on another machine may have differed."""
    (trainer, t_why), (sampler, s_why) = (resolve_dtype(d, device) for d in (trainer, sampler))
    why = t_why if t_why == s_why else f"trainer {t_why}; sampler {s_why}"
    changed = [f"{k} {saved[k]}" for k, v in (("dtype", trainer), ("sampler_dtype", sampler))
               if saved and saved[k] != v]
    note = f"; the checkpoint's run had {', '.join(changed)}" if changed else ""
    return trainer, sampler, f"dtypes: trainer {trainer}, sampler {sampler} ({why}){note}"


def load_policy(path, device, rank, ranks, sharded, dtype, checkpoint_activations, resume_from,
                head, lora=None, **adamw):
    """The trainer's Policy from a Hugging Face directory; resume_from: a checkpoint's directory
    (its optimizer.pt, and with LoRA its adapter) or None; head: the log-prob module around the
    model (head.TokenLogprobs). lora: {rank, alpha, targets, seed}."""
    # sharded: FSDP2 over the `ranks` trainers (beside sampler ranks); otherwise every rank holds
    # the model
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).train()
    if lora:  # the base, fingerprinted, held once in `dtype`, frozen
        lora = dict(lora, base=lora_adapters.fingerprint(path))
        cast(model, dtype)
        lora_adapters.add_adapters(model, lora["rank"], lora["alpha"], lora["targets"],
                                   lora.pop("seed"))
        if resume_from:
            lora_adapters.load_peft(resume_from, model)
    if checkpoint_activations:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(use_reentrant=False))
    logprobs = head(model if sharded or lora else compute_copy(model, dtype))
    if sharded:
        shard(model, dtype, root=logprobs)
    # foreach: under FSDP2 every parameter is a DTensor (the root is sharded too), so the
    # multi-tensor path that CUDA picks by default works; CPUs take it there too, so the tests run
    # what GPUs run. A CPU's plain tensors take the fused kernel: 2.8x foreach's speed here
    # (benchmarks/step_roofline.py)
    fused = not sharded and torch.device(device).type == "cpu"
    trained = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters
    optimizer = torch.optim.AdamW(trained, **{"fused" if fused else "foreach": True}, **adamw)
    if resume_from:  # under FSDP2 trainer rank 0 reads it for all
        state = (torch.load(os.path.join(resume_from, "optimizer.pt"), weights_only=False)
                 if rank == 0 or not sharded else {})
        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=sharded))
    return Policy(model, logprobs, optimizer, rank, ranks, sharded, lora)


def policy_size(policy):
    """-> (the base model's parameters, the LoRA adapters' (0 without))."""
    adapter = sum(p.numel() for p in policy.model.parameters() if p.requires_grad
                  ) if policy.lora else 0
    return sum(p.numel() for p in policy.model.parameters()) - adapter, adapter


def shard(model, dtype, root):
    """FSDP2 over the trainers' group: every decoder layer, then `root` (its forward uses the
    embeddings, the final norm and the head). fp32 shards, gathered in `dtype`, fp32 gradients."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mixed = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for layer in model.base_model.layers:
        fully_shard(layer, mp_policy=mixed, reshard_after_forward=True)
    fully_shard(root, mp_policy=mixed)


def cast(model, dtype):
    """`model`'s parameters in `dtype`, in place; its buffers (RoPE's inv_freq) stay fp32, as
    from_pretrained(dtype=...), FSDP2 and vLLM keep them -> model."""
    # model.to(bf16) would round inv_freq too: a position p's angle then moves by up to ~p * 2^-9
    # radians a frequency, and the trainer no longer computes the samplers' model
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


def compute_copy(model, dtype):
    """FSDP2's numerics without FSDP2: a `dtype` copy computes, kept in step by add_grads and
    copy_weights."""
    return model if dtype == torch.float32 else cast(copy.deepcopy(model), dtype)


def sampler_module(policy, dtype):
    """A torch sampler's module in the trainer's process: the compute module if in `dtype`
    (zero-copy updates), else compute_copy's (push_weights fills it); LoRA: the adapters merged."""
    if policy.lora:
        return lora_adapters.merged_copy(policy.model, dtype)
    compute = policy.logprobs.model
    same = next(compute.parameters()).dtype == dtype
    return compute if same else compute_copy(policy.model, dtype)


@torch.no_grad()
def add_grads(model, compute):
    """A micro-batch's gradients of the compute copy, added to the fp32 parameters' (summed in
    fp32)."""
    # through one scratch buffer: faster than a mixed-dtype add_ on a CPU (the same sums)
    if compute is model:
        return
    scratch = None
    for p, c in zip(model.parameters(), compute.parameters()):
        if c.grad is None:
            continue
        if p.grad is None:
            p.grad = torch.empty_like(p).copy_(c.grad)
        else:
            if scratch is None:  # one buffer of the largest parameter's size, made at the first add
                scratch = torch.empty(max(q.numel() for q in model.parameters()), device=p.device)
            p.grad.add_(scratch[:p.numel()].view_as(p).copy_(c.grad))
        c.grad = None


@torch.no_grad()
def copy_weights(model, compute):
    """After an optimizer step: the compute copy takes the new fp32 weights, rounded to its
    dtype."""
    if compute is not model:
        for p, c in zip(model.parameters(), compute.parameters()):
            c.copy_(p)


def micro_batches(lengths, rank, ranks, max_rows=0, max_tokens=0):
    """This trainer's micro-batches: rows by length (less padding), dealt round-robin, packed to the
    caps (train.py's micro_batch rows, micro_batch_tokens padded tokens; 0: none)."""
    # every trainer runs the same number (FSDP2's gathers pair up):
    # shorter lists end with empty micro-batches
    order = torch.argsort(lengths, descending=True, stable=True).tolist()
    packed = []
    for r in range(ranks):
        batches = [[]]
        for i in order[r::ranks]:
            rows = batches[-1]  # rows go longest first: padded to the first's length
            # a cap (0: none)
            if rows and (len(rows) >= max_rows > 0
                         or (len(rows) + 1) * int(lengths[rows[0]]) > max_tokens > 0):
                batches.append([])
            batches[-1].append(i)
        packed.append([b for b in batches if b])
    mine = [torch.tensor(b) for b in packed[rank]]
    return mine + [torch.zeros(0, dtype=torch.long)] * (max(map(len, packed)) - len(mine))


def sync_grads(model, n_trainers):
    """Data parallel (plain modules): average the trainers' gradients, one all-reduce of one
    buffer."""
    # FSDP2 modules (DTensor gradients) reduce their own
    grads = [p.grad for p in model.parameters()
             if p.grad is not None and not hasattr(p.grad, "full_tensor")]
    if n_trainers == 1 or not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    with naming_peers("a data-parallel rank died or stopped answering"):
        dist.all_reduce(flat)
    flat /= n_trainers
    for g, part in zip(grads, torch.split(flat, [g.numel() for g in grads])):
        g.copy_(part.view_as(g))


def gather_to_master(param, dtype):
    """A parameter's full tensor in `dtype` on trainer rank 0, None on the others."""
    # FSDP2 shards (DTensors split in dim-0 chunks of ceil(n / T) rows, the last ones shorter or
    # empty) are cast, padded to one chunk and gathered straight into one buffer on rank 0 only:
    # followers never hold a full tensor
    if not hasattr(param, "full_tensor"):
        return param.detach().to(dtype)  # one trainer, or data parallel: every rank holds it whole
    world, rank = dist.get_world_size(), dist.get_rank()
    chunk = -(-param.shape[0] // world)  # ceil(rows / world)
    local = param.to_local().detach()
    padded = local.to(dtype)
    if len(local) < chunk:
        padded = torch.cat([padded, padded.new_zeros(chunk - len(local), *local.shape[1:])])
    full = padded.new_empty((chunk * world, *param.shape[1:])) if rank == 0 else None
    with naming_peers("a trainer rank died or stopped answering (weight gather)"):
        dist.gather(padded, list(full.chunk(world)) if rank == 0 else None, dst=0)
    return full[:param.shape[0]] if rank == 0 else None


def full_state(policy):
    """Every trainer calls it (gathers) -> rank 0: fp32 weights {name: CPU tensor} (LoRA: the
    adapters'), full optimizer state."""
    # (None, None) on the other ranks
    weights = {name: gather_to_master(p, torch.float32)
               for name, p in policy.model.named_parameters() if p.requires_grad}
    optimizer_state = get_optimizer_state_dict(
        policy.model, policy.optimizer,
        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return (({k: v.cpu() for k, v in weights.items()}, optimizer_state) if policy.rank == 0
            else (None, None))


def weight_plan(model, bucket_bytes, dtype):
    """The buckets of a push: the model's parameters in order (LoRA: the adapted weights only, the
    rest never changes), sized as `dtype` (the samplers')."""
    adapted = lora_adapters.adapted(model)
    named = ([(name, tuple(m.weight.shape)) for name, m in adapted.items()] if adapted else
             [(name, tuple(p.shape)) for name, p in model.named_parameters()])
    return bucket_plan(named, bucket_bytes, torch.finfo(dtype).bits // 8)


def full_weights(model, names, dtype):
    """Every trainer iterates it (gathers) -> (name, its full `dtype` tensor on the master, else
    None); LoRA's adapted weights merged afresh in fp32 from the frozen base, then cast once."""
    params, adapted = dict(model.named_parameters()), lora_adapters.adapted(model)
    for name in names:
        if name in adapted:
            full = lora_adapters.merged(adapted[name], gather_to_master)
            yield name, None if full is None else full.to(dtype)
        else:
            yield name, gather_to_master(params[name], dtype)


def weight_buckets(model, plan, dtype):
    """Every trainer iterates it (gathers) -> one flat `dtype` tensor a bucket on the master, else
    None."""
    # each tensor is packed into the bucket as its gather lands, so the master holds at most the
    # bucket and one gathered tensor (a bucket of one tensor is that tensor, not a copy)
    for bucket in plan:
        flat, offset = None, 0
        for (name, shape), (_, full) in zip(bucket, full_weights(model, [n for n, _ in bucket],
                                                                 dtype)):
            if full is not None and len(bucket) == 1:
                flat = full.reshape(-1)
            elif full is not None:
                if flat is None:
                    flat = full.new_empty(sum(math.prod(s) for _, s in bucket))
                flat[offset:offset + full.numel()].copy_(full.reshape(-1))
            offset += math.prod(shape)
            del full
        yield flat


def push_weights(policy, samplers, version, dtype, bucket_bytes):
    """After a step, the new weights into every sampler in flight (PipelineRL), in `dtype`
    buckets."""
    # to the sampler ranks, or into vLLM in this process; a follower trainer (samplers None) joins
    # the gathers only. A torch sampler in this process decodes with the trainer's own module (the
    # compute module or the fp32 one): nothing to copy
    if any(getattr(samplers, "model", None) is m for m in (policy.logprobs.model, policy.model)):
        return samplers.update_weights(None, version)
    plan = weight_plan(policy.model, bucket_bytes, dtype)
    if samplers is None:  # a follower: its part of the gathers
        for _ in weight_buckets(policy.model, plan, dtype):
            pass
    elif isinstance(samplers, RemoteSamplers):
        samplers.update_weights(plan, weight_buckets(policy.model, plan, dtype), dtype, version)
    else:  # in this process (no gathers: nothing sharded): tensor by tensor, no bucket held
        samplers.update_weights(full_weights(policy.model, [n for b in plan for n, _ in b], dtype),
                                version)
