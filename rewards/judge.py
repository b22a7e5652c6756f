"""The code reward: the verdict of a model-written program on its tests, run in sandbox.py.

The program runs in the sandbox under harness.py, the test in a judge worker (serve), our process:
the expected values never enter the sandbox. The worker asks, the harness answers, a JSON line each,
values as codec.py writes them (data, or a handle naming an object and its class; handle 0: the
program's namespace, 1: its random.seed). Both files are read here as text, once, and run in the
sandbox as `python -c`; the worker execs codec.py's text too.

    judge -> harness   ["get", handle, name]  ["call", handle, args, kwargs(, method)]
                       ["next", handle]  ["class", handle]: its name, bases and methods
                       ["return", value] or ["raise", names]: the answer to a callback
    harness -> judge   ["value", value, changed arguments]  ["stop"]  ["fail", why]
                       ["raised", names, [args(, itself)]]  ["callback", number, args, kwargs]:
                       it calls the test's (0: print what it printed)

A reply is only the program's answer to the request before it: nothing the program holds, prints or
forges passes a test it fails. The worker (memory-limited, killed past the deadline), never the
trainer, decodes replies and runs the test; the trainer reads back a byte. stdin/stdout tests need
no worker: their output is compared here.
"""
import ast
import builtins
import json
import keyword
import os
import pickle
import random
import re
import resource
import socket
import subprocess
import symtable
import sys
import threading
import time
import unittest
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from functools import lru_cache

from . import sandbox
from .sandbox import TIMEOUT, WORKERS, Pipes, Sandboxed, run

ARGUMENTS_ROOM = 64 << 20  # characters of what the test passes in one call (trusted)
MARGIN = 2.0               # seconds a worker may run past the sandbox's deadline; then it is killed
JUDGE_MEMORY = 1 << 30     # bytes of address space of a judge worker (RLIMIT_AS)

# site's exit and quit, which -S leaves out: a program's exit() is an exit, never a NameError
EXITS = "import builtins, sys\nbuiltins.exit = builtins.quit = sys.exit\n"
SEED = random.seed  # the judge's own, which a worker's random.seed calls (_verdict)


