"""
ScaleRL in one file: PipelineRL-k generation, CISPO, prompt-average aggregation, batch-level
advantage normalisation, zero-variance filtering, No-Positive-Resampling, an FP32 LM head and
length control by interruption (Khatri et al. 2025, "The Art of Scaling Reinforcement Learning
Compute for LLMs", arXiv 2510.13786). Every leave-one-out ablation of the paper is one config value.

CPU, the built-in task and tiny model, ~10 minutes:
    python train.py
One GPU, a local model and a local JSONL of math problems:
    python train.py config/scalerl_8b.py --model_path=/models/Qwen3-8B --data_path=/data/polaris.jsonl
8 GPUs, one node: 6 vLLM sampler ranks, 2 FSDP2 trainer ranks (see distributed.py):
    torchrun --standalone --nproc_per_node=8 train.py config/scalerl_8b.py --model_path=... --n_samplers=6
2 nodes of 8 GPUs (run on each node; a shared filesystem holds out_dir):
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 \
        train.py config/scalerl_8b.py --model_path=... --n_samplers=12
CPU processes (gloo), the same protocol: 2 trainers + 1 sampler
    torchrun --standalone --nproc_per_node=3 train.py --n_samplers=1
An ablation:
    python train.py config/loo_dapo.py
Resume a run (the log continues with no gap and no duplicate):
    python train.py --init_from=resume
Then fit the scaling curve:
    python fit_curve.py out/log.jsonl --plot=fit.png
"""

import json
import math
import os
import random
import shutil
import sys
import time
from ast import literal_eval

import torch
from tqdm import tqdm

import data
import distributed
import loss as L
from fit_curve import fit_sigmoid
from sample import TorchSampler, VLLMSampler

# -----------------------------------------------------------------------------
# config: module-level constants; config/*.py files and --key=value override them.
# Defaults are the CPU run; the paper's value follows "paper:" where it differs.
# I/O
out_dir = "out"                # log.jsonl, config.json, ckpt/
init_from = "scratch"          # 'scratch' (start from model_path) | 'resume' (out_dir's checkpoint)
model_path = ""                # local Hugging Face causal-LM directory; '' = the built-in tiny model
data_path = "builtin"          # 'builtin' (the synthetic task of data.py) | a local JSONL of math problems
prompt_field = ""              # JSONL field of the problem; '' = "prompt" or "problem", whichever is there
answer_field = "answer"        # JSONL field of the reference answer
n_train = 4000                 # built-in task: training prompts
n_val = 200                    # held-out validation prompts (paper: 1,000)
seed = 0                       # the RL run: sampling and curriculum order (vary it for seed-to-seed spread)
data_seed = 0                  # the built-in task, its tiny base model and the held-out split: keep it
                               # fixed across seeds so runs start from the same R0 on the same prompts
# hardware
device = "cpu"                 # 'cpu' | 'cuda'
dtype = "float32"              # 'float32' | 'bfloat16' (bf16 is ~300x slower than fp32 on CPUs)
sampler = "torch"              # 'torch' (plain KV-cache decoding) | 'vllm'
sampler_slots = 256            # sequences decoded at once (continuous batching)
vllm_gpu_memory = 0.4          # vLLM's gpu_memory_utilization when it shares the GPU with the trainer
n_samplers = 0                 # torchrun: the last n_samplers ranks only generate, the others train
                               # (FSDP2); 0 = every rank samples and trains its share (data parallel)
