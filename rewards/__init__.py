"""
rewards/: the verifiers. A reader of the recipe needs only `score` and `KINDS` (how a row is read and
a completion scored); a new reward kind is one entry of KINDS here. The rest is the verifiers'
machinery: the math answer's grammar below, judge.py (a program's verdict against its tests),
sandbox.py (running the program isolated), and codec.py and harness.py (the Python that runs inside
the sandbox, read by judge.py as text).

Rewards: +1 for a solved problem, -1 for anything else (ScaleRL): the built-in task's digit, a math
problem's final answer, a program's tests (judge.py). A policy optimises whatever a reward pays for (RL
found `12 / 2 =` paid for gold 6 within half an hour here), so the math reward is written against an
adversary (ours, after verl's string match and PRM800K's grader; docs/rewards.md):
one final answer, a hedge is -1; numeric gold wants a literal compared exactly; symbolic gold gets
math-verify, decimals taken exactly, costly answers refused before parsing and the rest under a
wall-clock limit that holds in any thread.

    python benchmarks/rewards.py     # 256 adversarial answers and 256 honest ones, timed
"""
import ast
import json
import queue
import re
import select
import sys
import unicodedata
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from functools import lru_cache
from itertools import accumulate
from math import prod
from subprocess import DEVNULL, PIPE, Popen

from . import judge

THINK_START, THINK_END = "<think>", "</think>"  # the tags of thinking (data.THINK_START, THINK_END: these)

LONGEST = 200          # a final answer longer than this is -1 before any parsing (ours)
DEEPEST = 10           # ... and one nested deeper than this in brackets (ours)
TIMEOUT = 2.0          # seconds math-verify may spend on one symbolic answer, in any thread (ours; train.py's
WORKERS = 2            # verify_timeout); math-verify's worker processes


def scored_text(prompt, completion, cut=False):
    """The text after the completion's last </think>; all of it when no thinking was opened; None
    when thinking was opened (by the prompt or the completion, or again after its last close) and
    never closed. A text cut by the length cap is read up to its last finished line or sentence (its
    last 15 may have been 150), and is "" unless it answers explicitly there (a closed box, an answer
    marker, a closed block)."""
    if cut:
        ends = list(CLAUSE_END.finditer(completion))
        completion = completion[:ends[-1].start()] if ends else ""
    # open thinking: a <think> after the last </think>, or the prompt's when none closed
    _, closed, text = completion.rpartition(THINK_END)
    if THINK_START in text or prompt.opens_thinking and not closed:
        text = None
    elif closed:
        text = text.strip().removesuffix("<eos>").strip()
    explicit = text is not None and (
        boxed(untagged(text))[0] or MARKER.search(text) or FENCE.search(text))
    return text if explicit or not cut else ""


