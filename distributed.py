"""
The multi-process layout of train.py, on plain torch.distributed under torchrun (one node or many):

    torchrun --nproc_per_node=N train.py --n_samplers=S        (T = N - S trainer ranks)

    role            ranks          what it does
    master          0              trains its share of every batch (FSDP2 with the followers); owns the
                                   curriculum, the log, validation and checkpoints; hands prompts to the
                                   samplers and pushes them the weights after every step
    follower        1 .. T-1       trains its share of the batches the master sends
    sampler         T .. N-1       generates all the time; new weights land between two engine steps
    data_parallel   all, if S = 0  each rank samples and trains its own share of the prompts
    single          python train.py: sampler and trainer take turns in one process

Four channels, none of them a default process group over the whole job (an in-process vLLM engine on
a sampler rank adopts such a group as its own world and waits for ranks that never come):
    trainer group   the trainers' default group (gloo for CPU tensors, NCCL for CUDA): FSDP2, the stats
    control group   gloo over every rank, CPU tensors only: Mailbox messages (prompts to generate,
                    finished groups with their token ids / log-probs / versions / masks as arrays, the
                    batch for the followers, stop). Each rank receives on one thread per peer.
    weight group    the master and the samplers (NCCL on GPUs, gloo on CPU): the weights in buckets
    heartbeat       a counter per rank in torchrun's store, bumped every second by a thread. A rank that
                    waits on a peer waits as long as the peer's counter moves (it may be validating for
                    hours); a counter that stands still for rank_timeout fails the job naming the rank.
Every failure a peer causes surfaces as a RankError that names it; train.py prints it and exits 1.
"""

import copy
import datetime
import os
import pickle
import queue
import sys
import threading
import time
from collections import namedtuple
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import torch
import torch.distributed as dist

from sample import Group

Layout = namedtuple("Layout", "rank world role trainers samplers trainer_rank device store mailbox weight_group heartbeat")
TAG = 7  # the control group's point-to-point tag (its collectives use their own slots)


class RankError(RuntimeError):
    """A peer rank died or stopped answering: the message names it."""


def rank_error_hook(rank):
    """sys.excepthook for train.py: a RankError is one line naming the peer and exit code 1 at once (the
    peer may hold collectives open: no clean-up is attempted); anything else is a normal traceback."""
    def hook(kind, error, traceback):
        if issubclass(kind, RankError):
            print(f"train.py: rank {rank}: {error}", file=sys.stderr, flush=True)
            os._exit(1)
        sys.__excepthook__(kind, error, traceback)
    return hook


@contextmanager
def naming_peers(what):
    """Collective failures (gloo timeouts, lost peers: RuntimeErrors) -> a RankError saying `what`."""
    try:
        yield
    except RankError:
        raise
    except RuntimeError as e:
        raise RankError(f"{what}: {str(e).splitlines()[0]}") from None

# -----------------------------------------------------------------------------
# placement and setup

def gpu_for(local_rank, visible):
    """This rank's GPU as CUDA_VISIBLE_DEVICES names it: the local_rank-th entry of the mask the cluster
    scheduler set (indices, UUIDs or MIG ids, e.g. "3,5" -> rank 1 gets "5"), or str(local_rank) unset."""
    if not visible:
        return str(local_rank)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if local_rank >= len(entries):
        raise ValueError(f"local rank {local_rank} has no GPU: CUDA_VISIBLE_DEVICES={visible!r} lists {len(entries)}")
    return entries[local_rank]


def place(n_samplers, sampler, device_type):
    """Before anything initialises CUDA: refuse layouts that would put two ranks (so two vLLM engines, or
    an engine beside a trainer) on one GPU, and let a vLLM sampler rank see only its own GPU (an
    in-process engine takes cuda:0 of what it sees). Raises ValueError with a one-line reason."""
    world, local_world = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if sampler == "vllm" and n_samplers == 0 and world > 1:
        raise ValueError("sampler='vllm' with n_samplers=0 would start one vLLM engine per data-parallel rank "
                         "inside the trainers' process group; give vLLM its own ranks with --n_samplers=S")
    if device_type != "cuda":
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    n_gpus = len([e for e in visible.split(",") if e.strip()]) if visible else torch.cuda.device_count()
    if local_world > n_gpus:
        raise ValueError(f"{local_world} ranks on this node but {n_gpus} GPUs visible: two ranks would share a GPU; "
                         f"launch --nproc_per_node={n_gpus} or fewer")
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    if sampler == "vllm" and rank >= world - n_samplers > 0:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu_for(local_rank, visible)
    os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")  # as vLLM sets it: the weight broadcast's two ends agree


