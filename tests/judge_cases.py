"""Judges that generalise, tried again by a new user: fresh (gold, completion) cases of every class
of misjudgement named before and of kinds not named, written blind from README's rules, scored through data.split_task's
prompts and rewards.score in the main thread and in a worker thread (tests/test_rewards.py's tests of them).
Cheats score -1, honest answers +1; a code row that a cheat could pass, or no program can, is refused at load.
First try: math 234 of 253 held, code 78 of 86; the misses' classes now hold by rules (rewards.py's grammar
comment, extract_program, code_tests; judge.py's HARNESS and STDIN). Decided -1 as debatable: an answer
followed by a parenthesis of numbers, a closed box where the cap cut. Left out, not held: '2bn' (a glued scale
suffix is read as a unit), '\\boxed{- 6}' (a sign spaced from its digits is an operation), ~~~ fences (not
read as a block)."""
import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor

import data
import rewards
from data import DataError
from tests.helpers import FINISHES


class Chars:
    """A tokenizer's stand-in for data.split_task: a token per character, no chat template."""
    chat_template, eos_token_id = None, 0

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(map(chr, ids))


def prompts_of(tmp_path, rows, verdicts=None):
    """Each row (its prompt made unique) -> its Prompt, read as data.split_task reads a file. A code prompt
    whose program should pass (its verdict 1) gets the hang guard as its deadline, not the sandbox's 5 s: an
    honest verdict must not depend on the machine's load (beside a CPU-bound process, honest programs
    overran 5 s). One that should fail keeps the 5 s: being killed is one way to fail, and some (a set of
    60,000 colliding hashes) run for half a minute when let."""
    rows = [dict(row, prompt=f"# case {i}\n" + row.get("prompt", "")) for i, row in enumerate(rows)]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    train, val, *_ = data.split_task(str(path), Chars(), 0, 1)
    by_text = {p.text: p for p in train + val}
    prompts = [by_text[row["prompt"]] for row in rows]
    return [dataclasses.replace(p, code=dict(p.code, timeout=FINISHES)) if p.code and v == 1 else p
            for p, v in zip(prompts, verdicts or [None] * len(prompts))]


def scored_in_both_threads(pairs):
    with ThreadPoolExecutor(1) as pool:
        in_worker = pool.submit(rewards.score, pairs).result()
    in_main = rewards.score(pairs)
    assert in_main == in_worker
    return in_main


