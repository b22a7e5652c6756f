"""The roles of `torchrun --nproc_per_node=N train.py --n_samplers=S`, T = N - S of them trainers
(docs/many_gpus.md):

    master         0           trains; owns curriculum, log, validation, checkpoints; feeds samplers
    follower       1 .. T-1    trains its share of the batches the master sends
    sampler        T .. N-1    generates all the time; new weights land between two engine steps
    data_parallel  all (S = 0) each rank samples and trains its own share of the prompts
    single         1           python train.py: sampler and trainer take turns in one process
"""
import datetime
import os
import pickle
import queue
import signal
import sys
import threading
import time
from collections import namedtuple
from contextlib import contextmanager, suppress
from dataclasses import is_dataclass, replace

import numpy as np
import torch
import torch.distributed as dist


Layout = namedtuple("Layout", "rank world role trainers samplers trainer_rank device store mailbox "
                               "weight_group heartbeat")
TAG = 7  # the control group's point-to-point tag (its collectives use their own slots)
PREEMPTED = 75  # every rank's exit code after a stop signal and its checkpoint
                # (sysexits' EX_TEMPFAIL)


class RankError(RuntimeError):
    """A peer rank died or stopped answering: the message names it."""


def rank_error_hook(rank):
    """sys.excepthook: a RankError -> one line, exit 1 at once
    (no clean-up: peers may hold collectives)."""
    def hook(kind, error, traceback):
        if issubclass(kind, RankError):
            print(f"train.py: rank {rank}: {error}", file=sys.stderr, flush=True)
            os._exit(1)
        sys.__excepthook__(kind, error, traceback)
    return hook


class StopSignal:
    """SIGTERM or SIGINT (a scheduler's preemption, torchrun passing it on, Ctrl-C) -> `name` set,
    nothing else: train.py's loop reads it where no step, message or file is half done. The master
    (data-parallel ranks: together) acts on it; the others go on until its "stop". A repeated signal
    changes nothing."""

    def __init__(self):
        self.name = None
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, self.handle)

    def handle(self, number, frame):
        self.name = signal.Signals(number).name


@contextmanager
def naming_peers(what):
    """Collective failures (gloo timeouts, lost peers: RuntimeErrors)
    -> a RankError saying `what`."""
    try:
        yield
    except RankError:
        raise
    except RuntimeError as e:
        raise RankError(f"{what}: {str(e).splitlines()[0]}") from None

# -----------------------------------------------------------------------------
# placement and setup

def gpu_for(local_rank, visible):
    """This local rank's entry of CUDA_VISIBLE_DEVICES ("3,5": 1 -> "5"),
    or str(local_rank) if unset."""
    if not visible:
        return str(local_rank)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if local_rank >= len(entries):
        raise ValueError(f"local rank {local_rank} has no GPU: "
                         f"CUDA_VISIBLE_DEVICES={visible!r} lists {len(entries)}")
    return entries[local_rank]


def env(name, default=0):
    """torchrun's environment variable `name`, an int."""
    return int(os.environ.get(name, default))


