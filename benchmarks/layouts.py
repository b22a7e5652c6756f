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
    """Run train.py, then read its log -> the step figures (steps 2..last; step 1 includes the first
    admission of prompts): s/step, trainer idle fraction, trainer tokens/s inside the training step,
    sampler tokens/s over the wall time, final val_reward."""
    subprocess.run(launcher + ["train.py", f"--out_dir={out_dir}", *args], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        header, *rows = [json.loads(line) for line in f]
    steps = [r for r in rows if r["step"] > 1]
    wall = (steps[-1]["gpu_hours"] - rows[1]["gpu_hours"]) * 3600 / header["world"]  # training wall time
    busy = sum(r["step_time"] for r in steps)
    return dict(per_step=wall / len(steps), idle=1 - busy / wall,
                trainer_tps=sum(r["trained_tokens"] for r in steps) / busy,
                sampler_tps=(steps[-1]["tokens"] - rows[1]["tokens"]) / wall, val=rows[-1].get("val_reward"))


if __name__ == "__main__":
    args = ["--max_steps=60", "--eval_interval=1000", "--n_val=40", "--eval_samples=4"] + sys.argv[1:]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    with tempfile.TemporaryDirectory() as tmp:
        one = run(os.path.join(tmp, "one"), [sys.executable], args)
        two = run(os.path.join(tmp, "two"), torchrun, args + ["--n_samplers=1"])
    print(f"{'layout':28s} {'s / step':>9s} {'trainer idle':>13s} {'final val':>10s}")
    for name, r in [("1 process (time-shared)", one), ("1 trainer + 1 sampler rank", two)]:
        print(f"{name:28s} {r['per_step']:9.3f} {r['idle']:13.1%} {r['val']:10.3f}")
    print(f"step time ratio (2 processes / 1): {two['per_step'] / one['per_step']:.2f}; "
          f"trainer idle: {one['idle']:.1%} -> {two['idle']:.1%}")
