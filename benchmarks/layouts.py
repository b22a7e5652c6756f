"""
Benchmark (not a test): one process, where the sampler and the trainer take turns, against
1 trainer + 1 sampler rank under torchrun (gloo), on the same config, back to back:

    python benchmarks/layouts.py [--max_steps=60] [any train.py --key=value]

For each layout it prints the wall time per training step (validation excluded) and the trainer's
idle fraction: 1 - (time inside the training step) / (wall time), from the runs' log.jsonl.
"""

import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(out_dir, launcher, args):
    subprocess.run(launcher + ["train.py", f"--out_dir={out_dir}", *args], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        rows = [json.loads(line) for line in f][1:]
    world = [json.loads(line) for line in open(os.path.join(out_dir, "log.jsonl"))][0]["world"]
    steps = [r for r in rows if r["step"] > 1]  # step 1 includes the first admission of prompts
    wall = (steps[-1]["gpu_hours"] - rows[1]["gpu_hours"]) * 3600 / world  # training wall time
    busy = sum(r["step_time"] for r in steps)
    return wall / len(steps), 1 - busy / wall, rows[-1].get("val_reward")


if __name__ == "__main__":
    args = ["--max_steps=60", "--eval_interval=1000", "--n_val=40", "--eval_samples=4"] + sys.argv[1:]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    with tempfile.TemporaryDirectory() as tmp:
        one = run(os.path.join(tmp, "one"), [sys.executable], args)
        two = run(os.path.join(tmp, "two"), torchrun, args + ["--n_samplers=1"])
    print(f"{'layout':28s} {'s / step':>9s} {'trainer idle':>13s} {'final val':>10s}")
    for name, (per_step, idle, val) in [("1 process (time-shared)", one), ("1 trainer + 1 sampler rank", two)]:
        print(f"{name:28s} {per_step:9.3f} {idle:13.1%} {val:10.3f}")
    print(f"step time ratio (2 processes / 1): {two[0] / one[0]:.2f}; trainer idle: {one[1]:.1%} -> {two[1]:.1%}")