def setup(n_samplers, timeout_s, device_type, sampler):
    """Read torchrun's environment, make the groups, start the heartbeat -> Layout. One process: no groups."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    trainers = world - n_samplers
    role = ("single" if world == 1 else "data_parallel" if n_samplers == 0 else "master" if rank == 0 else
            "follower" if rank < trainers else "sampler")
    own_gpu = role == "sampler" and sampler == "vllm"  # place() narrowed CUDA_VISIBLE_DEVICES to one GPU
    device = torch.device(("cuda:0" if own_gpu else f"cuda:{local_rank}") if device_type == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world == 1:
        return Layout(0, 1, role, 1, 0, 0, device, None, None, None, None)
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timeout)  # torchrun's own rendezvous store, as a client
    if rank < trainers:  # the trainers' default group: FSDP2 and the stats see only trainers
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.PrefixStore("scalerl/trainers", store), rank=rank,
                                world_size=trainers, timeout=timeout)
    if n_samplers == 0:  # data parallel: the trainer group is all it needs
        return Layout(rank, world, role, trainers, 0, rank, device, store, None, None, None)
    heartbeat = Heartbeat(rank, timeout_s)
    # control: no timeout of its own (a receiving thread waits for as long as the sender lives; liveness is
    # the heartbeat's job); sends carry rank_timeout
    control = dist.ProcessGroupGloo(dist.PrefixStore("scalerl/control", store), rank, world, datetime.timedelta(days=30))
    peers = range(1, world) if rank == 0 else [0]  # the master talks to everyone, the others to the master
    senders = range(trainers, world) if rank == 0 else [0]  # the master hears from the samplers only
    mailbox = Mailbox(control, peers, senders, timeout_s, heartbeat)
    weight_group = None
    if rank == 0 or rank >= trainers:  # the master is rank 0 of it, samplers follow
        group_rank, size = (0 if rank == 0 else rank - trainers + 1), n_samplers + 1
        weight_store = dist.PrefixStore("scalerl/weights", store)
        if device.type == "cuda":  # torch 2.13 distributed_c10d.py:2194-2208 builds its NCCL groups this way
            options = dist.ProcessGroupNCCL.Options()
            options.is_high_priority_stream, options._timeout = False, timeout
            weight_group = dist.ProcessGroupNCCL(weight_store, group_rank, size, options)
        else:
            weight_group = dist.ProcessGroupGloo(weight_store, group_rank, size, timeout)
    return Layout(rank, world, role, trainers, n_samplers, rank if rank < trainers else None, device, store,
                  mailbox, weight_group, heartbeat)


def master_first(layout, build):
    """Run build() on the master only (e.g. the tiny model's warm-up); the other ranks wait for its result."""
    if layout.world == 1:
        return build()
    if layout.rank == 0:
        result = build()
        layout.store.set("scalerl/master_first", result)
        return result
    try:
        return layout.store.get("scalerl/master_first").decode()  # waits, up to rank_timeout
    except dist.DistStoreError:
        raise RankError("the master (rank 0) did not finish preparing the model within "
                        "rank_timeout (building the tiny model takes about a minute; or rank 0 died)") from None


def finish(layout):
    """Tear down in order, so that nothing outlives __main__ (a thread or group alive at interpreter exit
    aborts the process: "terminate called without an active exception"): the receiving threads (every
    peer has sent its last message), the heartbeat, the point-to-point groups, the trainers' group."""
    if layout.mailbox:
        layout.mailbox.close()
    if layout.heartbeat:
        layout.heartbeat.close()
    for group in (layout.weight_group, layout.mailbox and layout.mailbox.group):
        if group is not None:
            group.shutdown()
    if layout.role in ("master", "follower", "data_parallel"):  # the trainers' group (vLLM owns any other)
        dist.destroy_process_group()

# -----------------------------------------------------------------------------
# liveness and messages

class Heartbeat:
    """Every rank bumps scalerl/alive/<rank> in torchrun's store once a second from a thread, whatever the
    main thread is doing (validation, a checkpoint, a long step). check(peer) fails when the peer's counter
    has not moved for timeout_s: its process is gone or stopped, not merely busy."""

    def __init__(self, rank, timeout_s, period_s=1.0):
        self.timeout_s, self.period_s, self.seen = timeout_s, period_s, {}
        connect = lambda: dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                                        timeout=datetime.timedelta(seconds=timeout_s))
        self.store, beat_store = connect(), connect()  # the thread has its own connection
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._beat, args=(beat_store, f"scalerl/alive/{rank}"),
                                       name="heartbeat", daemon=True)
        self.thread.start()

    def _beat(self, store, key):
        while True:
            try:
                store.add(key, 1)
            except RuntimeError:  # the store is gone: the job is ending
                return
            if self.stopping.wait(self.period_s):
                return

    def check(self, peer, who):
        """Raise a RankError naming `who` if the peer's counter stood still for timeout_s (one store read a second)."""
        now = time.time()
        count, changed, checked = self.seen.get(peer, (None, now, 0.0))
        if now - checked < self.period_s:
            return
        latest = self.store.add(f"scalerl/alive/{peer}", 0)
        if latest != count:
            count, changed = latest, now
        self.seen[peer] = (count, changed, now)
        if now - changed > self.timeout_s:
            raise RankError(f"{who} shows no sign of life for {self.timeout_s:g} s (rank_timeout): dead or stopped")

    def close(self):
        self.stopping.set()
        self.thread.join()


