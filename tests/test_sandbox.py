"""rewards/sandbox.py: a program isolated (its deadline, memory, files, environment, network, signals,
output), and against an attacker: as root, and as an unprivileged trainer. The programs: tests/attacks.py.

Run alone: `python -m pytest tests/test_sandbox.py`."""

import errno
import fcntl
import json
import os
import platform
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

# tests.helpers first: importing it sets torch to one thread (it says why)
from tests.helpers import (ADD, ADD_TESTS, EXAMPLE_CODE, FINISHES, HANG_GUARD, REPO, SANDBOX_UIDS,
                           fails_in_time, full, our_uids)
import rewards
from rewards import judge
from rewards import sandbox
from tests.attacks import (DAEMON, DRIVER, FIND, HUNT, HUNT_EVERYWHERE, MEMORY, NAMESPACES, NUMBERS,
                           OOM_SCORE, PERSIST, PWNED, READ_ANSWERS, SEES, SHADOW, SIGNAL_EACH_OTHER,
                           SQUARES, TEST_FORMATS, TRAINER, WORKS)


# =============================================================================
# rewards/sandbox.py


# -----------------------------------------------------------------------------
# sandbox.py: a program isolated: its deadline, memory, files, environment, network, signals, output


def test_isolation_reports_an_unprivileged_user_no_network_and_the_limits():
    report = sandbox.isolation()
    assert report["python"] and "(root!)" not in report["user"]
    assert "namespace" in report["network"] and "connected" not in report["network"]
    assert report["seccomp"].startswith("filter on") or report["network"].startswith("new network namespace")
    assert "address space 1024 MiB" in report["limits"] and report["environment"] == "LANG, PATH"


def test_a_program_is_started_without_forking_the_trainer():
    # a fork write-protects every page of the process forked: its next write to each one faults. A trainer
    # holds 15 GiB, so its programs must start from a fresh interpreter (vfork, then exec)
    import mmap
    import resource
    faults = lambda: resource.getrusage(resource.RUSAGE_THREAD).ru_minflt  # noqa: E731
    pages = 16384
    with mmap.mmap(-1, pages * mmap.PAGESIZE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) as held:
        held.madvise(mmap.MADV_NOHUGEPAGE)  # one fault a page, not one a huge page
        ballast = np.frombuffer(held, np.uint8)
        for run in range(3):  # once held and written (0), then after a program (1, 2)
            if run:
                assert sandbox.run(["-c", "print(3)"], timeout=FINISHES).stdout == b"3\n"
            before = faults()
            ballast[::mmap.PAGESIZE] += 1
            assert (faults() - before >= pages) == (run == 0), run
        del ballast


@pytest.mark.slow
def test_an_infinite_loop_is_killed_at_the_deadline():
    fails_in_time("while True:\n    pass")
    fails_in_time("import time\ntime.sleep(600)", fn_name="f", tests=[dict(input=[], output=1)])


@pytest.mark.slow
def test_a_fork_bomb_is_contained_and_every_process_it_made_dies():
    fails_in_time("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    fails_in_time("import os, time\nfor _ in range(5):\n    if os.fork() == 0:\n        os.fork()\n        time.sleep(600)\n"
                  "print(3)")  # grandchildren still sleeping when the program is done
    assert judge.passes(ADD, tests=ADD_TESTS)  # the worker's uid is usable again


def test_a_10_gb_allocation_fails_at_the_memory_limit_not_the_deadline():
    result = sandbox.run(["-c", "x = bytearray(10 * 1024 ** 3)\nprint(3)"], timeout=FINISHES)
    assert result.returncode != 0 and b"MemoryError" in result.stderr and not result.timed_out
    fails_in_time("x = bytearray(10 * 1024 ** 3)\n" + ADD)


