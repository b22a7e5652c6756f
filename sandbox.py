"""
Runs model-written Python against tests, isolated: the code reward of the math + code runs.

    python benchmarks/sandbox.py     # the isolation in effect here, and programs per second through the pool

Threat model: the program is untrusted, an adversary by accident (infinite loops, fork bombs, huge
allocations or outputs) and, under RL pressure, by design (exiting early, printing what the checker wants,
patching the harness, killing the trainer, reading its secrets, the network). Every run ends by its deadline
in a verdict only a correct program earns, leaves nothing behind, and any failure is a fail (reward -1).

Every process: a fresh temporary directory, its own session, an environment of PATH and LANG, `python -I -S
-B`, limits on CPU, address space, file size, open files, processes and core dumps, no_new_privs, and a
seccomp filter under which socket(), io_uring, the kill family, ptrace and setsid fail. Started as root,
also: a dedicated unprivileged uid per worker thread (claimed machine-wide with a lock file), and new network
(loopback, down), mount (fresh tmpfs at /tmp and /dev/shm, its own /proc) and pid namespaces: the program is
pid 1 there, so every process it left dies with it. At the deadline, or past OUTPUT_CAP of output, every
process of the uid (else: the process group) is killed. isolation() reports what took effect.

Verdicts. stdin/stdout: one process per test; a pass needs exit code 0 in time and the expected output,
whitespace-normalised. Call-style tests and `assert EXPR == LITERAL` lines: a harness writes each value as
JSON to the stdout it saved before the program ran, compared here, in the parent, so the expected values
never enter the sandbox. Other asserts: the harness runs them after the program, then writes a per-run
random token; a program that inspects the harness (sys._getframe, gc) can find it: prefer the other forms.
"""
import ast
import ctypes
import errno
import fcntl
import json
import math
import os
import platform
import pwd
import resource
import secrets
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache, partial

TIMEOUT = 5.0             # wall seconds per process (ours; LiveCodeBench-style graders allow ~6 s a test)
MEMORY = 1 << 30          # address space, bytes
FILE_SIZE = 10 << 20      # the largest file it may write, bytes
OUTPUT_CAP = 1 << 20      # stdout and stderr, bytes each; more is a fail
OPEN_FILES = 64
PROCESSES = 32            # processes + threads of the sandbox uid
TMPFS = b"size=64m,nr_inodes=4096,mode=1777"  # the fresh /tmp and /dev/shm (mount namespace)
FIRST_UID = 59000         # root only: worker k runs as the first free uid >= this with no passwd entry
WORKERS = os.cpu_count() or 2
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}

# -----------------------------------------------------------------------------
# entering the sandbox: runs in the child between fork and exec (no imports, no locks)

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 0x40000
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
#          audit arch, [socket, kill, tkill, tgkill, ptrace, setsid, setpgid, pidfd_send_signal, io_uring_setup]
SYSCALLS = {"x86_64": (0xC000003E, [41, 62, 200, 234, 101, 112, 109, 424, 425]),
            "aarch64": (0xC00000B7, [198, 129, 130, 131, 117, 157, 154, 424, 425])}


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _seccomp_program():
    """Classic BPF: the syscalls above fail with EPERM, and so does every syscall of another ABI
    (x32, i386), whose numbers differ. None on other machines (then: no filter, and it is reported)."""
    if platform.machine() not in SYSCALLS:
        return None
    arch, denied = SYSCALLS[platform.machine()]
    deny, allow = 0x00050000 | errno.EPERM, 0x7FFF0000  # SECCOMP_RET_ERRNO | EPERM, SECCOMP_RET_ALLOW
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    jumps = [(jge, 0x40000000)] + [(jeq, nr) for nr in denied]  # each jumps to the final deny
    code = [(load, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, deny), (load, 0, 0, 0)]
    code += [(op, len(jumps) - i, 0, k) for i, (op, k) in enumerate(jumps)] + [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    buffer = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *c) for c in code))
    program = _SockFprog(len(code), ctypes.addressof(buffer))
    return program, buffer, ctypes.byref(program)  # the buffer kept alive; the reference made here, not in the child


_SECCOMP = _seccomp_program()
_PRCTL_ARGS, _MODE_FILTER = tuple(map(ctypes.c_ulong, (1, 0, 0, 0))), ctypes.c_ulong(SECCOMP_MODE_FILTER)


