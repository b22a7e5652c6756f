"""
ScaleRL in one file: PipelineRL-k generation, CISPO, prompt-average aggregation, batch-level
advantage normalisation, zero-variance filtering, No-Positive-Resampling, an FP32 LM head and length
control by interruption (Khatri et al. 2025, arXiv 2510.13786). Every leave-one-out ablation is one
config value.

CPU, the built-in task and its tiny model (~8 minutes); one GPU, your model (<= ~2B) and a JSONL
of math problems; 8 GPUs, 6 vLLM sampler ranks and 2 FSDP2 trainers (docs/many_gpus.md, for more
nodes and CPU processes); an ablation, a resume, its scaling curve's fit:
    python train.py
    python train.py config/scalerl_1gpu.py --model_path=/models/Qwen3-1.7B --data_path=D.jsonl
    torchrun --standalone --nproc_per_node=8 train.py config/scalerl_8b.py --model_path=M \\
        --n_samplers=6
    python train.py config/loo_dapo.py; python train.py --init_from=resume
    python fit_curve.py out/log.jsonl

The training step reads with four files open: train.py, loss.py, head.py and infra/policy.py; one
turn of the loop with train.py, scheduler.py, sample.py and infra/control.py (when to checkpoint,
validate and stop). build.py makes each part once.
"""

import json
import math
import os
import sys
import time
from types import SimpleNamespace

import torch
from tqdm import tqdm

import configurator
import data
import log
import loss
import rewards
import sample
import scheduler
from build import load_task, make_policy, make_rollouts, tiny_model
from infra import checkpoint, distributed, lora, memory
from infra.control import RunControl
from infra.policy import (add_grads, copy_weights, micro_batches, policy_size, push_weights,
                          resolve_dtypes, sync_grads)
from rewards import sandbox

# -----------------------------------------------------------------------------
# config: module-level constants; config/*.py files and --key=value override them (configurator.py).
# Defaults are the CPU run; the paper's value follows "paper:" where it differs.
# the ScaleRL recipe; each comment names the leave-one-out value
loss_type = "cispo"            # loss.LOSSES: 'cispo' | 'dapo' | 'gspo' | 'grpo'; its knobs follow
eps_max = 4.0                  # CISPO's upper truncation of the IS ratio (paper: 4, 5, 8 all alike)
clip_low = 0.2                 # DAPO / GRPO: ratio clipped below at 1 - clip_low
clip_high = 0.28               # DAPO: above at 1 + clip_high (GRPO: 1 + clip_low)
gspo_low = 3e-3                # GSPO: sequence ratio clipped to [1 - gspo_low, 1 + gspo_high]
gspo_high = 5e-3
is_correction = "none"         # loss.IS_CORRECTIONS: 'none' (paper) | 'tis' | 'icepop' | 'geo_mask'
tis_cap = 2.0                  # token TIS: a token's ratio to the sampler counts at most this
icepop_low = 0.5               # IcePop: a token whose ratio leaves [low, high] is dropped
icepop_high = 2.0
geo_low = 0.99                 # geometric mask: drops a sequence whose exp(mean log ratio) leaves
geo_high = 1.01                # [low, high]
agg = "prompt"                 # loss aggregation: 'prompt' | 'sample' | 'token'
adv_norm = "batch"             # advantage normalisation: 'batch' | 'prompt' | 'none'
zero_var_filter = True         # drop prompt groups whose rewards are all equal
npr = True                     # No-Positive-Resampling: retire prompts passing npr_threshold
npr_threshold = 0.9
fp32_head = True               # LM head in fp32 on the sampler and the trainer
off_policy = "pipeline"        # scheduler.OFF_POLICY: 'pipeline' (PipelineRL-k) | 'ppo' (PPO-k)
max_lag = 8                    # k: generation runs at most k optimizer steps ahead of training
length_control = "interrupt"   # 'interrupt' (forced '</think>') | 'penalty' (DAPO overlong penalty)
think_budget_min = data.TINY_THINK_BUDGET[0]  # thinking budget drawn per sequence (paper: 10k..12k)
think_budget_max = data.TINY_THINK_BUDGET[1]  # (paper: 12,288)
answer_budget = data.TINY_ANSWER_BUDGET       # tokens after '</think>' (paper: 2,048)
penalty_cache = 8              # 'penalty': L_cache below L_max = think + answer (paper: 2k of 14k)
train_truncated = False        # train on completions cut at the answer budget (paper, A.16: no)
temperature = 1.0              # sampling temperature, also used by the trainer and validation
# batch and optimiser
prompts_per_step = 32          # P prompts per optimizer step (paper: 48)
samples_per_prompt = 8         # G completions per prompt (paper: 16)
lr = 5e-5                      # constant after warm-up (paper: 5e-7 for 8B; tiny models need more:
                               # at 1e-4 the built-in task's CISPO runs fell back after ~60 steps)
