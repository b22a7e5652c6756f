"""
ScaleRL in one file: PipelineRL-k generation, CISPO, prompt-average aggregation, batch-level
advantage normalisation, zero-variance filtering, No-Positive-Resampling, an FP32 LM head and
length control by interruption (Khatri et al. 2025, "The Art of Scaling Reinforcement Learning
Compute for LLMs", arXiv 2510.13786). Every leave-one-out ablation of the paper is one config value.

CPU, the built-in task and tiny model, ~8 minutes:
    python train.py
One GPU, your own model (<= ~2B) and a local JSONL of math problems (vLLM beside the trainer):
    python train.py config/scalerl_1gpu.py --model_path=/models/Qwen3-1.7B --data_path=/data/polaris.jsonl
8 GPUs, one node: 6 vLLM sampler ranks, 2 FSDP2 trainer ranks (see distributed.py):
    torchrun --standalone --nproc_per_node=8 train.py config/scalerl_8b.py --model_path=... --n_samplers=6
2 nodes of 8 GPUs (run on each node; a shared filesystem holds out_dir):
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29500 \\
        train.py config/scalerl_8b.py --model_path=... --n_samplers=12
CPU processes (gloo), the same protocol: 2 trainers + 1 sampler
    torchrun --standalone --nproc_per_node=3 train.py --n_samplers=1
Math and code in one run (the code reward runs in sandbox.py):
    python train.py config/math_code_cpu.py
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
import shutil
import sys
import time
from ast import literal_eval
from collections import defaultdict, namedtuple

import torch
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                     set_optimizer_state_dict)
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

import data
import distributed
import loss as L
import memory
import sandbox
from fit_curve import fit_sigmoid
from sample import TorchSampler, VLLMSampler

# -----------------------------------------------------------------------------
# config: module-level constants; config/*.py files and --key=value override them.
# Defaults are the CPU run; the paper's value follows "paper:" where it differs.
# I/O
out_dir = "out"                # log.jsonl, config.json, ckpt/
init_from = "scratch"          # 'scratch' (start from model_path) | 'resume' (out_dir's checkpoint)
model_path = ""                # local Hugging Face causal-LM directory; '' = the built-in tiny model
data_path = "builtin"          # 'builtin' | local JSONL files, comma-separated, math and code (data.py)
prompt_field = ""              # JSONL field of the problem; '' = "prompt" or "problem", whichever is there
answer_field = "answer"        # JSONL field of the reference answer (math rows)
n_train = 4000                 # training prompts: the built-in task draws this many; JSONL: at most, 0 = all
n_val = 200                    # held-out validation prompts (paper: 1,000)
seed = 0                       # the RL run: sampling and curriculum order (vary it for seed-to-seed spread)
data_seed = 0                  # the built-in task, its tiny base model and the held-out split: keep it
                               # fixed across seeds so runs start from the same R0 on the same prompts
# hardware
device = "cpu"                 # 'cpu' | 'cuda'
dtype = "float32"              # compute: 'float32' | 'bfloat16' (parameters and AdamW state stay fp32;
                               # bf16 on CPUs is ~300x slower than fp32)
sampler = "torch"              # 'torch' (plain KV-cache decoding) | 'vllm'
sampler_slots = 256            # sequences decoded at once per sampler (continuous batching)
vllm_gpu_memory = 0.4          # vLLM's gpu_memory_utilization (a share of the GPU's *total* memory) beside
                               # the trainer, in one process
vllm_gpu_memory_own = 0.85     # ... on a sampler rank's own GPU
n_samplers = 0                 # torchrun: the last n_samplers ranks only generate, the others train
                               # (FSDP2); 0 = every rank samples and trains its share (data parallel)
rank_timeout = 1800.0          # seconds a rank waits on a peer that shows no sign of life
weight_bucket_mb = 1024        # the weights travel to the samplers in buckets of this size
checkpoint_activations = False # recompute each decoder layer in the backward (activation checkpointing)
micro_batch = 64               # at most this many completions per forward/backward (0 = no cap)
micro_batch_tokens = 0         # at most this many padded tokens per forward/backward (0 = no cap)
# the ScaleRL recipe; each comment names the leave-one-out value
loss = "cispo"                 # 'cispo' | 'dapo' | 'gspo' | 'grpo'
eps_max = 4.0                  # CISPO's upper truncation of the IS ratio (paper: 4, 5, 8 all alike)
clip_low = 0.2                 # DAPO / GRPO: ratio clipped below at 1 - clip_low
clip_high = 0.28               # DAPO: above at 1 + clip_high (GRPO: 1 + clip_low)
gspo_low = 3e-3                # GSPO: sequence ratio clipped to [1 - gspo_low, 1 + gspo_high]
gspo_high = 5e-3
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
train_truncated = False        # train on completions cut at the answer budget too (paper, A.16: excluded)
temperature = 1.0              # sampling temperature, also used by the trainer and validation
# batch and optimiser
prompts_per_step = 32          # P prompts per optimizer step (paper: 48)
samples_per_prompt = 8         # G completions per prompt (paper: 16)
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
    if not 1 <= think_budget_min <= think_budget_max:
        fail(f"think_budget_min={think_budget_min}, think_budget_max={think_budget_max}: need 1 <= min <= max")
    for key in ("prompts_per_step", "max_lag", "answer_budget", "eval_interval", "eval_samples",
                "ckpt_interval", "sampler_slots", "max_steps", "n_val", "weight_bucket_mb"):
        if globals()[key] < 1:
            fail(f"{key}={globals()[key]}: must be >= 1")
    for key in ("micro_batch", "micro_batch_tokens", "n_train"):
        if globals()[key] < 0:
            fail(f"{key}={globals()[key]}: must be >= 0 (0: no limit)")
    if length_control == "penalty" and not 0 < penalty_cache < think_budget_max + answer_budget:
        fail(f"penalty_cache={penalty_cache}: must lie in (0, L_max = {think_budget_max + answer_budget})")
    if model_path and not os.path.isdir(model_path):
        fail(f"model_path={model_path!r}: no such directory")
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
# the scheduler: what the samplers generate, and what trains when

class Rollouts:
    """Hands prompts to the samplers and decides which finished groups train at which step.

    Every group gets a ticket in hand-out order and remembers the policy version it was handed out
    under, v0; its tokens come from versions >= v0 (a sampler takes the weights before the prompts sent
    after them). Trained at step s (the trainer holds version s), no token of it lags more than s - v0.
      PipelineRL-k (ScaleRL sec. 3.1): the samplers never idle, and a group must train by step v0 + k,
        its deadline. A step takes the P oldest finished groups unless that would leave some untrained
        group unable to meet its deadline (at P groups a step, the j-th earliest remaining deadline needs
        step + 1 + j // P <= it): then it waits for the stragglers. Hand-outs stop at (k+1) P untrained
        groups, which keeps every deadline reachable. So the lag never exceeds k, in any finishing order.
      PPO-off-policy-k: k P prompts under one policy; once all are finished, k steps of P each (each
        step normalises its advantages over its own P groups, not over the round's k P: ours).
    Validation groups (prompt ids ("val", i)) share the samplers; collect() hands them back."""

    def __init__(self, curriculum, prompts, group_size, batch_size, max_lag, mode, requeue=()):
        self.curriculum, self.prompts, self.group_size = curriculum, prompts, group_size
        self.P, self.k, self.mode = batch_size, max_lag, mode
        self.requeue = list(requeue)  # prompts handed out before a resume and never trained: first again
        self.pending = {}             # ticket -> (prompt index, v0) of every group not yet trained
        self.finished = {}            # ticket -> Group, finished and waiting for its step
        self.next_ticket = 0
        self.exhausted = False        # the curriculum has retired every prompt

    def hand_out(self, samplers, version, room):
        """New groups for the samplers: as many as the rule allows, and at most `room` (their queue)."""
        if self.mode == "ppo":
            budget = self.k * self.P if not self.pending else 0
        else:
            budget = min((self.k + 1) * self.P - len(self.pending), room)
        for _ in range(budget):
            index = self.requeue.pop(0) if self.requeue else self.curriculum.next()
            if index is None:
                self.exhausted = True
                return
            self.pending[self.next_ticket] = (index, version)
            samplers.add(self.next_ticket, self.prompts[index].input_ids, self.group_size)
            self.next_ticket += 1

    def collect(self, groups):
        """Finished groups in; the validation ones come back, the training ones wait for their step."""
        validation = [g for g in groups if isinstance(g.prompt_id, tuple)]
        self.finished.update((g.prompt_id, g) for g in groups if not isinstance(g.prompt_id, tuple))
        return validation

    def ready_batch(self, version):
        """The P groups to train on at the step that starts from `version`, or None (keep sampling)."""
        tickets = sorted(self.finished)[:self.P]
        if len(tickets) < self.P:
            return None
        if self.mode == "ppo" and len(self.finished) < len(self.pending):
            return None  # the whole round first: one policy generated it
        if self.mode == "pipeline":
            chosen = set(tickets)
            deadlines = sorted(v0 + self.k for t, (_, v0) in self.pending.items() if t not in chosen)
            if any(version + 1 + j // self.P > d for j, d in enumerate(deadlines)):
                return None  # a straggler must join this step or the next ones in time: wait for it
        batch = [self.finished.pop(t) for t in tickets]
        for g in batch:
            g.index = self.pending.pop(g.prompt_id)[0]
        return batch

    @property
    def starved(self):
        """Every prompt is retired and fewer than P groups are left: no full batch will ever come."""
        return self.exhausted and len(self.pending) < self.P

    def in_flight(self):
        """The prompts of the groups handed out and not trained (a checkpoint hands them out again)."""
        return [index for index, _ in self.pending.values()]

# -----------------------------------------------------------------------------
# the pieces of a step

Task = namedtuple("Task", "prompts val_prompts reward_fn tokenizer eos_ids domains")
Policy = namedtuple("Policy", "model logprobs optimizer rank ranks sharded")
# Policy: model holds the fp32 parameters (AdamW steps them, checkpoints save them, the samplers get them
# cast); logprobs (loss.TokenLogprobs) computes with them, on the model itself or on its bf16 copy, and is
# the FSDP2 root when sharded; rank / ranks: this trainer among the trainers.


def completion_text(task, token_ids):
    """What the verifier reads. Special tokens are kept: '</think>' may be one (DESIGN.md traps)."""
    return task.tokenizer.decode([t for t in token_ids if t not in task.eos_ids], skip_special_tokens=False)


def score(groups, task, curriculum):
    """Reward every completion (+1 / -1: the verifier, or the sandbox, all of the batch at once) and keep
    the pass rate of the prompt's latest group for No-Positive-Resampling. 'penalty' adds DAPO's overlong
    penalty to correct answers: clip((L_max - |y|) / L_cache - 1, -1, 0), 0 up to L_max - L_cache, -1 at L_max."""
    pairs = [(task.prompts[g.index], completion_text(task, c.token_ids)) for g in groups for c in g.completions]
    rewards = iter(task.reward_fn.batch(pairs))
    L_max = think_budget_max + answer_budget
    for g in groups:
        g.rewards = [next(rewards) for _ in g.completions]
        curriculum.update(g.index, sum(r > 0 for r in g.rewards) / len(g.rewards))
        if length_control == "penalty":
            g.rewards = [r + min(max((L_max - len(c.token_ids)) / penalty_cache - 1, -1.0), 0.0) if r > 0 else r
                         for r, c in zip(g.rewards, g.completions)]


def collate(groups, advantages, pad_id):
    """Completion rows of the kept groups -> right-padded tensors, aligned the way loss.py wants:
    position t of (N, T-1) predicts token t+1, so completion token j of a row sits at len(prompt)-1+j.
    Completions cut at the answer budget are masked out unless train_truncated (paper, A.16)."""
    rows = [(g.prompt_ids, c, a) for g, adv in zip(groups, advantages) for c, a in zip(g.completions, adv.tolist())]
    lengths = torch.tensor([len(p) + len(c.token_ids) for p, c, _ in rows])
    T = int(lengths.max())
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)  # padding: never attended, never trained
    behaviour = torch.zeros(len(rows), T - 1)
    mask = torch.zeros(len(rows), T - 1)
    prompt_index = torch.tensor([i for i, g in enumerate(groups) for _ in g.completions])
    for r, (prompt_ids, c, _) in enumerate(rows):
        n, k = len(prompt_ids), len(c.token_ids)
        ids[r, :n + k] = torch.tensor(prompt_ids + c.token_ids)
        behaviour[r, n - 1:n - 1 + k] = torch.tensor(c.logprobs, dtype=torch.float32)  # NaN on forced tokens
        if train_truncated or c.finish_reason != "truncated":
            mask[r, n - 1:n - 1 + k] = torch.tensor(c.policy_mask, dtype=torch.float32)
    return ids, lengths, behaviour, mask, prompt_index, torch.tensor([a for _, _, a in rows])


def micro_batches(lengths, rank, ranks):
    """This trainer's micro-batches of rows: rows sorted by length (similar lengths share a micro-batch:
    less padding) and dealt round-robin to the trainers, then packed while a micro-batch holds at most
    micro_batch rows and micro_batch_tokens padded tokens (a row longer than that goes alone). Every
    trainer runs the same number (FSDP2's gathers pair up): shorter lists end with empty micro-batches."""
    order = torch.argsort(lengths, descending=True, stable=True).tolist()
    packed = []
    for r in range(ranks):
        batches = [[]]
        for i in order[r::ranks]:
            rows = batches[-1]
            full = rows and ((micro_batch and len(rows) >= micro_batch) or
                             (micro_batch_tokens and (len(rows) + 1) * int(lengths[rows[0]]) > micro_batch_tokens))
            if full:
                batches.append([])
            batches[-1].append(i)
        packed.append([b for b in batches if b])
    n = max(len(b) for b in packed)
    return [torch.tensor(b, dtype=torch.long) for b in packed[rank]] + [torch.zeros(0, dtype=torch.long)] * (n - len(packed[rank]))


def lr_at(step):
    """Linear warm-up, then constant (ScaleRL: 5e-7 after 100 warm-up steps)."""
    return lr * min(1.0, step / warmup_steps) if warmup_steps > 0 else lr


def train_step(policy, groups, step, pad_id):
    """The optimizer step after `step` earlier ones, on P scored groups -> the log's training stats.
    Zero-variance filter, advantages, fp32-head log-probs, the loss summed over micro-batches with
    weights built on the whole batch, clip, AdamW. Every trainer rank runs it on the same batch and
    computes its share of the rows. A non-finite loss or gradient skips the update."""
    rewards = torch.tensor([g.rewards for g in groups])  # (P, G)
    keep = L.zero_variance_mask(rewards) if zero_var_filter else torch.ones(len(groups), dtype=torch.bool)
    completions = [c for g in groups for c in g.completions]
    truncated = sum(c.finish_reason == "truncated" for c in completions)
    stats = dict(train_reward=rewards.mean().item(), train_pass_rate=(rewards > 0).float().mean().item(),
                 effective_prompts=int(keep.sum()), lr=lr_at(step + 1), truncation_rate=truncated / len(completions),
                 truncated_excluded=0 if train_truncated else truncated,
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
    ids, lengths, behaviour, mask, prompt_index, row_adv = collate(kept, advantages, pad_id)
    weights = L.token_weights(mask, prompt_index, agg)  # (N, T-1), sums to 1 over the whole batch
    for param_group in policy.optimizer.param_groups:
        param_group["lr"] = lr_at(step + 1)
    device = next(policy.logprobs.parameters()).device
    batches = micro_batches(lengths, policy.rank, policy.ranks)
    sums, loss_stats = dict(loss=0.0, entropy=0.0), []
    for i, rows in enumerate(batches):
        share = 1.0 if len(rows) else 0.0  # a rank short of rows still joins the collectives, weightless
        rows = rows if len(rows) else torch.zeros(1, dtype=torch.long)
        T = int(lengths[rows].max())
        mb = lambda x: x[rows, :T - 1].to(device)
        if policy.sharded:  # FSDP2 reduce-scatters the gradients after the last micro-batch only
            policy.logprobs.set_requires_gradient_sync(i == len(batches) - 1)
        logprobs, entropy = policy.logprobs(ids[rows, :T].to(device), temperature, fp32_head, with_entropy=True)
        mb_loss, mb_stats = L.policy_loss(logprobs, mb(behaviour), row_adv[rows].to(device), mb(mask) * share,
                                          mb(weights) * share, loss, eps_max=eps_max, clip_low=clip_low,
                                          clip_high=clip_high, gspo_low=gspo_low, gspo_high=gspo_high)
        # each rank's loss is its part of one global sum; gradients are averaged over the trainers
        # (FSDP2's reduce-scatter, sync_grads under data parallelism), so scale by their number
        (mb_loss * policy.ranks).backward()
        distributed.add_grads(policy.model, policy.logprobs.model)  # bf16 copy -> fp32 (no-op otherwise)
        sums["loss"] += mb_loss.detach()
        sums["entropy"] += (entropy * mb(mask) * share).sum()
        loss_stats.append(mb_stats)
    distributed.sync_grads(policy.model, policy.ranks)
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.model.parameters(), grad_clip, foreach=True)
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP2: a DTensor
    for key in ("tokens", "is_ratio_sum", "is_truncated_sum", "logprob_mismatch_sum"):
        sums[key] = sum(s[key] for s in loss_stats)
    sums = distributed.all_reduce_sums(sums, dict(is_ratio_max=max(s["is_ratio_max"] for s in loss_stats)))
    stats.update(L.merge_stats([sums], sums["entropy"]), loss=float(sums["loss"]), grad_norm=float(grad_norm),
                 trained_tokens=int(lengths.sum()))
    if not (math.isfinite(stats["loss"]) and math.isfinite(stats["grad_norm"])):
        policy.optimizer.zero_grad(set_to_none=True)
        return dict(stats, skipped="non_finite")  # logged, not applied (every rank agrees: the sums are global)
    policy.optimizer.step()
    policy.optimizer.zero_grad(set_to_none=True)
    distributed.copy_weights(policy.model, policy.logprobs.model)  # the bf16 copy takes the new weights
    return stats


@torch.no_grad()
def evaluate(samplers, rollouts, task, layout):
    """Pass rate on the held-out prompts x eval_samples, sampled like training (same temperature and
    length control: the paper's mean@16 is sampled), overall and per domain (several datasets), on the
    training samplers (their unfinished training groups keep decoding and wait in `rollouts`) -> the log's
    validation keys (val_seconds: its wall time), and the training tokens generated meanwhile. Data-parallel
    ranks each take their share."""
    started = time.time()
    for i, prompt in enumerate(task.val_prompts):
        samplers.add(("val", i), prompt.input_ids, eval_samples)
    pairs, tokens, val_tokens, done = [], 0, 0, 0
    with tqdm(total=len(task.val_prompts), desc="validation", leave=False,
              disable=not (layout.rank == 0 and sys.stderr.isatty())) as bar:
        while done < len(task.val_prompts):
            tokens += samplers.step()
            for group in rollouts.collect(samplers.pop_finished()):
                prompt = task.val_prompts[group.prompt_id[1]]
                pairs += [(prompt, completion_text(task, c.token_ids)) for c in group.completions]
                val_tokens += sum(sum(c.policy_mask) for c in group.completions)
                done += 1
                bar.update()
    counts = defaultdict(float)
    for (prompt, _), r in zip(pairs, task.reward_fn.batch(pairs)):
        for key in ("", f"_{prompt.domain}"):
            counts["correct" + key] += r > 0
            counts["total" + key] += 1
    if layout.role == "data_parallel":  # every rank evaluated its share
        counts = distributed.all_reduce_sums({k: counts[k] for k in sorted(
            f"{kind}{d}" for kind in ("correct", "total") for d in [""] + [f"_{d}" for d in task.domains])})
    result = dict(val_reward=counts["correct"] / counts["total"], val_seconds=time.time() - started)
    if len(task.domains) > 1:
        result.update({f"val_reward_{d}": counts[f"correct_{d}"] / max(counts[f"total_{d}"], 1) for d in task.domains})
    return result, tokens - val_tokens

# -----------------------------------------------------------------------------
# the log and the checkpoints

Log = namedtuple("Log", "file history")  # history: log key -> [(gpu_hours, value)] for the live fits


def logged_step(state):
    """The last step that out_dir's log holds up to the checkpoint's (-1 without a checkpoint). Below the
    checkpoint's step only when a crash came between the checkpoint and the log line (validation runs
    after the checkpoint): the resumed run then writes that step's line first."""
    if not state:
        return -1
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.endswith("\n")]
    return max((r.get("step", -1) for r in rows if r.get("step", -1) <= state["step"]), default=-1)


def open_log(state, header, task):
    """The master's config.json and log.jsonl. A new run writes the header line (the config, and the
    sandbox's isolation when code rewards run); a resumed one drops the lines written after its
    checkpoint (a hard kill's leftovers)."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(header["config"], f, indent=1)
    if any(p.code for p in task.prompts + task.val_prompts):  # which isolation the code rewards run under
        header["sandbox"] = sandbox.isolation()
        print("sandbox: " + "; ".join(f"{k} {v}" for k, v in header["sandbox"].items()), flush=True)
    path = os.path.join(out_dir, "log.jsonl")
    history = defaultdict(list)
    if state:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.endswith("\n")]
        rows = [r for r in rows if r.get("step", -1) <= state["step"]]
        with open(path + ".tmp", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        os.replace(path + ".tmp", path)
        for r in rows:
            for key in (k for k in r if k.startswith("val_reward")):
                history[key].append((r["gpu_hours"], r[key]))
    log = Log(open(path, "a"), history)
    if not state:
        write_row(log, header)
    return log


def write_row(log, row):
    log.file.write(json.dumps(row) + "\n")
    log.file.flush()


def log_step(log, row, t_start):
    """The live scaling-law fits on validation steps (one per domain), the JSONL row, the human line."""
    for key in [k for k in row if k.startswith("val_reward")]:
        log.history[key].append((row["gpu_hours"], row[key]))
        try:  # live prediction: the same fit as `python fit_curve.py out/log.jsonl --y=KEY`
            fit = fit_sigmoid(*zip(*log.history[key]))
            suffix = key.removeprefix("val_reward")
            row.update({f"fit_A{suffix}": fit.A, f"fit_B{suffix}": fit.B, f"fit_C_mid{suffix}": fit.C_mid})
        except ValueError:
            pass  # fewer than 4 points past the early transient
    row["time"] = time.time() - t_start
    write_row(log, row)
    line = [f"step {row['step']}"]
    if "train_reward" in row:
        line += [f"reward {row['train_reward']:+.3f}", f"loss {row['loss']:.4f}"]
    if "val_reward" in row:
        line.append(f"val {row['val_reward']:.3f}" + (f" (fit A {row['fit_A']:.3f})" if "fit_A" in row else ""))
    if "policy_lag_mean" in row:
        line.append(f"lag {row['policy_lag_mean']:.2f}")
    print(" | ".join(line + [f"{row.get('step_time', 0.0):.2f} s", f"{row['time']:.0f} s total"]), flush=True)


def save_checkpoint(policy, tokenizer, layout, state):
    """Every trainer rank calls it (the gathers are collectives); the master writes a Hugging Face model
    directory with the fp32 weights (an exact resume; transformers and vLLM load it as it is), the
    optimizer, and `state` (step, counters, curriculum shares, the step's row), swapped in atomically."""
    weights = {}
    for name, p in policy.model.named_parameters():
        full = distributed.gather_to_master(p, torch.float32)  # FSDP2: to the master only
        if full is not None:
            weights[name] = full.cpu()
    optimizer_state = get_optimizer_state_dict(policy.model, policy.optimizer, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))
    if layout.rank != 0:
        return
    tmp, final, old = (os.path.join(out_dir, d) for d in ("ckpt.tmp", "ckpt", "ckpt.old"))
    shutil.rmtree(tmp, ignore_errors=True)
    policy.model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save(optimizer_state, os.path.join(tmp, "optimizer.pt"))
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

# -----------------------------------------------------------------------------
# the task, the policy, the samplers

def load_task(path, layout):
    """Prompts, held-out prompts and the reward of data_path, tokenized with the model's tokenizer; the
    model's own end-of-turn ids join the tokenizer's eos (Qwen: two of them). Data parallel: this rank's share."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    try:
        prompts, val_prompts, reward_fn = data.load_task(data_path, tokenizer, n_train=n_train or None, n_val=n_val,
                                                          seed=data_seed, prompt_field=prompt_field or None,
                                                          answer_field=answer_field)
    except data.DataError as e:
        fail(str(e))
    domains = sorted({p.domain for p in val_prompts})
    if layout.role == "data_parallel":  # each rank owns every world-th prompt: its own curriculum
        prompts, val_prompts = prompts[layout.rank::layout.world], val_prompts[layout.rank::layout.world]
    try:
        generation_eos = GenerationConfig.from_pretrained(path).eos_token_id  # an int or a list
    except OSError:
        generation_eos = None
    eos_ids = {tokenizer.eos_token_id} | set([generation_eos] if isinstance(generation_eos, int) else generation_eos or [])
    return Task(prompts, val_prompts, reward_fn, tokenizer, eos_ids, domains)


def plan_memory(path, task, layout):
    """memory.py's plan for every role, from the model's config.json, printed by the master. On CUDA a role
    that cannot fit is a one-line error before any work, naming the biggest term and its knob."""
    from transformers import AutoConfig
    max_len = max(len(p.input_ids) for p in task.prompts + task.val_prompts) + think_budget_max + answer_budget
    rows = micro_batch or prompts_per_step * samples_per_prompt
    tokens = min(micro_batch_tokens or rows * max_len, rows * max_len)
    gpu = torch.cuda.get_device_properties(layout.device).total_memory if device == "cuda" else 0
    one_gpu = layout.world == 1
    share = (vllm_gpu_memory if one_gpu else vllm_gpu_memory_own) if sampler == "vllm" and gpu else 0.0
    roles = memory.plan(memory.shape_of(AutoConfig.from_pretrained(path)), layout.trainers,
                        layout.trainers > 1 and layout.samplers > 0, layout.samplers, one_gpu,
                        2 if dtype == "bfloat16" else 4, tokens, checkpoint_activations, max_len, share,
                        weight_bucket_mb << 20, gpu)
    if layout.rank == 0:
        print(memory.describe(roles, gpu or None), flush=True)
    problem = gpu and memory.check(roles, gpu, one_gpu)
    if problem:
        fail(problem)


def load_policy(path, layout, state):
    """The trainer: fp32 parameters and AdamW state; compute in `dtype` (FSDP2's MixedPrecisionPolicy over
    the trainers when the samplers are separate ranks, else a bf16 copy); activation checkpointing if asked."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(layout.device).train()
    if checkpoint_activations:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(use_reentrant=False))
    sharded = layout.trainers > 1 and layout.samplers > 0
    if sharded:
        logprobs = L.TokenLogprobs(model)
        distributed.shard(model, getattr(torch, dtype), root=logprobs)
    else:
        logprobs = L.TokenLogprobs(distributed.compute_copy(model, getattr(torch, dtype)))
    # foreach: under FSDP2 every parameter is a DTensor (the root is sharded too), so the multi-tensor
    # path that CUDA picks by default works; CPUs take it as well, so the tests run what GPUs run
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(beta1, beta2), eps=adam_eps,
                                  weight_decay=weight_decay, foreach=True)
    if state:
        optimizer_state = torch.load(os.path.join(path, "optimizer.pt"), weights_only=False) \
            if layout.rank == 0 or not sharded else {}
        set_optimizer_state_dict(model, optimizer, optimizer_state, options=StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=sharded))
    return Policy(model, logprobs, optimizer, layout.trainer_rank, layout.trainers, sharded)