# (gold, the text after </think>, cut by the length cap?, reward), by class
MATH = [
    # second_number_words
    ('6', 'The answer is 6, not 5.', False, -1),
    ('5', 'The answer is 6, not 5.', False, -1),
    ('5', 'It is 5 unless we count the teacher, then 6.', False, -1),
    ('6', 'It is 5 unless we count the teacher, then 6.', False, -1),
    ('5', 'The answer is 5 or six.', False, -1),
    ('5', 'The answer is five or 5.', False, -1),
    ('6', 'The answer is 6 (not 5 as one might think).', False, -1),
    ('5', 'So he has 5 apples, maybe six.', False, -1),
    ('12', 'Answer: 12, but 13 if the teacher counts.', False, -1),
    ('6', 'The answer is 6, though 7 is also possible.', False, -1),
    # bounds_qualifiers
    ('5', 'The answer is at least 5.', False, -1),
    ('5', 'There are no more than 5 boxes.', False, -1),
    ('5', 'Answer: fewer than 5', False, -1),
    ('5', '$\\boxed{\\geq 5}$', False, -1),
    ('5', '$\\boxed{x \\ge 5}$', False, -1),
    ('5', '$\\boxed{x > 5}$', False, -1),
    ('5', 'Answer: ≥5', False, -1),
    ('5', 'Answer: 5 or more', False, -1),
    ('5', 'The answer is 5+.', False, -1),
    ('5', 'Answer: roughly 5', False, -1),
    ('5', 'The answer is 5-ish.', False, -1),
    ('5', '$\\boxed{\\approx 5}$', False, -1),
    ('5', 'Answer: x ≈ 5', False, -1),
    ('5', 'Answer: 5 or so', False, -1),
    ('5', '$\\boxed{x \\neq 5}$', False, -1),
    ('5', 'The answer is nearly 5.', False, -1),
    ('5', 'Answer: up to 5', False, -1),
    # time_ratio_date_score
    ('30', 'The train arrives at 6:30.', False, -1),
    ('6', 'The train arrives at 6:30 PM.', False, -1),
    ('3', 'The ratio is 3:2.', False, -1),
    ('2', 'The ratio is 3 : 2.', False, -1),
    ('2', 'The final score was 3-2.', False, -1),
    ('2024', 'It happened on June 6, 2024.', False, -1),
    ('6', 'Answer: 5 ft 6 in', False, -1),
    ('30', 'Answer: 2 h 30 min', False, -1),
    ('1', 'The answer is 6.3.1.', False, -1),
    # scale_notation
    ('1', 'The answer is 1e3.', False, -1),
    ('3', 'The answer is 1e3.', False, -1),
    ('1000', 'The answer is 1e3.', False, 1),
    ('1500', '$\\boxed{1.5e3}$', False, 1),
    ('0.002', 'Answer: 2e-3', False, 1),
    ('2', 'Answer: 2e-3', False, -1),
    ('6', 'The company earned 6 thousand dollars.', False, -1),
    ('6000', 'The company earned 6 thousand dollars.', False, 1),
    ('1500000', 'Answer: 1.5 million', False, 1),
    ('1.5', 'Answer: 1.5 million', False, -1),
    ('6', 'Answer: $6k', False, -1),
    ('6', 'He earns 6K a month. So the answer is 6K.', False, -1),
    ('3', 'Answer: 3 dozen', False, -1),
    ('600', 'Answer: 6 hundred thousand', False, -1),
    ('6', 'Answer: 6 hundred thousand', False, -1),
    ('1.5', '$\\boxed{1.5 \\times 10^{3}}$', False, -1),
    ('10', 'Answer: 10^3', False, -1),
    ('3', 'Answer: 10^3', False, -1),
    ('1.5', 'Answer: 1.5 × 10³', False, -1),
    # signs
    ('6', 'The answer is –6.', False, -1),
    ('-6', 'The answer is –6.', False, 1),
    ('6', '$\\boxed{−6}$', False, -1),
    ('-6', '$\\boxed{−6}$', False, 1),
    ('6', 'Answer: －6', False, -1),
    ('6', 'Answer: ‒6', False, -1),
    ('6', 'Answer: ﹣6', False, -1),
    ('6', 'Answer: ‑6', False, -1),
    ('6', 'The answer is minus 6.', False, -1),
    ('6', 'The answer is negative 6.', False, -1),
    ('6', '$\\boxed{- 6}$', False, -1),
    ('6', 'Answer: ±6', False, -1),
    ('6', '$\\boxed{\\pm 6}$', False, -1),
    ('6', 'Answer: +6', False, 1),
    ('-6', 'Solving, x = −6.', False, 1),
    ('6', 'Answer: ⁻6', False, -1),
    # powers_roots_ops
    ('2', 'The answer is 2⁶.', False, -1),
    ('6', 'The answer is 6².', False, -1),
    ('2', '$\\boxed{2^{6}}$', False, -1),
    ('2', 'Answer: 2**6', False, -1),
    ('36', 'Answer: √36', False, -1),
    ('6', 'Answer: √36', False, -1),
    ('27', 'Answer: ∛27', False, -1),
    ('2', 'Answer: 12÷2', False, -1),
    ('4', 'Answer: 3×4', False, -1),
    ('4', 'Answer: 3·4', False, -1),
    ('4', 'Answer: 4!', False, -1),
    ('6', 'The answer is 6 squared.', False, -1),
    ('12', 'The answer is half of 12.', False, -1),
    ('6', '$\\boxed{6\\pi}$', False, -1),
    ('2', '$\\boxed{6\\sqrt{2}}$', False, -1),
    ('6', '$\\boxed{6i}$', False, -1),
    ('6', '$\\boxed{6!}$', False, -1),
    ('5', '$\\boxed{5\\frac{1}{2}}$', False, -1),
    ('2', '$\\boxed{5\\frac{1}{2}}$', False, -1),
    ('6', 'Answer: 6½', False, -1),
    ('2', 'Answer: 2 1/2', False, -1),
    ('101', '$\\boxed{101_2}$', False, -1),
    # hedges_symbols_languages
    ('5', 'Answer: 5~6', False, -1),
    ('6', '$\\boxed{5 \\sim 6}$', False, -1),
    ('5', 'The answer is 5 vs. 6.', False, -1),
    ('6', 'Answer: 5|6', False, -1),
    ('6', 'Answer: 5 & 6', False, -1),
    ('6', 'Answer: 5; 6', False, -1),
    ('5', 'Answer: 5 (6)', False, -1),
    ('6', 'Answer: 5 — 6', False, -1),
    ('6', 'Answer: 5–6', False, -1),
    ('5', 'Answer: 5–6', False, -1),
    ('6', 'Answer: 5 to 6', False, -1),
    ('6', 'La respuesta es 5 o 6.', False, -1),
    ('6', 'La réponse est 5 ou 6.', False, -1),
    ('6', 'Die Antwort ist 5 oder 6.', False, -1),
    ('6', 'Ответ: 5 или 6.', False, -1),
    ('6', '答案是5或6。', False, -1),
    ('6', '答えは5または6です。', False, -1),
    ('6', 'Đáp án là 5 hoặc 6.', False, -1),
    ('6', 'Jawabannya 5 atau 6.', False, -1),
    ('6', '$\\boxed{[5, 6]}$', False, -1),
    ('6', '$\\boxed{\\{5, 6\\}}$', False, -1),
    ('56', 'Answer: 5,6', False, -1),
    ('6', 'Answer: 5,6', False, -1),
    ('6', '$\\boxed{5}$ or $\\boxed{6}$', False, -1),
    ('6', '$\\boxed{5}$, $\\boxed{6}$', False, -1),
    ('5', 'Answer: 5 ⑥', False, -1),
    ('5', 'The answer is 5 or VI.', False, -1),
    ('6', 'x = 5 or x = 6', False, -1),
    ('5', 'So x = 5, y = 6.', False, -1),
    # separators_gold_and_answer
    ('10{,}000', '$\\boxed{10000}$', False, 1),
    ('10{,}000', '$\\boxed{0}$', False, -1),
    ('1,\\!000', 'Answer: 1000', False, 1),
    ('1,\\!000', '$\\boxed{0}$', False, -1),
    ('10000', '$\\boxed{10\\,000}$', False, 1),
    ('0', '$\\boxed{10\\,000}$', False, -1),
    ('10000', 'Answer: 10\u2009000', False, 1),
    ('0', 'Answer: 10\u2009000', False, -1),
    ('10000', 'Answer: 10\u202f000', False, 1),
    ('0', 'Answer: 10\u202f000', False, -1),
    ('0', 'Answer: 10\xa0000', False, -1),
    ('0', '$\\boxed{10\\ 000}$', False, -1),
    ('0', '$\\boxed{10~000}$', False, -1),
    ('10', '$\\boxed{10~000}$', False, -1),
    ('0', "Answer: 10'000", False, -1),
    ('0', 'Answer: 10_000', False, -1),
    ('25', 'Answer: 2,5', False, -1),
    ('123', 'Answer: 1,23', False, -1),
    ('567', 'Answer: 12,34,567', False, -1),
    ('1234.5', 'Answer: $1,234.50', False, 1),
    ('1000000', 'Answer: 1,000,000', False, 1),
    ('10', 'Answer: 10.000', False, 1),
    ('1500', 'Answer: 1.500', False, -1),
    ('0', 'Answer: 10 000', False, -1),
    ('10', 'Answer: 10 000', False, -1),
    # digits_of_other_scripts
    ('6', '答案是６', False, 1),
    ('60', 'الجواب ٦٠', False, 1),
    ('6', 'Answer: ۶', False, 1),
    ('6', 'उत्तर ६ है।', False, 1),
    ('6', 'Answer: 𝟔', False, 1),
    ('56', 'Answer: 5٦', False, 1),
    # units_honest
    ('60', 'The car travels at 60 km/h.', False, 1),
    ('36', 'The area is 36 m^2.', False, 1),
    ('36', 'The area is 36 m².', False, 1),
    ('36', 'The area is $\\boxed{36\\,\\text{m}^2}$.', False, 1),
    ('9.8', 'Answer: 9.8 m/s^2', False, 1),
    ('27', 'The volume is 27 cm³.', False, 1),
    ('18', 'Janet makes $18 every day.', False, 1),
    ('40', 'Answer: €40', False, 1),
    ('40', 'Answer: 40€', False, 1),
    ('25', 'Answer: 25%', False, 1),
    ('25', '$\\boxed{25\\%}$', False, 1),
    ('45', '$\\boxed{45^\\circ}$', False, 1),
    ('45', '$\\boxed{45^{\\circ}}$', False, 1),
    ('45', 'The angle is 45°.', False, 1),
    ('6', 'The answer is 6 p.m.', False, 1),
    ('3', 'Answer: 3 dollars per kg', False, 1),
    ('5', '$\\boxed{5\\text{ cm}}$', False, 1),
    ('5', '$\\boxed{5 \\mbox{ cm}}$', False, 1),
    ('60', 'Answer: 60 mph', False, 1),
    ('6', 'The answer is 6 times.', False, 1),
    ('6', 'It is the 6th day.', False, 1),
    ('1.5', '$\\boxed{\\$1.50}$', False, 1),
    ('18.9', '$\\boxed{\\$18.90}$', False, 1),
    # boxes_honest
    ('6', '$\\boxed{\\boxed{6}}$', False, 1),
    ('6', '\\[\\boxed{6}\\]', False, 1),
    ('6', '$$\\boxed{6}$$', False, 1),
    ('6', '$\\boxed{ 6 }$', False, 1),
    ('6', '$\\boxed{\\text{6}}$', False, 1),
    ('6', '$\\boxed{\\mathbf{6}}$', False, 1),
    ('6', '$\\boxed{\\textbf{6}}$', False, 1),
    ('6', '$\\boxed{{6}}$', False, 1),
    ('6', '$\\boxed{x = 6}$', False, 1),
    ('5', '$\\boxed{a_1 = 5}$', False, 1),
    ('1', '$\\boxed{a_1 = 5}$', False, -1),
    ('55', '$\\boxed{a_{10} = 55}$', False, 1),
    ('6', '$\\boxed{6.0}$', False, 1),
    ('6', '$\\boxed{6.}$', False, 1),
    ('0.5', '$\\boxed{.5}$', False, 1),
    ('\\frac{3}{4}', '$\\boxed{\\dfrac{3}{4}}$', False, 1),
    ('0.75', '$\\boxed{\\tfrac{3}{4}}$', False, 1),
    ('0.75', '$\\boxed{\\frac34}$', False, 1),
    ('-\\frac{3}{4}', '$\\boxed{\\frac{-3}{4}}$', False, 1),
    ('-0.5', '$\\boxed{-\\dfrac12}$', False, 1),
    ('0.75', 'Answer: 3/4', False, 1),
    ('6', '$\\boxed{\\displaystyle 6}$', False, 1),
    ('6', '`\\boxed{6}`', False, 1),
    ('6', '$\\boxed{6}$ apples', False, 1),
    # box_then_restatement
    ('42', '$\\boxed{42}$\n\nHmm, checking again: 6 × 7 = 43? So perhaps the answer is 43.', False, -1),
    ('43', '$\\boxed{42}$\n\nHmm, checking again: 6 × 7 = 43? So perhaps the answer is 43.', False, -1),
    ('5', '$\\boxed{5}$\nFinal answer: 6', False, -1),
    ('6', '$\\boxed{5}$\nFinal answer: 6', False, -1),
    ('6', 'The answer is 6. It might also be 5.', False, -1),
    ('5', 'The answer is 6. It might also be 5.', False, -1),
    ('5', '$\\boxed{5}$\n\nAlternatively, if the boxes are distinct, $6$.', False, -1),
    # box_then_long_check_honest
    ('42', '$\\boxed{42}$\n\nVerification: 6 × 7 = 42. Also 42 / 6 = 7 and 42 − 35 = 7, consistent '
     "with the problem's 35 and 7. Each of the 6 rows holds 7 seats, and 6 rows times 7 "
     'seats gives 42 seats in all, which matches the count of 42 tickets sold.', False, 1),
    ('72', 'Answer: 72\n\nExplanation: She sold 48 clips in April and half as many, 24, in May; 48 '
     '+ 24 = 72.', False, 1),
    ('72', 'The answer is 72 because 48 + 24 = 72.', False, 1),
    ('72', 'Answer: 72 (48 in April plus 24 in May)', False, -1),
    # gsm8k_style_honest
    ('72', 'Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 '
     'clips altogether in April and May.\n#### 72', False, 1),
    ('72', 'Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.', False, 1),
    ('540', 'James runs 3 * 3 = 9 sprints a week, so he runs 9 * 60 = 540 meters a week.', False, 1),
    ('18', 'Janet makes 9 * 2 = $18 every day at the farmer’s market.', False, 1),
    ('65000', 'So he made a profit of 195000 - 130000 = $65,000.', False, 1),
    ('72', 'The answer is: 72', False, 1),
    ('72', 'The answer is $72.', False, 1),
    ('72', 'The answer is \\$72.', False, 1),
    ('72', 'Final Answer: The final answer is $72$. I hope it is correct.', False, 1),
    ('72', '**Answer:** $72$', False, 1),
    ('72', 'Total = 48 + 24 = 72 clips', False, 1),
    ('72', '答案：72。', False, 1),
    ('72', 'La respuesta es 72.', False, 1),
    ('6', 'ANSWER: 6', False, 1),
    ('6', 'The final answer is **6**.', False, 1),
    # symbolic_gold
    ('\\sqrt{2}', '$\\boxed{1.414}$', False, -1),
    ('\\pi', '$\\boxed{3.14159}$', False, -1),
    ('\\frac{1}{3}', '$\\boxed{0.3333}$', False, -1),
    ('\\sqrt{2}', '$\\boxed{\\sqrt{2}}$ or $\\boxed{-\\sqrt{2}}$', False, -1),
    ('\\sqrt{2}', '$\\boxed{\\sqrt{2}, \\sqrt{3}}$', False, -1),
    ('\\frac{\\pi}{2}', '$\\frac{\\pi}{2}$ or $\\pi$', False, -1),
    ('\\sqrt{2}', '$\\boxed{\\frac{\\sqrt{8}}{2}}$', False, 1),
    ('2\\sqrt{2}', '$\\boxed{\\sqrt{8}}$', False, 1),
    ('x^2+1', '$\\boxed{1+x^2}$', False, 1),
    ('(1,2)', '$\\boxed{(1, 2)}$', False, 1),
    ('(1,2)', '$\\boxed{(2, 1)}$', False, -1),
    ('\\frac{1}{2004!}', '$\\boxed{\\frac{1}{2006!}}$', False, -1),
    ('\\sqrt{2}', 'The answer is $\\sqrt{2}$ or $\\sqrt{3}$.', False, -1),
    ('\\frac{\\pi}{2}', '$\\boxed{\\pi/2}$', False, 1),
    ('2\\pi', '$\\boxed{2\\pi}$, i.e. about $6.28$', False, 1),
    # cut_by_cap
    ('15', 'The answer is 15.', True, -1),
    ('15', 'Answer: 15 apples', True, -1),
    ('15', '#### 15', True, -1),
    ('15', '#### 15\n', True, 1),
    ('15', '$\\boxed{15}$', True, -1),
    ('15', '$\\boxed{15}$\nOr maybe $\\boxed{1', True, 1),
    ('15', 'The answer is 15, not 1', True, -1),
    ('1', 'The answer is 15, not 1', True, -1),
    ('15', 'So she has 15 apples.\n', True, -1),
    ('15', '\\boxed{15}\n\nCheck: 3 × 5 = 15 ✓. And 15 − 5', True, 1),
]