warmup_steps = 10              # linear warm-up (paper: 100)
weight_decay = 0.01
adam_eps = 1e-15               # (paper: 1e-15)
beta1 = 0.9
beta2 = 0.999                  # (ours: the paper does not say)
grad_clip = 1.0                # max grad norm (ours: the paper does not say)
max_steps = 400                # optimizer steps
lora_rank = 0                  # 0: full fine-tuning (the paper's); r > 0: LoRA adapters of rank r
                               # are all that trains, the base frozen (infra/lora.py; docs/lora.md)
lora_alpha = 32.0              # the adapters' update is scaled by lora_alpha / lora_rank
lora_targets = "all"           # 'all' linear layers of the decoder layers, or some: 'q_proj,v_proj'
max_minutes = 8.0              # wall-clock budget of the whole run, evaluation included; 0 = none
# data, evaluation, checkpoints
out_dir = "out"                # log.jsonl, config.json, ckpt/
init_from = "scratch"          # 'scratch' (start from model_path) | 'resume' (out_dir's checkpoint)
model_path = ""                # local Hugging Face causal-LM directory; '' = the built-in tiny model
data_path = "builtin"          # 'builtin' | local JSONL files, comma-separated, weighted (data.py)
prompt_field = ""              # JSONL field of the problem; '' = "prompt" or "problem"
answer_field = "answer"        # JSONL field of the reference answer (math rows)
prompt_template = "{problem}"  # what the model is asked, {problem} replaced by a row's problem
sandbox_unsafe = False         # code rewards without root and namespaces: programs run as you
verify_timeout = rewards.TIMEOUT  # seconds math-verify may spend on one answer, any thread (ours)
n_train = 4000                 # training prompts: the built-in task draws this many; JSONL: at most
n_val = 200                    # held-out validation prompts (paper: 1,000)
seed = 0                       # the RL run: sampling and curriculum order (vary it across seeds)
data_seed = 0                  # the built-in task, its base model and the held-out split: keep it
                               # fixed across seeds, so runs start from one R0 on the same prompts
eval_interval = 10             # steps between validations (paper: 100); step 0 is always evaluated
eval_samples = 8               # samples per held-out prompt (paper: 16, "mean@16")
ckpt_interval = 50             # steps between checkpoints; one is also written at the end
exact_resume = False           # True: checkpoints let the sequences in flight finish, max_minutes
                               # stops at one: a resumed run logs what one run logs, bit for bit
                               # (docs/resume.md "Sittings"; one process, the torch sampler)
wandb_log = False              # mirror every log.jsonl row to Weights & Biases (pip install wandb)
wandb_project = "scalerl"
wandb_run_name = ""            # '' = wandb's own name
# hardware
device = "cpu"                 # 'cpu' | 'cuda'
dtype = "float32"              # trainer compute: 'float32' | 'bfloat16' | 'auto' (bf16 on CUDA and
                               # native-bf16 CPUs); parameters and AdamW stay fp32 either way
sampler_dtype = "auto"         # sampler compute, the same choices (the paper's generators: bf16)
sampler = "torch"              # 'torch' (plain KV-cache decoding) | 'vllm'
sampler_slots = 1280           # sequences decoded at once per sampler (continuous batching): 5
                               # batches in flight keep PipelineRL-8's mean lag above 2 steps here
