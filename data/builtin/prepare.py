"""
The built-in task's base model, made here from a seed (nothing is downloaded), as nanoGPT's data/*/prepare.py
make their datasets: a character tokenizer and a 0.38M-parameter Llama warm-started on a noisy teacher's
demonstrations, cached under .cache/ (train.py runs this script when the model is not there yet):

    python data/builtin/prepare.py [--seed=0] [--measure=True]   # build or reuse it, print its pass@1 and pass@8
                                                                  # and the budget's ceiling; the last line printed
                                                                  # is its directory

RL on a small model sharpens what the base already does: it needs a base whose pass@8 is high while its
pass@1 is low. The teacher writes a wrong running-sum digit with probability TINY_SFT["teacher_slip"] and
carries on from it, so a chain of n steps is right ~0.8^n of the time: pass@1 ~0.18, pass@8 ~0.69 (seed 0), from
0.6-0.75 on 2 numbers to chance (0.1) on 15-20. The width is the study's choice (ours): at hidden 128 RL took the
recipe past 0.8 in 100 steps; at 96 it climbs for longer (0.21 -> 0.83 in python train.py's 321 steps, still rising).
The warm-up shows the clean teacher first (from noisy ones alone the rule was not learned); 10% of the
demonstrations are cut by the interruption phrase (masked) and answer the running sum so far.
"""
import hashlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import configurator  # noqa: E402
from data import (INTERRUPT_PHRASE, LETTERS, THINK_END, THINK_START, TINY_ANSWER_BUDGET, TINY_TASK,
                  TINY_THINK_BUDGET, DataError, decode, load_task, make_problem)  # noqa: E402
from rewards import score  # noqa: E402
from head import token_logprobs  # noqa: E402

TINY_MODEL = dict(hidden_size=96, num_hidden_layers=3, num_attention_heads=3,  # head_dim 32: vLLM CPU
                  intermediate_size=288, max_position_embeddings=1024)  # 96 wide: RL climbs for hundreds of steps
TINY_SFT = dict(steps=400, batch_size=64, lr=2e-3, warmup=30,
                clean_frac=0.7,       # the first 70% of steps show a teacher that never slips
                teacher_slip=0.2,     # then each running-sum digit is wrong with this probability
                interrupt_frac=0.1)   # demonstrations cut at a random point + the phrase
BUILD_VERSION = 1  # bump when the build code changes, so cached models are rebuilt
CACHE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ".cache")


