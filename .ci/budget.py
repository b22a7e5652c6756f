"""The maintainers' size check (issue 43), run by .ci/run beside the test command, never inside it: a fork
that grows a module stays green under `pytest test_all.py` and meets this check only in our CI.

Counts characters of code (indentation included; comments, a line's trailing comment too, and blank lines
free; docstrings count), so that wrapping a long line costs nothing but its indentation: each top-level module
at most MODULE characters, all of them (the core, test_all.py aside) at most CORE, at most LONG_SHARE of the
core's lines of code over 100 characters (comments included: a line's length is what a reader wraps) and none
over LONGEST.

    python .ci/budget.py          # prints each module's figures; exits 1 naming what is over
"""
import io
import os
import sys
import tokenize

MODULE = 31_000   # characters of code in one top-level module (issue 43 asks ~30,000: judge.py is 30,616)
CORE = 223_000    # ... in all of them together. Issue 43's ~200,000 was its day's ~190,500 by the old count
                  # (a trailing comment counted as code; by this count 173,251 then), plus room for forks.
                  # The judges of issue 40, the fault table of 44 and the extension points of 43 took it to
                  # 228,504; behaviour-preserving trims of every module but sandbox.py to 221,835 (2026-12-03)
LONGEST = 110     # characters in one line of code (wrap at ~100, as nanoGPT does)
LONG_SHARE = 0.05  # of the core's lines of code over 100 characters (nanoGPT 3.8%, nanochat 5.5%)
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


if __name__ == "__main__":
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    modules = sorted(f for f in os.listdir(repo) if f.endswith(".py") and f != "test_all.py")
    over, total, lines_in_all, long_in_all = [], 0, 0, 0
    print(f"{'module':<18}{'lines':>7}{'chars':>9}{'>100':>6}{'>110':>6}")
    for name in modules:
        text = open(os.path.join(repo, name), encoding="utf-8").read()
        lines, chars = code_lines(text), code_characters(text)
        long = [n for n, line in enumerate(lines) if len(line) > 100]
        longest = [line for line in lines if len(line) > LONGEST]
        total, lines_in_all, long_in_all = total + chars, lines_in_all + len(lines), long_in_all + len(long)
        print(f"{name:<18}{len(lines):>7}{chars:>9}{len(long):>6}{len(longest):>6}")
        if chars > MODULE:
            over.append(f"{name}: {chars} characters of code, over {MODULE}: split it by concept")
        if longest:
            over.append(f"{name}: {len(longest)} lines over {LONGEST} characters, e.g. {longest[0].strip()[:60]!r}")
    print(f"{'core':<18}{lines_in_all:>7}{total:>9}{long_in_all:>6}  ({long_in_all / lines_in_all:.1%} over 100)")
    if total > CORE:
        over.append(f"the core: {total} characters of code, over {CORE}")
    if long_in_all > LONG_SHARE * lines_in_all:
        over.append(f"the core: {long_in_all / lines_in_all:.1%} of its lines of code over 100 characters, "
                    f"over {LONG_SHARE:.0%}: wrap them")
    for line in over:
        print(f".ci/budget.py: {line}", file=sys.stderr)
    sys.exit(1 if over else 0)
