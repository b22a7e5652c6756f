"""infra/checkpoint.py: the fault table (docs/resume.md, "What survives what"): whole runs of train.py with a
stop signal, kill -9, a full disk or a damaged file at a chosen moment, then the resume (slow).

Run alone: `python -m pytest tests/test_checkpoint.py`."""

import os
import shutil
import signal
import subprocess

import pytest
import torch

# tests.helpers first: importing it sets torch to one thread (it says why)
from tests.helpers import read_train_log, run_train, torchrun
# the fixtures its tests take (pytest finds them by name in this module)
from tests.helpers import tiny_model_dir  # noqa: F401


# =============================================================================
# infra/checkpoint.py


# checkpoint.py has no unit tests of its own: whole runs test its log, checkpoints and resume
# (test_all.py's train.py section: test_resume_after_a_hard_kill_continues_the_log_and_the_curriculum,
# test_a_step_checkpointed_before_a_validation_that_crashed_is_logged_on_resume; tests/test_distributed.py:
# test_multi_process_layouts_sample_with_the_trainers_weights_keep_lag_within_k_and_resume; the fault
# table below), and tests/test_configurator.py its refusals
# (test_bad_configs_fail_before_any_work_with_one_line_errors: init_from).


# -----------------------------------------------------------------------------
# the fault table (docs/resume.md, "What survives what"): whole runs of train.py on the tiny model with one fault
# at a chosen moment (tests/harness.py's harness_fault): a stop signal (SIGTERM, SIGINT) at each moment of a step,
# in one process and under torchrun; kill -9 while a checkpoint is written; a full disk under out_dir; a damaged
# checkpoint file; a torn last line of log.jsonl (the hard kill between checkpoints and the checkpointed
# step whose validation crashed are tested in test_all.py's train.py section, the dead or stopped sampler
# rank in tests/test_distributed.py)

PREEMPTED = 75  # distributed.PREEMPTED: the exit code after a stop signal and its checkpoint
# validation every 4 steps, a checkpoint every 3, 8 steps; small batches: a fault's moment is a step's, not its size
EVERY = ["--eval_interval=4", "--ckpt_interval=3", "--prompts_per_step=4", "--n_val=8", "--eval_samples=2"]


def logged_steps(out_dir):
    return [r["step"] for r in read_train_log(out_dir)]


def saved_step(out_dir, name="ckpt"):
    return torch.load(os.path.join(out_dir, name, "state.pt"), weights_only=False)["step"]


def lines_of(stream):
    return [line for line in stream.splitlines() if line.strip()]


def assert_resumes_exactly(out_dir, launch=run_train, max_steps=8, validated=()):
    """--init_from=resume runs to max_steps: the log's steps go 0..max_steps with no gap and no duplicate,
    validated every 4 steps (a validation the stop left undone is done) and at `validated` (an earlier run's
    last step), and nothing half-written is left."""
    result = launch(out_dir, *EVERY, f"--max_steps={max_steps}", "--init_from=resume")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_train_log(out_dir)
    assert [r["step"] for r in rows] == list(range(max_steps + 1))
    assert [r["step"] for r in rows if "val_reward" in r] == sorted({*range(0, max_steps + 1, 4), *validated})
    assert saved_step(out_dir) == max_steps
    assert sorted(os.listdir(out_dir)) == ["ckpt", "config.json", "log.jsonl"]  # no ckpt.tmp, no ckpt.old
    return result


def assert_stopped_in_one_line(result, name, step, out_dir):
    """A stop signal's exit: PREEMPTED, and one line on stderr, its last, saying how to go on."""
    assert result.returncode == PREEMPTED, result.stderr[-3000:]
    said = [line for line in lines_of(result.stderr) if "--init_from=resume" in line]
    assert said == [lines_of(result.stderr)[-1]], result.stderr[-3000:]
    assert said[0] == (f"train.py: {name}: stopped after step {step}, checkpoint {out_dir / 'ckpt'}; to go on, "
                       "run the same command with --init_from=resume")
    assert "Traceback" not in result.stderr, result.stderr[-3000:]

# -----------------------------------------------------------------------------
# a stop signal: the step done checkpointed, every rank stopped, the resume exact


