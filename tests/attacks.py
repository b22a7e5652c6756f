"""The programs tests/test_sandbox.py's and tests/test_judge.py's tests run (string constants; no tests here).
The attacks print "pwned" (PWNED, their test, expects it) only if they worked; their {fields}
are filled in by str.format (NUMBERS: the syscalls without a glibc wrapper; a marker, a key, the trainer's pid)."""


# -----------------------------------------------------------------------------
# programs that read every string they can reach (the expected values must never be among them)


STRINGS = """
import gc, os, sys, types
def strings():  # every string the program can reach: frames up the stack, gc containers, code constants
    frame, seen = sys._getframe(), []
    while frame:
        seen += frame.f_locals.values()
        frame = frame.f_back
    seen += [v for o in gc.get_objects() if isinstance(o, (dict, list, tuple)) for v in (o.values() if isinstance(o, dict) else o)]
    for value in seen:
        yield from value.co_consts if isinstance(value, types.CodeType) else [value]
"""
HUNT = STRINGS + """found = [s for s in strings() if isinstance(s, str) and s.startswith("expected-") and len(s) > 9]
def answer():
    return found[0] if found else "wrong"
"""


# -----------------------------------------------------------------------------
# the test formats users bring, and the programs judged in each (judge.py's tests, an unprivileged trainer's)


SQUARE_CHECK = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-3) == 9\n"
# the formats users bring, as judge.passes() keywords (data.py turns rows into them): each must fail a program
# that defines nothing and a wrong one, and pass the right one
TEST_FORMATS = {
    "humaneval": dict(test=SQUARE_CHECK, entry_point="square"),  # check(candidate) is called with the entry point
    "humaneval, helpers in the test": dict(test="def helper(x):\n    return x * x\n\n" + SQUARE_CHECK.replace(
        "candidate(2) == 4", "candidate(2) == helper(2)"), entry_point="square"),
    "pytest": dict(test="def test_square():\n    assert square(2) == 4\n\ndef test_negative():\n    assert square(-3) == 9\n"),
    "mbpp": dict(test="import math\nassert math.isclose(square(1.5), 2.25)\nassert square(2) == 4"),
    "asserts": dict(test="assert square(2) == 4\nassert square(-3) == 9"),
    "call": dict(fn_name="square", tests=[dict(input=[2], output=4), dict(input=[-3], output=9)]),
    "stdin": dict(tests=[dict(input="2\n", output="4"), dict(input="-3\n", output="9")]),
}
SQUARES = dict(right="def square(x):\n    return x * x\n\ndef helper(x):\n    return x * x\n\n"
                     "if __name__ == '__main__':\n    print(square(int(input())))\n",
               nothing="pass", zero="def square(x):\n    return 0\n\ndef helper(x):\n    return 0\nprint(0)")

SHADOW = ("import math\nmath.isclose = lambda *a, **k: True\nisclose = math.isclose\n"
          "class Counter:\n    __eq__ = lambda self, other: True\n    __init__ = lambda self, *a: None\n"
          "sum = len = sorted = lambda *a, **k: 4\ndef square(x):\n    return 0\n")  # names a test may use, faked


# -----------------------------------------------------------------------------
# locks, leases and watches on the files concurrent programs share


SIGNAL_EACH_OTHER = r"""
import ctypes, errno, fcntl, json, os, struct
libc, out, stdlib = ctypes.CDLL(None, use_errno=True), {}, os.path.dirname(os.__file__)
def attempt(name, call):
    try:
        call()
        out[name] = "allowed"
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
def syscall(name, *args):
    if libc[name](*args) < 0:
        raise OSError(ctypes.get_errno(), name)
shared = os.open(os.__file__, os.O_RDONLY)
attempt("flock", lambda: fcntl.flock(shared, fcntl.LOCK_SH | fcntl.LOCK_NB))
attempt("fcntl_setlk", lambda: fcntl.lockf(shared, fcntl.LOCK_SH | fcntl.LOCK_NB))
attempt("ofd_setlk", lambda: fcntl.fcntl(shared, 37, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0)))
attempt("lease", lambda: fcntl.fcntl(shared, 1024, fcntl.F_RDLCK))
attempt("dnotify", lambda: fcntl.fcntl(os.open(stdlib, os.O_RDONLY), 1026, 0x1))
attempt("inotify_init1", lambda: syscall("inotify_init1", 0))
attempt("fanotify_init", lambda: syscall("fanotify_init", 0, 0))
print(json.dumps(out))
"""