def _source(name):
    """A file of ours beside this one, as text: what runs in the sandbox, which has no files."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name), "rb") as f:
        return f.read().decode()


# codec.py, then harness.py, one namespace in one `python -c`: harness.py's import of codec.py's
# names is a reader's and a linter's (an `if` that is false in the sandbox). Neither is imported.
CODEC = _source("codec.py")
HARNESS = CODEC + EXITS + _source("harness.py")
PYTHON = ["-X", "int_max_str_digits=0", "-c"]  # HARNESS or STDIN: ints of any size, as before 3.11
# the program runs with the argv `python solution.py` gives it (fileinput reads stdin), its source taken off
STDIN = EXITS + ('source, sys.argv[:] = sys.argv[1], ["solution.py"]\n'
                 'exec(compile(source, "solution.py", "exec"), {"__name__": "__main__"})')
_codec = {}
exec(CODEC, _codec)  # the judge's side of the same grammar, with its limits
encode, decode, bases = _codec["encode"], _codec["decode"], _codec["bases"]
REPLY_CAP = _codec["REPLY_CAP"]  # characters of one reply; more is a failed call
PROMPT = _codec["PROMPT"]  # the prelude's classes, by name: a worker's job's own
STOPS = (StopIteration, StopAsyncIteration)

# -----------------------------------------------------------------------------
# the judge's side of the conversation, in a worker


class Failed(BaseException):
    """A call failed for good (the process died, overran or exited, it raised a BaseException, its
    reply cannot be carried): a test that catches it fails all the same."""


# A program's object that is not data is an instance of its class's stand-in (RemoteClass): reached
# by attribute, call and the protocols its class defines, each answered by the object in the
# program's process; never by its __eq__ (a test's == is identity here).
class Remote:
    __slots__ = ()

    def __getattr__(self, name):
        if name.startswith(("__", "_Remote")):  # copy, pickle and friends probe these: none is its
            raise AttributeError(name)
        return self._Remote__talk.ask("get", self._Remote__handle, name)


# A program's class, stood in for here (Talk.stand_in): a call makes its object there, an attribute
# is read there, and its objects and subclasses are this class's (isinstance, except).
class RemoteClass(type):

    def __call__(cls, *args, **kwargs):
        return cls._Remote__talk.call(cls._Remote__handle, args, kwargs)

    __getattr__ = Remote.__getattr__


def _protocol(name):  # the method a protocol calls, answered by the program's object
    def method(self, *args, **kwargs):
        return self._Remote__talk.call(self._Remote__handle, args, kwargs, name)
    return method


def _exit(self, kind, error, trace):  # told the builtin class of what was raised; swallows nothing
    _protocol("__exit__")(self, kind and getattr(builtins, bases(error)[0]), None, None)


# What a program's object answers for itself: every protocol of Python's syntax and builtins but the
# comparisons, whose answer is the test's (==, <, `in` ask whether it matches the test's value,
# which a liar answers yes to unseen: == is identity, `in` iterates it and compares here, as Python
# does for a class without __contains__, and <, <=, >, >= are refused).
OPERATORS = "add sub mul matmul truediv floordiv mod divmod pow lshift rshift and xor or".split()
PROTOCOLS = {f"__{name}__": _protocol(f"__{name}__") for name in [
    *OPERATORS, *(f"r{o}" for o in OPERATORS), *(f"i{o}" for o in OPERATORS),
    *"neg pos abs invert int float complex index round trunc floor ceil".split(),
    *"len bool iter reversed str repr format bytes getitem setitem delitem call enter".split()]}
PROTOCOLS.update(__next__=lambda self: self._Remote__talk.ask("next", self._Remote__handle),
                 __exit__=_exit)


def _short_int(digits):  # a longer one is the program's forgery: encode writes them in hex
    if len(digits) > 20:
        raise ValueError("a long decimal int")
    return int(digits)


class Talk:
    """The judge's side of the conversation with harness.py, over the sandbox's pipes."""

    def __init__(self, pipes):
        self.pipes, self.failed = pipes, None
        # the test's callables given to the program, by id(); 0: what the program prints, printed
        # here (the test's redirect_stdout holds it)
        self.callbacks, self.numbers = [lambda text: print(text, end="")], {}
        self.classes, self.objects = {}, {}  # the program's classes' and objects' stand-ins

    def fail(self, why):
        self.failed = self.failed or why
        raise Failed(why)

    def exchange(self, message):
        """A message -> the program's next: its reply, or a callback."""
        stopped = self.pipes.pump(json.dumps(message).encode() + b"\n", line=True)
        if stopped or b"\n" not in self.pipes.stdout:
            self.fail(f"the program's process {stopped or 'ended'}")
        line, _, self.pipes.stdout[:] = self.pipes.stdout.partition(b"\n")
        try:
            reply = json.loads(line, parse_int=_short_int)
        except (ValueError, RecursionError):
            reply = None
        if not (type(reply) is list and reply and type(reply[0]) is str):
            self.fail("a reply that is not the protocol's")
        return reply

    def ask(self, *message, arguments=None):
        """A request -> its reply's value, serving the program's callbacks meanwhile. arguments: a
        call's, by position and name, which the program may have changed in place."""
        reply = self.exchange(list(message))
        while reply[0] == "callback":
            reply = self.exchange(self.run_callback(*reply[1:]))
        kind, *fields = reply
        if kind not in ("value", "raised", "stop"):
            self.fail(f"{fields[:1]}" if kind == "fail" else "a reply that is not the protocol's")
        try:
            if kind == "value":
                value = self.decode(fields[0])
                for key, new in fields[1]:
                    update(arguments[key], self.decode(new))
                return value
            error = StopIteration() if kind == "stop" else self.raised(*fields)
        except (Failed, MemoryError):
            raise
        except Exception:
            self.fail("a reply that is not the protocol's")
        raise error

    def call(self, handle, args, kwargs, *method):
        return self.ask("call", handle, self.carried(enumerate(args)), self.carried(kwargs.items()),
                        *method, arguments={**dict(enumerate(args)), **kwargs})

    def carried(self, arguments):
        """What the test passes, as data; a value that cannot be carried fails for good."""
        try:
            return [[k, encode(v, self.refer, [ARGUMENTS_ROOM])] for k, v in arguments]
        except BufferError as e:
            self.fail(f"the test's value: {e}")

    def refer(self, value):  # what the test passes that is not data
        if isinstance(value, (Remote, RemoteClass)):
            return {"ref": value._Remote__handle}
        if callable(value):  # a function of the test's: the program calls it back here
            if id(value) not in self.numbers:
                self.numbers[id(value)] = len(self.callbacks)
                self.callbacks.append(value)
            return {"callback": self.numbers[id(value)]}
        self.fail(f"the test passes a {type(value).__name__}, which no program can be given")

    def run_callback(self, number, args, kwargs):
        """The program calls a callable of the test's: it runs here."""
        try:
            function = self.callbacks[number]
            args, kwargs = [self.decode(a) for _, a in args], {k: self.decode(v) for k, v in kwargs}
        except (Failed, MemoryError):
            raise
        except Exception:
            self.fail("a callback that is not the protocol's")
        try:
            value = function(*args, **kwargs)
        except Exception as error:
            return ["raise", bases(error)]
        return ["return", self.carried([(0, value)])[0][1]]

    def decode(self, data):
        return decode(data, self.resolve)

    def resolve(self, tag, payload):
        if tag == "class":
            return self.stand_in(payload)
        if tag == "object":
            handle, kind = payload
            if handle not in self.objects:  # one object here for each there (`is` holds)
                self.objects[handle] = self.stand_in(kind).__new__(self.stand_in(kind))
                vars(self.objects[handle])["_Remote__handle"] = handle
            return self.objects[handle]
        if tag == "builtin" and isinstance(getattr(builtins, payload), type):  # never a function
            return getattr(builtins, payload)
        raise ValueError(f"no value is tagged {tag!r}")

    # A program's class -> its stand-in: a RemoteClass whose bases are its program bases' stand-ins
    # and its builtin exceptions (an except clause catches it as Python would), and whose methods
    # are the protocols the class defines (PROTOCOLS), each answered there.
    def stand_in(self, handle):
        if handle not in self.classes:
            name, bases, names = self.ask("class", int(handle))
            bases = [b for b in bases if isinstance(b, RemoteClass) or issubclass(b, BaseException)]
            methods = {n: PROTOCOLS[n] for n in names if n in PROTOCOLS}
            self.classes[handle] = RemoteClass(name, (*bases, Remote), dict(
                methods, _Remote__handle=handle, _Remote__talk=self))
        return self.classes[handle]

    # The program's exception: its own class's as the stand-in, a builtin's as itself (the nearest
    # builtin base otherwise), with its arguments; a BaseException fails for good.
    def raised(self, names, args):
        args, *own = self.decode(args)  # its arguments, and itself when its class is its own
        if isinstance(own and own[0], Exception) and not isinstance(own[0], STOPS):
            own[0].args = tuple(args)
            return own[0]
        for name in names:
            error = getattr(builtins, name, None)
            if not (isinstance(error, type) and issubclass(error, BaseException)):
                continue
            if not issubclass(error, Exception):
                self.fail(f"the program raised {name}")
            if issubclass(error, STOPS):  # it would end a map() early
                return RuntimeError(f"the program raised {name}")  # as PEP 479 has a generator do
            for arguments in (args, ()):
                with suppress(Exception):
                    return error(*arguments)
        return RuntimeError("the program raised")


