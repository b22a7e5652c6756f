"""RL tasks: the built-in task, JSONL rows of every reward kind (rewards.KINDS: math, code;
docs/own_model_and_data.md), their held-out splits, No-Positive-Resampling.

    python data.py --data=FILE.jsonl    # check a JSONL dataset: its size, or its first error
"""
import json
import os
import random
import re
import sys
from collections import Counter, namedtuple
from dataclasses import dataclass

import numpy as np

import configurator
from rewards import KINDS, THINK_END, THINK_START

INTERRUPT_PHRASE = (
    "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"
)
# The built-in task (ours; the paper trains on Polaris-53K math), its prompts i.i.d. from one
# generator (the held-out ones never in training), its base model made by data/builtin/prepare.py:
# 2-20 numbers from 0-3 tagged by letters, the running sum mod 10 after each, then the last:
# a3b0c2d1e2 -> <think>a3b3c5d6e8</think>8.
LETTERS = "abcdefghijklmnopqrstuvwxyz"
TINY_TASK = dict(min_terms=2, max_terms=20, max_term=3)
# completion tokens before the forced interruption (paper: 10k-12k). They cut no correct chain
# (a chain of n numbers ends with '</think>' as completion token 2n + 2, 42 at most), so the
# interruption acts only on runaway chains, as the paper's 10-12k of thinking does.
TINY_THINK_BUDGET = (44, 48)
TINY_ANSWER_BUDGET = 4  # tokens after </think> (paper: 2,048); the answer is 1 digit + <eos>


class DataError(ValueError):
    """Bad input (file, line, field named in the message): print it on one line, exit non-zero."""


@dataclass
class Prompt:
    id: str               # "builtin:17" (draw number), or "file.jsonl:12" (file name and line)
    text: str             # the problem as written (before any chat template)
    input_ids: list       # what the sampler feeds the model:
                          # chat template applied when there is one
    answer: str           # the reference answer ("" for code)
    difficulty: int = 0   # built-in task: number of terms
    domain: str = ""      # "builtin", the file's stem, or the row's "domain" field:
                          # val_reward_<domain>
    kind: str = None      # its reward kind (rewards.KINDS), decided once,
                          # as its row is read (row_kind)
    code: dict = None     # code problems: their tests,
                          # as judge.passes() keywords (tests, fn_name | test)
    weight: float = None  # the domain's weight from data_path ("file.jsonl:2");
                          # None: datasets pooled
    opens_thinking: bool = False  # the prompt as fed to the model ends inside <think>
                                  # (some chat templates)

    def __post_init__(self):
        # a Prompt made by hand (a test, a benchmark) names no kind: its fields give it
        self.kind = self.kind or (
            "code" if self.code else "builtin" if self.domain == "builtin" else "math")


Task = namedtuple("Task", "prompts val_prompts tokenizer eos_ids domains")

# -----------------------------------------------------------------------------
# the built-in task, and JSONL rows

def make_problem(rng, min_terms, max_terms, max_term):  # TINY_TASK's
    """-> (prompt text, answer, terms), e.g. ("a3b0c2", "5", [3, 0, 2])."""
    terms = [rng.randint(0, max_term) for _ in range(rng.randint(min_terms, max_terms))]
    return "".join(f"{LETTERS[i]}{t}" for i, t in enumerate(terms)), str(sum(terms) % 10), terms


def builtin_split(tokenizer, n_train, n_val, seed):
    """-> (train, val): n_val distinct held-out problems, then n_train i.i.d. ones, none of them."""
    if n_train < 1:
        raise DataError("the built-in task draws n_train training prompts: n_train must be >= 1")
    rng, seen, drawn, train, val = random.Random(seed), set(), 0, [], []
    for split, n in ((val, n_val), (train, n_train)):
        while len(split) < n:
            text, answer, terms = make_problem(rng, **TINY_TASK)
            if text not in seen:
                split.append(Prompt(f"builtin:{drawn}", text, encode_prompt(tokenizer, text),
                                    answer, len(terms), "builtin"))
                if split is val:
                    seen.add(text)
            drawn += 1
    return train, val