def place(n_samplers, sampler, device_type):
    """Before CUDA starts: refuse two ranks on one GPU (ValueError);
    show a vLLM sampler rank only its GPU."""
    world, local_world = env("WORLD_SIZE", 1), env("LOCAL_WORLD_SIZE", 1)
    # pushed weights reach only an engine in this process (an iterator cannot cross over)
    if sampler == "vllm":
        require_env("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if sampler == "vllm" and n_samplers == 0 and world > 1:
        raise ValueError("sampler='vllm' with n_samplers=0 would start one vLLM engine per "
                         "data-parallel rank inside the trainers' process group; give vLLM its own "
                         "ranks with --n_samplers=S")
    if device_type == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        n_gpus = (len([e for e in visible.split(",") if e.strip()]) if visible
                  else torch.cuda.device_count())
        if local_world > n_gpus:
            raise ValueError(f"{local_world} ranks on this node but {n_gpus} GPUs visible: two "
                             f"ranks would share a GPU; launch --nproc_per_node={n_gpus} or fewer")
        # an in-process vLLM engine takes cuda:0 of what it sees
        if sampler == "vllm" and env("RANK") >= world - n_samplers > 0:
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu_for(env("LOCAL_RANK"), visible)
        require_env("NCCL_CUMEM_ENABLE", "0")  # as vLLM sets it:
                                               # the weight broadcast's two ends agree


def require_env(name, value):
    if (exported := os.environ.setdefault(name, value)) != value:
        raise ValueError(
            f"{name}={exported} is exported, but this run needs {name}={value}: unset it")


def setup(n_samplers, timeout_s, device_type, sampler):
    """Read torchrun's environment, make the groups, start the heartbeat -> Layout.
    One process: no groups."""
    rank, world, local_rank = env("RANK"), env("WORLD_SIZE", 1), env("LOCAL_RANK")
    trainers = world - n_samplers
    role = ("single" if world == 1 else "data_parallel" if n_samplers == 0 else
            "master" if rank == 0 else "follower" if rank < trainers else "sampler")
    device = torch.device("cpu")
    if device_type == "cuda":  # place() narrowed a vLLM sampler's CUDA_VISIBLE_DEVICES
                               # to its own GPU
        device = torch.device("cuda:0" if role == "sampler" and sampler == "vllm"
                              else f"cuda:{local_rank}")
        torch.cuda.set_device(device)
    if world == 1:
        return Layout(0, 1, role, 1, 0, 0, device, None, None, None, None)
    heartbeat = Heartbeat(rank, timeout_s)  # its store is torchrun's own, as a client
    store = heartbeat.store
    timeout = datetime.timedelta(seconds=timeout_s)
    # no group spans the whole job (an in-process vLLM engine would adopt it): the trainers, the
    # control group (the Mailbox) and the weights each have their own; the default group is the
    # trainers' (FSDP2, the stats)
    if rank < trainers:
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.PrefixStore("scalerl/trainers", store),
                                rank=rank, world_size=trainers, timeout=timeout)
    mailbox = weight_group = None  # data parallel: the trainer group is all it needs
    if n_samplers:
        # control: no timeout of its own (a receiving thread waits for as long as the sender lives;
        # liveness is the heartbeat's job); sends carry rank_timeout
        control = dist.ProcessGroupGloo(dist.PrefixStore("scalerl/control", store), rank, world,
                                        datetime.timedelta(days=30))
        # the master hears from the samplers, the others from it
        mailbox = Mailbox(control, range(trainers, world) if rank == 0 else [0], timeout_s,
                          heartbeat)
    # the weight group: the master is its rank 0, the samplers follow
    if n_samplers and (rank == 0 or rank >= trainers):
        group_rank, size = (0 if rank == 0 else rank - trainers + 1), n_samplers + 1
        weight_store = dist.PrefixStore("scalerl/weights", store)
        if device.type == "cuda":  # as torch builds its own NCCL groups (docs/vllm.md,
                                   # "The source lines")
            options = dist.ProcessGroupNCCL.Options(is_high_priority_stream=False)
            # its own watchdog only far beyond rank_timeout: broadcast() names a silent peer first,
            # then aborts
            options._timeout = datetime.timedelta(seconds=2 * timeout_s + 600)
            weight_group = dist.ProcessGroupNCCL(weight_store, group_rank, size, options)
        else:
            weight_group = dist.ProcessGroupGloo(weight_store, group_rank, size, timeout)
        connect(weight_group, device, timeout_s,
                "the samplers" if rank == 0 else "the master (rank 0)")
    return Layout(rank, world, role, trainers, n_samplers, rank if rank < trainers else None,
                  device, store, mailbox, weight_group, heartbeat)


def master_first(layout, build):
    """Run build() on the master only (e.g. the tiny model's warm-up);
    the other ranks wait for its result."""
    if layout.world == 1:
        return build()
    if layout.rank == 0:
        layout.store.set("scalerl/master_first", build())
    # as long as the master lives (a build takes minutes)
    while not layout.store.check(["scalerl/master_first"]):
        layout.heartbeat.check(0, "the master (rank 0), preparing the model,")
        time.sleep(0.2)
    return layout.store.get("scalerl/master_first").decode()


def finish(layout):
    # in order, so that nothing outlives __main__ (at exit that aborts the process:
    # "terminate called without an active exception"): receiving threads, heartbeat, groups
    for part in filter(None, (layout.mailbox, layout.heartbeat)):  # the threads end:
                                                                   # every peer said its last
        part.close()
    for group in filter(None, (layout.weight_group, layout.mailbox and layout.mailbox.group)):
        group.shutdown()
    if layout.role in ("master", "follower", "data_parallel"):  # the trainers' group
                                                                # (vLLM owns any other)
        dist.destroy_process_group()

# -----------------------------------------------------------------------------
# liveness and messages