# (action, moment, after, the step checkpointed, the steps logged): a validation every 4 steps, a checkpoint
# every 3. Sampling: step 5's, after step 4 -> 4 checkpointed by the stop. Training: step 4, finished, and
# checkpointed; its validation is left to the resumed run (its row too). Validation: step 4's, finished and
# logged, then the stop and step 4's checkpoint. Checkpoint: step 6's write (the first after step 3's row)
# finishes, then the stop: nothing more to write.
MOMENTS = [("SIGTERM", "sampling", 4, 4, range(5)), ("SIGTERM", "training", 3, 4, range(4)),
           ("SIGINT", "validation", 3, 4, range(5)), ("SIGTERM", "checkpoint", 3, 6, range(7))]


@pytest.mark.slow
@pytest.mark.parametrize("action,moment,after,checkpointed,logged", MOMENTS, ids=[m[1] for m in MOMENTS])
def test_a_stop_signal_in_one_process_checkpoints_the_steps_done_and_the_resume_is_exact(
        tiny_model_dir, tmp_path, action, moment, after, checkpointed, logged):
    out = tmp_path / "run"
    result = run_train(out, *EVERY, "--max_steps=100", fault=(action, moment, after))
    assert f"harness: {action} at {moment}" in result.stdout, result.stdout[-3000:]
    assert_stopped_in_one_line(result, action, checkpointed, out)
    assert saved_step(out) == checkpointed and logged_steps(out) == list(logged)
    assert_resumes_exactly(out)


# torchrun passes the signal on to every rank (each its own process group); the master acts on it and tells the
# others over the control group (its "stop", with the exit code); torchrun gives them 30 s before a SIGKILL.
# Every moment is tried in one process (above); under torchrun, a moment of each kind of rank: the master
# sampling from a sampler rank, writing a checkpoint of sharded weights, and data-parallel ranks training
LAYOUTS = [(3, 1, "checkpoint"), (3, 1, "sampling"), (2, 0, "training")]
LAYOUT_IDS = ["2fsdp+1sampler-checkpoint", "2fsdp+1sampler-sampling", "2data-parallel-training"]


@pytest.mark.slow
@pytest.mark.parametrize("nproc,n_samplers,moment", LAYOUTS, ids=LAYOUT_IDS)
def test_a_stop_signal_to_torchrun_reaches_every_rank_which_stop_checkpointed_and_the_resume_is_exact(
        tiny_model_dir, tmp_path, nproc, n_samplers, moment):
    out = tmp_path / "run"
    launch = lambda *a, **k: torchrun(nproc, *a, f"--n_samplers={n_samplers}", **k)  # noqa: E731
    result = launch(out, *EVERY, "--max_steps=100", fault=("SIGTERM>torchrun", moment, 3))
    output = result.stdout + result.stderr
    assert "harness: SIGTERM>torchrun at" in output, output[-3000:]
    assert result.returncode != 0  # torchrun itself ends on the signal (its SignalException)
    exits = {r: (tmp_path / f"exit{r}").exists() and (tmp_path / f"exit{r}").read_text() for r in range(nproc)}
    assert exits == {rank: str(PREEMPTED) for rank in range(nproc)}, (exits, output[-3000:])
    said = [line for line in lines_of(output) if "--init_from=resume" in line]
    assert len(said) == 1 and said[0].startswith("train.py: SIGTERM: stopped after step "), output[-3000:]
    # every rank exited on its own within torchrun's grace: none was left to its SIGKILL
    assert "forcefully exiting via" not in output, output[-3000:]
    assert "rank 0 broke its connection" not in output and "shows no sign of life" not in output, output[-3000:]
    done = int(said[0].split("after step ")[1].split(",")[0])
    logged = logged_steps(out)
    assert saved_step(out) == done >= 3 and logged == list(range(len(logged)))
    assert logged[-1] in (done, done - 1)  # done - 1: the stop left step done's validation to the resumed run
    assert_resumes_exactly(out, launch)


