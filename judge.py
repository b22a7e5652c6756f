"""The verdict of a model-written program against its tests, run in sandbox.py: the code reward.
Calls and asserts run here, on literals from HARNESS: nothing the program holds or prints can forge a pass."""
import ast
import builtins
import json
import symtable
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from functools import lru_cache

from sandbox import TIMEOUT, WORKERS, Sandboxed, run


# the program reads and writes nothing: the pipes are the harness's
HARNESS = r"""
import os, sys
requests, replies, null = os.fdopen(os.dup(0), "rb"), os.dup(1), os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0), os.dup2(null, 1), os.dup2(null, 2)
literals = {"__builtins__": {}, "set": set, "frozenset": frozenset, "inf": float("inf"), "nan": float("nan")}
objects = [{"__name__": "solution"}]  # handle 0: the program's namespace; then every value handed out
exec(compile(sys.argv[1], "solution.py", "exec"), objects[0])
for line in requests:  # ("get", handle, name) or ("call", handle, args, kwargs)
    kind, handle, arg, *kwargs = eval(line, literals)
    try:
        objects.append(value := objects[handle](*arg, **kwargs[0]) if kind == "call" else
                       objects[0][arg] if handle == 0 else getattr(objects[handle], arg))
        reply = f"{len(objects) - 1} {int(callable(value))} {ascii(value)}"
    except Exception as e:
        reply = f"raised {type(e).__name__}"
    os.write(replies, (reply + "\n").encode())
"""
ENDS_ITERATION = (StopIteration, StopAsyncIteration)


def _value(process, request):
    """The program's value via HARNESS: data as itself, else a function or a Handle that reaches it there."""
    if process.pump(ascii(request).encode() + b"\n", line=True) or b"\n" not in process.stdout:
        raise ChildProcessError("the program's process died or did not answer in time")
    reply, _, process.stdout[:] = process.stdout.partition(b"\n")
    handle, is_callable, text = (reply.decode() + "  ").split(" ", 2)
    if handle == "raised":  # is_callable: the name of what it raised, raised here (a builtin Exception)
        error = getattr(builtins, is_callable, None)
        # a StopIteration would end the test's map() or generator early, as if all had passed
        if isinstance(error, type) and issubclass(error, Exception) and not issubclass(error, ENDS_ITERATION):
            raise error()
        raise RuntimeError(f"the program raised {is_callable}")
    if is_callable == "1":
        return lambda *args, **kwargs: _value(process, ("call", int(handle), args, kwargs))
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        fetch = lambda _, name: _value(process, ("get", int(handle), name))
        return type("Handle", (), {"__getattr__": fetch})()


def as_json(value):  # what JSON makes of a value (tuples -> lists, sets -> sorted lists, int keys -> str)
    return json.loads(json.dumps(value, default=sorted))


def passes(program, tests=(), fn_name=None, test=None, entry_point=None, timeout=TIMEOUT):
    """True when the program passes every test: stdin/stdout (a process each), call- or assert-style."""
    try:
        if not tests and not test:
            return False
        if fn_name is None and test is None:  # a process per test, lazily: the first fail ends it
            return all(r.returncode == 0 and r.stdout.decode(errors="replace").split() == t["output"].split()
                       for t in tests for r in [run(["-c", program], t["input"].encode(), timeout)])
        script, names = assert_plan(test, entry_point) if test is not None else (None, ())
        with Sandboxed(["-c", HARNESS, program], timeout) as process:
            if fn_name is not None:
                function = _value(process, ("get", 0, fn_name))
                return all(as_json(function(*t["input"])) == as_json(t["output"]) for t in tests)
            namespace = {}
            for name in names:
                with suppress(KeyError):  # not the program's: the test fails on it
                    namespace[name] = _value(process, ("get", 0, name))
            exec(compile(script, "<test>", "exec", optimize=0), namespace)  # asserts run under python -O too
            return True
    except Exception:  # malformed tests, values that are not literals, a process that died, ...: a fail
        return False


# a test may mean these without importing them
STDLIB_NAMES = {n for m in ("collections", "fractions", "decimal", "functools") for n in dir(__import__(m))
                if not n.startswith("_")} | {"isclose", "inf", "nan", "pi", "sqrt"}


@lru_cache(maxsize=10_000)
def assert_plan(test, entry_point=None):
    """-> (the script an assert-style test runs, the names the program supplies), or a one-line ValueError."""
    if entry_point is not None and not (isinstance(entry_point, str) and entry_point.isidentifier()):
        raise ValueError(f"entry_point must be a Python identifier, got {entry_point!r}")
    tree = ast.parse(test)
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    module_level = [n for n in tree.body if n not in functions.values()]
    called = {n.id for node in module_level for n in ast.walk(node) if isinstance(n, ast.Name)}
    # HumanEval's check(candidate) is called with the entry point, pytest's test_* functions are called
    uncalled = [name for name in functions if name not in called]
    calls = [f"check({entry_point})"] if entry_point and "check" in uncalled else []
    script = "\n".join([test, *calls, *(f"{name}()" for name in uncalled if name.startswith("test_"))])
    # the names the script binds, and those it reads but never binds in any of its scopes, builtins aside
    tables = [top := symtable.symtable(script, "<test>", "exec")]
    for table in tables:  # the list grows as it goes: every scope, however deep
        tables += table.get_children()
    bound = {s.get_name() for s in top.get_symbols()
             if s.is_assigned() or s.is_imported() or s.is_namespace()}
    free = {s.get_name() for table in tables for s in table.get_symbols()
            if s.is_referenced() and (table is top or s.is_global())} - bound - set(dir(builtins))
    if entry_point in bound:
        raise ValueError(f"the test defines the entry point {entry_point!r} itself")
    for name in sorted(free - {entry_point}):
        if name in sys.stdlib_module_names:
            raise ValueError(f"the test uses the module {name!r} without importing it")
        if entry_point is not None:
            raise ValueError(f"the test uses {name!r}, which it never binds "
                             "(only the entry point is the program's)")
        if name in STDLIB_NAMES:
            raise ValueError(f"the test uses {name!r} without importing it "
                             "(or name the program's in entry_point)")
    # the program supplies the entry point alone, or (none given) every name the test reads and never binds
    names = {entry_point} if entry_point else free
    # the nodes the script runs: its module level (the test's, then the calls added to it) and, each once, the
    # top-level functions it names, called or passed on (check(square) runs check), transitively
    todo, reached = module_level + ast.parse(script).body[len(tree.body):], []
    for statement in todo:  # the list grows as functions are reached
        for node in ast.walk(statement):
            reached.append(node)
            if isinstance(node, ast.Name) and node.id in functions:
                todo.append(functions.pop(node.id))
    if not names & {n.id for n in reached if isinstance(n, ast.Name)}:
        raise ValueError("the test calls no function of the program: "
                         "it would pass a program that defines nothing")
    if not any(isinstance(n, (ast.Assert, ast.Raise)) for n in reached):
        raise ValueError("the test asserts nothing")
    return script, tuple(sorted(names))


_pool = lru_cache(maxsize=None)(lambda workers: ThreadPoolExecutor(workers, thread_name_prefix="sandbox"))


def score_many(jobs, workers=WORKERS):
    """[dict(program=..., tests=..., fn_name=... | test=...), ...] -> bools in order, from a pool."""
    return _pool(workers).map(lambda job: passes(**job), jobs)
