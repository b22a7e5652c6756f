"""
Rewards: +1 for a solved problem, -1 for anything else (ScaleRL), in every domain: the built-in task's digit,
a math problem's final answer, a program's tests (judge.py). A policy optimises whatever a reward pays for
(RL found `12 / 2 =` paid for gold 6 within half an hour here), so the math reward is written against an
adversary (ours, after verl's string match and PRM800K's grader; README's "Your own model and data"): one
final answer, a hedge is -1; numeric gold wants a literal compared exactly; symbolic gold gets math-verify,
decimals taken exactly, costly answers refused before parsing and the rest under a wall-clock limit that holds
in any thread. The text scored: after the last </think>; all of it when no thinking was opened; -1 when
thinking was opened and never closed.

    python benchmarks/rewards.py     # 256 adversarial answers and 256 honest ones, timed
"""
import json
import queue
import re
import select
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from functools import lru_cache
from itertools import accumulate

import judge
from data import THINK_END, THINK_START

TAIL = 400             # characters at the end of the scored text that hold the final answer (ours)
LONGEST = 200          # a final answer longer than this is -1 before any parsing (ours)
DEEPEST = 10           # ... and one nested deeper than this in brackets (ours)
TIMEOUT = 2.0          # seconds math-verify may spend on one symbolic answer, in any thread (ours; train.py's
WORKERS = 2            # verify_timeout); math-verify's worker processes


def scored_text(prompt, completion_text):
    """The text after a completion's last </think>; all of it when no thinking was opened; None when thinking
    was opened (by the prompt or the completion) and never closed."""
    if THINK_END in completion_text:
        return completion_text.rsplit(THINK_END, 1)[1].strip().removesuffix("<eos>").strip()
    return None if prompt.opens_thinking or THINK_START in completion_text else completion_text


