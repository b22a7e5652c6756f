"""
The rollouts (Groups of Completions) and ScaleRL's off-policy rule, driven by train.py's loop (by
test_all.py with fake samplers).
"""
import math
from dataclasses import dataclass, field

# -----------------------------------------------------------------------------
# the rollouts: what the samplers make (sample.py), the scheduler holds and train.py trains on

@dataclass
class Completion:
    token_ids: list = field(default_factory=list)    # completion tokens (the prompt excluded)
    # a forced token's log-prob is NaN: any unmasked use of it is loud
    logprobs: list = field(default_factory=list)     # behaviour log-prob per token; NaN if forced
    versions: list = field(default_factory=list)     # policy version that produced each token
    policy_mask: list = field(default_factory=list)  # False for the forced interruption phrase
    finish_reason: str = None                        # 'eos' | 'truncated'
    interrupted: bool = False                        # the thinking budget ran out: phrase appended


@dataclass
class Group:
    """G completions of one prompt, made by a sampler (sample.py's add). prompt_id: the key it was
    handed out under: a training group's ticket (Rollouts), a validation group's held-out prompt
    index; prompt_ids: the prompt's tokens."""
    prompt_id: object
    prompt_ids: list
    completions: list
    index: int = None         # the training prompt it samples (task.prompts' index), once it trains
    rewards: list = None      # one per completion, once scored
    validation: bool = False  # a held-out prompt's group (train.evaluate): never trained


def room(slots, unfinished, G, P):
    """Groups the samplers may take now: their slots and one batch more, queued for rows that end.
    With max_lag >= slots / (P G) + 1 the lag bound never binds first: the slots stay full, no wave
    of stragglers every k + 1 steps (benchmarks/pipeline.py: 86% -> 100% busy)."""
    return math.ceil((slots + P * G - unfinished * G) / G)


class Rollouts:
    """Hands prompts to the samplers and decides which finished groups train at which step."""
    # Every group gets a ticket in hand-out order and remembers the policy version it was handed out
    # under, v0: its tokens come from versions >= v0, so trained at step s (the trainer holds
    # version s) none lags more than s - v0.
    #   PipelineRL-k (ScaleRL sec. 3.1): the samplers never idle, and a group must train by step
    #     v0 + k, its deadline. A step takes the P oldest finished groups unless that would leave
    #     some untrained group unable to meet its deadline (at P groups a step, the j-th earliest
    #     remaining deadline needs step + 1 + j // P <= it): then it waits for the stragglers.
    #     Hand-outs stop at (k+1) P untrained groups, which keeps every deadline reachable. So the
    #     lag never exceeds k, in any finishing order.
    #   PPO-off-policy-k: k P prompts under one policy; once all are finished, k steps of P each
    #     (each step normalises its advantages over its own P groups, not over the round's k P:
    #     ours).
    # Validation groups (Group.validation) share the samplers; collect() hands them back.

    def __init__(self, curriculum, prompts, group_size, batch_size, max_lag, mode, requeue=()):
        self.curriculum, self.prompts, self.group_size = curriculum, prompts, group_size
        self.P, self.k, self.mode = batch_size, max_lag, mode
        self.requeue = list(requeue)  # prompts handed out before a resume and never trained:
                                      # first again
        self.pending = {}             # ticket -> (prompt index, v0) of every group not yet trained
        self.finished = {}            # ticket -> Group, finished and waiting for its step
        self.next_ticket = 0
        self.exhausted = False        # the curriculum has retired every prompt
        self.version = 0              # the policy version of the last hand-out

    def hand_out(self, samplers, version, room):
        """New groups for the samplers: as many as the rule allows, at most `room`."""
        self.version = version  # the rule may read it (a group handed out at v0 lags version - v0)
        for _ in range(OFF_POLICY[self.mode][0](self, room)):
            index = self.requeue.pop(0) if self.requeue else self.curriculum.next()
            if index is None:
                self.exhausted = True
                return
            self.pending[self.next_ticket] = (index, version)
            samplers.add(self.next_ticket, self.prompts[index].input_ids, self.group_size)
            self.next_ticket += 1

    def collect(self, groups):
        """Finished groups in: the validation ones come back, the training ones wait for their
        step."""
        self.finished.update((g.prompt_id, g) for g in groups if not g.validation)
        return [g for g in groups if g.validation]

    def ready_batch(self, version):
        """The P groups to train on at the step from `version`, or None (keep sampling)."""
        tickets = sorted(self.finished)[:self.P]
        if len(tickets) < self.P or not OFF_POLICY[self.mode][1](self, tickets, version):
            return None
        batch = [self.finished.pop(t) for t in tickets]
        for g in batch:
            g.index = self.pending.pop(g.prompt_id)[0]
        return batch

    @property
    def starved(self):
        """Every prompt is retired and fewer than P groups are left: no full batch will come."""
        return self.exhausted and len(self.pending) < self.P

    def in_flight(self):
        """The prompts handed out and not trained (a checkpoint hands them out again)."""
        return [index for index, _ in self.pending.values()]

    def state_dict(self):
        """The groups handed out and not trained, finished ones verbatim (exact_resume's checkpoint:
        none is decoding), the tickets; the curriculum saves its own."""
        return dict(pending=dict(self.pending), finished=dict(self.finished),
                    next_ticket=self.next_ticket, exhausted=self.exhausted, version=self.version)

    def load_state_dict(self, state):
        self.__dict__.update(state, requeue=[])


# -----------------------------------------------------------------------------
# the off-policy rules: (how many new groups may be handed out now, given `room` in the samplers'
# queue; whether the P oldest finished groups may train at the step that starts from `version`).
# OFF_POLICY names them for the off_policy config key; a new rule is two functions and one entry
# here.

def pipeline_budget(r, room):
    return min((r.k + 1) * r.P - len(r.pending), room)


def pipeline_may_train(r, tickets, version):
    """Not if a straggler could then miss its deadline."""
    chosen = set(tickets)
    deadlines = sorted(v0 + r.k for t, (_, v0) in r.pending.items() if t not in chosen)
    return all(version + 1 + j // r.P <= d for j, d in enumerate(deadlines))


def ppo_budget(r, room):
    return r.k * r.P if not r.pending else 0  # the whole round at once, whatever the room


def ppo_may_train(r, tickets, version):
    return len(r.finished) >= len(r.pending)  # the whole round first: one policy generated it


OFF_POLICY = dict(pipeline=(pipeline_budget, pipeline_may_train), ppo=(ppo_budget, ppo_may_train))
