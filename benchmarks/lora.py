"""
Benchmark (not a test): full fine-tuning against LoRA on one model and this CPU, side by side, each in a process
of its own (so that each peak resident memory is its own):

    python benchmarks/lora.py --model_path=.cache/qwen_coder/model [--ranks="8 32" --rows=16 --prompt_len=150
        --completion_len=150 --decode_rows=64 --decode_tokens=32 --dtype=auto]

For each set-up (lora_rank 0, then each of --ranks; every linear layer of the blocks), train.py's own pieces:
  train step   s of train.train_step on a fixed batch of rows x (prompt_len + completion_len) tokens (the second
               step: the first warms up), micro-batches of 4 rows
  push         s of policy.push_weights into the torch sampler (full: nothing to copy when the sampler decodes
               with the trainer's own compute module, push_shared); bytes a push to a sampler rank or to vLLM
               carries (full: every weight; LoRA: the adapted weights, merged in fp32, cast)
  decode       tokens/s of sample.TorchSampler, decode_rows rows of decode_tokens tokens
  checkpoint   bytes of checkpoint.save's directory (weights or adapter, AdamW's state, the tokenizer)
  peak RSS     the process's peak resident memory (VmHWM) over all of it
then one table with each figure's ratio to full fine-tuning's.
"""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import configurator  # noqa: E402

DEFAULTS = dict(model_path="", ranks="8 32", rows=16, prompt_len=150, completion_len=150, decode_rows=64,
                decode_tokens=32, dtype="auto", lr=1e-5, one=-1)  # one: a set-up's rank, in its own process


def one(args, rank):
    """One set-up in this process -> its figures (a JSON line)."""
    import data
    import train
    from infra import checkpoint, distributed, policy as P
    from sample import TorchSampler
    from scheduler import Completion, Group
    train.configure([f"--dtype={args['dtype']}", f"--lora_rank={rank}", "--micro_batch=4",
                     f"--lr={args['lr'] * (10 if rank else 1)}", "--warmup_steps=0", "--sampler_dtype=auto"])
    train.dtype = P.resolve_dtype(train.dtype, "cpu")[0]
    train.sampler_dtype = P.resolve_dtype(train.sampler_dtype, "cpu")[0]
    layout = distributed.Layout(0, 1, "single", 1, 0, 0, torch.device("cpu"), None, None, None, None)
    started = time.perf_counter()
    policy = train.make_policy(train.current_config(), args["model_path"], layout)
    dtype = getattr(torch, train.sampler_dtype)
    sampler = TorchSampler(P.sampler_module(policy, dtype), max_seqs=args["decode_rows"], seed=0, eos_ids=(),
                           max_new_tokens=args["decode_tokens"])
    load_s = time.perf_counter() - started
    rng, vocab = random.Random(0), policy.model.config.vocab_size
    tokens = lambda n: [rng.randrange(100, vocab) for _ in range(n)]
    n = args["completion_len"]
    groups = [Group(p, tokens(args["prompt_len"]), [Completion(tokens(n), [-1.0] * n, [0] * n, [True] * n, "eos")
                                                     for _ in range(8)], index=p, rewards=[1.0, -1.0] * 4)
              for p in range(max(1, args["rows"] // 8))]
    figures = dict(lora_rank=rank, load_s=load_s,
                   trained_params=sum(p.numel() for p in policy.model.parameters() if p.requires_grad))
    for step in range(2):
        started = time.perf_counter()
        stats = train.train_step(train.current_config(), policy, groups, step, 0)
        figures["train_step_s"] = time.perf_counter() - started
    assert "skipped" not in stats, stats
    plan = P.weight_plan(policy.model, 1 << 30, dtype)
    pushed = sum(torch.Size(shape).numel() for bucket in plan for _, shape in bucket) * (torch.finfo(dtype).bits // 8)
    shared = sampler.model is policy.logprobs.model
    started = time.perf_counter()
    P.push_weights(policy, sampler, 2, dtype, 1 << 30)
    figures.update(push_s=time.perf_counter() - started, push_bytes=pushed, push_shared=shared)
    for i in range(args["decode_rows"] // 8):
        sampler.add(i, tokens(args["prompt_len"]), 8)
    started, decoded = time.perf_counter(), 0
    while sampler.num_unfinished:
        decoded += sampler.step()
        sampler.pop_finished()
    figures["decode_tokens_per_s"] = decoded / (time.perf_counter() - started)
    out = tempfile.mkdtemp()
    try:
        checkpoint.save(out, policy, data.load_tokenizer(args["model_path"]), dict(step=2))
        figures["checkpoint_bytes"] = sum(os.path.getsize(os.path.join(out, "ckpt", f))
                                          for f in os.listdir(os.path.join(out, "ckpt")))
    finally:
        shutil.rmtree(out)
    status = open("/proc/self/status").read()
    figures["peak_rss_gib"] = int(status.split("VmHWM:")[1].split()[0]) / 2**20
    return figures


if __name__ == "__main__":
    args = configurator.configure(DEFAULTS, sys.argv[1:], "benchmarks/lora.py")
    if args["one"] >= 0:
        print(json.dumps(one(args, args["one"])), flush=True)
        sys.exit(0)
    if not os.path.isdir(args["model_path"]):
        configurator.fail("benchmarks/lora.py", f"model_path={args['model_path']!r}: no such directory")
    results = []
    for rank in [0] + [int(r) for r in str(args["ranks"]).split()]:
        cmd = [sys.executable, __file__, *sys.argv[1:], f"--one={rank}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"benchmarks/lora.py: lora_rank={rank} failed: {done.stderr.strip().splitlines()[-1]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    full = results[0]
    keys = ("trained_params", "train_step_s", "push_s", "push_bytes", "decode_tokens_per_s", "checkpoint_bytes",
            "peak_rss_gib")
    print("| set-up | " + " | ".join(keys) + " |\n|" + "---|" * (len(keys) + 1))
    for r in results:
        cell = lambda k: f"{r[k]:.3g}" + (f" ({r[k] / full[k]:.2f}x)" if r is not full and full[k] else "")
        print(f"| {'full' if not r['lora_rank'] else 'LoRA r=' + str(r['lora_rank'])} | "
              + " | ".join(cell(k) for k in keys) + " |")