def update(old, new):
    """The test's argument made, in place, what the program made of it (its contents too)."""
    if type(old) is not type(new) or old is new:
        return new
    if isinstance(old, tuple):  # the tuple stays; what it holds may have changed
        for o, n in zip(old, new):
            update(o, n)
    elif isinstance(old, list):
        old[:] = [update(o, n) for o, n in zip(old, new)] + new[len(old):]
    elif isinstance(old, dict) or type(old) in PROMPT.values():  # a prompt's object: its state
        old_state, state = (old, new) if isinstance(old, dict) else (vars(old), vars(new))
        mapping = {k: update(old_state[k], v) if k in old_state else v for k, v in state.items()}
        old_state.clear()
        dict.update(old_state, mapping)  # Counter.update would add
    elif isinstance(old, (set, deque)):
        old.clear()
        old.update(new) if isinstance(old, set) else old.extend(new)
    elif isinstance(old, bytearray):
        old[:] = new
    else:
        return new
    return old


def same_as_json(value, expected):
    """A call test's comparison: Python's ==, but the expected value came from JSON, which has no
    tuple (a tuple equals the list it is written as) and only string keys (a key equals what
    json.dumps writes: 1 equals "1"; 1 and "1" together equal nothing). A set is never a list."""
    if type(expected) is list:
        return (isinstance(value, (list, tuple)) and len(value) == len(expected)
                and all(map(same_as_json, value, expected)))
    if type(expected) is dict:
        if not isinstance(value, dict):
            return False
        written = lambda k: json.dumps(k) if isinstance(k, (int, float)) or k is None else k
        keys = {written(k): v for k, v in value.items()}
        return (len(keys) == len(value) == len(expected)
                and all(k in keys and same_as_json(keys[k], v) for k, v in expected.items()))
    return value == expected


