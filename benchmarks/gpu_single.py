"""
The one-GPU check: the trainer and the torch sampler on a model of a real architecture
and size, through the project's own code, in ~5 (at most ~8) minutes on one H200, with only what that machine
has (torch, transformers, numpy, scipy, tqdm: train.py's imports; no vLLM):

    python benchmarks/gpu_single.py                        # one GPU
    python benchmarks/gpu_single.py --small --device=cpu   # the same code paths at toy sizes on a CPU, ~15 s

A random Qwen3ForCausalLM of Qwen3-0.6B's shape (28 layers, hidden 1024, 16 query / 8 KV heads of 128, MLP
3072, vocab 151,936, tied embeddings: 0.60B parameters), built in fp32 on the device and saved to a temporary
directory; 8 prompts of 64 random tokens x 8 completions of exactly 2,048 tokens (no eos), rewards +-1, half of
each group. Two trainers in turn, each sampling one batch with sample.TorchSampler and then taking --steps
train.train_step steps on it (lr 5e-7, no warm-up, activation checkpointing, micro-batches of <= 16,384 padded
tokens, trained although cut at the length limit):
  fsdp2   train.make_policy's FSDP2 branch at world size 1 (a one-rank NCCL / gloo group): fp32 parameters and
          AdamW state (foreach=True, on DTensors), bf16 compute by MixedPrecisionPolicy, the root sharded; the
          sampler is a bf16 copy of its own that policy.push_weights feeds in buckets, as it feeds vLLM
  single  train.make_policy in one process: fp32 master weights, a bf16 compute copy the sampler decodes with
  lora, fsdp2_lora  single and fsdp2 with LoRA (--lora_rank, every linear layer of the blocks): a frozen bf16
          base, fp32 adapters alone in AdamW; the sampler holds the merged model (policy.sampler_module, or its own
          copy of the base for fsdp2_lora) and a push sends the adapted weights merged in fp32

Figures, one line each, then one JSON line for the README:
  load, push    s to build the policy and its sampler; s of a push, and whether the sampler then holds exactly
                the bf16 cast of the master weights
  sample        s, sampler tokens/s (completion tokens / wall time), peak GPU memory of the phase
  logprob gap   mean and max |trainer - behaviour log-prob| over the batch at lag 0 (bf16 trainer forward)
  step k        s, trained tokens (prompts + completions), MFU = 6 N tokens / s / --peak_flops (N counts the
                tied embedding once, the checkpointed recompute not at all; LoRA: 4 N + 6 N_adapter, log.count's),
                peak GPU memory of the step; the last step is the warm one
  changed       the fraction of the fp32 master weights (LoRA: adapters) the first step moved (expect >= 0.99;
                LoRA ~0.5: A does not move while B is zero)
  plan          memory.py's estimate for the trainer, beside the last step's measured peak
Written against torch 2.13; the GPU machine has 2.11. Relied on: torch.distributed.fsdp.fully_shard and
MixedPrecisionPolicy (public since 2.6), and torch.mm(..., out_dtype=) on CUDA (head.py's fp32 head). That
head runs forward and backward on a tiny model first: where it fails, the run says so and goes on with
--fp32_head=False (bf16 logits in sampler and trainer alike) rather than waste the GPU time.
"""

import argparse
import gc
import json
import os
import random
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
from tqdm import tqdm
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging as hf_logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from infra import distributed  # noqa: E402
import head  # noqa: E402
from infra import memory  # noqa: E402
import train  # noqa: E402
from infra import lora  # noqa: E402
from infra.policy import push_weights, resolve_dtype, sampler_module, weight_plan  # noqa: E402
from sample import TorchSampler  # noqa: E402

FULL = dict(hidden_size=1024, num_hidden_layers=28, intermediate_size=3072, num_attention_heads=16,
            num_key_value_heads=8, head_dim=128, vocab_size=151936)  # Qwen3-0.6B
