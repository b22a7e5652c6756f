"""The program's side of judge.py's conversation, in the sandbox: it reads the judge's requests and
writes replies, nothing else. sys.argv: [-c, the program, the prompt's code], then the program's own
(["solution.py"], as `python solution.py` gives it).

Never imported: judge.py reads this file as text and runs it as `python -c` after codec.py's text
and judge.EXITS, all one namespace (the sandbox has no files but the interpreter's): codec.py's
names are this file's own there. The import of them below is a reader's and a linter's only.
"""
import builtins
import io
import json
import os
import sys

if __name__ != "__main__":  # a reader's view (python -c runs as __main__, after codec.py's text)
    from .codec import PROMPT, REPLY_CAP, bases, decode, encode

# the builtins as they are before the program runs: the judge may send any by name; encode sends
# only the classes by name (a builtin function the program binds, `solve = sorted`, is its own)
ORIGINAL = dict(vars(builtins))
BUILTINS = {k: v for k, v in ORIGINAL.items() if isinstance(v, type)}  # codec.py's encode reads it
dumps, loads = json.dumps, json.loads
# 0: its namespace; 1: its random.seed (the test's seeds it too); then each object handed out
objects = [{"__name__": "solution"}, lambda *a, **k: __import__("random").seed(*a, **k)]
handles = {}
printed = io.TextIOWrapper(io.BytesIO(), "utf-8", write_through=True)  # its sys.stdout


def refer(value):  # a program's object that is not data: the handles of it and of its class
    if id(value) not in handles:
        handles[id(value)] = len(objects)
        objects.append(value)
    if isinstance(value, type):
        return {"class": handles[id(value)]}
    return {"object": [handles[id(value)], refer(type(value))["class"]]}


def resolve(tag, payload):  # a builtin, an object handed out, or a callable of the test's
    if tag == "builtin":
        return ORIGINAL[payload]
    if tag == "ref":
        return objects[payload]
    if tag == "callback":
        return lambda *args, **kwargs: callback(payload, args, kwargs)
    raise ValueError(tag)


def send(message):
    text = printed.buffer.getvalue().decode(errors="replace")[:REPLY_CAP // 16]
    printed.buffer.seek(0), printed.buffer.truncate()
    if text:  # what it printed since its last message goes first: the test's callback 0 prints it
        callback(0, [text], {})
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
        elif kind == "class":  # its name, bases and the names of the methods Python's syntax calls
            value = [target.__name__, list(target.__bases__),
                     [n for n in dir(target) if n[:2] == "__"]]
        elif kind == "next":
            try:
                value = next(target)
            except StopIteration:
                return ["stop"]
        else:
            arguments = [(k, decode(v, resolve)) for k, v in (*request[0], *request[1])]
            before = carried(arguments, 1 << 40)
            if request[2:]:  # a method of a protocol, looked up on its class as Python does
                target = getattr(type(target), request[2]).__get__(target)
            value = target(*[v for k, v in arguments if type(k) is int],
                           **{k: v for k, v in arguments if type(k) is str})
    except BaseException as error:  # the program's: the judge raises it, or its class's stand-in
        own = [error] if BUILTINS.get(type(error).__name__) is not type(error) else []  # its class
        try:  # its arguments, and itself when its class is its own
            args = encode([list(error.args), *own], refer, [REPLY_CAP // 2])
        except Exception:
            args = [[]]
        return ["raised", bases(error), args]
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
    sys.stdout = printed
    (_, program, prompt), sys.argv[:] = sys.argv, ["solution.py"]
    exec(compile(prompt, "prompt.py", "exec"), objects[0])  # the prompt's code (HumanEval's)
    PROMPT.update({k: v for k, v in objects[0].items()
                   if isinstance(v, type) and v.__module__ == "solution"})
    exec(compile(program, "solution.py", "exec"), objects[0])
    if isinstance(cls := objects[0].get("Solution"), type):  # LeetCode's: its methods, entry points
        objects[0] = {k: getattr(o, k) for o in [cls()] for k in dir(o) if k[0] != "_"} | objects[0]
    serve()