def _verdict(pipes, job):
    """A call- or assert-style job, in a worker: the program's names fetched, the test run here."""
    talk = Talk(pipes)

    def seed(*args, **kwargs):  # the program's global random follows the test's, as in one process
        talk.call(1, args, kwargs)  # (the harness's handle 1: its random.seed)
        return SEED(*args, **kwargs)
    random.seed = seed
    try:
        namespace = {"__name__": "solution"}
        if job["prelude"]:  # the prompt's helpers are its own here: the program cannot change them
            exec(compile(job["prelude"], "<prompt>", "exec"), namespace)
        PROMPT.clear()
        PROMPT.update({k: v for k, v in namespace.items()
                       if isinstance(v, type) and v.__module__ == "solution"})
        for name in job["names"]:  # the program supplies them all, or fails
            namespace[name] = talk.ask("get", 0, name)
        if job["fn_name"]:
            function = namespace[job["fn_name"]]
            passed = all(same_as_json(function(*t["input"]), t["output"]) for t in job["tests"])
        else:
            exec(compile(job["script"], "<test>", "exec", optimize=0), namespace)  # under -O too
            passed = True
        return passed and not talk.failed
    except MemoryError:
        raise
    except BaseException:  # a failed assert or call, a test that raised, ...: a fail
        return False


def serve(fd):
    """A judge worker: jobs (pickled) and the sandbox's stdin and stdout come over the socket `fd`,
    a verdict byte goes back. It ends with the trainer, or out of memory."""
    sandbox.undumpable()  # a program run as our user (no root) cannot read the expected values
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    memory = JUDGE_MEMORY if hard == resource.RLIM_INFINITY else min(JUDGE_MEMORY, hard)
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    getattr(sys, "set_int_max_str_digits", abs)(0)  # the test's ints, as before Python 3.11
    unittest.main = lambda *args, **kwargs: None  # a test's own runs nothing: its classes run once
    trainer = socket.socket(fileno=fd)
    while True:
        header, fds, _, _ = socket.recv_fds(trainer, 8, 2)
        while 0 < len(header) < 8:
            header += trainer.recv(8 - len(header))
        if not header:
            return
        size, payload = int.from_bytes(header, "little"), bytearray()
        while len(payload) < size and (chunk := trainer.recv(size - len(payload))):
            payload += chunk
        job = pickle.loads(payload)
        with open(fds[0], "wb", buffering=0) as stdin, open(fds[1], "rb", buffering=0) as stdout:
            pipes = Pipes(stdin, stdout, None, job["deadline"])
            pipes.cap = 2 * REPLY_CAP
            try:
                verdict = _verdict(pipes, job)
            except MemoryError:
                os._exit(1)  # no verdict: the trainer replaces this worker
        trainer.sendall(b"1" if verdict else b"0")