def make_sampler(path, task, layout, version, policy=None):
    """A sampler in this process: the torch one decodes with the trainer's own compute module (one
    process: zero-copy updates) or with its own copy (a sampler rank); the vLLM one starts an engine."""
    knobs = dict(temperature=temperature, fp32_head=fp32_head, max_seqs=sampler_slots,
                 seed=seed + 1000 * layout.rank + version, eos_ids=task.eos_ids,
                 think_end_ids=task.tokenizer.encode("</think>", add_special_tokens=False),
                 interrupt_ids=task.tokenizer.encode(data.INTERRUPT_PHRASE, add_special_tokens=False),
                 think_budget=(think_budget_min, think_budget_max) if length_control == "interrupt" else None,
                 answer_budget=answer_budget, max_new_tokens=think_budget_max + answer_budget)
    if sampler == "torch":
        module = policy.logprobs.model if policy else \
            AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(layout.device).eval()
        handle = TorchSampler(module, **knobs)
    else:  # room for the longest prompt + thinking + the phrase + the answer
        max_len = max(len(p.input_ids) for p in task.prompts + task.val_prompts) + knobs["max_new_tokens"] + \
            len(knobs["interrupt_ids"])
        share = vllm_gpu_memory_own if layout.role == "sampler" else vllm_gpu_memory
        budget = dict(gpu_memory_utilization=share) if device == "cuda" else dict(kv_cache_memory_bytes=1 << 30)
        handle = VLLMSampler(path, engine_kwargs=dict(dtype=dtype, max_model_len=max_len, **budget), **knobs)
        tokens, sequences = handle.engine.kv_capacity()
        print(f"rank {layout.rank}: vLLM's KV cache holds {tokens:,} tokens, {sequences:.0f} sequences of the full "
              f"{max_len} tokens, for sampler_slots={sampler_slots}" + ("" if sequences >= sampler_slots else
              " (beyond that, long sequences are preempted and recomputed: if it shows in the step time, "
              "fewer slots or more memory)"), flush=True)
    handle.version = version
    return handle


