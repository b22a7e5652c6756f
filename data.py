"""
Tasks for RL: the built-in reasoning task with its tokenizer and tiny base model, JSONL math and
code datasets (math scored by math-verify, code by running it against its tests in sandbox.py),
several datasets in one run, rewards, the held-out split, and No-Positive-Resampling.

    python data.py                      # build (or reuse) the tiny base model, measure its pass rate
    python data.py --data=FILE.jsonl    # check a JSONL dataset: its size, or its first error

The built-in task: running sums (ours; the paper trains on Polaris-53K math)
-----------------------------------------------------------------------------
A prompt lists n numbers from 0-3, each tagged by a letter; the answer is the last digit of their
sum. The model thinks by writing the running sum (mod 10) after each letter, then answers:

    prompt      a3b0c2d1e2
    completion  <think>a3b3c5d6e8</think>8<eos>

Difficulty is n, uniform in 2..12, so the chain of thought is 2n+1 tokens long (<think> included).
Why this task, and not the more natural multi-digit addition (measured on these CPUs):
  - RL on a small model sharpens what the base already does: it needs a base whose pass@8 is
    high while its pass@1 is low. The base model imitates a *noisy teacher* that writes a wrong
    running-sum digit with probability TINY_SFT["teacher_slip"] at each step and carries on from
    it, so a chain of n steps is right with probability ~0.8^n: pass@1 ~0.3, pass@8 ~0.85.
    RL then only has to make each step's choice sharper, a skill the base demonstrably has.
  - Every step is one attention lookup (find the letter in the prompt, read the number after it)
    and one small table (a 40-entry add mod 10), which a 3-layer model learns from ~280 steps of
    clean demonstrations, for every seed tried (7; with 2 layers, 3 of 7 seeds got the lookup
    wrong for the middle letters). Digits 0-9 (a 100-entry table) needed >1000 steps, and
    learning the rule from noisy demonstrations alone failed within the build budget, so the
    warm-up shows the clean teacher first and the noisy one for its last 30% (ours).
  - Chains of n >= 11 run into the thinking budget TINY_THINK_BUDGET (14% of the base model's
    completions are interrupted), so the paper's forced interruption happens on every batch. 10% of the
    demonstrations are cut at a random point and continue with the interruption phrase (masked
    from the loss, as the sampler's forced tokens are in RL) and the teacher's best guess: the
    running sum so far. RL can learn better guesses: the unread numbers are in the prompt.
  - Completions are 8-30 tokens and prompts 4-24: a step of 256 completions is cheap on a CPU.
Prompts are drawn i.i.d. from the generator; held-out prompts never appear in the training set
(the warm-up's demonstrations come from the same generator: it teaches the procedure).
Measured (seed 0, 2 CPU cores): 666k parameters, built in ~45 s; validation at temperature 1,
pass@1 0.26, pass@8 0.86. A plain on-policy CISPO loop (32 prompts x 8, AdamW lr 1e-4) took
it to 0.82 in 30 steps (~20 s) and 0.93 in 150; lr 3e-5 gives a slower curve (0.82 in 100 steps).

JSONL datasets, one problem per line (data/example_math.jsonl, data/example_code.jsonl):
  - math: {"prompt" | "problem": ..., "answer": ...}, the answer checked by math-verify;
  - code, stdin/stdout: {"prompt": ..., "tests": [{"input": "1 2\\n", "output": "3"}, ...]};
  - code, call style: {"prompt": ..., "fn_name": "solve", "tests": [{"input": [args...], "output": value}]};
  - code, asserts: {"prompt": ..., "test": "assert solve(1, 2) == 3\\nassert ..."}.
A row is math when it has the answer field, code when it has "tests" or "test" (never both); a
"domain" field names its domain (default: the file's stem), other fields ("solution") are ignored.
The program is the last ```python (or bare ```) block of the final answer; sandbox.py says how each
style is judged. The tiny model cannot write Python: in the CPU demonstration (config/math_code_cpu.py)
the code domain stays at reward -1, and its groups are dropped by the zero-variance filter.
What every completion is scored on: the text after its last </think>; all of it when no thinking was
opened (models that do not think); nothing (-1) when thinking was opened, by the prompt (some chat
templates end in <think>) or by the completion, and never closed: unfinished reasoning earns nothing.

Several datasets: data_path="builtin,data/example_code.jsonl", or with weights
"math.jsonl:2,code.jsonl:1". Every prompt keeps its domain ("builtin", the file stem or the row's
field), which validation reports as val_reward_<domain>. n_val and n_train count per domain (ours):
each domain holds out n_val prompts and trains on at most n_train, so each domain's curve has the
same precision. Without weights the datasets are pooled (each epoch one shuffled pass over all
prompts); with weights, the Curriculum draws domains in proportion to them (see Curriculum).

Interruption (the sampler implements it; ScaleRL sec. 3.3): a completion that holds L tokens and
no </think> gets INTERRUPT_PHRASE appended, L drawn per completion uniformly from the integers of
TINY_THINK_BUDGET; after </think> (written or forced) at most TINY_ANSWER_BUDGET tokens follow.
"""

