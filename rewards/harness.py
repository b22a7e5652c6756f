"""The program's side of judge.py's conversation, in the sandbox: it reads the judge's requests and
writes replies, nothing else. sys.argv: [-c, the program, the prompt's code], then the program's own
(["solution.py"], as `python solution.py` gives it).

Never imported: judge.py reads this file as text and runs it as `python -c` after codec.py's text
and judge.EXITS, all one namespace (the sandbox has no files but the interpreter's): codec.py's
names are this file's own there. The import of them below is a reader's and a linter's only.
"""
import builtins
import json
import os
import sys
from collections.abc import Iterator

if __name__ != "__main__":  # a reader's view (python -c runs as __main__, after codec.py's text)
    from .codec import REPLY_CAP, bases, decode, encode

BUILTINS = dict(vars(builtins))  # as they are before the program runs; codec.py's encode reads it
dumps, loads = json.dumps, json.loads
objects, handles = [{"__name__": "solution"}], {}  # 0: its namespace; then each object handed out


def refer(value):  # a program's object that is not data: the handle the judge names it by
    if id(value) not in handles:
        handles[id(value)] = len(objects)
        objects.append(value)
    kind = "function" if callable(value) else "object"
    return {"iterator" if isinstance(value, Iterator) else kind: handles[id(value)]}


def resolve(tag, payload):  # a builtin, an object handed out, or a callable of the test's
    if tag == "builtin":
        return BUILTINS[payload]
    if tag == "ref":
        return objects[payload]
    if tag == "callback":
        return lambda *args, **kwargs: callback(payload, args, kwargs)
    raise ValueError(tag)


def send(message):
    text = dumps(message)
    if len(text) > REPLY_CAP:
        text = dumps(["fail", f"a reply of {len(text)} characters, over {REPLY_CAP}"])
    data = (text + "\n").encode()
    while data:
        data = data[os.write(replies, data):]


def carried(arguments, room):  # a call's arguments, [(position or name, value)], as data
    return [[key, encode(value, refer, [room])] for key, value in arguments]


def callback(number, args, kwargs):  # the program calls a callable of the test's: the judge runs it
    send(["callback", number, carried(enumerate(args), REPLY_CAP),
          carried(kwargs.items(), REPLY_CAP)])
    kind, payload = serve()
    if kind == "return":
        return decode(payload[0], resolve)
    raise next((e for e in map(BUILTINS.get, payload[0])
                if isinstance(e, type) and issubclass(e, BaseException)), RuntimeError)()


def answer(kind, handle, *request):
    try:
        target, arguments, before = objects[handle], [], []
        if kind == "get":
            value = target[request[0]] if handle == 0 else getattr(target, request[0])
        elif kind == "next":
            try:
                value = next(target)
            except StopIteration:
                return ["stop"]
        else:
            arguments = [(k, decode(v, resolve)) for k, v in (*request[0], *request[1])]
            before = carried(arguments, 1 << 40)
            value = target(*[v for k, v in arguments if type(k) is int],
                           **{k: v for k, v in arguments if type(k) is str})
    except BaseException as error:  # the program's: the judge raises its nearest builtin base
        names = bases(error)
        try:
            args = encode(list(error.args), refer, [REPLY_CAP // 2])
        except Exception:
            args = []
        return ["raised", names, args]
    try:  # the arguments it changed in place go back too
        changed = [new for new, old in zip(carried(arguments, 1 << 40), before) if new != old]
        return ["value", encode(value, refer, [REPLY_CAP]), changed]
    except BaseException as error:
        return ["fail", f"its value cannot be carried ({type(error).__name__})"]


def serve():  # answers the judge until it answers a callback of ours: -> (kind, payload)
    for line in requests:
        kind, *rest = loads(line)
        if kind in ("return", "raise"):
            return kind, rest
        send(answer(kind, *rest))
    os._exit(0)


if __name__ == "__main__":  # in the sandbox
    requests, replies = os.fdopen(os.dup(0), "rb"), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0), os.dup2(null, 1), os.dup2(null, 2)
    (_, program, prompt), sys.argv[:] = sys.argv, ["solution.py"]
    exec(compile(prompt, "prompt.py", "exec"), objects[0])  # the prompt's code (HumanEval's)
    exec(compile(program, "solution.py", "exec"), objects[0])
    if isinstance(cls := objects[0].get("Solution"), type):  # LeetCode's: its methods, entry points
        objects[0] = {k: getattr(o, k) for o in [cls()] for k in dir(o) if k[0] != "_"} | objects[0]
    serve()
