"""infra/distributed.py: messages, heartbeats, buckets, placement, the weight group; whole layouts of
train.py under torchrun (slow: tests/harness.py's harnesses).

Run alone: `python -m pytest tests/test_distributed.py`."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

# tests.helpers first: importing it sets torch to one thread (it says why)
from tests.helpers import (HANG_GUARD, HARNESS, LOG_KEYS, REPO, TRAIN_FAST, assert_tokens_counted_once,
                           read_train_log, torchrun)
# the fixtures its tests take (pytest finds them by name in this module)
from tests.helpers import tiny_model_dir  # noqa: F401
from infra import distributed


# =============================================================================
# infra/distributed.py


def gloo_pair(timeout_s=30):
    """Two gloo groups of one two-rank world, in this process (threads join them)."""
    import datetime
    import threading
    import torch.distributed as dist
    store, groups = dist.HashStore(), {}
    join = lambda rank: groups.__setitem__(rank, dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=timeout_s)))
    threads = [threading.Thread(target=join, args=(rank,)) for rank in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return groups


class NoHeartbeat:
    def check(self, peer, who):
        pass


def test_a_rollout_message_of_20_mb_crosses_the_control_group_intact():
    from scheduler import Completion, Group
    rng = np.random.default_rng(0)
    groups = []
    for p in range(8):  # 8 groups x 16 completions x 14k tokens: 13 bytes a token, 23 MB
        completions = [Completion(rng.integers(0, 151936, 14000).tolist(), rng.normal(size=14000).astype(np.float32).tolist(),
                                  rng.integers(0, 9, 14000).tolist(), (rng.random(14000) > 0.01).tolist(), "eos",
                                  bool(c % 2)) for c in range(16)]
        groups.append(Group(p, rng.integers(0, 1000, 300).tolist(), completions, validation=p == 7))
    message = ("groups", groups, 123)
    payload = distributed.pack(message)
    assert 20e6 < payload.numel() < 14 * 14000 * 16 * 8  # arrays, not pickled lists (~15 bytes a token)
    pair = gloo_pair()
    receiver = distributed.Mailbox(pair[0], senders=[1], timeout_s=30, heartbeat=NoHeartbeat())
    sender = distributed.Mailbox(pair[1], senders=[], timeout_s=30, heartbeat=NoHeartbeat())
    sender.send(0, message)
    sender.send(0, ("bye",))
    received = receiver.get(1, "rank 1")
    assert received == message and receiver.get(1, "rank 1") == ("bye",)
    receiver.close()  # its thread ended at "bye"
    assert not any(t.is_alive() for t in receiver.threads)


def test_a_peer_whose_heartbeat_stands_still_is_named_within_the_timeout(monkeypatch):
    import torch.distributed as dist
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    # a beat every 0.05 s against a timeout of 60 s: only a peer that stopped can look dead, on any machine
    alive, watcher = distributed.Heartbeat(1, timeout_s=60.0, period_s=0.05), distributed.Heartbeat(0, 60.0, 0.05)
    for _ in range(20):  # a busy peer (its thread beats) is never declared dead
        watcher.check(1, "sampler rank 1")
        time.sleep(0.05)
    alive.close()  # now it stands still, as a stopped or dead process does
    watcher.timeout_s = 0.5
    started = time.time()
    with pytest.raises(distributed.RankError, match=r"^sampler rank 1 shows no sign of life for 0.5 s"):
        while time.time() - started < HANG_GUARD:
            watcher.check(1, "sampler rank 1")
            time.sleep(0.05)
    watcher.close()


def test_bucket_plan_packs_consecutive_tensors_and_gives_a_big_tensor_its_own_bucket():
    shapes = [("a", (4, 4)), ("b", (8,)), ("c", (100, 10)), ("d", (2,)), ("e", (3, 3))]
    names = lambda plan: [[n for n, _ in bucket] for bucket in plan]
    assert names(distributed.bucket_plan(shapes, 100, 4)) == [["a", "b"], ["c"], ["d", "e"]]  # 64 + 32 bytes, ...
    assert names(distributed.bucket_plan(shapes, 10 ** 9, 4)) == [["a", "b", "c", "d", "e"]]
    assert names(distributed.bucket_plan(shapes, 1, 2)) == [["a"], ["b"], ["c"], ["d"], ["e"]]
    flat = torch.arange(16 + 8, dtype=torch.float32)
    bucket = distributed.bucket_plan(shapes, 100, 4)[0]
    (na, a), (nb, b) = distributed.unflatten(bucket, flat)
    assert (na, nb) == ("a", "b") and a.shape == (4, 4) and torch.equal(b, torch.arange(16, 24, dtype=torch.float32))


def test_a_sampler_rank_takes_its_own_entry_of_cuda_visible_devices_and_bad_placements_are_refused(monkeypatch):
    assert distributed.gpu_for(1, "3,5") == "5" and distributed.gpu_for(0, "GPU-9f2c,GPU-77aa") == "GPU-9f2c"
    assert distributed.gpu_for(2, None) == "2" and distributed.gpu_for(0, "MIG-a1b2") == "MIG-a1b2"
    with pytest.raises(ValueError, match="local rank 2 has no GPU"):
        distributed.gpu_for(2, "3,5")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="one vLLM engine per data-parallel rank"):
        distributed.place(0, "vllm", "cpu")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with pytest.raises(ValueError, match="3 ranks on this node but 2 GPUs visible"):
        distributed.place(1, "vllm", "cuda")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    distributed.place(1, "vllm", "cuda")  # the sampler rank: its own GPU only, the scheduler's mask respected
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"


def test_a_rank_waiting_on_the_master_to_build_the_model_waits_while_it_lives_and_names_it_when_it_stops():
    import datetime
    import types
    import torch.distributed as dist
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=0.1))  # the store's own timeout plays no part

    class Building:  # the master's heartbeat moves; its build ends after 10 checks (2 s, 20 store timeouts)
        checks = 0

        def check(self, peer, who):
            self.checks += 1
            if self.checks == 10:
                store.set("scalerl/master_first", "/models/tiny")
    follower = types.SimpleNamespace(world=2, rank=1, store=store, heartbeat=Building())
    assert distributed.master_first(follower, build=None) == "/models/tiny" and follower.heartbeat.checks == 10

    class Stopped:
        def check(self, peer, who):
            raise distributed.RankError(f"{who} shows no sign of life")
    follower = types.SimpleNamespace(world=2, rank=1, store=dist.HashStore(), heartbeat=Stopped())
    with pytest.raises(distributed.RankError, match=r"^the master \(rank 0\), preparing the model, shows no sign"):
        distributed.master_first(follower, build=None)


def test_exported_environment_that_breaks_the_layout_is_refused_not_overridden(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # pushed weights could not reach the engine
    with pytest.raises(ValueError, match="VLLM_ENABLE_V1_MULTIPROCESSING=1 is exported, but this run needs"):
        distributed.place(1, "vllm", "cpu")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "1")  # the two ends of the weight broadcast would disagree
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(ValueError, match="NCCL_CUMEM_ENABLE=1 is exported"):
        distributed.place(0, "torch", "cuda")
    monkeypatch.delenv("NCCL_CUMEM_ENABLE")
    distributed.place(0, "torch", "cuda")
    assert os.environ["NCCL_CUMEM_ENABLE"] == "0"


def test_a_weight_broadcast_that_a_peer_misses_fails_within_the_deadline_naming_the_peer():
    pair = gloo_pair(timeout_s=30)
    started = time.time()
    with pytest.raises(distributed.RankError, match=r"^the weight broadcast with sampler rank 1 did not complete within 1 s"):
        distributed.broadcast(pair[0], torch.ones(3), 1.0, "sampler rank 1")

    class Pending:  # an NCCL broadcast a dead peer never completes: the group is aborted before the error is raised
        aborted = False
        broadcast = lambda self, tensors, options: type("Work", (), dict(is_completed=lambda w: False))()
        abort = lambda self: setattr(self, "aborted", True)
    group = Pending()
    with pytest.raises(distributed.RankError, match="did not complete within 0.5 s"):
        distributed.broadcast(group, torch.ones(3), 0.5, "sampler rank 1")
    assert group.aborted
    plan = [[("w", (3,))]]
    with pytest.raises(distributed.RankError, match=r"^the weight broadcast with the master \(rank 0\)"):
        list(distributed.receive_buckets(gloo_pair()[1], plan, torch.float32, "cpu", 1.0))
    assert time.time() - started < HANG_GUARD


def test_the_weight_group_connects_at_setup_under_the_deadline_even_when_a_peer_never_joins():
    """NCCL builds its communicator inside the first collective, which blocks until every rank joins (no Work to
    poll yet, and abort() cannot reach it): connect() makes that first broadcast at setup in a thread it watches."""
    import threading
    calls = []

    class NeverJoins:  # ncclCommInitRankConfig waiting for a peer that is alive but stuck (SIGSTOP, a CUDA hang)
        def broadcast(self, tensors, options):
            calls.append("broadcast")
            threading.Event().wait()
        abort = lambda self: calls.append("abort")
    started = time.time()
    with pytest.raises(distributed.RankError, match=r"^sampler rank 1 did not join the weight group within 0.5 s"):
        distributed.connect(NeverJoins(), torch.device("cpu"), 0.5, "sampler rank 1")
    assert calls == ["broadcast", "abort"] and time.time() - started < HANG_GUARD

    class Pending:  # joined, but the first broadcast never completes: the same deadline, then abort
        broadcast = lambda self, tensors, options: type("Work", (), dict(is_completed=lambda w: False))()
        abort = lambda self: calls.append("abort")
    with pytest.raises(distributed.RankError, match="did not complete within 0.5 s"):
        distributed.connect(Pending(), torch.device("cpu"), 0.5, "sampler rank 1")
    pair, done = gloo_pair(), []  # both ends present: connected, and the group still carries the pushes
    threads = [threading.Thread(target=lambda r=r: done.append(distributed.connect(pair[r], torch.device("cpu"), 30,
                                                                                   "a peer"))) for r in (0, 1)]
    [t.start() for t in threads]
    [t.join(timeout=HANG_GUARD) for t in threads]
    assert done == [None, None]


# -----------------------------------------------------------------------------
# distributed.py: whole layouts under torchrun (slow)


def torchrun_harness(nproc, *args, timeout=900, env=None):
    """tests/harness.py under torchrun: one of its harnesses, named by the first argument."""
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                           HARNESS, *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.slow
@pytest.mark.parametrize("nproc,n_samplers", [(2, 1), (3, 1), (2, 0)], ids=["1trainer+1sampler", "2fsdp+1sampler",
                                                                            "2data-parallel"])
def test_multi_process_layouts_sample_with_the_trainers_weights_keep_lag_within_k_and_resume(tiny_model_dir, tmp_path,
                                                                                             nproc, n_samplers):
    out = tmp_path / "run"
    args = [f"--n_samplers={n_samplers}", "--max_lag=2", "--eval_interval=5", "--ckpt_interval=5",
            "--n_val=8", "--eval_samples=2"]  # the layout's protocol, not a validation's size
    result = torchrun(nproc, out, *args, "--max_steps=10")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_train_log(out)
    assert [r["step"] for r in rows] == list(range(11))
    assert all(all(k in r for k in LOG_KEYS) and r["policy_lag_max"] <= 2 for r in rows[1:])
    assert rows[1]["logprob_mismatch"] < 1e-5  # step 1: version-0 tokens only, sampled in another process
    # validation, after every push (steps 5, 10): what the trainer's weights sampled matches them to fp32's precision
    # (a stale or garbled push shows as a step's change, ~1e-2). FSDP2 trainers measure nothing (a sharded model).
    # Learning is the one-process test's: 10 steps raised validation by 0.04-0.10 here, within its noise (measured)
    fresh = [r["logprob_mismatch_lag0"] for r in rows if "logprob_mismatch_lag0" in r]
    assert fresh == [] if nproc == 3 else (len(fresh) == 3 and max(fresh) < 1e-4), fresh
    # gpu_hours: wall x processes; a step's time is its sampling and training, validation apart; both from one
    # clock reading a step (two readings parted them by a preemption's milliseconds on a loaded machine)
    assert rows[-1]["gpu_hours"] * 3600 == pytest.approx(nproc * sum(r["step_time"] for r in rows[1:]), rel=1e-9)
    assert_tokens_counted_once(out, rows)  # every rank's generated tokens, once (data parallel: all-reduced)
    result = torchrun(nproc, out, *args, "--max_steps=12", "--init_from=resume")  # the layout resumes too
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_train_log(out)
    assert [r["step"] for r in rows] == list(range(13)) and "val_reward" in rows[-1]
    assert rows[11]["gpu_hours"] > rows[10]["gpu_hours"]


@pytest.mark.slow
def test_loss_and_gradient_of_a_fixed_batch_match_in_one_two_and_three_processes(tiny_model_dir, tmp_path):
    results = {}
    for name, nproc, args in [("1 process", 1, []), ("2 FSDP2 trainers + 1 sampler", 3, ["--n_samplers=1"]),
                              ("2 FSDP2, token micro-batches, checkpointed", 3,
                               ["--n_samplers=1", "--micro_batch=0", "--micro_batch_tokens=40", "--checkpoint_activations=True"]),
                              ("2 data-parallel ranks", 2, ["--n_samplers=0", "--prompts_per_step=2"])]:
        out = tmp_path / f"{len(results)}.pt"
        result = torchrun_harness(nproc, "fixed_batch", out, tiny_model_dir, "--micro_batch=4", *args)
        assert result.returncode == 0, result.stderr[-3000:]
        results[name] = torch.load(out)
    reference = results.pop("1 process")
    assert reference["loss"] != 0 and reference["grad_norm"] > 0
    for name, r in results.items():
        assert abs(r["loss"] - reference["loss"]) < 1e-5, name
        assert abs(r["grad_norm"] - reference["grad_norm"]) < 1e-5 * max(1.0, reference["grad_norm"]), name
        for key, g in reference["grads"].items():
            assert (r["grads"][key] - g).abs().max() < 1e-5, (name, key)


@pytest.mark.slow
def test_with_lora_two_fsdp2_trainers_and_two_data_parallel_ranks_match_one_process(tiny_model_dir, tmp_path):
    """LoRA: the adapters alone get gradients, reduced over the trainers (FSDP2's reduce-scatter, the
    data-parallel all-reduce) to one process's. B is zero at step 0, so its gradient carries the whole
    model's backward; A's is zero everywhere."""
    results = {}
    for name, nproc, args in [("1 process", 1, []), ("2 FSDP2 + 1 sampler", 3, ["--n_samplers=1"]),
                              ("2 data-parallel ranks", 2, ["--n_samplers=0", "--prompts_per_step=2"])]:
        out = tmp_path / f"{len(results)}.pt"
        result = torchrun_harness(nproc, "fixed_batch", out, tiny_model_dir, "--micro_batch=4", "--lora_rank=4",
                                  *args)
        assert result.returncode == 0, result.stderr[-3000:]
        results[name] = torch.load(out)
    reference = results.pop("1 process")
    assert all(k.endswith((".lora_A", ".lora_B")) for k in reference["grads"]) and len(reference["grads"]) == 42
    assert all(g.abs().max() > 0 for k, g in reference["grads"].items() if k.endswith("lora_B"))
    for name, r in results.items():
        assert abs(r["loss"] - reference["loss"]) < 1e-5, name
        assert abs(r["grad_norm"] - reference["grad_norm"]) < 1e-5 * max(1.0, reference["grad_norm"]), name
        assert r["grads"].keys() == reference["grads"].keys()
        for key, g in reference["grads"].items():
            assert (r["grads"][key] - g).abs().max() < 1e-5, (name, key)


@pytest.mark.slow
def test_two_fsdp2_trainers_in_bf16_match_one_process_in_bf16(tiny_model_dir, tmp_path):
    """Mixed precision across ranks (FSDP2's MixedPrecisionPolicy, AdamW with foreach=True on DTensors) and
    in one process (a bf16 copy, fp32 master weights) agree to bf16's precision: they differ from each
    other no more than bf16 differs from fp32 (rows split between ranks round differently)."""
    results = {}
    for name, nproc, args in [("fp32", 1, []), ("bf16", 1, ["--dtype=bfloat16"]),
                              ("bf16 fsdp", 3, ["--dtype=bfloat16", "--n_samplers=1"])]:
        out = tmp_path / f"{len(results)}.pt"
        result = torchrun_harness(nproc, "fixed_batch", out, tiny_model_dir, "--micro_batch=4", *args)
        assert result.returncode == 0, result.stderr[-3000:]
        results[name] = torch.load(out)
    flat = lambda r: torch.cat([g.reshape(-1) for _, g in sorted(r["grads"].items())])
    fp32, one, fsdp = (results[k] for k in ("fp32", "bf16", "bf16 fsdp"))
    assert all(g.dtype == torch.float32 for g in fsdp["grads"].values())  # gradients reduced in fp32
    bf16_error = abs(one["loss"] - fp32["loss"])
    assert 0 < abs(fsdp["loss"] - one["loss"]) <= 2 * bf16_error
    assert (flat(fsdp) - flat(one)).norm() <= 2 * (flat(one) - flat(fp32)).norm()
    assert torch.nn.functional.cosine_similarity(flat(one), flat(fsdp), dim=0) > 0.99


@pytest.mark.slow
def test_bucketed_weight_push_is_exact_and_holds_at_most_two_buckets_extra(tmp_path):
    sizes = [64 << 10, 4 << 20, 1 << 30]  # smaller than most tensors, between tensors, larger than the model
    # a fixed mmap threshold: glibc then maps every block above 64 KB and unmaps it when freed, so the peak
    # resident memory follows the live tensors (by default freed blocks are kept for reuse)
    result = torchrun_harness(3, "buckets", tmp_path, *sizes, env=dict(MALLOC_MMAP_THRESHOLD_="65536"))
    assert result.returncode == 0, result.stderr[-3000:]
    master, follower, sampler = (torch.load(tmp_path / f"rank{r}.pt") for r in range(3))
    largest = max(t.numel() * 4 for t in master["full"].values())
    model_bytes = sum(t.numel() * 4 for t in master["full"].values())
    print({role: {size >> 10: round(r["extra"][size] / 2 ** 20, 1) for size in sizes}  # KB: MB, in the log
           for role, r in [("master", master), ("follower", follower), ("sampler", sampler)]})
    for size in sizes:
        assert all(torch.equal(sampler["received"][size][n], t) for n, t in master["full"].items()), size
        bucket = min(max(size, largest), model_bytes)  # a bucket holds at least its largest tensor
        for role, r in [("master", master), ("follower", follower), ("sampler", sampler)]:
            assert r["extra"][size] <= 2 * bucket + (8 << 20), (size, role, r["extra"][size] / 2 ** 20)
        assert follower["extra"][size] < largest / 2 + (8 << 20)  # never a full tensor it does not send


@pytest.mark.slow
def test_a_validation_longer_than_rank_timeout_does_not_fail_the_job(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    # the sampler rank holds each validation's groups back for 12 s (harness_slow_validation), so validation
    # outlasts rank_timeout=10 on any machine, while the follower trainer waits for the master and the master
    # for the sampler; step 1 checkpoints first. rank_timeout is also the process groups' connect window: at 4 s
    # the ranks' start on a loaded 2-core machine was once further apart (gloo: "timed out connecting")
    result = torchrun_harness(3, "slow_validation", 12, f"--out_dir={out}", *TRAIN_FAST, "--n_samplers=1",
                              "--rank_timeout=10", "--n_val=16", "--eval_samples=2", "--max_steps=1",
                              "--eval_interval=1", "--ckpt_interval=1")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_train_log(out)
    assert [r["step"] for r in rows] == [0, 1] and all("val_reward" in r for r in rows)
    assert min(r["val_seconds"] for r in rows) >= 12, [r["val_seconds"] for r in rows]


@pytest.mark.slow
def test_a_cold_start_longer_than_rank_timeout_does_not_fail_the_job(tiny_model_dir, tmp_path):
    out = tmp_path / "run"  # the master builds the model for 12 s more (harness_slow_build) while the others wait;
    # rank_timeout=10, not less: it is also the groups' connect window (the validation test above says why)
    result = torchrun_harness(3, "slow_build", 12, f"--out_dir={out}", *TRAIN_FAST, "--n_samplers=1", "--rank_timeout=10",
                              "--n_val=8", "--eval_samples=2", "--max_steps=1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "harness: the model's build held 12 s" in result.stderr  # the cold start did outlast rank_timeout
    assert [r["step"] for r in read_train_log(out)] == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGSTOP"])
def test_a_dead_or_silent_sampler_fails_the_job_naming_the_rank(tiny_model_dir, tmp_path, signal_name):
    import signal
    out = tmp_path / "run"
    process = torchrun(2, out, "--n_samplers=1", "--max_steps=100000", "--eval_interval=1000", "--rank_timeout=5",
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log = out / "log.jsonl"
    deadline = time.time() + HANG_GUARD
    while time.time() < deadline and not (log.exists() and len(log.read_text().splitlines()) >= 5):
        time.sleep(0.1)
    sampler_pid = None
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if b"RANK=1" in environ and str(out).encode() in cmdline and b"train.py" in cmdline:
            sampler_pid = pid
    assert sampler_pid, "sampler rank not found"
    os.kill(sampler_pid, getattr(signal, signal_name))
    killed, output = time.time(), []
    try:
        if signal_name == "SIGSTOP":  # alive but silent: the master's heartbeat check or a deadline names it
            for line in process.stdout:
                output.append(line)
                if line.startswith("train.py: rank 0: ") and "rank 1" in line:
                    break
            assert time.time() - killed < HANG_GUARD, "".join(output[-50:])
            os.kill(sampler_pid, signal.SIGKILL)  # spare torchrun its grace period for a stopped process
        output.append(process.communicate(timeout=90)[0])
    finally:
        process.kill()
        if os.path.exists(f"/proc/{sampler_pid}"):
            os.kill(sampler_pid, signal.SIGKILL)
    output = "".join(output)
    assert process.returncode != 0 and time.time() - killed < HANG_GUARD
    assert "rank      : 1" in output, output[-3000:]  # torchrun's summary names the failed rank too
    if signal_name == "SIGKILL":  # dead: torchrun sees the exit at once and stops the job
        assert "exitcode  : -9" in output, output[-3000:]