rank_timeout = 1800.0          # seconds a rank waits on a silent peer before failing the job
# the ScaleRL recipe; each comment names the leave-one-out value
loss = "cispo"                 # 'cispo' | 'dapo' | 'gspo' | 'grpo'
eps_max = 4.0                  # CISPO's upper truncation of the IS ratio (paper: 4, 5, 8 all alike)
agg = "prompt"                 # loss aggregation: 'prompt' | 'sample' | 'token'
adv_norm = "batch"             # advantage normalisation: 'batch' | 'prompt' | 'none'
zero_var_filter = True         # drop prompt groups whose rewards are all equal
npr = True                     # No-Positive-Resampling: retire prompts with pass rate >= npr_threshold
npr_threshold = 0.9
fp32_head = True               # LM head in fp32 on the sampler and the trainer
off_policy = "pipeline"        # 'pipeline' (PipelineRL-k) | 'ppo' (PPO-off-policy-k)
max_lag = 8                    # k: generation runs at most k optimizer steps ahead of training
length_control = "interrupt"   # 'interrupt' (forced '</think>') | 'penalty' (DAPO overlong penalty)
think_budget_min = data.TINY_THINK_BUDGET[0]  # thinking budget drawn per sequence (paper: 10k..12k)
think_budget_max = data.TINY_THINK_BUDGET[1]  # (paper: 12,288)
answer_budget = data.TINY_ANSWER_BUDGET       # tokens after '</think>' (paper: 2,048)
penalty_cache = 8              # 'penalty': L_cache, the soft zone below L_max = think_budget_max + answer_budget (paper: 2k of 14k)
temperature = 1.0              # sampling temperature, also used by the trainer and validation
# batch and optimiser
prompts_per_step = 32          # P prompts per optimizer step (paper: 48)
samples_per_prompt = 8         # G completions per prompt (paper: 16)
micro_batch = 64               # completions per forward/backward (bounds activation memory)
lr = 3e-5                      # constant after warm-up (paper: 5e-7 for 8B; tiny models need more)
warmup_steps = 10              # linear warm-up (paper: 100)
weight_decay = 0.01
adam_eps = 1e-15               # (paper: 1e-15)
beta1 = 0.9
beta2 = 0.999                  # (ours: the paper does not say)
grad_clip = 1.0                # max grad norm (ours: the paper does not say)
max_steps = 400                # optimizer steps
max_minutes = 8.0              # wall-clock budget of the whole run, evaluation included; 0 = none
# evaluation and checkpoints
eval_interval = 10             # steps between validations (paper: 100); step 0 is always evaluated
eval_samples = 8               # samples per held-out prompt (paper: 16, "mean@16")
ckpt_interval = 50             # steps between checkpoints; one is also written at the end
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith("_") and type(v) in (bool, int, float, str)]