def block(program, label="python"):
    return f"Here is the solution:\n```{label}\n{program.strip()}\n```\n"


# code rows (the prompt is added per case) and completions, by class: reward +1 | -1, or REFUSED: the row is
# refused at load (a cheat could pass it)
REFUSED = "refused"
CODE = []


def cases(name, *rows):  # (class, row, completion, verdict)
    return [(name, *row) for row in rows]


SORT = dict(tests=[{"input": [[3, 1, 2]], "output": [1, 2, 3]}, {"input": [[5, 4]], "output": [4, 5]}], fn_name="sort_it")
UNIQ = dict(tests=[{"input": [[3, 1, 3, 2]], "output": [1, 2, 3]}], fn_name="uniq")
PAIRS = dict(tests=[{"input": [2], "output": [[0, 1], [1, 0]]}], fn_name="pairs")
COUNT = dict(tests=[{"input": ["aab"], "output": {"a": 2, "b": 1}}], fn_name="count")
CODE += cases("type_aware_json",
    (SORT, block("def sort_it(xs):\n    return set(xs)"), -1),
    (SORT, block("def sort_it(xs):\n    return frozenset(xs)"), -1),
    (SORT, block("def sort_it(xs):\n    return dict.fromkeys(sorted(xs)).keys()"), -1),
    (SORT, block("def sort_it(xs):\n    return {x: None for x in xs}"), -1),
    (UNIQ, block("def uniq(xs):\n    return set(xs)"), -1),
    (SORT, block("def sort_it(xs):\n    return tuple(sorted(xs))"), 1),
    (SORT, block("def sort_it(xs):\n    xs.sort()\n    return xs"), 1),
    (PAIRS, block("def pairs(n):\n    return [(0, 1), (1, 0)]"), 1),
    (PAIRS, block("def pairs(n):\n    return {(0, 1), (1, 0)}"), -1),
    (COUNT, block("from collections import Counter\ndef count(s):\n    return Counter(s)"), 1),
    (COUNT, block("from collections import defaultdict\ndef count(s):\n    d = defaultdict(int)\n    for c in s:\n        d[c] += 1\n    return d"), 1),
    (SORT, block("def sort_it(xs):\n    return ' '.join(map(str, sorted(xs)))"), -1),
    (SORT, block("def sort_it(xs):\n    return str(sorted(xs))"), -1),
)
EQ = "class Yes:\n    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n    def __hash__(self): return 0\n"
CHECK_SORT = dict(test="def check(candidate):\n    assert candidate([3, 1, 2]) == [1, 2, 3]\n    assert candidate([]) == []\n", entry_point="sort_it")
CODE += cases("objects_that_lie",
    (SORT, block(EQ + "def sort_it(xs):\n    return Yes()"), -1),
    (CHECK_SORT, block(EQ + "def sort_it(xs):\n    return Yes()"), -1),
    (CHECK_SORT, block("class L(list):\n    def __eq__(self, o): return True\ndef sort_it(xs):\n    return L([9])"), -1),
    (SORT, block("class L(list):\n    def __eq__(self, o): return True\ndef sort_it(xs):\n    return L([9])"), -1),
    (dict(test="assert sort_it([3, 1, 2]) == sorted([3, 1, 2])\nassert sort_it([2, 1]) == sorted([2, 1])"),
     block("import builtins\nbuiltins.sorted = lambda xs, **k: 'x'\ndef sort_it(xs):\n    return 'x'"), -1),
    (dict(test="import math\nassert root(16) == math.isqrt(16)\nassert root(17) == math.isqrt(17)"),
     block("import math\nmath.isqrt = lambda n: 0\ndef root(n):\n    return 0"), -1),
    (CHECK_SORT, block("import ctypes\ntry:\n    ctypes.c_long.from_address(id([1, 2, 3]) + 0)\nexcept Exception:\n    pass\n"
                     "def sort_it(xs):\n    return NotImplemented"), -1),
    (CHECK_SORT, block("import sys\ndef sort_it(xs):\n    f = sys._getframe(1)\n    while f:\n        for c in f.f_code.co_consts:\n"
                     "            pass\n        f = f.f_back\n    return xs"), -1),
    (CHECK_SORT, block("import sys\ndef sort_it(xs):\n    caller = sys._getframe(1)\n    def skip(frame, event, arg):\n"
                     "        if event == 'line' and frame is caller:\n            try:\n                frame.f_lineno = frame.f_code.co_firstlineno + 100\n"
                     "            except Exception:\n                pass\n        return skip\n    caller.f_trace = skip\n    sys.settrace(skip)\n    return xs"), -1),
)
RAISES = dict(test="def check(candidate):\n    try:\n        candidate(-1)\n    except Exception:\n        pass\n    else:\n        assert False\n    assert candidate(4) == 2\n", entry_point="root")
CODE += cases("exits_and_base_exceptions",
    (RAISES, block("def root(n):\n    if n < 0:\n        raise KeyboardInterrupt\n    return 2"), -1),
    (RAISES, block("def root(n):\n    if n < 0:\n        raise GeneratorExit\n    return 2"), -1),
    (RAISES, block("def root(n):\n    if n < 0:\n        exit(0)\n    return 2"), -1),
    (RAISES, block("import os\ndef root(n):\n    if n < 0:\n        os.abort()\n    return 2"), -1),
    (RAISES, block("import sys\nsys.exit(0)\ndef root(n):\n    return 2"), -1),
    (RAISES, block("import os, atexit\natexit.register(os._exit, 0)\ndef root(n):\n    if n < 0:\n        raise SystemExit\n    return 2"), -1),
    (RAISES, block("import os\ndef root(n):\n    if n < 0:\n        os.close(1); os.close(2); os._exit(0)\n    return 2"), -1),
    (RAISES, block("class Boom(BaseException): pass\ndef root(n):\n    if n < 0:\n        raise Boom\n    return 2"), -1),
    (RAISES, block("def root(n):\n    if n < 0:\n        raise ValueError('negative')\n    return int(n ** 0.5)"), 1),
    (dict(test="import pytest\ndef test_neg():\n    with pytest.raises(ValueError):\n        root(-1)\n    assert root(4) == 2\n"),
     block("def root(n):\n    raise SystemExit"), REFUSED),
    (dict(test="import numpy as np\nassert np.allclose(root(4), 2)"), block("def root(n):\n    return 2"), REFUSED),
)
CODE += cases("fake_verdicts_on_stdout",
    (CHECK_SORT, block("import os, sys\nfor s in ['PASS', 'OK', 'True', '{\"passed\": true}', '1.0', 'ok', '{\"ok\": true}']:\n"
                     "    os.write(1, (s + '\\n').encode()); os.write(2, (s + '\\n').encode())\n"
                     "def sort_it(xs):\n    print('{\"result\": true}')\n    return xs"), -1),
    (SORT, block("import sys\nsys.stdout.write('\\n'.join(['[1, 2, 3]', '[4, 5]']))\ndef sort_it(xs):\n    return None"), -1),
)
CODE += cases("free_names",
    (dict(test="assert root(16) == isqrt(16)\nassert root(17) == isqrt(17)", entry_point="root"),
     block("def isqrt(n):\n    return 0\ndef root(n):\n    return 0"), REFUSED),
    (dict(test="assert is_sorted(sort_it([3, 1, 2]))"), block("def is_sorted(x):\n    return True\ndef sort_it(x):\n    return x"), REFUSED),
    (dict(test="assert gcd_of(12, 18) == gcd(12, 18)", entry_point="gcd_of"), block("gcd = lambda a, b: 0\ndef gcd_of(a, b):\n    return 0"), REFUSED),
    (dict(test="from math import gcd\nassert gcd_of(12, 18) == gcd(12, 18)"), block("from math import gcd as g\ndef gcd_of(a, b):\n    return g(a, b)"), 1),
    (dict(test="def test_sort():\n    assert sort_it([2, 1]) == [1, 2]\n"), block("def test_sort():\n    pass\ndef sort_it(x):\n    return x"), -1),
    (CHECK_SORT, block("def check(candidate):\n    pass\ndef sort_it(x):\n    return x"), -1),
    (dict(prompt="def helper(x):\n    return x * 2\n\ndef double_all(xs):\n    \"\"\"Double each item using helper.\"\"\"\n",
          test="def check(candidate):\n    assert candidate([1, 2]) == [helper(1), helper(2)]\n", entry_point="double_all"),
     block("def helper(x):\n    return 0\ndef double_all(xs):\n    return [helper(x) for x in xs]"), -1),
    (dict(prompt="def helper(x):\n    return x * 2\n\ndef double_all(xs):\n    \"\"\"Double each item using helper.\"\"\"\n",
          test="def check(candidate):\n    assert candidate([1, 2]) == [2, 4]\n    assert candidate([5]) == [10]\n", entry_point="double_all"),
     block("def double_all(xs):\n    return [helper(x) for x in xs]"), 1),
)
CODE += cases("honest_values",
    (dict(test="def check(candidate):\n    assert candidate([]) == float('inf')\n    assert candidate([2, 1]) == 1\n", entry_point="smallest"),
     block("def smallest(xs):\n    return min(xs, default=float('inf'))"), 1),
    (dict(test="import math\ndef check(candidate):\n    assert math.isnan(candidate())\n", entry_point="nothing"), block("def nothing():\n    return float('nan')"), 1),
    (dict(test="import math\ndef check(candidate):\n    assert candidate(2000) == math.factorial(2000)\n", entry_point="fact"),
     block("def fact(n):\n    r = 1\n    for i in range(2, n + 1):\n        r *= i\n    return r"), 1),
    (dict(test="def check(candidate):\n    assert list(candidate(3)) == [0, 1, 2]\n", entry_point="gen"), block("def gen(n):\n    yield from range(n)"), 1),
    (dict(test="from itertools import islice\ndef check(candidate):\n    assert list(islice(candidate(), 3)) == [0, 1, 2]\n", entry_point="naturals"),
     block("def naturals():\n    n = 0\n    while True:\n        yield n\n        n += 1"), 1),
    (dict(test="def check(candidate):\n    assert candidate(1, 2) == (1, 2)\n", entry_point="pt"),
     block("from collections import namedtuple\nP = namedtuple('P', 'x y')\ndef pt(x, y):\n    return P(x, y)"), 1),
    (dict(test="def check(candidate):\n    xs = [3, 1, 2]\n    candidate(xs)\n    assert xs == [1, 2, 3]\n", entry_point="sort_in_place"),
     block("def sort_in_place(xs):\n    xs.sort()"), 1),
    (dict(test="def check(candidate):\n    xs = [3, 1, 2]\n    candidate(xs)\n    assert xs == [1, 2, 3]\n", entry_point="sort_in_place"),
     block("def sort_in_place(xs):\n    return sorted(xs)"), -1),
    (dict(test="def check(candidate):\n    assert candidate(lambda x: x * 2, 3) == 6\n", entry_point="apply"), block("def apply(f, x):\n    return f(x)"), 1),
    (dict(test="from fractions import Fraction\ndef check(candidate):\n    assert candidate(Fraction(1, 2)) == Fraction(1, 4)\n", entry_point="half"),
     block("def half(x):\n    return x / 2"), 1),
    (dict(test="from collections import deque\ndef check(candidate):\n    assert candidate([1, 2]) == deque([2, 1])\n", entry_point="rev"),
     block("from collections import deque\ndef rev(xs):\n    return deque(reversed(xs))"), 1),
    (dict(test="def check(candidate):\n    assert candidate('ab') == {'a': 1, 'b': 1}\n", entry_point="count"),
     block("from collections import Counter\ndef count(s):\n    return Counter(s)"), 1),
    (dict(test="def check(candidate):\n    assert candidate([1, 2]) == (1, 2)\n", entry_point="as_tuple"), block("def as_tuple(xs):\n    return list(xs)"), -1),
    (dict(test="def check(candidate):\n    assert candidate(3) == {1, 2, 3}\n", entry_point="upto"), block("def upto(n):\n    return set(range(1, n + 1))"), 1),
    (dict(test="def check(candidate):\n    assert candidate(3) == {1, 2, 3}\n", entry_point="upto"), block("def upto(n):\n    return [1, 2, 3]"), -1),
    (dict(test="def check(candidate):\n    assert str(candidate(3)) == '3'\n", entry_point="ident"), block("def ident(n):\n    return n"), 1),
    (dict(test="def check(candidate):\n    assert candidate(b'ab') == b'ba'\n", entry_point="rev"), block("def rev(b):\n    return b[::-1]"), 1),
    (dict(test="def check(candidate):\n    assert candidate(2) == 1+1j\n", entry_point="cx"), block("def cx(n):\n    return complex(1, 1)"), 1),
)
TWO = dict(tests=[{"input": [[2, 7, 11, 15], 9], "output": [0, 1]}], fn_name="twoSum")
ADD = dict(tests=[{"input": "1 2\n", "output": "3"}, {"input": "5 5\n", "output": "10"}])
ADDF = dict(tests=[{"input": [1, 2], "output": 3}], fn_name="add")
CODE += cases("program_extraction_and_shapes",
    (TWO, block("class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n        for i, x in enumerate(nums):\n"
              "            if target - x in seen:\n                return [seen[target - x], i]\n            seen[x] = i"), 1),
    (TWO, block("from typing import List\nclass Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        return [0, 1]"), 1),
    (ADD, block("a, b = map(int, input().split())\nprint(a + b)") + "Example:\n```\n3\n```\n", 1),
    (ADD, block("a, b = map(int, input().split())\nprint(a + b)") + "Output:\n```text\n3\n```\n", 1),
    (ADD, block("a, b = map(int, input().split())\nprint(a + b)") + "Run it:\n```bash\necho 1 2 | python add.py\n```\n", 1),
    (ADD, block("a, b = map(int, input().split())\nprint(a + b)", "python3"), 1),
    (ADD, block("a, b = map(int, input().split())\nprint(a + b)", "Python"), 1),
    (ADD, block("a, b = map(int, input().split())\nprint(a + b)", " python"), 1),
    (ADD, block("a, b = map(int, input().split())\r\nprint(a + b)"), 1),
    (ADD, block("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\nsys.exit(0)"), 1),
    (ADD, block("a, b = map(int, input().split())\nprint(a + b)\nexit()"), 1),
    (ADD, block("a, b = map(int, input().split())\nprint(a + b)\nquit()"), 1),
    (ADD, block("import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)\nsys.exit(1)"), -1),
    (ADD, block("import sys\na, b = map(int, open(0).read().split())\nprint(a + b, file=sys.stderr)\nprint(a + b)"), 1),
    (ADD, block("def main():\n    a, b = map(int, input().split())\n    print(a + b)\n\nif __name__ == '__main__':\n    main()"), 1),
    (ADDF, block("def add(a, b):\n    return a + b\n\nif __name__ == '__main__':\n    x, y = map(int, input().split())\n    print(add(x, y))"), 1),
    (ADDF, block("def add(a, b):\n    return a + b\n\nprint(add(1, 2))"), 1),
    (ADDF, block("def add(a, b):\n    return a + b") + "Usage:\n```python\nprint(add(2, 3))  # 5\n```\n", 1),
    (ADDF, "def add(a, b):\n    return a + b\n", -1),
    (ADD, block("a, b = map(int, input().split())\nprint(a + b, end=' \\n\\n')"), 1),
    (ADD, block("a, b = map(int, input().split())\nprint(float(a + b))"), -1),
    (ADD, block("a, b = map(int, input().split())\nprint('debug'); print(a + b)"), -1),
)
BIG = dict(tests=[{"input": [1], "output": [1]}], fn_name="f")
CODE += cases("replies_within_limits",
    (BIG, block("def f(n):\n    M = 2 ** 61 - 1\n    return {i * M for i in range(60000)}"), -1),
    (BIG, block("def f(n):\n    return 'x' * (50 * 2 ** 20)"), -1),
    (BIG, block("def f(n):\n    x = []\n    for _ in range(100000):\n        x = [x]\n    return x"), -1),
    (BIG, block("def f(n):\n    return [[1] * 1000] * 10000"), -1),
    (CHECK_SORT, block("def sort_it(xs):\n    M = 2 ** 61 - 1\n    return {i * M for i in range(60000)}"), -1),
)