FENCE = re.compile(r"^```[ \t]*+([\w+-]*+)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def extract_program(prompt, completion_text):
    """A code completion's program, or None: its final answer's last fenced block that is code:
    labelled python, or unlabelled and not just values (`[1, 2, 3]` below a program: its output)."""
    def is_code(language, body):
        try:
            return language.lower() in ("python", "py", "python3") or language == "" and not all(
                map(literal, ast.parse(body).body))
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            return False
    def literal(statement):  # output is a value: 6, [1, 2, 3], True, {'a': 1}
        try:
            return isinstance(statement, ast.Expr) and ast.literal_eval(statement.value) is not ...
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return False
    blocks = [body for language, body in FENCE.findall(scored_text(prompt, completion_text) or "")
              if is_code(language, body)]
    # of those, the last that defines the entry point the tests name, if one does: a block below the
    # program that only uses it (`print(add(2, 3))`) is its example usage
    code = prompt.code or {}
    names = judge.entry_points(code.get("fn_name") or code.get("entry_point"))
    defines = [body for body in blocks if names and all(
        re.search(rf"^[ \t]*(?:async\s+)?(?:def|class)\s+{n}\b|^{n}\s*=", body, re.M) for n in names)]
    return (defines or blocks or [None])[-1]

# -----------------------------------------------------------------------------
# the final answer of a math completion: a small grammar (docs/rewards.md states it)
#
#   answer     := the last \boxed{} or <answer></answer> (every box agreeing) | the clause after
#                 the last answer marker | the last sentence holding a digit
#   statement  := [working '='] prefix NUMBER suffix     (a chain counts from its last '=', its
#                 working ending in what that '=' evaluates, not in a second name: x = 5, y = 6)
#   prefix     := words and formatting: no number, no operator, no qualifier (more than, about, not,
#                 half of); 'minus' or 'negative' just before the number is its sign (twice: none)
#   NUMBER     := sign digits[,ddd...][.digits][e±k] [scale words] | p/q in lowest terms
#                 | \frac{p}{q}
#   suffix     := units (km/h, m^2, %, °, dollars): no number, no operator, no qualifier (or more,
#                 squared; a comparative states a difference here: 3 more than Ann), no hedge
#                 anywhere (', maybe six': a second answer in words)
# One number in the answer's scope, and every later restatement (a short sentence or a marker clause
# stating a number, or any clause holding a hedge and a number) states the same value; anything else
# is -1. Digits of any script, every dash and minus, TeX and thin-space separators are read as one
# spelling first; any other math symbol or number sign (√, ∛, ⑥, ½, ₂) is an operator; GSM8K's
# calculator notes <<48+24=72>> are dropped; the gold goes through the same.
# Every pass is linear in the text, whatever a collapsing policy writes (benchmarks/rewards.py times
# runs of one character): no repeat can give back what it took to a repeat beside it (possessive
# where two meet: [ \t]*+#*+), a run is entered at its first character only (a lookbehind), a lazy
# scan stops at the next opener, and a run of words is counted once.

# the word for 'answer' of the languages of math datasets (en de fr es pt it ru zh ja), [final], then ':',
# '=' or that language's 'is'
MARKER = re.compile(r"(?i)(?:\b(?:answer|antwort|r[eé]ponse|respuesta|resposta|risposta|ответ)"
                    r"(?:\s+finale?)?|答案|答え|答)\s*(?:(?:(?:is|would\s+be|will\s+be|should\s+be|ist"
                    r"|lautet|est|es|é|è|равен)\b|是|为|は)\s*:?|[:：=])|####")
# a sentence ends before a word (not '5 vs. 6') or after a CJK stop
CLAUSE_END = re.compile(r"(?<=[.!?;])\s+(?=[^\W\d_])|(?<=[。！？；])|\n")
# markdown that only lays an answer out: emphasis around text (not 6*7, 2**6, x_1; at most 100
# characters: linear time), a code fence's line, a list's bullet before words, 'Step n', a line's '1.',
# '2)', '(3)' (unlisted: counting up from 1)
EMPHASIS = re.compile(r"(?<![\w*`\\])(\*{1,3}|_{1,3}|`+)(?=[^\s*_`])([^\n]{0,99}?[^\s\\])\1(?![\w*`])")
LAYOUT = re.compile(r"(?im)^[ \t]*(?:```|~~~).*$|^([ \t]*+#*+[ \t]*+)(?:[-*+•](?=[ \t]+[^\s\d])"
                    r"|step[ \t]*\d{1,3}[.):]?|(\()?(\d{1,3})(?(2)\)|[.)]))[ \t]+(?=\S)")
# '<' and '>' around a word are a tag, never a comparison: an answer's (R1's <answer>,
# <final_answer>) is a box, any other (<b>, <strong>, <em>) layout, read away as Markdown's is
TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z_-]*)>")
# a '!' that ends a sentence (the text, or before a capital) after a word, or after a number a word
# stands before ('is 42!'), is its punctuation; 5!, n!, $5!$, 5! = 120 and 5! ways are factorials
PROSE_BANG = re.compile(r"([^\W\d_]{2}|[^\W\d_]\s+[-+]?\\?\$?[\d,.]*\d)!(?=\s+[^\W\d_a-z]|\s*$)")
# a span starts at a run's first '$' and holds no opener of its kind: linear time
MATH_SPAN = re.compile(r"(?<!\$)\$++([^$]+)\$+|\\\(((?:(?!\\\().)+?)\\\)|\\\[((?:(?!\\\[).)+?)\\\]",
                       re.DOTALL)