def fail(message):
    """Bad input or config: one line, exit code 2, before any work is done."""
    print(f"train.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def configure(args):
    """nanoGPT's configurator, strict: `config/x.py` files (plain assignments) and `--key=value`
    override the constants above; unknown keys and values of the wrong type are errors."""
    for arg in args:
        if arg.startswith("--"):
            key, eq, text = arg[2:].partition("=")
            if not eq:
                fail(f"{arg}: expected --key=value")
            try:
                value = literal_eval(text)
            except (ValueError, SyntaxError):
                value = text  # a bare string: --out_dir=out-dapo
            items, source = {key: value}, arg
        else:
            if not os.path.isfile(arg):
                fail(f"{arg}: no such config file")
            namespace = {}
            exec(open(arg).read(), namespace)
            items, source = {k: v for k, v in namespace.items() if not k.startswith("_")}, arg
        for key, value in items.items():
            if key not in config_keys:
                fail(f"{source}: unknown config key {key!r}; valid keys: {', '.join(config_keys)}")
            default = globals()[key]
            if type(default) is float and type(value) is int:
                value = float(value)
            if type(value) is not type(default):
                fail(f"{source}: {key} must be {type(default).__name__}, got {value!r}")
            globals()[key] = value


def check_config():
    """A config that contradicts itself is an error before any work."""
    choices = dict(init_from=("scratch", "resume"), device=("cpu", "cuda"), dtype=("float32", "bfloat16"),
                   sampler=("torch", "vllm"), loss=("cispo", "dapo", "gspo", "grpo"), agg=("prompt", "sample", "token"),
                   adv_norm=("batch", "prompt", "none"), off_policy=("pipeline", "ppo"),
                   length_control=("interrupt", "penalty"))
    for key, allowed in choices.items():
        if globals()[key] not in allowed:
            fail(f"{key}={globals()[key]!r}: must be one of {', '.join(allowed)}")
    if samples_per_prompt < 2:
        fail(f"samples_per_prompt={samples_per_prompt}: a group needs >= 2 samples for a non-zero advantage")
    if (prompts_per_step * samples_per_prompt) % micro_batch:
        fail(f"the batch, prompts_per_step x samples_per_prompt = {prompts_per_step * samples_per_prompt}, "
             f"is not divisible by micro_batch={micro_batch}")
    if not 1 <= think_budget_min <= think_budget_max:
        fail(f"think_budget_min={think_budget_min}, think_budget_max={think_budget_max}: need 1 <= min <= max")
    for key in ("prompts_per_step", "max_lag", "answer_budget", "eval_interval", "eval_samples",
                "ckpt_interval", "sampler_slots", "max_steps", "n_val"):
        if globals()[key] < 1:
            fail(f"{key}={globals()[key]}: must be >= 1")
    if length_control == "penalty" and not 0 < penalty_cache < think_budget_max + answer_budget:
        fail(f"penalty_cache={penalty_cache}: must lie in (0, L_max = {think_budget_max + answer_budget})")
    if model_path and not os.path.isdir(model_path):
        fail(f"model_path={model_path!r}: no such directory")
    if data_path != "builtin" and not os.path.isfile(data_path):
        fail(f"data_path={data_path!r}: no such file")
    world = int(os.environ.get("WORLD_SIZE", 1))
    if not 0 <= n_samplers < world:
        fail(f"n_samplers={n_samplers}: need 0 <= n_samplers < the number of processes ({world}); "
             f"launch with torchrun --nproc_per_node=N")
    if n_samplers == 0 and prompts_per_step % world:
        fail(f"prompts_per_step={prompts_per_step} must be divisible by the {world} data-parallel ranks")
    if rank_timeout <= 0:
        fail(f"rank_timeout={rank_timeout}: must be > 0")
    if device == "cuda" and not torch.cuda.is_available():
        fail("device='cuda' but torch sees no GPU")
    if init_from == "scratch" and os.path.exists(os.path.join(out_dir, "log.jsonl")):
        fail(f"out_dir={out_dir!r} holds another run (log.jsonl); pass --init_from=resume or another --out_dir")
    if init_from == "resume" and not any(os.path.isdir(os.path.join(out_dir, d)) for d in ("ckpt", "ckpt.old")):
        fail(f"init_from='resume' but {out_dir!r} holds no checkpoint")

# -----------------------------------------------------------------------------
# the pieces of a step

def completion_text(tokenizer, token_ids, eos_ids):
    """What the verifier reads. Special tokens are kept: '</think>' may be one (DESIGN.md traps)."""
    return tokenizer.decode([t for t in token_ids if t not in eos_ids], skip_special_tokens=False)


def reward(prompt, completion):
    """+1 correct, -1 incorrect (ScaleRL); 'penalty' adds DAPO's overlong penalty to correct ones:
    clip((L_max - |y|) / L_cache - 1, -1, 0), zero up to L_max - L_cache, -1 at L_max."""
    r = reward_fn(prompt, completion_text(tokenizer, completion.token_ids, eos_ids))
    if length_control == "penalty" and r > 0:
        L_max = think_budget_max + answer_budget
        r += min(max((L_max - len(completion.token_ids)) / penalty_cache - 1, -1.0), 0.0)
    return r


def score(groups):
    """Reward every completion (kept on its group) and update the curriculum, where it lives: on the
    master, or on each data-parallel rank for its own share of the prompts."""
    for g in groups:
        g.rewards = [reward(prompts[g.index], c) for c in g.completions]
        curriculum.update(g.index, sum(r > 0 for r in g.rewards) / len(g.rewards))  # NPR: the latest group


def collate(groups, advantages):
    """Completion rows of the kept groups -> right-padded tensors, aligned the way loss.py wants:
    position t of (N, T-1) predicts token t+1, so completion token j of a row sits at len(prompt)-1+j."""
    rows = [(g.prompt_ids, c, a) for g, adv in zip(groups, advantages) for c, a in zip(g.completions, adv.tolist())]
    lengths = torch.tensor([len(p) + len(c.token_ids) for p, c, _ in rows])
    T = int(lengths.max())
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0  # never attended, never trained
    ids = torch.full((len(rows), T), pad, dtype=torch.long)
    behaviour = torch.zeros(len(rows), T - 1)
    mask = torch.zeros(len(rows), T - 1)
    prompt_index = torch.tensor([i for i, g in enumerate(groups) for _ in g.completions])
    for r, (prompt_ids, c, _) in enumerate(rows):
        n, k = len(prompt_ids), len(c.token_ids)
        ids[r, :n + k] = torch.tensor(prompt_ids + c.token_ids)
        behaviour[r, n - 1:n - 1 + k] = torch.tensor(c.logprobs, dtype=torch.float32)  # NaN on forced tokens
        mask[r, n - 1:n - 1 + k] = torch.tensor(c.policy_mask, dtype=torch.float32)
    return ids, lengths, behaviour, mask, prompt_index, torch.tensor([a for _, _, a in rows])


def lr_at(step):
    """Linear warm-up, then constant (ScaleRL: 5e-7 after 100 warm-up steps)."""
    return lr * min(1.0, step / warmup_steps) if warmup_steps > 0 else lr


def train_step(groups, step):
    """The optimizer step after `step` earlier ones, on P scored groups -> the log's training stats.
    Zero-variance filter, advantages, fp32-head log-probs, the loss summed over micro-batches with
    weights built on the whole batch, clip, AdamW. Every trainer rank runs it on the same batch and
    computes its share of the rows. A non-finite loss or gradient skips the update."""
    rewards = torch.tensor([g.rewards for g in groups])  # (P, G)
    keep = L.zero_variance_mask(rewards) if zero_var_filter else torch.ones(len(groups), dtype=torch.bool)
    completions = [c for g in groups for c in g.completions]
    stats = dict(train_reward=rewards.mean().item(), train_pass_rate=(rewards > 0).float().mean().item(),
                 effective_prompts=int(keep.sum()), lr=lr_at(step + 1),
                 truncation_rate=sum(c.finish_reason == "truncated" for c in completions) / len(completions),
                 interruption_rate=sum(c.interrupted for c in completions) / len(completions),
                 completion_tokens=sum(len(c.token_ids) for c in completions))
    lags = [step - v for c in completions for v in c.versions]  # the trainer holds version `step`
    stats.update(policy_lag_mean=sum(lags) / len(lags), policy_lag_max=max(lags),
                 # completions that received new weights mid-sequence (PipelineRL's in-flight updates)
                 inflight_update_frac=sum(len(set(c.versions)) > 1 for c in completions) / len(completions))
    kept = [g for g, k in zip(groups, keep.tolist()) if k]
    if not kept:  # every group was all-correct or all-wrong: nothing to learn from this batch
        return dict(stats, loss=0.0, grad_norm=0.0, skipped="no_signal", trained_tokens=0)
    advantages = L.group_advantages(rewards[keep], adv_norm)  # (P', G)
    ids, lengths, behaviour, mask, prompt_index, row_adv = collate(kept, advantages)
    weights = L.token_weights(mask, prompt_index, agg)  # (N, T-1), sums to 1 over the whole batch
    order = torch.argsort(lengths, descending=True)  # similar lengths share a micro-batch: less padding
    mine = order[layout_rank_in_trainers::n_trainers]  # dealt round-robin: balanced shares
    # the same number of micro-batches on every trainer: FSDP2's gathers in each forward pair up
    n_micro = math.ceil(math.ceil(len(order) / n_trainers) / micro_batch)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr_at(step + 1)
    sums, loss_stats = dict(loss=0.0, entropy=0.0), []
    for rows in torch.tensor_split(mine, n_micro):
        share = 1.0 if len(rows) else 0.0  # a rank short of rows still joins the collectives, weightless
        rows = rows if len(rows) else order[:1]
        T = int(lengths[rows].max())
        mb = lambda x: x[rows, :T - 1].to(model_device)
        logprobs, entropy = L.token_logprobs(model, ids[rows, :T].to(model_device), temperature, fp32_head,
                                             with_entropy=True)  # (n, T-1) fp32, the model in its own dtype
        mb_loss, mb_stats = L.policy_loss(logprobs, mb(behaviour), row_adv[rows].to(model_device), mb(mask) * share,
                                          mb(weights) * share, loss, eps_max=eps_max)
        # each rank's loss is its part of one global sum; data-parallel gradients are averaged over
        # the trainers (FSDP2's reduce-scatter, sync_grads for the rest), so scale by their number
        (mb_loss * n_trainers).backward()
        sums["loss"] += mb_loss.detach()
        sums["entropy"] += (entropy * mb(mask) * share).sum()
        loss_stats.append(mb_stats)
    distributed.sync_grads(model, n_trainers)
    grad_norm = distributed.clip_grad_norm(model, grad_clip)
    for key in ("tokens", "is_ratio_sum", "is_truncated_sum", "logprob_mismatch_sum"):
        sums[key] = sum(s[key] for s in loss_stats)
    sums = distributed.all_reduce_sums(sums, dict(is_ratio_max=max(s["is_ratio_max"] for s in loss_stats)))
    stats.update(L.merge_stats([sums], sums["entropy"]), loss=float(sums["loss"]), grad_norm=float(grad_norm),
                 trained_tokens=int(lengths.sum()))
    if not (math.isfinite(stats["loss"]) and math.isfinite(stats["grad_norm"])):
        optimizer.zero_grad(set_to_none=True)
        return dict(stats, skipped="non_finite")  # logged, not applied (every rank agrees: the sums are global)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return stats


@torch.no_grad()
def evaluate():
    """Pass rate on the held-out prompts x eval_samples, sampled like training (same temperature and
    length control: the paper's mean@16 is sampled). It runs on the training sampler, whose
    unfinished training sequences keep decoding alongside; their groups join finished_groups.
    Data-parallel ranks each evaluate their share of the prompts."""
    for i in range(len(val_prompts)):
        sampler_handle.add(("val", i), val_prompts[i].input_ids, eval_samples)
    correct, done = 0, 0
    with tqdm(total=len(val_prompts) * eval_samples, desc="validation", leave=False,
              disable=not (master and sys.stderr.isatty())) as bar:
        while done < len(val_prompts):
            sampler_handle.step()
            for group in sampler_handle.pop_finished():
                if isinstance(group.prompt_id, tuple):
                    prompt = val_prompts[group.prompt_id[1]]
                    correct += sum(reward_fn(prompt, completion_text(tokenizer, c.token_ids, eos_ids)) > 0
                                   for c in group.completions)
                    done += 1
                    bar.update(len(group.completions))
                else:
                    finished_groups.append(group)
    counts = dict(correct=correct, total=done * eval_samples)
    if dp:  # every data-parallel rank evaluated its share
        counts = distributed.all_reduce_sums(counts)
    return counts["correct"] / counts["total"]

# -----------------------------------------------------------------------------
# checkpoints: a Hugging Face model directory plus the trainer's state, swapped in atomically

def save_checkpoint(step, in_flight):
    """Every trainer rank calls it (gathering FSDP2 shards is a collective); the master writes."""
    weights = {name: t.detach().cpu() for name, t in distributed.full_weights(model)}
    optimizer_state = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))
    # each curriculum owner's share: one on the master, or one per data-parallel rank
    mine = dict(curriculum=curriculum.state_dict(), in_flight=in_flight) if curriculum else None
    shares = distributed.gather_objects(mine) if dp else [mine]
    if not master:
        return
    tmp, final, old = (os.path.join(out_dir, d) for d in ("ckpt.tmp", "ckpt", "ckpt.old"))
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save(optimizer_state, os.path.join(tmp, "optimizer.pt"))
    state = dict(step=step, counters=counters, shares=shares, world=layout.world, config=config)
    torch.save(state, os.path.join(tmp, "state.pt"))  # written last: its presence marks a complete dir
    # swap: a crash leaves either ckpt or ckpt.old complete, never a half-written ckpt
    if os.path.isdir(final):
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def checkpoint_dir():
    for d in ("ckpt", "ckpt.old"):  # ckpt.old is complete if a crash hit between the two renames
        path = os.path.join(out_dir, d)
        if os.path.isfile(os.path.join(path, "state.pt")):
            return path
    fail(f"init_from='resume' but {out_dir!r} holds no complete checkpoint")