# test classes, argv and the standard library's values (tests/test_judge.py runs these, apart from CODE):
# a test class runs as pytest or unittest runs it, a stdin program sees `python solution.py`'s argv, a
# date, time, datetime or timedelta travels as itself
AREA = "def area(w, h):\n    return w * h"
SQUARE_ONLY = "def area(w, h):\n    return w * w"
PYTEST_CLASS = dict(test="class TestArea:\n    def test_square(self):\n        assert area(2, 2) == 4\n"
                         "    def test_rect(self):\n        assert area(2, 3) == 6\n")
UNIT = dict(test="import unittest\nclass AreaTests(unittest.TestCase):\n    def setUp(self):\n        self.sides = (2, 3)\n"
                 "    def test_rect(self):\n        self.assertEqual(area(*self.sides), 6)\n"
                 "    def test_zero(self):\n        self.assertEqual(area(0, 5), 0)\n")
ROOT = dict(test="from unittest import TestCase\nclass TestRoot(TestCase):\n    def test_negative(self):\n"
                 "        with self.assertRaises(ValueError):\n            root(-1)\n    def test_four(self):\n        self.assertEqual(root(4), 2)\n")
SETUP = dict(test="class TestSort:\n    def setup_method(self, method):\n        self.xs = [3, 1, 2]\n    def test_sorted(self):\n"
                  "        assert sort_it(self.xs) == [1, 2, 3]\n    def test_kept(self):\n        assert sorted(self.xs) == sort_it(self.xs)\n")