# -----------------------------------------------------------------------------
# what a test may use, decided when it is loaded

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def entry_points(entry_point):
    """None, "f", "f, g" or ["f", "g"] -> a tuple of the names the program supplies."""
    if entry_point is None:
        return ()
    names = entry_point.split(",") if isinstance(entry_point, str) else entry_point
    names = [n.strip() if isinstance(n, str) else "" for n in names] if type(names) is list else []
    if not names or not all(n.isidentifier() and not keyword.iskeyword(n) for n in names):
        raise ValueError("entry_point must name the program's function: an identifier, or several "
                         f"(a list, or 'f, g'), got {entry_point!r}")
    return tuple(names)


def prelude_of(prompt):
    """The prompt as code the program and the test build on (HumanEval's imports, helpers, stub), or
    None: only a prompt that parses as Python, defines a function or class and does nothing else."""
    try:
        body = ast.parse(prompt).body
    except (SyntaxError, ValueError, TypeError):
        return None
    definitions = (*FUNCTIONS, ast.ClassDef)
    quiet = (*definitions, ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign)
    docstring = lambda n: isinstance(n, ast.Expr) and isinstance(getattr(n.value, "value", 0), str)
    defines = any(isinstance(n, definitions) for n in body)
    return prompt if defines and all(isinstance(n, quiet) or docstring(n) for n in body) else None


def _bound(table):
    return {s.get_name() for s in table.get_symbols()
            if s.is_assigned() or s.is_imported() or s.is_namespace()}


def _helpers(prelude):
    """What a prelude gives the test: the names it binds but its stubs (a def of a docstring or pass
    alone), which are the program's to write."""
    if not prelude:
        return set()
    empty = lambda s: isinstance(s, ast.Pass) or isinstance(getattr(s, "value", None), ast.Constant)
    stubs = {n.name for n in ast.parse(prelude).body
             if isinstance(n, FUNCTIONS) and all(map(empty, n.body))}
    return _bound(symtable.symtable(prelude, "<prompt>", "exec")) - stubs


def assert_plan(test, entry_point=None, prelude=None):
    """-> (the script an assert-style test runs, the names the program supplies), or a one-line
    ValueError. A name the test reads is a builtin, its own, the prompt's (prelude) or the
    program's: the entry point, or (none given) the one name left; several left are refused."""
    return _plan(test, entry_points(entry_point), prelude)


def _carriable(tree, names, prelude):
    """Refuses what a test passes the program that no program can be given, where it shows: a
    generator, or an object of a class of the test's (the prompt's travel as their state)."""
    classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    check = next((n for n in tree.body if getattr(n, "name", "") == "check"), None)
    callees = {*names, *([check.args.args[0].arg] if check and check.args.args else [])}
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) in callees:
            for arg in [*call.args, *(k.value for k in call.keywords)]:
                made = isinstance(arg, ast.Call) and getattr(arg.func, "id", None) in classes
                if made or isinstance(arg, ast.GeneratorExp):
                    raise ValueError(f"the test passes {ast.unparse(arg)[:40]!r} to the program, "
                                     "which cannot be given it (pass data, or a function)")


