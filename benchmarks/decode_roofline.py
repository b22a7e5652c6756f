"""
Benchmark (not a test): one decode step of sample.TorchSampler on a real model, part by part,
against this CPU's matmul peak in the dtype the sampler runs in, measured at the decode's own shapes
(M = rows; the model's K and N):

    python benchmarks/decode_roofline.py                     # Qwen2.5-Coder-0.5B, 64 and 192 rows
    python benchmarks/decode_roofline.py --rows=192, --variants=before,after --steps=3   # (a tuple)

Every row holds a realistic context: groups of 8 rows share a prompt of 250-450 tokens (a GSM8K
prompt of ~150 plus the completion so far), left-padded as the sampler pads them. Parts
(torch.profiler, each op's own time): body matmuls (the decoder layers' projections), body other
(norms, RoPE, SiLU, residuals, the embedding), head (the fp32 logits), attention over the cache,
sampling (log-softmax and the draw), cache upkeep (the column written, the mask grown) and
Python/bookkeeping (the step's wall time less its ops'). FLOPs: 2 x rows x the decoder layers'
weights; 2 x rows x H x V for the head; 4 x heads x head_dim x the context of each row a layer for
the attention. A part's share of the peak is its FLOPs over its seconds.

--variants runs ways of decoding the same step side by side, interleaved, on the same samplers:
  before   the decode with a copying head and draw: the logits divided by the temperature into a new
           tensor, torch.log_softmax, then its exp drawn from, a slice per block of 1,024 entries
  after    the decode as it is (sample.draw_tokens: max, exp and the draw in the logits' own buffer)
The body, the head's matmul and the attention are the same code in both: their differences are this
machine's noise (~5-10% between runs).
"""

import os
import random
import sys
import time
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import configurator  # noqa: E402
from step_roofline import wrap  # noqa: E402  (record_function around a method, undone after)
import head  # noqa: E402
import sample  # noqa: E402
from infra import speed  # noqa: E402
from infra.policy import resolve_dtype  # noqa: E402

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear",
              "mkldnn::_linear_pointwise")
ATTENTION_OPS = ("scaled_dot_product", "flash_attention")
PARTS = ("body matmuls", "body other", "head", "attention", "sampling", "cache upkeep",
         "python/bookkeeping")


def matmul_rate(m, k, n, dtype, repeats=10):
    """Best GFLOP/s of an (m, k) x (k, n) matmul in dtype, as a @ b, as F.linear on an (n, k)
    weight (the model's layout) and on that weight prepacked for oneDNN, over `repeats` runs each
    after an untimed one."""
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    w = b.t().contiguous()
    packed = torch.ops.mkldnn._reorder_linear_weight(w, m)  # oneDNN's own layout, reordered once
    best = 0.0
    for f in (lambda: a @ b, lambda: F.linear(a, w),
              lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], "")):
        f()
        best = max(best, *(2 * m * k * n / timed(f) / 1e9 for _ in range(repeats)))
    return best


def timed(f):
    start = time.perf_counter()
    f()
    return time.perf_counter() - start


def bandwidth(gib=1, repeats=5):
    """Read bandwidth, GB/s: the best of summing a 1 GiB fp32 tensor."""
    x = torch.ones(gib << 28)
    x.sum()
    return x.numel() * 4 / min(timed(x.sum) for _ in range(repeats)) / 1e9


def splice_seconds(s, repeats=3):
    """One rebuild of the whole cache (what dropping ended rows, or admitting new ones, costs)."""
    keep = lambda: s._splice([([(l.keys, l.values) for l in s.cache.layers], s.mask)])
    return min(timed(keep) for _ in range(repeats))


