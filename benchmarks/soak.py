"""
Benchmark (not a test): a long run's memory and step time, sampled as it goes. Runs train.py with
the arguments given (or, with --attach=PID, watches a run started otherwise), samples the resident memory of
its whole process tree (the trainer, the sandbox's and math-verify's workers, sampler ranks; not a fork of the
trainer before its exec) every --every seconds and reads each step's time from the run's log.jsonl; at the end
prints the growth per hour of both, fitted by least squares over the steps after the first (the pipeline's
fill is not its steady state):

    python benchmarks/soak.py config/qwen_gsm8k_cpu.py --out_dir=/root/runs/soak --max_minutes=55
    python benchmarks/soak.py --attach=12345 --out_dir=/root/runs/soak --every=10

A run stopped by SIGTERM to train.py (exit 75: checkpointed) is measured as one that finished.
Writes out_dir/soak.jsonl (soak-PID.jsonl when attached; one row a sample: seconds, GiB of the tree, the step
in progress: the log's last + 1) and prints, per step: its time and the tree's peak during it (its
validation included).
"""
import json
import os
import subprocess
import sys
import time

import numpy as np


def tree_memory(pid):
    """Resident bytes of a process and its descendants (Linux /proc). A child forked and not yet exec'd
    shares the trainer's pages: it is left out, or a 15 GiB trainer would count twice at every fork (the
    sandbox forked the trainer for every program until it started them from a fresh interpreter)."""
    children, cmdline, total = {}, {}, 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline[int(entry)] = f.read()
                children.setdefault(parent, []).append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    todo = [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        if p != pid and cmdline.get(p) == cmdline.get(pid):
            continue  # a fork of the trainer on its way to an exec
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            pass  # gone meanwhile
    return total


def read_steps(path):
    """The log's training rows so far: [(step, time, step_time)]; a torn last line is left for later."""
    rows = []
    with open(path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break
            if "step_time" in row:
                rows.append((row["step"], row["time"], row["step_time"]))
    return rows


def per_hour(x_seconds, y):
    """Least-squares slope of y against time, per hour, and y's mean: (slope, mean)."""
    slope = np.polyfit(np.asarray(x_seconds) / 3600, np.asarray(y), 1)[0]
    return slope, float(np.mean(y))


if __name__ == "__main__":
    every = 5.0
    options = {a.split("=")[0]: a.split("=", 1)[1] for a in sys.argv[1:]
               if a.startswith(("--every=", "--attach="))}
    args = [a for a in sys.argv[1:] if a.split("=")[0] not in options]
    every, attach = float(options.get("--every", every)), int(options.get("--attach", 0))
    out_dir = next((a.split("=", 1)[1] for a in args if a.startswith("--out_dir=")), None)
    if out_dir is None:
        sys.exit("benchmarks/soak.py: give --out_dir=DIR (the run's, where soak.jsonl goes beside log.jsonl)")
    os.makedirs(out_dir, exist_ok=True)
    log_path = os.path.join(out_dir, "log.jsonl")
    start = time.time()
    if attach:  # a run started otherwise: its process id, and its --out_dir for the log
        pid, returncode = attach, lambda: None if os.path.exists(f"/proc/{attach}") else 0
    else:
        run = subprocess.Popen([sys.executable, "train.py", *args],
                               cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        pid, returncode = run.pid, run.poll
    samples, printed = [], 0
    with open(os.path.join(out_dir, f"soak-{pid}.jsonl" if attach else "soak.jsonl"), "w") as soak:
        while returncode() is None:
            time.sleep(every)
            steps = read_steps(log_path) if os.path.exists(log_path) else []
            running = steps[-1][0] + 1 if steps else 1
            samples.append((time.time() - start, tree_memory(pid) / 2 ** 30, running))
            soak.write(json.dumps(dict(zip(("seconds", "rss_gib", "step"), samples[-1]))) + "\n")
            soak.flush()
            for step, t, step_time in steps[printed:]:
                peak = max((r for _, r, s in samples if s == step), default=float("nan"))
                print(f"soak: step {step}: {step_time:.0f} s, the tree's peak {peak:.2f} GiB", flush=True)
            printed = len(steps)
    steps = read_steps(log_path)
    if returncode() not in (0, 75) or len(steps) < 3:  # 75: stopped by a signal, resumable (train.py)
        sys.exit(f"benchmarks/soak.py: train.py exited {returncode()} after {len(steps)} steps: "
                 "too few to fit a growth")
    first_end = next((s for s, _, k in samples if k > steps[0][0]), samples[0][0])  # the first step done
    after = [(s, r) for s, r, _ in samples if s >= first_end]
    rss_slope, rss_mean = per_hour([s for s, _ in after], [r for _, r in after])
    # the tree's peak during each step: growth across steps, not within one
    peaks = [(t, max(r for _, r, k in samples if k == step)) for step, t, _ in steps[1:]
             if any(k == step for *_, k in samples)]
    end_slope, end_mean = per_hour(*zip(*peaks))
    time_slope, time_mean = per_hour([t for _, t, _ in steps[1:]], [st for _, _, st in steps[1:]])
    print(f"soak: {len(steps)} steps in {(time.time() - start) / 60:.1f} minutes; after step {steps[0][0]}:")
    print(f"  resident memory of the tree, every {every:.0f} s: mean {rss_mean:.2f} GiB, "
          f"{rss_slope:+.3f} GiB an hour ({rss_slope / rss_mean:+.1%} an hour)")
    print(f"  ... its peak within each step: mean {end_mean:.2f} GiB, {end_slope:+.3f} GiB an hour "
          f"({end_slope / end_mean:+.1%} an hour)")
    print(f"  step time: mean {time_mean:.0f} s, {time_slope:+.1f} s an hour ({time_slope / time_mean:+.1%} "
          "an hour)")