# LaTeX that only changes how its argument looks (font, weight, underline, frame, colour, size):
# unwrapped; any other command (\sqrt, \overline, \cancel, \phantom) is an operation
UNWRAP = re.compile(r"\\(?:text(?:[a-z]{2}|normal)?|math(?:[a-z]{2,3}|normal)|bm|boldsymbol|pmb|emph"
                    r"|u(?:nder)?line|[hmf]box|framebox|boxed|operatorname|(?:bf|it|rm|tt|sf|em|[a-z]*size"
                    r"|tiny|small|[lL]arge|LARGE|[hH]uge)(?![a-zA-Z])|(?:text)?color(?:box)?\s*+"
                    r"(?:\[[^][]*\])?\s*+\{[^{}]*\})\s*(?:\{([^{}]*)\})?")
THIN = "\u2009\u202f\u00a0\u2007"  # thin and no-break spaces: separators between digit groups
SEPARATOR = re.compile(r"(?<=\d)(?:\{,\}|\\[,!;: ]|[" + THIN + r"'])(?=\d{3}(?!\d))")
FRAC = re.compile(r"(-?)\\(?:[cdts]|nice)?frac\s*(?:\{\s*(-?\d+)\s*\}|(\d))\s*(?:\{\s*(-?\d+)\s*\}|(\d))")
# formatting that is not the answer: $ and \$, \( \) \[ \], \left \right, LaTeX spaces, degrees, braces,
# **bold**
DROP = re.compile(r"\\\$|\$|\\[()\[\]]|\\left|\\right|\\[,;:! ]|\\q?quad|\^\s*+\{?\s*+\\circ"
                  r"\s*\}?|°|[{}]|\*\*|\\(?:display|text|script)style|<<[^<>]*>>")
TOKEN = re.compile(r"""(?P<ratio>-?\d+/-?\d+(?![\d/]|[.,]\d))
    |(?P<number>[-+]?(?:(?<!\d,)\d{1,3}(?:,\d{3})++(?![,\d])|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?
        (?![\d.]\d)|[-+]?\.\d+)
    |(?P<equals>=)|(?P<power>\^\s*-?\d+)|(?P<op>[-+*/^×÷·⋅!<>~≈≤≥±|]|\\[a-zA-Z]+)
    |(?P<word>[^\W\d_]+)|(?P<space>\s+)|(?P<other>.)""", re.VERBOSE)
RUNAWAY = 300  # characters of a number's mantissa or a ratio's part: longer is a runaway
SCALES = {"hundred": 100, "thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12,
          "dozen": 12}
# words that offer another answer, and those that bound or approximate one: not an exact answer
HEDGES = set("or not maybe perhaps probably possibly likely might although though alternatively"
             " otherwise unless oder ou или 或 vielleicht quizás talvez forse возможно".split())
# comparatives bound a number they stand before ('more than 3', 'over 3') or are joined to by
# 'and' ('12 and over'); right after it they state a difference: '3 km farther than Ann', '3 more'
COMPARATIVES = set("than more less fewer over under above below beyond mehr moins menos más mais"
                   " più meno больше меньше".split())
AND_WORDS = {"and", "und", "y", "e", "и"}
QUALIFIERS = HEDGES | COMPARATIVES | set("least most about around approximately"
                          " approx roughly nearly almost circa ca up estimated ish half twice double"
                          " triple squared cubed nicht pas no não не ungefähr etwa mindestens"
                          " environ plus aproximadamente cerca примерно около 约 大约 至少 左右 多 余 約"
                          .split())
SUPERSCRIPTS = str.maketrans({c: f"^{d}" for d, c in enumerate("⁰¹²³⁴⁵⁶⁷⁸⁹")} | {"⁻": "^-"})
TOWER = re.compile(r"\^\s*(?:\{[^{}]*\^|\(?[\w.]+\)?\s*\^|\{?\s*\d{4,})|\*\*\s*\(?(?:[\w.]+\)?\s*\*\*|\d{4,})"
                   r"|\d{3,}\s*!|\d{25,}")