def test_writes_into_the_repository_and_home_are_refused_and_tmp_is_private():
    name = f"sandbox-wrote-{secrets.token_hex(4)}"
    targets = [os.path.join(REPO, name), os.path.join(os.path.expanduser("~"), name),
               os.path.join(REPO, "data", "example_code.jsonl"), os.path.join("/tmp", name)]
    before = open(targets[2]).read()
    program = ("import os\n"
               f"for path in {targets!r}:\n"
               "    try:\n        open(path, 'a').write('pwned')\n        print('wrote', path)\n"
               "    except OSError as e:\n        print('refused', e.errno)\n"
               "open('scratch.txt', 'w').write('fine')\nprint(os.path.exists('scratch.txt'))")
    result = sandbox.run(["-c", program], timeout=FINISHES)
    # ENOENT or EROFS (the sandbox's root is its own, read-only: home's path is there when the interpreter lies
    # under it); EACCES where the kernel grants no namespaces (the host's files, as the sandbox's uid)
    lines = result.stdout.decode().splitlines()
    assert result.returncode == 0 and lines[3] == f"wrote {targets[3]}" and lines[4] == "True", lines
    assert all(line in (f"refused {e}" for e in (errno.EACCES, errno.ENOENT, errno.EROFS)) for line in lines[:3]), lines
    assert not any(os.path.exists(path) for path in targets[:2] + targets[3:]) and open(targets[2]).read() == before


def test_the_environment_holds_no_secret_of_the_parent(monkeypatch):
    secret = secrets.token_hex(16)
    monkeypatch.setenv("SCALERL_TEST_SECRET", secret)
    program = "import os\nprint(dict(os.environ))\nprint(open(f'/proc/{os.getppid() or 1}/environ').read())"
    result = sandbox.run(["-c", program], timeout=FINISHES)
    assert secret.encode() not in result.stdout + result.stderr and b"PATH" in result.stdout


def test_a_connection_to_a_listening_socket_never_arrives():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.3)
        port = server.getsockname()[1]
        program = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
                   "s.sendall(b'hello')\nprint(3)")
        result = sandbox.run(["-c", program], timeout=FINISHES)
        assert result.returncode != 0 and b"Error" in result.stderr
        with pytest.raises(socket.timeout):
            server.accept()
        fails_in_time(program.replace("print(3)", ADD))


def test_the_program_cannot_kill_its_parent_or_its_parents_group():
    bystander = subprocess.Popen(["sleep", "30"])  # in this process's group
    try:
        program = ("import os, signal\n"
                   f"for kill in (lambda: os.kill({os.getpid()}, 9), lambda: os.killpg({os.getpgid(0)}, 9),\n"
                   f"             lambda: os.kill({bystander.pid}, 9), lambda: os.kill(os.getppid(), 9),\n"
                   "             lambda: os.kill(-1, 9)):\n"
                   "    try:\n        kill()\n        print('killed')\n    except OSError as e:\n        print(e.errno)")
        result = sandbox.run(["-c", program], timeout=FINISHES)
        assert b"killed" not in result.stdout and len(result.stdout.split()) == 5
        assert bystander.poll() is None  # and this test, being here, is alive
    finally:
        bystander.kill()
        bystander.wait()


def test_100_mb_of_output_is_cut_at_the_cap():
    result = sandbox.run(["-c", "import sys\nsys.stdout.write('3' * 10 ** 8)"], timeout=FINISHES)
    assert result.overflowed and not result.timed_out and len(result.stdout) <= sandbox.OUTPUT_CAP + (1 << 16)
    fails_in_time("import sys\nprint(3)\nsys.stdout.write(' ' * 10 ** 8)", tests=[dict(input="", output="3")])


def test_two_programs_of_a_batch_cannot_lock_or_watch_the_files_they_share():
    """The interpreter and its standard library are the one thing concurrent programs share (read-only): a lock held
    on os.py, a lease, or a watch on the stdlib directory would be a channel between them. Each is denied."""
    results = [json.loads(sandbox.run(["-c", SIGNAL_EACH_OTHER], timeout=FINISHES).stdout) for _ in range(2)]
    assert results[0] == results[1] == dict.fromkeys(results[0], "EPERM") and len(results[0]) == 7, results


