"""
memory.py's plan beside what FSDP2 and the trainer really hold, measured on CPU by torch's FSDPMemTracker
(torch.distributed._tools.fsdp2_mem_tracker), term by term, at the trainer's two peaks: a micro-batch's backward
(the second of two: the first one's gradients held, as in every micro-batch of a real step but the first) and
AdamW's step. Each trainer is built as policy.load_policy builds it (random weights instead of from_pretrained):
fp32 parameters, FSDP2 per decoder layer + head.TokenLogprobs as the root (policy.shard: MixedPrecisionPolicy,
param_dtype = the compute dtype, reduce_dtype fp32), activation checkpointing, AdamW(foreach=True) whose moments
already exist (a first step on zero gradients), and both gradient-sync choices, imposed by a hook on the root's
forward whatever train.py asks for:
  every     FSDP2's default: each micro-batch's backward reduce-scatters its gradients into the fp32 shards
  no-sync   set_requires_gradient_sync(i == last): FSDP2 accumulates them unsharded until the last one

    python benchmarks/memory_check.py                      # every check, ~35 minutes on 2 busy cores
    python benchmarks/memory_check.py --per_layer          # what a decoder layer saves for its backward, seconds
    python benchmarks/memory_check.py --fake --fake_layouts=2:every,4:every      # Qwen3-8B only (~30 s a layout)
    python benchmarks/memory_check.py --real --real_tokens=512 --real_variants=bfloat16:ckpt:every --json=out.json

fake: Qwen3-8B's real shapes (hidden 4096, 36 layers, MLP 12288, vocab 151,936, 32 / 8 heads of 128, untied)
  on fake tensors, one process as rank 0 of 2 or 4 trainers (torch's fake process group: collectives are
  no-ops), bf16 compute, two micro-batches of 16,384 tokens. What makes fake tensors account like real ones:
  - the device mesh is made before fake mode and fully_shard gets it (policy.shard asks for the default one);
  - DTensor's sharding propagation runs in a fake mode of its own: by default it reuses the active one, and
    the tracker, which tells propagation apart from real work by its fake mode, then counts the global-shape
    tensors it makes for every DTensor op (AdamW's first step: 36 bytes a local parameter instead of 12);
  - transformers is told the rows are not packed (with fake position ids it cannot check, so it builds a
    T x T mask, and SDPA then copies K and V to every head): what it finds with real tensors;
  - device "cpu", with the head as CUDA runs it (head.head_weight leaves it bf16; bf16 operands, fp32 logits):
    FSDP2 needs streams on "cuda", and CPUs upcast the head to fp32 (a CPU-only term, checked on real tensors).
  train.train_step reads numbers (.item()) that fake tensors do not have, so its memory path runs as a loop
  of its own here: the same module calls, policy_loss, backward, clip_grad_norm_(foreach), AdamW, zero_grad.
real: SmolLM2-135M's shape (Llama, 30 layers, hidden 576, 9 / 3 heads of 64, MLP 1536, vocab 49,152, tied),
  random weights, 2 gloo ranks, train.train_step itself on rows of --real_tokens tokens, --real_micro_batches
  of one row a rank; per variant dtype:checkpointing:sync; the head in fp32 as CPUs run it (memory.py's
  cpu=True). Unless --no_timing, a second step runs untracked: its time, and how far the resident memory rose
  in it (glibc made to return freed blocks at once), beside the tracker's count (they agreed to within 1%).
  The times on CPU with gloo only indicate: a rank has one slow core, and on GPUs the reduce-scatters overlap
  the backward.
per layer: the bytes a token one decoder layer saves for its backward, in fp32 and bf16, for both shapes.
A term agrees when plan and measurement are within 20%, or differ by less than 1% of the phase's total (the
no-sync peak comes after the last layer's gradients were reduce-scattered: a layer's Sharded Grad).
"""

import argparse
import json
import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import head  # noqa: E402
import loss as L  # noqa: E402
from infra import memory  # noqa: E402
from infra import policy as P  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20
QWEN3_8B = dict(model="qwen3", hidden_size=4096, num_hidden_layers=36, intermediate_size=12288, vocab_size=151936,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)
SMOLLM2_135M = dict(model="llama", hidden_size=576, num_hidden_layers=30, intermediate_size=1536, vocab_size=49152,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True)
TOLERANCE = 0.2
# the plan's term -> the tracker's categories it answers for
MEASURED = {"Activation + Temp": ("Activation", "Temp", "Inputs", "Buffer")}