# (10^{10^{10}}, 9^9^9, 9**9**9, 2**(2**64), 2^{1000}, 1000!, huge literals)


def _ascii(c):
    """A non-ASCII character as the grammar reads it: a digit of any script as 0-9, a dash or minus as
    '-', a THIN space as itself, another space as ' '."""
    if c.isdecimal():
        return str(unicodedata.decimal(c))
    if c == "\u2212" or unicodedata.category(c) == "Pd":
        return "-"
    sign = unicodedata.category(c) in ("Sm", "No", "Nl")  # not a CJK numeral: 一共 is 'in all'
    if sign and c not in "⁰¹²³⁴⁵⁶⁷⁸⁹⁻":  # superscripts are powers (SUPERSCRIPTS)
        return "*"  # an operator, or a number the grammar does not read: √36, ∛27, 5 ⑥, 6½, 101₂
    return c if c in THIN or not c.isspace() else " "


def normalise(text):
    """One spelling of a final answer: ASCII digits and minus, thousands separators as ',',
    \\frac{p}{q} as p/q, superscripts as ^k, \\textbf{} and its kind unwrapped, formatting dropped."""
    text = re.sub(r"[^\x00-\x7f]", lambda m: _ascii(m[0]), text).translate(SUPERSCRIPTS)
    # a sign before a currency symbol is the amount's: -$5 is $-5
    text = re.sub(r"(?<![\w)])([-+])(\\?\$|[€£¥])", r"\2\1", SEPARATOR.sub(",", text))
    text = re.sub(f"[{THIN}]", " ", text).replace("\\%", "%")
    text = FRAC.sub(lambda m: f" {m[1]}{m[2] or m[3]}/{m[4] or m[5]} ", UNWRAP.sub(r" \1 ", text))
    return DROP.sub(" ", UNWRAP.sub(r" \1 ", text))


def _value(kind, text, canonical):
    """A number token's exact value, or None (a ratio not in lowest terms, a runaway: a part or a
    mantissa over RUNAWAY characters, an exponent past 100)."""
    # int() sees no part longer than RUNAWAY, nor an exponent's sign and leading zeros: past 4,300
    # digits (zeros too) it raises
    if kind == "ratio":
        parts = text.split("/")
        if max(map(len, parts)) > RUNAWAY:
            return None
        p, q = map(int, parts)
        lowest = q not in (0, 1, -1) and Fraction(p, q).denominator == abs(q)
        return Fraction(p, q) if q and (lowest or not canonical) else None
    mantissa, _, exponent = text.replace(",", "").lower().partition("e")
    digits = exponent.lstrip("+-").lstrip("0")
    if len(mantissa) > RUNAWAY or len(digits) > 3 or int(digits or 0) > 100:  # 4 digits: past 100
        return None
    power = int(digits or 0)
    return Fraction(mantissa) * Fraction(10) ** (-power if exponent.startswith("-") else power)


def leading(tokens, words):
    """How many of tokens, from the first, are among words (lowercase)."""
    return next((j for j, (_, text) in enumerate(tokens) if text.lower() not in words), len(tokens))