def read_jsonl(path, prompt_field=None, answer_field="answer"):
    """-> [dict(line, text, answer, code, domain, kind)], or a DataError naming line and field."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                if line.strip():
                    rows.append(dict(read_row(line, path, prompt_field, answer_field), line=n))
            except ValueError as e:  # read_row's, naming the field
                raise DataError(f"{path}:{n}: {e}") from None
    if not rows:
        raise DataError(f"{path}: empty file, no rows")
    return rows


def json_int(digits):
    """A JSON int of any length: Python 3.11 converts 4,300 digits at most, longer in halves."""
    if len(digits) <= 4000:
        return int(digits)
    if digits[0] == "-":
        return -json_int(digits[1:])
    half = len(digits) // 2
    return json_int(digits[:-half]) * 10 ** half + json_int(digits[-half:])


def read_row(line, path, prompt_field, answer_field):
    """A line of the JSONL file at path -> dict(text, answer, code, domain, kind), read by its kind
    (row_kind), or a ValueError naming the field."""
    try:
        row = json.loads(line, parse_int=json_int)
    except json.JSONDecodeError as e:
        raise DataError(f"malformed JSON ({e.msg}, column {e.colno})") from None
    except (ValueError, RecursionError) as e:
        raise DataError(f"malformed JSON ({type(e).__name__}: {str(e)[:100]})") from None
    if not isinstance(row, dict):
        raise DataError(f"expected a JSON object, got {type(row).__name__}")
    missing = lambda named: DataError(f"missing field {named} (has: {', '.join(row) or 'none'})")
    blank = lambda value: value is None or isinstance(value, str) and not value.strip()
    field = prompt_field or ("prompt" if "prompt" in row else "problem")
    if blank(row.get(field)):
        raise missing(repr(field) if prompt_field else "'prompt' or 'problem'")
    kind = row_kind(row, answer_field)
    if not kind:
        raise missing(needed_fields(answer_field))
    if "answer" in KINDS[kind].fields and blank(row[answer_field]):
        raise missing(repr(answer_field))
    if not isinstance(row[field], str):
        raise DataError(f"field {field!r} must be a string")
    domain = row.get("domain", os.path.splitext(os.path.basename(path))[0])
    if "domain" in row and not (isinstance(domain, str) and re.fullmatch(r"[\w.-]+", domain)):
        raise DataError("field 'domain' must be a name of letters, digits, '_', '.' or '-'")
    if domain == "builtin":
        raise DataError("the domain 'builtin' is the built-in task's; "
                        "rename the file or set a 'domain' field")
    read = KINDS[kind].read(row, row[field], row.get(answer_field))
    return dict(text=row[field], answer="", code=None) | read | dict(domain=domain, kind=kind)


def row_kind(row, answer_field="answer"):
    """The kind (rewards.KINDS) whose fields the row has, of two that nest the one with more;
    None for none, a DataError naming two."""
    found = {}
    for kind in KINDS:
        needed = kind_fields(kind, answer_field)
        if needed and all(row.keys() & names for names in needed):
            found[kind] = {f for names in needed for f in names if f in row}
    found = {kind: have for kind, have in found.items()
             if not any(have < other for other in found.values())}
    if len(found) > 1:
        named = [" and ".join(repr(f) for f in row if f in have) + f" ({kind})"
                 for kind, have in found.items()]
        raise DataError(f"both {' and '.join(named)}; keep one")
    return next(iter(found), None)


def kind_fields(kind, answer_field="answer"):
    """A kind's fields as [[a name, or the names one of which], ...], 'answer' as answer_field."""
    return [[answer_field if f == "answer" else f
             for f in ((names,) if isinstance(names, str) else names)]
            for names in KINDS[kind].fields]


def needed_fields(answer_field="answer"):
    """What each kind of row needs: "'answer' (math) or 'tests' / 'test' / 'test_list' (code)"."""
    each = [" and ".join(" / ".join(map(repr, names)) for names in kind_fields(kind, answer_field))
            + f" ({kind})" for kind in KINDS if KINDS[kind].fields]
    return " or ".join(each)


