"""
Benchmark (not a test): fp32 against bf16 compute for one model on this CPU, the trainer and the sampler
apart, measured side by side (interleaved, best of --repeats) with the ops that take the time:

    python benchmarks/cpu_dtypes.py --model_path=.cache/smollm2/model [--rows=32 --prompt_len=100
        --completion_len=150 --repeats=2 --threads=2 --dtypes=auto]

trainer: train.py's own step (fp32 masters and AdamW; compute in the dtype: the one-process bf16 copy; fp32
head) on a fixed batch of rows x (prompt_len + completion_len) tokens; sampler: sample.TorchSampler decoding
completion_len tokens for each row, on the trainer's compute module, as in one process.

First, in a second or two, a small matmul in each dtype, and whether this CPU has native bf16
(policy.native_bf16): without it (an AVX2 CPU) bf16 ran 4.5-100x slower than fp32, so --dtypes=auto
measures fp32 alone there and says so; --dtypes=float32,bfloat16 measures both anyway.
"""

import contextlib
import os
import random
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import configurator  # noqa: E402
from infra import distributed  # noqa: E402
import train  # noqa: E402
from infra.policy import resolve_dtype  # noqa: E402
from sample import TorchSampler  # noqa: E402
from scheduler import Completion, Group  # noqa: E402
from step_roofline import matmul_rate  # noqa: E402 (benchmarks/, this script's directory)


def batch(rows, prompt_len, completion_len, vocab, seed=0):
    rng = random.Random(seed)
    groups = []
    for p in range(max(1, rows // 8)):
        prompt = [rng.randrange(100, vocab) for _ in range(prompt_len)]
        completions = [Completion([rng.randrange(100, vocab) for _ in range(completion_len)], [-1.0] * completion_len,
                                  [0] * completion_len, [True] * completion_len, "eos") for _ in range(min(rows, 8))]
        groups.append(Group(p, prompt, completions, index=p, rewards=[1.0, -1.0] * (len(completions) // 2)))
    return groups


def measure(dtype, args, profiled=False):
    """-> (train step s, sampler tokens/s, the top ops of the step and of decoding)"""
    train.configure([f"--dtype={dtype}", "--micro_batch=16", "--lr=1e-6", "--warmup_steps=0"])
    layout = distributed.Layout(0, 1, "single", 1, 0, 0, torch.device("cpu"), None, None, None, None)
    policy = train.make_policy(train.current_config(), args["model_path"], layout)
    groups = batch(args["rows"], args["prompt_len"], args["completion_len"], policy.model.config.vocab_size)
    train.train_step(train.current_config(), policy, groups, 0, 0)  # warm
    profiler = lambda: profile(activities=[ProfilerActivity.CPU]) if profiled else contextlib.nullcontext()
    with profiler() as trainer_prof:
        started = time.perf_counter()
        train.train_step(train.current_config(), policy, groups, 1, 0)
        step_s = time.perf_counter() - started
    sampler = TorchSampler(policy.logprobs.model, temperature=1.0, max_seqs=args["rows"], seed=0, eos_ids=(),
                           think_budget=None, max_new_tokens=args["completion_len"])
    for g in groups:
        sampler.add(g.prompt_id, g.prompt_ids, len(g.completions))
    with profiler() as sampler_prof:
        tokens, started = 0, time.perf_counter()
        while sampler.num_unfinished:
            tokens += sampler.step()
            sampler.pop_finished()
        tokens_s = tokens / (time.perf_counter() - started)
    top = lambda prof: ", ".join(f"{e.key} {e.self_cpu_time_total / 1e6:.1f} s" for e in sorted(
        prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:4]) if profiled else ""
    return step_s, tokens_s, top(trainer_prof), top(sampler_prof)


if __name__ == "__main__":
    defaults = dict(model_path="", rows=32, prompt_len=100, completion_len=150, repeats=2, threads=2,
                    dtypes="auto")
    args = configurator.configure(defaults, sys.argv[1:], "benchmarks/cpu_dtypes.py",
                                  dict(rows=1, repeats=1, threads=1))
    torch.set_num_threads(args["threads"])
    # first, in a second or two: a small matmul in each dtype, and train.py's 'auto' here
    probe = {d: matmul_rate(256, 512, 512, getattr(torch, d), 20, seconds=0.5)
             for d in ("float32", "bfloat16")}
    fast, why = resolve_dtype("auto", "cpu")
    dtypes = ["float32", "bfloat16"] if fast == "bfloat16" else ["float32"]
    dtypes = args["dtypes"].split(",") if args["dtypes"] != "auto" else dtypes
    skipped = "" if "bfloat16" in dtypes else "; bf16 skipped (it would take several times fp32's " \
        "time), --dtypes=float32,bfloat16 measures it"
    print(f"a (256 x 512) @ (512 x 512) matmul: fp32 {probe['float32']:.0f} GFLOP/s, bf16 "
          f"{probe['bfloat16']:.0f} GFLOP/s; 'auto' is {fast} ({why}){skipped}", flush=True)
    results = {}
    for repeat in range(args["repeats"]):
        for dtype in dtypes:
            last = repeat == args["repeats"] - 1
            step_s, tokens_s, trainer_ops, sampler_ops = measure(dtype, args, profiled=last)
            print(f"{dtype}, repeat {repeat + 1}: a trainer step {step_s:.1f} s, the sampler "
                  f"{tokens_s:.0f} tokens/s", flush=True)
            best = results.get(dtype, (float("inf"), 0.0))
            results[dtype] = (min(best[0], step_s), max(best[1], tokens_s))
            if trainer_ops:
                print(f"{dtype}: trainer's top ops: {trainer_ops}\n{dtype}: sampler's top ops: {sampler_ops}", flush=True)
    if len(results) < 2:
        sys.exit(0)
    (f_step, f_tok), (b_step, b_tok) = results["float32"], results["bfloat16"]
    print(f"trainer step: fp32 {f_step:.1f} s, bf16 {b_step:.1f} s: bf16 takes {b_step / f_step:.2f}x the time")
    print(f"sampler: fp32 {f_tok:.0f} tokens/s, bf16 {b_tok:.0f} tokens/s: bf16 takes {f_tok / b_tok:.2f}x the time")