def make_sampler(model, rows, context, seed=0):
    """A TorchSampler with `rows` running rows, 8 a prompt of context[0]..context[1] tokens."""
    rng = random.Random(seed)
    s = sample.TorchSampler(model, max_seqs=rows, seed=seed, max_new_tokens=1 << 20)
    for p in range(rows // 8):
        n = rng.randint(*context)
        s.add(p, [rng.randrange(100, model.config.vocab_size) for _ in range(n)], 8)
    s.step()  # the prefill and the first token
    return s


def part_of(event, labels):
    """The part an op belongs to: by its own name, an enclosing op's, or the label around it."""
    names, label = [], None
    while event is not None:
        names.append(event.name)
        label = label or (event.name if event.name in labels else None)
        event = event.cpu_parent
    if any(key in n for n in names for key in ATTENTION_OPS):
        return "attention"
    if label == "forward":
        return "body matmuls" if any(n in MATMUL_OPS for n in names) else "body other"
    if label in ("head", "sampling", "cache upkeep"):
        return label
    # _decode's own ops: the mask grown (and before: its log_softmax)
    return "sampling" if "log_softmax" in names[0] else "cache upkeep"


def profile_steps(s, steps):
    """-> {part: seconds a step} over `steps` profiled decode steps, and their wall s a step."""
    undo = [wrap(sample, "forward_with_cache", "forward"), wrap(sample, "lm_head_logits", "head"),
            wrap(sample, "draw_tokens", "sampling"),
            wrap(speed.GrowingLayer, "update", "cache upkeep"),
            wrap(sample.TorchSampler, "_splice", "cache upkeep")]
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            wall = timed(lambda: [s.step() for _ in range(steps)]) / steps
    finally:
        for u in undo:
            u()
    labels = ("forward", "head", "sampling", "cache upkeep")
    seconds = defaultdict(float)
    for event in prof.events():
        if "::" in event.name:  # an op (aten::, mkldnn::), not a label
            seconds[part_of(event, labels)] += event.self_cpu_time_total / 1e6 / steps
    return seconds, wall


def flops(model, s):
    """-> {part: FLOPs of one decode step} for the sampler's rows and their contexts."""
    c = model.config
    rows = len(s.rows)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    body = sum(p.numel() for n, p in model.model.layers.named_parameters() if p.dim() == 2)
    context = int(s.mask.sum())  # every row's real columns (padding excluded)
    return {"body matmuls": 2 * rows * body, "head": 2 * rows * c.hidden_size * c.vocab_size,
            "attention": 4 * c.num_attention_heads * head_dim * context * c.num_hidden_layers}


def before_head(hidden, weight, weight32, bias, temperature, fp32_head=True, _head=head._head):
    """head._head before: the logits divided by the temperature into a new tensor."""
    return _head(hidden, weight, weight32, bias, 1.0, fp32_head) / temperature


def before_draw(logits, generator, block=1024):
    """sample.draw_tokens before: log_softmax, then the inverse CDF on its exp, a slice a block."""
    logprobs = torch.log_softmax(logits, -1)
    probs = logprobs.exp()
    V = probs.shape[1]
    masses = torch.stack([probs[:, i:i + block].sum(-1) for i in range(0, V, block)], 1)
    u = torch.rand(len(probs), 2, dtype=torch.float64, generator=generator)

    def draw(weights, u):
        cdf = weights.cumsum(-1, dtype=torch.float64)
        index = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True)
        return index.clamp_(max=cdf.shape[1] - 1)
    index = draw(masses, u[:, 0]) * block + torch.arange(block)
    entries = probs.gather(1, index.clamp(max=V - 1)) * (index < V)
    sampled = index.gather(1, draw(entries, u[:, 1]))
    return sampled, logprobs.gather(1, sampled)[:, 0]


def variant(name):
    """Switch the decode to a variant (see the docstring) -> a function that switches it back."""
    if name == "before":
        now, draw = head._head, sample.draw_tokens
        head._head, sample.draw_tokens = before_head, before_draw
        return lambda: (setattr(head, "_head", now), setattr(sample, "draw_tokens", draw))
    return lambda: None


def measure(model, samplers, variants, steps, repeats, peak):
    """Per rows: {variant: (wall s a step, {part: s a step})}, the variants interleaved, best of
    repeats."""
    out = {rows: {} for rows in samplers}
    for _ in range(repeats):
        for rows, s in samplers.items():
            for name in variants:
                undo = variant(name)
                try:
                    s.step()  # warm, in this variant
                    wall = min(timed(s.step) for _ in range(steps))
                    parts, profiled = profile_steps(s, steps)
                    # the profiler's overhead taken out evenly; Python: what the ops leave
                    parts["python/bookkeeping"] = max(profiled - sum(parts.values()), 0.0)
                    parts = {part: sec * wall / profiled for part, sec in parts.items()}
                finally:
                    undo()
                if name not in out[rows] or wall < out[rows][name][0]:
                    out[rows][name] = (wall, parts)
    return out


