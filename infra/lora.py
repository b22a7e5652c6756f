"""
LoRA (Hu et al. 2021), train.py's lora_rank: each chosen nn.Linear of the decoder layers keeps its
weight W frozen and learns a low-rank update,

    y = x W^T + b + (alpha / r) (x A^T) B^T        A: (r, in), B: (out, r), B = 0 at first

so step 0 is the base model bit for bit. Only A and B reach AdamW (fp32); the base is held once, in
the compute dtype (no fp32 master copy, no moments: a 0.5B model's run state goes from ~7.5 GB to
~50 MB at rank 8). The samplers decode with W + (alpha / r) B A, merged afresh in fp32 from the
frozen W at each version (never merged and unmerged in place: bf16 round trips drift), and only the
adapted weights are pushed (the rest never changes). A checkpoint holds the adapter in the files
PEFT writes (adapter_config.json, adapter_model.safetensors; vLLM's LoRA serving loads them: a
test) and the base model's fingerprint, so a resume onto another base is refused.

    add_adapters(model, rank, alpha, targets, seed)  the adapted modules' names (ValueError: a
                             target that matches nothing); count(config, rank, targets): how many
    adapted(model)           {weight's name: LoRALinear}, empty for full fine-tuning
    merged(module, gather)   W + (alpha / r) B A in fp32 (gather: a parameter -> its full tensor)
    merged_copy(model, dtype)  a plain model with every adapter merged in (a torch sampler's)
    fingerprint(path)        a base model directory's identity: names, shapes, sampled values
    save_peft / load_peft    the adapter in PEFT's files
"""

import copy
import functools
import glob
import hashlib
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file


class LoRALinear(nn.Linear):
    """An nn.Linear with an adapter: add_adapters turns one into this in place (its weight, its
    name and its place in the model stay; lora_A and lora_B join it)."""

    def forward(self, x):
        # the adapter in x's dtype (bf16 compute: cast from its fp32 masters, with gradient)
        update = F.linear(F.linear(x, self.lora_A.to(x.dtype)), self.lora_B.to(x.dtype))
        return super().forward(x) + self.scale * update


def linear_layers(model):
    """{name: nn.Linear} inside the decoder layers (the embeddings and the head stay frozen)."""
    layers = model.get_decoder().layers
    prefix = next(n for n, m in model.named_modules() if m is layers)
    return {f"{prefix}.{name}": m for name, m in layers.named_modules()
            if isinstance(m, nn.Linear)}


def targets_of(model, targets):
    """'all' or comma-separated short names (q_proj,v_proj) -> {name: nn.Linear}; ValueError naming
    a short name that matches no linear layer."""
    linears = linear_layers(model)
    if targets == "all":
        return linears
    wanted = [t.strip() for t in targets.split(",")]
    short = {name.rsplit(".", 1)[-1] for name in linears}
    if missing := [t for t in wanted if t not in short]:
        raise ValueError(f"lora_targets={targets!r}: {', '.join(missing)} matches no linear layer "
                         f"of the decoder layers (they have {', '.join(sorted(short))}, or 'all')")
    return {n: m for n, m in linears.items() if n.rsplit(".", 1)[-1] in wanted}