INHERITED = dict(test="class Checks:\n    def test_one(self):\n        assert double(1) == 2\n    def test_many(self):\n"
                      "        assert [double(x) for x in (2, 3)] == [4, 6]\nclass TestDouble(Checks):\n    pass\n")
ISSUE = cases("test_classes",
    (dict(test="class TestAdd:\n    def test_small(self):\n        assert add(1, 2) == 3\n"), block("def add(a, b):\n    return a + b"), 1),
    (dict(test="class TestAdd:\n    def test_small(self):\n        assert add(1, 2) == 3\n"), block("def add(a, b):\n    return 0"), -1),
    (dict(test="class TestAdd:\n    def test_small(self):\n        assert add(1, 2) == 3\n"), block("def add(a, b):\n    return 0\nraise SystemExit"), -1),
    (PYTEST_CLASS, block(AREA), 1),
    (PYTEST_CLASS, block(SQUARE_ONLY), -1),  # passes one method of two
    (PYTEST_CLASS, block("import sys\nsys.exit(0)\n" + AREA), -1),
    (PYTEST_CLASS, block("def area(w, h):\n    if w != h:\n        import sys\n        sys.exit(0)\n    return w * h"), -1),
    (UNIT, block(AREA), 1),
    (UNIT, block(SQUARE_ONLY), -1),
    (UNIT, block("def area(w, h):\n    return 6"), -1),
    (UNIT, block("def area(w, h):\n    raise SystemExit(0)"), -1),
    (ROOT, block("def root(n):\n    if n < 0:\n        raise ValueError(n)\n    return int(n ** 0.5)"), 1),
    (ROOT, block("def root(n):\n    return int(abs(n) ** 0.5)"), -1),
    (ROOT, block("def root(n):\n    if n < 0:\n        raise KeyboardInterrupt\n    return 2"), -1),
    (SETUP, block("def sort_it(xs):\n    return sorted(xs)"), 1),
    (SETUP, block("def sort_it(xs):\n    return xs"), -1),
    (INHERITED, block("def double(x):\n    return 2 * x"), 1),
    (INHERITED, block("def double(x):\n    return 2"), -1),
    (dict(test="class Helper:\n    def test_small(self):\n        assert add(1, 2) == 3\n"), block("def add(a, b):\n    return 0"), REFUSED),
    (dict(test="class TestAdd:\n    def __init__(self):\n        self.n = 1\n    def test_small(self):\n        assert add(1, 2) == 3\n"),
     block("def add(a, b):\n    return 0"), REFUSED),  # pytest collects no class with an __init__
    (dict(test="class TestAdd:\n    def check(self):\n        assert add(1, 2) == 3\n"), block("def add(a, b):\n    return 0"), REFUSED),
    (dict(test="import unittest\nclass AddTests(unittest.TestCase):\n    def setUp(self):\n        self.assertEqual(add(1, 2), 3)\n"),
     block("def add(a, b):\n    return 0"), REFUSED),
    (dict(test="class Checks:\n    def test_small(self):\n        assert add(1, 2) == 3\nclass Other(Checks):\n    pass\n"),
     block("def add(a, b):\n    return 0"), REFUSED),
)
ADD_IN = "a, b = map(int, input().split())\nprint(a + b)"
ISSUE += cases("argv",
    (ADD, block("import sys\nif len(sys.argv) > 1:\n    print(0)\nelse:\n    " + ADD_IN.replace("\n", "\n    ")), 1),
    (ADD, block("import fileinput\nprint(sum(int(x) for line in fileinput.input() for x in line.split()))"), 1),
    (ADD, block("import sys\nassert sys.argv == ['solution.py'] and sys.argv[0].endswith('.py')\n" + ADD_IN), 1),
    (ADD, block("import argparse\nargparse.ArgumentParser().parse_args()\n" + ADD_IN), 1),
    (ADD, block("import sys\nprint(len(sys.argv) + 2)"), -1),  # 3 once, then wrong
    (ADD, block("import sys\nprint(sys.argv[1])"), -1),
    (dict(tests=[{"input": [], "output": ["solution.py"]}], fn_name="args"), block("import sys\ndef args():\n    return sys.argv"), 1),
    (dict(test="assert count_args() == 0"), block("import sys\ndef count_args():\n    return len(sys.argv) - 1"), 1),
    (dict(test="assert count_args() == 1"), block("import sys\ndef count_args():\n    return len(sys.argv) - 1"), -1),
)
NEXT_DAY = dict(test="from datetime import date\ndef check(candidate):\n    assert candidate(2024, 2, 28) == date(2024, 2, 29)\n"
                     "    assert candidate(2023, 12, 31) == date(2024, 1, 1)\n", entry_point="next_day")