def pack(message):
    """A message (a tuple of plain values, Groups and Completions) -> one uint8 tensor. The per-token lists
    travel as arrays (token ids and versions int32, log-probs fp32, masks bool: 13 bytes a token), as
    pickle protocol 5's out-of-band buffers beside a small pickle: [count, lengths..., pickle, buffers...]."""
    def to_arrays(x):
        if isinstance(x, Group):
            return replace(x, prompt_ids=np.asarray(x.prompt_ids, np.int32), completions=[
                replace(c, token_ids=np.asarray(c.token_ids, np.int32), logprobs=np.asarray(c.logprobs, np.float32),
                        versions=np.asarray(c.versions, np.int32), policy_mask=np.asarray(c.policy_mask, bool))
                for c in x.completions])
        return type(x)(map(to_arrays, x)) if isinstance(x, (tuple, list)) else x
    buffers = []
    body = pickle.dumps(to_arrays(message), protocol=5, buffer_callback=buffers.append)
    parts = [body] + [b.raw() for b in buffers]
    header = np.array([len(parts)] + [len(p) for p in parts], np.int64).tobytes()
    return torch.frombuffer(bytearray(b"".join([header, *parts])), dtype=torch.uint8)


def unpack(payload):
    """pack's inverse; the arrays become lists again (what sample.py and train.py work with)."""
    raw = payload.numpy().tobytes()
    count = int(np.frombuffer(raw, np.int64, 1)[0])
    lengths = np.frombuffer(raw, np.int64, count, 8).tolist()
    offsets = np.cumsum([8 * (count + 1)] + lengths).tolist()
    body, *buffers = [memoryview(raw)[a:b] for a, b in zip(offsets, offsets[1:])]
    def to_lists(x):
        if isinstance(x, Group):
            return replace(x, prompt_ids=x.prompt_ids.tolist(), completions=[
                replace(c, token_ids=c.token_ids.tolist(), logprobs=c.logprobs.tolist(),
                        versions=c.versions.tolist(), policy_mask=c.policy_mask.tolist()) for c in x.completions])
        return type(x)(map(to_lists, x)) if isinstance(x, (tuple, list)) else x
    return to_lists(pickle.loads(body, buffers=buffers))