def start_thread(target, args, name):
    thread = threading.Thread(target=target, args=args, name=name,
                              daemon=True)  # exit does not wait for it
    thread.start()
    return thread


class Heartbeat:
    """A thread bumps scalerl/alive/<rank> in torchrun's store every period_s,
    whatever the rank does."""

    def __init__(self, rank, timeout_s, period_s=1.0):
        self.timeout_s, self.period_s, self.seen = timeout_s, period_s, {}
        self.store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                   is_master=False,  # torchrun's, as a client
                                   timeout=datetime.timedelta(seconds=timeout_s))
        self.stopping = threading.Event()
        # the thread beats over a connection of its own
        # (Store.clone, torch >= 2.8: "one store per thread")
        self.thread = start_thread(self._beat, (self.store.clone(), f"scalerl/alive/{rank}"),
                                   "heartbeat")

    def _beat(self, store, key):
        with suppress(RuntimeError):  # the store is gone: the job is ending
            while not self.stopping.wait(self.period_s):
                store.add(key, 1)

    def check(self, peer, who):
        now = time.time()
        count, changed, checked = self.seen.get(peer, (None, now, 0.0))
        if now - checked >= self.period_s:  # one store read a period at most
            latest = self.store.add(f"scalerl/alive/{peer}", 0)
            self.seen[peer] = (latest, now if latest != count else changed, now)
            if latest == count and now - changed > self.timeout_s:
                raise RankError(f"{who} shows no sign of life for {self.timeout_s:g} s "
                                "(rank_timeout): dead or stopped")

    def close(self):
        self.stopping.set()
        self.thread.join()


def convert(x, to_arrays):
    """Groups' per-token lists as arrays (int32 ids and versions, fp32 log-probs, bool masks),
    or back (a Group: scheduler.py's, any dataclass with completions)."""
    if is_dataclass(x) and hasattr(x, "completions"):
        as_ = np.asarray if to_arrays else (lambda v, t: v.tolist())
        return replace(x, prompt_ids=as_(x.prompt_ids, np.int32), completions=[
            replace(c, token_ids=as_(c.token_ids, np.int32), logprobs=as_(c.logprobs, np.float32),
                    versions=as_(c.versions, np.int32), policy_mask=as_(c.policy_mask, bool))
            for c in x.completions])
    return type(x)(convert(v, to_arrays) for v in x) if isinstance(x, (tuple, list)) else x


def pack(message):
    return torch.frombuffer(bytearray(pickle.dumps(convert(message, True), protocol=5)),
                            dtype=torch.uint8)


class Mailbox:
    """Ordered messages over the gloo control group, received by a thread per sender:
    poll() never blocks."""

    def __init__(self, group, senders, timeout_s, heartbeat):
        self.group, self.timeout, self.heartbeat = (group, datetime.timedelta(seconds=timeout_s),
                                                    heartbeat)
        self.inbox = {src: queue.Queue() for src in senders}
        self.threads = [start_thread(self._receive, (src,), f"mail-from-{src}") for src in senders]

    def _receive(self, src):
        message = ("",)
        try:
            while message[0] not in ("stop", "bye"):  # the sender's last
                length = torch.zeros(1, dtype=torch.int64)
                self.group.recv([length], src, TAG).wait()
                payload = torch.empty(int(length), dtype=torch.uint8)
                self.group.recv([payload], src, TAG).wait()
                message = convert(pickle.loads(payload.numpy().tobytes()), False)
                self.inbox[src].put(message)
        except RuntimeError as e:  # the connection broke: the sender died
            self.inbox[src].put(
                RankError(f"rank {src} broke its connection: {str(e).splitlines()[0]}"))

    def send(self, dst, message):
        payload = pack(message)  # its int64 length goes first: the receiver sizes its buffer
        with naming_peers(
                f"rank {dst} did not take a message within rank_timeout (dead or stopped?)"):
            self.group.send([torch.tensor([payload.numel()])], dst, TAG).wait(self.timeout)
            self.group.send([payload], dst, TAG).wait(self.timeout)

    def get(self, src, who):
        """The next message from src, waiting as long as src is alive (its heartbeat moves)."""
        while True:
            with suppress(queue.Empty):
                message = self.inbox[src].get(timeout=0.2)
                if isinstance(message, RankError):
                    raise message
                return message
            self.heartbeat.check(src, who)

    def poll(self, src):
        # qsize() is exact: the main thread is the only reader
        return [self.get(src, f"rank {src}") for _ in range(self.inbox[src].qsize())]

    def close(self):
        for thread in self.threads:  # each ends at its sender's last message
            thread.join(self.timeout.total_seconds())

