"""The processes the tests start, this file run as a script from the repository's root:

    python -m torch.distributed.run --nproc_per_node=N tests/harness.py fixed_batch ...  # a layout
    python tests/harness.py fault ACTION MOMENT AFTER ...    # train.py with one fault
    python tests/harness.py vllm_tied DIR                    # a vLLM engine in a process of its own

The layouts of train.py run on CPU and gloo (tests/test_distributed.py's torchrun_harness); the faults are
the fault table's (tests/test_checkpoint.py, through tests/helpers.py's train_script); vllm_tied is
test_vllm_reloads_tied_embeddings_in_flight_with_the_fp32_head's body. Some harnesses use the tests'
helpers: tests/helpers.py's (fixed_batch, recorded_step, the tiny Qwen) and, for vllm_tied, test_all.py's
in-flight check. No tests here."""

import errno
import gc
import json
import os
import re
import signal
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":  # run as a script, sys.path[0] is tests/: the repository's root instead
    sys.path[0] = REPO

import data  # noqa: E402  (these below the path's fix)
from infra import distributed  # noqa: E402
import head  # noqa: E402
from infra import policy as P  # noqa: E402
from tests import helpers  # noqa: E402  (as in every test file: one thread for torch)
import train  # noqa: E402


def peak_rss_reset():
    """Linux: reset this process's peak resident memory (VmHWM) -> a function returning the peak since, in bytes."""
    open("/proc/self/clear_refs", "w").write("5")
    read = lambda key: int(re.search(rf"{key}:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024
    return lambda: read("VmHWM")


def end_harness(layout):
    """The protocol's last messages (the master's "stop", a sampler's "bye"), then distributed.finish."""
    if layout.mailbox:
        if layout.rank == 0:
            for rank in range(1, layout.world):
                layout.mailbox.send(rank, ("stop",))
        else:
            assert layout.mailbox.get(0, "the master (rank 0)") == ("stop",)
            if layout.role == "sampler":
                layout.mailbox.send(0, ("bye",))
    distributed.finish(layout)


def harness_fixed_batch(out, model_dir, *config):
    """One train_step of helpers.fixed_batch() in train.py's layout for `config` -> the master saves the loss,
    the grad norm and the full gradients to `out`."""
    train.configure(list(config) + ["--grad_clip=1e9"])
    layout = distributed.setup(train.n_samplers, 60.0, "cpu", "torch")
    if layout.role != "sampler":  # a sampler rank takes no part in the gradient
        groups = helpers.fixed_batch(len(data.load_tokenizer(model_dir)))
        stats, grads = helpers.recorded_step(model_dir, groups, layout)
        if layout.rank == 0:
            torch.save(dict(loss=stats["loss"], grad_norm=stats["grad_norm"], grads=grads), out)
    end_harness(layout)


def harness_buckets(out, *bucket_sizes):
    """2 FSDP2 trainers push a ~80 MB fp32 Llama to 1 sampler rank in buckets of each size; every rank
    measures its peak resident memory above what it held before each push -> out/rank<r>.pt."""
    from transformers import LlamaConfig, LlamaForCausalLM
    layout = distributed.setup(1, 60.0, "cpu", "torch")
    torch.manual_seed(1 if layout.role == "sampler" else 0)  # the sampler starts from other weights
    model = LlamaForCausalLM(LlamaConfig(vocab_size=6000, hidden_size=512, intermediate_size=1536,
                                         num_hidden_layers=4, num_attention_heads=8, tie_word_embeddings=False))
    if layout.role != "sampler":
        P.shard(model, torch.float32, root=head.TokenLogprobs(model))
    params, result = dict(model.named_parameters()), dict(extra={}, received={})
    for size in map(int, bucket_sizes):
        plan = P.weight_plan(model, size, torch.float32)
        gc.collect()
        peak = peak_rss_reset()
        before = peak()
        if layout.role == "sampler":
            with torch.no_grad():
                for name, t in distributed.receive_buckets(layout.weight_group, plan, torch.float32, "cpu", 60):
                    params[name].copy_(t)
        else:
            for flat in P.weight_buckets(model, plan, torch.float32):
                if flat is not None:  # the master
                    distributed.broadcast(layout.weight_group, flat, 60, "sampler rank 2")
        result["extra"][size] = peak() - before
        if layout.role == "sampler":
            result["received"][size] = {n: p.detach().clone() for n, p in params.items()}
    if layout.role != "sampler":  # the reference: the trainers' weights, gathered on the master
        result["full"] = {n: P.gather_to_master(p, torch.float32) for n, p in params.items()}
    torch.save(result, os.path.join(out, f"rank{layout.rank}.pt"))
    end_harness(layout)


def harness_slow_build(hold_s, *args):
    """train.py with `args`, as torchrun runs it, except that the master's preparation of the tiny model (found
    in its cache or built) takes hold_s seconds more: a cold start that outlasts rank_timeout by construction,
    on any machine."""
    import runpy
    from infra import distributed
    master_first = distributed.master_first

    def slow_master_first(layout, build):  # build() runs on the master only, the others wait for it
        def slow_build():
            time.sleep(float(hold_s))
            print(f"harness: the model's build held {hold_s} s", file=sys.stderr, flush=True)
            return build()
        return master_first(layout, slow_build)
    distributed.master_first = slow_master_first
    sys.argv = [os.path.join(REPO, "train.py"), *args]
    runpy.run_path(sys.argv[0], run_name="__main__")


def harness_slow_validation(hold_s, *args):
    """train.py with `args`, as torchrun runs it, except that a sampler rank holds each validation's finished
    groups back until hold_s seconds after its first prompt arrived (it goes on decoding and reporting):
    a validation that outlasts rank_timeout by construction, on any machine."""
    import runpy
    import sample
    add, pop = sample.Sampler.add, sample.Sampler.pop_finished

    def add_and_start_the_clock(self, prompt_id, prompt_ids, n, think_budget=None, validation=False):
        if validation and prompt_id == 0:
            self.hold_until = time.time() + float(hold_s)
        add(self, prompt_id, prompt_ids, n, think_budget, validation)

    def pop_all_but_held(self):
        holding = time.time() < getattr(self, "hold_until", 0)
        held = [g for g in self.finished if holding and g.validation]
        self.finished = [g for g in self.finished if not any(g is h for h in held)]
        groups, self.finished = pop(self), held
        return groups
    sample.Sampler.add, sample.Sampler.pop_finished = add_and_start_the_clock, pop_all_but_held
    sys.argv = [os.path.join(REPO, "train.py"), *args]
    runpy.run_path(sys.argv[0], run_name="__main__")


def harness_vllm_tied(path):
    """test_vllm_reloads_tied_embeddings_in_flight_with_the_fp32_head's body, in a process of its own."""
    import pathlib
    from sample import VLLMSampler
    import test_all  # its sample.py section: perturbed_copy, check_update_mid_sequence
    tied = helpers.make_tiny_qwen(pathlib.Path(path), tie=True)
    old = helpers.load_tiny_qwen(tied)
    new = test_all.perturbed_copy(old)
    assert old.lm_head.weight is old.model.embed_tokens.weight and "lm_head.weight" not in dict(new.named_parameters())
    sampler = VLLMSampler(tied["path"], engine_kwargs=dict(dtype="float32", max_model_len=256, kv_cache_memory_bytes=1 << 29),
                          **helpers.sampler_knobs(tied, eos_ids=[], think_budget=None, max_new_tokens=12))
    test_all.check_update_mid_sequence(sampler, old, new, tied["prompts"][:2], steps_before=5, total=12,
                                       tol=1e-4)
    print("tied reload ok")


def harness_fault(action, moment, after, *args):
    """train.py with `args`, as python or torchrun runs it, with one fault on the master (rank 0), fired at the
    first MOMENT once log.jsonl holds step AFTER's row; it says when on stdout. ACTION: SIGTERM, SIGINT or
    SIGKILL sent to the master itself, SIGTERM>torchrun sent to its parent (torchrun, which passes it on to
    every rank), or ENOSPC raised by the write; every rank's exit code is written to exitRANK beside out_dir.
    MOMENT: sampling (a sampler's engine step), training (a micro-batch's loss), validation (its first prompt
    handed out), checkpoint (the write of optimizer.pt: the weights written, state.pt not yet), swap
    (ckpt.tmp renamed into place, ckpt already moved to ckpt.old). tests/test_checkpoint.py's fault table uses
    it."""
    import runpy
    from infra import distributed
    import loss
    import sample
    out_dir = next(a.split("=", 1)[1] for a in args if a.startswith("--out_dir="))
    fired, after = [], int(after)

    def due():
        if fired or os.environ.get("RANK", "0") != "0" or not os.path.exists(os.path.join(out_dir, "log.jsonl")):
            return False
        with open(os.path.join(out_dir, "log.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.endswith("\n")]
        return max((r.get("step", -1) for r in rows), default=-1) >= after

    def fault():
        fired.append(moment)
        print(f"harness: {action} at {moment}", flush=True)
        if action == "ENOSPC":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        name, _, whom = action.partition(">")
        os.kill(os.getppid() if whom == "torchrun" else os.getpid(), getattr(signal, name))

    def before(owner, method, when):
        original = getattr(owner, method)

        def wrapped(*a, **k):
            if when(*a, **k) and due():
                fault()
            return original(*a, **k)
        setattr(owner, method, wrapped)

    anytime = lambda *a, **k: True  # noqa: E731
    if moment == "sampling":
        before(sample.TorchSampler, "step", anytime)
        before(distributed.RemoteSamplers, "step", anytime)
    elif moment == "training":
        before(loss, "policy_loss", anytime)
    elif moment == "validation":  # its first prompt handed out
        first = lambda self, prompt_id, *a, validation=False, **k: validation and prompt_id == 0  # noqa: E731
        before(sample.Sampler, "add", first)
        before(distributed.RemoteSamplers, "add", first)
    elif moment == "checkpoint":  # the weights written, the optimizer's state next
        before(torch, "save", lambda obj, f, *a, **k: str(f).endswith("optimizer.pt"))
    elif moment == "swap":  # ckpt moved to ckpt.old, ckpt.tmp not yet in its place
        before(os, "rename", lambda src, dst, *a, **k: str(src).endswith("ckpt.tmp"))
    sys.argv = [os.path.join(REPO, "train.py"), *args]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as e:  # every rank's exit code, beside out_dir (torchrun does not say them all)
        with open(os.path.join(os.path.dirname(os.path.abspath(out_dir)), f"exit{os.environ.get('RANK', 0)}"),
                  "w") as f:
            f.write(str(e.code))
        raise


def main(name, *args):
    """Run the harness `name` with the command line's other arguments."""
    harnesses = dict(fixed_batch=harness_fixed_batch, buckets=harness_buckets,
                     slow_validation=harness_slow_validation, slow_build=harness_slow_build,
                     vllm_tied=harness_vllm_tied, fault=harness_fault)
    harnesses[name](*args)


if __name__ == "__main__":  # torchrun, and the tests' subprocesses: tests/harness.py NAME ARGS...
    main(*sys.argv[1:])