def write_log(row):
    log_file.write(json.dumps(row) + "\n")
    log_file.flush()


def make_sampler(path, policy):
    """A sampler in this process: the torch one decodes with `policy` (in one process, the trainer's
    own module), the vLLM one starts an engine on `path`."""
    knobs = dict(temperature=temperature, fp32_head=fp32_head, max_seqs=sampler_slots,
                 seed=seed + 1000 * layout.rank + step, eos_ids=eos_ids,
                 think_end_ids=tokenizer.encode("</think>", add_special_tokens=False),
                 interrupt_ids=tokenizer.encode(data.INTERRUPT_PHRASE, add_special_tokens=False),
                 think_budget=(think_budget_min, think_budget_max) if length_control == "interrupt" else None,
                 answer_budget=answer_budget, max_new_tokens=think_budget_max + answer_budget)
    if sampler == "torch":
        handle = TorchSampler(policy, **knobs)
    else:  # room for the longest prompt + thinking + the phrase + the answer
        max_len = max(len(p.input_ids) for p in prompts + val_prompts) + knobs["max_new_tokens"] + len(knobs["interrupt_ids"])
        memory = dict(gpu_memory_utilization=vllm_gpu_memory) if device == "cuda" else dict(kv_cache_memory_bytes=1 << 30)
        handle = VLLMSampler(path, engine_kwargs=dict(dtype=dtype, max_model_len=max_len, **memory), **knobs)
    handle.version = step
    return handle