def random_model(shape, **changes):
    """A randomly initialised fp32 causal LM of `shape` (a Qwen3 or a Llama), in train mode."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
    config, cls = (Qwen3Config, Qwen3ForCausalLM) if shape["model"] == "qwen3" else (LlamaConfig, LlamaForCausalLM)
    fields = {k: v for k, v in dict(shape, **changes).items() if k != "model"}
    return cls(config(**fields, max_position_embeddings=32768)).train()


def build_policy(shape, rank, ranks, dtype, checkpoint):
    """policy.load_policy's sharded Policy for a random model of `shape`, with AdamW's moments already made."""
    torch.manual_seed(0)  # every rank the same weights, as from_pretrained gives them
    model = random_model(shape)
    if checkpoint:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(use_reentrant=False))
    logprobs = head.TokenLogprobs(model)
    P.shard(model, dtype, root=logprobs)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True, lr=1e-6, betas=(0.9, 0.999), eps=1e-15,
                                  weight_decay=0.01)
    for p in model.parameters():  # the moments exist from the second step on: make them now
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return P.Policy(model, logprobs, optimizer, rank, ranks, True)


def gradient_sync(policy, every, micro_batches):
    """Impose a gradient-sync choice, whatever train.py asks for: reduce-scatter after every micro-batch, or
    (every=False) after the last of each step's `micro_batches` only. A hook on the root's forward decides."""
    fsdp_class, forwards = type(policy.logprobs), [0]
    policy.logprobs.set_requires_gradient_sync = lambda *args, **kwargs: None  # train.py's own call gives way

    def decide(*_):
        forwards[0] += 1
        fsdp_class.set_requires_gradient_sync(policy.logprobs, every or forwards[0] % micro_batches == 0)
    policy.logprobs.register_forward_pre_hook(decide)


def tracked(policy, step):
    """step() under FSDPMemTracker -> {'backward': {category: bytes}, 'step': {...}}: the peak before AdamW's step
    (forward, backward, clip) and the peak of the step itself."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType
    from torch.distributed.fsdp import FSDPModule
    tracker, root, peaks = FSDPMemTracker(policy.logprobs, policy.optimizer), policy.logprobs, {}

    def before_step(*_):
        peaks["backward"] = tracker.get_tracker_snapshot("peak")
        tracker._peak_mem = {}  # the step's own peak from here

    with tracker:  # its own hooks go in on entry: ours go in after, to run first
        peaks["start"] = tracker.get_tracker_snapshot()
        hooks = [policy.optimizer.register_step_pre_hook(before_step),
                 # one tracker over several micro-batches: it refuses a second root forward unless its module stats go
                 root.register_forward_pre_hook(lambda *_: None if tracker._mod_tracker.is_bw else
                                                tracker.reset_mod_stats(), prepend=True)]
        for module in root.modules():
            group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
            if group:
                # no-sync micro-batches leave FSDP2's fp32 gradient accumulators (_fsdp_param.py,
                # to_accumulated_grad_if_needed), made inside post_backward: the tracker files them under Temp
                def post_backward(*args, _inner=group.post_backward, _group=group):
                    _inner(*args)
                    for fsdp_param in _group.fsdp_params:
                        if fsdp_param.unsharded_accumulated_grad is not None:
                            tracker._update_and_maybe_create_winfos(fsdp_param.unsharded_accumulated_grad,
                                                                    _FSDPRefType.UNSHARDED_GRAD)
                group.post_backward = post_backward
        step()
    peaks["step"] = tracker.get_tracker_snapshot("peak")
    for hook in hooks:
        hook.remove()
    name = lambda key: getattr(key, "value", key)
    return {phase: {name(k): v for k, v in next(iter(snap.values())).items()} for phase, snap in peaks.items()}


