"""A run's out_dir, written by the master and read back on resume: config.json; log.jsonl (README,
"The log": the contract with fit_curve.py), each row flushed; ckpt/, a Hugging Face model directory
(fp32 weights and the tokenizer: transformers and vLLM load it as it is) with optimizer.pt and
state.pt (step, counters, curriculum, the step's log row, the other files' sizes), written beside
the old one and swapped in. On resume the checkpoint is checked and the log cut back to its step: it
goes on with no gap and no duplicate. A write that fails (a full disk) ends the run in one line,
leaving the log's complete rows and the last complete checkpoint (README, "What survives what")."""

import json
import os
import shutil
import sys
import time
import zipfile
from collections import defaultdict, namedtuple
from contextlib import contextmanager, suppress

import torch
from safetensors import safe_open

import configurator
from fit_curve import fit_sigmoid
from infra.policy import full_state

class Log(namedtuple("Log", "file history wandb warned")):
    """The open log.jsonl; history: key -> [(gpu_hours, value)] for the live fits; wandb: the module
    or None; warned: warnings()' state."""

    def close(self):
        self.file.close()
        if self.wandb:
            self.wandb.finish()


def fail(message):
    configurator.fail("train.py", message)  # one line, exit 2


def first_line(error):
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"


@contextmanager
def writing(path, undo=lambda: None):
    """A write into out_dir/NAME. One that fails (a full disk, a lost mount: OSError, or torch's and
    safetensors' own errors) -> undo() (give the room back, cut a torn line), a line naming `path`,
    exit 1 at once (no clean-up: peers may hold collectives; they see the connection break)."""
    try:
        yield
    except Exception as e:
        with suppress(OSError):
            undo()
        out_dir = os.path.dirname(path)
        free = shutil.disk_usage(out_dir).free / 2**20
        kept = [d for d in ("ckpt", "ckpt.old")
                if os.path.isfile(os.path.join(out_dir, d, "state.pt"))]
        print(f"train.py: cannot write {path}: {first_line(e)} ({free:.1f} MiB free there); "
              "out_dir keeps the log's complete rows and its last complete checkpoint: "
              "make room, then " +
              ("run again with --init_from=resume" if kept else "start again (no checkpoint yet)"),
              file=sys.stderr, flush=True)
        os._exit(1)


def read_log(path):
    """log.jsonl -> (its rows, a torn last line: the text after the last newline, '' if none). A
    hard kill or a full disk may cut the last line short; a complete line that is not JSON: one line
    naming it, exit 2."""
    if not os.path.isfile(path):
        fail(f"{path}: missing: a checkpoint without its run's log cannot resume")
    with open(path) as f:
        lines = f.read().split("\n")
    rows = []
    for number, line in enumerate(lines[:-1], 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            fail(f"{path} line {number}: not a JSON row ({e.msg}): repair or delete the line")
    return rows, lines[-1]


def read_checkpoint(path):
    """A complete checkpoint directory's state.pt, its other files checked against the sizes it
    recorded and their headers and pickles read: one that is truncated or garbled -> one line naming
    it, exit 2. Bytes changed inside the tensors pass (no checksums: hashing an 8B model's
    checkpoint takes a minute)."""
    def read_pickle(file):  # torch.save's zip: its directory, and its pickle read, CRC-32 checked
        with zipfile.ZipFile(file) as z:
            z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))

    file = os.path.join(path, "state.pt")
    try:
        read_pickle(file)
        state = torch.load(file, weights_only=False)
        # (a checkpoint of an older train.py: none)
        for name, size in state.get("files", {}).items():
            file = os.path.join(path, name)
            if os.path.getsize(file) != size:
                raise ValueError(f"{os.path.getsize(file)} bytes, {size} when written")
            if name.endswith(".safetensors"):
                with safe_open(file, "pt") as weights:
                    weights.keys()
            elif name.endswith(".pt"):
                read_pickle(file)
    except Exception as e:
        fail(f"{file}: a damaged checkpoint file, truncated or garbled ({first_line(e)}); "
             "restore it or start again in another --out_dir")
    return state


