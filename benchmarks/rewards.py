"""
Benchmark (not a test): what scoring a batch of math completions costs, as train.py scores one (rewards.score),
in the main thread and in a worker thread, for 256 adversarial answers (towers of powers, huge powers, deep
nesting, long hedges, unevaluated arithmetic) and 256 honest ones, each against numeric and symbolic gold;
the seconds a call takes on degenerate completions (a long run of one character beside what the grammar looks
for, as a collapsing policy writes) at 10k, 20k and 40k characters, where linear time reads as 40k about twice
20k. Then what a judge call costs the trainer (time, its peak memory) for the worst replies a program
can give: colliding hashes, a 1 MiB literal, deep nesting (judge.py decodes them in a worker):

    python benchmarks/rewards.py      # a line per batch, run and worst reply, then a JSON line of all
"""

import json
import os
import re
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from rewards import judge  # noqa: E402
import rewards  # noqa: E402
from data import Prompt  # noqa: E402

ADVERSARIAL = ["\\boxed{9**9**9**9}", "\\boxed{10^{10^{10^{10}}}}", "\\boxed{2**(2**64)}",
               "\\boxed{" + "(" * 2000 + "1" + ")" * 2000 + "}", "The answer is " + " or ".join(map(str, range(101))),
               "\\boxed{1000!}", "\\boxed{2^{1000}}", "$" + "+".join(["x"] * 150) + "$", "12 / 2 =", "\\frac{12}{2}",
               "\\boxed{" + "\\sqrt{" * 30 + "2" + "}" * 30 + "}", "$(x+1)^{99} - (x-1)^{99}$", "9^9^9^9"]
HONEST = [("72", "The answer is 72."), ("72", "\\boxed{72}"), ("72", "So she sold 48 + 24 = 72 clips."),
          ("72", "#### 72"), ("\\frac{\\sqrt{3}}{2}", "$\\frac{\\sqrt{3}}{2}$"), ("2\\sqrt{3}", "\\boxed{\\sqrt{12}}"),
          ("(0, 1]", "The answer is $(0, 1]$."), ("\\frac{1}{2}", "\\boxed{0.5}")]

# degenerate completions: n characters of a run beside what the grammar looks for. Before round five of the
# judges all but the last two grew with the square of their length (the spaces: 5 s a call at 10k characters,
# 33 s at 20k)
SYMBOLIC = "\\frac{\\sqrt{3}}{2}"
RUNS = {
    "spaces before a list's number": ("42", lambda n: " " * n + "42"),
    "a $ run before a math span": (SYMBOLIC, lambda n: "$" * n + "42"),
    "\\( openers never closed": (SYMBOLIC, lambda n: "\\(" * (n // 2)),
    "spaces between ^ and a power": ("42", lambda n: "2^" + " " * n + "{2}"),
    "digit groups, the last too long": ("42", lambda n: "1" + ",000" * (n // 4) + "0"),
    "spaces after \\color": ("42", lambda n: "\\color" + " " * n + "42"),
    "a long number, symbolic gold": (SYMBOLIC, lambda n: "1" * n),
    "scale words after a number": ("42", lambda n: "5" + " million" * (n // 8)),
    "\\textbf{ never closed": ("42", lambda n: "\\textbf{" * (n // 8)),
    "sign words before a number": ("42", lambda n: "minus " * (n // 6) + "5"),
}


def batch(cases, n=256):
    """n (prompt, completion) pairs from (gold, answer) cases in turn."""
    return [(Prompt(f"x:{i}", "", [], gold, domain="math"), answer) for i, (gold, answer) in
            zip(range(n), cases * n)]


# the replies that held the trainer before judge.py decoded them in a worker (39-112 s, ~490 MiB):
# the program's values, and bytes it writes on the harness's reply descriptor (answering "get f")
FORGED = ("import os\nfor fd in range(3, 10):\n    try:\n        os.write(fd, {})\n"
          "    except OSError:\n        pass\ndef f():\n    return 1\n")
COLLIDING = ("""b'["value", {"set": [' + b", ".join(b'{"int": "%s"}' % """
             """hex(k * (2 ** 61 - 1)).encode() for k in range(40000)) + b']}, []]\\n'""")
WORST_REPLIES = {
    "colliding-hash set": "class H(int):\n    __hash__ = lambda self: id(self)\n"
                          "def f():\n    return {H(k * (2 ** 61 - 1)) for k in range(50000)}",
    "colliding-hash set, forged": FORGED.format(COLLIDING),
    "1 MiB literal": "def f():\n    return [[1]] * 209000",  # just under the cap: decoded whole
    "1 MiB literal, forged":
        FORGED.format("""b'["value", [' + b"[1], " * 209000 + b'1], []]\\n'"""),
    "deep nesting":
        "def f():\n    x = 0\n    for _ in range(100000):\n        x = [x]\n    return x",
    "deep nesting, forged": FORGED.format('b"[" * (1 << 20) + b"\\n"'),
}


def peak_rss_reset():
    """Linux: this process's peak resident memory (VmHWM) reset -> a function: the peak since."""
    open("/proc/self/clear_refs", "w").write("5")
    return lambda: int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) * 1024


def judge_call(program, n=3):
    """-> (seconds a judge call, the trainer's peak memory growth in MiB) over n calls."""
    test = "try:\n    x = len(f())\nexcept Exception:\n    x = -1\nassert x > 0"
    peak = peak_rss_reset()
    before, start = peak(), time.perf_counter()
    for _ in range(n):
        judge.passes(program, test=test)
    return (time.perf_counter() - start) / n, (peak() - before) / 2 ** 20


def seconds_a_call(gold, text, n=5):
    """The fastest of n calls of rewards.math_reward (the others shared the machine)."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        rewards.math_reward(gold, text)
        times.append(time.perf_counter() - start)
    return min(times)


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
    for name, (gold, run) in RUNS.items():
        seconds = [seconds_a_call(gold, run(n)) for n in (10_000, 20_000, 40_000)]
        figures["run_" + "_".join(re.findall(r"\w+", name))] = [round(s, 4) for s in seconds]
        print(f"{name:>31}: " + ", ".join(f"{k} {s:.4f} s" for k, s in zip(("10k", "20k", "40k"), seconds))
              + f" a call (40k/20k {seconds[2] / seconds[1]:.1f})")
    judge.passes("def f():\n    return 1", test="assert f() == 1")  # the sandbox's probe, not timed
    for name, program in WORST_REPLIES.items():
        seconds, grown = judge_call(program)
        key = "judge_" + name.replace(",", "").replace(" ", "_")
        figures[key] = dict(seconds=round(seconds, 3), trainer_mib=round(grown, 1))
        print(f"{name:>27}: {seconds:6.3f} s a judge call, trainer's peak memory +{grown:.1f} MiB")
    print(json.dumps(figures))