SMALL = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=8192)  # 1 MiB of bf16 embedding: 2 buckets of 1 MiB
SIZES = dict(full=dict(prompts=8, samples=8, prompt_len=64, new_tokens=2048, micro_batch_tokens=16384),
             small=dict(prompts=2, samples=4, prompt_len=8, new_tokens=32, micro_batch_tokens=96))
DECODE_S_PER_LAYER = 1.2e-3  # eager decoding is overhead-bound: 1.26 ms a layer a step measured here with a
                             # 28-layer toy model on one CPU core (ours; the GPU's launches cost about as much)
GiB = 1 << 30


def qwen3(shape, device):
    with torch.device(device):  # initialised where it runs: no 2.4 GB trip through the CPU
        return Qwen3ForCausalLM(Qwen3Config(**shape, tie_word_embeddings=True, max_position_embeddings=4096))


def now(device):
    if device.type == "cuda":
        torch.cuda.synchronize()  # CPU-GPU sync: the timers measure finished work
    return time.perf_counter()


def reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device):
    return round(torch.cuda.max_memory_allocated(device) / GiB, 2) if device.type == "cuda" else None


def whole(p):
    return p.full_tensor() if hasattr(p, "full_tensor") else p  # an FSDP2 DTensor (one rank: no traffic)


def nccl_error(device):
    """A one-rank NCCL all-reduce, before anything else: whether NCCL starts in this machine's container runtime
    (the FSDP2 path and every multi-GPU layout need it). -> None, or the error line; the rest runs either way."""
    if device.type != "cuda":
        return "no GPU: the FSDP2 path runs on gloo"
    try:
        dist.init_process_group("cpu:gloo,cuda:nccl", store=dist.HashStore(), rank=0, world_size=1)
        x = torch.ones(4, device=device)
        dist.all_reduce(x)
        torch.cuda.synchronize(device)
        return None if x.sum().item() == 4 else f"all-reduce gave {x.tolist()}"
    except Exception as e:  # the FSDP2 path will fail the same way; the one-process path does not need NCCL
        return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"


def fp32_head_error(device, dtype):
    """head.py's fp32 head takes its own route on GPUs (bf16 operands, fp32 accumulation): forward and backward
    on a tiny model, so that a failure costs a second, not minutes of sampling. -> None, or the error line."""
    model = qwen3(SMALL, device).to(dtype)
    try:
        ids = torch.randint(0, SMALL["vocab_size"], (2, 8), device=device)
        head.token_logprobs(model, ids).sum().backward()
    except (RuntimeError, TypeError, NotImplementedError) as e:
        return str(e).splitlines()[0]
    return None


