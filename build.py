"""
A process's parts, made once from the config (cfg: train.py's knobs, by name): the built-in task's
model, the task (a data-parallel rank's share), the trainer's policy and the rollouts (the
curriculum and the off-policy rule), resumed from a checkpoint's state. The sampler is sample.make.
train.py calls each once; a reader of the loop can skip this file.
"""

import importlib.util
import os

import torch

import configurator
import data
import head
import scheduler
from infra.policy import load_policy
from rewards import sandbox


def failing(prefix=""):  # a ValueError naming bad input inside: one line, exit 2
    return configurator.failing("train.py", prefix)


def tiny_model(data_seed):
    """The built-in task's base model directory: data/builtin/prepare.py's cache, built once."""
    # the script's settings read in this process, whose imports it shares: started as a script
    # only to build (its start alone took ~6 s of every run)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data/builtin/prepare.py")
    spec = importlib.util.spec_from_file_location("builtin_prepare", script)
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    with failing():
        return prepare.cached_model(data_seed)


def load_task(cfg, path, layout):
    """The task; a data-parallel rank keeps every world-th prompt (its curriculum, its validation
    share). Code rewards need the sandbox (rewards/sandbox.py)."""
    with failing():
        task = data.load_task(cfg.data_path, path, cfg.n_train, cfg.n_val, cfg.data_seed,
                              cfg.prompt_field or None, cfg.answer_field, cfg.prompt_template)
    with failing(f"data_path={cfg.data_path!r}: "):  # isolated, or unsafe and a WARNING
        if any(p.code for p in task.prompts + task.val_prompts):
            sandbox.require(cfg.sandbox_unsafe)
    share = (slice(layout.rank, None, layout.world) if layout.role == "data_parallel"
             else slice(None))
    return task._replace(prompts=task.prompts[share], val_prompts=task.val_prompts[share])


def make_policy(cfg, path, layout, resumed=None):
    """The trainer's Policy (infra/policy.py): sharded by FSDP2 when 2+ trainers sit beside sampler
    ranks. resumed: log.resume's (its directory, its state, ...); LoRA: path is the base."""
    adapters = dict(rank=cfg.lora_rank, alpha=cfg.lora_alpha, targets=cfg.lora_targets,
                    seed=cfg.seed, path=path) if cfg.lora_rank else None
    with failing():  # (lora_targets that match nothing)
        return load_policy(
            path, layout.device, layout.trainer_rank, layout.trainers,
            layout.trainers > 1 and layout.samplers > 0, getattr(torch, cfg.dtype),
            cfg.checkpoint_activations, resumed[0] if resumed else None, head.TokenLogprobs,
            adapters, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay)


def make_rollouts(cfg, task, layout, state):
    """This rank's curriculum (No-Positive-Resampling) and scheduler (the off-policy rule), resumed
    from `state` if any."""
    dp = layout.role == "data_parallel"
    if dp and state and state["world"] != layout.world:
        configurator.fail("train.py", f"the checkpoint was written by {state['world']} "
                          f"data-parallel ranks, this run has {layout.world}")
    curriculum = data.Curriculum(
        len(task.prompts), cfg.seed + layout.rank, cfg.npr, cfg.npr_threshold,
        [p.domain for p in task.prompts], [p.weight for p in task.prompts])
    mine = state["shares"][layout.rank if dp else 0] if state else dict(in_flight=[])
    if mine.get("curriculum"):
        curriculum.load_state_dict(mine["curriculum"])
    rollouts = scheduler.Rollouts(  # (the groups it brings go out first)
        curriculum, task.prompts, cfg.samples_per_prompt,
        cfg.prompts_per_step // layout.world if dp else cfg.prompts_per_step, cfg.max_lag,
        cfg.off_policy, requeue=mine["in_flight"])
    if state and state.get("rollouts"):  # drained (exact_resume): its finished groups as they were
        rollouts.load_state_dict(state["rollouts"])
    return rollouts
