"""
Benchmark (not a test): one training step of train.py's own code and one sampler decode step on this CPU, part by
part, against what the machine can do (its measured matmul peak and memory bandwidth):

    python benchmarks/step_roofline.py --model_path=.cache/smollm2/model --rows=128 --prompt_len=80 --completion_len=32
    python benchmarks/step_roofline.py --model_path=.cache/qwen_coder/model --rows=8 --prompt_len=120 --completion_len=300
    python benchmarks/step_roofline.py --shape=qwen0.5b ...    # a random model of that shape (smollm2 | qwen0.5b)

A 0.5B model's step holds its fp32 weights, gradients and AdamW's moments (~8 GB) and every row's activations:
on a 24 GB machine --rows=8 runs, and --rows=32 (with --shape=qwen0.5b) was killed by the kernel at 24 GB resident.

The step: train.train_step on made-up groups of rows x (prompt_len + completion_len) tokens (fp32
masters and AdamW, compute in --dtype, the fp32 head, the config's micro-batches), profiled; every
op is put in a part (body, attention, head, optimizer, the bf16 copy's upkeep) and a phase (forward,
backward: which holds the recompute of the checkpointed head). Per part: seconds, FLOPs, GFLOP/s and
the share of the compute dtype's matmul peak at the model's shapes. The sampler: one decode step of
sample.TorchSampler for `rows` sequences at the batch's context, its tokens/s against the
memory-bandwidth bound (the weights and the KV cache read once a step). One JSON line at the end.

--dtype=auto (the default) is train.py's: bf16 only where this CPU has native bf16
(policy.resolve_dtype). Each dtype's matmul peak is probed on a small matmul first and measured at
the model's shapes only if that takes seconds, not minutes: without native bf16, a bf16 matmul ran
at ~1 GFLOP/s on an AVX2 CPU.

--variants measures ways of computing the same step side by side, interleaved, best of --repeats each:
  head=now|before    a bf16 model's fp32 head: head.py's (_HeadLogprobs: oneDNN's bf16 products summed in
                     fp32, one pass over the logits each way), or as before this round (before_logprobs)
  attn=sdpa|eager    the attention kernel of the compute copy (transformers' attn_implementation)
  adamw=fused|foreach  AdamW's kernel (a CPU's unsharded policy: fused, policy.load_policy)
  upkeep=now|before  the bf16 copy's gradients into the fp32 ones: through a scratch buffer, or a mixed add_
e.g. --variants=head=now,head=before,attn=eager
"""

import json
import os
import random
import sys
import tempfile
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import configurator  # noqa: E402
from infra import distributed  # noqa: E402
import head  # noqa: E402
import train  # noqa: E402
from infra.policy import resolve_dtype  # noqa: E402
from sample import TorchSampler  # noqa: E402
from scheduler import Completion, Group  # noqa: E402

SHAPES = dict(smollm2=dict(model_type="llama", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                           num_key_value_heads=3, intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True),
              qwen0_5b=dict(model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                            num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                            tie_word_embeddings=False))
ATTENTION_OPS = ("scaled_dot_product", "flash_attention", "_efficient_attention")
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm")


