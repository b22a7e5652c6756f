"""
Benchmark (not a test): tokens/s of sample.TorchSampler (torch), the same sampler with the decode step as it was
before the grouped decode attention and the inverse-CDF draw (torch_before; every row runs to new_tokens, so the
rule for dropping ended rows does not enter), sample.VLLMSampler (vllm, when vLLM is installed) and transformers'
model.generate, on one tiny random Qwen2 or a real model, side by side in one run, as ratios:

    python benchmarks/samplers.py [--batch=64] [--new_tokens=64] [--prompt_len=16] [--repeats=3] [--device=cpu]
    python benchmarks/samplers.py --model_path=.cache/qwen_coder/model --dtype=bfloat16 --engines=torch,torch_before
"""

import os
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import configurator  # noqa: E402
import sample  # noqa: E402
from loss import token_logprobs  # noqa: E402
from sample import TorchSampler, VLLMSampler  # noqa: E402


@contextmanager
def decoding_as_before(model):
    """The decode step before the grouped decode attention and the inverse-CDF draw: sdpa, torch.multinomial."""
    draw = sample.sample_tokens
    model.set_attn_implementation("sdpa")
    sample.sample_tokens = lambda logprobs, generator: torch.multinomial(logprobs.exp(), 1, generator=generator)
    try:
        yield
    finally:
        sample.sample_tokens = draw
        model.set_attn_implementation("sdpa_decode")


def bench(batch=64, new_tokens=64, prompt_len=16, repeats=3, device="cpu", model_path="", dtype="float32",
          engines="generate,torch,torch_before,vllm"):
    """tokens/s of the `engines` on one tiny random Qwen2 (~1M parameters, fp32) or --model_path in --dtype,
    in one run, interleaved, best of `repeats` (shared machines are noisy), as ratios, and each sampler's
    max |sampler - trainer| log-prob gap (loss.token_logprobs). On a CPU shared with other jobs, set
    OMP_NUM_THREADS=1: OpenMP threads waiting on a busy core ran ~50x slower."""
    torch.manual_seed(0)
    if model_path:
        from transformers import AutoModelForCausalLM
        model, path = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).eval(), model_path
        config = model.config
    else:
        config = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=4, head_dim=32, tie_word_embeddings=False,
                             max_position_embeddings=1024)
        model = Qwen2ForCausalLM(config).eval()
        path = tempfile.mkdtemp()
        model.save_pretrained(path)
    model.to(device)
    prompts = torch.randint(2, config.vocab_size, (batch, prompt_len), device=device)  # (B, P)
    print(f"model {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params on {device}, batch {batch}, "
          f"{prompt_len} prompt + {new_tokens} new tokens, torch threads {torch.get_num_threads()}")
    knobs = dict(temperature=1.0, max_seqs=batch, think_budget=None, max_new_tokens=new_tokens)
    engines = engines.split(",")
    samplers = {name: TorchSampler(model, **knobs) for name in ("torch", "torch_before") if name in engines}
    try:
        engine_kwargs = dict(dtype=dtype, max_model_len=prompt_len + new_tokens, kv_cache_memory_bytes=1 << 30)
        if "vllm" in engines:
            samplers["vllm"] = VLLMSampler(path, engine_kwargs=engine_kwargs, **knobs)
    except ImportError as e:
        print(f"VLLMSampler skipped: {e}")

    def run_sampler(sampler, before=False):
        for i, prompt in enumerate(prompts.tolist()):
            sampler.add(i, prompt, 1)
        tokens, groups, t0 = 0, [], time.perf_counter()
        with decoding_as_before(model) if before else nullcontext():
            while sampler.num_unfinished:
                tokens += sampler.step()
                groups += sampler.pop_finished()
        return tokens / (time.perf_counter() - t0), groups

    def run_generate():
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, top_k=0,
                                 top_p=1.0, temperature=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
            out = out.cpu()  # waits for the device
        return (out.shape[0] * (out.shape[1] - prompt_len)) / (time.perf_counter() - t0), None

    speed, gaps = {}, {}
    for _ in range(repeats):
        runs = [("generate", run_generate)] if "generate" in engines else []
        for name, run in runs + [(k, lambda s=s, k=k: run_sampler(s, k == "torch_before")) for k, s in samplers.items()]:
            tokens_per_s, groups = run()
            speed.setdefault(name, []).append(tokens_per_s)
            for g in groups or []:
                c = g.completions[0]
                with torch.no_grad():
                    ref = token_logprobs(model, torch.tensor([g.prompt_ids + c.token_ids], device=device))
                gap = (torch.tensor(c.logprobs) - ref[0, prompt_len - 1:].cpu()).abs().max().item()
                gaps[name] = max(gaps.get(name, 0.0), gap)
    first = next(iter(speed))
    base = max(speed[first])
    for name, runs in speed.items():
        gap = f"   max |sampler - trainer| log-prob {gaps[name]:.1e}" if name in gaps else ""
        print(f"{name:13s} {max(runs):8.0f} tok/s  x{max(runs) / base:.2f} of {first}"
              f"  (runs: {', '.join(f'{r:.0f}' for r in runs)}){gap}")


if __name__ == "__main__":
    bench(**configurator.configure(dict(batch=64, new_tokens=64, prompt_len=16, repeats=3, device="cpu", model_path="",
                                        dtype="float32", engines="generate,torch,torch_before,vllm"), sys.argv[1:],
                                   "benchmarks/samplers.py", dict(batch=1, new_tokens=1, prompt_len=1, repeats=1,
                                                                  dtype=("float32", "bfloat16"))))
