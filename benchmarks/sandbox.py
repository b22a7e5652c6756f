"""
Benchmark (not a test): the isolation sandbox.py achieves on this machine, and programs per second through
its pool (a third each stdin/stdout, call-style and assert-style tests; every program correct):

    python benchmarks/sandbox.py
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import configurator  # noqa: E402
import judge  # noqa: E402
import sandbox  # noqa: E402


def bench(n=120):
    """Programs per second through the pool: a third each stdin/stdout (2 tests: 2 processes), call
    style and assert style (1 process each); every program is correct."""
    jobs = []
    for i in range(n):
        if i % 3 == 0:
            jobs.append(dict(program="a, b = map(int, input().split())\nprint(a + b)",
                             tests=[dict(input=f"{i} 2", output=f"{i + 2}"), dict(input="5 6", output="11")]))
        elif i % 3 == 1:
            jobs.append(dict(program="def add(a, b):\n    return a + b", fn_name="add",
                             tests=[dict(input=[i, 2], output=i + 2), dict(input=[5, 6], output=11)]))
        else:
            jobs.append(dict(program="def add(a, b):\n    return a + b", test=f"assert add({i}, 2) > {i}"))
    sandbox.isolation()  # measured outside the timing
    started = time.perf_counter()
    passed = list(judge.score_many(jobs))
    seconds = time.perf_counter() - started
    return dict(programs=n, passed=sum(passed), seconds=seconds, programs_per_s=n / seconds,
                processes_per_s=n * 4 / 3 / seconds, workers=sandbox.WORKERS)


if __name__ == "__main__":
    n = configurator.configure(dict(n=120), sys.argv[1:], "benchmarks/sandbox.py", dict(n=1))["n"]
    for key, value in sandbox.isolation().items():
        print(f"{key:>12}: {value}")
    b = bench(n)
    print(f"{b['programs']} programs ({b['passed']} passed) in {b['seconds']:.1f} s with {b['workers']} workers: "
          f"{b['programs_per_s']:.1f} programs/s, {b['processes_per_s']:.1f} sandboxed processes/s")