# -----------------------------------------------------------------------------
# collectives among the trainers, and the weights' way to the samplers

def all_reduce_sums(sums, maxima=None):
    """{name: number} summed (and `maxima` maxed) over the trainers -> {name: float};
    no-op alone."""
    maxima = maxima or {}
    values, peaks = (torch.tensor([float(v) for v in d.values()], dtype=torch.double)
                     for d in (sums, maxima))
    if dist.is_initialized() and dist.get_world_size() > 1:
        with naming_peers("a trainer rank died or stopped answering"):
            dist.all_reduce(values)
            if len(peaks):
                dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    return {**dict(zip(sums, values.tolist())), **dict(zip(maxima, peaks.tolist()))}


def gather_objects(obj):
    out = [None] * dist.get_world_size()
    with naming_peers("a trainer rank died or stopped answering"):
        dist.all_gather_object(out, obj)
    return out


def agree(batch, last, generated, signalled):
    """Data-parallel ranks at a step: every rank's share of the batch -> one batch, one stop decision
    (a signal's too), the tokens all of them decoded."""
    batches, stops, decoded, signals = zip(*gather_objects((batch, last, generated, signalled)))
    return [g for share in batches for g in share], any(stops), sum(decoded), any(signals)


def send_step(layout, batch, step):
    """The master's batch to its follower trainers (each trains its share of the rows)."""
    for rank in range(1, layout.trainers) if layout.samplers else ():
        layout.mailbox.send(rank, ("step", batch, step))


def follow(layout, train, push, save):
    """A follower trainer's life: its share of each step the master sends (train(batch, step), then
    push(version): its part of the broadcast) and of each checkpoint (save(): full_state gathers
    from every trainer), until "stop" -> the exit code that carries."""
    while (message := layout.mailbox.get(0, "the master (rank 0)"))[0] != "stop":
        if message[0] == "save":
            save()
            continue
        _, batch, step = message
        train(batch, step)
        push(step + 1)
    return message[1]


def bucket_plan(shapes, bucket_bytes, element_size):
    """[(name, shape)] -> buckets [[(name, shape), ...]]:
    consecutive tensors up to bucket_bytes, or one."""
    buckets, size = [], 0
    for name, shape in shapes:
        nbytes = int(np.prod(shape)) * element_size
        if not buckets or size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append((name, tuple(shape)))
        size += nbytes
    return buckets


def unflatten(bucket, flat):
    parts = flat.split([int(np.prod(shape)) for _, shape in bucket])
    return ((name, part.view(shape)) for (name, shape), part in zip(bucket, parts))


def broadcast(group, tensor, deadline_s, peers, work=None):
    """One broadcast from the weight group's rank 0 (`work`: connect's);
    failed or stalled -> RankError."""
    # polled under a deadline: NCCL's own wait does not block the CPU,
    # and its watchdog aborts naming no one
    with naming_peers(f"the weight broadcast with {peers} failed"):
        work = work or group.broadcast([tensor], dist.BroadcastOptions())  # rootRank 0, the default
        deadline = time.time() + deadline_s
        while not work.is_completed():
            # a pending NCCL op cannot be cancelled: abort the group, then name the peer
            if time.time() > deadline:
                group.abort()
                raise RankError(f"the weight broadcast with {peers} did not complete within "
                                f"{deadline_s:g} s (rank_timeout): dead or stopped?")
            time.sleep(0.001)
        work.wait()


def connect(group, device, deadline_s, peers):
    """The weight group's first broadcast, under the deadline
    (NCCL connects in it; gloo when built)."""
    # NCCL builds its communicator in the first collective, blocking until every rank joins, with no
    # Work to poll and out of abort()'s reach (torch 2.11, 2.13: ProcessGroupNCCL.cpp collective()
    # -> initNCCLComm -> ncclCommInitRankConfig), so a watched thread issues it and a peer alive but
    # stuck (SIGSTOP, a CUDA hang) is named
    one, issued = torch.zeros(1, device=device), []

    def issue():
        if device.type == "cuda":
            torch.cuda.set_device(device)  # the current device is per thread
        try:
            issued.append(group.broadcast([one], dist.BroadcastOptions()))
        except BaseException as e:  # raised again below, named
            issued.append(e)
    start_thread(issue, (), "weight-group-connect").join(deadline_s)
    if not issued:  # still inside NCCL's communicator init: it cannot be cancelled,
                    # the process exits instead
        group.abort()
        raise RankError(f"{peers} did not join the weight group within {deadline_s:g} s "
                        "(rank_timeout): stopped?")
    with naming_peers(f"the weight broadcast with {peers} failed"):
        if isinstance(issued[0], BaseException):
            raise issued[0]
    broadcast(group, one, deadline_s, peers, work=issued[0])


