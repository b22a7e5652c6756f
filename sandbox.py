"""
Runs model-written Python against tests, isolated: the code reward of the math + code runs.

    python benchmarks/sandbox.py     # the isolation in effect here, and programs per second through the pool

The program is an adversary: by accident (infinite loops, fork bombs, huge outputs) and, under RL pressure, by design
(reading the answers, forging the verdict, attacking the trainer, persisting). A run ends by its deadline in a verdict
only a correct program earns, leaves nothing behind, and any failure is reward -1. Always: a fresh directory, PATH and
LANG, `python -I -S -B`, oom_score_adj 1000, rlimits, no_new_privs, seccomp (SYSCALLS: no sockets, kill or other signals,
ptrace, namespaces, keyring, SysV IPC, setsid: killing the process group kills all a run started). Full isolation (the
trainer is root, the kernel grants namespaces) adds a uid and a memory cgroup per worker thread, new mount, pid, net,
IPC, UTS and cgroup namespaces with the program as pid 1, and pivot_root into an empty tmpfs holding read-only binds of
the interpreter, its standard library (site-packages hidden) and the libraries ldd names, /dev/null, zero and urandom,
its proc and a fresh 64 MiB /tmp, its cwd: nothing else of the host. Otherwise require() refuses but with
sandbox_unsafe=True: programs then run as the trainer's user, with all that needs no root, beside a non-dumpable trainer.

Verdicts. stdin/stdout: a process per test; exit 0 in time and the expected output, whitespace-normalised. Calls and
asserts: HARNESS runs the program, then answers requests (a value, a call) with Python literals in that process; the
parent runs the test (trusted dataset code, its asserts kept under python -O), the names it takes from the program
standing for the program's: data as itself, a callable as a function calling it there, another object as a Handle.
Call-style is `fn_name(*input) == output` as JSON. Assert-style (assert_plan): HumanEval's check(candidate) is called
with the entry point, pytest's test_* functions are called; the program supplies the entry point alone (none given:
the names the test reads and never binds), never a builtin or a name the test imports; a StopIteration it raises is a
failure. A test that would call nothing of the program is refused. Nothing the program's process holds or prints can
forge a pass.
"""
import ast
import atexit
import builtins
import ctypes
import fcntl
import json
import os
import pwd
import resource
import selectors
import shutil
import signal
import struct
import subprocess
import symtable
import sys
import tempfile
import threading
import time
from collections import namedtuple
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, suppress
from functools import lru_cache, partial

TIMEOUT = 5.0             # wall seconds per process (ours; LiveCodeBench-style graders allow ~6 s a test)
MEMORY = 1 << 30          # bytes: each process's address space, and all of a run's processes (memory cgroup)
FILE_SIZE = 10 << 20      # the largest file it may write, bytes
OUTPUT_CAP = 1 << 20      # stdout and stderr, bytes each; more is a fail
OPEN_FILES = 64
PROCESSES = 32            # processes + threads of the sandbox uid
TMPFS = b"size=64m,nr_inodes=4096,mode=1777"  # the program's /tmp (full isolation)
FIRST_UID = 59000         # root only: worker k runs as the first free uid >= this with no passwd entry
WORKERS = os.cpu_count() or 2
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}

# -----------------------------------------------------------------------------
# entering the sandbox: runs in the child between fork and exec (no imports, no locks, libc functions looked up here)