# -----------------------------------------------------------------------------
# sandbox.py against an attacker
# Each attack is a program submitted through the reward exactly as a completion's code block is, built to print
# "pwned" (what its test expects) only if the attack worked: a pass would be +1. Each class of the threat model
# (sandbox.py's docstring) is tried with the trainer as root (full isolation: this process) and, where it applies,
# as an unprivileged trainer: /usr/bin/python3 as uid 65534 (nobody) on a copy of sandbox.py, which must refuse
# code rewards, and with sandbox_unsafe=True must still hold what needs no root. Every attack must fail (reward -1),
# leave nothing behind and leave the trainer alive. The programs: tests/attacks.py.


def processes_of(uids):
    """Live processes (not zombies) whose real uid is in `uids`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        except OSError:
            continue
        if int(status["Uid"].split()[0]) in uids and status["State"].split()[0] != "Z":
            found.append(int(pid))
    return found


def ipc_objects_of(uids):
    """SysV shared memory segments, semaphores and message queues owned by `uids`."""
    found = []
    for kind in ("shm", "sem", "msg"):
        with open(f"/proc/sysvipc/{kind}") as f:
            header, *rows = [line.split() for line in f]
        found += [(kind, row) for row in rows if int(row[header.index("uid")]) in uids]
    return found


def keys_of(uids):
    """{uid: how many keys it owns} from /proc/key-users ("  uid:  usage nkeys/nikeys ...")."""
    with open("/proc/key-users") as f:
        counts = {int(line.split(":")[0]): int(line.split()[2].split("/")[0]) for line in f}
    return {uid: n for uid, n in counts.items() if uid in uids}


KEYS_BEFORE = keys_of(SANDBOX_UIDS)  # a key of a uid outlives its processes: none may be added


def files_named(marker, places=("/", "/tmp", "/var/tmp", "/run/lock", "/dev/shm", "/dev/mqueue", os.path.expanduser("~"))):
    return [path for path in (os.path.join(place, marker) for place in places) if os.path.lexists(path)]


def remove_traces(marker, key):
    """What a PERSIST that got through left (a failing test's, or one without root: its own user's places)."""
    for flag in ("-M", "-S", "-Q"):
        subprocess.run(["ipcrm", flag, str(key)], capture_output=True)
    for path in files_named(marker):
        os.remove(path)


def eventually(check, seconds=HANG_GUARD):
    """check() once it is falsy (killed processes take a moment to go), or what it returned at the hang guard."""
    stop = time.monotonic() + seconds
    while (left := check()) and time.monotonic() < stop:
        time.sleep(0.05)
    return left


def nothing_left():
    assert eventually(lambda: processes_of(our_uids())) == []
    assert ipc_objects_of(SANDBOX_UIDS) == [] and keys_of(SANDBOX_UIDS) == KEYS_BEFORE


def attack(program, tests=PWNED, timeout=FINISHES, **fields):
    """The attack's verdict through the reward, and what it printed (run alone, for the assertion messages)."""
    source = program.format(**NUMBERS[platform.machine()], **fields)
    return judge.passes(source, tests=tests, timeout=timeout), sandbox.run(["-c", source], timeout=timeout)


# -----------------------------------------------------------------------------
# sandbox.py against an attacker, as root: full isolation


def cheat_outside_the_sandbox(job):
    """Whether a job's program passes where it can read what this process can (no sandbox)."""
    try:
        return cheat(job)
    except Exception:
        return False


def cheat(job):
    if "tests" in job and "fn_name" not in job:
        t = job["tests"][0]
        out = subprocess.run([sys.executable, "-c", job["program"]], input=t["input"], capture_output=True, text=True)
        return out.stdout.split() == t["output"].split()
    namespace = {}
    exec(job["program"], namespace)
    if "fn_name" in job:
        return all(namespace[job["fn_name"]](*t["input"]) == t["output"] for t in job["tests"])
    exec(job["test"], namespace)
    return True