vllm_gpu_memory = 0.4          # vLLM's gpu_memory_utilization beside the trainer (of the GPU's total)
vllm_gpu_memory_own = 0.85     # ... on a sampler rank's own GPU
n_samplers = 0                 # torchrun: the last n_samplers ranks generate, the others train
                               # (FSDP2); 0 = every rank samples and trains its share (data parallel)
rank_timeout = 1800.0          # seconds a rank waits on a peer that shows no sign of life
weight_bucket_mb = 1024        # the weights travel to the samplers in buckets of this size
checkpoint_activations = False # recompute each decoder layer in the backward
micro_batch = 64               # at most this many completions per forward/backward (0 = no cap)
micro_batch_tokens = 0         # at most this many padded tokens per forward/backward (0 = no cap)
warn_truncation = 0.15         # warn when a step's truncation rate passes this (paper: 10-15% at
                               # batch 768 signalled instability); the other warnings: log.warnings
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items()
               if k[0] != "_" and type(v) in (bool, int, float, str)]
RULES = dict(  # configurator.configure's rules: the allowed values, or the smallest number
    agg=("prompt", "sample", "token"), adv_norm=("batch", "prompt", "none"),
    length_control=("interrupt", "penalty"),
    init_from=("scratch", "resume"), device=("cpu", "cuda"), sampler=("torch", "vllm"),
    dtype=("float32", "bfloat16", "auto"), sampler_dtype=("float32", "bfloat16", "auto"),
    samples_per_prompt=2, think_budget_min=1, rank_timeout=2.0, verify_timeout=0.1,
    **dict.fromkeys("prompts_per_step max_lag answer_budget eval_interval eval_samples "
                    "ckpt_interval sampler_slots max_steps n_val weight_bucket_mb".split(), 1),
    **dict.fromkeys("micro_batch micro_batch_tokens n_train lora_rank".split(), 0))


def fail(message):
    configurator.fail("train.py", message)


def failing(prefix=""):  # a ValueError naming bad input inside: one line, exit 2
    return configurator.failing("train.py", prefix)


def current_config():
    """Every knob above as it stands -> cfg (cfg.lr; vars(cfg): {key: value}), which every function
    below is handed: none reads a knob from the module."""
    return SimpleNamespace(**{k: globals()[k] for k in config_keys})


def configure(args):
    # read now: a loss or a correction added to its table is one more choice
    rules = dict(RULES, loss_type=tuple(loss.LOSSES), is_correction=tuple(loss.IS_CORRECTIONS),
                 off_policy=tuple(scheduler.OFF_POLICY))
    globals().update(configurator.configure(vars(current_config()), args, "train.py", rules))


def check_config(cfg):
    """What the table cannot say: a config that contradicts itself or the machine fails before any
    work."""
    world, L_max = int(os.environ.get("WORLD_SIZE", 1)), cfg.think_budget_max + cfg.answer_budget
    checks = [
        (cfg.think_budget_min > cfg.think_budget_max,
         f"think_budget_min={cfg.think_budget_min} > think_budget_max={cfg.think_budget_max}"),
        (cfg.length_control == "penalty" and not 0 < cfg.penalty_cache < L_max,
         f"penalty_cache={cfg.penalty_cache}: must lie in (0, L_max = {L_max})"),
        (cfg.model_path and not os.path.isdir(cfg.model_path),
         f"model_path={cfg.model_path!r}: no such directory"),
        (not 0 <= cfg.n_samplers < world,
         f"n_samplers={cfg.n_samplers}: need 0 <= n_samplers < the number of processes ({world}); "
         "launch with torchrun --nproc_per_node=N"),
        (cfg.n_samplers == 0 and cfg.prompts_per_step % world,
         f"prompts_per_step={cfg.prompts_per_step} must be divisible by the {world} data-parallel "
         "ranks"),
        (cfg.device == "cuda" and not torch.cuda.is_available(),
         "device='cuda' but torch sees no GPU"),
        (cfg.init_from == "scratch" and os.path.exists(os.path.join(cfg.out_dir, "log.jsonl")),
         f"out_dir={cfg.out_dir!r} holds another run (log.jsonl); pass --init_from=resume or "
         "another --out_dir"),
        (cfg.init_from == "resume" and not checkpoint.latest(cfg.out_dir),
         f"init_from='resume' but {cfg.out_dir!r} holds no checkpoint (a complete ckpt/ or "
         "ckpt.old/)"),
        (cfg.lora_alpha <= 0, f"lora_alpha={cfg.lora_alpha}: must be > 0"),
        (cfg.exact_resume and (world > 1 or cfg.sampler != "torch"),
         "exact_resume=True needs one process and sampler='torch' (the random state of vLLM and of "
         "other ranks is not saved)")]
    for bad, message in checks:
        if bad:
            fail(message)