def table(model, s, results, peak, gbps):
    rows = len(s.rows)
    work = flops(model, s)
    kv = sum(layer.keys.nbytes + layer.values.nbytes for layer in s.cache.layers)
    total = sum(work.values())
    names = list(results)
    print(f"\n{rows} rows, context {int(s.mask.sum()) // rows} tokens a row on average "
          f"(cache width {s.mask.shape[1]}); {total / 1e9:.0f} GFLOP a step; "
          f"peak {peak:.0f} GFLOP/s")
    print(f"{'part':<20}" + "".join(f"{n:>30}" for n in names))
    for part in PARTS:
        cells = []
        for n in names:
            sec = results[n][1].get(part, 0.0)
            f = work.get(part)
            rate = f"{f / sec / 1e9:5.0f} GF/s {f / sec / 1e9 / peak:4.0%}" if f and sec else ""
            cells.append(f"{sec * 1e3:8.1f} ms {rate:>18}")
        print(f"{part:<20}" + "".join(f"{c:>30}" for c in cells))
    for n in names:
        sec = results[n][1]["attention"]
        print(f"  {n}: the attention read the KV cache, {kv / 1e9:.2f} GB, "
              f"at {kv / sec / 1e9:.1f} GB/s "
              f"({kv / sec / 1e9 / gbps:.0%} of the read bandwidth, {gbps:.0f} GB/s)")
    splice = splice_seconds(s)
    # steps between drops: max_seqs // 8 endings, completions of ~280 tokens (the Qwen run's)
    every = s.max_seqs // 8 / (rows / 280)
    print(f"  a splice (the cache rebuilt to drop ended rows or admit new ones) "
          f"{splice * 1e3:.0f} ms; two every ~{every:.0f} steps of ~280-token completions: "
          f"~{2 * splice / every * 1e3:.0f} ms a step")
    for n in names:
        wall = results[n][0]
        print(f"  {n}: {wall:.3f} s a step, {rows / wall:.0f} tokens/s, "
              f"{total / wall / 1e9:.0f} GFLOP/s, "
              f"{total / wall / 1e9 / peak:.0%} of the peak")


if __name__ == "__main__":
    defaults = dict(model_path=".cache/qwen_coder/model", rows=(64, 192), context=(250, 450),
                    steps=2, repeats=2, dtype="auto", threads=0, variants="after")
    args = configurator.configure(defaults,
                                  sys.argv[1:], "benchmarks/decode_roofline.py",
                                  dict(steps=1, repeats=1, threads=0,
                                       dtype=("float32", "bfloat16", "auto")))
    if args["threads"]:
        torch.set_num_threads(args["threads"])
    dtype, why = resolve_dtype(args["dtype"], "cpu")
    dtype = getattr(torch, dtype)
    from transformers import AutoModelForCausalLM
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args["model_path"], dtype=dtype).eval()
    c = model.config
    rows, context = args["rows"], args["context"]
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args['model_path']}: {n_params / 1e6:.0f}M parameters in {dtype} ({why}), "
          f"{torch.get_num_threads()} threads; loaded in {time.perf_counter() - t0:.0f} s",
          flush=True)
    peaks = {}
    for m in rows:  # the decode's own shapes: q/o, k/v, gate/up, down, the head
        shapes = [(m, c.hidden_size, c.hidden_size), (m, c.hidden_size, c.intermediate_size),
                  (m, c.intermediate_size, c.hidden_size), (m, c.hidden_size, c.vocab_size)]
        rates = [matmul_rate(*shape, dtype) for shape in shapes]
        peaks[m] = max(rates)
        each = ", ".join(f"{k}x{n} {r:.0f}" for (_, k, n), r in zip(shapes, rates))
        print(f"matmul peak at M={m}: {each}"
              f" GFLOP/s in {dtype}", flush=True)
    t0 = time.perf_counter()
    gbps = bandwidth()
    samplers = {m: make_sampler(model, m, context) for m in rows}
    print(f"prefilled in {time.perf_counter() - t0:.0f} s", flush=True)
    with torch.no_grad():
        results = measure(model, samplers, args["variants"].split(","), args["steps"],
                          args["repeats"], peaks)
    for m, s in samplers.items():
        table(model, s, results[m], peaks[m], gbps)
