"""The run's log and its compute axis. log.jsonl is the contract with fit_curve.py (docs/log.md):
one JSON row per optimizer step, flushed, validation figures on evaluated steps; beside it the console
line, the live fit of the scaling law on every validation, and the paper's warnings. The compute
axis C the law is fitted on is counted here (`count`): gpu_hours (wall hours of sampling and
training, times the processes) and flops (~2N a token generated, ~6N a token trained; with LoRA
~4N + 6N_adapter, no weight gradients for the frozen base). The master
writes it; infra/checkpoint.py cuts it back to a checkpoint's step on resume, so it goes on with no
gap and no duplicate."""

import json
import math
import os
import sys
import time
from collections import defaultdict, namedtuple
from contextlib import suppress

from fit_curve import fit_sigmoid, read_records
from infra import checkpoint
from infra.checkpoint import writing


class Run:
    """One process's run on the compute axis: the counters a checkpoint carries, the step's row and
    whether it is logged and evaluated yet, and the open log (the master's; None on the other
    ranks)."""

    def __init__(self, state, logged, config, layout, sizes, isolation=None):
        """state, logged: log.resume's (None, None: a new run); sizes: the base model's parameters
        and the LoRA adapters'; isolation: what code rewards run under (the master's log header)."""
        n_params, n_adapter = sizes
        log = open_run(config, layout, n_params, isolation, logged) if layout.rank == 0 else None
        eval_interval, world = config["eval_interval"], layout.world
        self.step, self.resumed = (state["step"], True) if state else (0, False)  # where it starts
        self.counters = state["counters"] if state else dict(train_seconds=0.0, flops=0.0, tokens=0)
        self.n_params, self.n_adapter, self.world, self.log = n_params, n_adapter, world, log
        # the run's start, and its first training segment's
        self.t_start = self.segment_start = time.time()
        # this process's CPU time, validation included, a resumed run's earlier time too
        self.cpu_start = time.process_time() - self.counters.get("cpu_seconds", 0.0)
        # tokens decoded since a step last counted them (exact_resume: the drain's, checkpointed)
        self.generated = state.get("generated", 0) if state else 0
        row, self.evaluate = first_row(state, logged, eval_interval)
        self.unlogged, self.row = row is not None, row or state["row"]

    def count(self, step, stats, evaluate):
        """A training step done: its row (the compute axis moved on), to be logged, evaluated or
        not."""
        self.row = count(self.counters, step, stats, self.generated, self.n_params,
                         self.segment_start, self.cpu_start, self.world, self.n_adapter)
        self.unlogged, self.generated, self.evaluate = True, 0, evaluate

    def write(self):
        """The step's row to log.jsonl and the console (the master's); the next training segment
        starts: validation and checkpoints are not training compute."""
        if self.log:
            log_step(self.log, self.row, self.t_start)
        self.unlogged = False
        self.segment_start = time.time()

    def seconds(self):
        return time.time() - self.t_start

    def close(self):
        if self.log:
            self.log.close()


class Log(namedtuple("Log", "file history wandb warned")):
    """The open log.jsonl; history: key -> [(gpu_hours, value)] for the live fits; wandb: the module
    or None; warned: warnings()' state."""

    def close(self):
        self.file.close()
        if self.wandb:
            self.wandb.finish()


def first_row(state, logged, eval_interval):
    """(the run's first row to log, whether to evaluate it): step 0's (R0, always evaluated), a
    resumed step's whose row a crash kept from the log, or (None, False) when the log has it
    already."""
    if state is None:
        return dict(step=0, gpu_hours=0.0, flops=0.0, tokens=0), True
    if max((r.get("step", -1) for r in logged), default=-1) >= state["step"]:
        return None, False
    return dict(state["row"]), state["step"] % eval_interval == 0 or state["last"]


def follow(history, row):
    """A row's points for the live fits (val_reward and val_reward_<domain>, not their standard
    errors) added to `history` -> their keys."""
    keys = [k for k in row if k.startswith("val_reward") and not k.endswith("_se")]
    for key in keys:
        history[key].append((row["gpu_hours"], row[key]))
    return keys