# -----------------------------------------------------------------------------
# the training step

def score(cfg, groups, prompts, task):
    """Every completion of `groups` (one of `prompts` each) -> its reward in g.rewards (+1 / -1, the
    batch at once)."""
    scores = iter(rewards.score(
        [(p, data.decode(task, x.token_ids), x.finish_reason == "truncated")
         for p, g in zip(prompts, groups) for x in g.completions], cfg.verify_timeout))
    for g in groups:
        g.rewards = [next(scores) for _ in g.completions]


def reward_groups(cfg, groups, task, curriculum):
    """Reward every completion and give the curriculum each group's pass rate."""
    score(cfg, groups, [task.prompts[g.index] for g in groups], task)
    L_max = cfg.think_budget_max + cfg.answer_budget
    for g in groups:
        curriculum.update(g.index, sum(r > 0 for r in g.rewards) / len(g.rewards))
        if cfg.length_control == "penalty":
            # DAPO's overlong penalty on correct answers: 0 up to L_max - L_cache, -1 at L_max
            g.rewards = [r + min(max((L_max - len(x.token_ids)) / cfg.penalty_cache - 1, -1.0), 0.0)
                         if r > 0 else r for r, x in zip(g.rewards, g.completions)]


def train_step(cfg, policy, groups, step, pad_id):
    """The optimizer step after `step` earlier ones, on P scored groups -> the log's training
    stats. Every trainer rank runs it on the same batch and computes its share of the rows."""
    step_lr = cfg.lr * min(1.0, (step + 1) / max(cfg.warmup_steps, 1))  # warm-up, then constant
    scores = torch.tensor([g.rewards for g in groups])  # (P, G)
    keep = (loss.zero_variance_mask(scores) if cfg.zero_var_filter
            else torch.ones(len(groups), dtype=torch.bool))
    # the batch's figures before any learning: rewards, lengths, cuts, PipelineRL's lag
    stats = dict(log.batch_figures(groups, scores, step, step_lr, cfg.train_truncated),
                 effective_prompts=int(keep.sum()))
    kept = [g for g, k in zip(groups, keep.tolist()) if k]
    if not kept:  # every group was all-correct or all-wrong: nothing to learn from this batch
        return dict(stats, loss=0.0, grad_norm=0.0, skipped="no_signal", trained_tokens=0)
    ids, lengths, behaviour, mask, prompt_index, row_adv = loss.collate(
        kept, loss.group_advantages(scores[keep], cfg.adv_norm), pad_id, cfg.train_truncated)
    weights = loss.token_weights(mask, prompt_index, cfg.agg)  # (N, T-1), sums to 1 over the batch
    for param_group in policy.optimizer.param_groups:
        param_group["lr"] = step_lr
    on, loss_stats = next(policy.logprobs.parameters()).device, []
    knobs = loss.knobs_of(vars(cfg))  # loss_type, is_correction and their knobs, by name
    for rows in micro_batches(lengths, policy.rank, policy.ranks, cfg.micro_batch,
                              cfg.micro_batch_tokens):
        # a rank short of rows still joins the collectives, with one weightless row
        present, rows = (1.0, rows) if len(rows) else (0.0, torch.zeros(1, dtype=torch.long))
        T = int(lengths[rows].max())
        mb = lambda x: x[rows, :T - 1].to(on)
        logprobs, entropy = policy.logprobs(
            ids[rows, :T].to(on), cfg.temperature, cfg.fp32_head, with_entropy=True)
        on_mask = mb(mask) * present
        mb_loss, mb_stats = loss.policy_loss(
            logprobs, mb(behaviour), row_adv[rows].to(on), on_mask, mb(weights) * present,
            **knobs)
        # each rank's loss is its part of one global sum; the trainers' gradients are averaged
        # (FSDP2's reduce-scatter every micro-batch; sync_grads under data parallelism)
        (mb_loss * policy.ranks).backward()
        add_grads(policy.model, policy.logprobs.model)  # bf16 copy -> fp32 (no-op otherwise)
        loss_stats.append(dict(mb_stats, loss=mb_loss.detach(), entropy=(entropy * on_mask).sum()))
    sync_grads(policy.model, policy.ranks)
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.model.parameters(), cfg.grad_clip,
                                               foreach=True)
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
        grad_norm = grad_norm.full_tensor()
    # the loss's stats by name, over every trainer (sums, and maxima for names ending in _max)
    stats.update(loss.merge_stats(loss_stats, reduce=distributed.all_reduce_sums),
                 grad_norm=float(grad_norm), trained_tokens=int(lengths.sum()))
    finite = math.isfinite(stats["loss"]) and math.isfinite(stats["grad_norm"])
    if finite:  # a non-finite step is logged, not applied (every rank agrees: the sums are global)
        policy.optimizer.step()
        copy_weights(policy.model, policy.logprobs.model)  # the bf16 copy takes the new weights
    policy.optimizer.zero_grad(set_to_none=True)
    memory.release()  # the step's activations and gradients, freed, back to the OS
    return stats if finite else dict(stats, skipped="non_finite")