class Mailbox:
    """Ordered messages between this rank and its peers over the control group (gloo, point to point): a
    message is an int64 length and a uint8 payload (pack). One thread per sender receives into a queue, so
    poll() never blocks: the master trains while groups arrive, samplers decode while prompts do. A
    message whose kind is "stop" or "bye" is the sender's last; its thread ends there."""

    def __init__(self, group, peers, senders, timeout_s, heartbeat):
        self.group, self.timeout, self.heartbeat = group, datetime.timedelta(seconds=timeout_s), heartbeat
        self.peers, self.inbox = list(peers), {src: queue.Queue() for src in senders}
        self.threads = [threading.Thread(target=self._receive, args=(src,), name=f"mail-from-{src}", daemon=True)
                        for src in senders]
        for thread in self.threads:
            thread.start()

    def _receive(self, src):
        try:
            while True:
                length = torch.zeros(1, dtype=torch.int64)
                self.group.recv([length], src, TAG).wait()
                payload = torch.empty(int(length), dtype=torch.uint8)
                self.group.recv([payload], src, TAG).wait()
                message = unpack(payload)
                self.inbox[src].put(message)
                if message[0] in ("stop", "bye"):
                    return
        except RuntimeError as e:  # the connection broke: the sender died
            self.inbox[src].put(RankError(f"rank {src} broke its connection: {str(e).splitlines()[0]}"))

    def send(self, dst, message):
        payload = pack(message)
        with naming_peers(f"rank {dst} did not take a message within rank_timeout (dead or stopped?)"):
            self.group.send([torch.tensor([payload.numel()])], dst, TAG).wait(self.timeout)
            self.group.send([payload], dst, TAG).wait(self.timeout)

    def broadcast(self, message):
        for dst in self.peers:
            self.send(dst, message)

    def poll(self, src):
        """Every message from src that has arrived, without waiting."""
        messages = []
        while True:
            try:
                message = self.inbox[src].get_nowait()
            except queue.Empty:
                return messages
            if isinstance(message, RankError):
                raise message
            messages.append(message)

    def get(self, src, who):
        """The next message from src, waiting as long as src is alive (its heartbeat moves)."""
        while True:
            try:
                message = self.inbox[src].get(timeout=0.2)
            except queue.Empty:
                self.heartbeat.check(src, who)
                continue
            if isinstance(message, RankError):
                raise message
            return message

    def close(self):
        """Wait for every sender's last message (their threads end there)."""
        for thread in self.threads:
            thread.join(self.timeout.total_seconds())

# -----------------------------------------------------------------------------
# the trainer's parameters: fp32 master weights, bf16 compute, FSDP2 across trainers

