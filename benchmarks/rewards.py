"""
Benchmark (not a test): what scoring a batch of math completions costs, as train.py scores one (rewards.score),
in the main thread and in a worker thread, for 256 adversarial answers (towers of powers, huge powers, deep
nesting, long hedges, unevaluated arithmetic) and 256 honest ones, each against numeric and symbolic gold:

    python benchmarks/rewards.py      # one line per batch, then one JSON line of every figure
"""

import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rewards  # noqa: E402
from data import Prompt  # noqa: E402

ADVERSARIAL = ["\\boxed{9**9**9**9}", "\\boxed{10^{10^{10^{10}}}}", "\\boxed{2**(2**64)}",
               "\\boxed{" + "(" * 2000 + "1" + ")" * 2000 + "}", "The answer is " + " or ".join(map(str, range(101))),
               "\\boxed{1000!}", "\\boxed{2^{1000}}", "$" + "+".join(["x"] * 150) + "$", "12 / 2 =", "\\frac{12}{2}",
               "\\boxed{" + "\\sqrt{" * 30 + "2" + "}" * 30 + "}", "$(x+1)^{99} - (x-1)^{99}$", "9^9^9^9"]
HONEST = [("72", "The answer is 72."), ("72", "\\boxed{72}"), ("72", "So she sold 48 + 24 = 72 clips."),
          ("72", "#### 72"), ("\\frac{\\sqrt{3}}{2}", "$\\frac{\\sqrt{3}}{2}$"), ("2\\sqrt{3}", "\\boxed{\\sqrt{12}}"),
          ("(0, 1]", "The answer is $(0, 1]$."), ("\\frac{1}{2}", "\\boxed{0.5}")]


def batch(cases, n=256):
    """n (prompt, completion) pairs from (gold, answer) cases in turn."""
    return [(Prompt(f"x:{i}", "", [], gold, domain="math"), answer) for i, (gold, answer) in
            zip(range(n), cases * n)]


def timed(pairs, in_thread):
    out, start = [], time.perf_counter()
    if in_thread:
        thread = threading.Thread(target=lambda: out.extend(rewards.score(pairs)))
        thread.start()
        thread.join()
    else:
        out.extend(rewards.score(pairs))
    return time.perf_counter() - start, sum(r > 0 for r in out)


if __name__ == "__main__":
    rewards.score(batch(HONEST, 8))  # the math-verify workers start (their imports are not a batch's time)
    rewards.verified = rewards.verified.__wrapped__  # no cache: every answer is verified, as if all were distinct
    adversarial = [(gold, answer) for answer in ADVERSARIAL for gold in ("72", "2\\sqrt{3}")]
    figures = {}
    for name, answers in (("adversarial", adversarial), ("honest", HONEST)):
        for where in ("main", "thread"):
            seconds, paid = timed(batch(answers), where == "thread")
            figures[f"{name}_{where}_s"] = round(seconds, 2)
            print(f"{name:>11} x 256, {where} thread: {seconds:6.2f} s, {paid} paid")
    print(json.dumps(figures))