@torch.no_grad()
def evaluate(cfg, samplers, rollouts, task, layout, policy, pad_id, mismatch_groups=8):
    """Held-out mean@n, pass@k (k = 1, 2, 4, ..., n = eval_samples), lag-0 mismatch (log.validation;
    on the first mismatch_groups groups) -> (figures, training tokens meanwhile)."""
    # sampled as in training (the paper's mean@16 is), under interruption whatever length_control
    # (one protocol, ours), on the training samplers: their groups decode on and wait in `rollouts`
    started = time.time()
    for i, prompt in enumerate(task.val_prompts):
        samplers.add(i, prompt.input_ids, cfg.eval_samples,
                     (cfg.think_budget_min, cfg.think_budget_max), validation=True)
    groups, tokens = [], 0  # tokens: the training groups', decoded meanwhile
    with tqdm(total=len(task.val_prompts), desc="validation", leave=False,
              disable=not (layout.rank == 0 and sys.stderr.isatty())) as bar:
        while len(groups) < len(task.val_prompts):
            tokens += samplers.step()
            new = rollouts.collect(samplers.pop_finished())
            tokens -= sum(sum(x.policy_mask) for g in new for x in g.completions)
            groups += new
            bar.update(len(new))
    prompts = [task.val_prompts[g.prompt_id] for g in groups]
    score(cfg, groups, prompts, task)
    reduce = distributed.all_reduce_sums if layout.role == "data_parallel" else None
    result = log.validation(prompts, groups, cfg.eval_samples, task.domains, started, reduce)
    if groups and not policy.sharded:  # (a data-parallel rank may hold no held-out prompt)
        # the lag-0 mismatch on the first groups, in one forward within the trainer's caps
        few = groups[:mismatch_groups]
        ids, lengths, behaviour, mask, _, _ = loss.collate(
            few, torch.zeros(len(few), cfg.eval_samples), pad_id, cfg.train_truncated)
        rows = micro_batches(lengths, 0, 1, cfg.micro_batch, cfg.micro_batch_tokens)[0]
        T, on = int(lengths[rows].max()), next(policy.model.parameters()).device
        logprobs = policy.logprobs(ids[rows, :T].to(on), cfg.temperature, cfg.fp32_head)
        mb = lambda x: x[rows, :T - 1].to(on)
        result.update(loss.sampler_mismatch(logprobs, mb(behaviour), mb(mask)))
    memory.release()  # the validation's KV cache rows, freed, back to the OS
    return result, tokens