def shard(model, dtype, root):
    """FSDP2 over the trainers' group, as its authors intend: every decoder layer, then the root (the
    embeddings, the final norm and the head: `root` is the module whose forward uses them, loss.TokenLogprobs).
    Parameters and AdamW state stay fp32 and sharded; each forward gathers the layer in `dtype` (bf16 on GPUs)
    and gradients are reduced in fp32 (MixedPrecisionPolicy). Layers reshard after forward; the root keeps its
    parameters gathered through the backward (FSDP2's default for the root)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for layer in model.base_model.layers:
        fully_shard(layer, mp_policy=policy, reshard_after_forward=True)
    fully_shard(root, mp_policy=policy)


def compute_copy(model, dtype):
    """One process, or data parallel, in bf16: the same numerics as FSDP2's MixedPrecisionPolicy without
    FSDP2. `model` keeps the fp32 parameters (AdamW steps them, checkpoints save them); the returned copy
    in `dtype` runs forward and backward (and, in one process, decodes). add_grads() after each micro-batch,
    copy_weights() after each step. In fp32 the model is its own compute copy."""
    return model if dtype == torch.float32 else copy.deepcopy(model).to(dtype)


@torch.no_grad()
def add_grads(model, compute):
    """The compute copy's gradients of one micro-batch, added to the fp32 parameters' (accumulated in fp32)."""
    if compute is model:
        return
    for p, c in zip(model.parameters(), compute.parameters()):
        if c.grad is not None:
            p.grad = c.grad.float() if p.grad is None else p.grad.add_(c.grad)
            c.grad = None


@torch.no_grad()
def copy_weights(model, compute):
    """After an optimizer step: the compute copy takes the new fp32 weights, rounded to its dtype."""
    if compute is not model:
        for p, c in zip(model.parameters(), compute.parameters()):
            c.copy_(p)


def sync_grads(model, n_trainers):
    """Data parallel (plain modules): average the gradients over the trainers, one all-reduce of one flat
    buffer. FSDP2 modules (DTensor gradients) reduce their own."""
    grads = [p.grad for p in model.parameters() if p.grad is not None and not hasattr(p.grad, "full_tensor")]
    if n_trainers == 1 or not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    with naming_peers("a data-parallel rank died or stopped answering"):
        dist.all_reduce(flat)
    flat /= n_trainers
    for g, part in zip(grads, torch.split(flat, [g.numel() for g in grads])):
        g.copy_(part.view_as(g))


def all_reduce_sums(sums, maxima=None):
    """{name: number} summed (and `maxima` maxed) over the trainers -> {name: float}; no-op alone."""
    maxima = maxima or {}
    values = torch.tensor([float(v) for v in sums.values()], dtype=torch.float64)
    peaks = torch.tensor([float(v) for v in maxima.values()], dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        with naming_peers("a trainer rank died or stopped answering"):
            dist.all_reduce(values)
            if len(peaks):
                dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    return {**dict(zip(sums, values.tolist())), **dict(zip(maxima, peaks.tolist()))}


def gather_objects(obj):
    """Every trainer's object -> the list of them, on every trainer (data parallel: each rank's share)."""
    out = [None] * dist.get_world_size()
    with naming_peers("a trainer rank died or stopped answering"):
        dist.all_gather_object(out, obj)
    return out

# -----------------------------------------------------------------------------
# weights in buckets: trainers -> master -> every sampler, never a second full copy anywhere

def bucket_plan(shapes, bucket_bytes, element_size):
    """[(name, shape)] in order -> buckets [[(name, shape), ...], ...]: consecutive tensors while they fit in
    bucket_bytes; a tensor larger than a bucket travels alone (its bucket is that tensor)."""
    buckets, size = [[]], 0
    for name, shape in shapes:
        nbytes = int(np.prod(shape)) * element_size
        if buckets[-1] and size + nbytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append((name, tuple(shape)))
        size += nbytes
    return [b for b in buckets if b]


def gather_to_master(param, dtype):
    """A parameter's full tensor in `dtype` on trainer rank 0, None on the others. FSDP2 shards (DTensors
    split in dim-0 chunks of ceil(n / T) rows, the last ones shorter or empty) are cast, padded to one
    chunk and gathered straight into one buffer on rank 0 only: followers never hold a full tensor."""
    if not hasattr(param, "full_tensor"):
        return param.detach().to(dtype)  # one trainer, or data parallel: every rank holds it whole
    world, rank = dist.get_world_size(), dist.get_rank()
    rows = param.shape[0]
    chunk = -(-rows // world)
    local = param.to_local().detach()
    padded = local.to(dtype) if local.shape[0] == chunk else torch.cat([local.to(dtype), local.new_zeros(
        (chunk - local.shape[0], *local.shape[1:]), dtype=dtype)])
    full = padded.new_empty((chunk * world, *param.shape[1:])) if rank == 0 else None
    with naming_peers("a trainer rank died or stopped answering (weight gather)"):
        dist.gather(padded, list(full.chunk(world)) if full is not None else None, dst=0)
    return full[:rows] if full is not None else None


def weight_plan(model, bucket_bytes, dtype):
    """The buckets of a push: the model's parameters in order, sized as `dtype` (what the samplers run)."""
    shapes = [(name, tuple(p.shape)) for name, p in model.named_parameters()]
    return bucket_plan(shapes, bucket_bytes, torch.finfo(dtype).bits // 8)


def weight_buckets(model, plan, dtype):
    """Every trainer iterates it (the gathers are collectives) -> one flat `dtype` tensor per bucket on the
    master, None elsewhere. Each tensor is packed into the bucket as its gather lands, so the master holds
    at most the bucket and one gathered tensor (a bucket of one tensor is that tensor, not a copy)."""
    params = dict(model.named_parameters())
    for bucket in plan:
        flat, offset = None, 0
        for name, shape in bucket:
            full = gather_to_master(params[name], dtype)
            if full is not None and len(bucket) == 1:
                flat = full.reshape(-1)
            elif full is not None:
                if flat is None:
                    flat = full.new_empty(sum(int(np.prod(s)) for _, s in bucket))
                flat[offset:offset + full.numel()].copy_(full.reshape(-1))
            offset += int(np.prod(shape))
            del full
        yield flat


def unflatten(bucket, flat):
    """A bucket's flat tensor -> (name, view) in plan order."""
    offset = 0
    for name, shape in bucket:
        n = int(np.prod(shape))
        yield name, flat[offset:offset + n].view(shape)
        offset += n


def broadcast(group, tensor, deadline_s, peers):
    """One broadcast from the weight group's rank 0, waited for with a deadline (NCCL's own wait does not
    block the CPU and its watchdog would abort without a name): a failure or a silent peer -> RankError."""
    options = dist.BroadcastOptions()
    options.rootRank = 0
    with naming_peers(f"the weight broadcast with {peers} failed"):
        work = group.broadcast([tensor], options)
        deadline = time.time() + deadline_s
        while not work.is_completed():
            if time.time() > deadline:
                raise RankError(f"the weight broadcast with {peers} did not complete within "
                                f"{deadline_s:.0f} s (rank_timeout): dead or stopped?")
            time.sleep(0.001)
        work.wait()


def receive_buckets(group, plan, dtype, device, deadline_s):
    """A sampler's side of the push -> (name, tensor) views of one bucket at a time, as they arrive (vLLM's
    reload_weights consumes the iterator, loading each bucket before the next is received)."""
    for bucket in plan:
        flat = torch.empty(sum(int(np.prod(shape)) for _, shape in bucket), dtype=dtype, device=device)
        broadcast(group, flat, deadline_s, "the master (rank 0)")
        yield from unflatten(bucket, flat)

# -----------------------------------------------------------------------------
# the master's view of the sampler ranks: the same interface as a sampler in the same process

class RemoteSamplers:
    """What train.py's loop drives on the master when the samplers are other ranks: add() hands a group
    to the least loaded sampler, step() collects what they finished, update_weights() pushes the weights
    bucket by bucket (they apply them between two engine steps, in flight)."""

    def __init__(self, layout, timeout_s):
        self.layout, self.timeout_s = layout, timeout_s
        self.ranks = list(range(layout.trainers, layout.world))
        self.load = {r: 0 for r in self.ranks}  # groups handed out and not yet returned
        self.heard = {r: time.time() for r in self.ranks}
        self.finished, self.version = [], 0

    @property
    def num_unfinished(self):
        return sum(self.load.values())

    def add(self, prompt_id, prompt_ids, n):
        rank = min(self.ranks, key=lambda r: self.load[r])
        self.layout.mailbox.send(rank, ("add", prompt_id, list(prompt_ids), n))
        self.load[rank] += 1

    def step(self):
        tokens, now = 0, time.time()
        for rank in self.ranks:
            for _, groups, generated in self.layout.mailbox.poll(rank):  # ("groups", [Group], tokens)
                self.finished += groups
                self.load[rank] -= len(groups)
                tokens += generated
                self.heard[rank] = now
        if not tokens and not self.finished:
            time.sleep(0.002)  # nothing yet: do not spin
            for rank in self.ranks:
                self.layout.heartbeat.check(rank, f"sampler rank {rank}")
                if self.load[rank] and now - self.heard[rank] > self.timeout_s:  # alive, but no progress
                    raise RankError(f"sampler rank {rank} sent nothing for {self.timeout_s:.0f} s (rank_timeout)")
        return tokens

    def pop_finished(self):
        finished, self.finished = self.finished, []
        return finished

    def update_weights(self, plan, flats, dtype, version):
        """plan: weight_plan(...); flats: weight_buckets(...) on the master. The samplers learn the plan, then
        take each bucket as it is broadcast."""
        for rank in self.ranks:
            self.layout.mailbox.send(rank, ("weights", version, plan, str(dtype).removeprefix("torch.")))
        peers = f"sampler rank{'s' if len(self.ranks) > 1 else ''} {', '.join(map(str, self.ranks))}"
        for flat in flats:
            broadcast(self.layout.weight_group, flat.to(self.layout.device), self.timeout_s, peers)
        self.version = version

    def stop(self):
        """The samplers' last message; each answers "bye" (its last) and exits."""
        for rank in self.ranks:
            self.layout.mailbox.send(rank, ("stop",))


def serve(sampler, layout, timeout_s, report_s=1.0):
    """A sampler rank's whole life: take prompts and weights from the master, decode without pause, send
    finished groups (and, every report_s while it has work, its token count: the master's sign of progress)."""
    mailbox, reported, tokens = layout.mailbox, time.time(), 0
    while True:
        for message in mailbox.poll(0):
            if message[0] == "add":
                sampler.add(*message[1:])
            elif message[0] == "weights":  # join the master's broadcasts, load each bucket as it lands
                _, version, plan, dtype = message
                sampler.update_weights(receive_buckets(layout.weight_group, plan, getattr(torch, dtype), layout.device,
                                                       timeout_s), version)
            elif message[0] == "stop":
                mailbox.send(0, ("bye",))
                return
        if sampler.num_unfinished:
            tokens += sampler.step()
            groups = sampler.pop_finished()
            if groups or time.time() - reported > report_s:
                mailbox.send(0, ("groups", groups, tokens))
                reported, tokens = time.time(), 0
        else:
            time.sleep(0.002)
            layout.heartbeat.check(0, "the master (rank 0)")