def count(config, rank, targets):
    """A transformers config -> the adapters' parameters (the model built on the meta device)."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(rank * (m.in_features + m.out_features) for m in targets_of(model, targets).values())


def add_adapters(model, rank, alpha, targets, seed):
    """Freeze `model` and adapt its `targets` in place -> their names. A as nn.Linear's own init
    (uniform in +-1/sqrt(in)), drawn from `seed` so every rank draws the same; B zero."""
    model.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    chosen = targets_of(model, targets)
    for name, m in chosen.items():
        bound = 1 / math.sqrt(m.in_features)
        A = (torch.rand(rank, m.in_features, generator=generator) * 2 - 1) * bound
        m.__class__, m.scale = LoRALinear, alpha / rank
        m.lora_A = nn.Parameter(A.to(m.weight.device))
        m.lora_B = nn.Parameter(torch.zeros(m.out_features, rank, device=m.weight.device))
    return list(chosen)


def adapted(model):
    """{the weight's name: its LoRALinear} (the names the samplers load by)."""
    return {f"{name}.weight": m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def merged(module, gather=lambda p, dtype: p.detach().to(dtype)):
    """W + (alpha / r) B A, in fp32 from the frozen W (None where gather gives None: FSDP2's
    followers)."""
    W, A, B = (gather(p, torch.float32) for p in (module.weight, module.lora_A, module.lora_B))
    return None if W is None else torch.addmm(W, B, A, alpha=module.scale)


@torch.no_grad()
def merged_copy(model, dtype):
    """A plain model (nn.Linear again) with every adapter merged in, its parameters in `dtype` (its
    buffers as they are: policy.cast)."""
    copied, sources = copy.deepcopy(model), adapted(model)
    for p in copied.parameters():
        p.data = p.data.to(dtype)
    for name, m in adapted(copied).items():
        m.weight.copy_(merged(sources[name]))  # from the base as held: one rounding, to `dtype`
        del m.lora_A, m.lora_B, m.scale
        m.__class__ = nn.Linear
    return copied


def resume_problem(saved, lora_state, now, base_path):
    """A checkpoint's run (saved: its config; lora_state: its adapter's, with the base model's
    fingerprint) against this run's LoRA knobs (now: lora_rank, lora_alpha, lora_targets) and base
    model -> what stops the resume, or None."""
    was = {**now, "lora_rank": 0, **saved}  # (an older checkpoint's missing keys)
    if changed := [f"{k}={was[k]!r}" for k in now if was[k] != now[k]]:
        return f"the checkpoint's run had {', '.join(changed)}: resume with its settings"
    if now["lora_rank"] and (base := fingerprint(base_path)) != lora_state["base"]:
        return (f"{base_path}: not the base model the checkpoint's adapter was trained on "
                f"(fingerprint {base}, the checkpoint's {lora_state['base']})")
    return None


@functools.lru_cache
def fingerprint(path):
    """A model directory's identity, whatever dtype holds it: a hash of its safetensors' every
    tensor's name, shape and 1,024 of its values in fp32. Read once a process (a resume checks it
    before the policy loads, which records it)."""
    digest = hashlib.sha256()
    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        with safe_open(file, "pt") as f:
            for name in sorted(f.keys()):
                t = f.get_tensor(name)
                digest.update(f"{name}{tuple(t.shape)}".encode())
                digest.update(t.reshape(-1)[::max(1, t.numel() // 1024)].float().numpy().tobytes())
    return digest.hexdigest()[:16]


def peft_name(param_name):
    """'model.layers.0.self_attn.q_proj.lora_A' -> PEFT's key of it."""
    module, which = param_name.rsplit(".", 1)
    return f"base_model.model.{module}.{which}.weight"


def save_peft(directory, adapters, lora):
    """adapters: {parameter name: full fp32 tensor} -> adapter_model.safetensors and
    adapter_config.json in `directory` (PEFT's LoraConfig fields; vLLM reads r, lora_alpha and
    target_modules); lora: Policy.lora."""
    save_file({peft_name(n): t.contiguous() for n, t in adapters.items()},
              os.path.join(directory, "adapter_model.safetensors"), metadata={"format": "pt"})
    modules = sorted({n.rsplit(".", 2)[-2] for n in adapters})
    # the base model as the config gave it: a committed adapter names no one machine's directories
    # (PEFT and vLLM take the base model from their caller anyway)
    config = dict(peft_type="LORA", task_type="CAUSAL_LM", r=lora["rank"],
                  lora_alpha=lora["alpha"], target_modules=modules, lora_dropout=0.0,
                  bias="none", fan_in_fan_out=False, use_rslora=False, modules_to_save=None,
                  init_lora_weights=True, inference_mode=True,
                  base_model_name_or_path=lora["path"])
    with open(os.path.join(directory, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=1)


@torch.no_grad()
def load_peft(directory, model):
    """adapter_model.safetensors into an adapted model's lora_A and lora_B (every one of them)."""
    saved = load_file(os.path.join(directory, "adapter_model.safetensors"))
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if sorted(map(peft_name, params)) != sorted(saved):
        raise ValueError(f"{directory}: its adapter's layers are not this run's "
                         "(lora_targets or the model differ)")
    for name, p in params.items():
        p.copy_(saved[peft_name(name)])