# pytest's and unittest's tests, run as they run them: the module's fixtures around all (pytest's
# given the module, None, where they take it), a class's around its tests, an instance per test*
# method with pytest's setup_method (debug(): a TestCase's setUp, test and tearDown, what fails
# raising here). A skip (unittest.SkipTest) is skipped, and a run that skips every test fails.
RUN_TESTS = """
def run_tests(*tests, none=lambda *a: None):
    unittest, ran, module = __import__("unittest"), [], globals()
    def run(test, setup=none, teardown=none):
        try:
            setup(test), test(), teardown(test), ran.append(test)
        except unittest.SkipTest:
            pass
    def run_class(cls):
        unit = issubclass(cls, unittest.TestCase)
        getattr(cls, "setUpClass" if unit else "setup_class", none)()
        for name in [n for n in dir(cls) if n.startswith("test") and callable(getattr(cls, n))]:
            test = cls(name) if unit else cls()
            fixtures = [getattr(test, f, none) for f in ("setup_method", "teardown_method")]
            run(test.debug) if unit else run(getattr(test, name), *fixtures)
        getattr(cls, "tearDownClass" if unit else "teardown_class", none)()
    fixture = lambda *names: next((module[n] for n in names if n in module), none)
    setup = fixture("setUpModule", "setup_module")
    teardown = fixture("tearDownModule", "teardown_module")
    setup(*[None] * setup.__code__.co_argcount)
    for test in tests:  # functions and classes, a nested class after its own
        run_class(test) if isinstance(test, type) else run(test)
    teardown(*[None] * teardown.__code__.co_argcount)
    assert ran, "every test was skipped"
"""


def _skipped(node):  # a test pytest and unittest skip whatever happens: @skip(...), @unittest.skip
    return any(ast.unparse(getattr(d, "func", d)).rsplit(".", 1)[-1] == "skip"
               for d in getattr(node, "decorator_list", ()))


# The names of the classes pytest collects in a body: a unittest TestCase (a base named *TestCase,
# or one of `units`: those, and names TestCase is imported as) or a class named Test* without an
# __init__, with a test* method (its own or a base's of these) or a nested class it collects (a
# pytest class's, named after it). What it collects not, or skips whatever happens, is never run,
# and its asserts test nothing.
def _test_classes(body, units, outer=""):
    tested, found = set(), []
    for c in (n for n in body if isinstance(n, ast.ClassDef) and not _skipped(n)):
        bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in c.bases}
        methods = {n.name for n in c.body if isinstance(n, FUNCTIONS) and not _skipped(n)}
        unit = any(b.endswith("TestCase") for b in bases) or bool(bases & units)
        inner = [] if unit else _test_classes(c.body, units, f"{outer}{c.name}.")  # as TestA.TestB
        if any(m.startswith("test") for m in methods) or bases & tested or inner:
            tested.add(c.name)
        if unit:
            units.add(c.name)
        elif not c.name.startswith("Test") or "__init__" in methods:
            continue
        found += [outer + c.name, *inner] if c.name in tested else []
    return found


# What reaches into the program's process, which is not the test's, is refused: a patch of a module
# (unittest.mock's; sys.stdout and sys.stderr aside: what the program prints, the test's prints),
# or pytest's fixtures (capsys, monkeypatch), which a test function or method asks for by argument
# (after self, and the mocks its patch decorators pass, first).
def _watches(tree, tests):
    methods = [m for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for m in c.body]
    for node in ast.walk(tree):
        patches = isinstance(node, ast.Call) and "patch" in ast.unparse(node.func).split(".")
        if patches and not re.search(r"'(sys\.)?std(out|err)'", ast.unparse(node)):
            raise ValueError(f"the test patches {ast.unparse(node)[:40]!r} in its process, "
                             "not the program's")
    for f in [*tests, *methods]:
        if isinstance(f, FUNCTIONS) and f.name.startswith("test"):
            mocks = sum("patch" in ast.unparse(d) for d in f.decorator_list) + (f in methods)
            if asked := f.args.args[mocks:len(f.args.args) - len(f.args.defaults)]:
                raise ValueError(f"the test's {f.name} asks for pytest's fixture {asked[0].arg!r}")


