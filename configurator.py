"""nanoGPT's configurator, strict, for every entry point: config files (plain assignments,
config/*.py) and --key=value override the defaults in order (python train.py
config/scalerl_1gpu.py --lr=1e-6). A key unknown, a value of the wrong type or not allowed: one
line on stderr, exit code 2, no work.
"""

import os
import sys
from ast import literal_eval
from contextlib import contextmanager


def fail(program, message):
    """Bad input or config: one line, exit code 2."""
    print(f"{program}: error: {message}", file=sys.stderr)
    sys.exit(2)


@contextmanager
def failing(program, prefix=""):
    """Bad input the code inside names in a ValueError -> fail(program, prefix + its message)."""
    try:
        yield
    except ValueError as e:
        fail(program, prefix + str(e))


def configure(defaults, args, program, rules=None):
    """defaults {key: value, its type the key's}, args (config files, --key=value: in order),
    rules {key: a tuple of the allowed values, or the smallest allowed number} -> a new dict."""
    config = dict(defaults)
    for arg in args:
        if arg.startswith("--"):
            key, eq, text = arg[2:].partition("=")
            if not eq:
                fail(program, f"{arg}: expected --key=value")
            try:
                value = literal_eval(text)
            except (ValueError, SyntaxError):
                value = text  # a bare string: --out_dir=out-dapo
            items = {key: value}
        elif not os.path.isfile(arg):
            fail(program, f"{arg}: no such config file")
        else:
            exec(open(arg).read(), namespace := {})
            items = {k: v for k, v in namespace.items() if not k.startswith("_")}
        for key, value in items.items():
            if key not in config:
                fail(program, f"{arg}: unknown config key {key!r}; valid keys: {', '.join(config)}")
            wanted = type(config[key])
            value = float(value) if wanted is float and type(value) is int else value  # 1 -> 1.0
            if type(value) is not wanted:
                fail(program, f"{arg}: {key} must be {wanted.__name__}, got {value!r}")
            config[key] = value
    for key, allowed in (rules or {}).items():
        value = config[key]
        if isinstance(allowed, tuple) and value not in allowed:
            fail(program, f"{key}={value!r}: must be one of {', '.join(map(str, allowed))}")
        if not isinstance(allowed, tuple) and value < allowed:
            fail(program, f"{key}={value!r}: must be >= {allowed}"
                 + " (0: no limit)" * (allowed == 0))
    return config
