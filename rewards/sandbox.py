"""Runs model-written Python isolated, for the code reward (verdicts: judge.py; docs/rewards.md,
"Code rewards").
The program is an adversary: fork bombs, huge outputs, reading the answers, forging the verdict, persisting.

    python benchmarks/sandbox.py    # the isolation in effect here, and programs per second through the pool
"""
import ast
import atexit
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
import sys
import tempfile
import threading
import time
from collections import namedtuple
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
# entering the sandbox: a fresh interpreter (_START) enters it, then execs the program. The trainer is
# never forked: a fork write-protects all its pages (a 15 GiB trainer's fork and the first write to each
# page after it cost more than the program), and vfork, which does not, runs nothing before the exec

_libc = ctypes.CDLL(None, use_errno=True)
_mount, _umount2, _unshare = _libc.mount, _libc.umount2, _libc.unshare
_prctl, _syscall = _libc.prctl, _libc.syscall
_ONE, _ZERO = [ctypes.c_ulong(v) for v in (1, 0, 0, 0)], [ctypes.c_ulong(0)] * 4  # prctl's unsigned longs
# mount, cgroup, UTS, IPC, pid, net
NAMESPACES = 0x20000 | 0x2000000 | 0x4000000 | 0x8000000 | 0x20000000 | 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 0x4000, 0x40000
READ_ONLY = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
MACHINE = os.uname().machine
# audit arch, pivot_root, [denied: socket, kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo,
# pidfd_send_signal, ptrace, process_vm_readv, process_vm_writev, pidfd_getfd, process_madvise, setsid,
# setpgid, unshare, setns, add_key, request_key, keyctl, shmget, semget, msgget, mq_open, bpf,
# perf_event_open, userfaultfd, io_uring_setup, setpriority, ioprio_set, flock, inotify_init1,
# inotify_add_watch, fanotify_init, fanotify_mark(, inotify_init)], [pid 0 only: prlimit64,
# sched_setaffinity, sched_setscheduler, sched_setparam, sched_setattr, migrate_pages, move_pages],
# clone3, clone, fcntl, ioctl. Locks, leases and watches on the files every run shares would be a
# channel between runs (fcntl's commands denied below).
SYSCALLS = {
    "x86_64": (0xC000003E, 155, [41, 62, 200, 234, 129, 297, 424, 101, 310, 311, 438, 440, 112, 109, 272,
                                 308, 248, 249, 250, 29, 64, 68, 240, 321, 298, 323, 425, 141, 251, 73, 294,
                                 254, 300, 301, 253], [302, 203, 144, 142, 314, 256, 279], 435, 56, 72, 16),
    "aarch64": (0xC00000B7, 41, [198, 129, 130, 131, 138, 240, 424, 117, 270, 271, 438, 440, 157, 154, 97,
                                 268, 217, 218, 219, 194, 190, 186, 180, 280, 241, 282, 425, 140, 30, 32, 26,
                                 27, 262, 263], [261, 122, 119, 118, 274, 238, 239], 435, 220, 25, 29)}


def _seccomp_program(arch, _, denied, own, clone3, clone, fcntl_, ioctl):
    """-> (a classic BPF filter, its sock_fprog) from one machine's SYSCALLS (None elsewhere: no filter)."""
    # BPF_LD|W|ABS, BPF_JMP|JEQ|K, |JGE|K, |JSET|K, BPF_RET|K
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow = (ret, 0x7FFF0000)
    # loads from seccomp_data: nr at 0, arch at 4, argument i's low word at 16 + 8 i. Denied: every syscall of
    # another ABI (x32, i386); clone3: ENOSYS, so libc falls back to clone (clone3's flags are unreadable)
    code = [(ld, 4), (jeq, arch, None, "no"), (ld, 0), (jge, 0x40000000, "no"),
            *[(jeq, n, "no") for n in denied], *[(jeq, n, "own") for n in own], (jeq, clone3, "nosys"),
            (jeq, clone, "clone"), (jeq, fcntl_, "fcntl"), (jeq, ioctl, "ioctl"), allow,
            "clone", (ld, 16), (jset, NAMESPACES | 0x10000000 | 0x8000, "no"), allow,
            # F_SETOWN, F_SETSIG, F_SETOWN_EX; F_SETLK(W), F_OFD_SETLK(W), F_SETLEASE, F_NOTIFY (record locks,
            # leases and directory watches)
            "fcntl", (ld, 24), *[(jeq, c, "no") for c in (8, 10, 15, 6, 7, 37, 38, 1024, 1026)], allow,
            "ioctl", (ld, 24), (jeq, 0x8901, "no"), (jeq, 0x8902, "no"), allow,
            "own", (ld, 16), (jeq, 0, None, "no"), allow, "no", (ret, 0x50001), "nosys", (ret, 0x50026)]
    at = {c: sum(not isinstance(d, str) for d in code[:i]) for i, c in enumerate(code) if isinstance(c, str)}
    insns = [(*c, None, None)[:4] for c in code if not isinstance(c, str)]
    jump = lambda label, i: at[label] - i - 1 if label else 0  # relative to the next instruction
    buffer = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", op, jump(jt, i), jump(jf, i), k)
                                                  for i, (op, k, jt, jf) in enumerate(insns)))
    return buffer, ctypes.create_string_buffer(struct.pack("HP", len(insns), ctypes.addressof(buffer)))


