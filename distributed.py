"""
The multi-process layout of train.py, on plain torch.distributed under torchrun (one node or many):

    torchrun --nproc_per_node=N train.py --n_samplers=S

    ranks 0 .. T-1      trainers (T = N - S): FSDP2 over the trainer ranks only; rank 0 (the master)
                        owns the curriculum, the log, validation and the checkpoints
    ranks T .. N-1      samplers: generate all the time, stream finished groups to the master, and
                        take the new weights after every optimizer step between two engine steps
    S = 0               every rank samples and trains on its own share of the prompts (data parallel)

Three channels, and no default process group spanning the whole job, so that an in-process vLLM
engine on a sampler rank can make its own one-rank world (it adopts an existing default group as
its world, then waits for ranks that never come):
    Mailbox        ordered Python messages through torchrun's rendezvous store (groups of completions,
                   prompts to generate, weight announcements); non-blocking, no threads
    trainer group  the default process group of the trainer ranks: FSDP2, the batch, the stats
    weight group   the master and the samplers: one broadcast per step (gloo on CPU, NCCL on GPUs)
A rank that dies breaks the collectives it is in; one that stops answering is caught by a
deadline (rank_timeout); either way every rank exits non-zero with a message naming the rank.
"""

import datetime
import os
import pickle
import time
from collections import defaultdict, namedtuple
from contextlib import contextmanager

import torch
import torch.distributed as dist

Layout = namedtuple("Layout", "rank world trainers samplers is_sampler master store weight_group device")


class RankError(RuntimeError):
    """A peer rank died or stopped answering: the message names it."""


@contextmanager
def naming_peers(what):
    """Collective failures (gloo and NCCL timeouts, lost peers: RuntimeErrors) -> a RankError saying `what`."""
    try:
        yield
    except RuntimeError as e:
        raise RankError(f"{what}: {str(e).splitlines()[0]}") from None


def setup(n_samplers, timeout_s, device_type):
    """Read torchrun's environment and make the process groups -> Layout. One process: no groups."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}" if device_type == "cuda" else "cpu")
    if world == 1:
        return Layout(0, 1, 1, 0, False, True, None, None, device)
    trainers = world - n_samplers
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timeout)  # torchrun's own rendezvous store, as a client
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if rank < trainers:  # the trainers' default group: FSDP2 and collectives see only trainers
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.PrefixStore("scalerl/trainers", store), rank=rank,
                                world_size=trainers, timeout=timeout)
    weight_group = None
    if n_samplers and (rank == 0 or rank >= trainers):  # the master is rank 0 of it, samplers follow
        group_rank = 0 if rank == 0 else rank - trainers + 1
        weight_store = dist.PrefixStore("scalerl/weights", store)
        if device.type == "cuda":
            weight_group = dist.ProcessGroupNCCL(weight_store, group_rank, n_samplers + 1)
        else:
            weight_group = dist.ProcessGroupGloo(weight_store, group_rank, n_samplers + 1, timeout)
    return Layout(rank, world, trainers, n_samplers, rank >= trainers, rank == 0, store, weight_group, device)


def pin_sampler_gpu(n_samplers, sampler, device_type):
    """A vLLM sampler rank sees only its own GPU: an in-process engine takes cuda:0 of what it sees.
    Must run before anything initialises CUDA (GPU only; not executed on CPU)."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if device_type == "cuda" and sampler == "vllm" and rank >= world - n_samplers > 0:
        os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("LOCAL_RANK", "0")
        os.environ["LOCAL_RANK"] = "0"
    os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")  # as vLLM sets it: the weight broadcast's two ends agree


def master_first(layout, build):
    """Run build() on the master only (e.g. the tiny model's warm-up); the other ranks wait for its result."""
    if layout.world == 1:
        return build()
    if layout.master:
        result = build()
        layout.store.set("scalerl/master_first", result)
        return result
    try:
        return layout.store.get("scalerl/master_first").decode()  # waits, up to rank_timeout
    except dist.DistStoreError:
        raise RankError("the master (rank 0) did not finish preparing the model within "
                        "rank_timeout (building the tiny model takes about a minute; or rank 0 died)") from None


def finish(layout):
    """Tear down the trainers' group (a sampler rank's default group, if any, is vLLM's own)."""
    if layout.world > 1 and not layout.is_sampler:
        dist.destroy_process_group()

# -----------------------------------------------------------------------------
# trainers: FSDP2 over the decoder layers, gradient averaging and clipping, collectives that name the culprit