import ast
import hashlib
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache, partial

import numpy as np
import torch

import sandbox
from loss import token_logprobs

INTERRUPT_PHRASE = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"
THINK_START, THINK_END = "<think>", "</think>"
LETTERS = "abcdefghijklmnopqrstuvwxyz"

TINY_TASK = dict(min_terms=2, max_terms=12, max_term=3)  # n in 2..12 numbers, each 0..3
TINY_THINK_BUDGET = (22, 26)  # completion tokens before the forced interruption (paper: 10k-12k)
TINY_ANSWER_BUDGET = 4        # tokens after </think> (paper: 2,048); the answer is 1 digit + <eos>
TINY_MODEL = dict(hidden_size=128, num_hidden_layers=3, num_attention_heads=4,  # head_dim 32: vLLM CPU
                  intermediate_size=384, max_position_embeddings=1024)
TINY_SFT = dict(steps=400, batch_size=64, lr=2e-3, warmup=30,
                clean_frac=0.7,       # the first 70% of steps show a teacher that never slips
                teacher_slip=0.2,     # then each running-sum digit is wrong with this probability
                interrupt_frac=0.1)   # demonstrations cut at a random point + the phrase
BUILD_VERSION = 1  # bump when the build code changes, so cached models are rebuilt
CACHE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache")


class DataError(ValueError):
    """Bad input (file, line, field named in the message): print it on one line and exit non-zero."""


@dataclass
class Prompt:
    id: str               # "builtin:17" (draw number), or "file.jsonl:12" (file name and line)
    text: str             # the problem as written (before any chat template)
    input_ids: list       # what the sampler feeds the model: chat template applied when there is one
    answer: str           # the reference answer ("" for code)
    difficulty: int = 0   # built-in task: number of terms; datasets: 0
    domain: str = ""      # "builtin", the file's stem, or the row's "domain" field: val_reward_<domain>
    code: dict = None     # code problems: their tests, as sandbox.passes() keywords (tests, fn_name | test)
    weight: float = None  # the domain's weight from data_path ("file.jsonl:2"); None: datasets pooled
    opens_thinking: bool = False  # the prompt as fed to the model ends inside <think> (some chat templates)

# -----------------------------------------------------------------------------
# the built-in task: problems, the noisy teacher, the checker

def make_problem(rng, min_terms=2, max_terms=12, max_term=3):
    """-> (prompt text, answer, terms), e.g. ("a3b0c2", "5", [3, 0, 2])."""
    terms = [rng.randint(0, max_term) for _ in range(rng.randint(min_terms, max_terms))]
    text = "".join(f"{LETTERS[i]}{t}" for i, t in enumerate(terms))
    return text, str(sum(terms) % 10), terms


