"""The codebase: one-way data flow in train.py, and no `global` in the top-level modules.

Run alone: `python -m pytest tests/test_codebase.py`."""

import os

# tests.helpers first: importing it sets torch to one thread (it says why)
from tests.helpers import REPO


# =============================================================================
# the codebase


def test_no_global_and_no_function_reads_a_name_bound_only_in_main():
    """One-way data flow: every function of train.py gets its runtime objects as arguments."""
    import ast
    tree = ast.parse(open(os.path.join(REPO, "train.py")).read())
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    module_names = {t.id for n in tree.body if n is not main for t in ast.walk(n) if isinstance(t, ast.Name)
                    and isinstance(t.ctx, ast.Store)} | {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    module_names |= {a.asname or a.name.split(".")[0] for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
                     for a in n.names}
    main_only = {t.id for t in ast.walk(main) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)} - module_names
    for function in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        local = {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)} | \
                {t.id for t in ast.walk(function) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
        read = {t.id for t in ast.walk(function) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Load)}
        assert not (read - local) & main_only, (function.name, (read - local) & main_only)
    for f in (f for f in os.listdir(REPO) if f.endswith(".py") and f != "test_all.py"):
        assert not any(isinstance(n, ast.Global) for n in ast.walk(ast.parse(open(os.path.join(REPO, f)).read()))), f