def jsonl_split(path, tokenizer, n_train, n_val, seed, prompt_field, answer_field, template):
    """A seeded shuffle of the file; per domain, n_val held out, then at most n_train (0: all)."""
    rows = read_jsonl(path, prompt_field, answer_field)
    random.Random(seed).shuffle(rows)
    # each domain's rows; domains and rows in the shuffled order
    by_domain = {}
    for row in rows:
        by_domain.setdefault(row["domain"], []).append(row)
    train, val = [], []
    # per domain (ours): every domain's curve gets the same precision
    for domain, rows in by_domain.items():
        if n_val >= len(rows):
            of_domain = f" of domain {domain!r}" if len(by_domain) > 1 else ""
            raise DataError(f"{path}: n_val={n_val} held-out prompts must be fewer than the file's "
                            f"{len(rows)} rows{of_domain}")
        for n, row in enumerate(rows[:n_val + (n_train or len(rows))]):
            input_ids = encode_prompt(tokenizer, template.replace("{problem}", row["text"]))
            (val if n < n_val else train).append(Prompt(
                f"{os.path.basename(path)}:{row['line']}", row["text"], input_ids, row["answer"],
                domain=domain, kind=row["kind"], code=row["code"],
                # the prompt as fed ends inside <think> (some chat templates): a <think> after the
                # last </think>
                opens_thinking=THINK_START in tokenizer.decode(input_ids).rpartition(THINK_END)[2]))
    return train, val

# -----------------------------------------------------------------------------
# loading a task: tokenizer, datasets, split

def load_tokenizer(path):
    from transformers import AutoTokenizer
    if not any(os.path.isfile(os.path.join(path, f))
               for f in ("tokenizer.json", "tokenizer_config.json")):
        raise DataError(f"{path}: no tokenizer found (tokenizer.json or tokenizer_config.json)")
    return AutoTokenizer.from_pretrained(path)


def encode_prompt(tokenizer, text):
    if not getattr(tokenizer, "chat_template", None):
        return tokenizer.encode(text, add_special_tokens=True)
    text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)  # the template holds any BOS


def interruption(tokenizer):
    """The ids the sampler appends at the thinking budget."""
    # the phrase after a blank line, so that it starts a word whatever the model was writing (ours),
    # unless the tokenizer holds the phrase as a token (the tiny model's)
    blank_line = ("" if len(tokenizer.tokenize(INTERRUPT_PHRASE.removesuffix(THINK_END))) == 1
                  else "\n\n")
    return tokenizer.encode(blank_line + INTERRUPT_PHRASE, add_special_tokens=False)


def decode(task, token_ids):
    """A completion's text as the reward reads it, special tokens kept ('</think>' may be one)."""
    return task.tokenizer.decode([t for t in token_ids if t not in task.eos_ids],
                                 skip_special_tokens=False)


def parse_data_path(data_path):
    """"a.jsonl:2,b.jsonl:1" -> [("a.jsonl", 2.0), ("b.jsonl", 1.0)]; no weights: None each."""
    bad = lambda message: DataError(f"data_path={data_path!r}: {message}")
    sources = []
    for entry in map(str.strip, data_path.split(",")):
        path, _, weight = entry.rpartition(":")
        try:
            weight = float(weight)
        except ValueError:  # no weight (or a ':' inside the path)
            path, weight = entry, None
        if not path:
            raise bad("an empty entry")
        if weight is not None and not 0 < weight < float("inf"):
            raise bad(f"the weight of {path} must be a positive number")
        sources.append((path, weight))
    if len({weight is None for _, weight in sources}) > 1:
        raise bad("give every dataset a weight, or none")
    if len({path for path, _ in sources}) < len(sources):
        raise bad("a dataset appears twice")
    return sources


def load_task(data_path, model_path, *args, **kwargs):
    """split_task's Task with the model directory's tokenizer, eos_ids with the model's end-of-turn
    ids (Qwen has 2)."""
    task = split_task(data_path, load_tokenizer(model_path), *args, **kwargs)
    if os.path.isfile(os.path.join(model_path, "generation_config.json")):
        from transformers import GenerationConfig
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
        task.eos_ids.update([eos] if isinstance(eos, int) else eos or [])
    return task