def _enter(uid, run_dir, cpu_seconds, nproc):
    """Namespaces while root, the uid, no_new_privs, seccomp, the limits. A namespace the kernel refuses is
    skipped (isolation() reports it); a failed setuid raises: the program never runs."""
    if uid is not None:
        _libc.unshare(CLONE_NEWNET)
        new_mounts = _libc.unshare(CLONE_NEWNS) == 0 and _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0
        if new_mounts:
            for path in (b"/tmp", b"/dev/shm"):
                _libc.mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, TMPFS)
            os.makedirs(run_dir, 0o700, exist_ok=True)  # hidden by the new /tmp: make it again there
            os.chown(run_dir, uid, uid)
            os.chdir(run_dir)
        if _libc.unshare(CLONE_NEWPID) == 0:
            _become_pid_1()
            if new_mounts:  # a /proc that shows only the sandbox's processes
                _libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    _libc.prctl(PR_SET_NO_NEW_PRIVS, *_PRCTL_ARGS)
    if _SECCOMP:
        _libc.prctl(PR_SET_SECCOMP, _MODE_FILTER, _SECCOMP[2])
    for limit, value in ((resource.RLIMIT_CPU, cpu_seconds), (resource.RLIMIT_FSIZE, FILE_SIZE),
                         (resource.RLIMIT_NOFILE, OPEN_FILES), (resource.RLIMIT_NPROC, nproc),
                         (resource.RLIMIT_CORE, 0), (resource.RLIMIT_AS, MEMORY)):  # last: a big parent's
        resource.setrlimit(limit, (value, value))                                # child allocates nothing after it


def _become_pid_1():
    """After unshare(CLONE_NEWPID) the child execs the program as pid 1: when it dies, the kernel kills every
    process left in there. This process stays outside as root, reaps it and exits with its status."""
    pid = os.fork()
    if pid == 0:
        return
    os.closerange(0, 1 << 16)  # no copy of the pipes: the parent sees EOF and exec errors as usual
    status = os.waitpid(pid, 0)[1]
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))

# -----------------------------------------------------------------------------
# one sandboxed process

_slot = threading.local()


def _worker_uid():
    """This thread's uid (root only), claimed machine-wide by an flock that dies with the process."""
    if os.geteuid() != 0:
        return None
    if not hasattr(_slot, "uid"):
        for uid in range(FIRST_UID, FIRST_UID + 10_000):
            try:
                pwd.getpwuid(uid)
                continue  # a real account: never ours
            except KeyError:
                pass
            fd = os.open(f"/tmp/scalerl-sandbox-{uid}.lock", os.O_CREAT | os.O_RDWR, 0o600)  # one place for all runs
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            _slot.uid, _slot.lock = uid, fd
            break
    return _slot.uid