_libc = ctypes.CDLL(None, use_errno=True)
_mount, _umount2, _unshare, _prctl, _syscall = _libc.mount, _libc.umount2, _libc.unshare, _libc.prctl, _libc.syscall
_ONE, _ZERO = [ctypes.c_ulong(v) for v in (1, 0, 0, 0)], [ctypes.c_ulong(0)] * 4  # prctl's unsigned long arguments
NAMESPACES = 0x20000 | 0x2000000 | 0x4000000 | 0x8000000 | 0x20000000 | 0x40000000  # mount, cgroup, UTS, IPC, pid, net
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 0x4000, 0x40000
READ_ONLY = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
MACHINE = os.uname().machine
# audit arch, pivot_root, [denied: socket, kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo, pidfd_send_signal,
# ptrace, process_vm_readv, process_vm_writev, pidfd_getfd, process_madvise, setsid, setpgid, unshare, setns, add_key,
# request_key, keyctl, shmget, semget, msgget, mq_open, bpf, perf_event_open, userfaultfd, io_uring_setup, setpriority,
# ioprio_set, flock, inotify_init1, inotify_add_watch, fanotify_init, fanotify_mark(, inotify_init)], [pid 0 only:
# prlimit64, sched_setaffinity, sched_setscheduler, sched_setparam, sched_setattr, migrate_pages, move_pages], (clone3,
# clone, fcntl, ioctl). Locks, leases and watches on the files every run shares would be a channel between runs.
SYSCALLS = {"x86_64": (0xC000003E, 155, [41, 62, 200, 234, 129, 297, 424, 101, 310, 311, 438, 440, 112, 109, 272, 308,
                                         248, 249, 250, 29, 64, 68, 240, 321, 298, 323, 425, 141, 251, 73, 294,
                                         254, 300, 301, 253],
                       [302, 203, 144, 142, 314, 256, 279], (435, 56, 72, 16)),
            "aarch64": (0xC00000B7, 41, [198, 129, 130, 131, 138, 240, 424, 117, 270, 271, 438, 440, 157, 154, 97, 268,
                                         217, 218, 219, 194, 190, 186, 180, 280, 241, 282, 425, 140, 30, 32, 26,
                                         27, 262, 263],
                        [261, 122, 119, 118, 274, 238, 239], (435, 220, 25, 29))}

FCNTL_DENIED = (8, 10, 15, 6, 7, 37, 38, 1024, 1026)  # F_SETOWN, F_SETSIG, F_SETOWN_EX; F_SETLK(W), F_OFD_SETLK(W),
# F_SETLEASE, F_NOTIFY (record locks, leases and directory watches)


def _seccomp_program():
    """Classic BPF over seccomp_data (nr at 0, arch at 4, argument i's low word at 16 + 8 i): EPERM ("no") for SYSCALLS'
    denials and every syscall of another ABI (x32, i386); ENOSYS for clone3, whose flags it cannot read."""
    if MACHINE not in SYSCALLS:
        return None
    arch, _, denied, own, (clone3, clone, fcntl_, ioctl) = SYSCALLS[MACHINE]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, |JGE|K, |JSET|K, BPF_RET|K
    code = [(ld, 4), (jeq, arch, None, "no"), (ld, 0), (jge, 0x40000000, "no"), *[(jeq, n, "no") for n in denied],
            *[(jeq, n, "own") for n in own], (jeq, clone3, "nosys"), (jeq, clone, "clone"), (jeq, fcntl_, "fcntl"),
            (jeq, ioctl, "ioctl"), (ret, 0x7FFF0000), "clone", (ld, 16), (jset, NAMESPACES | 0x10000000 | 0x8000, "no"),
            (ret, 0x7FFF0000), "fcntl", (ld, 24), *[(jeq, c, "no") for c in FCNTL_DENIED], (ret, 0x7FFF0000),
            "ioctl", (ld, 24), (jeq, 0x8901, "no"), (jeq, 0x8902, "no"), (ret, 0x7FFF0000), "own", (ld, 16),
            (jeq, 0, None, "no"), (ret, 0x7FFF0000), "no", (ret, 0x50001), "nosys", (ret, 0x50026)]
    at = {c: sum(not isinstance(d, str) for d in code[:i]) for i, c in enumerate(code) if isinstance(c, str)}
    insns = [(*c, None, None)[:4] for c in code if not isinstance(c, str)]
    buffer = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", op, jt and at[jt] - i - 1 or 0, jf and at[jf] - i - 1
                                                              or 0, k) for i, (op, k, jt, jf) in enumerate(insns)))
    return buffer, ctypes.create_string_buffer(struct.pack("HP", len(insns), ctypes.addressof(buffer)))  # sock_fprog


_SECCOMP = _seccomp_program()


def _check(result, what):
    if result != 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


def _write(path, data):
    with open(path, "wb", buffering=0) as f:
        f.write(data)