@full
def test_reading_the_answers_earns_nothing_on_any_example_problem():
    rows = [json.loads(line) for line in open(EXAMPLE_CODE)]
    specs = [rewards.code_tests(row) for row in rows]
    jobs = [dict(spec, program=READ_ANSWERS.format(path=EXAMPLE_CODE, prompt=row["prompt"]), timeout=FINISHES)
            for row, spec in zip(rows, specs)]
    assert sum(map(cheat_outside_the_sandbox, jobs)) >= 20  # where the dataset can be read, the attack works
    assert not any(judge.score_many(jobs))
    nothing_left()


@full
def test_the_program_sees_no_dataset_repository_home_sys_mount_table_or_host_network():
    parent = [os.path.dirname(REPO)] if os.path.dirname(REPO) not in ("/", "/tmp") else []  # /tmp: the sandbox's own
    paths = [EXAMPLE_CODE, REPO, *parent, "/data", "/home", os.path.expanduser("~/.ssh"), "/etc/passwd",
             "/sys/class/net", "/var", "/run", "/usr/bin/env", "/bin/sh"]
    result = sandbox.run(["-c", SEES.format(paths=paths)], timeout=FINISHES)
    seen = json.loads(result.stdout)
    assert [p for p in paths if seen[p]] == [], seen
    assert not {"/sys", "/data", "/home", "/etc", REPO} & set(seen["mounts"]) and "/tmp" in seen["mounts"], seen
    assert seen["interfaces"] == ["lo"] and seen["processes"] == ["1"], seen


@full
def test_nothing_persists_outside_the_private_tmp_even_with_tmpdir_set(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox.tempfile, "tempdir", str(tmp_path))  # TMPDIR=... on a cluster: the host's disk
    marker, key = f"sandbox-persist-{secrets.token_hex(4)}", secrets.randbelow(1 << 30) + 1
    try:
        results = json.loads(sandbox.run(["-c", PERSIST.format(**NUMBERS[platform.machine()], marker=marker, key=key)],
                                         timeout=FINISHES).stdout)
        assert set(results.values()) <= {"EACCES", "EROFS", "ENOENT", "EPERM", "done"}, results
        assert [k for k, v in results.items() if v == "done"] == ["write /dev/shm"], results  # its own /tmp
        assert {results[k] for k in ("shmget", "semget", "msgget", "mq_open", "add_key", "keyctl")} == {"EPERM"}, results
        passed, result = attack(FIND, marker=marker, key=key)
        assert not passed and result.stdout.startswith(b"nothing"), result
        nothing_left()
        assert files_named(marker) == [] and os.listdir(tmp_path) == []
    finally:
        remove_traces(marker, key)


@full
def test_the_run_directory_is_the_sandboxs_own_tmpfs_whatever_tmpdir_says(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox.tempfile, "tempdir", str(tmp_path))
    program = ("import os\nopen('big', 'wb').write(bytes(5 << 20))\n"
               "print(os.getcwd(), [l.split()[8] for l in open('/proc/self/mountinfo') if l.split()[4] == os.getcwd()])")
    result = sandbox.run(["-c", program], timeout=FINISHES)
    assert result.returncode == 0 and result.stdout.split() == [b"/tmp", b"['tmpfs']"], result
    assert os.listdir(tmp_path) == []


@full
def test_memory_is_capped_for_all_processes_of_a_run_together():
    if "cgroup" not in sandbox.isolation()["memory"]:
        pytest.skip("no writable memory cgroup here: " + sandbox.isolation()["memory"])
    passed, result = attack(MEMORY)
    assert not passed and b"killed by signal 9" in result.stdout, result  # the kernel's choice, inside the run
    nothing_left()


@full
def test_every_process_of_a_program_is_the_kernels_first_pick_under_memory_pressure():
    result = sandbox.run(["-c", OOM_SCORE], timeout=FINISHES)
    assert result.stdout.split() == [b"1000", b"1000"], result