def shard(model):
    """FSDP2 (fully_shard) on every decoder layer, over the trainers' default group. The embeddings,
    the final norm and the LM head stay whole on every trainer (sync_grads averages their gradients):
    loss.token_logprobs reads the head's weight directly for the fp32 head, outside any forward."""
    from torch.distributed.fsdp import fully_shard
    for layer in model.base_model.layers:
        fully_shard(layer)


def sync_grads(model, n_trainers):
    """Average over the trainers the gradients FSDP2 does not reduce (all of them under plain data
    parallelism): one all-reduce of one flat buffer."""
    grads = [p.grad for p in model.parameters() if p.grad is not None and not hasattr(p.grad, "full_tensor")]
    if n_trainers == 1 or not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= n_trainers
    for g, part in zip(grads, torch.split(flat, [g.numel() for g in grads])):
        g.copy_(part.view_as(g))


def clip_grad_norm(model, max_norm):
    """torch's clip_grad_norm_ for a model whose layers are FSDP2 shards (DTensor) and the rest whole:
    the shards' squares are summed over the trainers, the whole gradients counted once."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros(())
    sharded = [g.to_local() for g in grads if hasattr(g, "full_tensor")]
    whole = [g for g in grads if not hasattr(g, "full_tensor")]
    squares = lambda gs: torch.stack([g.float().pow(2).sum() for g in gs]).sum() if gs else 0.0  # on the device
    total = squares(whole)
    if sharded:
        shard_squares = squares(sharded)
        dist.all_reduce(shard_squares)
        total = total + shard_squares
    total = torch.as_tensor(total).sqrt()
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale)
    return total


def all_reduce_sums(sums, maxima=None):
    """{name: number} summed (and `maxima` maxed) over the trainers -> {name: float}; no-op alone."""
    maxima = maxima or {}
    values = torch.tensor([float(v) for v in sums.values()], dtype=torch.float64)
    peaks = torch.tensor([float(v) for v in maxima.values()], dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(values)
        if len(peaks):
            dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    return {**dict(zip(sums, values.tolist())), **dict(zip(maxima, peaks.tolist()))}


def broadcast_object(obj):
    """The master's object to every trainer (the others pass None) -> it."""
    box = [obj]
    with naming_peers("no word from the master (rank 0) or a trainer rank"):
        dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj):
    """Every trainer's object -> the list of them, on every trainer."""
    out = [None] * dist.get_world_size()
    with naming_peers("a trainer rank died or stopped answering"):
        dist.all_gather_object(out, obj)
    return out

# -----------------------------------------------------------------------------
# messages

class Mailbox:
    """Ordered messages between ranks through the rendezvous store: send() writes key
    "to/<dst>/from/<src>/<n>", poll() reads and deletes the keys that have arrived. Non-blocking, so
    the master keeps training while groups come in and samplers keep decoding while prompts do."""

    def __init__(self, store, rank):
        self.store, self.rank = dist.PrefixStore("scalerl/mail", store), rank
        self.sent, self.received = defaultdict(int), defaultdict(int)

    def send(self, dst, message):
        self.store.set(f"to/{dst}/from/{self.rank}/{self.sent[dst]}", pickle.dumps(message))
        self.sent[dst] += 1

    def poll(self, src):
        messages = []
        while True:
            key = f"to/{self.rank}/from/{src}/{self.received[src]}"
            if not self.store.check([key]):
                return messages
            messages.append(pickle.loads(self.store.get(key)))
            self.store.delete_key(key)
            self.received[src] += 1

# -----------------------------------------------------------------------------
# weights: the master's full tensors into every sampler, one broadcast per dtype

def full_weights(model):
    """[(name, full tensor)] of the trainer's parameters. Under FSDP2 each is a DTensor shard and
    full_tensor() all-gathers it: a collective that every trainer rank must call."""
    return [(name, p.full_tensor() if hasattr(p, "full_tensor") else p) for name, p in model.named_parameters()]