def peak_rss_reset():
    """Linux: reset this process's peak resident memory -> (resident now, a function returning the peak since)."""
    import re
    read = lambda key: int(re.search(rf"{key}:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024
    open("/proc/self/clear_refs", "w").write("5")
    return read("VmRSS"), lambda: read("VmHWM")


def compare(plan_phases, measured):
    """-> rows (phase, term, plan bytes, measured bytes, agrees) for every plan term, every measured category the
    plan has no term for, and the totals."""
    rows = []
    for phase, terms in plan_phases.items():
        got, total = dict(measured[phase]), measured[phase]["Total"]
        got.pop("Total")
        for term, planned, _ in terms:
            short = term.split(" (")[0]
            value = sum(got.pop(k, 0) for k in MEASURED.get(short, (short,)))
            rows.append((phase, term, planned, value, abs(planned - value) <= max(TOLERANCE * value, 0.01 * total)))
        rows += [(phase, f"{k} (not in the plan)", 0, v, v <= 0.01 * total) for k, v in got.items() if v > total / 1000]
        planned = sum(b for _, b, _ in terms)
        rows.append((phase, "Total", planned, total, abs(planned - total) <= TOLERANCE * total))
    return rows


def table(title, rows, unit=GiB):
    name = "GiB" if unit == GiB else "MiB"
    lines = [title, f"  {'phase':9} {'term':58} {'plan ' + name:>10} {'measured':>10} {'ratio':>6}"]
    for phase, term, planned, value, agrees in rows:
        ratio = f"{planned / value:.2f}" if value else "-"
        lines.append(f"  {phase:9} {term:58} {planned / unit:10.2f} {value / unit:10.2f} {ratio:>6}"
                     f"{'' if agrees else '  <- off'}")
    return "\n".join(lines)

# -----------------------------------------------------------------------------
# per decoder layer: what its backward keeps, per token


def per_layer_check(tokens=1024):
    """-> rows (model, dtype, bytes a token one decoder layer saves for its backward, memory.py's estimate): autograd's
    saved tensors, parameters excluded, counted once per storage, on fake tensors (no activation checkpointing:
    with it the layer keeps its input and these come back one layer at a time, in its recompute)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    rows = []
    for name, shape in (("SmolLM2-135M", SMOLLM2_135M), ("Qwen3-8B", QWEN3_8B)):
        for dtype in (torch.float32, torch.bfloat16):
            with FakeTensorMode(allow_non_fake_inputs=True):
                torch.set_default_dtype(dtype)  # (fake parameters cannot be cast after)
                try:
                    model = random_model(shape, num_hidden_layers=1, vocab_size=1000)
                finally:
                    torch.set_default_dtype(torch.float32)
                params, storages = list(model.parameters()), []

                def keep(t):
                    if not any(t is p or t._base is p for p in params) and \
                            not any(s is t.untyped_storage() for s in storages):
                        storages.append(t.untyped_storage())
                    return t
                x = torch.randn(1, tokens, shape["hidden_size"], dtype=dtype, requires_grad=True)
                position = model.model.rotary_emb(x, torch.arange(tokens)[None])
                with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
                    model.model.layers[0](x, position_embeddings=position, attention_mask=None)
            H, I, kv = shape["hidden_size"], shape["intermediate_size"], shape["num_key_value_heads"] * shape["head_dim"]
            rows.append((name, str(dtype).split(".")[1], sum(s.nbytes() for s in storages) / tokens,
                         (8 * H + 5 * I + 2 * kv) * dtype.itemsize))
    return rows

# -----------------------------------------------------------------------------
# fake tensors: Qwen3-8B


def fake_step(policy, tokens, micro_batches):
    """train.train_step's memory path on fake tensors: per micro-batch (one row of `tokens`) the log-probs with
    entropy, the CISPO loss, backward scaled by the trainers; then clip, AdamW, zero_grad."""
    vocab = policy.model.config.vocab_size

    def step():
        for _ in range(micro_batches):
            ids = torch.randint(0, vocab, (1, tokens))
            logprobs, entropy = policy.logprobs(ids, 1.0, True, with_entropy=True)
            mask = torch.ones(1, tokens - 1)
            loss, _ = L.policy_loss(logprobs, torch.zeros(1, tokens - 1), torch.ones(1), mask, mask / mask.sum())
            (loss * policy.ranks).backward()
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0, foreach=True)
        policy.optimizer.step()
        policy.optimizer.zero_grad(set_to_none=True)
    return step


def fake_check(trainers, sync_every, checkpoint=True, shape=QWEN3_8B, tokens=16384, micro_batches=2):
    """Rank 0 of `trainers` on fake tensors -> dict(peaks, plan, comm bytes per rank, seconds)."""
    import torch.distributed.fsdp._fully_shard._fully_shard as fully_shard_module
    import torch.distributed.tensor._sharding_prop as sharding_prop
    import transformers.masking_utils as masking_utils
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    started = time.time()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=trainers)
    mesh = init_device_mesh("cpu", (trainers,))
    patched = [(fully_shard_module, "_init_default_mesh"), (sharding_prop, "detect_fake_mode"),
               (masking_utils, "find_packed_sequence_indices"), (head, "head_weight"),
               (dist, "all_gather_single"), (dist, "reduce_scatter_single")]
    saved = [getattr(module, name) for module, name in patched]
    comm = dict(all_gather=0, reduce_scatter=0)

    def counting(key, collective, which):
        def call(*args, **kwargs):
            tensor = kwargs.get(which) if which in kwargs else args[0 if which == "output" else 1]
            comm[key] += tensor.numel() * tensor.element_size()
            return collective(*args, **kwargs)
        return call
    fully_shard_module._init_default_mesh = lambda *args, **kwargs: mesh
    sharding_prop.detect_fake_mode = lambda *args, **kwargs: None
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    head.head_weight = lambda model, fp32_head=True: model.get_output_embeddings().weight  # as on CUDA
    dist.all_gather_single = counting("all_gather", dist.all_gather_single, "output")
    dist.reduce_scatter_single = counting("reduce_scatter", dist.reduce_scatter_single, "input")
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            policy = build_policy(shape, 0, trainers, torch.bfloat16, checkpoint)
            gradient_sync(policy, sync_every, micro_batches)
            comm.update(all_gather=0, reduce_scatter=0)
            peaks = tracked(policy, fake_step(policy, tokens, micro_batches))
    finally:
        for (module, name), value in zip(patched, saved):
            setattr(module, name, value)
        dist.destroy_process_group()
    plan = memory.trainer_phases(memory.shape_of(shape), trainers, True, 2, tokens, checkpoint, sync_every)
    return dict(trainers=trainers, sync_every=sync_every, checkpoint=checkpoint, tokens=tokens,
                micro_batches=micro_batches, peaks=peaks, plan=plan, rows=compare(plan, peaks), comm=comm,
                seconds=time.time() - started)

# -----------------------------------------------------------------------------
# real tensors: SmolLM2-135M on 2 gloo ranks, train.train_step


def rows_of(vocab, rows, length, seed=0):
    """`rows` completions (groups of two, rewards +1 / -1) of exactly `length` tokens with their 8-token prompts."""
    import random
    from sample import Completion, Group
    rng = random.Random(seed)
    n = length - 8
    return [Group(g, [rng.randrange(3, vocab) for _ in range(8)],
                  [Completion([rng.randrange(3, vocab) for _ in range(n)], [-1.0] * n, [0] * n, [True] * n, "eos")
                   for _ in range(2)], index=g, rewards=[1.0, -1.0]) for g in range(rows // 2)]


def real_rank(rank, ranks, port, variants, tokens, micro_batches, timing, out):
    import train
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    results = []
    for variant in variants:
        dtype, checkpoint, sync = variant.split(":")
        if rank == 0:  # a variant takes a minute or more on 2 cores: none passes unsaid
            print(f"real: {variant} ...", flush=True)
        train.configure([f"--dtype={dtype}", "--micro_batch=0", f"--micro_batch_tokens={tokens}", "--warmup_steps=0",
                         "--lr=1e-6", "--grad_clip=1.0"])
        policy = build_policy(SMOLLM2_135M, rank, ranks, getattr(torch, dtype), checkpoint == "ckpt")
        gradient_sync(policy, sync == "every", micro_batches)
        groups = rows_of(SMOLLM2_135M["vocab_size"], micro_batches * ranks, tokens)  # micro-batches of 1 row
        peaks = tracked(policy, lambda: train.train_step(train.current_config(), policy, groups, 10, 0))
        seconds = rss_rise = None
        if timing:  # a step without the tracker: its time, and how far the resident memory rose in it
            import gc
            gc.collect()
            resident, peak = peak_rss_reset()
            started = time.time()
            train.train_step(train.current_config(), policy, groups, 11, 0)
            seconds, rss_rise = time.time() - started, peak() - resident
        plan = memory.trainer_phases(memory.shape_of(SMOLLM2_135M), ranks, True, getattr(torch, dtype).itemsize,
                                     tokens, checkpoint == "ckpt", sync == "every", cpu=True)
        tracker_rise = max(peaks["backward"]["Total"], peaks["step"]["Total"]) - peaks["start"]["Total"]
        results.append(dict(variant=variant, tokens=tokens, micro_batches=micro_batches, peaks=peaks, plan=plan,
                            rows=compare(plan, peaks), seconds=seconds, rss_rise=rss_rise, tracker_rise=tracker_rise))
        policy = None  # freed before the next variant builds its own
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def real_check(variants, tokens=1024, micro_batches=2, timing=True, ranks=2):
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # glibc returns every freed block above 64 KB at once, so that resident memory follows the live tensors
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "real.json")
        mp.spawn(real_rank, args=(ranks, port, variants, tokens, micro_batches, timing, out), nprocs=ranks)
        with open(out) as f:
            return json.load(f)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per_layer", action="store_true", help="only what a decoder layer saves, per token")
    parser.add_argument("--fake", action="store_true", help="only the Qwen3-8B check on fake tensors")
    parser.add_argument("--real", action="store_true", help="only the SmolLM2-135M check on real tensors")
    parser.add_argument("--fake_layouts", default="2:every,2:no-sync,4:every,4:no-sync",
                        help="fake: trainers:every|no-sync[:full], comma-separated (2 trainers: 8 GPUs, 4: 16 GPUs; "
                             "full: no activation checkpointing)")
    parser.add_argument("--real_tokens", type=int, default=1024, help="real: tokens a micro-batch (one row)")
    parser.add_argument("--real_variants", default="float32:ckpt:every,float32:ckpt:no-sync,float32:full:every,"
                        "bfloat16:ckpt:every,bfloat16:ckpt:no-sync,bfloat16:full:every",
                        help="real: dtype:ckpt|full:every|no-sync, comma-separated")
    parser.add_argument("--real_micro_batches", type=int, default=2, help="real: micro-batches a rank")
    parser.add_argument("--no_timing", action="store_true",
                        help="real: skip the untracked step that times each variant")
    parser.add_argument("--json", default="", help="write every result here")
    args = parser.parse_args()
    results = dict(per_layer=[], fake=[], real=[])
    everything = not (args.per_layer or args.fake or args.real)
    if args.per_layer or everything:
        results["per_layer"] = per_layer_check()
        print("saved for the backward by one decoder layer, bytes a token (SDPA; memory.py: (8 H + 5 I + 2 KV) x dtype)")
        for name, dtype, measured, planned in results["per_layer"]:
            print(f"  {name:13} {dtype:9} measured {measured:9,.0f}  plan {planned:9,.0f}  ratio {planned / measured:.2f}")
    if args.fake or everything:
        for layout in args.fake_layouts.split(","):
            trainers, sync, *full = layout.split(":")
            r = fake_check(int(trainers), sync == "every", checkpoint=not full)
            results["fake"].append(r)
            print(table(f"Qwen3-8B, fake tensors, {trainers} trainers, gradient sync {sync}, 2 micro-batches of "
                        f"{r['tokens']:,} tokens, bf16, {'no ' if full else ''}checkpointing ({r['seconds']:.0f} s); "
                        f"a step gathers {r['comm']['all_gather'] / GiB:.1f} GiB of parameters and reduce-scatters "
                        f"{r['comm']['reduce_scatter'] / GiB:.1f} GiB of gradients (a rank sends (T-1)/T of them)",
                        r["rows"]), flush=True)
    if args.real or everything:
        variants = args.real_variants.split(",")
        if any(v.startswith("bfloat16") for v in variants) and not P.native_bf16():
            print("real: this CPU has no native bf16 (avx512_bf16, AMX, Arm BF16): the bfloat16 "
                  "variants hold the memory they would anywhere, in several times fp32's time",
                  flush=True)
        for r in real_check(variants, args.real_tokens, args.real_micro_batches, not args.no_timing):
            results["real"].append(r)
            timed = (f", untracked: {r['seconds']:.1f} s a step, resident memory rose {r['rss_rise'] / MiB:.0f} "
                     f"MiB (the tracker: {r['tracker_rise'] / MiB:.0f})") if r["seconds"] else ""
            print(table(f"SmolLM2-135M, real tensors, 2 gloo ranks, {r['variant']}, {r['micro_batches']} micro-batches "
                        f"of {r['tokens']} tokens{timed}", r["rows"], MiB), flush=True)
    off = [(r.get("variant") or (r["trainers"], r["sync_every"]), row[:2]) for kind in ("fake", "real")
           for r in results[kind] for row in r["rows"] if not row[4]]
    off += [row[:2] for row in results["per_layer"] if abs(row[3] / row[2] - 1) > TOLERANCE]
    print("every term agrees" if not off else f"terms off: {off}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