def _kill_all(proc, uid):
    """SIGKILL every process of the sandbox uid (a kill(-1) sent as that uid), then the process group (all there
    is without a uid). The leader is reaped only then, so the group's id cannot have been reused."""
    if uid is not None:
        subprocess.run([shutil.which("kill") or "/bin/kill", "-9", "-1"], user=uid, group=uid, extra_groups=[],
                       env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(1)
        except subprocess.TimeoutExpired:
            pass
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


@dataclass
class Run:
    returncode: int | None  # None: it never ran, or was killed at the deadline or past the output cap
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False
    overflowed: bool = False


def run(args, stdin=b"", timeout=TIMEOUT, python=None):
    """`python -I -S -B *args` once in the sandbox, stdin fed from `stdin` -> Run. Never raises."""
    python = python or isolation()["python"]
    if python is None:
        return Run(None, stderr=b"no Python interpreter runs in the sandbox (see isolation())")
    uid, run_dir, proc = _worker_uid(), tempfile.mkdtemp(prefix="sandbox-"), None
    try:
        nproc = PROCESSES if uid is not None else _tasks_of(os.getuid()) + PROCESSES
        if uid is not None:
            os.chown(run_dir, uid, uid)
        with tempfile.TemporaryFile() as stdin_file:  # unlinked: nothing to find or tamper with later
            stdin_file.write(stdin)
            stdin_file.seek(0)
            proc = subprocess.Popen([python, "-I", "-S", "-B", *args], stdin=stdin_file, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, cwd=run_dir, env=ENV, start_new_session=True,
                                    preexec_fn=partial(_enter, uid, run_dir, math.ceil(timeout) + 1, nproc))
        return _collect(proc, time.monotonic() + timeout)
    except Exception as e:  # a sandbox failure is a fail, never a crash of the run
        return Run(None, stderr=f"{type(e).__name__}: {e}".encode())
    finally:
        if proc is not None:
            _kill_all(proc, uid)
            proc.stdout.close(), proc.stderr.close()
        shutil.rmtree(run_dir, ignore_errors=True)


def _collect(proc, deadline):
    """Read stdout and stderr (bounded) until both close and the process exits, or the deadline."""
    output = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    with selectors.DefaultSelector() as selector:
        for fd in output:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            if time.monotonic() > deadline:
                return Run(None, *(b"".join(v) for v in output.values()), timed_out=True)
            for key, _ in selector.select(deadline - time.monotonic()):
                chunk = os.read(key.fd, 1 << 16)
                output[key.fd].append(chunk)
                if not chunk:
                    selector.unregister(key.fd)
                elif sum(map(len, output[key.fd])) > OUTPUT_CAP:
                    return Run(None, *(b"".join(v) for v in output.values()), overflowed=True)
    stdout, stderr = (b"".join(v) for v in output.values())
    while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:  # exited, not reaped
        if time.monotonic() > deadline:
            return Run(None, stdout, stderr, timed_out=True)
        time.sleep(0.002)
    return Run(proc.wait(), stdout, stderr)


def _tasks_of(uid):
    """Tasks of a uid: not root, RLIMIT_NPROC counts them all, so the limit is this + PROCESSES (racy, a bound)."""
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            count += len(os.listdir(f"/proc/{pid}/task")) if os.stat(f"/proc/{pid}").st_uid == uid else 0
        except OSError:
            pass  # gone meanwhile
    return count

# -----------------------------------------------------------------------------
# tests and verdicts

HARNESS = r"""
def harness():  # everything it needs is bound to its locals before the program runs
    import json, os, sys
    job = json.loads(sys.stdin.read())
    write, exit, run, evaluate, dumps = os.write, os._exit, exec, eval, json.dumps
    out = os.dup(1)  # the real stdout; the program's own output goes to /dev/null
    os.dup2(os.open(os.devnull, os.O_RDWR), 0), os.dup2(0, 1)
    program = compile(job["program"], "solution.py", "exec")
    exprs = [compile(e, "<test>", "eval") for e in job["exprs"]]
    test = compile(job["test"], "<test>", "exec") if job["test"] else None
    token, namespace = job.pop("token").encode(), {"__name__": "solution", "__builtins__": __builtins__}
    del job
    try:
        run(program, namespace)
        for expr in exprs:  # values go to the parent, which compares them with the expected ones
            write(out, (dumps(evaluate(expr, namespace), default=sorted) + "\n").encode())
        if test is not None:
            run(test, namespace)
            write(out, token + b"\n")
    except BaseException:
        exit(1)
    exit(0)
harness()
"""


def literal_asserts(test):
    """`assert EXPR == LITERAL` statements -> [(EXPR, value)], or None if the test has any other statement."""
    try:
        statements = ast.parse(test).body
        checks = []
        for s in statements:
            compare = s.test if isinstance(s, ast.Assert) and s.msg is None else None
            if not (isinstance(compare, ast.Compare) and len(compare.ops) == 1 and isinstance(compare.ops[0], ast.Eq)):
                return None
            checks.append((ast.unparse(compare.left), ast.literal_eval(compare.comparators[0])))
        return checks or None
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None


def as_json(value):
    """What the harness's JSON makes of a value (tuples -> lists, sets -> sorted lists, int keys -> str)."""
    return json.loads(json.dumps(value, default=sorted))


def passes(program, tests=(), fn_name=None, test=None, timeout=TIMEOUT):
    """True when the program passes every test (the module docstring says how each style is judged)."""
    try:
        if not tests and not test:
            return False
        if fn_name is None and test is None:
            for t in tests:
                result = run(["-c", program], t["input"].encode(), timeout)
                if result.returncode != 0 or result.stdout.decode(errors="replace").split() != t["output"].split():
                    return False
            return True
        checks = [(f"{fn_name}(*{t['input']!r})", t["output"]) for t in tests] if fn_name else literal_asserts(test)
        token = "" if checks is not None else secrets.token_hex(16)
        job = dict(program=program, exprs=[e for e, _ in checks or []], test=test if token else "", token=token)
        result = run(["-c", HARNESS], json.dumps(job).encode(), timeout)
        if result.returncode != 0:
            return False
        if token:
            return result.stdout == token.encode() + b"\n"
        lines = result.stdout.decode(errors="replace").splitlines()
        return len(lines) == len(checks) and all(json.loads(line) == as_json(v) for line, (_, v) in zip(lines, checks))
    except Exception:  # malformed tests, unserialisable values, ...: a fail, never a crash
        return False


@lru_cache(maxsize=None)
def _pool(workers):
    return ThreadPoolExecutor(workers, thread_name_prefix="sandbox")


def score_many(jobs, workers=WORKERS):
    """[dict(program=..., tests=..., fn_name=... | test=...), ...] -> an iterator of bools in the jobs' order, all
    queued at once on a pool of `workers` threads; reading a result waits for it (the caller works meanwhile)."""
    return _pool(workers).map(lambda job: passes(**job), jobs)

# -----------------------------------------------------------------------------
# what isolation took effect here, measured once by running a probe in the sandbox

PROBE = r"""
import json, os, resource, socket
r = dict(uid=os.getuid(), pid=os.getpid(), env=sorted(os.environ), net=os.readlink("/proc/self/ns/net"), mnt=os.readlink("/proc/self/ns/mnt"),
         limits=[resource.getrlimit(getattr(resource, "RLIMIT_" + n))[0] for n in ("CPU", "AS", "FSIZE", "NOFILE", "NPROC")],
         tmp=[l.split()[2] for l in open("/proc/self/mounts") if l.split()[1] == "/tmp"][-1:] or ["the host's"],
         seccomp=[l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")][0])
try:
    socket.socket().connect(("127.0.0.1", 9))
except OSError as e:
    r["socket"] = e.strerror
print(json.dumps(r))
"""


@lru_cache(maxsize=None)
def isolation():
    """-> the interpreter and the isolation that took effect, as strings, as a probe program in the sandbox saw
    it; python None when no interpreter runs there (a venv under /root is unreadable): every program fails."""
    candidates = dict.fromkeys(filter(None, [sys.executable, getattr(sys, "_base_executable", None),
                                             shutil.which("python3", path=ENV["PATH"])]))
    for python in candidates:
        result = run(["-c", PROBE], timeout=TIMEOUT, python=python)
        if result.returncode == 0:
            break
    else:
        return dict(python=None, error=result.stderr.decode(errors="replace").strip()[-300:])
    probe = json.loads(result.stdout)
    cpu, memory, file_size, files, processes = probe["limits"]
    dedicated = os.geteuid() == 0 and probe["uid"] != 0
    new_net, new_mnt = (probe[ns] != os.readlink(f"/proc/self/ns/{ns}") for ns in ("net", "mnt"))
    return dict(
        python=python,
        user=f"uid {probe['uid']}" + (" (root!)" if probe["uid"] == 0 else ", dedicated to one worker" if dedicated
                                      else ": the caller's own, so it can read and write what the caller can"),
        network=("new network namespace" if new_net else "the host's network namespace")
                + f"; connecting to 127.0.0.1: {probe.get('socket', 'connected!')}",
        seccomp={"2": "filter on (no sockets, kill, ptrace, setsid, io_uring)", "0": "off"}.get(probe["seccomp"], probe["seccomp"]),
        filesystem=f"cwd a fresh private directory; /tmp: {probe['tmp'][0]}" + (" (new mount namespace)" if new_mnt else ""),
        limits=f"cpu {cpu} s, address space {memory >> 20} MiB, file size {file_size >> 20} MiB, {files} open files, "
               f"{processes} processes",
        environment=", ".join(probe["env"]),
        cleanup=("new pid namespace: all its processes die with the program; " if probe["pid"] == 1 else "")
                + ("every process of the uid, then " if dedicated else "") + "the process group")