def log_step(log, row, t_start):
    """The live scaling-law fits on validation steps (one per domain), the JSONL row, the human
    line."""
    for key in follow(log.history, row):
        # live prediction: the same fit as `python fit_curve.py out/log.jsonl --y=KEY`
        with suppress(ValueError):  # fewer than 4 points past the early transient
            fit = fit_sigmoid(*zip(*log.history[key]))
            row.update({f"fit_{k}{key.removeprefix('val_reward')}": getattr(fit, k)
                        for k in ("A", "B", "C_mid")})
    row["time"] = time.time() - t_start
    warnings(log.warned, row)
    path = log.file.name
    # a failed write is cut back to here: the log keeps complete rows only
    end = os.path.getsize(path)
    with writing(path, undo=lambda: os.truncate(path, end)):
        # flushed: fit_curve.py may read a live run
        print(json.dumps(row), file=log.file, flush=True)
    if log.wandb:  # the same row on the dashboard (its numbers)
        log.wandb.log({k: v for k, v in row.items() if isinstance(v, (int, float))},
                      step=row["step"])
    line = [f"step {row['step']}"] + ([f"reward {row['train_reward']:+.3f}",
                                       f"loss {row['loss']:.4f}"] if "train_reward" in row else [])
    if "val_reward" in row:
        # over held-out prompts
        se = f" ± {row['val_reward_se']:.3f}" if "val_reward_se" in row else ""
        fit = f" (fit A {row['fit_A']:.3f})" if "fit_A" in row else ""
        line.append(f"val {row['val_reward']:.3f}{se}{fit}")
    line += [f"lag {row['policy_lag_mean']:.2f}"] if "policy_lag_mean" in row else []
    print(" | ".join(line + [f"{row.get('step_time', 0.0):.2f} s", f"{row['time']:.0f} s total"]),
          flush=True)


def warnings(warned, row):
    """The paper's warnings, each once per start of train.py, on the console and in the row ('warning'), with
    what to do."""
    cut, lag0, c_mid = (row.get("truncation_rate", 0.0), row.get("logprob_mismatch_lag0"),
                        row.get("fit_C_mid"))
    if warned.get("mismatch_lag0") is None:  # this start's first figure
        warned["mismatch_lag0"] = lag0
    first = warned["mismatch_lag0"]
    found = {
        "truncation": cut > warned["limit"] and
        f"truncation rate {cut:.0%} > warn_truncation={warned['limit']}: the paper saw instability "
        "past 10-15%; raise think_budget_max or lower lr",
        "mismatch": lag0 is not None and first is not None and lag0 > 5 * max(first, 1e-3) and
        f"sampler/trainer mismatch at lag 0 {lag0:.3g}, over 5x its first {first:.3g}: check that "
        "the weights reach the samplers, fp32_head and sampler_dtype",
        "extrapolation": c_mid is not None and c_mid > row["gpu_hours"] and
        f"the live fit's C_mid {c_mid:.3g} lies beyond the data ({row['gpu_hours']:.3g} "
        "gpu_hours): its A is an extrapolation; trust it once C_mid is inside the run"}
    new = [message for key, message in found.items() if message and not warned.get(key)]
    warned.update({key: warned.get(key) or bool(message) for key, message in found.items()})
    for message in new:
        print(f"warning: {message}", flush=True)
    if new:
        row["warning"] = "; ".join(new)