@pytest.mark.slow
def test_a_lora_run_of_2_fsdp2_trainers_stopped_and_resumed_checkpoints_its_adapter_alone(tiny_model_dir, tmp_path):
    """LoRA (infra/lora.py): the trainers gather the sharded adapters, the checkpoint holds them alone (PEFT's
    files), and on resume the sampler rank, which starts from the base, gets the adapter merged in by a push the
    follower joins."""
    out = tmp_path / "run"
    launch = lambda *a, **k: torchrun(3, *a, "--n_samplers=1", "--lora_rank=4", "--lr=1e-3", **k)  # noqa: E731
    result = launch(out, *EVERY, "--max_steps=100", fault=("SIGTERM>torchrun", "sampling", 3))
    assert "harness: SIGTERM>torchrun at" in result.stdout + result.stderr, result.stderr[-3000:]
    files = sorted(os.listdir(out / "ckpt"))
    assert "adapter_model.safetensors" in files and not any(f.startswith("model") for f in files), files
    assert (saved := saved_step(out)) >= 3
    assert_resumes_exactly(out, launch)
    rows = read_train_log(out)
    # the first step after the resume trains on groups sampled after it (its groups in flight go out again): with
    # the adapter merged in, the sampler rank's log-probs are the trainer's (the base's would miss by ~0.02)
    first = rows[saved + 1]
    assert first["policy_lag_max"] == 0 and first["logprob_mismatch"] < 1e-5, first

# -----------------------------------------------------------------------------
# exact_resume: a run in sittings (docs/resume.md, "Sittings"), each ending at its budget on a checkpoint step, the
# next resuming from the files git carries (log.jsonl, config.json, ckpt/), logs what one uninterrupted run logs

CLOCK = {"gpu_hours", "cpu_seconds", "step_time", "time", "val_seconds"}  # wall and CPU time, and what is read off it:


def unclocked(rows):  # ... the live fits (fit_*), made against gpu_hours
    return [{k: v for k, v in r.items() if k not in CLOCK and not k.startswith("fit_")} for r in rows]


def sitting_then_clone(tmp_path, args):
    """One uninterrupted run; a sitting of the same run stopped by its budget (spent before its first step: it stops
    at its first checkpoint step), its committed files copied into a fresh directory and resumed there -> (the
    uninterrupted run's rows, the sitting's, the resumed run's)."""
    whole, sitting, clone = (tmp_path / name for name in ("whole", "sitting", "clone"))
    for out, more in ((whole, ()), (sitting, ("--max_minutes=1e-9",))):
        result = run_train(out, *args, *more)
        assert result.returncode == 0, result.stderr[-3000:]
    clone.mkdir()  # a fresh clone holds what was committed: no ckpt.old, no ckpt.tmp
    for name in ("log.jsonl", "config.json"):
        shutil.copy(sitting / name, clone / name)
    shutil.copytree(sitting / "ckpt", clone / "ckpt")
    result = run_train(clone, *args, "--init_from=resume")
    assert result.returncode == 0, result.stderr[-3000:]
    return read_train_log(whole), read_train_log(sitting), read_train_log(clone)


@pytest.mark.slow
@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
def test_a_sitting_stopped_at_its_budget_and_resumed_from_its_committed_files_logs_what_one_run_logs(
        tiny_model_dir, tmp_path, lora_rank):
    args = ["--exact_resume=True", "--max_steps=6", "--eval_interval=2", "--ckpt_interval=2", "--prompts_per_step=8",
            "--n_val=8", "--eval_samples=2", "--sampler_slots=96", "--max_lag=2", f"--lora_rank={lora_rank}",
            "--lr=1e-3"]
    whole, sitting, resumed = sitting_then_clone(tmp_path, args)
    assert [r["step"] for r in sitting] == [0, 1, 2] and "val_reward" in sitting[-1]
    assert [r["step"] for r in resumed] == list(range(7))
    # the pipeline was really off-policy across the stop: groups sampled before it trained after it
    assert max(r["policy_lag_max"] for r in resumed[3:]) >= 1
    assert unclocked(resumed) == unclocked(whole)  # every figure, to the last bit


