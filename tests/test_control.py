"""infra/control.py: the run control's state machine on its own, every stop path (max_steps, the time budget, a
signal between steps and in an engine step, a run starved of prompts, a dead data-parallel rank), checkpoints when
due, and exact_resume's drained checkpoint. The loop itself (train.py) is tested with the recipe in test_all.py.

Run alone: `python -m pytest tests/test_control.py`."""

import pytest

from infra.control import RunControl
from infra.distributed import PREEMPTED, RankError


class Run:  # log.Run's part the control reads
    def __init__(self, step=0, resumed=False, seconds=0.0):
        self.step, self.resumed, self.elapsed = step, resumed, seconds
        self.unlogged, self.evaluate, self.generated = True, True, 0

    def seconds(self):
        return self.elapsed


class Samplers:  # three sequences in flight, one finished per engine step of 10 tokens
    num_unfinished = 3

    def step(self):
        self.num_unfinished -= 1
        return 10

    def pop_finished(self):
        return ["group"]

    def state_dict(self):
        return "random state"


class Rollouts:
    starved = False

    def __init__(self):
        self.collected = []

    def collect(self, groups):
        self.collected += groups

    def state_dict(self):
        return "finished groups"


class Stop:
    name = None


def control(run=None, agree=None, max_steps=100, max_minutes=0.0, ckpt_interval=50, eval_interval=10,
            exact_resume=False):
    saves = []
    made = RunControl(run or Run(), Samplers(), Rollouts(), Stop(), lambda step, last, **exact: saves.append(
        (step, last, sorted(exact))), agree, max_steps, max_minutes, ckpt_interval, eval_interval, exact_resume)
    return made, saves


def test_max_steps_ends_the_run_validated_checkpointed_and_done():
    c, saves = control(max_steps=2)
    assert c.boundary(0) and not c.stops(0) and saves == []  # step 0: validated (R0), nothing saved
    assert c.decide(0, "batch") == "batch" and not c.last and c.evaluates(1) is False
    c.run.unlogged = False
    assert c.decide(1, "batch") == "batch" and c.last and c.final and c.due
    assert c.evaluates(2)  # the run's last step is validated whatever eval_interval says
    assert c.boundary(2) is False  # the row is logged already in this fake: nothing to validate
    assert saves == [(2, True, [])] and c.stops(2)
    assert c.exit_code(2) == 0


def test_a_checkpoint_every_ckpt_interval_steps_written_once_and_not_again_after_a_resume():
    c, saves = control(ckpt_interval=3)
    for step in range(6):
        c.boundary(step)
        c.stops(step)
        c.decide(step, "batch")
    assert saves == [(3, False, [])]  # (step 6's checkpoint is written at the next boundary)
    resumed, saves = control(run=Run(step=3, resumed=True), ckpt_interval=3)
    resumed.due = True
    resumed.boundary(3)
    assert saves == []  # out_dir holds step 3's checkpoint already


def test_a_signal_between_steps_checkpoints_leaves_the_validation_to_the_resumed_run_and_exits_preempted():
    c, saves = control()
    c.decide(6, "batch")
    c.stop.name = "SIGTERM"
    assert c.signalled()
    assert c.boundary(7) is False  # step 7's validation is not begun: the resumed run does it
    assert saves == [(7, False, [])] and c.stops(7)
    assert c.exit_code(7) == PREEMPTED
    c.run.evaluate = False
    assert c.boundary(7) is True and saves == [(7, False, [])]  # an unvalidated row is logged; no second save


def test_a_signal_after_the_runs_last_step_is_logged_changes_nothing():
    c, saves = control(max_steps=3)
    c.decide(2, "batch")
    c.run.unlogged = False
    c.stop.name = "SIGINT"
    c.boundary(3)
    assert c.stops(3) and c.exit_code(3) == 0


def test_the_time_budget_ends_the_run_as_its_last_step_validated():
    c, saves = control(run=Run(seconds=61.0), max_minutes=1.0)
    assert c.decide(4, "batch") == "batch" and c.last and c.final
    assert c.boundary(5) and saves == [(5, True, [])] and c.stops(5)
    assert c.exit_code(5) == 0  # the budget's end is the run's end, not a preemption


def test_exact_resume_stops_at_a_checkpoint_step_after_draining_and_saves_what_the_validation_left():
    c, saves = control(run=Run(seconds=61.0), max_minutes=1.0, ckpt_interval=4, exact_resume=True)
    c.decide(4, "batch")  # the budget is spent, but step 5 is no checkpoint step
    assert not c.last and not c.due
    c.decide(7, "batch")  # step 8 is
    assert c.last and c.due and not c.final  # a sitting's stop: validated as any step
    assert c.evaluates(8) is False
    assert c.boundary(8) and saves == []  # drained first: every sequence in flight finished
    assert c.samplers.num_unfinished == 0 and c.run.generated == 30 and c.rollouts.collected == ["group"] * 3
    assert c.stops(8)
    assert saves == [(8, False, ["generated", "rollouts", "sampler"])]


def test_a_signal_under_exact_resume_is_prompt_no_drain():
    c, saves = control(exact_resume=True)
    c.stop.name = "SIGTERM"
    c.boundary(3)
    assert saves == [(3, False, [])] and c.samplers.num_unfinished == 3


def test_a_run_starved_of_prompts_ends_once_none_is_decoding_and_a_data_parallel_rank_waits_for_the_others():
    c, _ = control()
    c.rollouts.starved = True
    c.starved()
    assert not c.last  # three sequences still decoding
    c.samplers.num_unfinished = 0
    c.starved()
    assert c.last
    dp, _ = control(agree=lambda *a: a)
    dp.rollouts.starved, dp.samplers.num_unfinished = True, 0
    dp.starved()
    assert not dp.last


def test_data_parallel_ranks_agree_on_the_batch_the_stop_and_a_signal():
    seen = []

    def agree(batch, last, generated, signalled):
        seen.append((batch, last, generated, signalled))
        return ["mine", "theirs"], True, generated + 5, True  # the other rank was signalled

    c, saves = control(agree=agree)
    c.stop.name = "SIGTERM"
    assert not c.signalled()  # acted on together, at decide
    c.run.generated = 7
    assert c.decide(3, ["mine"]) == ["mine", "theirs"]
    assert seen == [(["mine"], False, 7, True)] and c.run.generated == 12 and c.last and c.stopping
    c.boundary(4)
    assert saves == [(4, True, [])] and c.stops(4)


def test_a_dead_rank_in_the_agreement_stops_the_process_before_any_checkpoint():
    def agree(*args):
        raise RankError("a trainer rank died or stopped answering")

    c, saves = control(agree=agree)
    with pytest.raises(RankError):
        c.decide(3, ["mine"])
    assert saves == []