@full
def test_namespaces_cannot_be_made_or_joined_and_plain_fork_threads_and_pools_still_work():
    passed, result = attack(NAMESPACES)
    results = json.loads(result.stdout.splitlines()[0])
    assert not passed and set(results.values()) == {"EPERM", "ENOSYS"} and results["clone3 user"] == "ENOSYS", results
    assert judge.passes(WORKS, tests=[dict(input="", output="3")], timeout=FINISHES)
    nothing_left()


@full
def test_no_signal_limit_trace_or_proc_file_reaches_the_trainer():
    passed, result = attack(TRAINER, trainer=os.getpid())
    results = json.loads(result.stdout.splitlines()[0])
    assert not passed and "done" not in results.values(), results  # and this test, being here, is alive
    nothing_left()


@full
def test_a_child_that_lets_go_of_the_pipes_dies_with_the_run():
    assert judge.passes(DAEMON, tests=PWNED, timeout=FINISHES)  # the answer is right: the run still ends it
    assert processes_of(our_uids()) == []  # at once: the helper exits after its namespace is empty
    nothing_left()


@full
@pytest.mark.parametrize("test", ["assert answer() == 'x' * 32", "assert answer() == ''.join(['x'] * 32)",
                                  "x = answer()\nassert len(x) == 32 and x == 'x' * 32"])
def test_no_assert_is_decided_by_anything_the_programs_process_holds_or_writes(test):
    assert not judge.passes(HUNT_EVERYWHERE, test=test, timeout=FINISHES)
    assert not judge.passes(HUNT.replace("answer", "check"), fn_name="check", tests=[dict(input=[], output="x" * 32)],
                              timeout=FINISHES)
    nothing_left()


# -----------------------------------------------------------------------------
# sandbox.py against an attacker, as an unprivileged trainer: /usr/bin/python3 as nobody on a copy of sandbox.py


NOBODY = 65534

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="as root, as CI runs: the sandbox's full isolation, and "
                             "an unprivileged trainer started as nobody")


