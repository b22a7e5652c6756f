"""Values as data, the grammar both sides of judge.py's conversation share: JSON's own values are
themselves (ints below SHORT, floats with NaN and Infinity), the rest an object of one key,
{tag: payload}. What is not data is refer()'s (a handle, a callback) and comes back through
resolve(); BUILTINS too is each side's own.

Never imported: judge.py reads this file as text, execs it for the judge's side and runs it in the
sandbox ahead of harness.py (`python -c`: the sandbox has no files but the interpreter's). Its
limits are defined here, once; judge.py reads REPLY_CAP back from the exec.
"""
import builtins
import sys
from collections import Counter, OrderedDict, defaultdict, deque, namedtuple

REPLY_CAP = 1 << 20  # characters of one reply; more is a failed call (sandbox.OUTPUT_CAP)
DEPTH = 100          # nesting of a value, both ways; deeper is a failed call
COLLISIONS = 8       # keys of one set or dict that may share a hash; more is a failed call
SHORT = 1 << 63      # larger ints travel in hex: int(str) is quadratic in the digits
BUILTINS = vars(builtins)  # the judge's; the harness's is a copy taken before the program runs
MAPPINGS = {"dict": dict, "Counter": Counter, "OrderedDict": OrderedDict}
VIEWS = {type({}.keys()): "keys", type({}.values()): "values", type({}.items()): "items"}
# a builtin's subclass (an IntEnum, a list whose __eq__ lies) travels as an exact copy, made in C
EXACT = [(int, int.__pos__), (float, float.__pos__), (complex, complex.__pos__),
         (str, str.__str__), (bytes, lambda b: bytes.__getitem__(b, slice(None))),
         (bytearray, bytearray.copy), (list, list.copy), (dict, dict.copy), (set, set.copy),
         (tuple, lambda t: tuple.__getitem__(t, slice(None))), (frozenset, frozenset.copy)]
NAMED = {}  # (name, fields) -> its namedtuple class
# the classes the prompt declares, by name (each side's own, filled once its prompt has run): their
# objects travel as their state, rebuilt by the other side's class, never by the sender's code
PROMPT = {}
# the standard library's plain values (of their class exactly), carried as its constructor's arguments:
# tag (the class's name) -> (its module, value -> the arguments). A zone travels as its offset then
# (a timezone: == and arithmetic compare instants), where a datetime's fold changes nothing.
VALUES = {"Fraction": ("fractions", lambda v: [v.numerator, v.denominator]),
          "range": ("builtins", lambda v: [v.start, v.stop, v.step]),
          "slice": ("builtins", lambda v: [v.start, v.stop, v.step]),
          "date": ("datetime", lambda v: [v.year, v.month, v.day]),
          "time": ("datetime", lambda v: [v.hour, v.minute, v.second, v.microsecond, zone(v)]),
          "datetime": ("datetime", lambda v: [*v.timetuple()[:6], v.microsecond, zone(v)]),
          "timedelta": ("datetime", lambda v: [v.days, v.seconds, v.microseconds]),
          "timezone": ("datetime", lambda v: [v.utcoffset(None), v.tzname(None)]),
          **{tag: (module, lambda v: [str(v)]) for module, tags in [  # what its str() gives
              ("decimal", "Decimal"), ("uuid", "UUID"),
              ("ipaddress", "IPv4Address IPv6Address IPv4Network IPv6Network")]
             for tag in tags.split()}}


def zone(v):  # an aware value's zone as the timezone of its offset (a ZoneInfo's too); or None
    return v.tzinfo and loaded("datetime", "timezone")(v.utcoffset(), v.tzname())


def loaded(module, name):  # a class of a module once imported (the harness starts faster without)
    return getattr(sys.modules.get(module), name, None)


