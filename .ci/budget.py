"""The maintainers' size check, run by .ci/run beside the test command, never inside it: a fork that grows a module
stays green under pytest and meets this check only in our CI.

Counts characters of code (indentation included; comments, a line's trailing comment too, and blank lines free;
docstrings count), so that wrapping a long line costs nothing but its indentation. Three parts, each with a cap of
its own: the recipe (the top level's modules, test_all.py aside), rewards/ (the verifiers, the judge, the sandbox)
and infra/ (the process layer and the speed work). Each module at most MODULE characters; at most LONG_SHARE of
all their lines of code over 100 characters (comments included: a line's length is what a reader wraps) and none
over LONGEST.

    python .ci/budget.py          # prints each module's figures; exits 1 naming what is over
"""
import io
import os
import sys
import tokenize

# characters of code: each cap leaves 5-6% of room over the part's size when the layout was made (the recipe
# 105,340, infra/ 51,684; rewards/ 76,108 with the judges' round of test classes, argv, stdlib values, markup,
# list numbering and answer words of nine languages), so that a fork's first additions fit. infra/ grew by one
# concept since, LoRA (infra/lora.py and its places in policy, checkpoint and memory): 62,523, capped at 66,300.
# The recipe grew by what a fit can know (fit_curve.py's calibrated interval, regime gate and every domain's
# curve; log.py's validation figures for the gate): 122,141, capped at 126,000 (train.py's 26k is next to shrink).
# The loop on one screen moved the run control (stop signals, budget, checkpoints, the data-parallel agreement)
# from train.py into infra/control.py: train.py 26.5k -> 18.1k, infra/ 62.6k -> 70.4k, capped at 74,000; the
# recipe, its makers in build.py and sample.make, loss.collate and log.resume: 121.8k -> 123.8k, capped at 130,000
# The judges' fifth round (linear-time passes, answer tags, comparatives; the program's objects as they are,
# the prompt's types as values, pytest's and unittest's collection): rewards/ 76,108 -> 83,202, capped at 87,600
PARTS = {".": 130_000, "rewards": 87_600, "infra": 74_000}
MODULE = 31_000   # characters of code in one module (rewards/judge.py is the largest)
LONGEST = 110     # characters in one line of code (wrap at ~100, as nanoGPT does)
LONG_SHARE = 0.05  # of all the parts' lines of code over 100 characters (nanoGPT 3.8%, nanochat 5.5%)
SKIP = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
        tokenize.ENDMARKER)


def code_lines(text):
    """The lines of a module that hold code, whole: docstrings count; comments and blank lines do not."""
    lines = text.splitlines()
    used = {n for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type not in SKIP
            for n in range(t.start[0], t.end[0] + 1)}
    return [lines[n - 1] for n in sorted(used) if n <= len(lines) and lines[n - 1].strip()]


def code_characters(text):
    """Characters of code: code_lines' without a trailing comment (nor the spaces before it)."""
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    comment_at = {t.start[0]: t.start[1] for t in tokens if t.type == tokenize.COMMENT}
    lines = text.splitlines()
    used = {n for t in tokens if t.type not in SKIP for n in range(t.start[0], t.end[0] + 1)}
    return sum(len(lines[n - 1][:comment_at.get(n)].rstrip()) for n in used
               if n <= len(lines) and lines[n - 1].strip())


def check(repo, folder, cap):
    """One part's figures printed -> the lines naming what is over."""
    directory = os.path.join(repo, folder)
    modules = sorted(f for f in os.listdir(directory) if f.endswith(".py") and f != "test_all.py")
    over, total, lines_in_all, long_in_all = [], 0, 0, 0
    for name in modules:
        path = os.path.normpath(os.path.join(folder, name))
        text = open(os.path.join(directory, name), encoding="utf-8").read()
        lines, chars = code_lines(text), code_characters(text)
        long = [line for line in lines if len(line) > 100]
        longest = [line for line in lines if len(line) > LONGEST]
        total, lines_in_all, long_in_all = total + chars, lines_in_all + len(lines), long_in_all + len(long)
        print(f"{path:<22}{len(lines):>7}{chars:>9}{len(long):>6}{len(longest):>6}")
        if chars > MODULE:
            over.append(f"{path}: {chars} characters of code, over {MODULE}: split it by concept")
        if longest:
            over.append(f"{path}: {len(longest)} lines over {LONGEST} characters, e.g. {longest[0].strip()[:60]!r}")
    part = "the recipe (top level)" if folder == "." else folder + "/"
    print(f"{part:<22}{lines_in_all:>7}{total:>9}{long_in_all:>6}  (cap {cap}: {1 - total / cap:.1%} room)\n")
    if total > cap:
        over.append(f"{part}: {total} characters of code, over {cap}")
    return over, lines_in_all, long_in_all


if __name__ == "__main__":
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    print(f"{'module':<22}{'lines':>7}{'chars':>9}{'>100':>6}{'>110':>6}")
    over, lines_in_all, long_in_all = [], 0, 0
    for folder, cap in PARTS.items():
        more, lines, long = check(repo, folder, cap)
        over, lines_in_all, long_in_all = over + more, lines_in_all + lines, long_in_all + long
    print(f"{'all':<22}{lines_in_all:>7}{'':>9}{long_in_all:>6}  ({long_in_all / lines_in_all:.1%} over 100)")
    if long_in_all > LONG_SHARE * lines_in_all:
        over.append(f"{long_in_all / lines_in_all:.1%} of the lines of code over 100 characters, "
                    f"over {LONG_SHARE:.0%}: wrap them")
    for line in over:
        print(f".ci/budget.py: {line}", file=sys.stderr)
    sys.exit(1 if over else 0)