@pytest.mark.slow
def test_without_exact_resume_a_resumed_run_samples_its_groups_in_flight_again_and_its_log_departs(
        tiny_model_dir, tmp_path):
    """The comparison above can fail: without the drain the groups in flight at the stop are sampled again (no gap,
    no duplicate: the prompts go out again), so the resumed log departs from the uninterrupted one."""
    args = ["--max_steps=4", "--eval_interval=2", "--ckpt_interval=2", "--prompts_per_step=8", "--n_val=8",
            "--eval_samples=2", "--sampler_slots=96", "--max_lag=2"]
    whole, sitting, resumed = sitting_then_clone(tmp_path, args)
    assert [r["step"] for r in sitting] == [0, 1] and [r["step"] for r in resumed] == list(range(5))
    whole, resumed = unclocked(whole), unclocked(resumed)
    # (the sitting validated step 1, its last: the uninterrupted run did not)
    assert resumed[0] == whole[0] and {k: resumed[1][k] for k in whole[1]} == whole[1]
    assert resumed[2:] != whole[2:]

# -----------------------------------------------------------------------------
# kill -9 while a checkpoint is written: the last complete one is taken


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["checkpoint", "swap"])
def test_kill_9_while_a_checkpoint_is_written_resumes_from_the_last_complete_one_without_duplicates(
        tiny_model_dir, tmp_path, moment):
    out = tmp_path / "run"
    result = run_train(out, *EVERY, "--max_steps=100", fault=("SIGKILL", moment, 3))  # step 6's checkpoint
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    assert logged_steps(out) == list(range(6))  # step 6's row comes after its checkpoint: not written
    if moment == "checkpoint":  # the weights written, state.pt not: ckpt.tmp is incomplete, ckpt step 3's
        assert os.path.isdir(out / "ckpt.tmp") and not os.path.exists(out / "ckpt.tmp" / "state.pt")
        assert saved_step(out) == 3
    else:  # between the swap's renames: no ckpt, ckpt.old complete
        assert not os.path.exists(out / "ckpt") and saved_step(out, "ckpt.old") == 3
    assert_resumes_exactly(out)  # the log cut back to step 3, steps 4-8 again: once each

# -----------------------------------------------------------------------------
# a full disk under out_dir: one line, the log intact, a resume once there is room


def mount_tmpfs(path, size):
    """A tmpfs of `size` bytes at path (root only) -> whether it is mounted."""
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.mark.slow
def test_a_full_disk_under_out_dir_ends_the_run_in_one_line_keeps_the_log_and_resumes_once_there_is_room(
        tiny_model_dir, tmp_path):
    """As root: out_dir on a tmpfs with room for one checkpoint, not for the second beside it (the swap holds
    two); elsewhere ENOSPC is raised by that write (harness_fault). Both: a checkpoint every 3 steps."""
    disk = tmp_path / "disk"
    files = {name: os.path.getsize(os.path.join(tiny_model_dir, name)) for name in os.listdir(tiny_model_dir)}
    checkpoint_bytes = 3 * files.pop("model.safetensors") + sum(files.values())  # weights, AdamW's 2 moments
    mounted = mount_tmpfs(disk, int(1.5 * checkpoint_bytes) // 4096 * 4096)
    print("out_dir on a tmpfs" if mounted else "no tmpfs (not root?): ENOSPC injected")
    out = disk / "run"
    try:
        result = run_train(out, *EVERY, "--max_steps=8", fault=() if mounted else ("ENOSPC", "checkpoint", 3))
        assert result.returncode == 1, result.stderr[-3000:]
        errors = [line for line in lines_of(result.stderr) if line.startswith("train.py: ")]
        assert errors == [lines_of(result.stderr)[-1]], result.stderr[-3000:]  # one line, the last
        assert errors[0].startswith(f"train.py: cannot write {out / 'ckpt.tmp'}: ")  # step 6's checkpoint
        assert "MiB free there" in errors[0]  # (torch's own error says "unexpected pos")
        assert errors[0].endswith("make room, then run again with --init_from=resume")
        assert logged_steps(out) == list(range(6))  # the log intact: every row whole, up to step 5
        assert saved_step(out) == 3 and not os.path.exists(out / "ckpt.tmp")  # its room given back
        if mounted:  # room
            subprocess.run(["mount", "-o", f"remount,size={64 << 20}", str(disk)], check=True)
        assert_resumes_exactly(out)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(disk)])

# -----------------------------------------------------------------------------
# a damaged checkpoint file, a torn log: one line each