def teacher_completion(terms, rng, slip=0.0, cut=None):
    """The teacher's demonstration as (thinking, forced, answer) strings. With probability `slip`
    a running-sum digit is replaced by a random wrong one and the sum carries on from it. cut=k
    keeps k chain tokens (letters and digits) and appends the interruption phrase (`forced`);
    the answer is then the running sum written so far."""
    total, chain, written = 0, [], []
    for i, t in enumerate(terms):
        total = (total + t) % 10
        if rng.random() < slip:
            total = (total + rng.randint(1, 9)) % 10
        chain += [LETTERS[i], str(total)]
        written.append(str(total))
    if cut is None:
        return THINK_START + "".join(chain) + THINK_END, "", written[-1]
    kept = chain[:cut]
    return THINK_START + "".join(kept), INTERRUPT_PHRASE, written[cut // 2 - 1] if cut >= 2 else "0"


def final_answer(completion_text):
    """The text after the last </think>, stripped (None when there is no </think>)."""
    if THINK_END not in completion_text:
        return None
    answer = completion_text.rsplit(THINK_END, 1)[1].strip()
    return answer.removesuffix("<eos>").strip()  # in case the caller decoded the special tokens


def scored_text(prompt, completion_text):
    """What a math or code completion is scored on: its final answer; all of it when no thinking
    was opened (models that do not think); None when thinking was opened, by the prompt or the
    completion, and never closed (an answer inside unfinished reasoning earns nothing)."""
    answer = final_answer(completion_text)
    if answer is not None:
        return answer
    return None if prompt.opens_thinking or THINK_START in completion_text else completion_text


def builtin_reward(prompt, completion_text):
    """+1 if the answer after </think> is exactly the reference, else -1 (ScaleRL's rewards)."""
    return 1.0 if final_answer(completion_text) == prompt.answer else -1.0

# -----------------------------------------------------------------------------
# real datasets: JSONL math problems scored by math-verify, code problems run in the sandbox

def read_jsonl(path, prompt_field=None, answer_field="answer"):
    """-> list of dict(line, text, answer, code, domain), one per problem. prompt_field None: "prompt",
    else "problem". A row is math when it has answer_field, code when it has "tests" or "test"."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: malformed JSON ({e.msg}, column {e.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            where, has = f"{path}:{lineno}", f"(has: {', '.join(row) or 'none'})"
            field = prompt_field or ("prompt" if "prompt" in row else "problem")
            is_code = answer_field not in row and ("tests" in row or "test" in row)
            wanted = [(field, repr(field) if prompt_field else "'prompt' or 'problem'")]
            if not is_code:
                wanted.append((answer_field, repr(answer_field) if answer_field in row else
                               f"{answer_field!r} (math) or 'tests' / 'test' (code)"))
            for name, shown in wanted:
                value = row.get(name)
                if value is None or (isinstance(value, str) and not value.strip()):
                    raise DataError(f"{where}: missing field {shown} {has}")
            if not isinstance(row[field], str):
                raise DataError(f"{where}: field {field!r} must be a string")
            if answer_field in row and ("tests" in row or "test" in row):
                raise DataError(f"{where}: both {answer_field!r} (math) and {'tests' if 'tests' in row else 'test'!r} (code); keep one")
            domain = row.get("domain", os.path.splitext(os.path.basename(path))[0])
            if "domain" in row and not (isinstance(domain, str) and re.fullmatch(r"[\w.-]+", domain)):
                raise DataError(f"{where}: field 'domain' must be a name of letters, digits, '_', '.' or '-'")
            if domain == "builtin":
                raise DataError(f"{where}: the domain 'builtin' is the built-in task's; rename the file or set a 'domain' field")
            rows.append(dict(line=lineno, text=row[field], answer="" if is_code else str(row[answer_field]).strip(),
                             code=code_tests(row, where) if is_code else None, domain=domain))
    if not rows:
        raise DataError(f"{path}: empty file, no rows")
    return rows


def code_tests(row, where):
    """A code row's tests as sandbox.passes() keywords, or a DataError naming the field."""
    if "test" in row:  # assert style
        test = row["test"]
        if "tests" in row or "fn_name" in row:
            raise DataError(f"{where}: field 'test' (asserts) cannot go with 'tests' or 'fn_name'")
        if not isinstance(test, str) or not test.strip():
            raise DataError(f"{where}: field 'test' must be a non-empty string of Python asserts")
        try:
            ast.parse(test)
        except SyntaxError as e:
            raise DataError(f"{where}: field 'test' is not valid Python ({e.msg}, line {e.lineno})") from None
        return dict(test=test)
    tests, fn_name = row["tests"], row.get("fn_name")
    if fn_name is not None and not (isinstance(fn_name, str) and fn_name.isidentifier()):
        raise DataError(f"{where}: field 'fn_name' must be a Python identifier, got {fn_name!r}")
    if not isinstance(tests, list) or not tests:
        raise DataError(f"{where}: field 'tests' must be a non-empty list of {{\"input\": ..., \"output\": ...}}")
    for i, t in enumerate(tests):
        if not isinstance(t, dict) or "input" not in t or "output" not in t:
            raise DataError(f"{where}: field 'tests[{i}]' must be an object with 'input' and 'output'")
        if fn_name is None and not (isinstance(t["input"], str) and isinstance(t["output"], str)):
            raise DataError(f"{where}: field 'tests[{i}]': stdin/stdout tests take strings (arguments need 'fn_name')")
        if fn_name is not None and not isinstance(t["input"], list):
            raise DataError(f"{where}: field 'tests[{i}].input' must be the list of arguments of {fn_name}()")
    return dict(tests=tests, fn_name=fn_name) if fn_name else dict(tests=tests)


@lru_cache(maxsize=100_000)
def _parse_gold(answer, timeout):
    from math_verify import parse
    return parse(answer if "$" in answer or "\\boxed" in answer else f"${answer}$", parsing_timeout=timeout)


def math_reward(prompt, completion_text):
    """+1 if math-verify finds the reference answer in the completion's final answer, else -1.
    The thinking is stripped first (scored_text); math-verify extracts \\boxed{...} or the last
    expression and compares symbolically, so \\frac{1}{2} == 0.5. Its timeouts use SIGALRM, which
    only works on the main thread."""
    from math_verify import parse, verify
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    answer = scored_text(prompt, completion_text)
    if answer is None:
        return -1.0
    predicted = parse(answer, parsing_timeout=timeout)
    try:
        return 1.0 if verify(_parse_gold(prompt.answer, timeout), predicted, timeout_seconds=timeout) else -1.0
    except Exception:  # math-verify raises on some exotic inputs: count them as wrong
        return -1.0


FENCE = re.compile(r"^```[ \t]*([\w+-]*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def extract_program(prompt, completion_text):
    """The program of a code completion: the last ```python (```py, ```python3 or bare ```) block
    of its final answer, fences on their own lines; None when there is none."""
    answer = scored_text(prompt, completion_text)
    blocks = [body for lang, body in FENCE.findall(answer or "") if lang.lower() in ("", "python", "py", "python3")]
    return blocks[-1] if blocks else None


def code_reward(prompt, completion_text):
    """+1 if the completion's program passes every test of the prompt in the sandbox, else -1."""
    program = extract_program(prompt, completion_text)
    return 1.0 if program is not None and sandbox.passes(program, **prompt.code) else -1.0


def reward(prompt, completion_text):
    """+1.0 | -1.0 for a prompt of any domain: its tests, the built-in checker, or math-verify."""
    score = code_reward if prompt.code else builtin_reward if prompt.domain == "builtin" else math_reward
    return score(prompt, completion_text)


def score_batch(score, pairs):
    """[(prompt, completion_text), ...] -> [+1.0 | -1.0, ...]: a whole step at once. The code
    completions run in the sandbox's pool in parallel; the others are scored by `score` here, on the
    calling thread (math-verify's timeouts need the main thread)."""
    programs = [extract_program(p, text) if p.code else None for p, text in pairs]
    passed = sandbox.score_many([dict(program=program, **p.code) for (p, _), program in zip(pairs, programs)
                                 if program is not None])  # started: they run while the rest is scored here
    rewards = [None if program is not None else -1.0 if p.code else score(p, text) for (p, text), program in zip(pairs, programs)]
    return [(1.0 if next(passed) else -1.0) if r is None else r for r in rewards]


for _score in (builtin_reward, math_reward, code_reward, reward):
    _score.batch = partial(score_batch, _score)  # reward_fn.batch(pairs): what train.py calls once a step

# -----------------------------------------------------------------------------
# load a task: prompts, held-out split, reward

def load_tokenizer(path):
    from transformers import AutoTokenizer
    if not os.path.isfile(os.path.join(path, "tokenizer.json")) and \
            not os.path.isfile(os.path.join(path, "tokenizer_config.json")):
        raise DataError(f"{path}: no tokenizer found (tokenizer.json or tokenizer_config.json)")
    return AutoTokenizer.from_pretrained(path)


def encode_prompt(tokenizer, text):
    """Prompt text -> input ids, through the chat template when the tokenizer has one."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
        return tokenizer.encode(text, add_special_tokens=False)  # the template holds any BOS
    return tokenizer.encode(text, add_special_tokens=True)


def parse_data_path(data_path):
    """"builtin,math.jsonl:2,code.jsonl:1" -> [("builtin", None), ("math.jsonl", 2.0), ("code.jsonl", 1.0)]:
    comma-separated datasets, each with an optional weight after the last ':' (see Curriculum)."""
    sources = []
    for entry in map(str.strip, data_path.split(",")):
        path, _, weight = entry.rpartition(":")
        try:
            weight = float(weight)
        except ValueError:  # no weight (or a ':' inside the path)
            path, weight = entry, None
        if not path:
            raise DataError(f"data_path={data_path!r}: an empty entry")
        if weight is not None and not (math.isfinite(weight) and weight > 0):
            raise DataError(f"data_path={data_path!r}: the weight of {path} must be a positive number")
        sources.append((path, weight))
    if len({weight is None for _, weight in sources}) > 1:
        raise DataError(f"data_path={data_path!r}: give every dataset a weight, or none")
    if len({path for path, _ in sources}) < len(sources):
        raise DataError(f"data_path={data_path!r}: a dataset appears twice")
    return sources


def load_task(data, tokenizer, n_train, n_val, seed=0, prompt_field=None, answer_field="answer"):
    """-> (train_prompts, val_prompts, reward_fn); reward_fn(prompt, completion_text) -> +1.0 | -1.0,
    and reward_fn.batch([(prompt, completion_text), ...]) -> [+1.0 | -1.0, ...] scores a whole step
    (the code in parallel in the sandbox's pool).

    data: "builtin" (n_train i.i.d. problems, and n_val distinct held-out ones that never appear
    in training), a JSONL path (a seeded shuffle: n_val held out, then at most n_train of the
    rest; n_train None takes all), or several of them, comma-separated, with optional weights
    ("builtin:3,data/example_code.jsonl:1"). n_train and n_val count per domain, and each dataset
    is split as if it were alone. tokenizer: a tokenizer, or the path of a directory holding one."""
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer)
    train, val, domain_weights, kinds = [], [], {}, set()
    for path, weight in parse_data_path(data):
        if path == "builtin":
            more_train, more_val = builtin_split(tokenizer, n_train, n_val, seed)
            kinds.add("builtin")
        else:
            more_train, more_val = jsonl_split(path, tokenizer, n_train, n_val, seed, prompt_field, answer_field)
            kinds |= {"code" if p.code else "math" for p in more_train + more_val}
        for p in more_train + more_val:
            p.weight = weight
            if domain_weights.setdefault(p.domain, weight) != weight:
                raise DataError(f"data_path={data!r}: domain {p.domain!r} gets two weights ({domain_weights[p.domain]} and {weight})")
        train, val = train + more_train, val + more_val
    if "code" in kinds and sandbox.isolation()["python"] is None:
        raise DataError(f"data_path={data!r}: code problems, but the sandbox runs no Python: {sandbox.isolation()['error']}")
    reward_fn = dict(builtin=builtin_reward, math=math_reward, code=code_reward)[kinds.pop()] if len(kinds) == 1 else reward
    return train, val, reward_fn


def builtin_split(tokenizer, n_train, n_val, seed):
    if n_train is None:
        raise DataError("the built-in task needs a number of training prompts (n_train)")
    rng = random.Random(seed)
    val, seen, drawn = [], set(), 0
    while len(val) < n_val:
        text, answer, terms = make_problem(rng, **TINY_TASK)
        if text not in seen:
            seen.add(text)
            val.append(Prompt(f"builtin:{drawn}", text, encode_prompt(tokenizer, text), answer, len(terms), "builtin"))
        drawn += 1
    train = []
    while len(train) < n_train:
        text, answer, terms = make_problem(rng, **TINY_TASK)
        if text not in seen:
            train.append(Prompt(f"builtin:{drawn}", text, encode_prompt(tokenizer, text), answer, len(terms), "builtin"))
        drawn += 1
    return train, val


def jsonl_split(path, tokenizer, n_train, n_val, seed, prompt_field, answer_field):
    rows = read_jsonl(path, prompt_field, answer_field)
    random.Random(seed).shuffle(rows)
    by_domain = defaultdict(list)  # in the shuffled order
    for row in rows:
        by_domain[row["domain"]].append(row)
    train, val = [], []
    for domain, rows in by_domain.items():
        if n_val >= len(rows):
            raise DataError(f"{path}: n_val={n_val} held-out prompts must be fewer than the file's {len(rows)} rows"
                            + (f" of domain {domain!r}" if len(by_domain) > 1 else ""))
        prompts = []
        for row in rows[:n_val + (len(rows) if n_train is None else n_train)]:
            input_ids = encode_prompt(tokenizer, row["text"])
            fed = tokenizer.decode(input_ids)
            prompts.append(Prompt(f"{os.path.basename(path)}:{row['line']}", row["text"], input_ids, row["answer"],
                                  domain=domain, code=row["code"], opens_thinking=fed.rfind(THINK_START) > fed.rfind(THINK_END)))
        train, val = train + prompts[n_val:], val + prompts[:n_val]
    return train, val

# -----------------------------------------------------------------------------
# the curriculum: epochs in a seeded order, No-Positive-Resampling

class Curriculum:
    """Hands out training prompt indices, epoch after epoch, each epoch in a fresh seeded order.

    No-Positive-Resampling (ScaleRL sec. 3.4): a prompt whose latest group of G samples passed at
    a rate >= threshold is retired: it is never handed out again (ours: the latest group decides,
    and retirement is final). npr=False is the ablation: uniform sampling, nothing retired.
    next() returns None once every prompt is retired: the caller logs it and stops cleanly.

    Several datasets with weights (domains and weights: one entry per prompt, from Prompt.domain
    and Prompt.weight; ours): each domain is its own stream of seeded epochs, and next() picks the
    stream by smooth weighted round-robin, so over any window the domains are drawn in proportion
    to their weights (2:1 -> a a b a a b ..., with no sampling noise), a domain whose prompts are
    all retired dropping out. Without weights, one stream over every prompt: datasets are pooled."""

    def __init__(self, n_prompts, seed=0, npr=True, threshold=0.9, domains=None, weights=None):
        self.n_prompts, self.seed, self.npr, self.threshold = n_prompts, seed, npr, threshold
        self.pass_rate_history = [[] for _ in range(n_prompts)]
        self.retired = set()
        self.domains, self.weights, stream_of = [None], [1.0], [0] * n_prompts  # one pooled stream
        if weights is not None and any(w is not None for w in weights):
            weight_of = {}
            for domain, weight in zip(domains, weights):
                if weight is None or not weight > 0 or weight_of.setdefault(domain, weight) != weight:
                    raise DataError(f"curriculum: domain {domain!r} needs one positive weight, got {weight} "
                                    f"and {weight_of.get(domain)}")
            if len(weight_of) > 1:  # a single weighted domain is just the plain curriculum
                self.domains, self.weights = list(weight_of), list(weight_of.values())
                stream_of = [self.domains.index(d) for d in domains]
        self.members = [[i for i, k in enumerate(stream_of) if k == stream] for stream in range(len(self.domains))]
        self.epochs, self.positions = [0] * len(self.domains), [0] * len(self.domains)  # how far into its epoch each stream is
        self.credits = [0.0] * len(self.domains)  # the weighted round-robin's
        self._orders = {}  # stream -> (epoch, its order), computed once per epoch

    @property
    def epoch(self):  # the epoch of the stream furthest behind (of the only one, without weights)
        return min(self.epochs)

    def order(self, epoch, stream=0):
        """A stream's order in epoch e: a permutation of its prompts seeded by (seed, e), and the
        stream's number with several, so the state need not store it."""
        if self._orders.get(stream, (None,))[0] != epoch:
            key = [self.seed, epoch] + ([stream] if len(self.domains) > 1 else [])
            members = self.members[stream]
            self._orders[stream] = (epoch, [members[i] for i in np.random.default_rng(key).permutation(len(members))])
        return self._orders[stream][1]

    def next(self):
        if len(self.retired) == self.n_prompts:
            return None
        live = [k for k, members in enumerate(self.members) if any(i not in self.retired for i in members)]
        for k in live:  # smooth weighted round-robin (nginx's): the largest credit goes, and pays the total
            self.credits[k] += self.weights[k]
        stream = max(live, key=lambda k: self.credits[k])
        self.credits[stream] -= sum(self.weights[k] for k in live)
        while True:
            if self.positions[stream] == len(self.members[stream]):
                self.epochs[stream], self.positions[stream] = self.epochs[stream] + 1, 0
            index = self.order(self.epochs[stream], stream)[self.positions[stream]]
            self.positions[stream] += 1
            if index not in self.retired:  # checked here: a group may finish after the epoch began
                return index

    def update(self, index, pass_rate):
        self.pass_rate_history[index].append(float(pass_rate))
        if self.npr and pass_rate >= self.threshold:
            self.retired.add(index)

    @property
    def retired_count(self):
        return len(self.retired)

    def state_dict(self):
        several = len(self.domains) > 1  # one stream: the format of a single dataset, unchanged
        state = dict(n_prompts=self.n_prompts, seed=self.seed, npr=self.npr, threshold=self.threshold,
                     epoch=list(self.epochs) if several else self.epochs[0],
                     position=list(self.positions) if several else self.positions[0], retired=sorted(self.retired),
                     pass_rate_history=[list(h) for h in self.pass_rate_history])
        return dict(state, domains=list(self.domains), credits=list(self.credits)) if several else state

    def load_state_dict(self, d):
        if d["n_prompts"] != self.n_prompts:
            raise DataError(f"curriculum state is for {d['n_prompts']} prompts, this run has {self.n_prompts}")
        if d.get("domains", [None]) != self.domains:
            raise DataError(f"curriculum state is for the weighted domains {d.get('domains', 'none (pooled)')}, "
                            f"this run has {self.domains if len(self.domains) > 1 else 'none (pooled)'}")
        self.seed, self.npr, self.threshold, self._orders = d["seed"], d["npr"], d["threshold"], {}
        self.epochs, self.positions = [d[k] if isinstance(d[k], list) else [d[k]] for k in ("epoch", "position")]
        self.credits, self.retired = list(d.get("credits", [0.0])), set(d["retired"])
        self.pass_rate_history = [list(h) for h in d["pass_rate_history"]]

# -----------------------------------------------------------------------------
# the tiny tokenizer and base model

def build_tokenizer():
    """Character-level Hugging Face fast tokenizer: printable ASCII and newline, one token each;
    <pad> <eos> <unk> special; <think>, </think> and the interruption phrase's words as single
    tokens that are *not* special, so decoding with skip_special_tokens=True keeps them. The phrase
    is one token plus </think>: two forced decode steps instead of ~80 characters (ours)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    specials = ["<pad>", "<eos>", "<unk>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(specials + chars)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character
    tok.decoder = decoders.Fuse()  # join the characters back with nothing in between
    tok.add_special_tokens([AddedToken(t, special=True) for t in specials])
    words = [THINK_START, THINK_END, INTERRUPT_PHRASE.removesuffix(THINK_END)]
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in words])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>", model_max_length=TINY_MODEL["max_position_embeddings"])


def demonstration_batch(tokenizer, rng, batch_size, slip, interrupt_frac):
    """Teacher demonstrations as right-padded (B, T) input ids and a (B, T) mask of the tokens the
    model is trained on: the completion, minus the forced interruption phrase."""
    rows, masks = [], []
    for _ in range(batch_size):
        text, _, terms = make_problem(rng, **TINY_TASK)
        cut = rng.randint(1, 2 * len(terms)) if rng.random() < interrupt_frac else None
        thinking, forced, answer = teacher_completion(terms, rng, slip, cut)
        parts = [(text, 0), (thinking, 1), (forced, 0), (answer, 1)]
        ids = [tokenizer.encode(s, add_special_tokens=False) for s, _ in parts]
        rows.append(sum(ids, []) + [tokenizer.eos_token_id])
        masks.append(sum(([m] * len(i) for i, (_, m) in zip(ids, parts)), []) + [1])
    T = max(map(len, rows))
    input_ids = torch.tensor([r + [tokenizer.pad_token_id] * (T - len(r)) for r in rows])
    mask = torch.tensor([m + [0] * (T - len(m)) for m in masks], dtype=torch.float32)
    return input_ids, mask


def warm_up(model, tokenizer, seed, steps, batch_size, lr, warmup, clean_frac, teacher_slip, interrupt_frac):
    """Supervised warm-up on teacher demonstrations (the paper starts RL from an SFT checkpoint):
    AdamW, linear warm-up then cosine decay to lr/10, loss on the completion tokens only."""
    from tqdm import tqdm
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    model.train()
    for step in (bar := tqdm(range(steps), desc="warm-up", file=sys.stderr, mininterval=2)):
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))
        slip = 0.0 if step < clean_frac * steps else teacher_slip
        input_ids, mask = demonstration_batch(tokenizer, rng, batch_size, slip, interrupt_frac)
        logprobs = token_logprobs(model, input_ids)  # (B, T-1): log p(input_ids[:, t+1])
        loss = -(logprobs * mask[:, 1:]).sum() / mask[:, 1:].sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    return loss.item()


def build_settings(seed=0, **overrides):
    settings = dict(version=BUILD_VERSION, seed=seed, task=TINY_TASK, model=TINY_MODEL, sft=dict(TINY_SFT))
    for key, value in overrides.items():
        if key not in TINY_SFT:
            raise ValueError(f"unknown warm-up setting {key!r} (known: {', '.join(TINY_SFT)})")
        settings["sft"][key] = value
    return settings


def default_model_dir(seed=0, **overrides):
    """.cache/tiny-<hash of the build settings> inside the repository (gitignored)."""
    settings = json.dumps(build_settings(seed, **overrides), sort_keys=True)
    return os.path.join(CACHE_DIR, f"tiny-{hashlib.sha256(settings.encode()).hexdigest()[:10]}")


def build_tiny_model(model_dir=None, seed=0, **overrides):
    """Build the tokenizer and the warm-started tiny model as a Hugging Face directory, or reuse it
    if it is already there. Default location: .cache/tiny-<hash of the settings> in the repo, so
    changed settings rebuild. The build writes a temporary directory and renames it into place, so
    a killed build never looks complete. overrides: TINY_SFT keys (e.g. steps=20 for tests).
    Same seed and settings -> bit-identical safetensors (checked here across 1 and 2 threads and
    transformers 5.19 and 5.24; other CPUs may round differently)."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    settings = build_settings(seed, **overrides)
    model_dir = model_dir or default_model_dir(seed, **overrides)
    if os.path.isfile(os.path.join(model_dir, "build.json")):  # only a finished build has it
        return model_dir
    if os.path.exists(model_dir):
        raise DataError(f"{model_dir}: exists but holds no finished build (no build.json); remove it or pick another")
    started = time.time()
    tokenizer = build_tokenizer()
    # Llama, not Qwen2: transformers' AutoTokenizer (and so vLLM) swaps in Qwen2Tokenizer for any
    # qwen2 directory, changing the ids. Untied embeddings: vLLM's weight reload mishandles tied ones.
    config = LlamaConfig(vocab_size=len(tokenizer), **TINY_MODEL,
                         num_key_value_heads=TINY_MODEL["num_attention_heads"], tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float()
    final_loss = warm_up(model, tokenizer, seed, **settings["sft"])
    # sampling defaults = the RL distribution: temperature 1, no top-k / top-p truncation
    model.generation_config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                               eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    parent = os.path.dirname(os.path.abspath(model_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(model_dir) + ".tmp-", dir=parent)
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the model directory is not
    try:
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)
        with open(os.path.join(tmp, "build.json"), "w") as f:
            json.dump(dict(settings, final_loss=round(final_loss, 4),
                           parameters=sum(p.numel() for p in model.parameters())), f, indent=1)
        os.rename(tmp, model_dir)  # atomic; fails if another process finished the same build first
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isfile(os.path.join(model_dir, "build.json")):
            raise
    print(f"built {model_dir} in {time.time() - started:.0f} s", file=sys.stderr)
    return model_dir

# -----------------------------------------------------------------------------
# measuring a model's pass rate, with the training sampler (sample.py) and the training budgets

@torch.no_grad()
def measure_pass_rate(model_dir, n_prompts=200, samples=8, seed=1234):
    """Validation pass rate of a built-in-task model at temperature 1, interrupted like training:
    pass@1 (mean over prompts and samples), pass@samples, interrupted fraction, pass@1 by difficulty."""
    from transformers import AutoModelForCausalLM
    from sample import TorchSampler
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    _, val, reward_fn = load_task("builtin", tokenizer, 0, n_prompts, seed)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)
    sampler = TorchSampler(model, temperature=1.0, max_seqs=512, seed=seed, eos_ids=[tokenizer.eos_token_id],
                           think_end_ids=encode(THINK_END), interrupt_ids=encode(INTERRUPT_PHRASE),
                           think_budget=TINY_THINK_BUDGET, answer_budget=TINY_ANSWER_BUDGET)
    for i, prompt in enumerate(val):
        sampler.add(i, prompt.input_ids, samples)
    passed, interrupted = {}, 0
    while sampler.num_unfinished:
        sampler.step()
        for group in sampler.pop_finished():
            prompt = val[group.prompt_id]
            passed[prompt.id] = [reward_fn(prompt, tokenizer.decode(c.token_ids, skip_special_tokens=True)) > 0
                                 for c in group.completions]
            interrupted += sum(c.interrupted for c in group.completions)
    by_difficulty = defaultdict(list)
    for prompt in val:
        by_difficulty[prompt.difficulty].append(np.mean(passed[prompt.id]))
    return dict(pass_at_1=float(np.mean([np.mean(v) for v in passed.values()])),
                pass_at_k=float(np.mean([any(v) for v in passed.values()])), k=samples,
                interrupted=interrupted / (len(val) * samples),
                by_difficulty={n: round(float(np.mean(v)), 3) for n, v in sorted(by_difficulty.items())})

# -----------------------------------------------------------------------------

def main(argv):
    args = dict(a.removeprefix("--").split("=", 1) for a in argv if "=" in a)
    unknown = [a for a in argv if "=" not in a] + [k for k in args if k not in ("seed", "data")]
    if unknown:
        raise DataError(f"unknown argument {unknown[0]!r}; usage: python data.py [--seed=N] [--data=FILE.jsonl]")
    if "data" in args:
        rows = read_jsonl(args["data"])
        print(f"{args['data']}: {len(rows)} problems")
        return
    started = time.time()
    model_dir = build_tiny_model(seed=int(args.get("seed", 0)))
    with open(os.path.join(model_dir, "build.json")) as f:
        build = json.load(f)
    print(f"model {model_dir}: {build['parameters']:,} parameters, warm-up loss {build['final_loss']} "
          f"(ready in {time.time() - started:.0f} s)")
    stats = measure_pass_rate(model_dir)
    print(f"validation at temperature 1, 200 prompts x {stats['k']}: pass@1 {stats['pass_at_1']:.3f} | "
          f"pass@{stats['k']} {stats['pass_at_k']:.3f} | interrupted {stats['interrupted']:.3f}")
    print("pass@1 by number of terms: " + " ".join(f"{n}:{r:.2f}" for n, r in stats["by_difficulty"].items()))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
