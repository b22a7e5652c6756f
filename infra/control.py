"""When the loop checkpoints, validates and stops: stop signals, the time budget, max_steps, a run
starved of prompts, checkpoints (drained first under exact_resume) and the data-parallel ranks'
agreement, in one object train.py's loop asks at two places a step. Its state machine is tested on
its own (tests/test_control.py), so the loop's tests stay about the recipe."""

from infra.distributed import PREEMPTED


class RunControl:
    """One process's run control (the master's, a data-parallel rank's, the one process's).

    Between steps `boundary` checkpoints when due and says whether the step's row is validated and
    logged now, then `stops` writes exact_resume's checkpoint and says whether the loop ends. Before
    a step trains, `decide` settles whether it is the run's last (every data-parallel rank agrees,
    on the batch too); `evaluates` whether the step it makes is validated; `exit_code` at the end.

    save(step, last, **exact): the checkpoint (last: the run's end, validated, not a sitting's);
    agree: distributed.agree on data-parallel ranks, else None; run: log.Run (its counters, row,
    tokens `generated`, seconds); samplers, rollouts: the loop's."""

    def __init__(self, run, samplers, rollouts, stop, save, agree, max_steps, max_minutes,
                 ckpt_interval, eval_interval, exact_resume):
        self.run, self.samplers, self.rollouts, self.stop, self.save = (
            run, samplers, rollouts, stop, save)
        self.agree, self.dp = agree, agree is not None
        self.max_steps, self.max_minutes, self.exact = max_steps, max_minutes, exact_resume
        self.ckpt_interval, self.eval_interval = ckpt_interval, eval_interval
        self.saved = run.step if run.resumed else -1  # the step of out_dir's checkpoint
        # last: this process's loop ends after the step; final: the run's end, validated (a
        # sitting's stop under exact_resume validates as any step); due: a checkpoint at the top
        self.last = self.final = self.stopping = self.due = self.draining = False

    def signalled(self):
        """A stop signal this process acts on alone (data-parallel ranks act on it together, at
        `decide`): no step begins, the top checkpoints, its groups go out again on resume."""
        return self.stop.name is not None and not self.dp

    def boundary(self, step):
        """Between steps: the checkpoint when due, before a validation that may take hours
        (exact_resume: every sequence in flight finishes first, the checkpoint follows the
        validation) -> whether to validate and log the step's row now (a stop leaves a validation
        not begun to the resumed run)."""
        self.stopping = self.stopping or self.signalled()
        due = (self.due or self.stopping) and self.saved != step
        # exact_resume keeps the samplers' random state as the log leaves it; a signal's stop is
        # prompt: no drain, its groups go out again
        self.draining = due and self.exact and not self.stopping
        if self.draining:
            while self.samplers.num_unfinished:
                self.run.generated += self.samplers.step()
                self.rollouts.collect(self.samplers.pop_finished())
        elif due:
            self.save(step, self.final)
            self.saved = step
        return self.run.unlogged and not (self.stopping and self.run.evaluate)

    def stops(self, step):
        """After the validation: exact_resume's checkpoint (the groups finished and waiting, the
        samplers' random state) -> whether the loop ends here."""
        if self.draining:
            self.save(step, self.final, rollouts=self.rollouts.state_dict(),
                      sampler=self.samplers.state_dict(), generated=self.run.generated)
            self.saved = step
        return self.last or self.stopping or step >= self.max_steps

    def starved(self):
        """No batch is ready: the run ends if no prompt is left and none is decoding (a
        data-parallel rank waits for the others' decision)."""
        self.last = (self.rollouts.starved and not self.samplers.num_unfinished
                     and not self.dp)

    def decide(self, step, batch):
        """Before the step trains: is it the run's last (max_steps, no prompt left, the time
        budget; exact_resume stops at a checkpoint step, where a resume goes on exactly) -> the
        batch (data-parallel ranks: every rank's share, one decision, a signal's too)."""
        timed = (0 < self.max_minutes * 60 < self.run.seconds()
                 and not (self.exact and (step + 1) % self.ckpt_interval))
        ends = step + 1 >= self.max_steps or self.rollouts.starved
        self.last = ends or timed
        if self.dp:
            batch, self.last, self.run.generated, self.stopping = self.agree(
                batch, self.last, self.run.generated, self.stop.name is not None)
        self.final = ends if self.exact else self.last
        self.due = self.last or (step + 1) % self.ckpt_interval == 0
        return batch

    def evaluates(self, step):
        """Whether the step just made is validated: every eval_interval steps, and the run's
        last."""
        return step % self.eval_interval == 0 or self.final

    def exit_code(self, step):
        """0 when the run is done (a signal meanwhile changes nothing), else PREEMPTED."""
        done = not self.run.unlogged and (self.last or step >= self.max_steps)
        return PREEMPTED if self.stopping and not done else 0
