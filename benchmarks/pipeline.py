"""
Benchmark (not a test): does the off-policy pipeline keep the sampler busy? scheduler.Rollouts exactly as
train.py drives it (the room in groups, hand-outs within the lag bound, the P oldest finished groups a step),
against a sampler of `slots` rows that decodes one token a row an engine step, a row freeing its slot when its
completion ends and a group finishing with its last row. Lengths are drawn as the one-hour config's run had
them (docs/real_model/qwen_gsm8k.jsonl, step 8: 48% cut at the 256-token cap, 229 tokens a completion: the
rest uniform on [120, 256)), or from --cut and --low. No model: the figures are the scheduler's, in engine
steps, so they hold on any machine:

    python benchmarks/pipeline.py                          # the config's 192 slots, P 8 x 8, lag 2 to 6
    python benchmarks/pipeline.py --slots=256 --lags=2,3 --cut=0.66 --room_by=queue

  room    slots: hand-outs fill the slots, counted in groups (a row whose group is not finished holds its
          slot after it ends); queue: scheduler.room, the slots and a batch queued (what train.py
          uses)
  busy    rows decoding / slots, averaged over engine steps
  starved engine steps with under half the slots decoding (a GPU sampler idles in them; a CPU one decodes
          at a smaller M, which costs it per token)
  engine  engine steps per training step (a one-process run's decoding time, at the rows it had)
  p90     ... the 90th percentile over steps: a wave of stragglers every k + 1 steps shows here
  lag     mean and max policy lag of the trained groups, in steps (the bound is max_lag)
  waited  engine steps in which P groups were finished and the rule held them for a straggler's deadline
"""
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import scheduler  # noqa: E402

class Group:
    def __init__(self, prompt_id):
        self.prompt_id, self.index, self.validation = prompt_id, None, False


class Curriculum:
    def next(self):
        return 0


class Sampler:
    """`slots` rows; a queue of rows; an engine step decodes every running row one token."""

    def __init__(self, slots, n, length):
        self.slots, self.n, self.length = slots, n, length
        self.queue, self.running, self.left, self.finished, self.num_unfinished = [], [], {}, [], 0
        self.rows_decoded = []  # rows decoding, one entry an engine step

    def add(self, prompt_id, prompt_ids, n):
        self.left[prompt_id] = n
        self.queue += [[prompt_id, self.length()] for _ in range(n)]
        self.num_unfinished += 1

    def step(self):
        free = self.slots - len(self.running)
        self.running, self.queue = self.running + self.queue[:free], self.queue[free:]
        self.rows_decoded.append(len(self.running))
        for row in self.running:
            row[1] -= 1
            if row[1] == 0:
                self.left[row[0]] -= 1
                if self.left[row[0]] == 0:
                    self.finished.append(Group(row[0]))
        self.running = [row for row in self.running if row[1] > 0]

    def pop_finished(self):
        done, self.finished = self.finished, []
        self.num_unfinished -= len(done)
        return done


def simulate(slots, P, n, max_lag, length, steps, mode="pipeline", room_by="groups"):
    """train.py's loop with no model: -> the figures above, over `steps` training steps after the first."""
    sampler = Sampler(slots, n, length)
    rollouts = scheduler.Rollouts(Curriculum(), [type("Prompt", (), {"input_ids": []})], n, P, max_lag, mode)
    step, lags, waited, engine_at = 0, [], 0, []  # engine steps at each training step
    while step <= steps:
        if room_by == "queue":  # train.py's: the slots and a batch queued
            room = scheduler.room(slots, sampler.num_unfinished, n, P)
        else:  # before: the slots only, counted in groups
            room = -(-(slots - sampler.num_unfinished * n) // n)
        rollouts.hand_out(sampler, step, room)
        sampler.step()
        rollouts.collect(sampler.pop_finished())
        handed = {ticket: v0 for ticket, (_, v0) in rollouts.pending.items()}
        ready = len(rollouts.finished) >= P
        batch = rollouts.ready_batch(step)
        if batch is None:
            waited += ready and step > 0  # P groups finished, the rule waits for a straggler's deadline
            continue
        if step > 0:
            lags += [step - handed[g.prompt_id] for g in batch]
        engine_at.append(len(sampler.rows_decoded))
        step += 1
    first = engine_at[0]  # the pipeline's fill is not its steady state
    rows = sampler.rows_decoded[first:]
    return dict(busy=sum(rows) / len(rows) / slots, starved=sum(r < slots / 2 for r in rows) / len(rows),
                engine=(engine_at[-1] - first) / (len(engine_at) - 1), lag_mean=sum(lags) / len(lags),
                lag_max=max(lags), waited=waited / (len(rows)),
                spread=sorted(b - a for a, b in zip(engine_at[1:], engine_at[2:]))[len(engine_at) * 9 // 10 - 2])


if __name__ == "__main__":
    slots, P, n, lags, cut, low, cap, steps, seed = 192, 8, 8, "2,3,4,6", 0.48, 120, 256, 400, 0
    mode, room_by = "pipeline", "slots,queue"
    for arg in sys.argv[1:]:
        key, value = arg.removeprefix("--").split("=")
        globals()[key] = type(globals()[key])(value)
    rng = random.Random(seed)

    def length():
        return cap if rng.random() < cut else rng.randrange(low, cap)
    print(f"{slots} slots, P={P} prompts x {n} samples, {mode}; lengths: {cut:.0%} cut at {cap}, "
          f"the rest uniform on [{low}, {cap}); {steps} steps after the pipeline's fill")
    print(f"{'room':>7}{'max_lag':>8}{'busy':>7}{'starved':>9}{'engine':>8}{'p90':>6}{'lag mean':>10}"
          f"{'lag max':>9}{'waited':>8}")
    for by in room_by.split(","):
        for k in map(int, lags.split(",")):
            f = simulate(slots, P, n, k, length, steps, mode, by)
            print(f"{by:>7}{k:>8}{f['busy']:>7.0%}{f['starved']:>9.0%}{f['engine']:>8.1f}{f['spread']:>6}"
                  f"{f['lag_mean']:>10.2f}{f['lag_max']:>9}{f['waited']:>8.0%}")