def sample_batch(sampler, prompts, group_size, new_tokens, rng):
    """Every completion decoded at once -> (groups scored +-1, half of each group at random; tokens generated)."""
    for i, prompt in enumerate(prompts):
        sampler.add(i, prompt, group_size)
    groups, tokens = [], 0
    with tqdm(total=new_tokens, desc="sampling (decode steps)", mininterval=15, file=sys.stdout) as bar:
        while sampler.num_unfinished:
            tokens += sampler.step()
            groups += sampler.pop_finished()
            bar.update()
    for g in groups:
        g.index, g.rewards = g.prompt_id, [1.0] * (group_size // 2) + [-1.0] * (group_size - group_size // 2)
        rng.shuffle(g.rewards)
    return sorted(groups, key=lambda g: g.prompt_id), tokens


@torch.no_grad()
def logprob_gap(policy, groups, rows_per_forward, device):
    """(mean, max) |trainer - behaviour| log-prob over every completion token, before any step (lag 0)."""
    n = len(groups[0].prompt_ids)  # every prompt, and every completion, has the same length here
    rows = [(g.prompt_ids + c.token_ids, c.logprobs) for g in groups for c in g.completions]
    gaps = []
    for i in range(0, len(rows), rows_per_forward):
        ids = torch.tensor([r[0] for r in rows[i:i + rows_per_forward]], device=device)  # (B, T)
        behaviour = torch.tensor([r[1] for r in rows[i:i + rows_per_forward]], device=device)  # (B, T - n)
        trainer = policy.logprobs(ids, train.temperature, train.fp32_head)[:, n - 1:]  # (B, T - n)
        assert trainer.shape == behaviour.shape and trainer.dtype == behaviour.dtype == torch.float32
        gaps.append((trainer - behaviour).abs().flatten())
    if policy.sharded:  # FSDP2 keeps the root gathered (bf16) after a forward without grad: back to fp32 shards
        policy.logprobs.reshard()
    gaps = torch.cat(gaps)
    return gaps.mean().item(), gaps.max().item()


def run_path(name, model_dir, layout, prompts, args, device, out):
    """One trainer set-up, end to end: its figures into `out` as they come (a failure keeps those before it)."""
    t = now(device)
    train.configure([f"--lora_rank={args.lora_rank if name.endswith('lora') else 0}"])
    if name.startswith("fsdp2"):
        if not dist.is_initialized():  # FSDP2 needs a default process group: one rank, on a store of our own
            dist.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo",
                                    store=dist.HashStore(), rank=0, world_size=1)
        # load_policy shards when 2+ trainers sit beside sampler ranks: a layout that says so, then the policy
        # told it is the only trainer (rank 0 of 1: no loss scaling, every row its own)
        policy = train.make_policy(train.current_config(), model_dir, layout._replace(trainers=2, samplers=1))._replace(ranks=1)
        sampler_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, train.dtype))
        sampler_model = sampler_model.to(device).eval()  # a sampler's own copy, as train.make_sampler makes it
    else:
        policy = train.make_policy(train.current_config(), model_dir, layout)
        # the trainer's compute copy itself (LoRA: a merged copy)
        sampler_model = sampler_module(policy, getattr(torch, train.dtype))
    sampler = TorchSampler(sampler_model, temperature=train.temperature, fp32_head=train.fp32_head,
                           max_seqs=len(prompts) * args.samples, seed=args.seed, eos_ids=(), think_budget=None,
                           max_new_tokens=args.new_tokens)
    out["load_s"] = now(device) - t
    t = now(device)
    push_weights(policy, sampler, 0, getattr(torch, train.dtype), train.weight_bucket_mb << 20)  # fsdp2: buckets
    out["push_s"] = now(device) - t
    received, adapted = dict(sampler.model.named_parameters()), lora.adapted(policy.model)
    weight = lambda n, p: lora.merged(adapted[n], lambda q, d: whole(q).detach().to(d)) if n in adapted \
        else whole(p)  # LoRA: merged in fp32, then cast as the push casts it
    exact = lambda: all(torch.equal(received[n], weight(n, p).to(received[n].device, received[n].dtype))
                        for n, p in policy.model.named_parameters() if n in received)
    out["push_exact"] = exact()  # and again after the last step, when the weights have moved
    buckets = len(weight_plan(policy.model, train.weight_bucket_mb << 20, getattr(torch, train.dtype)))
    how = "shared module" if sampler_model is policy.logprobs.model else f"{buckets} bucket{'s' if buckets > 1 else ''}"
    print(f"{name}: load {out['load_s']:.1f} s | push {out['push_s']:.2f} s ({how}), exact {out['push_exact']}",
          flush=True)

    reset_peak(device)
    t = now(device)
    groups, tokens = sample_batch(sampler, prompts, args.samples, args.new_tokens, random.Random(args.seed))
    out.update(sample_s=now(device) - t, sample_peak_gib=peak_gib(device))
    out["sampler_tokens_per_s"] = tokens / out["sample_s"]
    print(f"{name}: sample {out['sample_s']:.1f} s | {tokens} tokens | {out['sampler_tokens_per_s']:.0f} tokens/s "
          f"| peak {out['sample_peak_gib']} GiB", flush=True)
    rows_per_forward = max(1, args.micro_batch_tokens // (args.prompt_len + args.new_tokens))
    out["logprob_gap_mean"], out["logprob_gap_max"] = logprob_gap(policy, groups, rows_per_forward, device)
    print(f"{name}: logprob gap at lag 0 ({train.dtype}): mean {out['logprob_gap_mean']:.2e} | "
          f"max {out['logprob_gap_max']:.2e}", flush=True)

    n_params = sum(p.numel() for p in policy.model.parameters())  # DTensors count their global size
    trained = [p for p in policy.model.parameters() if p.requires_grad]
    n_trained = sum(p.numel() for p in trained)
    flops_per_token = 4 * n_params + 2 * n_trained  # 6N; LoRA 4 N + 6 N_adapter
    out["trained_params"] = n_trained
    for step in range(args.steps):
        before = [whole(p).detach().to("cpu", copy=True) for p in trained] if step == 0 else None
        reset_peak(device)
        t = now(device)
        stats = train.train_step(train.current_config(), policy, groups, step, 0)
        seconds = now(device) - t
        assert "skipped" not in stats and stats["effective_prompts"] == len(groups), stats
        mfu = flops_per_token * stats["trained_tokens"] / seconds / args.peak_flops
        out.update(step_s=seconds, trained_tokens=stats["trained_tokens"], mfu=mfu, step_peak_gib=peak_gib(device))
        line = f"{name}: step {step + 1} {seconds:.2f} s | {stats['trained_tokens']} tokens | MFU {mfu:.1%} | " \
               f"peak {out['step_peak_gib']} GiB | loss {stats['loss']:+.4f} | grad norm {stats['grad_norm']:.3g}"
        if before:
            changed = sum((whole(p).detach().cpu() != b).sum().item() for p, b in zip(trained, before))
            out.update(changed=changed / n_trained, train_step_mismatch=stats["logprob_mismatch"])
            line += f" | changed {out['changed']:.4f} of the trained weights"
        t = now(device)
        push_weights(policy, sampler, step + 1, getattr(torch, train.dtype), train.weight_bucket_mb << 20)
        out["push_after_step_s"], out["push_exact"] = now(device) - t, out["push_exact"] and exact()
        print(line + f" | push {out['push_after_step_s']:.2f} s, exact {out['push_exact']}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="toy sizes: the CPU smoke run of the same code paths")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--paths", default="fsdp2,single,lora", help="which trainers, in this order")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per path, on the one sampled batch")
    parser.add_argument("--lora_rank", type=int, default=8, help="the lora paths' rank")
    for key, full in SIZES["full"].items():
        parser.add_argument(f"--{key}", type=int, help=f"default {full} ({SIZES['small'][key]} with --small)")
    parser.add_argument("--lr", type=float, default=5e-7)
    parser.add_argument("--peak_flops", type=float, default=989e12, help="bf16 dense peak (H200 SXM: 989 TFLOP/s)")
    parser.add_argument("--budget_minutes", type=float, default=8.0, help="skip a path that would end past it")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for key, value in SIZES["small" if args.small else "full"].items():
        setattr(args, key, value if getattr(args, key) is None else getattr(args, key))
    os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")  # as the layouts set it (distributed.place)
    t_start, paths = time.perf_counter(), args.paths.split(",")
    hf_logging.disable_progress_bar()  # the loading bars of every from_pretrained: noise in a captured log
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    train.configure([f"--device={args.device}", f"--dtype={args.dtype}", "--checkpoint_activations=True",
                     "--micro_batch=0", f"--micro_batch_tokens={args.micro_batch_tokens}", f"--lr={args.lr}",
                     "--warmup_steps=0", "--train_truncated=True", f"--seed={args.seed}",
                     f"--weight_bucket_mb={1 if args.small else 1024}"])
    shape = SMALL if args.small else FULL
    plan_shape = memory.shape_of(shape | dict(tie_word_embeddings=True))
    gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    tokens = args.prompts * args.samples * (args.prompt_len + args.new_tokens)
    decode_s = args.new_tokens * shape["num_hidden_layers"] * DECODE_S_PER_LAYER
    train_s = args.steps * 8 * plan_shape.params * tokens / (0.3 * args.peak_flops)  # 8N with the recompute, 30% MFU
    why = resolve_dtype(args.dtype, args.device)[1]  # a CPU without native bf16 says so, in seconds
    print(f"{gpu_name} | torch {torch.__version__} | {args.dtype} ({why}) | "
          f"{plan_shape.params / 1e6:.1f}M parameters | "
          f"{args.prompts} x {args.samples} completions of {args.new_tokens} tokens | {args.steps} steps per path | "
          f"estimate on an H200 at these sizes: ~{(decode_s + train_s + 30) * len(paths) / 60 + 0.5:.1f} min (decode "
          f"{decode_s:.0f} s + train {train_s:.0f} s + load ~30 s per path, + ~30 s set-up)", flush=True)

    import transformers
    result = dict(device=gpu_name, torch=torch.__version__, transformers=transformers.__version__,
                  params=plan_shape.params, dtype=args.dtype,
                  completions=args.prompts * args.samples, new_tokens=args.new_tokens, steps=args.steps,
                  micro_batch_tokens=args.micro_batch_tokens, fp32_head=True)
    result["nccl_error"] = nccl_error(device)
    print(f"NCCL, one rank: {result['nccl_error'] or 'all-reduce ok'}", flush=True)
    error = fp32_head_error(device, getattr(torch, args.dtype))
    if error:
        print(f"fp32 head: head.lm_head_logits fails on {device.type}: {error}; going on with --fp32_head=False "
              f"(bf16 logits in the sampler and the trainer alike)", flush=True)
        train.configure(["--fp32_head=False"])
        result.update(fp32_head=False, fp32_head_error=error)

    layout = distributed.Layout(0, 1, "single", 1, 0, 0, device, None, None, None, None)
    prompt_rng = random.Random(args.seed)
    prompts = [[prompt_rng.randrange(shape["vocab_size"]) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
    with tempfile.TemporaryDirectory() as model_dir:
        torch.manual_seed(args.seed)
        t = now(device)
        qwen3(shape, device).save_pretrained(model_dir)  # fp32: the master weights start from exactly these
        gc.collect()
        print(f"model built and saved in {now(device) - t:.1f} s", flush=True)
        path_s = 0.0  # the wall time of the last path: the next one takes about as long
        for name in paths:
            if time.perf_counter() - t_start + path_s > args.budget_minutes * 60:
                print(f"{name}: skipped: another ~{path_s:.0f} s would pass --budget_minutes", flush=True)
                continue
            t = time.perf_counter()
            result[name] = {}
            try:  # one GPU run is precious: a path that breaks says how far it ran, and the next one still runs
                run_path(name, model_dir, layout, prompts, args, device, result[name])
            except Exception as e:
                traceback.print_exc()
                result[name]["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
            path_s = result[name]["wall_s"] = time.perf_counter() - t
            plan = memory.plan(plan_shape, 1, name.startswith("fsdp2"), 0, True,
                               2 if args.dtype == "bfloat16" else 4, args.micro_batch_tokens, True,
                               args.prompt_len + args.new_tokens, 0.0, 1 << 30, 0,
                               adapter=result[name].get("trained_params", 0) * name.endswith("lora"))
            result[name]["plan_gib"] = round(sum(b for _, b, _ in plan["trainer"]) / GiB, 2)
            print(f"{name}: memory.py's plan for the trainer {result[name]['plan_gib']} GiB, measured peak of the last "
                  f"step {result[name].get('step_peak_gib')} GiB | path wall {path_s:.0f} s", flush=True)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if dist.is_initialized():
        dist.destroy_process_group()
    result["wall_s"] = time.perf_counter() - t_start
    print(f"total {result['wall_s']:.0f} s", flush=True)
    rounded = lambda x: {k: rounded(v) for k, v in x.items()} if isinstance(x, dict) else \
        float(f"{x:.4g}") if isinstance(x, float) else x
    print(json.dumps(rounded(result)))
    sys.exit(1 if any("error" in result.get(name, {}) for name in paths) else 0)
