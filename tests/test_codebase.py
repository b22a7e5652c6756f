"""The codebase: the import order of the concepts (no arrow runs back up, no hidden cycle), one-way data flow in
train.py, and no `global` anywhere in the core.

Run alone: `python -m pytest tests/test_codebase.py`."""

import ast
import os

# tests.helpers first: importing it sets torch to one thread (it says why)
from tests.helpers import REPO


# =============================================================================
# the codebase


def test_no_global_and_no_function_reads_a_name_bound_only_in_main():
    """One-way data flow: every function of train.py gets its runtime objects as arguments."""
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
    for name, path in core_modules().items():
        assert not any(isinstance(n, ast.Global) for n in ast.walk(ast.parse(open(path).read()))), name


def test_no_function_of_train_py_or_build_py_reads_a_knob_it_was_not_handed():
    """Config in plain sight: the knobs are train.py's module constants (a config file and --key=value override
    them), and every function is handed them (cfg); only current_config reads them, from globals()."""
    import train
    for name in ("train.py", "build.py"):
        tree = ast.parse(open(os.path.join(REPO, name)).read())
        functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        for function in functions:
            local = {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)} | \
                    {t.id for t in ast.walk(function) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
            read = {t.id for t in ast.walk(function) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Load)}
            assert not (read - local) & set(train.config_keys), (name, function.name, (read - local) & set(train.config_keys))
    assert {"train_step", "train_loop", "evaluate", "current_config"} <= {f.name for f in ast.parse(
        open(os.path.join(REPO, "train.py")).read()).body if isinstance(f, ast.FunctionDef)}


# The reading order of the concepts, bottom up: a module imports only modules before it (its lazy imports too),
# so no arrow runs back up and no cycle hides. The folders' modules by their dotted names; a forker's new module
# (not listed) only may not close a cycle.
# infra/ sits beneath the recipe: the recipe may import it, it never imports the recipe (what it needs from the
# recipe is passed in, and its errors are worded by the caller).
INFRA = ["infra.speed", "infra.distributed", "infra.lora", "infra.policy", "infra.checkpoint", "infra.memory",
         "infra.control"]
ORDER = INFRA + ["configurator", "fit_curve", "head", "loss", "scheduler", "rewards.codec", "rewards.harness",
                 "rewards.sandbox", "rewards.judge", "rewards", "data", "sample", "build", "log", "train"]


def core_modules():
    """{dotted name: path} of the top level's modules (test_all.py aside), rewards/'s and infra/'s."""
    found = {}
    for folder in ("", "rewards", "infra"):
        for f in sorted(os.listdir(os.path.join(REPO, folder))):
            if f.endswith(".py") and f != "test_all.py":
                name = folder if f == "__init__.py" else ".".join(filter(None, (folder, f[:-3])))
                found[name] = os.path.join(REPO, folder, f)
    return found


def core_imports(path, modules):
    """The core modules a file imports, anywhere in it (dotted names; a package's relative imports resolved)."""
    package = os.path.relpath(os.path.dirname(path), REPO).replace(os.sep, ".").strip(".")
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(filter(None, (package, node.module))) if node.level else node.module or ""
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
    return {m for m in found if m in modules}


def test_each_module_imports_only_the_modules_before_it_in_the_reading_order_lazy_imports_included():
    modules = core_modules()
    assert set(ORDER) <= set(modules), set(ORDER) - set(modules)
    imports = {name: core_imports(path, modules) for name, path in modules.items()}
    for name in ORDER:
        assert imports[name] <= set(ORDER[:ORDER.index(name)]), (name, imports[name] - set(ORDER[:ORDER.index(name)]))
    assert imports["data"] == {"configurator", "rewards"}  # the recipe's data reads the kinds, never the sandbox
    for name in INFRA + ["infra"]:  # no file under infra/ imports a top-level module or the rewards
        assert imports[name] <= set(INFRA), (name, imports[name] - set(INFRA))
    order = []  # every module, listed or not, after everything it imports: exists exactly when there is no cycle
    while len(order) < len(modules):
        ready = sorted(m for m in set(modules) - set(order) if imports[m] <= set(order))
        assert ready, {m: imports[m] - set(order) for m in set(modules) - set(order)}  # the cycle's modules
        order += ready


def test_a_script_a_module_runs_imports_only_what_comes_before_that_module():
    """data/builtin/prepare.py is run by train.py (importlib, and as a subprocess): an import of train, or of
    anything after it, would be a cycle no import graph shows. Every data/*/prepare.py stays below train."""
    modules = core_modules()
    run = {}  # script path -> the core modules that run it
    for name, path in modules.items():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "/" in node.value \
                    and node.value.endswith(".py") and os.path.isfile(os.path.join(REPO, node.value)):
                run.setdefault(os.path.join(REPO, node.value), set()).add(name)
    assert os.path.join(REPO, "data", "builtin", "prepare.py") in run  # the case this test exists for
    for script in glob_scripts():
        run.setdefault(script, {"train"})
    for script, runners in run.items():
        before = set(ORDER[:min(ORDER.index(r) for r in runners if r in ORDER)])
        assert core_imports(script, modules) <= before, (script, core_imports(script, modules) - before)


def glob_scripts():
    return [os.path.join(REPO, "data", d, "prepare.py") for d in sorted(os.listdir(os.path.join(REPO, "data")))
            if os.path.isfile(os.path.join(REPO, "data", d, "prepare.py"))]