# -----------------------------------------------------------------------------
# the attacks: each prints "pwned" only if it worked


PWNED = [dict(input="", output="pwned")]  # the test every attack program would pass if its attack worked

# syscalls without a glibc wrapper, by number (x86_64, aarch64), from the kernel's tables, not sandbox.py's
NUMBERS = {"x86_64": dict(clone=56, clone3=435, add_key=248, keyctl=250, rt_tgsigqueueinfo=297, pidfd_getfd=438),
           "aarch64": dict(clone=220, clone3=435, add_key=217, keyctl=219, rt_tgsigqueueinfo=240, pidfd_getfd=438)}

SYSCALL = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
def call(function, *args):  # a libc function, or libc.syscall with the number first
    if function(*[ctypes.c_long(a) if isinstance(a, int) else a for a in args]) == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
def syscall(nr, *args):
    call(libc.syscall, nr, *args)
results = dict()
def attempt(name, f):
    try:
        f()
        results[name] = "done"
    except OSError as e:
        results[name] = errno.errorcode.get(e.errno, str(e.errno))
def report():
    print(json.dumps(results))
    print("pwned" if "done" in results.values() else "held")
"""

# 1. reading the answers: the dataset file, found where the trainer has it, gives every expected output
READ_ANSWERS = """
import ast, json, sys
rows = [json.loads(line) for line in open({path!r})]
row = [r for r in rows if r["prompt"] == {prompt!r}][0]
if "fn_name" in row:
    answers = {{json.dumps(t["input"]): t["output"] for t in row["tests"]}}
    globals()[row["fn_name"]] = lambda *args: answers[json.dumps(list(args))]
elif "test" in row:  # assert f(args) == expected: answer each call from the test itself
    answers = {{}}
    for node in ast.walk(ast.parse(row["test"])):
        try:
            args, expected = ast.literal_eval(ast.Tuple(node.left.args, ast.Load())), ast.literal_eval(node.comparators[0])
            answers[(node.left.func.id, repr(args))] = expected
        except (AttributeError, ValueError):
            pass  # not `assert f(literals) == literal`
    for name in {{n for n, _ in answers}}:
        globals()[name] = lambda *args, name=name: answers[(name, repr(args))]
else:
    given = sys.stdin.read()
    print([t["output"] for t in row["tests"] if t["input"].split() == given.split()][0])
"""

SEES = """
import json, os
seen = {{p: os.path.exists(p) for p in {paths!r}}}
seen["mounts"] = [line.split()[4] for line in open("/proc/self/mountinfo")]
seen["interfaces"] = [line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]]
seen["processes"] = [p for p in os.listdir("/proc") if p.isdigit()]
print(json.dumps(seen))
"""

# 2. persisting: files outside the private /tmp, SysV IPC, POSIX message queues, keys, a process left running
PERSIST = SYSCALL + """
import time
marker, key = {marker!r}, {key}
for directory in ("/var/tmp", "/run/lock", "/dev/shm", "/dev/mqueue", os.path.expanduser("~"), "/"):
    attempt("write " + directory, lambda: open(os.path.join(directory, marker), "w").write(marker))
attempt("shmget", lambda: call(libc.shmget, key, 768 << 20, 0o1666))  # IPC_CREAT | 0666: outlives every process
attempt("semget", lambda: call(libc.semget, key, 1, 0o1666))
attempt("msgget", lambda: call(libc.msgget, key, 0o1666))
attempt("mq_open", lambda: call(libc.mq_open, ctypes.c_char_p(b"/" + marker.encode()), 0o102, 0o666, None))
attempt("add_key", lambda: syscall({add_key}, ctypes.c_char_p(b"user"), ctypes.c_char_p(marker.encode()),
                                   ctypes.c_char_p(b"secret"), 6, -4))  # into KEY_SPEC_USER_KEYRING