def receive_buckets(group, plan, dtype, device, deadline_s):
    """A sampler's side of the push -> (name, tensor) views,
    a bucket at a time (vLLM loads each)."""
    for bucket in plan:
        flat = torch.empty(sum(int(np.prod(shape)) for _, shape in bucket), dtype=dtype,
                           device=device)
        broadcast(group, flat, deadline_s, "the master (rank 0)")
        yield from unflatten(bucket, flat)

# -----------------------------------------------------------------------------
# the master's view of the sampler ranks:
# a sampler's interface (add, step, pop_finished, update_weights)

class RemoteSamplers:
    def __init__(self, layout, timeout_s):
        self.layout, self.timeout_s = layout, timeout_s
        self.ranks = list(range(layout.trainers, layout.world))
        # per rank: the groups handed out and not yet returned (add: to the least loaded),
        # when it last sent
        self.load, self.heard = {r: 0 for r in self.ranks}, {r: time.time() for r in self.ranks}
        self.finished = []

    @property
    def num_unfinished(self):
        return sum(self.load.values())

    def add(self, prompt_id, prompt_ids, n, think_budget=None, validation=False):
        rank = min(self.ranks, key=lambda r: self.load[r])
        self.layout.mailbox.send(rank, ("add", prompt_id, list(prompt_ids), n, think_budget,
                                        validation))
        self.load[rank] += 1

    def step(self):
        tokens, now = 0, time.time()
        for rank in self.ranks:
            # ("groups", [Group], tokens)
            for _, groups, generated in self.layout.mailbox.poll(rank):
                self.finished += groups
                self.load[rank] -= len(groups)
                tokens += generated
                self.heard[rank] = now
        if not tokens and not self.finished:
            time.sleep(0.002)  # nothing yet: do not spin
            for rank in self.ranks:
                self.layout.heartbeat.check(rank, f"sampler rank {rank}")
                # alive, but no progress
                if self.load[rank] and now - self.heard[rank] > self.timeout_s:
                    raise RankError(f"sampler rank {rank} sent nothing for {self.timeout_s:.0f} s "
                                    "(rank_timeout)")
        return tokens

    def pop_finished(self):
        finished, self.finished = self.finished, []
        return finished

    def update_weights(self, plan, flats, dtype, version):
        for rank in self.ranks:  # the plan (policy.weight_plan) first,
                                 # then each bucket as it is broadcast
            self.layout.mailbox.send(rank, ("weights", version, plan, dtype))
        peers = (
            f"sampler rank{'s' if len(self.ranks) > 1 else ''} {', '.join(map(str, self.ranks))}")
        for flat in flats:
            broadcast(self.layout.weight_group, flat.to(self.layout.device), self.timeout_s, peers)

    def stop(self, code=0):
        """The last message to every other rank: followers and samplers stop
        (a sampler answers "bye") and exit with `code` (PREEMPTED after a stop signal)."""
        for rank in range(1, self.layout.world):
            self.layout.mailbox.send(rank, ("stop", code))


def serve(sampler, layout, timeout_s, report_s=1.0):
    """A sampler rank's life: prompts and weights from the master, decoding without pause,
    groups back -> the exit code the master's "stop" carries."""
    mailbox, reported, tokens = layout.mailbox, time.time(), 0
    while True:
        for message in mailbox.poll(0):
            if message[0] == "add":
                sampler.add(*message[1:])
            elif message[0] == "weights":  # join the master's broadcasts,
                                           # load each bucket as it lands
                _, version, plan, dtype = message
                buckets = receive_buckets(layout.weight_group, plan, dtype, layout.device,
                                          timeout_s)
                sampler.update_weights(buckets, version)
            elif message[0] == "stop":
                mailbox.send(0, ("bye",))
                return message[1]
        if sampler.num_unfinished:
            tokens += sampler.step()
            groups = sampler.pop_finished()
            if groups or time.time() - reported > report_s:  # while it works,
                                                             # the master's sign of progress
                mailbox.send(0, ("groups", groups, tokens))
                reported, tokens = time.time(), 0
        else:
            time.sleep(0.002)
            layout.heartbeat.check(0, "the master (rank 0)")