_SECCOMP = _seccomp_program(*SYSCALLS[MACHINE]) if MACHINE in SYSCALLS else None


def _check(result, what):
    if result != 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


def _write(path, data):
    with open(path, "wb", buffering=0) as f:
        f.write(data)


_START = "import sys; sys.path.append(sys.argv[1]); import sandbox; sandbox._start(*sys.argv[2:])"


def _start(spec, *args):
    """_START's: enters the sandbox as `spec` says, then execs `python -I -S -B *args`; or exits 126."""
    _enter(*ast.literal_eval(spec))
    try:
        os.execv(sys.executable, [sys.executable, "-I", "-S", "-B", *args])
    except OSError as e:
        os.write(2, f"sandbox: {e}\n".encode())
        os._exit(126)


def _enter(uid, cgroup, root, plan, cpu_seconds, nproc):
    """oom_score_adj, cgroup, namespaces and root (full), uid, no_new_privs, seccomp, rlimits; or exit 126."""
    try:
        # PR_SET_DUMPABLE, as exec would: a non-dumpable trainer's child cannot write its /proc
        _prctl(4, *_ONE)
        _write(b"/proc/self/oom_score_adj", b"1000")
        if cgroup:  # before anything is allocated
            _write(cgroup + b"/cgroup.procs", b"0")
        if root:
            _enter_namespaces(root, plan)
        if uid >= 0:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        _check(_prctl(38, *_ONE), "no_new_privs")  # PR_SET_NO_NEW_PRIVS
        # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        _check(_prctl(22, ctypes.c_ulong(2), _SECCOMP[1]) if _SECCOMP else 0, "seccomp")
        # AS last
        limits = dict(CPU=cpu_seconds, FSIZE=FILE_SIZE, NOFILE=OPEN_FILES, NPROC=nproc, CORE=0, AS=MEMORY)
        for name, value in limits.items():
            resource.setrlimit(getattr(resource, "RLIMIT_" + name), (value, value))
    except BaseException as e:
        os.write(2, f"sandbox: {e}\n".encode())
        os._exit(126)