attempt("keyctl", lambda: syscall({keyctl}, 1, None))  # KEYCTL_JOIN_SESSION_KEYRING: a new session keyring
if os.fork() == 0:  # a daemon: lets go of the pipes and waits
    for fd in (0, 1, 2):
        os.close(fd)
    time.sleep(600)
    os._exit(0)
print(json.dumps(results))
"""

FIND = """
import ctypes, os
marker, key = {marker!r}, {key}
libc = ctypes.CDLL(None, use_errno=True)
found = [d for d in ("/var/tmp", "/run/lock", "/dev/shm", "/dev/mqueue", os.path.expanduser("~"), "/", "/tmp")
         if os.path.exists(os.path.join(d, marker))]
found += [n for n, get in (("shm", libc.shmget), ("sem", libc.semget), ("msg", libc.msgget)) if get(key, 0, 0) >= 0]
print("pwned" if found else "nothing", found)
"""

# 3. memory: three children of 600 MiB each, all alive at once
MEMORY = """
import os, select, time
r, w = os.pipe()
children = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        block = bytearray(600 << 20)  # zeroed: every page touched
        os.write(w, b"+")
        time.sleep(600)
        os._exit(0)
    children.append(pid)
held = b""
while len(held) < 3:
    if select.select([r], [], [], 0.05)[0]:
        held += os.read(r, 3)
    for pid in children:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            print("a child was killed by signal", os.WTERMSIG(status) if os.WIFSIGNALED(status) else None)
            raise SystemExit(1)
print("pwned")
"""

OOM_SCORE = """
import os
r, w = os.pipe()
if os.fork() == 0:
    os.write(w, open("/proc/self/oom_score_adj").read().encode())
    os._exit(0)
os.wait()
print(open("/proc/self/oom_score_adj").read().strip(), os.read(r, 100).decode().strip())
"""

# 4. namespaces: a user namespace gives full capabilities inside
NAMESPACES = SYSCALL + """
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x20000, 0x40000000, 17
for name, flags in (("user", CLONE_NEWUSER), ("mount", CLONE_NEWNS), ("net", CLONE_NEWNET)):
    attempt("unshare " + name, lambda: call(libc.unshare, flags))
def clone(flags):
    pid = libc.syscall({clone}, ctypes.c_long(flags), None, None, None, None)
    if pid == 0:
        os._exit(0)
    if pid == -1:
        raise OSError(ctypes.get_errno(), "clone")
    os.waitpid(pid, 0)
attempt("clone user", lambda: clone(CLONE_NEWUSER | SIGCHLD))
attempt("clone parent", lambda: clone(0x8000 | SIGCHLD))  # CLONE_PARENT: a sibling, outside the tracked tree
args = (ctypes.c_uint64 * 11)(CLONE_NEWUSER, 0, 0, 0, SIGCHLD, 0, 0, 0, 0, 0, 0)
attempt("clone3 user", lambda: syscall({clone3}, ctypes.byref(args), ctypes.sizeof(args)))
attempt("setns", lambda: call(libc.setns, os.open("/proc/self/ns/net", os.O_RDONLY), 0))
report()
"""

# 5. the trainer: signals (direct, queued, through a pipe's or a socket's owner), limits, affinity, its memory
TRAINER = SYSCALL + """
import fcntl, resource, signal, socket, struct
trainer = {trainer} or os.getppid()
siginfo = struct.pack("iii", signal.SIGKILL, 0, -1) + bytes(116)  # si_code SI_QUEUE
attempt("kill", lambda: os.kill(trainer, signal.SIGKILL))
attempt("kill -1", lambda: os.kill(-1, signal.SIGKILL))
attempt("rt_sigqueueinfo", lambda: call(libc.sigqueue, trainer, signal.SIGKILL, 0))
attempt("rt_tgsigqueueinfo", lambda: syscall({rt_tgsigqueueinfo}, trainer, trainer, signal.SIGKILL, siginfo))
attempt("pidfd_send_signal", lambda: signal.pidfd_send_signal(os.pidfd_open(trainer), signal.SIGKILL))
def pipe_owner(command, argument):
    r, w = os.pipe()
    fcntl.fcntl(r, command, argument)
    fcntl.fcntl(r, 10, signal.SIGKILL)  # F_SETSIG
    fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC)
    os.write(w, b"x")  # the owner gets F_SETSIG's signal