def _enter(uid, cgroup, root, plan, cpu_seconds, nproc):
    """oom_score_adj, cgroup, (full) namespaces and root, uid, no_new_privs, seccomp, limits; or why not, and exit 126."""
    try:
        _prctl(4, *_ONE)  # PR_SET_DUMPABLE, as exec would: a non-dumpable trainer's child cannot write its /proc
        _write(b"/proc/self/oom_score_adj", b"1000")
        _write(cgroup + b"/cgroup.procs", b"0") if cgroup else None  # before anything is allocated
        if root:
            _check(_unshare(NAMESPACES), "unshare")
            _check(_mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount")  # nothing propagates to the host
            _become_pid_1()
            _pivot_into(root, plan)
        if uid >= 0:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        _check(_prctl(38, *_ONE), "no_new_privs")  # PR_SET_NO_NEW_PRIVS
        _check(_prctl(22, ctypes.c_ulong(2), _SECCOMP[1]) if _SECCOMP else 0, "seccomp")  # PR_SET_SECCOMP, MODE_FILTER
        for limit, value in zip(("CPU", "FSIZE", "NOFILE", "NPROC", "CORE", "AS"),  # AS last: a big parent's child
                                (cpu_seconds, FILE_SIZE, OPEN_FILES, nproc, 0, MEMORY)):  # allocates nothing after it
            resource.setrlimit(getattr(resource, "RLIMIT_" + limit), (value, value))
    except BaseException as e:
        os.write(2, f"sandbox: {e}\n".encode())
        os._exit(126)


def _become_pid_1():
    """After unshare(CLONE_NEWPID) the child execs the program as pid 1 (its namespace dies with it); this process stays
    outside as root until pid 1 exits or the parent sends SIGTERM, then kills pid 1, reaps it and exits as it did."""
    signals = {signal.SIGCHLD, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # from now on they wait for sigwaitinfo
    if (pid := os.fork()) == 0:
        return signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
    os.closerange(0, 1 << 16)  # no copy of the pipes: the parent sees EOF and exec errors as usual
    signal.sigwaitinfo(signals)
    os.kill(pid, signal.SIGKILL)  # not reaped yet, so still pid 1's pid
    status = os.waitpid(pid, 0)[1]
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def _pivot_into(root, plan):
    """Build the private root at `root` (plan: _root_plan), make it / and drop the host's."""
    for kind, path, arg in plan:
        here = root + path
        if kind == "dir":
            os.mkdir(here, 0o755)
        elif kind == "link":
            os.symlink(arg, here)
        elif kind == "mount":  # arg: (type, flags, options)
            _check(_mount(arg[0], here, *arg), "mount " + os.fsdecode(path))
        else:  # "bind" (read-only) or "dev" (a device: read-write, and not nodev)
            os.mkdir(here, 0o755) if arg else os.close(os.open(here, os.O_CREAT | os.O_WRONLY, 0o644))
            _check(_mount(path, here, None, MS_BIND, None), "bind " + os.fsdecode(path))
            _check(_mount(None, here, None, READ_ONLY, None) if kind == "bind" else 0, "mount")
    os.chdir(root)
    _check(_syscall(SYSCALLS[MACHINE][1], b".", b"."), "pivot_root")
    _check(_umount2(b".", 2), "umount")  # MNT_DETACH: the host's tree is gone
    _check(_mount(None, b"/", None, READ_ONLY, None), "mount")
    os.chdir("/tmp")


@lru_cache(maxsize=None)
def _root_plan(python):
    """The private root for `python`, as steps (kind, path, arg): the interpreter, its sys.path, their libraries."""
    found = subprocess.run([python, "-I", "-S", "-c", "import json, sys, sysconfig as s\nprint(json.dumps([sys.executable, "
                            "sys.path, s.get_path('purelib'), s.get_path('platlib')]))"], capture_output=True, env=ENV)
    executable, path, *packages = json.loads(found.stdout)
    path = sorted(p for p in path if os.path.exists(p))  # a directory before what it holds
    modules = [f"{p}/{f}" for p in path if os.path.isdir(p) for f in os.listdir(p) if f.endswith(".so")]
    ldd = subprocess.run(["ldd", executable, *modules], capture_output=True, text=True, env=ENV).stdout.split()
    plan = [("mount", b"", (b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,nr_inodes=1024,mode=755")), ("dir", b"/dev", None),
            ("dir", b"/proc", None), ("dir", b"/tmp", None), ("link", b"/dev/shm", b"/tmp"),
            *[("dev", b"/dev/" + d, False) for d in (b"null", b"zero", b"urandom")],
            *[("link", b"/dev/" + d, b"/proc/self/fd" + n) for d, n in ((b"fd", b""), (b"stdin", b"/0"),
                                                                       (b"stdout", b"/1"), (b"stderr", b"/2"))]]
    made = {os.fsdecode(p): kind for kind, p, _ in plan}
    for p in [*path, executable, *(w for w in ldd if w[0] == "/" and w[-1] != ":")]:  # not "(0x...)", "file:"
        _graft(p, plan, made)
    bound = [p for p, kind in made.items() if kind == "bind"]
    hide = [p for p in set(packages) if os.path.isdir(p) and any(p.startswith(b + "/") for b in bound)]
    return plan + [("mount", os.fsencode(p), (b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, b"size=4k")) for p in hide] + \
        [("mount", b"/proc", (b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)),
         ("mount", b"/tmp", (b"tmpfs", MS_NOSUID | MS_NODEV, TMPFS))]


def _graft(path, plan, made):
    """Steps that make `path` resolve as on the host: directories (0755), symlinks, then a bind of what it names."""
    parts, here = path.strip("/").split("/"), ""
    while parts and made.get(here) != "bind":
        here += "/" + parts.pop(0)
        kind = "link" if os.path.islink(here) else "dir" if parts else "bind"
        if here not in made:
            made[here] = kind
            plan.append((kind, os.fsencode(here), os.fsencode(os.readlink(here)) if kind == "link" else
                         os.path.isdir(here)))
        if kind == "link":  # on from where it points
            parts = os.path.normpath(os.path.join(os.path.dirname(here), os.readlink(here))).split("/")[1:] + parts
            here = ""

# -----------------------------------------------------------------------------
# one sandboxed process

_slot = threading.local()


def _worker():
    """This thread's (uid, memory cgroup or None, why none); root only (else uid -1): a uid no other worker holds."""
    if os.geteuid() != 0:
        return -1, None, "not root"
    if not hasattr(_slot, "uid"):
        for uid in range(FIRST_UID, FIRST_UID + 10_000):
            with suppress(KeyError):
                pwd.getpwuid(uid)
                continue  # a real account: never ours
            _slot.lock = os.open(f"/tmp/scalerl-sandbox-{uid}.lock", os.O_CREAT | os.O_RDWR, 0o600)  # one place for all
            with suppress(BlockingIOError):
                fcntl.flock(_slot.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            os.close(_slot.lock)
        _slot.uid, _slot.cgroup = uid, _memory_cgroup(uid)
    return (_slot.uid, *_slot.cgroup)


def _memory_cgroup(uid):
    """A child of the trainer's memory cgroup (v1; v2 if delegated) holding MEMORY -> (path, None) or (None, why)."""
    try:
        lines = [line.rstrip("\n").split(":", 2) for line in open("/proc/self/cgroup")]
        v1 = [path for _, kinds, path in lines if "memory" in kinds.split(",")]
        v2 = [path for n, _, path in lines if n == "0" and os.path.exists("/sys/fs/cgroup/cgroup.controllers")]
        group = f"/sys/fs/cgroup/memory{v1[0]}" if v1 else f"/sys/fs/cgroup{v2[0]}"
        group = group.rstrip("/") + f"/scalerl-sandbox-{uid}"
        os.makedirs(group, exist_ok=True)
        atexit.register(shutil.rmtree, group, True)  # an rmdir: its files go with it, and errors are ignored
        _write(group + ("/memory.limit_in_bytes" if v1 else "/memory.max"), str(MEMORY).encode())
        return os.fsencode(group), None
    except (OSError, IndexError) as e:
        return None, f"no writable memory cgroup: {e!r}"


Run = namedtuple("Run", "returncode stdout stderr timed_out overflowed", defaults=(b"", b"", False, False))
# returncode None: it never ran, or was killed at the deadline (timed_out) or past the output cap (overflowed)


class Sandboxed(AbstractContextManager):
    """`python -I -S -B *args` in the sandbox; leaving the context kills it and all it started, and cleans up."""

    def __init__(self, args, timeout=TIMEOUT, python=None, full=None):
        report = isolation() if python is None else {}
        python, self.full = python or report["python"], report.get("mode") == "full" if full is None else full
        if python is None:
            raise ChildProcessError("no Python interpreter runs in the sandbox (see isolation())")
        uid, cgroup, _ = _worker()
        self.proc, self.run_dir = None, tempfile.mkdtemp(prefix="sandbox-")  # full isolation: where its root is mounted
        try:
            os.chown(self.run_dir, uid, uid)  # -1: unchanged
            root = (os.fsencode(self.run_dir), _root_plan(python)) if self.full else (None, None)
            nproc = PROCESSES if uid >= 0 else _tasks_of(os.getuid()) + PROCESSES
            self.proc = subprocess.Popen([python, "-I", "-S", "-B", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, cwd=self.run_dir, env=ENV, umask=0o022,
                                         start_new_session=True,
                                         preexec_fn=partial(_enter, uid, cgroup, *root, int(timeout) + 1, nproc))
        except BaseException:
            self.__exit__()
            raise
        self.stdout, self.stderr, self.deadline = bytearray(), bytearray(), time.monotonic() + timeout
        self.reading = {self.proc.stdout: self.stdout, self.proc.stderr: self.stderr}  # the streams still open

    def __exit__(self, *_):
        if self.proc is not None:  # not reaped yet, so its pid and process group are this run's. Full isolation: its
            with suppress(OSError):  # helper kills pid 1, reaps it once its namespace is empty and exits; else, the group
                os.kill(self.proc.pid, signal.SIGTERM) if self.full else os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                stream.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def pump(self, data=b"", line=False):
        """Write `data` to its stdin while reading its stdout and stderr until stdout holds a line (line), or else until
        stdin is closed after the data and stdout and stderr closed. -> None, or "timed out" or "overflowed"."""
        data, stdin = memoryview(data), self.proc.stdin
        with selectors.DefaultSelector() as selector:
            for stream in [*self.reading, *([stdin] if data else [])]:
                selector.register(stream, selectors.EVENT_WRITE if stream is stdin else selectors.EVENT_READ)
            while data or self.reading and not (line and b"\n" in self.stdout):
                if not (data or line):
                    stdin.close()
                if time.monotonic() > self.deadline:
                    return "timed out"
                for key, _ in selector.select(self.deadline - time.monotonic()):
                    if key.fileobj is stdin:
                        try:  # at most PIPE_BUF bytes: one free slot of the pipe, which select promised, takes them
                            data = data[os.write(key.fd, data[:4096]):]
                        except BrokenPipeError:  # it stopped reading: what it wrote is judged
                            data = data[:0]
                        if not data:
                            selector.unregister(stdin)
                    elif chunk := os.read(key.fd, 1 << 16):
                        self.reading[key.fileobj] += chunk
                        if len(self.reading[key.fileobj]) > OUTPUT_CAP:
                            return "overflowed"
                    else:
                        selector.unregister(key.fileobj)
                        del self.reading[key.fileobj]
        return None


def run(args, stdin=b"", timeout=TIMEOUT, python=None, full=None):
    """`python -I -S -B *args` once in the sandbox, stdin fed from `stdin` -> Run. Never raises."""
    try:
        with Sandboxed(args, timeout, python, full) as p:
            stopped, info = p.pump(stdin), None
            while not stopped and (info := os.waitid(os.P_PID, p.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)) is None \
                    and time.monotonic() < p.deadline:  # its exit, not reaped yet: its process group stays this run's
                time.sleep(0.002)
            returncode = info and (info.si_status if info.si_code == os.CLD_EXITED else -info.si_status)
            return Run(returncode, bytes(p.stdout), bytes(p.stderr), returncode is None and stopped != "overflowed",
                       stopped == "overflowed")
    except Exception as e:  # a sandbox failure is a fail, never a crash of the run
        return Run(None, stderr=f"{type(e).__name__}: {e}".encode())


def _tasks_of(uid):
    """Tasks of a uid: not root, RLIMIT_NPROC counts them all, so the limit is this + PROCESSES (racy, a bound)."""
    tasks = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with suppress(OSError):  # gone meanwhile
            tasks += len(os.listdir(f"/proc/{pid}/task")) if os.stat(f"/proc/{pid}").st_uid == uid else 0
    return tasks

# -----------------------------------------------------------------------------
# tests and verdicts

HARNESS = r"""
import os, sys
requests, replies, null = os.fdopen(os.dup(0), "rb"), os.dup(1), os.open(os.devnull, os.O_RDWR)
os.dup2(null, 0), os.dup2(null, 1), os.dup2(null, 2)  # the program reads and writes nothing; the pipes are the harness's
literals = {"__builtins__": {}, "set": set, "frozenset": frozenset, "inf": float("inf"), "nan": float("nan")}
objects = [{"__name__": "solution"}]  # handle 0: the program's namespace; then every value handed out
exec(compile(sys.argv[1], "solution.py", "exec"), objects[0])
for line in requests:  # ("get", handle, name) or ("call", handle, args, kwargs)
    kind, handle, arg, *kwargs = eval(line, literals)
    try:
        objects.append(value := objects[handle](*arg, **kwargs[0]) if kind == "call" else
                       objects[0][arg] if handle == 0 else getattr(objects[handle], arg))
        reply = f"{len(objects) - 1} {int(callable(value))} {ascii(value)}"
    except Exception as e:
        reply = f"raised {type(e).__name__}"
    os.write(replies, (reply + "\n").encode())
"""


def _value(process, request):
    """A value of the program's, asked of HARNESS -> data as itself, a callable as a function calling it there, another
    object as a Handle whose attributes are fetched there; what it raised is raised here (a builtin Exception)."""
    if process.pump(ascii(request).encode() + b"\n", line=True) or b"\n" not in process.stdout:
        raise ChildProcessError("the program's process died or did not answer in time")
    reply, _, process.stdout[:] = process.stdout.partition(b"\n")
    handle, is_callable, text = (reply.decode() + "  ").split(" ", 2)
    if handle == "raised":  # StopIteration would end the test's map() or generator early, as if all had passed
        error = getattr(builtins, is_callable, None)
        plain = isinstance(error, type) and issubclass(error, Exception) and not issubclass(error, ENDS_ITERATION)
        raise error() if plain else RuntimeError(f"the program raised {is_callable}")
    if is_callable == "1":
        return lambda *args, **kwargs: _value(process, ("call", int(handle), args, kwargs))
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return type("Handle", (), {"__getattr__": lambda _, name: _value(process, ("get", int(handle), name))})()


def as_json(value):  # what JSON makes of a value (tuples -> lists, sets -> sorted lists, int keys -> str)
    return json.loads(json.dumps(value, default=sorted))


def passes(program, tests=(), fn_name=None, test=None, entry_point=None, timeout=TIMEOUT):
    """True when the program passes every test (the module docstring says how each style is judged)."""
    try:
        if not tests and not test:
            return False
        if fn_name is None and test is None:
            runs = (run(["-c", program], t["input"].encode(), timeout) for t in tests)  # lazily: the first fail ends it
            return all(r.returncode == 0 and r.stdout.decode(errors="replace").split() == t["output"].split()
                       for r, t in zip(runs, tests))
        script, names = assert_plan(test, entry_point) if test is not None else (None, ())
        with Sandboxed(["-c", HARNESS, program], timeout) as process:
            if fn_name is not None:
                function = _value(process, ("get", 0, fn_name))
                return all(as_json(function(*t["input"])) == as_json(t["output"]) for t in tests)
            namespace = {}
            for name in names:
                with suppress(KeyError):  # not the program's: the test fails on it
                    namespace[name] = _value(process, ("get", 0, name))
            exec(compile(script, "<test>", "exec", optimize=0), namespace)  # asserts run under python -O too
            return True
    except Exception:  # malformed tests, values that are not literals, a process that died, ...: a fail, never a crash
        return False


ENDS_ITERATION = (StopIteration, StopAsyncIteration)
STDLIB_NAMES = {n for m in ("collections", "fractions", "decimal", "functools") for n in dir(__import__(m))
                if not n.startswith("_")} | {"isclose", "inf", "nan", "pi", "sqrt"}  # a test may mean these, unimported


@lru_cache(maxsize=10_000)
def assert_plan(test, entry_point=None):
    """-> (the script an assert-style test runs, the names the program supplies it), or ValueError (one line) for a
    test that would test nothing of the program. HumanEval's check(candidate) is called with the entry point and
    pytest's test_* functions are called; the program supplies the entry point alone, or (none given) every name the
    test reads but never binds, builtins aside; a standard module or a name it exports must be imported by the test."""
    if entry_point is not None and not (isinstance(entry_point, str) and entry_point.isidentifier()):
        raise ValueError(f"entry_point must be a Python identifier, got {entry_point!r}")
    tree = ast.parse(test)
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    called = {n.id for node in tree.body if node not in functions.values() for n in ast.walk(node)
              if isinstance(n, ast.Name)}
    calls = [f"check({entry_point})"] if "check" in functions and entry_point and "check" not in called else []
    script = "\n".join([test, *calls, *(f"{name}()" for name in functions if name.startswith("test_")
                                          and name not in called)])
    free = _free_names(script)
    if entry_point in _bound_names(script):
        raise ValueError(f"the test defines the entry point {entry_point!r} itself")
    for name in sorted(free - {entry_point}):
        if name in sys.stdlib_module_names:
            raise ValueError(f"the test uses the module {name!r} without importing it")
        if entry_point is not None:
            raise ValueError(f"the test uses {name!r}, which it never binds (only the entry point is the program's)")
        if name in STDLIB_NAMES:
            raise ValueError(f"the test uses {name!r} without importing it (or name the program's in entry_point)")
    names = {entry_point} if entry_point else free
    reached = _reached(ast.parse(script))
    if not names & {n.id for n in reached if isinstance(n, ast.Name)}:
        raise ValueError("the test calls no function of the program: it would pass a program that defines nothing")
    if not any(isinstance(n, (ast.Assert, ast.Raise)) for n in reached):
        raise ValueError("the test asserts nothing")
    return script, tuple(sorted(names))


def _bound_names(code):
    return {s.get_name() for s in symtable.symtable(code, "<test>", "exec").get_symbols()
            if s.is_assigned() or s.is_imported() or s.is_namespace()}


def _free_names(code):
    """The names code reads but never binds, in any of its scopes; builtins aside."""
    tables, read = [symtable.symtable(code, "<test>", "exec")], set()
    top = tables[0]
    while tables:
        table = tables.pop()
        tables += table.get_children()
        read |= {s.get_name() for s in table.get_symbols() if s.is_referenced() and (table is top or s.is_global())}
    return read - _bound_names(code) - set(dir(builtins))


def _reached(tree):
    """The nodes of the code a script runs: its module level, and the top-level functions that code names (called,
    or passed on: check(square) runs check), transitively."""
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    todo, reached, seen = [n for n in tree.body if n not in functions.values()], [], set()
    while todo:
        for node in ast.walk(todo.pop()):
            reached.append(node)
            if isinstance(node, ast.Name) and node.id in functions and node.id not in seen:
                seen.add(node.id)
                todo.append(functions[node.id])
    return reached


_pool = lru_cache(maxsize=None)(lambda workers: ThreadPoolExecutor(workers, thread_name_prefix="sandbox"))


def score_many(jobs, workers=WORKERS):
    """[dict(program=..., tests=..., fn_name=... | test=...), ...] -> bools in order, from a pool working meanwhile."""
    return _pool(workers).map(lambda job: passes(**job), jobs)

# -----------------------------------------------------------------------------
# what isolation took effect here, measured once by running a probe in the sandbox

PROBE = r"""
import json, os, resource
r = dict(uid=os.getuid(), pid=os.getpid(), env=sorted(os.environ), root=sorted(os.listdir("/")), new=[n for n in ns
         if os.readlink("/proc/self/ns/" + n) != ns[n]], oom=open("/proc/self/oom_score_adj").read().strip(),
         limits=[resource.getrlimit(getattr(resource, "RLIMIT_" + n))[0] for n in ("CPU", "AS", "FSIZE", "NOFILE", "NPROC")],
         seccomp=[l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")][0])
print(json.dumps(r))
"""


@lru_cache(maxsize=None)
def isolation():
    """-> what took effect, as a probe in the sandbox saw it: mode "full", or a WARNING and what is missing; python None
    when no interpreter runs there. Not root, it first makes the trainer non-dumpable: programs run as its user."""
    if os.geteuid() != 0:
        _prctl(4, *_ZERO)  # PR_SET_DUMPABLE 0
    ns = {n: os.readlink(f"/proc/self/ns/{n}") for n in ("mnt", "pid", "net", "ipc", "uts", "cgroup")}
    missing = None if os.geteuid() == 0 else f"root (the trainer runs as uid {os.geteuid()})"
    for full in (True, False) if missing is None else (False,):
        for python in dict.fromkeys(filter(None, [getattr(sys, "_base_executable", None), sys.executable,
                                                  shutil.which("python3", path=ENV["PATH"])])):
            result = run(["-c", f"ns = {ns!r}\n" + PROBE], python=python, full=full)
            if result.returncode == 0:
                return _report(python, full, json.loads(result.stdout), missing)
            missing = missing or f"namespaces ({result.stderr.decode(errors='replace').strip()[-200:]})"
    return dict(python=None, error=result.stderr.decode(errors="replace").strip()[-300:])


def _report(python, full, probe, missing):
    (cpu, memory, file_size, files, processes), (_, cgroup, no_cgroup), on = probe["limits"], _worker(), probe["seccomp"]
    return dict(
        python=python, **{} if full else dict(missing=missing), mode="full" if full else "WARNING: partial (see missing)",
        user=f"uid {probe['uid']}" + (" (root!)" if probe["uid"] == 0 else ", one worker's own" if os.geteuid() == 0 else
                                      ": the trainer's own, so it reads and writes what the trainer can"),
        filesystem=f"its own: /{', /'.join(probe['root'])}, read-only but for /tmp, its cwd" if full else "the host's",
        network=("new" if "net" in probe["new"] else "the host's") + " network namespace" + "; sockets denied" * (on == "2"),
        namespaces=", ".join(probe["new"]) or "none new",
        seccomp="filter on (no sockets, signals, ptrace, namespaces, keyring, IPC)" if on == "2" else "off",
        memory=(f"{MEMORY >> 20} MiB for all of a run's processes (cgroup)" if cgroup else f"per process only ({no_cgroup})")
               + f"; oom_score_adj {probe['oom']}", environment=", ".join(probe["env"]),
        limits=f"cpu {cpu} s, address space {memory >> 20} MiB, file size {file_size >> 20} MiB, {files} open files, "
               f"{processes} processes",
        cleanup=("pid 1 of its pid namespace; " if probe["pid"] == 1 else "") + "its process group killed at the end")


def require(unsafe=False):
    """ValueError (one line) unless code rewards run fully isolated here, or WARNING if `unsafe` -> isolation()"""
    report = isolation()
    if report["python"] is None:
        raise ValueError(f"code rewards: no Python interpreter runs in the sandbox: {report['error']}")
    if "missing" in report:
        why = f"the sandbox lacks {report['missing']}, so programs would run as {report['user']}"
        if not unsafe:
            raise ValueError(f"code rewards: {why}; full isolation needs root and namespaces, or set sandbox_unsafe=True "
                             "to run them anyway (README, code rewards)")
        print(f"WARNING: sandbox_unsafe=True: {why}", file=sys.stderr)
    return report