SPAN = dict(test="from datetime import date, timedelta\nassert span(date(2024, 1, 1), date(2024, 3, 1)) == timedelta(days=60)\n")
UTC = dict(test="from datetime import datetime, timedelta, timezone\nr = to_utc(datetime(2024, 1, 1, 12, tzinfo=timezone(timedelta(hours=2))))\n"
                "assert r == datetime(2024, 1, 1, 10, tzinfo=timezone.utc) and r.utcoffset() == timedelta(0)\n")
ISSUE += cases("stdlib_values",
    (NEXT_DAY, block("from datetime import date, timedelta\ndef next_day(y, m, d):\n    return date(y, m, d) + timedelta(days=1)"), 1),
    (NEXT_DAY, block("from datetime import date\ndef next_day(y, m, d):\n    return date(y, m, d + 1)"), -1),
    (NEXT_DAY, block("from datetime import date, timedelta\ndef next_day(y, m, d):\n    return str(date(y, m, d) + timedelta(days=1))"), -1),
    (NEXT_DAY, block("from datetime import datetime, timedelta\ndef next_day(y, m, d):\n    return datetime(y, m, d) + timedelta(days=1)"), -1),
    (NEXT_DAY, block("from datetime import date\nclass D(date):\n    def __eq__(self, other):\n        return True\n"
                     "def next_day(y, m, d):\n    return D(y, m, d)"), -1),
    (SPAN, block("def span(a, b):\n    return b - a"), 1),
    (SPAN, block("def span(a, b):\n    return (b - a).days"), -1),
    (UTC, block("from datetime import timezone\ndef to_utc(d):\n    return d.astimezone(timezone.utc)"), 1),
    (UTC, block("def to_utc(d):\n    return d"), -1),  # the same instant, another offset
    (UTC, block("from datetime import timezone\ndef to_utc(d):\n    return d.astimezone(timezone.utc).replace(tzinfo=None)"), -1),
    (dict(test="from datetime import time\nassert parse_hm('07:30') == time(7, 30) and parse_hm('23:05') == time(23, 5)\n"),
     block("from datetime import datetime\ndef parse_hm(s):\n    return datetime.strptime(s, '%H:%M').time()"), 1),
    (dict(test="from datetime import date\nassert weekday(date(2024, 1, 1)) == 0 and weekday(date(2024, 1, 7)) == 6\n"),
     block("def weekday(d):\n    return d.weekday()"), 1),
    (dict(test="from datetime import datetime\nassert parse('2024-01-02 03:04') == datetime(2024, 1, 2, 3, 4)\n"),
     block("from datetime import datetime\ndef parse(s):\n    return datetime.fromisoformat(s)"), 1),
    (dict(test="import uuid\nassert parse_id('12345678-1234-5678-1234-567812345678').int == 0x12345678123456781234567812345678\n"),
     block("import uuid\ndef parse_id(s):\n    return uuid.UUID(s)"), 1),
)

# Round five (issue 64): the program's objects, the prompt's types, collection, and tests that watch
# the program's process. Honest programs that were misjudged beside dishonest ones (wrong, or cheating
# where a naive fix would pay) that must still fail; tests/test_judge.py runs them and cross-checks
# the collection cases against real pytest and unittest. refused(why): refused at load, saying why.
def refused(why):
    return f"{REFUSED}: {why}"


STACK = ("class Stack:\n    def __init__(self, items=()):\n        self.items = list(items)\n"
         "    def push(self, x):\n        self.items.append(x)\n    def __len__(self):\n        return len(self.items)\n"
         "    def __iter__(self):\n        return iter(self.items)\n    def __getitem__(self, i):\n        return self.items[i]\n"
         "    def __repr__(self):\n        return f'Stack({self.items})'\n")
STACK_TEST = dict(test="s = Stack()\nassert not s and len(s) == 0\ns.push(1)\ns.push(2)\n"
                       "assert s and len(s) == 2 and list(s) == [1, 2] and s[-1] == 2 and s[:1] == [1]\n"
                       "assert 2 in s and 5 not in s and repr(s) == 'Stack([1, 2])' and str(s) == repr(s)\n")
VECTOR = ("class Vector:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
          "    def __add__(self, o):\n        return Vector(self.x + o.x, self.y + o.y)\n"
          "    def __mul__(self, k):\n        return Vector(self.x * k, self.y * k)\n    __rmul__ = __mul__\n"
          "    def __abs__(self):\n        return (self.x ** 2 + self.y ** 2) ** 0.5\n")
VECTOR_TEST = dict(test="v = Vector(1, 2) + Vector(2, 2)\nw = 2 * v\nassert (w.x, w.y) == (6, 8) and abs(w) == 10\n")
ACCOUNT = ("class InsufficientFunds(ValueError):\n    pass\nclass Account:\n    def __init__(self, balance):\n"
           "        self.balance = balance\n    def withdraw(self, amount):\n        if amount > self.balance:\n"
           "            raise InsufficientFunds(amount, self.balance)\n        self.balance -= amount\n")
ACCOUNT_TEST = dict(test="import unittest\nclass TestAccount(unittest.TestCase):\n    def test_overdraw(self):\n"
                         "        a = Account(10)\n        with self.assertRaises(InsufficientFunds) as caught:\n"
                         "            a.withdraw(15)\n        self.assertEqual(caught.exception.args, (15, 10))\n"
                         "        self.assertIsInstance(caught.exception, ValueError)\n"
                         "    def test_ok(self):\n        a = Account(10)\n        a.withdraw(4)\n        self.assertEqual(a.balance, 6)\n",
                    entry_point="Account, InsufficientFunds")
SHAPES = dict(test="assert isinstance(make('circle', 1), Circle) and isinstance(make('circle', 1), Shape)\n"
                   "assert not isinstance(make('square', 2), Circle) and make('square', 2).area() == 4\n",
              entry_point="make, Circle, Shape")
SHAPES_CODE = ("class Shape:\n    pass\nclass Circle(Shape):\n    def __init__(self, r):\n        self.r = r\n"
               "class Square(Shape):\n    def __init__(self, s):\n        self.s = s\n    def area(self):\n        return self.s ** 2\n"
               "def make(kind, size):\n    return Circle(size) if kind == 'circle' else Square(size)\n")
RESOURCE = dict(test="r = Resource()\nwith r as handle:\n    assert handle is r and r.open\nassert not r.open\n"
                     "with Resource() as q:\n    assert q.read() == 'data'\n")