FENCE = re.compile(r"^```[ \t]*([\w+-]*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def extract_program(prompt, completion_text):
    """The program of a code completion: the last ```python (```py, ```python3 or bare ```) block of its
    final answer, fences on their own lines; None when there is none."""
    answer = scored_text(prompt, completion_text)
    languages = ("", "python", "py", "python3")
    blocks = [body for lang, body in FENCE.findall(answer or "") if lang.lower() in languages]
    return blocks[-1] if blocks else None

# -----------------------------------------------------------------------------
# the final answer of a math completion, and a number it states

MARKER = re.compile(r"(?i)\b(?:final\s+)?answer\s*(?:is\s*:?|:|=)|####")
SENTENCE_END = re.compile(r"(?<=[.!?])(?<!\.\.)\s+|\n+")  # not after an ellipsis
HEDGE = re.compile(r"(?is)\d.*\bor\b.*\d")  # 'or' between numbers: 5 or 6, x = 5 or x = 6
MATH_SPAN = re.compile(r"\$+([^$]+)\$+|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
UNWRAP = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
# formatting that is not the answer: \\$ and $, \\%, \\( \\) \\[ \\], \\left \\right, LaTeX spaces,
# degrees, **bold**
DROP = re.compile(r"\\[$%]|\$|\\[()\[\]]|\\left|\\right|\\[,;:! ]|\^\s*\{?\s*\\circ\s*\}?|°"
                  r"|(?<!\w)\*\*(?=\S)|(?<=\S)\*\*(?!\w)")
TOKEN = re.compile(r"""(?P<fraction>-?\\[dt]?frac\s*(?:\{\s*-?\d+\s*\}|\d)\s*(?:\{\s*\d+\s*\}|\d)
                             |-?\d+\s*/\s*\d+(?!\.?\d))
    |(?P<number>-?(?:\d{1,3}(?:,\d{3})+(?![,\d])|\d+)(?:\.\d+)?|-?\.\d+)
    |(?P<equals>=)|(?P<op>(?<=\d)\s*x\s*(?=\d)|[-+*/^×÷·!<>|]|\\[a-zA-Z]+)|(?P<space>\s+)
    |(?P<separator>\.{2,}|…|[,;&]|\b(?:or|and|to)\b)|(?P<word>[^\W\d_]+)|(?P<other>.)""", re.VERBOSE)
TOWER = re.compile(r"\^\s*(?:\{[^{}]*\^|\(?[\w.]+\)?\s*\^|\{?\s*\d{4,})|\*\*\s*\(?(?:[\w.]+\)?\s*\*\*|\d{4,})"
                   r"|\d{3,}\s*!|\d{25,}")
# (10^{10^{10}}, 9^9^9, 9**9**9, 2**(2**64), 2^{1000}, 1000!, huge literals)


def boxed(text):
    """Every \\boxed{...} (or \\fbox{...}) in text, braces balanced; None for an unclosed one."""
    found = []
    for match in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, start = 1, match.end()
        for end in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                found.append(text[start:end])
                break
        else:
            found.append(None)
    return found


def final_answer(text):
    """-> (answer, where a hedge counts): the \\boxed{} of the text's tail (None when the boxes differ or one
    is unclosed), else the last sentence holding a number (or the last one) after the last answer marker, or
    of the tail. A hedge counts after the marker (so "5. Or 6." is one), else in that sentence."""
    tail = text[-TAIL:].replace("\u2212", "-")  # the Unicode minus
    boxes = boxed(tail)
    if boxes:
        one = None not in boxes and len({re.sub(r"\s+", "", b) for b in boxes}) == 1
        return (boxes[-1] if one else None), boxes[-1] or ""
    markers = list(MARKER.finditer(tail))
    region = tail[markers[-1].end():] if markers else tail
    sentences = [s for s in SENTENCE_END.split(region) if s.strip()] or [""]
    last = [s for s in sentences if re.search(r"\d", s)][-1:] or sentences[-1:]
    return last[0], region if markers else last[0]


def literal(answer, canonical=True):
    """The one number a final answer states, as a Fraction, else None: an operation left in it (after the
    last '=' of a chain), a list, or no number. canonical: fractions in lowest terms only (12/2 is not 6)."""
    tokens = [(m.lastgroup, m.group()) for m in TOKEN.finditer(DROP.sub(" ", UNWRAP.sub(r" \1 ", answer)))]
    kinds = [kind for kind, _ in tokens]
    if "equals" in kinds:  # a chain: what its last '=' gives
        tokens = tokens[len(kinds) - kinds[::-1].index("equals"):]
    tokens = [(kind, text) for kind, text in tokens if kind != "space"]
    numbers = [i for i, (kind, _) in enumerate(tokens) if kind in ("number", "fraction")]
    if not numbers or any(kind == "op" for kind, _ in tokens):
        return None
    before = [kind for kind, _ in tokens[:numbers[-1]]]
    if (before[:-1] if before[-1:] == ["separator"] else before)[-1:] in (["number"], ["fraction"]):
        return None  # a list (a number before it, a separator between or not): 5 6 7 8, 5, 6, 7, 8, 0 ... 100
    kind, text = tokens[numbers[-1]]
    if kind == "number":
        return Fraction(text.replace(",", ""))
    # \frac{3}{4}, \frac34; else 3/4
    parts = (re.findall(r"\{\s*-?(\d+)\s*\}|(\d)", text.split("frac")[1]) if "frac" in text
             else re.findall(r"(\d+)()", text))
    p, q = (int(a or b) for a, b in parts)
    sign = -1 if text.count("-") % 2 else 1
    lowest = q > 1 and Fraction(p, q).denominator == q
    return Fraction(sign * p, q) if q and (lowest or not canonical) else None


@lru_cache(maxsize=100_000)
def numeric_gold(gold):
    """The gold answer's number if it is a literal (18, 1,000, $5, 42%, 0.5, \\frac{1}{2}), else None."""
    return literal(gold.replace("\u2212", "-"), canonical=False)


def costly(answer):
    """An answer math-verify is not given: too long, nested too deep, a tower of powers or a huge number."""
    deepest = max(accumulate((c in "([{") - (c in ")]}") for c in answer), default=0)
    return len(answer) > LONGEST or deepest > DEEPEST or TOWER.search(answer) is not None


def symbolic(answer):
    """The one expression of a final answer, for math-verify: its $...$ (all alike) or all of it, decimals as
    exact fractions (0.4999999 is not 1/2); None for two different ones, an 'or', or a costly one."""
    spans = {"".join(m).strip() for m in MATH_SPAN.findall(answer)}
    expression = spans.pop() if len(spans) == 1 else None if spans else answer.strip()
    if expression is None or re.search(r"\bor\b", expression) or costly(expression):
        return None
    return re.sub(r"(\d*)\.(\d+)", lambda m: rf"\frac{{{int(m[1] + m[2])}}}{{{10 ** len(m[2])}}}", expression)

# -----------------------------------------------------------------------------
# math-verify in worker processes: a wall-clock limit that holds in any thread (its SIGALRM works in the main
# thread only, and an answer of a few characters can cost sympy minutes)

WORKER = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from math_verify import parse, verify
print("ready", flush=True)
for line in sys.stdin:
    gold, answer = json.loads(line)
    try:
        gold, answer = parse(gold, parsing_timeout=None), parse(answer, parsing_timeout=None)
        ok = verify(gold, answer, timeout_seconds=None)
    except BaseException:
        ok = False
    print(int(bool(ok)), flush=True)
"""


class Verifier:
    """One math-verify worker process: an answer past its time (or one that kills it) is -1 and the worker
    killed; the next answer starts a fresh one (its ~1 s of imports not counted as the answer's)."""

    proc = None  # the worker process, started by the first answer

    def __call__(self, gold, expression, timeout):
        if self.proc is None:
            self.proc = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
            if self.line(120) != b"ready":
                self.stop()
                raise RuntimeError("rewards.py: math-verify's worker did not start (pip install math-verify)")
        try:
            self.proc.stdin.write(json.dumps([gold, expression]).encode() + b"\n")
            verdict = self.line(timeout)
        except OSError:  # it died
            verdict = None
        if verdict is None:
            self.stop()
        return verdict == b"1"

    def line(self, timeout):
        """Its next line of output within `timeout` seconds, else None (it writes each line whole)."""
        ready = select.select([self.proc.stdout], [], [], timeout)[0]
        return (self.proc.stdout.readline().strip() or None) if ready else None

    def stop(self):
        self.proc.kill()
        self.proc.communicate()  # reaped, its pipes closed
        self.proc = None


_verifiers = queue.SimpleQueue()
for _ in range(WORKERS):
    _verifiers.put(Verifier())


@lru_cache(maxsize=100_000)
def verified(gold, expression, timeout):
    """math-verify's verdict on a symbolic answer, from a free worker (a repeated answer costs nothing)."""
    verifier = _verifiers.get()
    try:
        gold = gold if "$" in gold or "\\boxed" in gold else f"${gold}$"
        return verifier(gold, f"${expression}$", timeout)
    finally:
        _verifiers.put(verifier)

# -----------------------------------------------------------------------------
# rewards

def math_reward(gold, text, timeout=TIMEOUT):
    """+1.0 | -1.0 for the scored text of a math completion (the module docstring gives the rules)."""
    answer, hedge_region = final_answer(text)
    if answer is None or HEDGE.search(hedge_region):
        return -1.0
    if (value := numeric_gold(gold)) is not None:
        return 1.0 if literal(answer) == value else -1.0
    expression = symbolic(answer)
    return 1.0 if expression is not None and verified(gold, expression, timeout) else -1.0


def reward(prompt, completion_text, timeout=TIMEOUT):
    """+1.0 | -1.0 for one completion of a prompt of any domain. Built-in: the digit exactly, after thinking.
    Math: math_reward. Code: the program of the last fenced block passes its tests (judge.py)."""
    answer = scored_text(prompt, completion_text)
    if answer is None:
        return -1.0
    if prompt.code:
        program = extract_program(prompt, completion_text)
        return 1.0 if program is not None and judge.passes(program, **prompt.code) else -1.0
    if prompt.domain == "builtin":  # the task is to think first: no '</think>', no answer
        return 1.0 if THINK_END in completion_text and answer == prompt.answer else -1.0
    return math_reward(prompt.answer, answer, timeout)


_scorers = ThreadPoolExecutor(WORKERS, thread_name_prefix="rewards")


def score(pairs, timeout=TIMEOUT):
    """[(prompt, completion_text)] -> [+1.0 | -1.0] in order. Programs run in the sandbox's pool, and the rest
    in threads that feed math-verify's workers, all at once."""
    programs = [extract_program(p, text) if p.code else None for p, text in pairs]
    jobs = [dict(program=program, **p.code) for (p, _), program in zip(pairs, programs)
            if program is not None]
    passed = judge.score_many(jobs)  # started: they run while the rest is scored
    others = _scorers.map(lambda pair: reward(*pair, timeout=timeout),
                          [pair for pair, program in zip(pairs, programs) if program is None])
    return [next(others) if program is None else (1.0 if next(passed) else -1.0) for program in programs]