def split_task(data_path, tokenizer, n_train, n_val, seed=0, prompt_field=None,
               answer_field="answer", template="{problem}"):
    """-> Task; n_train (0: every row) and n_val per domain, each dataset split as if alone."""
    train, val, weights = [], [], {}
    split_args = (tokenizer, n_train, n_val, seed)
    for path, weight in parse_data_path(data_path):
        more_train, more_val = (
            builtin_split(*split_args) if path == "builtin"
            else jsonl_split(path, *split_args, prompt_field, answer_field, template))
        for p in more_train + more_val:
            p.weight = weight
            if weights.setdefault(p.domain, weight) != weight:
                raise DataError(f"data_path={data_path!r}: domain {p.domain!r} gets two weights "
                                f"({weights[p.domain]} and {weight})")
        train += more_train
        val += more_val
    return Task(train, val, tokenizer, {tokenizer.eos_token_id}, sorted({p.domain for p in val}))

# -----------------------------------------------------------------------------
# the curriculum: epochs in a seeded order, No-Positive-Resampling

class Curriculum:
    """Prompt indices, a fresh seeded order each epoch, retired ones skipped; None once all are."""

    def __init__(self, n_prompts, seed=0, npr=True, threshold=0.9, domains=None, weights=None):
        self.n_prompts, self.seed = n_prompts, seed
        # npr=False: the ablation (uniform)
        self.npr, self.threshold, self.retired = npr, threshold, set()
        # domains, weights: one entry per prompt
        weight_of = dict(zip(domains, weights)) if weights and None not in weights else {}
        if len(weight_of) < 2:  # no weights, or one weighted domain: one stream, datasets pooled
            weight_of, domains = {None: 1.0}, [None] * n_prompts
        self.domains, self.weights = list(weight_of), list(weight_of.values())
        self.members = [[i for i, d in enumerate(domains) if d == domain] for domain in weight_of]
        # how far each stream is
        self.epochs, self.positions = [0] * len(weight_of), [0] * len(weight_of)
        self.credits = [0.0] * len(weight_of)  # the weighted round-robin's
        self._orders = {}  # stream -> (epoch, its order), computed once per epoch

    def order(self, epoch, stream=0):
        """A stream's order in an epoch: a permutation seeded by (seed, epoch[, stream])."""
        if self._orders.get(stream, (None,))[0] != epoch:
            seed = [self.seed, epoch] + ([stream] if len(self.domains) > 1 else [])
            order = np.random.default_rng(seed).permutation(self.members[stream]).tolist()
            self._orders[stream] = (epoch, order)
        return self._orders[stream][1]

    def next(self):
        if len(self.retired) == self.n_prompts:
            return None
        live = [k for k, members in enumerate(self.members) if not self.retired.issuperset(members)]
        # weighted domains (ours): a stream each, by smooth weighted round-robin
        # (nginx's; no sampling noise): the largest credit goes, and pays the total
        # (2:1 -> a a b a a b ...)
        for k in live:
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
        """No-Positive-Resampling (ScaleRL 3.4): pass_rate >= threshold retires index for good."""
        if self.npr and pass_rate >= self.threshold:  # ours: the latest group decides
            self.retired.add(index)

    def state_dict(self):
        keys = "n_prompts seed npr threshold domains epochs positions credits".split()
        return dict({key: getattr(self, key) for key in keys}, retired=sorted(self.retired))

    def load_state_dict(self, d):
        for key, mine in (("n_prompts", self.n_prompts), ("domains", self.domains)):
            if d[key] != mine:
                raise DataError(f"the checkpoint's curriculum has {key} {d[key]}, this run {mine}")
        self.seed, self._orders = d["seed"], {}
        self.npr, self.threshold, self.retired = d["npr"], d["threshold"], set(d["retired"])
        self.epochs = list(d["epochs"])
        self.positions = list(d["positions"])
        self.credits = list(d["credits"])


if __name__ == "__main__":
    path = configurator.configure(dict(data=""), sys.argv[1:], "data.py")["data"]
    if not path:
        configurator.fail("data.py", "usage: python data.py --data=FILE.jsonl "
                          "(the tiny model: python data/builtin/prepare.py)")
    try:
        kinds = Counter(row["kind"] for row in read_jsonl(path))
        print(f"{path}: {kinds.total()} problems "
              f"({', '.join(f'{n} {kind}' for kind, n in kinds.items())})")
    except DataError as e:
        configurator.fail("data.py", str(e))