def push_weights(policy, samplers, version, layout):
    """After a step, the new weights into every sampler, in flight (PipelineRL): they apply them between
    two engine steps and unfinished sequences go on under them. The torch sampler of one process decodes
    with the trainer's compute module itself: nothing to copy. Otherwise the weights travel in buckets
    cast to the samplers' dtype, gathered from the FSDP2 shards on the way; a follower (samplers None)
    takes part in the gathers only."""
    if isinstance(samplers, TorchSampler) and samplers.model is policy.logprobs.model:
        return samplers.update_weights(None, version)
    sampler_dtype = getattr(torch, dtype)
    plan = distributed.weight_plan(policy.model, weight_bucket_mb << 20, sampler_dtype)
    flats = distributed.weight_buckets(policy.model, plan, sampler_dtype)
    if samplers is None:
        for _ in flats:
            pass
    elif layout.samplers:
        samplers.update_weights(plan, flats, sampler_dtype, version)
    else:  # vLLM in this process
        samplers.update_weights((t for bucket, flat in zip(plan, flats) for t in distributed.unflatten(bucket, flat)),
                                version)


def follow(policy, task, layout):
    """A follower trainer's whole life: each message from the master is a batch, its step and whether to
    checkpoint; it trains its share of the rows and joins the gathers of the weight push and of the
    checkpoint. Between messages it waits for as long as the master lives (hours of validation)."""
    while (message := layout.mailbox.get(0, "the master (rank 0)"))[0] != "stop":
        _, batch, step, save = message
        train_step(policy, batch, step, task.tokenizer.pad_token_id or 0)
        push_weights(policy, None, step + 1, layout)
        if save:
            save_checkpoint(policy, task.tokenizer, layout, None)