def _enter_namespaces(root, plan):
    """New namespaces; returns as pid 1 of the new pid namespace, in the private root built at `root`."""
    _check(_unshare(NAMESPACES), "unshare")
    # nothing propagates to the host
    _check(_mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount")
    # returns in a child, which execs the program as pid 1; this process, outside, exits as pid 1 did. At pid
    # 1's exit, or the parent's SIGTERM, it kills pid 1 (its pid namespace dies with it) and reaps it
    signal.pthread_sigmask(signal.SIG_BLOCK, signals := {signal.SIGCHLD, signal.SIGTERM})  # for sigwaitinfo
    if (pid := os.fork()) != 0:
        os.closerange(0, 1 << 16)  # no copy of the pipes: the parent sees EOF and exec errors as usual
        signal.sigwaitinfo(signals)
        os.kill(pid, signal.SIGKILL)  # not reaped yet, so still pid 1's pid
        # exits as pid 1 did: its status, or 128 + N where signal N killed it (waitstatus_to_exitcode: -N)
        os._exit(code if (code := os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])) >= 0 else 128 - code)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
    # the private root at `root` (plan: _root_plan), made / with the host's dropped
    for kind, path, arg in plan:
        here = root + path
        if kind == "dir":
            os.mkdir(here, 0o755)
        elif kind == "link":
            os.symlink(arg, here)
        elif kind == "mount":  # arg: (type, flags, options)
            _check(_mount(arg[0], here, *arg), "mount " + os.fsdecode(path))
        else:  # "bind" (read-only) or "dev" (a device: read-write, and not nodev); arg: a directory
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
    """`python`'s private root as steps (kind, path, arg): the interpreter, its sys.path, their libraries."""
    query = ("import json, sys, sysconfig as s\n"
             "print(json.dumps([sys.executable, sys.path, s.get_path('purelib'), s.get_path('platlib')]))")
    found = subprocess.run([python, "-I", "-S", "-c", query], capture_output=True, env=ENV)
    executable, path, *packages = json.loads(found.stdout)
    path = sorted(p for p in path if os.path.exists(p))  # a directory before what it holds
    modules = [f"{p}/{f}" for p in path if os.path.isdir(p) for f in os.listdir(p) if f.endswith(".so")]
    ldd = subprocess.run(["ldd", executable, *modules], capture_output=True, text=True, env=ENV)
    plan = [("mount", b"", (b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,nr_inodes=1024,mode=755")),
            *[("dir", b"/" + d, None) for d in (b"dev", b"proc", b"tmp")], ("link", b"/dev/shm", b"/tmp"),
            *[("dev", b"/dev/" + d, False) for d in (b"null", b"zero", b"urandom")],
            *[("link", b"/dev/" + d, b"/proc/self/fd" + n)
              for d, n in ((b"fd", b""), (b"stdin", b"/0"), (b"stdout", b"/1"), (b"stderr", b"/2"))]]
    made = {os.fsdecode(p): kind for kind, p, _ in plan}
    # each path (ldd's, not its "(0x...)" or "file:") made to resolve as on the host: its directories, its
    # symlinks (followed from where they point), then a bind of what it names (unless a directory above is)
    for p in [*path, executable, *(w for w in ldd.stdout.split() if w[0] == "/" and w[-1] != ":")]:
        parts, here = p.strip("/").split("/"), ""
        while parts and made.get(here) != "bind":
            here += "/" + parts.pop(0)
            link = os.readlink(here) if os.path.islink(here) else None
            if here not in made:
                made[here] = kind = "link" if link else "dir" if parts else "bind"
                plan.append((kind, os.fsencode(here), os.fsencode(link) if link else os.path.isdir(here)))
            if link:
                parts, here = os.path.normpath(os.path.join(here, "..", link)).split("/")[1:] + parts, ""
    bound = [p for p, kind in made.items() if kind == "bind"]
    # the site-packages under what is bound, hidden by an empty tmpfs
    hidden = [("mount", os.fsencode(p), (b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, b"size=4k"))
              for p in set(packages) if os.path.isdir(p) and any(p.startswith(b + "/") for b in bound)]
    return plan + hidden + [("mount", b"/proc", (b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)),
                            ("mount", b"/tmp", (b"tmpfs", MS_NOSUID | MS_NODEV, TMPFS))]

# -----------------------------------------------------------------------------
# one sandboxed process

_slot = threading.local()


def _worker():
    """This thread's (uid no other worker holds, memory cgroup or None, why none); not root: uid -1."""
    if os.geteuid() != 0:  # programs run as our user
        undumpable()
        return -1, None, "not root"
    if not hasattr(_slot, "uid"):
        for uid in range(FIRST_UID, FIRST_UID + 10_000):
            with suppress(KeyError):
                pwd.getpwuid(uid)
                continue  # a real account: never ours
            # one place for all the trainers of this machine
            _slot.lock = os.open(f"/tmp/scalerl-sandbox-{uid}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            with suppress(BlockingIOError):
                fcntl.flock(_slot.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            os.close(_slot.lock)
        # its memory cgroup: a child of ours (v1; v2 if delegated) holding MEMORY
        try:
            lines = [line.rstrip("\n").split(":", 2) for line in open("/proc/self/cgroup")]
            v1 = [f"/sys/fs/cgroup/memory{path}" for _, kinds, path in lines if "memory" in kinds.split(",")]
            unified = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
            v2 = [f"/sys/fs/cgroup{path}" for n, _, path in lines if n == "0" and unified]
            group = os.path.join((v1 or v2)[0], f"scalerl-sandbox-{uid}")
            os.makedirs(group, exist_ok=True)
            atexit.register(shutil.rmtree, group, True)  # an rmdir: its files go with it, errors are ignored
            _write(group + ("/memory.limit_in_bytes" if v1 else "/memory.max"), str(MEMORY).encode())
            _slot.cgroup = os.fsencode(group), None
        except (OSError, IndexError) as e:
            _slot.cgroup = None, f"no writable memory cgroup: {e!r}"
        _slot.uid = uid
    return (_slot.uid, *_slot.cgroup)


def undumpable():
    """PR_SET_DUMPABLE 0: a program run as our user (no root) cannot read our memory or /proc files."""
    _prctl(4, *_ZERO)


Run = namedtuple("Run", "returncode stdout stderr timed_out overflowed", defaults=(b"", b"", False, False))
# returncode None: it never ran, or was killed at the deadline (timed_out) or past the output cap (overflowed)


class Pipes:
    """A process's stdin (a file to write), stdout and stderr (files to read, or None) and a deadline
    (time.monotonic(): one clock for all processes of the machine); pump() feeds and reads them."""

    cap = OUTPUT_CAP  # bytes a stream may hold unread: more is a fail

    def __init__(self, stdin, stdout, stderr, deadline):
        self.stdin, self.deadline = stdin, deadline
        self.stdout, self.stderr = bytearray(), bytearray()
        # the streams still open
        streams = ((stdout, self.stdout), (stderr, self.stderr))
        self.reading = {f: buffer for f, buffer in streams if f}

    def pump(self, data=b"", line=False):
        """Feed `data` to stdin, reading stdout and stderr, until stdout holds a line (line) or all close."""
        data, stdin = memoryview(data), self.stdin
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
                        # at most PIPE_BUF bytes: one free slot of the pipe, which select promised, takes them
                        written = len(data)  # BrokenPipeError: it stopped reading, what it wrote is judged
                        with suppress(BrokenPipeError):
                            written = os.write(key.fd, data[:4096])
                        if not (data := data[written:]):
                            selector.unregister(stdin)
                    elif chunk := os.read(key.fd, 1 << 16):
                        self.reading[key.fileobj] += chunk
                        if len(self.reading[key.fileobj]) > self.cap:
                            return "overflowed"
                    else:
                        selector.unregister(key.fileobj)
                        del self.reading[key.fileobj]


class Sandboxed(Pipes, AbstractContextManager):
    """`python -I -S -B *args` in the sandbox; leaving the context kills all it started and cleans up."""

    def __init__(self, args, timeout=TIMEOUT, python=None, full=None):
        report = isolation() if python is None else dict(python=python)
        if (python := report["python"]) is None:
            raise ChildProcessError("no Python interpreter runs in the sandbox (see isolation())")
        self.full = report.get("mode") == "full" if full is None else full
        uid, cgroup, _ = _worker()
        # full isolation: the run directory is where its root is mounted
        self.run_dir = tempfile.mkdtemp(prefix="sandbox-")
        try:
            os.chown(self.run_dir, uid, uid)  # -1: unchanged
            root = (os.fsencode(self.run_dir), _root_plan(python)) if self.full else (None, None)
            # not root, the program runs as us, and RLIMIT_NPROC counts all our tasks
            nproc = PROCESSES if uid >= 0 else _tasks_of(os.getuid()) + PROCESSES
            spec = repr((uid, cgroup, *root, int(timeout) + 1, nproc))
            here = os.path.dirname(os.path.abspath(__file__))
            self.proc = subprocess.Popen(
                [python, "-I", "-S", "-c", _START, here, spec, *args], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=self.run_dir, env=ENV, umask=0o022,
                start_new_session=True)
        except BaseException:  # nothing started
            shutil.rmtree(self.run_dir, ignore_errors=True)
            raise
        deadline = time.monotonic() + timeout
        super().__init__(self.proc.stdin, self.proc.stdout, self.proc.stderr, deadline)

    def __exit__(self, *_):
        # not reaped yet, so its pid and process group are this run's. Full isolation: its helper kills
        # pid 1, reaps it once its namespace is empty and exits; else, the group is killed
        with self.proc, suppress(OSError):  # then Popen's exit closes the pipes and reaps it
            self.proc.terminate() if self.full else os.killpg(self.proc.pid, signal.SIGKILL)
        shutil.rmtree(self.run_dir, ignore_errors=True)


def run(args, stdin=b"", timeout=TIMEOUT, python=None, full=None):
    """`python -I -S -B *args` once in the sandbox, stdin fed from `stdin` -> Run. Never raises."""
    try:
        with Sandboxed(args, timeout, python, full) as p:
            stopped, info = p.pump(stdin), None
            # its exit, not reaped yet (WNOWAIT): its process group stays this run's
            exited = partial(os.waitid, os.P_PID, p.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            while not stopped and (info := exited()) is None and time.monotonic() < p.deadline:
                time.sleep(0.002)
            returncode = info and (info.si_status if info.si_code == os.CLD_EXITED else -info.si_status)
            return Run(returncode, bytes(p.stdout), bytes(p.stderr),
                       returncode is None and stopped != "overflowed", stopped == "overflowed")
    except Exception as e:  # a sandbox failure is a fail, never a crash of the run
        return Run(None, stderr=f"{type(e).__name__}: {e}".encode())


def _tasks_of(uid):
    """The processes + threads of `uid` (racy: a bound)."""
    tasks = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with suppress(OSError):  # gone meanwhile
            tasks += len(os.listdir(f"/proc/{pid}/task")) if os.stat(f"/proc/{pid}").st_uid == uid else 0
    return tasks

# -----------------------------------------------------------------------------
# what isolation took effect here, measured once by running a probe in the sandbox

PROBE = r"""import json, os, resource
limits = [resource.getrlimit(vars(resource)["RLIMIT_" + n])[0] for n in "CPU AS FSIZE NOFILE NPROC".split()]
print(json.dumps(dict(uid=os.getuid(), pid=os.getpid(), oom=open("/proc/self/oom_score_adj").read().strip(),
    env=", ".join(sorted(os.environ)), root=", /".join(sorted(os.listdir("/"))), limits=limits,
    new=[n for n in ns if os.readlink("/proc/self/ns/" + n) != ns[n]],
    seccomp=[l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")][0] == "2")))"""


@lru_cache(maxsize=None)
def isolation():
    """-> what took effect as a probe in the sandbox saw it: mode "full", or a WARNING and what is missing."""
    ns = {n: os.readlink(f"/proc/self/ns/{n}") for n in ("mnt", "pid", "net", "ipc", "uts", "cgroup")}
    missing = None if os.geteuid() == 0 else f"root (the trainer runs as uid {os.geteuid()})"
    pythons = [getattr(sys, "_base_executable", None), sys.executable]
    for full in (True, False) if missing is None else (False,):
        for python in dict.fromkeys(filter(None, [*pythons, shutil.which("python3", path=ENV["PATH"])])):
            if (result := run(["-c", f"ns = {ns!r}\n" + PROBE], python=python, full=full)).returncode == 0:
                return _report(python, full, missing, _worker()[2], **json.loads(result.stdout))
            missing = missing or f"namespaces ({result.stderr.decode(errors='replace').strip()[-200:]})"
    return dict(python=None, error=result.stderr.decode(errors="replace").strip()[-300:])


# from uid on, what the probe saw (PROBE's fields); no_cgroup: why a run has no memory cgroup, or None
def _report(python, full, missing, no_cgroup, uid, pid, oom, env, root, limits, new, seccomp):
    cpu, memory, file_size, files, processes = limits
    whose = (" (root!)" if uid == 0 else ", one worker's own" if os.geteuid() == 0 else
             ": the trainer's own, so it reads and writes what the trainer can")
    return dict(
        python=python, **{} if full else dict(missing=missing),
        mode="full" if full else "WARNING: partial (see missing)", user=f"uid {uid}{whose}",
        filesystem=f"its own: /{root}, read-only but for /tmp, its cwd" if full else "the host's",
        network=("new" if "net" in new else "the host's") + " network namespace"
                + "; sockets denied" * seccomp, namespaces=", ".join(new) or "none new",
        seccomp="filter on (no sockets, signals, ptrace, namespaces, keyring, IPC)" if seccomp else "off",
        memory=(f"{MEMORY >> 20} MiB for all of a run's processes (cgroup)" if no_cgroup is None
                else f"per process only ({no_cgroup})") + f"; oom_score_adj {oom}", environment=env,
        limits=f"cpu {cpu} s, address space {memory >> 20} MiB, file size {file_size >> 20} MiB, "
               f"{files} open files, {processes} processes",
        cleanup="pid 1 of its pid namespace; " * (pid == 1) + "its process group killed at the end")


def require(unsafe=False):
    """-> isolation(); ValueError (one line) unless fully isolated here, or a WARNING if `unsafe`."""
    if (report := isolation())["python"] is None:
        raise ValueError(f"code rewards: no Python interpreter runs in the sandbox: {report['error']}")
    if "missing" in report:
        why = f"the sandbox lacks {report['missing']}, so programs would run as {report['user']}"
        if not unsafe:
            raise ValueError(f"code rewards: {why}; full isolation needs root and namespaces, or set "
                             "sandbox_unsafe=True to run them anyway (docs/rewards.md, Code rewards)")
        print(f"WARNING: sandbox_unsafe=True: {why}", file=sys.stderr)
    return report