def broadcast_weights(group, named_tensors=None, spec=None, device="cpu", peers="the master (rank 0)"):
    """Master: pass named_tensors; samplers: pass the spec [(name, shape, dtype)] the master announced.
    One flat buffer per dtype, in spec order on both sides -> [(name, tensor)] in spec order.
    peers names the other end for the error message when a peer dies or stops answering."""
    spec = spec or [(name, tuple(t.shape), t.dtype) for name, t in named_tensors]
    tensors, received = dict(named_tensors or []), {}
    for dtype in sorted({d for _, _, d in spec}, key=str):
        part = [(name, torch.Size(shape)) for name, shape, d in spec if d == dtype]
        if tensors:
            flat = torch.cat([tensors[name].detach().reshape(-1).to(device) for name, _ in part])
        else:
            flat = torch.empty(sum(shape.numel() for _, shape in part), dtype=dtype, device=device)
        options = dist.BroadcastOptions()
        options.rootRank = 0
        with naming_peers(f"the weight broadcast with {peers} failed (dead or silent past rank_timeout?)"):
            group.broadcast([flat], options).wait()
        for (name, shape), t in zip(part, torch.split(flat, [shape.numel() for _, shape in part])):
            received[name] = t.view(shape)
    return [(name, received[name]) for name, _, _ in spec]

# -----------------------------------------------------------------------------
# the master's view of the sampler ranks: the same interface as a sampler in the same process

class RemoteSamplers:
    """What train.py's loop drives on the master when the samplers are other ranks: add() hands a
    group to the least loaded sampler, step() collects what they finished, update_weights()
    broadcasts the new weights (they apply them between two engine steps, in flight)."""

    def __init__(self, layout, mailbox, timeout_s):
        self.layout, self.mailbox, self.timeout_s = layout, mailbox, timeout_s
        self.ranks = list(range(layout.trainers, layout.world))
        self.load = {r: 0 for r in self.ranks}  # groups handed out and not yet returned
        self.heard = {r: time.time() for r in self.ranks}
        self.finished, self.version = [], 0

    @property
    def num_unfinished(self):
        return sum(self.load.values())

    def add(self, prompt_id, prompt_ids, n):
        rank = min(self.ranks, key=lambda r: self.load[r])
        self.mailbox.send(rank, ("add", prompt_id, list(prompt_ids), n))
        self.load[rank] += 1

    def step(self):
        tokens, now = 0, time.time()
        for rank in self.ranks:
            for kind, groups, generated in self.mailbox.poll(rank):  # ("groups", [Group], tokens)
                self.finished += groups
                self.load[rank] -= len(groups)
                tokens += generated
                self.heard[rank] = now
        if not tokens and not self.finished:
            time.sleep(0.002)  # nothing yet: do not hammer the store
            for rank in self.ranks:
                if self.load[rank] and now - self.heard[rank] > self.timeout_s:
                    raise RankError(f"sampler rank {rank} sent nothing for {self.timeout_s:.0f} s (rank_timeout)")
        return tokens

    def pop_finished(self):
        finished, self.finished = self.finished, []
        return finished

    def update_weights(self, named_tensors, version):
        spec = [(name, tuple(t.shape), t.dtype) for name, t in named_tensors]
        for rank in self.ranks:
            self.mailbox.send(rank, ("weights", version, spec))
        peers = f"sampler rank{'s' if len(self.ranks) > 1 else ''} {', '.join(map(str, self.ranks))}"
        broadcast_weights(self.layout.weight_group, named_tensors, device=self.layout.device, peers=peers)
        self.version = version

    def stop(self):
        for rank in self.ranks:
            self.mailbox.send(rank, ("stop",))


def serve(sampler, layout, mailbox, timeout_s, report_s=1.0):
    """A sampler rank's whole life: take groups and weights from the master, decode without pause,
    send finished groups (and, every report_s, the token count: the master's sign of life)."""
    heard, reported, tokens = time.time(), time.time(), 0
    while True:
        for message in mailbox.poll(0):
            heard = time.time()
            if message[0] == "add":
                sampler.add(*message[1:])
            elif message[0] == "weights":  # join the master's broadcast, then apply in flight
                _, version, spec = message
                sampler.update_weights(broadcast_weights(layout.weight_group, spec=spec, device=layout.device), version)
            elif message[0] == "stop":
                return
        if sampler.num_unfinished:
            tokens += sampler.step()
            groups = sampler.pop_finished()
            if groups or time.time() - reported > report_s:
                mailbox.send(0, ("groups", groups, tokens))
                reported, tokens = time.time(), 0
        else:
            time.sleep(0.002)
            if time.time() - heard > timeout_s:
                raise RankError(f"sampler rank {layout.rank}: the master (rank 0) sent nothing for "
                                f"{timeout_s:.0f} s (rank_timeout)")
