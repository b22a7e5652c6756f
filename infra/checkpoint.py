"""A run's checkpoints in out_dir (log.py writes log.jsonl and config.json beside them): ckpt/, a
Hugging Face model directory (fp32 weights and the tokenizer: transformers and vLLM load it as it
is; with LoRA the adapter in PEFT's files, the base model's fingerprint in state.pt) with
optimizer.pt and state.pt (step, counters, curriculum, the step's log row, the other files'
sizes), written beside the old one and swapped in. On resume (log.resume) the checkpoint is checked
and the log cut back to its step: it goes on with no gap and no duplicate. A write that fails (a
full disk) ends the run in one line, leaving the log's complete rows and the last complete
checkpoint (docs/resume.md)."""

import os
import shutil
import sys
import zipfile
from contextlib import contextmanager, suppress

import torch
from safetensors import safe_open

from infra.lora import save_peft
from infra.policy import full_state


def first_line(error):
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"


@contextmanager
def writing(path, undo=lambda: None):
    """A write into out_dir/NAME. One that fails (a full disk, a lost mount: OSError, or torch's and
    safetensors' own errors) -> undo() (give the room back, cut a torn line), a line naming `path`,
    exit 1 at once (no clean-up: peers may hold collectives; they see the connection break)."""
    try:
        yield
    except Exception as e:
        with suppress(OSError):
            undo()
        out_dir = os.path.dirname(path)
        free = shutil.disk_usage(out_dir).free / 2**20
        kept = [d for d in ("ckpt", "ckpt.old")
                if os.path.isfile(os.path.join(out_dir, d, "state.pt"))]
        print(f"train.py: cannot write {path}: {first_line(e)} ({free:.1f} MiB free there); "
              "out_dir keeps the log's complete rows and its last complete checkpoint: "
              "make room, then " +
              ("run again with --init_from=resume" if kept else "start again (no checkpoint yet)"),
              file=sys.stderr, flush=True)
        os._exit(1)


def read_checkpoint(path):
    """A complete checkpoint directory's state.pt, its other files checked against the sizes it
    recorded and their headers and pickles read: one that is truncated or garbled -> one line naming
    it (ValueError). Bytes changed inside the tensors pass (no checksums: hashing an 8B model's
    checkpoint takes a minute)."""
    def read_pickle(file):  # torch.save's zip: its directory, and its pickle read, CRC-32 checked
        with zipfile.ZipFile(file) as z:
            z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))

    file = os.path.join(path, "state.pt")
    try:
        read_pickle(file)
        state = torch.load(file, weights_only=False)
        # (a checkpoint of an older train.py: none)
        for name, size in state.get("files", {}).items():
            file = os.path.join(path, name)
            if os.path.getsize(file) != size:
                raise ValueError(f"{os.path.getsize(file)} bytes, {size} when written")
            if name.endswith(".safetensors"):
                with safe_open(file, "pt") as weights:
                    weights.keys()
            elif name.endswith(".pt"):
                read_pickle(file)
    except Exception as e:
        raise ValueError(f"{file}: a damaged checkpoint file, truncated or garbled ({first_line(e)}"
                         "); restore it or start again in another --out_dir") from None
    return state


def latest(out_dir):
    """The complete checkpoint directory a resume takes (ckpt.old: a kill between the swap's two
    renames), or None."""
    return next((path for path in (os.path.join(out_dir, d) for d in ("ckpt", "ckpt.old"))
                 if os.path.isfile(os.path.join(path, "state.pt"))), None)


def save_run(out_dir, policy, task, layout, rollouts, state):
    """The checkpoint: weights and optimizer, every rank's curriculum and its groups in flight,
    `state`. The master's followers save with it (distributed.follow): full_state's gathers
    need every trainer."""
    from infra.distributed import gather_objects
    for rank in range(1, layout.trainers) if layout.role == "master" else ():
        layout.mailbox.send(rank, ("save",))
    share = dict(curriculum=rollouts.curriculum.state_dict(), in_flight=rollouts.in_flight())
    shares = gather_objects(share) if layout.role == "data_parallel" else [share]
    save(out_dir, policy, task.tokenizer, dict(state, world=layout.world, shares=shares))


def save(out_dir, policy, tokenizer, state):
    """Every trainer calls it (full_state's gathers are collectives); the master writes ckpt.tmp,
    state.pt last (its presence marks a complete directory; it records the other files' sizes), and
    swaps it in."""
    weights, optimizer_state = full_state(policy)
    if weights is None:
        return
    tmp, final, old = (os.path.join(out_dir, d) for d in ("ckpt.tmp", "ckpt", "ckpt.old"))
    with writing(tmp, undo=lambda: shutil.rmtree(tmp, ignore_errors=True)):  # failed: its room back
        shutil.rmtree(tmp, ignore_errors=True)
        if policy.lora:  # the adapter only, in PEFT's files: base and tokenizer are model_path's
            os.makedirs(tmp)
            save_peft(tmp, weights, policy.lora)
        else:
            policy.model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
        torch.save(optimizer_state, os.path.join(tmp, "optimizer.pt"))
        files = {name: os.path.getsize(os.path.join(tmp, name)) for name in os.listdir(tmp)}
        torch.save(dict(state, files=files, lora=policy.lora), os.path.join(tmp, "state.pt"))
        # a crash leaves ckpt or ckpt.old complete, never a half-written ckpt
        if os.path.isdir(final):
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