def statement(text, canonical=True):
    """The one number a statement states (the grammar above), as a Fraction, else None."""
    spaced = [(m.lastgroup, m[0]) for m in TOKEN.finditer(normalise(text))]
    equals = [j for j, (kind, _) in enumerate(spaced) if kind == "equals"]
    if equals:  # a chain: what its last '=' gives, after working of one chain (not x = 5 or x = 6)
        working, link = spaced[:equals[-1]], spaced[(equals[-2] if equals[1:] else -1) + 1:equals[-1]]
        commas = [j for j, token in enumerate(link) if token == ("other", ",")]
        named = commas and {k for k, _ in link[commas[-1]:]} <= {"other", "word", "space"}
        if QUALIFIERS & {t.lower() for _, t in working} or named and any(
                k == "number" for k, _ in link[:commas[-1]]):  # x = 5, y = 6: a second statement
            return None
        spaced = spaced[equals[-1] + 1:]
    # a sign glued to a term is an operation (x+1, 2-3); a letter glued to a number a product (2x)
    for (a, x), (b, y) in zip([("space", "")] + spaced, spaced + [("space", "")]):
        if b == "number" and y[0] in "+-" and a in ("word", "number", "ratio", "power") or \
                a in ("number", "ratio") and b == "word" and len(y) == 1 and y < "\u3040":
            return None
    tokens = [token for token in spaced if token[0] != "space"]
    numbers = [i for i, (kind, _) in enumerate(tokens) if kind in ("number", "ratio")]
    if len(numbers) != 1:
        return None
    i = numbers[0]
    prefix, suffix, value = tokens[:i], tokens[i + 1:], _value(*tokens[i], canonical)
    # the words below (scales, signs, qualifiers, hedges) match word tokens only: no other token is
    # spelled as one
    # a run of scale words multiplies (6 hundred million; past 8 of them, 10^96, a runaway as an
    # exponent past 100 is) and a run of sign words signs (minus minus 5 is 5): each counted once
    scales, signs = leading(suffix, SCALES), leading(prefix[::-1], ("minus", "negative"))
    factor = prod(SCALES[t.lower()] for _, t in suffix[:scales]) if scales <= 8 else None
    factor = factor and factor * (-1) ** signs
    value = value and factor and value * factor
    prefix, suffix = prefix[:len(prefix) - signs], suffix[scales:]
    left, right = [{text.lower() for _, text in part} for part in (prefix[-2:], suffix[:2])]
    near = left | (right if AND_WORDS & right else right - COMPARATIVES)  # 3 more: a difference
    if value is None or QUALIFIERS & near or HEDGES & {text.lower() for _, text in suffix} or any(
            kind in ("op", "power") for kind, _ in prefix):
        return None
    # a unit's '/' and '^k' follow a word: km/h, m^2
    for (before, _), (kind, text) in zip([("", "")] + suffix, suffix):
        after_word = before in ("word", "power")
        if kind == "power" and not after_word or kind == "op" and not (text == "/" and after_word):
            return None
    return value


