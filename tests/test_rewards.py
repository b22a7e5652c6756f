"""rewards/ (its __init__.py): the built-in checker, math answers (a table of honest formats beside the cheats
that must earn nothing), the program of a code answer, a mixed batch; the registry of reward kinds, and the
fork a researcher makes first (a multiple-choice kind).

Run alone: `python -m pytest tests/test_rewards.py`."""

import ast
import json
import os
import re

import pytest

# tests.helpers first: importing it sets torch to one thread (it says why)
from tests.helpers import ADD, ADD_TESTS, EXAMPLE, EXAMPLE_CODE, REPO
# the fixtures its tests take (pytest finds them by name in this module)
from tests.helpers import tok  # noqa: F401
import data
import rewards
from rewards import judge
from data import DataError, INTERRUPT_PHRASE, Prompt
import train


# =============================================================================
# rewards/__init__.py


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


@pytest.mark.parametrize("cls", ["MARKUP", "LISTS", "LANGUAGES"])
def test_markup_list_numbering_and_answer_words_of_other_languages_score_by_one_rule_each(cls):
    # three classes of answers (tests/math_cases.py): emphasis and presentation read away, a list's enumerator
    # not a number, the answer markers of the languages of math datasets; cheats inside each still -1
    from concurrent.futures import ThreadPoolExecutor
    import tests.math_cases
    table = getattr(tests.math_cases, cls)
    assert [(case, rewards.math_reward(*case[:2])) for case in table if rewards.math_reward(*case[:2]) != case[-1]] == []
    with ThreadPoolExecutor(1) as pool:
        assert list(pool.map(lambda case: rewards.math_reward(*case[:2]), table)) == [e for *_, e in table]
    prompt = lambda gold: Prompt("x:1", "", [], gold, domain="math")  # after thinking, as the trainer scores it
    assert [rewards.reward(prompt(g), "<think>6 or 7?</think>" + a) for g, a, _ in table] == [e for *_, e in table]


@pytest.mark.parametrize("cls", ["TAGS", "COMPARATIVES", "PUNCTUATION", "PROMISES"])
def test_answer_tags_comparatives_sentence_punctuation_and_the_docs_promises_score_by_one_rule_each(cls):
    # four classes of answers (tests/math_cases.py, issue 64): an answer's tag is a box and any other tag
    # layout, a comparative after the number a difference, sentence punctuation not mathematics, thinking
    # opened again -1 and a scale word the number's. Scored as the trainer scores them (rewards.reward reads
    # the text after thinking), in the main thread and in a worker thread, and after a closed thinking
    from concurrent.futures import ThreadPoolExecutor
    import tests.math_cases
    table = getattr(tests.math_cases, cls)
    prompt = lambda gold: Prompt("x:1", "", [], gold, domain="math")
    scored = lambda case: rewards.reward(prompt(case[0]), case[1])
    assert [(case, scored(case)) for case in table if scored(case) != case[-1]] == []
    with ThreadPoolExecutor(1) as pool:
        assert list(pool.map(scored, table)) == [e for *_, e in table]
    assert [rewards.reward(prompt(g), "<think>6 or 7?</think>" + a) for g, a, _ in table] == [e for *_, e in table]


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
    train.reward_groups(train.current_config(), [g], task, data.Curriculum(1))
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
    prompts = prompts_of(tmp_path, [row for _, row, *_ in loaded], [case[-1] for case in loaded])
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