attempt("F_SETOWN", lambda: pipe_owner(8, trainer))
attempt("F_SETOWN_EX", lambda: pipe_owner(15, struct.pack("ii", 1, trainer)))  # F_OWNER_PID
def socket_owner():
    a, b = socket.socketpair()
    fcntl.ioctl(a, 0x8901, struct.pack("i", trainer))  # FIOSETOWN
    fcntl.ioctl(a, 0x5452, struct.pack("i", 1))        # FIOASYNC
    b.send(b"x")  # SIGIO, whose default action ends the owner
attempt("FIOSETOWN", socket_owner)
attempt("prlimit", lambda: resource.prlimit(trainer, resource.RLIMIT_CPU, (1, 1)))
attempt("sched_setaffinity", lambda: os.sched_setaffinity(trainer, {{0}}))
attempt("setpriority", lambda: os.setpriority(os.PRIO_PROCESS, trainer, 19))
attempt("ptrace", lambda: call(libc.ptrace, 16, trainer, 0, 0))  # PTRACE_ATTACH
buffer = ctypes.create_string_buffer(8)
iovec = struct.pack("PN", ctypes.addressof(buffer), 8)
attempt("process_vm_readv", lambda: call(libc.process_vm_readv, trainer, iovec, 1, iovec, 1, 0))
attempt("pidfd_getfd", lambda: syscall({pidfd_getfd}, os.pidfd_open(trainer), 0, 0))
attempt("environ", lambda: open(f"/proc/{{trainer}}/environ").read())
attempt("mem", lambda: open(f"/proc/{{trainer}}/mem", "wb"))
report()
"""

# 5. a child that lets go of the pipes while its parent answers correctly and exits
DAEMON = """
import os, time
if os.fork() == 0:
    for fd in (0, 1, 2):
        os.close(fd)
    time.sleep(600)
print("pwned")
"""

# 6. asserts: what the program's process holds or prints must not decide a verdict
HUNT_EVERYWHERE = STRINGS + """found = [s for s in strings() if isinstance(s, str) and len(s) == 32 and s.isalnum()]  # a token, say
def answer():
    return found[0] if found else "wrong"
for fd in range(3, 20):  # and plausible replies on every descriptor, ahead of any request
    try:
        os.write(fd, b"1 1 None\\n2 0 True\\n" * 50)
    except OSError:
        pass
"""

WORKS = """
import multiprocessing, os, subprocess, sys, threading
box = []
thread = threading.Thread(target=lambda: box.append(1))
thread.start(), thread.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
assert os.waitpid(pid, 0)[1] >> 8 == 7
assert subprocess.run([sys.executable, "-c", "print(2)"], capture_output=True).stdout == b"2\\n"
pool = multiprocessing.Pool(2)  # closed, not terminated: kill() is denied, even to its own children
assert pool.map(abs, [-1, -2]) == [1, 2]
pool.close(), pool.join()
open("scratch", "w").write("x" * 1000)
print(sum(box) + 2)
"""


# -----------------------------------------------------------------------------
# an unprivileged trainer: the driver /usr/bin/python3 runs as nobody, beside a copy of the rewards/ package


DRIVER = r"""
import json, os, sys
from rewards import judge, sandbox
jobs = json.load(open(sys.argv[1]))
out = {}
try:
    sandbox.require(False)
    out["refused"] = None
except ValueError as e:
    out["refused"] = str(e)
out["isolation"] = sandbox.require(True)
out["passed"] = [judge.passes(**job) for job in jobs]
out["runs"] = [sandbox.run(["-c", job["program"]], timeout=job.get("timeout", 120)).stdout.decode(errors="replace")
               for job in jobs]
print(json.dumps(out))
"""