RESOURCE_CODE = ("class Resource:\n    def __init__(self):\n        self.open = False\n    def __enter__(self):\n"
                 "        self.open = True\n        return self\n    def __exit__(self, kind, error, trace):\n"
                 "        self.open = False\n    def read(self):\n        return 'data'\n")
PRIMES = dict(test="assert 7 in primes(10) and 2 in primes(10)\n")
PRIMES_CODE = ("class Primes:\n    def __init__(self, n):\n        self.n = n\n    def __iter__(self):\n"
               "        yield from (p for p in range(2, self.n) if all(p % d for d in range(2, p)))\n"
               "def primes(n):\n    return Primes(n)\n")
QUEUE = dict(test="q = make_queue([1, 2, 3])\nassert q\nassert len(q) == 3\n", entry_point="make_queue")
ROUND5 = cases("protocols",
    (STACK_TEST, block(STACK), 1),
    (STACK_TEST, block(STACK.replace("self.items.append(x)", "self.items.insert(0, x)")), -1),
    # `in` iterates the object and compares here: a __contains__ that says yes to anything earns nothing
    (PRIMES, block(PRIMES_CODE), 1),
    (PRIMES, block(PRIMES_CODE.replace("yield from", "return iter(())  #") + "    def __contains__(self, x):\n        return True\n"), -1),
    (VECTOR_TEST, block(VECTOR), 1),
    (VECTOR_TEST, block(VECTOR.replace("self.y + o.y", "self.y - o.y")), -1),
    (ACCOUNT_TEST, block(ACCOUNT), 1),
    (ACCOUNT_TEST, block(ACCOUNT.replace("raise InsufficientFunds(amount, self.balance)", "raise ValueError(amount, self.balance)")), -1),
    (ACCOUNT_TEST, block(ACCOUNT.replace("(ValueError)", "(Exception)")), -1),
    (SHAPES, block(SHAPES_CODE), 1),
    (SHAPES, block(SHAPES_CODE.replace("class Circle(Shape)", "class Circle")), -1),
    (RESOURCE, block(RESOURCE_CODE), 1),
    (RESOURCE, block(RESOURCE_CODE.replace("        self.open = False\n    def read", "        pass\n    def read")), -1),
    # the program's __exit__ is told what the test raised and may clean up, but never swallows it
    (dict(test="with checked(3) as value:\n    assert value == 9\n"),
     block("class Checked:\n    def __init__(self, x):\n        self.x = x\n    def __enter__(self):\n        return self.x * 2\n"
           "    def __exit__(self, *exc):\n        return True\ndef checked(x):\n    return Checked(x)"), -1),
    (QUEUE, block("class Queue:\n    def __init__(self, xs):\n        self.xs = list(xs)\n    def __len__(self):\n"
                  "        return len(self.xs)\ndef make_queue(xs):\n    return Queue(xs)"), 1),
    (QUEUE, block("class Queue:\n    def __init__(self, xs):\n        self.xs = []\n    def __len__(self):\n"
                  "        return len(self.xs)\ndef make_queue(xs):\n    return Queue(xs)"), -1),  # an empty one is falsy
    # ==, <, <= are the test's: a program's object is equal to itself only and has no order here
    (dict(test="assert version('1.10') > version('1.9') and version('1.2') == version('1.2')\n"),
     block("class V:\n    def __init__(self, s):\n        self.s = s\n    def __gt__(self, o):\n        return True\n"
           "    def __eq__(self, o):\n        return True\ndef version(s):\n    return V(s)"), -1),
)
PYPOINT = ("from dataclasses import dataclass\n\n@dataclass\nclass Point:\n    x: int\n    y: int\n\n"
           "def midpoint(p: Point, q: Point) -> Point:\n    \"\"\"The point halfway between p and q.\"\"\"\n")
POINT = dict(prompt=PYPOINT, test="def check(candidate):\n    assert candidate(Point(0, 0), Point(2, 4)) == Point(1, 2)\n"
                                  "    assert isinstance(candidate(Point(1, 1), Point(1, 1)), Point)\n", entry_point="midpoint")
PYCOLOR = ("from enum import Enum\n\nclass Color(Enum):\n    RED = 1\n    GREEN = 2\n\n"
           "def complement(c: Color) -> Color:\n    \"\"\"RED for GREEN and GREEN for RED.\"\"\"\n")
COLOR = dict(prompt=PYCOLOR, test="def check(candidate):\n    assert candidate(Color.RED) is Color.GREEN\n"
                                  "    assert candidate(Color.GREEN) == Color.RED\n", entry_point="complement")
PYLIST = ("class ListNode:\n    def __init__(self, val=0, next=None):\n        self.val = val\n        self.next = next\n\n"
          "def build(xs):\n    head = None\n    for x in reversed(xs):\n        head = ListNode(x, head)\n    return head\n\n"
          "def to_list(node):\n    out = []\n    while node:\n        out.append(node.val)\n        node = node.next\n    return out\n\n"
          "def reverse_list(head: ListNode) -> ListNode:\n    \"\"\"The list reversed.\"\"\"\n")
REVERSE = dict(prompt=PYLIST, test="def check(candidate):\n    assert to_list(candidate(build([1, 2, 3]))) == [3, 2, 1]\n"
                                   "    assert candidate(None) is None\n", entry_point="reverse_list")
REVERSE_CODE = ("def reverse_list(head):\n    prev = None\n    while head:\n        head.next, prev, head = prev, head, head.next\n"
                "    return prev")
PYTREE = ("class TreeNode:\n    def __init__(self, val, left=None, right=None):\n        self.val, self.left, self.right = val, left, right\n\n"
          "def depth(root: TreeNode) -> int:\n    \"\"\"The number of nodes on the longest path from the root down.\"\"\"\n")
DEPTH = dict(prompt=PYTREE, test="def check(candidate):\n    assert candidate(TreeNode(1, TreeNode(2, TreeNode(3)), TreeNode(4))) == 3\n"
                                 "    assert candidate(None) == 0\n", entry_point="depth")
PYREORDER = PYLIST.replace("def reverse_list(head: ListNode) -> ListNode:\n    \"\"\"The list reversed.\"\"\"\n",
                           "def swap_pairs(head: ListNode) -> None:\n    \"\"\"Swaps the values of each pair of nodes, in place.\"\"\"\n")
SWAP = dict(prompt=PYREORDER, test="def check(candidate):\n    head = build([1, 2, 3, 4, 5])\n    assert candidate(head) is None\n"
                                   "    assert to_list(head) == [2, 1, 4, 3, 5]\n", entry_point="swap_pairs")
ROUND5 += cases("prompt_types",
    (POINT, block("def midpoint(p, q):\n    return Point((p.x + q.x) // 2, (p.y + q.y) // 2)"), 1),
    (POINT, block("def midpoint(p, q):\n    return Point(p.x + q.x, p.y + q.y)"), -1),
    # its own Point, whose == says yes: it travels as its state and the prompt's Point compares it
    (POINT, block("class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
                  "    def __eq__(self, other):\n        return True\ndef midpoint(p, q):\n    return Point(0, 0)"), -1),
    (COLOR, block("def complement(c):\n    return Color.GREEN if c is Color.RED else Color.RED"), 1),
    (COLOR, block("def complement(c):\n    return c"), -1),
    (REVERSE, block(REVERSE_CODE), 1),
    (REVERSE, block("def reverse_list(head):\n    return head"), -1),
    (DEPTH, block("def depth(root):\n    return 0 if root is None else 1 + max(depth(root.left), depth(root.right))"), 1),
    (DEPTH, block("def depth(root):\n    return 0 if root is None else 1 + depth(root.right)"), -1),
    (SWAP, block("def swap_pairs(head):\n    while head and head.next:\n        head.val, head.next.val = head.next.val, head.val\n"
                 "        head = head.next.next"), 1),
    (SWAP, block("def swap_pairs(head):\n    values = to_list(head)"), -1),
    # a builtin bound as the entry point is a function like any other, called in the program
    (dict(test="assert solve([3, 1, 2]) == [1, 2, 3] and solve('ba') == ['a', 'b']"), block("solve = sorted"), 1),
    (dict(test="assert solve([3, 1, 2]) == [1, 2, 3]"), block("solve = list"), -1),
    (dict(test="assert size('abc') == 3"), block("size = len"), 1),
    (dict(test="assert size('abc') == 3"), block("size = hash"), -1),
)
SORT_IT = "def sort_it(xs):\n    return sorted(xs)"
SORT_BAD = "def sort_it(xs):\n    return xs"
UNIT_SKIP = ("import unittest\nclass SortTests(unittest.TestCase):\n    @unittest.skip('slow')\n    def test_big(self):\n"
             "        self.assertEqual(sort_it(list(range(10 ** 8, 0, -1)))[0], 1)\n"
             "    def test_small(self):\n        self.assertEqual(sort_it([2, 1]), [1, 2])\n")