@lru_cache(maxsize=10_000)
def _plan(test, names, prelude):
    tree = ast.parse(test)
    # what runs when named: top-level functions and classes (a class's body runs where it stands)
    functions = {n.name: n for n in tree.body if isinstance(n, (*FUNCTIONS, ast.ClassDef))}
    module_level = [n for n in tree.body if n not in functions.values()] + [
        n for c in functions.values() if isinstance(c, ast.ClassDef)
        for n in (*c.keywords, *c.decorator_list, *c.body) if not isinstance(n, FUNCTIONS)]
    called = {n.id for node in module_level for n in ast.walk(node) if isinstance(n, ast.Name)}
    # HumanEval's check(candidate) is called with the entry point; pytest's test* functions and
    # test classes too, in the file's order (TestCase however it is imported)
    uncalled = [name for name, n in functions.items()
                if isinstance(n, FUNCTIONS) and name not in called]
    calls = [f"check({names[0]})"] if names and "check" in uncalled else []
    units = {a.asname for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names
             if a.name.endswith("TestCase") and a.asname}
    tests = [name for name in uncalled if name.startswith("test") and not _skipped(functions[name])]
    _watches(tree, [functions[name] for name in tests])
    tests += _test_classes(tree.body, units)
    tests.sort(key=lambda t: [*functions].index(t.split(".")[0]))  # the file's order
    if not (calls or tests) and any(map(_skipped, ast.walk(tree))):
        raise ValueError("the test skips every test it has")
    run = [RUN_TESTS, f"run_tests({', '.join(tests)})"] if tests else []
    script = "\n".join([test, *calls, *run])
    # the names the script binds, and those it reads but never binds in any of its scopes
    tables = [top := symtable.symtable(script, "<test>", "exec")]
    for table in tables:  # the list grows as it goes: every scope, however deep
        tables += table.get_children()
    bound = _bound(top)
    free = {s.get_name() for table in tables for s in table.get_symbols()
            if s.is_referenced() and (table is top or s.is_global())} - bound - set(dir(builtins))
    given = _helpers(prelude)
    if set(names) & bound:
        raise ValueError(f"the test defines the entry point {min(set(names) & bound)!r} itself")
    unknown = sorted(free - given - set(names))
    for name in unknown:
        if name in sys.stdlib_module_names:
            raise ValueError(f"the test uses the module {name!r} without importing it")
    if len(unknown) > 1 and not names:
        raise ValueError(f"the test uses {' and '.join(map(repr, unknown))} without importing or "
                         "defining them: name the program's in 'entry_point' (a list, or 'f, g')")
    if unknown and names:
        raise ValueError(f"the test uses {unknown[0]!r}, which it never binds or imports "
                         "(only the entry point is the program's)")
    names = names or tuple(unknown)
    _carriable(tree, names, prelude)
    # the nodes the script runs: its module level (the test's, then the calls added to it) and, each
    # once, the top-level functions it names, called or passed on (check(square) runs check)
    added = [n for n in ast.parse(script).body[len(tree.body):] if not isinstance(n, FUNCTIONS)]
    todo, reached = module_level + added, []
    for statement in todo:  # the list grows as functions are reached
        nodes = [statement]
        for node in nodes:  # its nodes but what is skipped whatever happens
            reached.append(node)
            nodes += [n for n in ast.iter_child_nodes(node) if not _skipped(n)]
            if isinstance(node, ast.Name) and node.id in functions:
                todo.append(functions.pop(node.id))
    if not set(names) & {n.id for n in reached if isinstance(n, ast.Name)}:
        raise ValueError("the test calls no function of the program: "
                         "it would pass a program that defines nothing")
    # an assert, a raise, or unittest's self.assert*() and self.fail()
    asserts = lambda n: getattr(getattr(n, "func", None), "attr", "").startswith(("assert", "fail"))
    if not any(isinstance(n, (ast.Assert, ast.Raise)) or asserts(n) for n in reached):
        raise ValueError("the test asserts nothing")
    return script, names