def build_tokenizer():
    """Character-level Hugging Face fast tokenizer: printable ASCII and newline, a token each; <pad> <eos> <unk>
    special; <think>, </think> and the interruption phrase's words single tokens, *not* special (decoding
    with skip_special_tokens=True keeps them): the phrase is two forced decode steps, not ~80 (ours)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    specials = ["<pad>", "<eos>", "<unk>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(specials + chars)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character
    tok.decoder = decoders.Fuse()  # join the characters back with nothing in between
    tok.add_special_tokens([AddedToken(t, special=True) for t in specials])
    words = [THINK_START, THINK_END, INTERRUPT_PHRASE.removesuffix(THINK_END)]
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in words])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>", model_max_length=TINY_MODEL["max_position_embeddings"])


def teacher_completion(terms, rng, slip=0.0, cut=None):
    """-> (thinking, forced, answer) strings; a running-sum digit slips to a wrong one with probability `slip` and
    the sum carries on from it; cut=k keeps k chain tokens, then the phrase and the sum written so far."""
    total, chain, written = 0, [], []
    for i, t in enumerate(terms):
        total = (total + t) % 10
        if rng.random() < slip:
            total = (total + rng.randint(1, 9)) % 10
        chain += [LETTERS[i], str(total)]
        written.append(str(total))
    if cut is None:
        return THINK_START + "".join(chain) + THINK_END, "", written[-1]
    return THINK_START + "".join(chain[:cut]), INTERRUPT_PHRASE, written[cut // 2 - 1] if cut >= 2 else "0"


def demonstration_batch(tokenizer, rng, batch_size, slip, interrupt_frac):
    """Teacher demonstrations -> (B, T) input ids and a (B, T) mask: the completion, minus the forced phrase."""
    rows, masks = [], []
    for _ in range(batch_size):
        text, _, terms = make_problem(rng, **TINY_TASK)
        cut = rng.randint(1, 2 * len(terms)) if rng.random() < interrupt_frac else None
        thinking, forced, answer = teacher_completion(terms, rng, slip, cut)
        parts = [(text, 0), (thinking, 1), (forced, 0), (answer, 1)]
        ids = [tokenizer.encode(s, add_special_tokens=False) for s, _ in parts]
        rows.append(sum(ids, []) + [tokenizer.eos_token_id])
        masks.append(sum(([m] * len(i) for i, (_, m) in zip(ids, parts)), []) + [1])
    T = max(map(len, rows))
    input_ids = torch.tensor([r + [tokenizer.pad_token_id] * (T - len(r)) for r in rows])
    mask = torch.tensor([m + [0] * (T - len(m)) for m in masks], dtype=torch.float32)
    return input_ids, mask


def warm_up(model, tokenizer, seed, steps, batch_size, lr, warmup, clean_frac, teacher_slip, interrupt_frac):
    """Supervised warm-up on teacher demonstrations (the paper starts RL from an SFT checkpoint): AdamW,
    linear warm-up then cosine decay to lr/10, loss on the completion tokens only -> the final loss."""
    from tqdm import tqdm
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    model.train()
    for step in (bar := tqdm(range(steps), desc="warm-up", file=sys.stderr, mininterval=2)):
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))
        slip = 0.0 if step < clean_frac * steps else teacher_slip
        input_ids, mask = demonstration_batch(tokenizer, rng, batch_size, slip, interrupt_frac)
        logprobs = token_logprobs(model, input_ids)  # (B, T-1): log p(input_ids[:, t+1])
        loss = -(logprobs * mask[:, 1:]).sum() / mask[:, 1:].sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 20 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    return loss.item()


def build_settings(seed=0, **overrides):
    settings = dict(version=BUILD_VERSION, seed=seed, task=TINY_TASK, model=TINY_MODEL, sft=dict(TINY_SFT))
    for key, value in overrides.items():
        if key not in TINY_SFT:
            raise ValueError(f"unknown warm-up setting {key!r} (known: {', '.join(TINY_SFT)})")
        settings["sft"][key] = value
    return settings


def default_model_dir(seed=0, **overrides):
    """.cache/tiny-<hash of the build settings> inside the repository (gitignored)."""
    settings = json.dumps(build_settings(seed, **overrides), sort_keys=True)
    return os.path.join(CACHE_DIR, f"tiny-{hashlib.sha256(settings.encode()).hexdigest()[:10]}")


def finished(model_dir):
    """Whether model_dir holds a finished build: only a finished build has build.json."""
    return os.path.isfile(os.path.join(model_dir, "build.json"))


def cached_model(seed=0):
    """The finished build's directory for `seed`: found in the cache, or built by running this script
    (~1 minute: its own process, as a user runs it); a failed build -> DataError."""
    model_dir = default_model_dir(seed)
    if finished(model_dir):
        return model_dir
    built = subprocess.run([sys.executable, os.path.abspath(__file__), f"--seed={seed}", "--measure=False"],
                           stdout=subprocess.PIPE, text=True)
    if built.returncode:
        raise DataError(f"data/builtin/prepare.py --seed={seed} failed (exit {built.returncode})")
    return built.stdout.splitlines()[-1]


def build_tiny_model(model_dir=None, seed=0, **overrides):
    """The tokenizer and the warm-started model as a Hugging Face directory, built or reused (default:
    default_model_dir(), so changed settings rebuild), renamed into place: a killed build never looks complete.
    overrides: TINY_SFT keys. Same seed and settings -> bit-identical safetensors (1 or 2 threads)."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    settings = build_settings(seed, **overrides)
    model_dir = model_dir or default_model_dir(seed, **overrides)
    if finished(model_dir):
        return model_dir
    if os.path.exists(model_dir):
        raise DataError(f"{model_dir}: exists but holds no finished build (no build.json); remove it or pick another")
    started = time.time()
    tokenizer = build_tokenizer()
    # Llama, not Qwen2: transformers' AutoTokenizer (and so vLLM) swaps in Qwen2Tokenizer for any
    # qwen2 directory, changing the ids. Untied embeddings: vLLM's weight reload mishandles tied ones.
    config = LlamaConfig(vocab_size=len(tokenizer), **TINY_MODEL,
                         num_key_value_heads=TINY_MODEL["num_attention_heads"], tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float()
    final_loss = warm_up(model, tokenizer, seed, **settings["sft"])
    # sampling defaults = the RL distribution: temperature 1, no top-k / top-p truncation
    model.generation_config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                               eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    parent = os.path.dirname(os.path.abspath(model_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(model_dir) + ".tmp-", dir=parent)
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the model directory is not
    try:
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)
        with open(os.path.join(tmp, "build.json"), "w") as f:
            json.dump(dict(settings, final_loss=round(final_loss, 4),
                           parameters=sum(p.numel() for p in model.parameters())), f, indent=1)
        os.rename(tmp, model_dir)  # atomic; fails if another process finished the same build first
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not finished(model_dir):
            raise
    print(f"built {model_dir} in {time.time() - started:.0f} s", file=sys.stderr)
    return model_dir


def ceiling(task, think_budget, answer_budget, penalty_zone):
    """What a perfect policy scores on the held-out prompts under these budgets: the clean teacher's completion
    pushed token by token through the sampler's own budget rules at the smallest thinking budget drawn. -> the
    share scored +1 with no interruption and no truncation, and the share short enough (<= penalty_zone tokens,
    L_max - L_cache) to lose nothing to the length penalty. A budget that binds shows here, not in a fit."""
    from sample import Sampler
    encode = lambda text: task.tokenizer.encode(text, add_special_tokens=False)
    sampler = Sampler(eos_ids=task.eos_ids, think_end_ids=encode(THINK_END), interrupt_ids=encode(INTERRUPT_PHRASE),
                      think_budget=(think_budget[0], think_budget[0]), answer_budget=answer_budget,
                      max_new_tokens=think_budget[1] + answer_budget)
    passed, unpenalised = 0, 0
    for prompt in task.val_prompts:
        terms = [int(c) for c in prompt.text[1::2]]
        thinking, _, answer = teacher_completion(terms, random.Random(0))
        sampler.add(prompt.id, prompt.input_ids, 1)
        seq, tokens = sampler.queue.popleft(), encode(thinking + answer) + [task.tokenizer.eos_token_id]
        for token in tokens:
            sampler._push(seq, token, 0.0)
            if seq.completion.finish_reason or seq.forced:
                break
        done = seq.completion.finish_reason == "eos" and not seq.completion.interrupted
        passed += done and score([(prompt, decode(task, seq.completion.token_ids))])[0] > 0
        unpenalised += len(tokens) <= penalty_zone
    n = len(task.val_prompts)
    return passed / n, unpenalised / n


@torch.no_grad()
def measure_pass_rate(model_dir, n_prompts=200, samples=8, seed=1234):
    """A built-in-task model sampled as training samples (TorchSampler, temperature 1, the training budgets) ->
    pass@1, pass@samples, the interrupted fraction and pass@1 by difficulty."""
    from transformers import AutoModelForCausalLM
    from sample import TorchSampler
    task = load_task("builtin", model_dir, 1, n_prompts, seed)
    val, encode = task.val_prompts, lambda text: task.tokenizer.encode(text, add_special_tokens=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    sampler = TorchSampler(model, temperature=1.0, max_seqs=512, seed=seed, eos_ids=task.eos_ids,
                           think_end_ids=encode(THINK_END), interrupt_ids=encode(INTERRUPT_PHRASE),
                           think_budget=TINY_THINK_BUDGET, answer_budget=TINY_ANSWER_BUDGET)
    for i, prompt in enumerate(val):
        sampler.add(i, prompt.input_ids, samples)
    groups = []
    while sampler.num_unfinished:
        sampler.step()
        groups += sampler.pop_finished()
    passed = np.array(score([(val[g.prompt_id], decode(task, c.token_ids)) for g in groups for c in g.completions])
                      ).reshape(len(groups), samples) > 0  # (prompts, samples)
    difficulty = np.array([val[g.prompt_id].difficulty for g in groups])
    return dict(pass_at_1=float(passed.mean()), pass_at_k=float(passed.any(1).mean()), k=samples,
                interrupted=float(np.mean([c.interrupted for g in groups for c in g.completions])),
                by_difficulty={int(n): round(float(passed[difficulty == n].mean()), 3) for n in np.unique(difficulty)})


if __name__ == "__main__":
    # penalty_cache: train.py's default (its 'penalty' length control), for the budget's ceiling below
    args = configurator.configure(dict(seed=0, measure=True, penalty_cache=8), sys.argv[1:],
                                  "data/builtin/prepare.py")
    started = time.time()
    model_dir = build_tiny_model(seed=args["seed"])
    with open(os.path.join(model_dir, "build.json")) as f:
        build = json.load(f)
    print(f"{build['parameters']:,} parameters, warm-up loss {build['final_loss']} (ready in {time.time() - started:.0f} s)",
          file=sys.stderr)
    if args["measure"]:
        stats = measure_pass_rate(model_dir)
        print(f"validation at temperature 1, 200 prompts x {stats['k']}: pass@1 {stats['pass_at_1']:.3f} | "
              f"pass@{stats['k']} {stats['pass_at_k']:.3f} | interrupted {stats['interrupted']:.3f}\npass@1 by number "
              "of terms: " + " ".join(f"{n}:{r:.2f}" for n, r in stats["by_difficulty"].items()))
        # the budgets a run of train.py samples under by default: the built-in task's (data.py)
        think_min, think_max = TINY_THINK_BUDGET
        task, L_max = load_task("builtin", model_dir, 1, 200, 0), think_max + TINY_ANSWER_BUDGET
        passed, unpenalised = ceiling(task, (think_min, think_max), TINY_ANSWER_BUDGET, L_max - args["penalty_cache"])
        print(f"a perfect policy under train.py's budgets: {passed:.3f} uninterrupted and right, {unpenalised:.3f} "
              "clear of the length penalty")
    print(model_dir)