@pytest.fixture(scope="module")
def checkpointed_run(tiny_model_dir, tmp_path_factory):
    """A run of 3 steps (its checkpoint at step 3), copied by each test that damages it."""
    out = tmp_path_factory.mktemp("checkpointed") / "run"
    result = run_train(out, *EVERY, "--max_steps=3")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def damage_copy(run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def garble(path, offset, n=32):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(255 - b for b in f.read(n)))  # every bit flipped: the same size


def truncate(path):
    os.truncate(path, os.path.getsize(path) // 2)


def garble_pickle(path):
    """4 bytes flipped inside the pickle (data.pkl) of a torch.save file: a zip, its entries stored."""
    import struct
    import zipfile
    with zipfile.ZipFile(path) as z:
        offset = next(i for i in z.infolist() if i.filename.endswith("data.pkl")).header_offset
    with open(path, "rb") as f:  # the entry's local header: 30 bytes, its name and extra field's lengths at 26
        f.seek(offset + 26)
        name, extra = struct.unpack("<HH", f.read(4))
    garble(path, offset + 30 + name + extra + 8, 4)


DAMAGES = [("model.safetensors", truncate), ("model.safetensors", lambda p: garble(p, 0)),
           ("state.pt", lambda p: garble(p, 0)), ("state.pt", garble_pickle), ("optimizer.pt", truncate),
           ("optimizer.pt", lambda p: garble(p, 0)), ("optimizer.pt", garble_pickle)]


@pytest.mark.slow
@pytest.mark.parametrize("name,damage", DAMAGES, ids=["weights-truncated", "weights-header-garbled",
                                                      "state-header-garbled", "state-pickle-garbled",
                                                      "optimizer-truncated", "optimizer-header-garbled",
                                                      "optimizer-pickle-garbled"])
def test_a_truncated_or_garbled_checkpoint_file_is_named_in_one_line_and_nothing_is_touched(
        checkpointed_run, tmp_path, name, damage):
    out = damage_copy(checkpointed_run, tmp_path)
    damage(out / "ckpt" / name)
    log = (out / "log.jsonl").read_bytes()
    result = run_train(out, *EVERY, "--max_steps=8", "--init_from=resume")
    assert result.returncode == 2, result.stderr[-3000:]
    assert lines_of(result.stderr) == [lines_of(result.stderr)[0]], result.stderr[-3000:]  # one line
    assert lines_of(result.stderr)[0].startswith(f"train.py: error: {out / 'ckpt' / name}: a damaged checkpoint file")
    assert (out / "log.jsonl").read_bytes() == log and sorted(os.listdir(out)) == ["ckpt", "config.json", "log.jsonl"]


@pytest.mark.slow
def test_a_torn_last_log_line_is_dropped_on_resume_in_one_line_and_a_garbled_one_refused(checkpointed_run, tmp_path):
    out = damage_copy(checkpointed_run, tmp_path / "torn")
    text = (out / "log.jsonl").read_text()
    # a write cut short: step 3's row (its checkpoint's own, the run's last: validated) half written; the
    # resumed run writes it again
    (out / "log.jsonl").write_text(text[:len(text) - len(text.splitlines()[-1]) // 2 - 1])
    result = assert_resumes_exactly(out, validated=[3])
    said = [line for line in lines_of(result.stderr) if "torn" in line]
    assert said == [f"train.py: {out / 'log.jsonl'}: dropped its torn last line "
                    f"({len(text.splitlines()[-1]) - len(text.splitlines()[-1]) // 2} characters without a newline: "
                    "a write cut short); the log goes on after step 2"], result.stderr[-3000:]
    # a whole line that is not JSON is no crash's: refused, named
    out = damage_copy(checkpointed_run, tmp_path / "garbled")
    lines = text.splitlines(keepends=True)
    (out / "log.jsonl").write_text("".join(lines[:2] + ["{garbled\n"] + lines[3:]))
    result = run_train(out, *EVERY, "--max_steps=8", "--init_from=resume")
    assert result.returncode == 2 and len(lines_of(result.stderr)) == 1, result.stderr[-3000:]
    assert result.stderr.startswith(f"train.py: error: {out / 'log.jsonl'} line 3 is not JSON (")