# -----------------------------------------------------------------------------
# the trainer's side: judge workers, a verdict per job


class Worker:
    """A judge worker process (serve): gets a job and the sandbox's pipes, answers a byte."""

    def __init__(self):
        ours, theirs = socket.socketpair()
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        main = (f"import sys\nsys.path.insert(0, {repo!r})\n"
                f"from rewards import judge\njudge.serve({theirs.fileno()})")
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", main], pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)  # what a test prints (unittest.main's report) is nobody's
        self.socket = ours

    def judge(self, job, process):
        """The verdict on a job whose program runs in `process` -> True | False, or None: the worker
        died, or overran the sandbox's deadline by MARGIN (stop it)."""
        payload = pickle.dumps(dict(job, deadline=process.deadline))
        pipes = [process.stdin.fileno(), process.proc.stdout.fileno()]
        left = lambda: max(process.deadline + MARGIN - time.monotonic(), 0.001)
        try:
            self.socket.settimeout(left())
            socket.send_fds(self.socket, [len(payload).to_bytes(8, "little")], pipes)
            self.socket.sendall(payload)
            self.socket.settimeout(left())
            verdict = self.socket.recv(1)
        except OSError:  # it died, or overran (socket.timeout)
            verdict = b""
        return {b"1": True, b"0": False}.get(verdict)

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.socket.close()


# Workers live while a passes() or a score_many() batch is under way: the last to end stops the
# idle ones, so no process outlives the batch that needed it (the next starts them, ~50 ms each)
_idle, _held, _lock = [], [0], threading.Lock()


def _hold(n):
    """+1: judging starts; -1: it ends, and the last to end stops the idle workers."""
    with _lock:
        _held[0] += n
        stopping = [] if _held[0] else _idle[:]
        _idle[:] = _idle if _held[0] else []
    for worker in stopping:
        worker.stop()


def _judged(job, program, timeout):
    with _lock:
        worker = _idle.pop() if _idle else None
    verdict = False
    try:
        worker = worker or Worker()
        args = [*PYTHON, HARNESS, program, job["prelude"] or ""]
        with Sandboxed(args, timeout) as process:
            verdict = worker.judge(job, process)
    finally:
        if worker and verdict is None:  # it died or overran: a fresh one next time
            worker.stop()
        elif worker:
            with _lock:
                _idle.append(worker)
    return bool(verdict)


def passes(program, tests=(), fn_name=None, test=None, entry_point=None, prelude=None,
           timeout=TIMEOUT):
    """True when the program passes every test: stdin/stdout (a process each, judged here), call-
    or assert-style (one process, judged by a worker; prelude: the prompt's code, run first)."""
    _hold(1)
    try:
        if not tests and not test:
            return False
        if fn_name is None and test is None:  # a process per test, lazily: the first fail ends it
            args = [*PYTHON, STDIN, program]
            return all(r.returncode == 0 and r.stdout.decode(errors="replace").split()
                       == t["output"].split() for t in tests
                       for r in [run(args, t["input"].encode(), timeout)])
        plan = assert_plan(test, entry_point, prelude) if test is not None else (None, (fn_name,))
        job = dict(tests=tests, fn_name=fn_name, script=plan[0], names=plan[1], prelude=prelude)
        return _judged(job, program, timeout)
    except Exception:  # malformed tests, a refused test, no sandbox, ...: a fail
        return False
    finally:
        _hold(-1)


_pool = lru_cache(maxsize=None)(lambda n: ThreadPoolExecutor(n, thread_name_prefix="sandbox"))


def score_many(jobs, workers=WORKERS):
    """[dict(program=..., tests=..., fn_name=... | test=...), ...] -> bools in order (a pool)."""
    jobs = list(jobs)
    left = [len(jobs)]
    if jobs:
        _hold(1)  # the batch keeps its workers until its last job ends

    def one(job):
        try:
            return passes(**job)
        finally:
            with _lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                _hold(-1)
    return _pool(workers).map(one, jobs)