def push(cfg, policy, samplers, version):
    """The policy's weights into every sampler, in flight (None: a follower's part)."""
    push_weights(policy, samplers, version, getattr(torch, cfg.sampler_dtype),
                 cfg.weight_bucket_mb << 20)

# -----------------------------------------------------------------------------
# the loop

def train_loop(cfg, policy, samplers, rollouts, task, layout, run, control, pad_id):
    """PipelineRL-k in one process's time (the master's, a data-parallel rank's, the one process's):
    hand prompts out, step the samplers, reward finished groups, train on a ready batch, push the
    weights in flight, log and validate -> the last step. run: log.Run; control: a RunControl."""
    slots = cfg.sampler_slots * max(layout.samplers, 1)  # every sampler's (scheduler.room)
    step = run.step
    while True:
        # between steps: a checkpoint when due, then validate (step 0, every eval_interval steps,
        # the last) and log the step's row
        if control.boundary(step):
            if run.evaluate:
                scores, tokens = evaluate(cfg, samplers, rollouts, task, layout, policy, pad_id)
                run.row.update(scores)
                run.generated += tokens
            run.write()
        if control.stops(step):
            break
        # hand out prompts within the lag bound, one engine step on every sampler, groups in
        room = scheduler.room(slots, samplers.num_unfinished, cfg.samples_per_prompt, rollouts.P)
        rollouts.hand_out(samplers, step, room)
        run.generated += samplers.step()
        rollouts.collect(samplers.pop_finished())
        if control.signalled():  # a stop meanwhile: no step begins
            continue
        if (batch := rollouts.ready_batch(step)) is None:  # keep sampling, unless none is left
            control.starved()
            continue
        # reward: the verifier or the sandbox, and the curriculum's pass rates
        reward_groups(cfg, batch, task, rollouts.curriculum)
        batch = control.decide(step, batch)  # the run's last step? (data-parallel ranks: agreed)
        distributed.send_step(layout, batch, step)  # the followers train it too
        # train, then push the weights into every sampler, in flight
        stats = train_step(cfg, policy, batch, step, pad_id)
        step += 1
        push(cfg, policy, samplers, step)
        run.count(step, stats, evaluate=control.evaluates(step))
    if rollouts.starved and control.last and layout.rank == 0:
        share = " of a data-parallel share" if control.dp else ""
        print(f"every training prompt{share} is retired by No-Positive-Resampling: stopping")
    return step

