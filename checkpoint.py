"""A run's out_dir, written by the master and read back on resume: config.json; log.jsonl (README, "The
log": the contract with fit_curve.py), each row flushed; ckpt/, a Hugging Face model directory (fp32 weights
and the tokenizer: transformers and vLLM load it as it is) with optimizer.pt and state.pt (step, counters,
curriculum, the step's log row), written beside the old one and swapped in. On resume the log is cut back to
the checkpoint's step: it goes on with no gap and no duplicate."""

import json
import os
import shutil
import time
from collections import defaultdict, namedtuple

import torch

from fit_curve import fit_sigmoid
from policy import full_state

class Log(namedtuple("Log", "file history wandb")):
    """The open log.jsonl; history: key -> [(gpu_hours, value)] for the live fits; wandb: None, or wandb."""

    def close(self):
        self.file.close()
        if self.wandb:
            self.wandb.finish()


def resume(out_dir):
    """-> (the checkpoint's directory, its state, the log's rows up to its step); None: no complete one."""
    for path in (os.path.join(out_dir, d) for d in ("ckpt", "ckpt.old")):
        if os.path.isfile(os.path.join(path, "state.pt")):
            state = torch.load(os.path.join(path, "state.pt"), weights_only=False)
            with open(os.path.join(out_dir, "log.jsonl")) as f:  # a hard kill may leave half a line: dropped
                rows = [json.loads(line) for line in f if line.endswith("\n")]
            return path, state, [r for r in rows if r.get("step", -1) <= state["step"]]
    return None


def first_row(state, logged, eval_interval):
    """(the run's first row to log, whether to evaluate it): step 0's (R0, always evaluated), a resumed step's
    whose row a crash kept from the log, or (None, False) when the log has it already."""
    if state is None:
        return dict(step=0, gpu_hours=0.0, flops=0.0, tokens=0), True
    if max((r.get("step", -1) for r in logged), default=-1) >= state["step"]:
        return None, False
    return dict(state["row"]), state["step"] % eval_interval == 0 or state["last"]


def fitted(key):
    """The log's keys the live fits follow: val_reward and val_reward_<domain>, not their standard errors."""
    return key.startswith("val_reward") and not key.endswith("_se")


def log_step(log, row, t_start):
    """The live scaling-law fits on validation steps (one per domain), the JSONL row, the human line."""
    for key in list(filter(fitted, row)):
        log.history[key].append((row["gpu_hours"], row[key]))
        try:  # live prediction: the same fit as `python fit_curve.py out/log.jsonl --y=KEY`
            fit = fit_sigmoid(*zip(*log.history[key]))
            suffix = key.removeprefix("val_reward")
            row.update({f"fit_A{suffix}": fit.A, f"fit_B{suffix}": fit.B, f"fit_C_mid{suffix}": fit.C_mid})
        except ValueError:
            pass  # fewer than 4 points past the early transient
    row["time"] = time.time() - t_start
    print(json.dumps(row), file=log.file, flush=True)  # flushed: fit_curve.py may read a live run
    if log.wandb:  # the same row on the dashboard (its numbers)
        log.wandb.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=row["step"])
    line = [f"step {row['step']}"] + ([f"reward {row['train_reward']:+.3f}", f"loss {row['loss']:.4f}"]
                                      if "train_reward" in row else [])
    if "val_reward" in row:
        se = f" ± {row['val_reward_se']:.3f}" if "val_reward_se" in row else ""  # over held-out prompts
        fit = f" (fit A {row['fit_A']:.3f})" if "fit_A" in row else ""
        line.append(f"val {row['val_reward']:.3f}{se}{fit}")
    line += [f"lag {row['policy_lag_mean']:.2f}"] if "policy_lag_mean" in row else []
    print(" | ".join(line + [f"{row.get('step_time', 0.0):.2f} s", f"{row['time']:.0f} s total"]), flush=True)


def open_run(out_dir, config, layout, n_params, isolation, logged):
    """The master's config.json and log.jsonl (mirrored to Weights & Biases with wandb_log)."""
    # A new run writes the header: the config, the model's size and, with code rewards, the sandbox's
    # isolation (printed too); a resumed one rewrites its rows `logged` (the lines after its checkpoint are a
    # crash's leftovers)
    header = dict(config=config, n_params=n_params, world=layout.world)
    if isolation:  # the isolation code rewards run under
        header["sandbox"] = isolation
        print("sandbox: " + "; ".join(f"{k} {v}" for k, v in isolation.items()), flush=True)
    mirror = None
    if config["wandb_log"]:  # imported only when on
        import wandb as mirror
        mirror.init(project=config["wandb_project"], name=config["wandb_run_name"] or None, config=config)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    rows = [header] if logged is None else logged  # a new run's log starts with its header
    path, history = os.path.join(out_dir, "log.jsonl"), defaultdict(list)
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(path + ".tmp", path)
    for r in rows:
        for key in filter(fitted, r):
            history[key].append((r["gpu_hours"], r[key]))
    return Log(open(path, "a"), history, mirror)


def count(counters, step, stats, generated, n_params, started, cpu_start, world):
    """A step into the run's counters -> its log row: each generated token counted once (~2N FLOPs a token
    generated, ~6N trained), the wall time of sampling and training since `started` (validation apart)."""
    counters["flops"] += 2 * n_params * generated + 6 * n_params * stats["trained_tokens"]
    counters["tokens"] += generated
    elapsed = time.time() - started  # read once: gpu_hours and step_time agree, even across a preemption
    counters["train_seconds"] += elapsed
    counters["cpu_seconds"] = time.process_time() - cpu_start  # validation included
    return dict(step=step, gpu_hours=counters["train_seconds"] * world / 3600, flops=counters["flops"],
                tokens=counters["tokens"], cpu_seconds=counters["cpu_seconds"], step_time=elapsed, **stats)


def save_run(out_dir, policy, task, layout, curriculum, rollouts, state):
    """The checkpoint: weights and optimizer, every rank's curriculum and its groups in flight, `state`."""
    from distributed import gather_objects
    share = dict(curriculum=curriculum.state_dict(), in_flight=rollouts.in_flight())
    shares = gather_objects(share) if layout.role == "data_parallel" else [share]
    save(out_dir, policy, task.tokenizer, dict(state, world=layout.world, shares=shares))


def save(out_dir, policy, tokenizer, state):
    """Every trainer calls it (full_state's gathers are collectives); the master writes ckpt.tmp, state.pt
    last (its presence marks a complete directory), and swaps it in."""
    weights, optimizer_state = full_state(policy)
    if weights is None:
        return
    tmp, final, old = (os.path.join(out_dir, d) for d in ("ckpt.tmp", "ckpt", "ckpt.old"))
    shutil.rmtree(tmp, ignore_errors=True)
    policy.model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save(optimizer_state, os.path.join(tmp, "optimizer.pt"))
    torch.save(state, os.path.join(tmp, "state.pt"))
    if os.path.isdir(final):  # a crash leaves either ckpt or ckpt.old complete, never a half-written ckpt
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
