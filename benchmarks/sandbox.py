"""
Benchmark (not a test): the isolation sandbox.py achieves on this machine, and programs per second through
its pool (a third each stdin/stdout, call-style and assert-style tests; every program correct):

    python benchmarks/sandbox.py
    python benchmarks/sandbox.py --ballast=8    # beside a trainer-sized process: GiB held and written

With --ballast, a numpy array that size is held and written page by page in a thread while the programs run, as
a trainer decodes while its validation's programs are judged; its pages written per second are printed with and
without the programs beside, the figure a fork of the trainer for every program (copy-on-write) slows.
"""

import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import configurator  # noqa: E402
from rewards import judge  # noqa: E402
from rewards import sandbox  # noqa: E402


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


def writing(ballast, done):
    """Pages of `ballast` written per second until done() by one thread (numpy releases the GIL)."""
    pages, started = 0, time.perf_counter()
    while not done():
        ballast[::4096] += 1
        pages += len(ballast) // 4096
    return pages / (time.perf_counter() - started)


if __name__ == "__main__":
    c = configurator.configure(dict(n=120, ballast=0.0), sys.argv[1:], "benchmarks/sandbox.py", dict(n=1))
    n = c["n"]
    for key, value in sandbox.isolation().items():
        print(f"{key:>12}: {value}")
    if c["ballast"]:
        ballast = np.ones(int(c["ballast"] * (1 << 30)), dtype=np.uint8)  # touched: resident
        end = time.perf_counter() + 10
        alone, rate, stop = writing(ballast, lambda: time.perf_counter() > end), [], threading.Event()
        writer = threading.Thread(target=lambda: rate.append(writing(ballast, stop.is_set)))
        writer.start()
        b = bench(n)
        stop.set()
        writer.join()
        print(f"{c['ballast']:g} GiB ballast: {alone:.3g} pages/s written alone, {rate[0]:.3g} beside the "
              f"programs ({rate[0] / alone:.2f}x);\n  the programs: {b['programs_per_s']:.1f}/s beside it")
    b = bench(n)
    print(f"{b['programs']} programs ({b['passed']} passed) in {b['seconds']:.1f} s with {b['workers']} workers: "
          f"{b['programs_per_s']:.1f} programs/s, {b['processes_per_s']:.1f} sandboxed processes/s")