def encode(value, refer, room, depth=0):
    """value -> JSON-able data; room: [characters left], a lower bound of the JSON's length."""
    room[0] -= 1
    if room[0] < 0 or depth > DEPTH:
        raise BufferError("too big or too deeply nested to carry")
    kind, more = type(value), lambda v: encode(v, refer, room, depth + 1)
    if value is None or kind in (bool, float):
        return value
    if kind is str:
        room[0] -= len(value)
        return value
    if kind is int:
        return value if -SHORT < value < SHORT else {"int": hex(value)}
    if kind is list:
        return [more(v) for v in value]
    if kind in (tuple, set, frozenset):
        return {kind.__name__: [more(v) for v in value]}
    if kind in VIEWS:  # the dict it views
        return {VIEWS[kind]: more(dict(value.mapping))}
    if kind in MAPPINGS.values():
        return {kind.__name__: [[more(k), more(v)] for k, v in value.items()]}
    if kind is defaultdict:
        return {"defaultdict": [more(value.default_factory), more(dict(value))]}
    if kind is deque:
        return {"deque": [[more(v) for v in value], value.maxlen]}
    if kind in (bytes, bytearray):
        room[0] -= 2 * len(value)
        return {kind.__name__: value.hex()}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    for tag, (module, arguments) in VALUES.items():
        if kind is loaded(module, tag):
            return {tag: more(arguments(value))}
    if kind.__name__ in PROMPT and (state := prompted(value)) is not None:
        return {"prompt": [kind.__name__, more(state)]}
    if isinstance(value, tuple) and isinstance(getattr(kind, "_fields", None), tuple):
        items = list(tuple.__getitem__(value, slice(None)))  # a namedtuple: its fields, then items
        return {"namedtuple": [more(kind.__name__), more(list(kind._fields)), more(items)]}
    for base, copy in EXACT:
        if isinstance(value, base):
            return more(copy(value))
    name = getattr(value, "__name__", None)
    if isinstance(name, str) and BUILTINS.get(name) is value:
        return {"builtin": name}
    return refer(value)


def decode(data, resolve, depth=0):
    """encode's data -> the value, built afresh of builtin types (never by the sender's code)."""
    if depth > DEPTH:
        raise BufferError("too deeply nested")
    more = lambda d: decode(d, resolve, depth + 1)
    if type(data) is list:
        return [more(d) for d in data]
    if type(data) is not dict:
        return data
    (tag, payload), = data.items()
    if tag == "int":
        return int(payload, 16)
    if tag == "tuple":
        return tuple(map(more, payload))
    if tag in ("set", "frozenset"):
        return (set if tag == "set" else frozenset)(distinct([more(d) for d in payload]))
    if tag in MAPPINGS:
        keys, values = [more(k) for k, _ in payload], [more(v) for _, v in payload]
        mapping = dict(zip(distinct(keys), values))
        return mapping if tag == "dict" else MAPPINGS[tag](mapping)
    if tag in ("keys", "values", "items"):
        return getattr(dict, tag)(more(payload))
    if tag == "defaultdict":
        factory, mapping = map(more, payload)
        return defaultdict(factory, mapping)
    if tag == "deque":
        items, maxlen = payload
        return deque(map(more, items), maxlen)
    if tag == "namedtuple":
        name, fields, values = map(more, payload)
        if (name, tuple(fields)) not in NAMED:
            NAMED.clear() if len(NAMED) > 1000 else None
            NAMED[name, tuple(fields)] = namedtuple(name, fields)
        return NAMED[name, tuple(fields)](*values)
    if tag in ("bytes", "bytearray"):
        return (bytes if tag == "bytes" else bytearray).fromhex(payload)
    if tag == "complex":
        real, imag = payload
        return complex(real, imag)
    if tag in VALUES:  # the class's own constructor checks its arguments
        return getattr(__import__(VALUES[tag][0]), tag)(*map(more, payload))
    if tag == "prompt":  # an Enum's member by name, or an object by its state
        kind, state = PROMPT[payload[0]], more(payload[1])
        if type(state) is str:
            return kind.__members__[state]
        value = kind.__new__(kind)
        vars(value).update(state)
        return value
    return resolve(tag, payload)


# The state of an object of the prompt's class: an Enum's name, or its __dict__; None for a
# builtin's subclass (a NamedTuple travels as a namedtuple, an int or a list as a copy) or an
# object with none.
def prompted(value):
    if isinstance(value, loaded("enum", "Enum") or ()):
        return value.name
    builtin = isinstance(value, tuple(base for base, _ in EXACT))
    return None if builtin else getattr(value, "__dict__", None)


def distinct(keys):
    """keys, unless many share a hash: a set or dict of them would take quadratic time to build."""
    if max(Counter(map(hash, keys)).values(), default=0) > COLLISIONS:
        raise BufferError("keys whose hashes collide")
    return keys


def bases(error):  # the names of its class's builtin bases, nearest first
    return [c.__name__ for c in type(error).__mro__ if BUILTINS.get(c.__name__) is c]