# -----------------------------------------------------------------------------
if __name__ == "__main__":
    stop = distributed.StopSignal()  # SIGTERM, SIGINT: a checkpoint, then every rank stops
    configure(sys.argv[1:])
    cfg = current_config()
    with failing():
        distributed.place(cfg.n_samplers, cfg.sampler, cfg.device)  # before CUDA initialises
    check_config(cfg)
    with failing():  # (a damaged checkpoint or log)
        resumed = log.resume(cfg.out_dir) if cfg.init_from == "resume" else None
    # 'auto' -> the dtype this machine is fast in, once (the config saved and logged holds it)
    cfg.dtype, cfg.sampler_dtype, dtypes = resolve_dtypes(
        cfg.dtype, cfg.sampler_dtype, cfg.device, resumed[1]["config"] if resumed else None)
    config = vars(cfg)
    layout = distributed.setup(cfg.n_samplers, cfg.rank_timeout, cfg.device, cfg.sampler)
    sys.excepthook = distributed.rank_error_hook(layout.rank)  # a dead or silent peer: one line
    if layout.rank == 0:
        print(json.dumps(config, indent=1) + "\n" + dtypes, flush=True)
    # the model (the built-in tiny model is built once, by the master), the task, the memory plan
    base_path = cfg.model_path or distributed.master_first(
        layout, lambda: tiny_model(cfg.data_seed))
    load_path, state, logged = resumed or (base_path, None, None)
    knobs = {k: config[k] for k in ("lora_rank", "lora_alpha", "lora_targets")}
    if state and (problem := lora.resume_problem(state["config"], state["lora"], knobs, base_path)):
        fail(problem)
    # LoRA: the checkpoint holds the adapter; samplers start from the base, a push merges it in
    model_dir = base_path if cfg.lora_rank else load_path
    step = state["step"] if state else 0
    task = load_task(cfg, model_dir, layout)
    pad_id = task.tokenizer.pad_token_id or 0  # None: 0
    # room for the longest prompt, the thinking, the interruption phrase and the answer
    max_len = (max(len(p.input_ids) for p in task.prompts + task.val_prompts) + cfg.think_budget_max
               + cfg.answer_budget + len(data.interruption(task.tokenizer)))
    with failing():  # (lora_targets that match nothing)
        if problem := memory.plan_run(model_dir, layout, config, max_len):
            fail(problem)

    if layout.role == "sampler":  # generate what the master hands out until it says stop
        exit_code = distributed.serve(sample.make(cfg, model_dir, task, layout, step, max_len),
                                      layout, cfg.rank_timeout)
    elif layout.role == "follower":  # train a share of each batch the master sends
        policy = make_policy(cfg, model_dir, layout, resumed)
        if policy.lora and resumed:  # the master's first push (the samplers start from the base)
            push(cfg, policy, None, step)
        exit_code = distributed.follow(
            layout, lambda batch, s: train_step(cfg, policy, batch, s, pad_id),
            lambda version: push(cfg, policy, None, version),
            lambda: checkpoint.save(cfg.out_dir, policy, task.tokenizer, None))
    else:  # the master, a data-parallel rank, or the one process: the loop's state, made here
        policy = make_policy(cfg, model_dir, layout, resumed)
        rollouts = make_rollouts(cfg, task, layout, state)
        samplers = (distributed.RemoteSamplers(layout, cfg.rank_timeout) if layout.samplers
                    else sample.make(cfg, model_dir, task, layout, step, max_len, policy))
        samplers.version = step
        if state and state.get("sampler"):  # drained (exact_resume): the random state it had
            samplers.load_state_dict(state["sampler"])
        if policy.lora and state:
            push(cfg, policy, samplers, step)
        code = any(p.code for p in task.prompts + task.val_prompts)  # the log's header says what
        isolation = sandbox.isolation() if code and layout.rank == 0 else None  # they run under
        run = log.Run(state, logged, config, layout, policy_size(policy), isolation)
        save = lambda step, last, **exact: checkpoint.save_run(  # noqa: E731
            cfg.out_dir, policy, task, layout, rollouts,
            dict(step=step, counters=run.counters, config=config, row=run.row, last=last, **exact))
        control = RunControl(
            run, samplers, rollouts, stop, save,
            distributed.agree if layout.role == "data_parallel" else None,
            cfg.max_steps, cfg.max_minutes, cfg.ckpt_interval, cfg.eval_interval, cfg.exact_resume)
        step = train_loop(cfg, policy, samplers, rollouts, task, layout, run, control, pad_id)
        exit_code = control.exit_code(step)
        if layout.samplers:  # the last message to every other rank
            samplers.stop(exit_code)
        run.close()
    distributed.finish(layout)
    if exit_code:  # stopped by a signal: every rank exits with PREEMPTED, the master says how on
        if layout.rank == 0:
            print(f"train.py: {stop.name or 'a stop signal'}: stopped after step {step}, "
                  f"checkpoint {os.path.join(cfg.out_dir, 'ckpt')}; to go on, run the same command "
                  "with --init_from=resume", file=sys.stderr, flush=True)
        sys.exit(exit_code)