def boxed(text):
    """-> (the contents of text's outermost non-empty \\boxed{} or \\fbox{}, a box inside one unwrapped;
    the text after the last), or (None, "") when one is unclosed."""
    found, end = [], 0
    for match in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        if match.start() < end:
            continue  # inside the box before
        depth = 1
        for end in range(match.end(), len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                break
        else:
            return None, ""
        found.append(re.sub(r"\\(?:boxed|fbox)\s*", "", text[match.end():end]))
        end += 1
    found = [box for box in found if box.strip("{} ")]  # '\boxed{}' (the instruction, echoed) is no answer
    return found, text[end:] if found else ""


def unlisted(text):
    # text less LAYOUT; a line's number is a list's only as the next of its count ('Answer: 42\n43. Done'
    # states 43)
    count = [0]
    def item(m):
        if m[3] and int(m[3]) not in (1, count[0] + 1):
            return m[0]
        count[0] = int(m[3] or count[0])
        return m[1] or ""
    return LAYOUT.sub(item, text)


def untagged(text):
    """text with an answer's tags as a box and any other tag as a space (TAG)."""
    box = lambda m: "}" if m[1] else r"\boxed{"
    return TAG.sub(lambda m: box(m) if m[2].lower().endswith("answer") else " ", text)


def final_answer(text):
    """The grammar's first line -> (the answer's text, the boxes, the rest of its clause, the text
    after that); the answer None when a box is unclosed."""
    text = unlisted(EMPHASIS.sub(r"\2", untagged(text)))  # markdown and HTML layout read away first
    text = PROSE_BANG.sub(r"\1.", text)
    boxes, after = boxed(text)
    if boxes is None:
        return None, [], "", ""
    if boxes:
        rest, *later = CLAUSE_END.split(after, 1)
        return boxes[-1], boxes, rest, "".join(later)
    markers = list(MARKER.finditer(text))
    if markers:  # the clause after the last marker
        clause, *later = CLAUSE_END.split(text[markers[-1].end():].lstrip(), 1)
        return clause, [], "", "".join(later)
    sentences = CLAUSE_END.split(text)
    return ([s for s in sentences if re.search(r"\d", s)] or sentences)[-1], [], "", ""


def alone(rest):
    # True when the rest of the answer's clause offers no other answer: a hedge ('or 46 if ...',
    # 'although 8 is possible', 'maybe six') offers a second; the question's own numbers ('costs
    # \boxed{4} dollars more than 2 bagels') and working ('since 48 + 24 = 72') do not
    return not HEDGES & {m[0].lower() for m in TOKEN.finditer(normalise(rest))}  # words only match


def restates(later, value):
    # True when nothing after the answer's clause states another value: no short clause (one number
    # and at most two words, in any language: 'Or 6.', 'Actually 56.'), no hedged one ('It might
    # also be 5.') and no marker clause states a different one. Working and checking (more words,
    # or several numbers) are not statements
    for clause in CLAUSE_END.split(later):
        marked = MARKER.split(clause)[-1]
        tokens = [(m.lastgroup, m[0].lower()) for m in TOKEN.finditer(normalise(marked))]
        kinds = [kind for kind, _ in tokens]
        words = sum(kind == "word" and t not in SCALES for kind, t in tokens)  # 2 million: a number
        short = MARKER.search(clause) or words <= 2 or HEDGES & {t for _, t in tokens}
        if short and kinds.count("number") + kinds.count("ratio") == 1 and statement(marked) != value:
            return False
    return True


@lru_cache(maxsize=100_000)
def numeric_gold(gold):
    """The gold answer's number if it is one (18, 1,000, 10{,}000, $5, 42%, 0.5, \\frac{1}{2}), else None."""
    return statement(gold, canonical=False)


def costly(answer):
    """An answer math-verify is not given: too long, nested too deep, a tower of powers or a huge number."""
    deepest = max(accumulate((c in "([{") - (c in ")]}") for c in answer), default=0)
    return len(answer) > LONGEST or deepest > DEEPEST or TOWER.search(answer) is not None


# a symbolic answer's 'or' between numbers: in its text from the first digit to the last (one search
# for that text, another for the 'or': linear time)
HEDGE = re.compile(r"(?i)\bor\b")


def symbolic(answer):
    """A final answer's one expression for math-verify: its $...$ (all alike) or all of it, decimals as
    fractions (0.4999999 is not 1/2); None for two different ones, an 'or', or a costly one."""
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
    """One math-verify worker process: an answer past its time (or one that kills it) is -1 and the
    worker killed; the next starts a fresh one (its ~1 s of imports not counted as the answer's)."""

    proc = None  # the worker process, started by the first answer

    def __call__(self, gold, expression, timeout):
        if self.proc is None:
            self.proc = Popen([sys.executable, "-c", WORKER], stdin=PIPE, stdout=PIPE, stderr=DEVNULL,
                              bufsize=0)
            if self.line(120) != b"ready":
                self.stop()
                raise RuntimeError("rewards: math-verify's worker did not start (pip install math-verify)")
        try:
            self.proc.stdin.write(json.dumps([gold, expression]).encode() + b"\n")
            verdict = self.line(timeout)
        except OSError:  # it died
            verdict = None
        if verdict is None:
            self.stop()
        return verdict == b"1"

    def line(self, timeout):
        """Its next line within `timeout` seconds, else None (it writes each line whole)."""
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
    """math-verify's verdict on a symbolic answer, from a free worker (cached: a repeat is free)."""
    verifier = _verifiers.get()
    try:
        gold = gold if "$" in gold or "\\boxed" in gold else f"${gold}$"
        return verifier(gold, f"${expression}$", timeout)
    finally:
        _verifiers.put(verifier)

# -----------------------------------------------------------------------------
# reward kinds. KINDS names them; a row's kind is decided once, when data.py reads it (data.row_kind):
# the kind whose fields the row has, 'answer' standing for the answer_field; of two whose fields nest, the
# one with more ('choices' and 'answer' over 'answer'). A kind is
#   fields  the fields its rows have: names, or a tuple of names meaning one of them; () for the built-in
#           task, whose prompts are drawn, never read (a kind naming 'answer' needs it not blank)
#   read    (row, text, answer) -> the Prompt's fields from the row: text (the problem as the model sees it),
#           answer, code; a ValueError naming the field for a bad row (data.py adds file:line)
#   reward  (prompt, text, completion_text, timeout) -> +1.0 | -1.0 for one completion, text being the scored
#           text (after thinking; never None: an unclosed <think> is -1 before any kind sees it)
#   many    optional, a batch scorer: [(prompt, text, completion_text)] -> an iterator of their verdicts in
#           order, started at once (code: every program in the sandbox's pool)
# A new kind: its functions here and one entry in KINDS (test_all.py adds a multiple-choice one at run time).

Kind = namedtuple("Kind", "fields read reward many", defaults=[None])


def builtin_reward(prompt, text, completion_text, timeout):
    """The built-in task: its digit exactly, after thinking (no </think>: -1, the task is to think)."""
    return 1.0 if THINK_END in completion_text and text == prompt.answer else -1.0


def math_reward(gold, text, timeout=TIMEOUT):
    """+1.0 | -1.0 for a math completion's scored text: numeric gold by the grammar above, exactly;
    symbolic gold by math-verify on the answer's one expression."""
    answer, boxes, rest, later = final_answer(text)
    if answer is None:
        return -1.0
    if (value := numeric_gold(gold)) is not None:
        stated = [statement(box) for box in boxes] or [statement(answer)]
        one = len(set(stated)) == 1 and alone(rest) and restates(later, stated[-1])
        return 1.0 if one and stated[-1] == value else -1.0
    numbered = re.search(r"(?s)\d.*\d", answer)
    hedged = numbered and HEDGE.search(numbered[0])
    if len({re.sub(r"\s+", "", box) for box in boxes}) > 1 or hedged:
        return -1.0
    expression = symbolic(answer)
    return 1.0 if expression is not None and verified(gold, expression, timeout) else -1.0


CODE_FIELDS = ("tests", "test", "test_list")  # a row with one of them is code (code_tests reads it)


def code_tests(row, prompt=None):
    """A code row's tests as judge.passes() keywords (formats: docs/rewards.md), or a ValueError naming the
    field. A prompt that is Python (HumanEval's stub and helpers), or a 'prelude' field, is the
    prelude: run before the program, its helpers the test's own (judge.prelude_of)."""
    def require(ok, message):
        if not ok:
            raise ValueError(f"field {message}")
    if "prelude" in row:  # the prompt's code given apart, for a prompt that wraps it in prose
        prompt = row["prelude"]
        require(judge.prelude_of(prompt), "'prelude' must be Python that imports and defines only")
    prelude = judge.prelude_of(row.get("prompt", row.get("problem")) if prompt is None else prompt)
    given = lambda **fields: {key: value for key, value in fields.items() if value}
    styles = [key for key in CODE_FIELDS if key in row]
    require(len(styles) == 1, f"{' and '.join(map(repr, styles))}: give one of them")
    if "tests" in row:
        tests, fn_name = row["tests"], row.get("fn_name")
        require(fn_name is None or (isinstance(fn_name, str) and fn_name.isidentifier()),
                f"'fn_name' must be a Python identifier, got {fn_name!r}")
        require(isinstance(tests, list) and tests,
                "'tests' must be a non-empty list of {\"input\": ..., \"output\": ...}")
        for i, t in enumerate(tests):
            require(isinstance(t, dict) and "input" in t and "output" in t,
                    f"'tests[{i}]' must be an object with 'input' and 'output'")
            require(fn_name or (isinstance(t["input"], str) and isinstance(t["output"], str)),
                    f"'tests[{i}]': stdin/stdout tests take strings (arguments need 'fn_name')")
            require(not fn_name or isinstance(t["input"], list),
                    f"'tests[{i}].input' must be the list of arguments of {fn_name}()")
        return dict(tests=tests, **given(fn_name=fn_name, prelude=fn_name and prelude))
    field, entry_point = styles[0], row.get("entry_point")
    require("fn_name" not in row, f"{field!r} (asserts) cannot go with 'fn_name'")
    if field == "test":
        test = row["test"]
        require(isinstance(test, str) and test.strip(), "'test' must be a non-empty string of Python asserts")
    else:  # MBPP: its imports and setup code run before the asserts
        parts = [row.get("test_imports") or [], [row.get("test_setup_code") or ""], row["test_list"]]
        strings = all(isinstance(p, list) and all(isinstance(x, str) for x in p) for p in parts)
        require(strings and row["test_list"], "'test_list' (and 'test_imports') must be lists of strings of "
                                              "Python, 'test_setup_code' a string")
        test = "\n".join(line for part in parts for line in part if line.strip())
    try:
        judge.assert_plan(test, entry_point, prelude)
    except SyntaxError as e:
        raise ValueError(f"field {field!r} is not valid Python ({e.msg}, line {e.lineno})") from None
    except ValueError as e:
        raise ValueError(f"field {field!r}: {e}") from None
    # the judge and the sandbox run the standard library only (no site-packages)
    outside = sorted(set(imported(test + "\n" + (prelude or ""))) - sys.stdlib_module_names)
    require(not outside, f"{field!r} imports {outside[:1]}, outside the standard library")
    return dict(test=test, **given(entry_point=entry_point, prelude=prelude))


def imported(code):  # the top-level modules code imports
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            yield node.module.split(".")[0]


def code_reward(prompt, text, completion_text, timeout):
    """The program of the last fenced block passes its tests (judge.py)."""
    program = extract_program(prompt, completion_text)
    return 1.0 if program is not None and judge.passes(program, **prompt.code) else -1.0


def code_many(triples):
    """A batch's programs at once in the sandbox's pool, running while the other kinds are scored."""
    programs = [extract_program(p, completion) for p, _, completion in triples]
    passed = judge.score_many([dict(program=program, **p.code) for (p, *_), program in zip(triples, programs)
                               if program is not None])
    return (1.0 if program is not None and next(passed) else -1.0 for program in programs)


KINDS = dict(
    builtin=Kind((), None, builtin_reward),
    math=Kind(("answer",), lambda row, text, answer: dict(answer=str(answer).strip()),
              lambda prompt, text, _, timeout: math_reward(prompt.answer, text, timeout)),
    code=Kind((CODE_FIELDS,), lambda row, text, _: dict(code=code_tests(row, text)), code_reward,
              code_many),
)

# -----------------------------------------------------------------------------
# rewards

def reward(prompt, completion_text, timeout=TIMEOUT, cut=False):
    """+1.0 | -1.0 for one completion: -1 for thinking never closed, else its prompt's kind's verdict
    (KINDS) on the text after thinking (cut: by the length cap)."""
    text = scored_text(prompt, completion_text, cut)
    return -1.0 if text is None else KINDS[prompt.kind].reward(prompt, text, completion_text, timeout)


_scorers = ThreadPoolExecutor(WORKERS, thread_name_prefix="rewards")


def score(pairs, timeout=TIMEOUT):
    """[(prompt, completion_text[, cut by the length cap])] -> [+1.0 | -1.0] in order. A kind's pairs
    go to its batch scorer (code: the sandbox's pool) at once, first; the rest to threads that feed
    math-verify's workers."""
    pairs = list(pairs)
    batch = [p.kind if KINDS[p.kind].many and scored_text(p, c, *cut) is not None else None
             for p, c, *cut in pairs]
    started = {}  # None: one at a time, in threads
    for kind in sorted(dict.fromkeys(batch), key=lambda kind: kind is None):
        mine = [pair for pair, of in zip(pairs, batch) if of == kind]
        started[kind] = iter(KINDS[kind].many([(p, scored_text(p, c, *cut), c) for p, c, *cut in mine])
                             if kind else _scorers.map(lambda t: reward(*t[:2], timeout, *t[2:]), mine))
    return [next(started[kind]) for kind in batch]