# -----------------------------------------------------------------------------
if __name__ == "__main__":
    configure(sys.argv[1:])
    try:
        distributed.place(n_samplers, sampler, device)  # before anything initialises CUDA
    except ValueError as e:
        fail(str(e))
    check_config()
    config = {k: globals()[k] for k in config_keys}
    layout = distributed.setup(n_samplers, rank_timeout, device, sampler)
    sys.excepthook = distributed.rank_error_hook(layout.rank)  # a dead or silent peer: one line, exit 1
    master, dp = layout.rank == 0, layout.role == "data_parallel"
    if master:
        print(json.dumps(config, indent=1))

    # the task and the model directory (the built-in tiny model is built once, by the master)
    base_path = model_path or distributed.master_first(layout, lambda: data.build_tiny_model(seed=data_seed))
    load_path = checkpoint_dir() if init_from == "resume" else base_path
    state = torch.load(os.path.join(load_path, "state.pt"), weights_only=False) if init_from == "resume" else None
    step = state["step"] if state else 0
    task = load_task(load_path, layout)
    plan_memory(load_path, task, layout)
    pad_id = task.tokenizer.pad_token_id if task.tokenizer.pad_token_id is not None else 0

    if layout.role == "sampler":  # generate until the master says stop
        distributed.serve(make_sampler(load_path, task, layout, step), layout, rank_timeout)
        distributed.finish(layout)
        sys.exit(0)
    policy = load_policy(load_path, layout, state)
    n_params = sum(p.numel() for p in policy.model.parameters())
    if layout.role == "follower":  # train a share of each batch the master sends
        follow(policy, task, layout)
        distributed.finish(layout)
        sys.exit(0)

    # the master, a data-parallel rank, or the one process: curriculum, scheduler, samplers, log
    if dp and state and state["world"] != layout.world:
        fail(f"the checkpoint was written by {state['world']} data-parallel ranks, this run has {layout.world}")
    curriculum = data.Curriculum(len(task.prompts), seed=seed + layout.rank, npr=npr, threshold=npr_threshold,
                                 domains=[p.domain for p in task.prompts], weights=[p.weight for p in task.prompts])
    share = state["shares"][layout.rank if dp else 0] if state else dict(curriculum=None, in_flight=[])
    if share["curriculum"]:
        curriculum.load_state_dict(share["curriculum"])
    local_prompts = prompts_per_step // layout.world if dp else prompts_per_step  # groups this rank brings
    rollouts = Rollouts(curriculum, task.prompts, samples_per_prompt, local_prompts, max_lag, off_policy,
                        requeue=share["in_flight"])
    samplers = distributed.RemoteSamplers(layout, rank_timeout) if layout.samplers else \
        make_sampler(load_path, task, layout, step, policy)
    samplers.version = step
    slots = sampler_slots * max(layout.samplers, 1) + (local_prompts * samples_per_prompt if layout.samplers else 0)
    counters = state["counters"] if state else dict(train_seconds=0.0, flops=0.0, tokens=0)
    log = open_log(state, dict(config=config, n_params=n_params, world=layout.world), task) if master else None
    t_start, generated = time.time(), 0
    if step == 0 or logged_step(state) < step:  # R0, or a resumed step whose row a crash kept from the log
        row = dict(state["row"]) if state else dict(step=0, gpu_hours=0.0, flops=0.0, tokens=0)
        if step % eval_interval == 0 or state["last"]:
            scores, generated = evaluate(samplers, rollouts, task, layout)
            row.update(scores)
        if log:
            log_step(log, row, t_start)

    segment_start = time.time()
    while step < max_steps:
        # sample: new prompts within the lag bound, one engine step on every sampler, finished groups in
        room = math.ceil((slots - samplers.num_unfinished * samples_per_prompt) / samples_per_prompt)
        rollouts.hand_out(samplers, step, room)
        generated += samplers.step()
        rollouts.collect(samplers.pop_finished())
        batch = rollouts.ready_batch(step)
        if batch is None:
            if rollouts.starved and not samplers.num_unfinished and not dp:
                print("every training prompt is retired by No-Positive-Resampling: stopping")
                break
            continue
        t0 = time.time()
        # reward: the verifier or the sandbox, and the curriculum's pass rates
        score(batch, task, curriculum)
        last = step + 1 >= max_steps or rollouts.starved or 0 < max_minutes * 60 < time.time() - t_start
        if dp:  # every rank brings its share: one batch, one decision to stop, every rank's tokens
            shares = distributed.gather_objects((batch, last, generated))
            batch, last, generated = [g for s in shares for g in s[0]], any(s[1] for s in shares), sum(s[2] for s in shares)
        save = last or (step + 1) % ckpt_interval == 0
        for rank in range(1, layout.trainers) if layout.samplers else ():  # the followers train the same batch
            layout.mailbox.send(rank, ("step", batch, step, save))
        # train
        stats = train_step(policy, batch, step, pad_id)
        step += 1
        # push the weights into every sampler, in flight
        push_weights(policy, samplers, step, layout)
        # count, checkpoint (before a validation that may take hours), evaluate, log
        counters["tokens"] += generated
        counters["flops"] += 2 * n_params * generated + 6 * n_params * stats["trained_tokens"]  # ~2N / ~6N a token
        counters["train_seconds"] += time.time() - segment_start  # wall time of sampling + training
        row = dict(step=step, gpu_hours=counters["train_seconds"] * layout.world / 3600, flops=counters["flops"],
                   tokens=counters["tokens"], step_time=time.time() - t0, **stats)  # gpu_hours: wall x processes
        if save:
            shares = [dict(curriculum=curriculum.state_dict(), in_flight=rollouts.in_flight())]
            save_checkpoint(policy, task.tokenizer, layout, dict(
                step=step, counters=counters, shares=distributed.gather_objects(shares[0]) if dp else shares,
                world=layout.world, config=config, row=row, last=last))
        if step % eval_interval == 0 or last:
            scores, generated = evaluate(samplers, rollouts, task, layout)
            row.update(scores)
        if log:
            log_step(log, row, t_start)
        segment_start = time.time()  # validation and checkpoints are not training compute
        if last:
            if rollouts.starved and master:
                print(f"every training prompt{' of a data-parallel share' if dp else ''} is retired by "
                      "No-Positive-Resampling: stopping")
            break

    if layout.samplers:  # the last message to every other rank
        samplers.stop()
        for rank in range(1, layout.trainers):
            layout.mailbox.send(rank, ("stop",))
    if log:
        log.file.close()
    distributed.finish(layout)