def read_log(path):
    """log.jsonl -> (its rows, a torn last line: the text after the last newline that is not a row,
    '' if none: a hard kill or a full disk may cut it short). A complete line that is not JSON, or
    no log: ValueError, one line naming it."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: missing: a checkpoint without its run's log cannot resume")
    try:  # fit_curve's reader: every line a JSON object, a half-written last line left out
        records = read_records(path)
    except ValueError as e:
        raise ValueError(f"{path} {e}: repair or delete the line") from None
    with open(path) as f:
        text = f.read()
    tail = text[text.rfind("\n") + 1:]
    read_tail = records and records[-1][0] == text.count("\n") + 1
    return [record for _, record in records], "" if read_tail else tail


def resume(out_dir):
    """-> (the checkpoint's directory, its state, the log's complete rows up to its step); None: no
    complete checkpoint. A damaged checkpoint or log: ValueError, one line naming it."""
    if (path := checkpoint.latest(out_dir)) is None:
        return None
    state = checkpoint.read_checkpoint(path)
    rows, _ = read_log(os.path.join(out_dir, "log.jsonl"))
    return path, state, [r for r in rows if r.get("step", -1) <= state["step"]]


def open_run(config, layout, n_params, isolation, logged):
    """The master's config.json and log.jsonl (mirrored to Weights & Biases with wandb_log)."""
    # A new run writes the header: the config, the model's size and, with code rewards, the
    # sandbox's isolation (printed too); a resumed one rewrites its rows `logged` (the lines after
    # its checkpoint are a crash's leftovers)
    out_dir, header = config["out_dir"], dict(config=config, n_params=n_params, world=layout.world)
    if isolation:  # the isolation code rewards run under
        header["sandbox"] = isolation
        print("sandbox: " + "; ".join(f"{k} {v}" for k, v in isolation.items()), flush=True)
    mirror = None
    if config["wandb_log"]:  # imported only when on
        import wandb as mirror
        mirror.init(project=config["wandb_project"], name=config["wandb_run_name"] or None,
                    config=config)
    rows = [header] if logged is None else logged  # a new run's log starts with its header
    path, history = os.path.join(out_dir, "log.jsonl"), defaultdict(list)
    torn = read_log(path)[1] if logged is not None else ""
    # repaired: the row comes again (its step is past the checkpoint's, or the checkpoint's own)
    if torn:
        after = f"step {rows[-1]['step']}" if rows and "step" in rows[-1] else "its header"
        print(f"train.py: {path}: dropped its torn last line ({len(torn)} characters without a "
              f"newline: a write cut short); the log goes on after {after}",
              file=sys.stderr, flush=True)
    with writing(path):
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(config, f, indent=1)
        with open(path + ".tmp", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        os.replace(path + ".tmp", path)
    for r in rows:
        follow(history, r)
    return Log(open(path, "a"), history, mirror, dict(limit=config.get("warn_truncation", 0.15)))


def count(counters, step, stats, generated, n_params, started, cpu_start, world, n_adapter=0):
    """A step into the run's counters -> its log row: each generated token counted once (~2N FLOPs a
    token generated, ~6N trained), the wall time of sampling and training since `started`
    (validation apart)."""
    # LoRA (n_adapter: the adapters' parameters): the forward and the activations' gradients through
    # base and adapters, weight gradients for the adapters only; the samplers decode merged
    trained = 4 * n_params + 6 * n_adapter if n_adapter else 6 * n_params
    counters["flops"] += 2 * n_params * generated + trained * stats["trained_tokens"]
    counters["tokens"] += generated
    # read once: gpu_hours and step_time agree, even across a preemption
    elapsed = time.time() - started
    counters["train_seconds"] += elapsed
    counters["cpu_seconds"] = time.process_time() - cpu_start  # validation included
    return dict(step=step, gpu_hours=counters["train_seconds"] * world / 3600,
                flops=counters["flops"], tokens=counters["tokens"],
                cpu_seconds=counters["cpu_seconds"], step_time=elapsed, **stats)


def batch_figures(groups, scores, step, lr, train_truncated):
    """A batch's figures before any learning, for the log: rewards, the step's learning rate,
    lengths, cuts, interruptions, PipelineRL's lag (the trainer holds version `step`), in-flight
    updates."""
    completions = [c for g in groups for c in g.completions]
    n = len(completions)
    truncated = sum(c.finish_reason == "truncated" for c in completions)
    lags = [step - v for c in completions for v in c.versions]
    return dict(
        train_reward=scores.mean().item(),
        train_pass_rate=(scores > 0).float().mean().item(),
        lr=lr, truncation_rate=truncated / n,
        truncated_excluded=0 if train_truncated else truncated,
        interruption_rate=sum(c.interrupted for c in completions) / n,
        completion_tokens=sum(len(c.token_ids) for c in completions),
        policy_lag_mean=sum(lags) / len(lags), policy_lag_max=max(lags),
        # completions that received new weights mid-sequence
        inflight_update_frac=sum(len(set(c.versions)) > 1 for c in completions) / n)


# -----------------------------------------------------------------------------
# validation's figures


def pass_at_k(n, c, k):
    """Unbiased pass@k from n samples of which c passed:
    1 - C(n - c, k) / C(n, k) (Chen et al. 2021)."""
    return 1.0 if n - c < k else 1.0 - math.prod(1 - k / i for i in range(n - c + 1, n + 1))


def validation(prompts, groups, eval_samples, domains, started, reduce=None):
    """Scored held-out groups (one of `prompts` each) -> the log's validation figures: val_reward
    (mean@n), its standard errors, pass@k (k = 1, 2, 4, ..., n = eval_samples), per domain too when
    there are several; `reduce` sums the counts over data-parallel ranks (each evaluated its
    share)."""
    # sums over samples and prompts, overall and per domain: the same keys on every rank
    # 1, 2, 4, ..., n
    ks = sorted({2 ** i for i in range(eval_samples.bit_length())} | {eval_samples})
    kinds = ("correct", "total", "prompts", "squares", "binomial", "truncated", "tokens",
             *(f"pass@{k}" for k in ks))
    names = ["", *(f"_{d}" for d in domains)]
    counts = {kind + d: 0.0 for kind in kinds for d in names}
    for prompt, g in zip(prompts, groups):
        n, c = len(g.rewards), sum(r > 0 for r in g.rewards)
        # squares: for the standard error over prompts; binomial: p (1 - p) / n, the
        # sampling's share
        # the completions cut at the length limit, and all their tokens
        truncated = sum(done.finish_reason == "truncated" for done in g.completions)
        tokens = sum(len(done.token_ids) for done in g.completions)
        figures = (c, n, 1, (c / n) ** 2, c * (n - c) / n ** 2 / n, truncated, tokens,
                   *(pass_at_k(n, c, k) for k in ks))
        for d in ("", f"_{prompt.domain}"):
            for kind, x in zip(kinds, figures):
                counts[kind + d] += x
    if reduce:
        counts = reduce(counts)
    mean = counts["correct"] / counts["total"]
    # the prompts' pass rates' variance
    spread = max(counts["squares"] / counts["prompts"] - mean ** 2, 0.0)
    # val_reward_se: the spread between prompts (a new draw of prompts); val_sampling_se: the
    # samples' own error
    # on these prompts (what separates points of one run, which share them), sqrt(sum p(1-p)/k) / n
    result = {"val_reward": mean, "val_reward_se": (spread / counts["prompts"]) ** 0.5,
              "val_seconds": time.time() - started}
    for d in names if len(domains) > 1 else [""]:
        # overall and per domain; none named val_reward_*: `follow` reads those as domains' curves
        total = max(counts[f"total{d}"], 1)
        n_prompts = max(counts[f"prompts{d}"], 1)
        result[f"val_sampling_se{d}"] = counts[f"binomial{d}"] ** 0.5 / n_prompts
        # per completion: the share cut at the length limit, the mean length
        result[f"val_truncation_rate{d}"] = counts[f"truncated{d}"] / total
        result[f"val_completion_tokens{d}"] = counts[f"tokens{d}"] / total
        if d:
            result[f"val_reward{d}"] = counts[f"correct{d}"] / total
        for k in ks:  # unbiased pass@k from the same samples (Chen et al. 2021), as peers log it
            result[f"val_pass@{k}{d}"] = counts[f"pass@{k}{d}"] / n_prompts
    return result