def model_dir(args):
    """A model directory: --model_path, or a random model of --shape saved once into a temporary directory."""
    if args["model_path"]:
        return args["model_path"]
    from transformers import AutoConfig, AutoModelForCausalLM
    shape = dict(SHAPES[args["shape"].replace(".", "_")])
    config = AutoConfig.for_model(shape.pop("model_type"), **shape, max_position_embeddings=4096)
    path = tempfile.mkdtemp(prefix="roofline-")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def made_up_groups(args, vocab, seed=0):
    """rows completions, 8 a group, half rewarded +1 (every group carries signal), random tokens."""
    rng, groups = random.Random(seed), []
    n = args["completion_len"]
    for p in range(max(1, args["rows"] // 8)):
        prompt = [rng.randrange(100, vocab) for _ in range(args["prompt_len"])]
        completions = [Completion([rng.randrange(100, vocab) for _ in range(n)], [-1.0] * n, [0] * n, [True] * n,
                                  "eos") for _ in range(min(args["rows"], 8))]
        groups.append(Group(p, prompt, completions, index=p, rewards=[1.0, -1.0] * (len(completions) // 2)))
    return groups


def matmul_peak(shapes, dtype, repeats=5, budget_s=120.0):
    """-> (best GFLOP/s of (m, k) x (k, n) matmuls in dtype over the model's shapes, whether
    measured at them): a small probe first (about a second at 1 GFLOP/s), and only its rate when
    the shapes would take over budget_s at that rate."""
    # without native bf16 a bf16 a @ b ran ~1 GFLOP/s on an AVX2 CPU: minutes to hours at the shapes
    probe = matmul_rate(256, 512, 512, dtype, repeats=20, seconds=0.5)
    seconds = sum(2 * m * k * n for m, k, n in shapes) * (repeats + 1) / (probe * 1e9)
    fits = seconds <= budget_s
    name = str(dtype).removeprefix("torch.")
    verdict = f"take ~{seconds:.0f} s" if fits else f"would take ~{seconds:.0f} s: skipped"
    print(f"matmul peak in {name}: a probe ran {probe:.0f} GFLOP/s; the model's shapes {verdict}",
          flush=True)
    if not fits:
        return probe, False
    return max(probe, *(matmul_rate(m, k, n, dtype, repeats) for m, k, n in shapes)), True


def matmul_rate(m, k, n, dtype, repeats, seconds=float("inf")):
    """Best GFLOP/s of an (m, k) x (k, n) matmul in dtype over `repeats` runs after an untimed one,
    fewer once `seconds` have passed (a busy core slows any one run: the best of many is the
    machine's)."""
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    a @ b
    best, started = 0.0, time.perf_counter()
    for _ in range(repeats):
        best = max(best, 2 * m * k * n / timed(lambda: a @ b) / 1e9)
        if time.perf_counter() - started > seconds:
            break
    return best


def bandwidth(gib=1, repeats=5):
    """Read bandwidth, GB/s: the best of summing a 1 GiB tensor."""
    x = torch.ones(gib << 28)  # fp32
    x.sum()
    seconds = min(timed(x.sum) for _ in range(repeats))
    return x.numel() * 4 / seconds / 1e9


def timed(f):
    start = time.perf_counter()
    f()
    return time.perf_counter() - start


def wrap(owner, name, label):
    """owner.name runs inside record_function(label) (the profiler's phases); -> a function that undoes it."""
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        with record_function(label):
            return original(*args, **kwargs)
    setattr(owner, name, wrapped)
    return lambda: setattr(owner, name, original)


def phase_of(event, labels):
    while event is not None and event.name not in labels:
        event = event.cpu_parent
    return event.name if event is not None else "other"


def part_of(event, vocab):
    if any(key in event.name for key in ATTENTION_OPS):
        return "attention"
    if any(vocab in shape for shape in event.input_shapes or [] if shape):
        return "head"
    return "matmul" if event.name in MATMUL_OPS else "rest"


def profile_step(policy, groups, vocab):
    """-> ({(phase, part): seconds of ops' own time}, the step's wall seconds) for one train_step, profiled."""
    labels = ("forward", "backward", "optimizer", "upkeep")
    undo = [wrap(type(policy.logprobs), "forward", "forward"), wrap(torch.Tensor, "backward", "backward"),
            wrap(policy.optimizer, "step", "optimizer"), wrap(train, "add_grads", "upkeep"),
            wrap(train, "copy_weights", "upkeep")]
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            wall = timed(lambda: train.train_step(train.current_config(), policy, groups, 1, 0))
    finally:
        for u in undo:
            u()
    seconds = defaultdict(float)
    for event in prof.events():
        if event.name.startswith("aten::") or any(key in event.name for key in ATTENTION_OPS):
            seconds[phase_of(event, labels), part_of(event, vocab)] += event.self_cpu_time_total / 1e6
    return seconds, wall


def before_logprobs(model, input_ids, temperature=1.0, fp32_head=True, attention_mask=None, with_entropy=False,
                    chunk_tokens=None):
    """head.token_logprobs as it was before this round (the variant head=before): each chunk's head and
    log-softmax under activation checkpointing, autograd's backward, a bf16 head as IEEE fp32 matmuls of its
    upcast operands, the entropy recomputed in the backward too."""
    from torch.utils.checkpoint import checkpoint
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    B, T, H = hidden.shape
    hidden, targets = hidden[:, :-1].reshape(-1, H), input_ids[:, 1:].reshape(-1)
    weight = head.head_weight(model, fp32_head)

    def chunk(h, y):
        logits = torch.nn.functional.linear(h.float(), weight) / temperature
        lse = torch.logsumexp(logits, dim=-1)
        with torch.no_grad():
            entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
        return logits.gather(-1, y[:, None]).squeeze(-1) - lse, entropy
    n = chunk_tokens or max(1, (1 << 26) // weight.shape[0])
    outs = [checkpoint(chunk, hidden[s:s + n], targets[s:s + n], use_reentrant=False)
            for s in range(0, hidden.shape[0], n)]
    logprobs = torch.cat([o for o, _ in outs]).view(B, T - 1)
    return (logprobs, torch.cat([e for _, e in outs]).view(B, T - 1)) if with_entropy else logprobs


def variant(policy, name):
    """Switch the policy's compute to a variant (see the docstring) -> a function that switches it back."""
    key, value = name.split("=")
    if key == "head" and value == "before":
        head.token_logprobs, original = before_logprobs, head.token_logprobs
        return lambda: setattr(head, "token_logprobs", original)
    if key == "adamw" and value == "foreach":  # the optimizer before this round (fused: policy.load_policy's)
        fused, policy.optimizer.defaults["foreach"] = policy.optimizer.defaults["fused"], True
        policy.optimizer.defaults["fused"] = None
        for group in policy.optimizer.param_groups:
            group.update(fused=None, foreach=True)
        return lambda: [group.update(fused=fused, foreach=None) for group in policy.optimizer.param_groups]
    if key == "upkeep" and value == "before":  # add_grads as before this round: a mixed-dtype add_
        def mixed(model, compute):
            for p, c in zip(model.parameters(), compute.parameters()):
                if c.grad is not None and compute is not model:
                    p.grad = c.grad.float() if p.grad is None else p.grad.add_(c.grad)
                    c.grad = None
        train.add_grads, original = mixed, train.add_grads
        return lambda: setattr(train, "add_grads", original)
    if key == "attn":
        model = policy.logprobs.model
        before = model.config._attn_implementation
        model.set_attn_implementation(value)
        return lambda: model.set_attn_implementation(before)
    return lambda: None  # head=now, attn=sdpa: as it is


def compare(args, policy, groups):
    """-> {variant: best step seconds}, the variants interleaved."""
    best = dict.fromkeys(args["variants"].split(","), float("inf"))
    for _ in range(args["repeats"]):
        for name in best:
            undo = variant(policy, name)
            try:
                train.train_step(train.current_config(), policy, groups, 1, 0)  # warm, in this variant
                best[name] = min(best[name], timed(lambda: train.train_step(train.current_config(), policy, groups, 1, 0)))
            finally:
                undo()
    return {name: round(s, 3) for name, s in best.items()}


def trainer(args, path, peak):
    train.configure([f"--dtype={args['dtype']}", f"--micro_batch={args['micro_batch']}", "--lr=1e-6",
                     "--warmup_steps=0", f"--micro_batch_tokens={args['micro_batch_tokens']}"])
    layout = distributed.Layout(0, 1, "single", 1, 0, 0, torch.device("cpu"), None, None, None, None)
    policy = train.make_policy(train.current_config(), path, layout)
    config = policy.model.config
    groups = made_up_groups(args, config.vocab_size)
    train.train_step(train.current_config(), policy, groups, 0, 0)  # warm: allocations, oneDNN's kernels
    wall = min(timed(lambda: train.train_step(train.current_config(), policy, groups, 1, 0)) for _ in range(args["repeats"]))
    seconds, profiled_wall = profile_step(policy, groups, config.vocab_size)
    H, V, layers = config.hidden_size, config.vocab_size, config.num_hidden_layers
    T = args["prompt_len"] + args["completion_len"]
    tokens = args["rows"] * T  # every row is full: no padding
    n_params = sum(p.numel() for p in policy.model.parameters())
    body = n_params - V * H * (1 if config.tie_word_embeddings else 2)  # the decoder layers' matmul weights
    attention = 2 * 2 * args["rows"] * T * T * H // 2 * layers  # QK^T and AV, causal half
    flops = {("forward", "matmul"): 2 * body * tokens, ("backward", "matmul"): 4 * body * tokens,
             ("forward", "attention"): attention, ("backward", "attention"): 2 * attention,
             ("forward", "head"): 2 * H * V * tokens, ("backward", "head"): 6 * H * V * tokens}  # + its recompute
    scale = wall / profiled_wall  # the profiler's overhead taken out, evenly
    parts = {}
    for (phase, part), s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        f = flops.get((phase, part), 0)
        parts[f"{phase} {part}"] = dict(seconds=round(s * scale, 3), gflop=round(f / 1e9, 1),
                                        gflops=round(f / (s * scale) / 1e9, 1) if f else None,
                                        peak_share=round(f / (s * scale) / 1e9 / peak, 3) if f else None)
    model_flops = 6 * n_params * tokens
    variants = compare(args, policy, groups) if args["variants"] else {}
    return dict(step_s=round(wall, 3), tokens=tokens, n_params=n_params, model_gflops=round(model_flops / wall / 1e9, 1),
                peak_share=round(model_flops / wall / 1e9 / peak, 3), parts=parts, variants=variants), policy


def sampler(args, policy, gbps):
    """One decode step for `rows` sequences at the batch's context (prompt and completion as KV cache)."""
    model = policy.logprobs.model
    config = model.config
    knobs = dict(temperature=1.0, max_seqs=args["rows"], seed=0, eos_ids=(), think_budget=None,
                 max_new_tokens=args["completion_len"] + 8)
    groups = made_up_groups(dict(args, prompt_len=args["prompt_len"] + args["completion_len"]), config.vocab_size)
    s = TorchSampler(model, **knobs)
    for g in groups:
        s.add(g.prompt_id, g.prompt_ids, len(g.completions))
    s.step()  # the prefill and the first token
    steps = [timed(s.step) for _ in range(args["repeats"] + 2)]
    step_s = min(steps)
    rows = len(s.rows)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    context = args["prompt_len"] + args["completion_len"]
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * context * rows * model.dtype.itemsize
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    head = config.vocab_size * config.hidden_size * 4 if s.fp32_head and model.dtype != torch.float32 else 0
    bound = rows / ((weights + head + kv) / gbps / 1e9)
    return dict(decode_step_s=round(step_s, 4), tokens_s=round(rows / step_s, 1), bound_tokens_s=round(bound, 1),
                bandwidth_share=round(rows / step_s / bound, 3), bytes_weights=weights, bytes_fp32_head=head,
                bytes_kv=kv)


if __name__ == "__main__":
    args = configurator.configure(dict(model_path="", shape="smollm2", rows=128, prompt_len=80,
                                       completion_len=32, dtype="auto", micro_batch=16,
                                       micro_batch_tokens=0, repeats=2, threads=0, variants=""),
                                  sys.argv[1:], "benchmarks/step_roofline.py",
                                  dict(rows=8, prompt_len=2, completion_len=1, repeats=1, threads=0, micro_batch=0,
                                       micro_batch_tokens=0, dtype=("float32", "bfloat16", "auto"),
                                       shape=("smollm2", "qwen0.5b")))
    if args["threads"]:
        torch.set_num_threads(args["threads"])
    args["dtype"], why = resolve_dtype(args["dtype"], "cpu")  # as train.py resolves it
    print(f"the trainer and the sampler compute in {args['dtype']} ({why}); "
          f"{torch.get_num_threads()} threads", flush=True)
    path = model_dir(args)
    config = json.load(open(os.path.join(path, "config.json")))
    H, I, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    m = min(4096, args["rows"] * (args["prompt_len"] + args["completion_len"]))
    shapes = [(m, H, I), (m, I, H), (m, H, V)]
    peaks, at_shapes = {}, {}
    for dtype in ("float32", "bfloat16"):
        peaks[dtype], at_shapes[dtype] = matmul_peak(shapes, getattr(torch, dtype))
    gbps = bandwidth()
    rates = ", ".join(f"{d} {peaks[d]:.0f} GFLOP/s{'' if at_shapes[d] else ' (the probe)'}"
                      for d in peaks)
    print(f"this machine, {torch.get_num_threads()} threads: matmul peak {rates} at the model's "
          f"shapes; read bandwidth {gbps:.1f} GB/s", flush=True)
    step, policy = trainer(args, path, peaks[args["dtype"]])
    print(f"trainer: {step['step_s']:.2f} s a step of {step['tokens']:,} tokens, "
          f"{step['n_params'] / 1e6:.0f}M parameters: {step['model_gflops']:.0f} GFLOP/s "
          f"(6N x tokens), {step['peak_share']:.0%} of the {args['dtype']} peak")
    for name, part in step["parts"].items():
        rate = f"{part['gflops']:7.0f} GFLOP/s  {part['peak_share']:5.0%} of peak" if part["gflops"] else ""
        print(f"  {name:<20} {part['seconds']:7.3f} s  {part['gflop']:8.1f} GFLOP  {rate}")
    for name, seconds in step["variants"].items():
        print(f"  variant {name:<14} {seconds:7.3f} s a step: {seconds / step['variants'][next(iter(step['variants']))]:.2f}x "
              f"the first")
    decode = sampler(args, policy, gbps)
    print(f"sampler: one decode step of {args['rows']} sequences in {decode['decode_step_s']:.3f} s: "
          f"{decode['tokens_s']:.0f} tokens/s, the bandwidth bound {decode['bound_tokens_s']:.0f} "
          f"({decode['bandwidth_share']:.0%})")
    print(json.dumps(dict(args=args, peaks=peaks, peaks_at_shapes=at_shapes, bandwidth_gbps=gbps,
                          trainer=step, sampler=decode)))