def load_model(path):
    from transformers import AutoModelForCausalLM
    torch_dtype = torch.float32 if device == "cpu" else getattr(torch, dtype)  # bf16 on CPUs is ~300x slower
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(layout.device)

# -----------------------------------------------------------------------------
if __name__ == "__main__":
    configure(sys.argv[1:])
    distributed.pin_sampler_gpu(n_samplers, sampler, device)  # before anything initialises CUDA
    check_config()
    config = {k: globals()[k] for k in config_keys}
    layout = distributed.setup(n_samplers, rank_timeout, device)
    master = layout.master
    dp = n_samplers == 0 and layout.world > 1   # data parallel: every rank samples and trains its share
    n_trainers, layout_rank_in_trainers = layout.trainers, layout.rank if not layout.is_sampler else -1
    if master:
        print(json.dumps(config, indent=1))
    try:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                             set_optimizer_state_dict)
        from transformers import AutoTokenizer, GenerationConfig

        # data and tokenizer; the built-in tiny model is built once, by the master
        base_path = model_path or distributed.master_first(layout, lambda: data.build_tiny_model(seed=data_seed))
        load_path = checkpoint_dir() if init_from == "resume" else base_path
        state = torch.load(os.path.join(load_path, "state.pt"), weights_only=False) if init_from == "resume" else None
        step = state["step"] if state else 0
        tokenizer = AutoTokenizer.from_pretrained(load_path)
        try:
            prompts, val_prompts, reward_fn = data.load_task(data_path, tokenizer, n_train=n_train, n_val=n_val,
                                                              seed=data_seed, prompt_field=prompt_field or None,
                                                              answer_field=answer_field)
        except data.DataError as e:
            fail(str(e))
        if dp:  # each rank owns every world-th prompt: its own curriculum, no prompt drawn twice
            prompts, val_prompts = prompts[layout.rank::layout.world], val_prompts[layout.rank::layout.world]
        try:  # the model's own end-of-turn ids join the tokenizer's eos (Qwen: two of them)
            generation_eos = GenerationConfig.from_pretrained(load_path).eos_token_id  # an int or a list
        except OSError:
            generation_eos = None
        eos_ids = {tokenizer.eos_token_id} | set([generation_eos] if isinstance(generation_eos, int) else generation_eos or [])

        if layout.is_sampler:  # a sampler rank: generate until the master says stop
            sampler_handle = make_sampler(load_path, load_model(load_path).eval() if sampler == "torch" else None)
            distributed.serve(sampler_handle, layout, distributed.Mailbox(layout.store, layout.rank), rank_timeout)
            distributed.finish(layout)
            sys.exit(0)

        # a trainer rank: the model (FSDP2 over the trainers when samplers are separate), the optimizer
        model = load_model(load_path).train()
        model_device = layout.device
        n_params = sum(p.numel() for p in model.parameters())
        if n_samplers and n_trainers > 1:
            distributed.shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(beta1, beta2), eps=adam_eps,
                                      weight_decay=weight_decay)
        curriculum = data.Curriculum(len(prompts), seed=seed + layout.rank, npr=npr, threshold=npr_threshold) \
            if master or dp else None
        counters, requeue = dict(train_seconds=0.0, flops=0.0, tokens=0), []
        if state:
            if dp and state["world"] != layout.world:
                fail(f"the checkpoint was written by {state['world']} data-parallel ranks, this run has {layout.world}")
            optimizer_state = torch.load(os.path.join(load_path, "optimizer.pt"), weights_only=False) \
                if master or n_trainers == 1 else {}
            set_optimizer_state_dict(model, optimizer, optimizer_state, options=StateDictOptions(
                full_state_dict=True, broadcast_from_rank0=n_trainers > 1))
            counters = state["counters"]
            if curriculum:
                share = state["shares"][layout.rank if dp else 0]
                curriculum.load_state_dict(share["curriculum"])
                requeue = list(share["in_flight"])

        if not master and not dp:  # an FSDP2 trainer beside the master: follow its steps
            while (message := distributed.broadcast_object(None)) is not None:
                batch, step, save = message
                train_step(batch, step)
                distributed.full_weights(model)  # the gather the master's weight broadcast needs
                if save:
                    save_checkpoint(step + 1, None)
            distributed.finish(layout)
            sys.exit(0)

        # the master, or a data-parallel rank: the log, the samplers, the loop
        if master:
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, "config.json"), "w") as f:
                json.dump(config, f, indent=1)
        log_path = os.path.join(out_dir, "log.jsonl")
        val_history = []  # (gpu_hours, val_reward) of this run so far, for the live fit
        if master and state:  # drop the lines written after the checkpoint (a hard kill's leftovers)
            with open(log_path) as f:
                lines = [line for line in f if line.endswith("\n") and json.loads(line).get("step", -1) <= step]
            with open(log_path + ".tmp", "w") as f:
                f.writelines(lines)
            os.replace(log_path + ".tmp", log_path)
            val_history = [(r["gpu_hours"], r["val_reward"]) for r in map(json.loads, lines) if "val_reward" in r]
        log_file = open(log_path, "a") if master else None
        if master and not state:
            write_log(dict(config=config, n_params=n_params, world=layout.world))
        if n_samplers:  # the samplers are other ranks
            sampler_handle = distributed.RemoteSamplers(layout, distributed.Mailbox(layout.store, 0), rank_timeout)
            sampler_handle.version = step
        else:  # in this process: the torch sampler shares the trainer's module, zero-copy
            sampler_handle = make_sampler(load_path, model)
        local_prompts = prompts_per_step // layout.world if dp else prompts_per_step  # groups this rank brings per step
        capacity = sampler_slots * max(n_samplers, 1)  # sequences decoded at once, over all samplers

        # the loop: the samplers never stop; whenever P groups are finished, a training step runs and
        # its weights reach the samplers at once, mid-sequence (PipelineRL; time-sliced in one process)
        started = {}          # ticket -> (prompt index, version when handed out), for groups not yet trained on
        finished_groups = []  # finished training groups waiting for the trainer
        next_ticket, all_retired = 0, False
        t_start = time.time()

        def feed():
            """Hand out prompts. PipelineRL-k: keep the samplers busy, never more than k steps ahead (at
            most (k+1) P groups between hand-out and training); the samplers' own queue adds one batch.
            PPO-off-policy-k: k*P prompts, once the previous round is all trained on."""
            global next_ticket, all_retired
            if off_policy == "ppo":
                budget = max_lag * local_prompts if not started else 0
            else:
                queued = sampler_handle.num_unfinished * samples_per_prompt
                room = capacity + (prompts_per_step * samples_per_prompt if n_samplers else 0) - queued
                budget = min((max_lag + 1) * local_prompts - len(started), math.ceil(room / samples_per_prompt))
            for _ in range(max(budget, 0)):
                index = requeue.pop(0) if requeue else curriculum.next()
                if index is None:
                    all_retired = True
                    return
                started[next_ticket] = (index, sampler_handle.version)
                sampler_handle.add(next_ticket, prompts[index].input_ids, samples_per_prompt)
                next_ticket += 1

        def ready_batch():
            """The oldest finished groups, once no unfinished group is older than k steps (so that no
            token is trained more than k steps after the version that sampled it)."""
            if len(finished_groups) < local_prompts:
                return None
            if off_policy == "ppo" and sampler_handle.num_unfinished:
                return None  # PPO-off-policy-k: the whole round is generated by one policy before any step
            finished = {g.prompt_id for g in finished_groups}
            oldest_unfinished = min((v for t, (_, v) in started.items() if t not in finished), default=step)
            if off_policy == "pipeline" and oldest_unfinished <= step - max_lag:
                return None  # wait: that group must join this batch
            finished_groups.sort(key=lambda g: g.prompt_id)  # tickets are issued in hand-out order
            batch = finished_groups[:local_prompts]
            del finished_groups[:local_prompts]
            for g in batch:
                g.index = started.pop(g.prompt_id)[0]
            return batch

        def log_step(row, step_seconds):
            """The live scaling-law fit on validation steps, the JSONL row, the human line (master)."""
            if not master:
                return
            if "val_reward" in row:
                val_history.append((row["gpu_hours"], row["val_reward"]))
                try:  # live prediction: the same fit as `python fit_curve.py out/log.jsonl`
                    fit = fit_sigmoid(*zip(*val_history))
                    row.update(fit_A=fit.A, fit_B=fit.B, fit_C_mid=fit.C_mid)
                except ValueError:
                    pass  # fewer than 4 points past the early transient
            row["time"] = time.time() - t_start
            write_log(row)
            line = [f"step {row['step']}"]
            if "train_reward" in row:
                line += [f"reward {row['train_reward']:+.3f}", f"loss {row['loss']:.4f}"]
            if "val_reward" in row:
                line.append(f"val {row['val_reward']:.3f}" + (f" (fit A {row['fit_A']:.3f})" if "fit_A" in row else ""))
            if "policy_lag_mean" in row:
                line.append(f"lag {row['policy_lag_mean']:.2f}")
            print(" | ".join(line + [f"{step_seconds:.2f} s", f"{row['time']:.0f} s total"]), flush=True)

        if step == 0:  # R0: the reward at zero compute
            log_step(dict(step=0, gpu_hours=0.0, flops=0.0, tokens=0, val_reward=evaluate()), 0.0)
        segment_start = time.time()
        while step < max_steps:
            feed()
            generated = sampler_handle.step()
            counters["tokens"] += generated
            counters["flops"] += 2 * n_params * generated  # ~2N per generated token (prefill not counted)
            finished_groups += sampler_handle.pop_finished()
            batch = ready_batch()
            if batch is None:
                if all_retired and not sampler_handle.num_unfinished and not dp:  # no P groups will ever come
                    print("every training prompt is retired by No-Positive-Resampling: stopping")
                    break
                continue
            t0 = time.time()
            score(batch)
            out_of_prompts = curriculum.retired_count == len(prompts) and len(started) < local_prompts
            last = step + 1 >= max_steps or out_of_prompts or 0 < max_minutes * 60 < time.time() - t_start
            save = (step + 1) % ckpt_interval == 0
            if dp:  # every rank brings its share; the batch and the decision to stop are common
                shares = distributed.gather_objects((batch, last, out_of_prompts))
                batch = [g for b, _, _ in shares for g in b]
                last, out_of_prompts = any(s[1] for s in shares), any(s[2] for s in shares)
            elif n_trainers > 1:
                distributed.broadcast_object((batch, step, save or last))
            stats = train_step(batch, step)
            step += 1
            if n_samplers:  # the full weights to every sampler rank (a gather over the FSDP2 shards first)
                sampler_handle.update_weights(distributed.full_weights(model), step)
            else:
                sampler_handle.update_weights(None if sampler == "torch" else distributed.full_weights(model), step)
            step_seconds = time.time() - t0
            counters["flops"] += 6 * n_params * stats["trained_tokens"]  # ~6N per trained token (fwd + bwd)
            counters["train_seconds"] += time.time() - segment_start  # wall time of sampling + training
            row = dict(step=step, gpu_hours=counters["train_seconds"] * layout.world / 3600, flops=counters["flops"],
                       tokens=counters["tokens"], step_time=step_seconds, **stats)  # gpu_hours: wall x processes (GPUs)
            if step % eval_interval == 0 or last:
                row["val_reward"] = evaluate()
            log_step(row, step_seconds)
            if save or last:
                save_checkpoint(step, [index for index, _ in started.values()])
            if out_of_prompts and master:
                print(f"every training prompt{' of a data-parallel share' if dp else ''} is retired by "
                      "No-Positive-Resampling: stopping")
            segment_start = time.time()  # validation and checkpoints are not training compute
            if last:
                break
        if n_samplers:
            sampler_handle.stop()
            if n_trainers > 1:
                distributed.broadcast_object(None)
        if log_file:
            log_file.close()
        distributed.finish(layout)
    except distributed.RankError as e:  # a peer died or went silent: say which, and fail the job
        print(f"train.py: rank {layout.rank}: {e}", file=sys.stderr, flush=True)
        os._exit(1)