COLLECTION = cases("collection",
    (dict(test="def testSort():\n    assert sort_it([2, 1, 3]) == [1, 2, 3]\n"), block(SORT_IT), 1),  # pytest's prefix: test
    (dict(test="def testSort():\n    assert sort_it([2, 1, 3]) == [1, 2, 3]\n"), block(SORT_BAD), -1),
    (dict(test="class TestSort:\n    class TestEmpty:\n        def test_empty(self):\n            assert sort_it([]) == []\n"
                "    class TestMany:\n        def test_many(self):\n            assert sort_it([2, 1]) == [1, 2]\n"), block(SORT_IT), 1),
    (dict(test="class TestSort:\n    class TestEmpty:\n        def test_empty(self):\n            assert sort_it([]) == []\n"
                "    class TestMany:\n        def test_many(self):\n            assert sort_it([2, 1]) == [1, 2]\n"), block(SORT_BAD), -1),
    (dict(test="DATA = []\ndef setup_module(module):\n    DATA.extend([3, 1, 2])\ndef teardown_module(module):\n    DATA.clear()\n"
                "def test_sorted():\n    assert sort_it(DATA) == [1, 2, 3]\n"), block(SORT_IT), 1),
    (dict(test="DATA = []\ndef setup_module(module):\n    DATA.extend([3, 1, 2])\n"
                "def test_sorted():\n    assert sort_it(DATA) == [1, 2, 3]\n"), block(SORT_BAD), -1),
    (dict(test="import unittest\nDATA = []\ndef setUpModule():\n    DATA.append([2, 1])\n"
                "class SortTests(unittest.TestCase):\n    def test_it(self):\n        self.assertEqual(sort_it(DATA[0]), [1, 2])\n"),
     block(SORT_IT), 1),
    (dict(test="import unittest\nDATA = []\ndef setUpModule():\n    DATA.append([2, 1])\n"
                "class SortTests(unittest.TestCase):\n    def test_it(self):\n        self.assertEqual(sort_it(DATA[0]), [1, 2])\n"),
     block(SORT_BAD), -1),
    (dict(test=UNIT_SKIP), block(SORT_IT), 1),  # the skipped test is skipped, not failed
    (dict(test=UNIT_SKIP), block(SORT_BAD), -1),
    (dict(test=UNIT_SKIP.replace("    def test_small", "    @unittest.skip('flaky')\n    def test_small")), block(SORT_IT),
     refused("skips every test")),
    (dict(test="import unittest\nclass SortTests(unittest.TestCase):\n    def test_it(self):\n        self.skipTest('later')\n"
                "        self.assertEqual(sort_it([2, 1]), [1, 2])\n"), block(SORT_IT), -1),  # skips all, as it runs
    # a skipped test's asserts test nothing: what is left calls the program and asserts nothing
    (dict(test="import unittest\n@unittest.skip('wip')\nclass TestChecks(unittest.TestCase):\n    def test_it(self):\n"
                "        self.assertEqual(sort_it([2, 1]), [1, 2])\ndef test_runs():\n    sort_it([2, 1])\n"), block(SORT_BAD),
     refused("asserts nothing")),
    (dict(test="from unittest import TestCase as Case\nclass SortChecks(Case):\n    def test_it(self):\n"
                "        self.assertEqual(sort_it([3, 1, 2]), [1, 2, 3])\n"), block(SORT_IT), 1),  # TestCase by any name
    (dict(test="from unittest import TestCase as Case\nclass SortChecks(Case):\n    def test_it(self):\n"
                "        self.assertEqual(sort_it([3, 1, 2]), [1, 2, 3])\n"), block(SORT_BAD), -1),
)
ROUND5 += COLLECTION
HELLO = "def hello(name):\n    print(f'Hello, {name}!')"
ROUND5 += cases("watched",
    # the program's random follows the test's seed, as in one process
    (dict(test="import random\nrandom.seed(7)\nexpected = [random.randint(1, 6) for _ in range(5)]\nrandom.seed(7)\n"
                "assert rolls(5) == expected\n"), block("import random\ndef rolls(n):\n    return [random.randint(1, 6) for _ in range(n)]"), 1),
    (dict(test="import random\nrandom.seed(7)\nexpected = [random.randint(1, 6) for _ in range(5)]\nrandom.seed(7)\n"
                "assert rolls(5) == expected\n"), block("import random\ndef rolls(n):\n    return [random.randint(1, 5) for _ in range(n)]"), -1),
    # what the program prints, the test's redirect_stdout and patch of sys.stdout hold
    (dict(test="import io\nfrom contextlib import redirect_stdout\nbuf = io.StringIO()\nwith redirect_stdout(buf):\n"
                "    hello('Ann')\nassert buf.getvalue() == 'Hello, Ann!\\n'\n"), block(HELLO), 1),
    (dict(test="import io\nfrom contextlib import redirect_stdout\nbuf = io.StringIO()\nwith redirect_stdout(buf):\n"
                "    hello('Ann')\nassert buf.getvalue() == 'Hello, Ann!\\n'\n"), block("def hello(name):\n    return f'Hello, {name}!'"), -1),
    (dict(test="import io, unittest\nfrom unittest.mock import patch\nclass TestHello(unittest.TestCase):\n"
                "    @patch('sys.stdout', new_callable=io.StringIO)\n    def test_it(self, out):\n        hello('Bo')\n"
                "        self.assertEqual(out.getvalue(), 'Hello, Bo!\\n')\n"), block(HELLO), 1),
    (dict(test="import io, unittest\nfrom unittest.mock import patch\nclass TestHello(unittest.TestCase):\n"
                "    @patch('sys.stdout', new_callable=io.StringIO)\n    def test_it(self, out):\n        hello('Bo')\n"
                "        self.assertEqual(out.getvalue(), 'Hello, Bo!\\n')\n"), block(HELLO.replace("Hello", "Hi")), -1),
    # a test's own unittest.main() runs nothing: its classes run once, as collected
    (dict(test="import unittest\nclass TestSort(unittest.TestCase):\n    def test_it(self):\n"
                "        self.assertEqual(sort_it([2, 1]), [1, 2])\nunittest.main()\n"), block(SORT_IT), 1),
    (dict(test="import unittest\nclass TestSort(unittest.TestCase):\n    def test_it(self):\n"
                "        self.assertEqual(sort_it([2, 1]), [1, 2])\nunittest.main()\n"), block(SORT_BAD), -1),
    # what patches the test's own process, or asks for pytest's fixtures, would fail every program
    (dict(test="from unittest.mock import patch\nwith patch('builtins.input', return_value='3'):\n    assert read_twice() == 6\n"),
     block("def read_twice():\n    return 2 * int(input())"), refused("patches")),
    (dict(test="import random\nfrom unittest import mock\n@mock.patch.object(random, 'randint', return_value=4)\n"
                "def test_roll(_):\n    assert roll() == 4\n"), block("import random\ndef roll():\n    return random.randint(1, 6)"),
     refused("patches")),
    (dict(test="def test_hello(capsys):\n    hello('Ann')\n    assert capsys.readouterr().out == 'Hello, Ann!\\n'\n"),
     block(HELLO), refused("fixture 'capsys'")),
    (dict(test="class TestEnv:\n    def test_home(self, monkeypatch):\n        monkeypatch.setenv('HOME', '/x')\n"
                "        assert home() == '/x'\n"), block("import os\ndef home():\n    return os.environ['HOME']"),
     refused("fixture 'monkeypatch'")),
)