def resume(out_dir):
    """-> (the checkpoint's directory, its state, the log's complete rows up to its step); None: no
    complete one (ckpt.old: a kill between the swap's two renames)."""
    for path in (os.path.join(out_dir, d) for d in ("ckpt", "ckpt.old")):
        if os.path.isfile(os.path.join(path, "state.pt")):
            state = read_checkpoint(path)
            rows, _ = read_log(os.path.join(out_dir, "log.jsonl"))
            return path, state, [r for r in rows if r.get("step", -1) <= state["step"]]
    return None


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
    """The paper's warnings, each once a sitting, on the console and in the row ('warning'), with
    what to do."""
    cut, lag0, c_mid = (row.get("truncation_rate", 0.0), row.get("logprob_mismatch_lag0"),
                        row.get("fit_C_mid"))
    if warned.get("mismatch_lag0") is None:  # the sitting's first figure
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


def open_run(out_dir, config, layout, n_params, isolation, logged):
    """The master's config.json and log.jsonl (mirrored to Weights & Biases with wandb_log)."""
    # A new run writes the header: the config, the model's size and, with code rewards, the
    # sandbox's isolation (printed too); a resumed one rewrites its rows `logged` (the lines after
    # its checkpoint are a crash's leftovers)
    header = dict(config=config, n_params=n_params, world=layout.world)
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


def count(counters, step, stats, generated, n_params, started, cpu_start, world):
    """A step into the run's counters -> its log row: each generated token counted once (~2N FLOPs a
    token generated, ~6N trained), the wall time of sampling and training since `started`
    (validation apart)."""
    counters["flops"] += 2 * n_params * generated + 6 * n_params * stats["trained_tokens"]
    counters["tokens"] += generated
    # read once: gpu_hours and step_time agree, even across a preemption
    elapsed = time.time() - started
    counters["train_seconds"] += elapsed
    counters["cpu_seconds"] = time.process_time() - cpu_start  # validation included
    return dict(step=step, gpu_hours=counters["train_seconds"] * world / 3600,
                flops=counters["flops"], tokens=counters["tokens"],
                cpu_seconds=counters["cpu_seconds"], step_time=elapsed, **stats)


def save_run(out_dir, policy, task, layout, curriculum, rollouts, state):
    """The checkpoint: weights and optimizer, every rank's curriculum and its groups in flight,
    `state`. The master's followers save with it (train.py's run_follower): full_state's gathers
    need every trainer."""
    from infra.distributed import gather_objects
    for rank in range(1, layout.trainers) if layout.role == "master" else ():
        layout.mailbox.send(rank, ("save",))
    share = dict(curriculum=curriculum.state_dict(), in_flight=rollouts.in_flight())
    shares = gather_objects(share) if layout.role == "data_parallel" else [share]
    save(out_dir, policy, task.tokenizer, dict(state, world=layout.world, shares=shares))


def save(out_dir, policy, tokenizer, state):
    """Every trainer calls it (full_state's gathers are collectives); the master writes ckpt.tmp,
    state.pt last (its presence marks a complete directory; it records the other files' sizes), and
    swaps it in."""
    weights, optimizer_state = full_state(policy)
    if weights is None:
        return
    tmp, final, old = (os.path.join(out_dir, d) for d in ("ckpt.tmp", "ckpt", "ckpt.old"))
    with writing(tmp, undo=lambda: shutil.rmtree(tmp, ignore_errors=True)):  # failed: its room back
        shutil.rmtree(tmp, ignore_errors=True)
        policy.model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        torch.save(optimizer_state, os.path.join(tmp, "optimizer.pt"))
        files = {name: os.path.getsize(os.path.join(tmp, name)) for name in os.listdir(tmp)}
        torch.save(dict(state, files=files), os.path.join(tmp, "state.pt"))
        # a crash leaves ckpt or ckpt.old complete, never a half-written ckpt
        if os.path.isdir(final):
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