@pytest.fixture(scope="module")
def unprivileged():
    """-> run(jobs) for a trainer that is not root: the result of DRIVER, its stderr, and the processes of its uid
    left once it is done (none but what was there before), its environment holding a secret."""
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no /usr/bin/python3 for nobody to run")
    home = tempfile.mkdtemp(prefix="sandbox-unprivileged-")
    os.chmod(home, 0o755)
    # the rewards/ package: the stdlib alone, so a bare /usr/bin/python3 runs it
    shutil.copytree(os.path.join(REPO, "rewards"), os.path.join(home, "rewards"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(os.path.join(home, "driver.py"), "w") as f:
        f.write(DRIVER)
    keys = keys_of({NOBODY})

    def run(jobs):
        with open("/tmp/scalerl-test-nobody.lock", "w") as lock:  # one driver at a time: "left" counts all of nobody's
            fcntl.flock(lock, fcntl.LOCK_EX)
            return drive(jobs)

    def drive(jobs):
        secret = secrets.token_hex(16)
        with open(os.path.join(home, "jobs.json"), "w") as f:
            json.dump(jobs, f)
        for folder, _, names in os.walk(home):
            os.chmod(folder, 0o755)
            for name in names:
                os.chmod(os.path.join(folder, name), 0o644)
        before = set(processes_of({NOBODY}))
        done = subprocess.run(["/usr/bin/python3", "driver.py", "jobs.json"], cwd=home, user=NOBODY, group=NOBODY,
                              extra_groups=[], env=dict(PATH="/usr/bin:/bin", TRAINER_SECRET=secret),
                              capture_output=True, text=True, timeout=HANG_GUARD)
        assert done.returncode == 0, (done.returncode, done.stderr[-3000:])  # the trainer alive, done
        out = json.loads(done.stdout)
        assert secret not in done.stdout
        left = eventually(lambda: set(processes_of({NOBODY})) - before)
        assert ipc_objects_of({NOBODY}) == [] and keys_of({NOBODY}) == keys
        return out, done.stderr, left

    yield run
    shutil.rmtree(home, ignore_errors=True)


@as_root
def test_an_unprivileged_trainer_refuses_code_rewards_unless_told_unsafe_and_then_says_warning(unprivileged):
    out, stderr, left = unprivileged([dict(program="print(input())", tests=[dict(input="3", output="3")], timeout=FINISHES),
                                      dict(program="def f(x):\n    return x\n", fn_name="f", tests=[dict(input=[1], output=1)],
                                           timeout=FINISHES),
                                      dict(program="def f(x):\n    return x\n", test="assert f((1,)) == (1,)", timeout=FINISHES),
                                      dict(program=WORKS, tests=[dict(input="", output="3")], timeout=FINISHES)])
    assert out["refused"] and "\n" not in out["refused"] and "sandbox_unsafe=True" in out["refused"], out["refused"]
    assert "root" in out["refused"]
    assert out["isolation"]["mode"].startswith("WARNING") and "WARNING" in stderr
    assert out["passed"] == [True] * 4 and not left  # what needs no root holds, and correct programs pass


@as_root
def test_an_unprivileged_trainer_survives_every_signal_and_keeps_its_memory_and_environment(unprivileged):
    source = TRAINER.format(**NUMBERS[platform.machine()], trainer=0)  # the trainer is the program's parent there
    out, _, left = unprivileged([dict(program=source, tests=PWNED, timeout=FINISHES)])
    results = json.loads(out["runs"][0].splitlines()[0])
    assert out["passed"] == [False] and "done" not in results.values(), results
    assert results["environ"] == results["mem"] == "EACCES" and not left, results  # the trainer is non-dumpable


@as_root
def test_an_unprivileged_trainer_kills_every_process_of_a_run_denies_namespaces_ipc_keys_and_forged_asserts(unprivileged):
    marker, key = f"sandbox-persist-{secrets.token_hex(4)}", secrets.randbelow(1 << 30) + 1
    jobs = [dict(program=DAEMON, tests=PWNED, timeout=FINISHES),
            dict(program=NAMESPACES.format(**NUMBERS[platform.machine()]), tests=PWNED, timeout=FINISHES),
            dict(program=PERSIST.format(**NUMBERS[platform.machine()], marker=marker, key=key), tests=PWNED, timeout=FINISHES),
            dict(program=OOM_SCORE, tests=[dict(input="", output="1000 1000")], timeout=FINISHES),
            dict(program=HUNT, test="assert answer() == 'x' * 32", timeout=FINISHES)]
    try:
        out, _, left = unprivileged(jobs)
        assert out["passed"] == [True, False, False, True, False] and not left, (out, left)  # daemons died with their runs
        namespaces, persisted = json.loads(out["runs"][1].splitlines()[0]), json.loads(out["runs"][2])
        assert set(namespaces.values()) == {"EPERM", "ENOSYS"}, namespaces
        assert {persisted[k] for k in ("shmget", "semget", "msgget", "mq_open", "add_key", "keyctl")} == {"EPERM"}, persisted
    finally:
        remove_traces(marker, key)  # files in the user's own writable places: not covered without root (README)


def test_an_unprivileged_trainer_judges_every_test_format_and_its_programs_cannot_signal_each_other(unprivileged):
    jobs = [dict(TEST_FORMATS[kind], program=program, timeout=FINISHES) for kind in TEST_FORMATS
            for program in SQUARES.values()]
    jobs += [dict(program="def is_even(n):\n    raise StopIteration\n", test="assert all(map(is_even, [1, 3]))"),
             dict(program=SHADOW, test="import math\nassert math.isclose(square(2), 4.0)"),
             dict(program=SIGNAL_EACH_OTHER, tests=PWNED, timeout=FINISHES)]
    out, _, left = unprivileged(jobs)
    assert out["passed"] == [True, False, False] * len(TEST_FORMATS) + [False] * 3 and not left, out["passed"]
    denied = json.loads(out["runs"][-1])
    assert denied == dict.fromkeys(denied, "EPERM") and len(denied) == 7, denied
