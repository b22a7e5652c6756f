"""
Benchmark (not a test): does RL have signal here? A base model's pass@1 and pass@k on held-out problems of one
or more datasets, sampled exactly as train.py's validation samples (its config, its sampler, its budgets, its
rewards), with the tokens, the truncation rate and the sampler's speed. RL sharpens what a base model already
does: look for pass@1 of roughly 0.1-0.5 with a pass@k well above it.

    python benchmarks/pass_rates.py config/smollm2_cpu.py --data_path=.cache/smollm2/svamp.jsonl,.cache/smollm2/asdiv.jsonl
    (any train.py --key=value; n_val prompts per dataset x eval_samples samples; --show=2 prints completions,
    --show_paid=20 the first 20 the reward paid; --adapter=out/ckpt samples a LoRA run's model: model_path's base
    with that checkpoint's adapter merged in)
"""

import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import data  # noqa: E402
from infra import distributed  # noqa: E402
import rewards  # noqa: E402
import sample  # noqa: E402
import train  # noqa: E402
from infra import lora  # noqa: E402
from infra.policy import resolve_dtype  # noqa: E402


def merged_model(base, adapter):
    """`base` with a LoRA checkpoint's adapter (PEFT's files) merged in, in a temporary directory -> its path."""
    from transformers import AutoModelForCausalLM
    config = json.load(open(os.path.join(adapter, "adapter_config.json")))
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    lora.add_adapters(model, config["r"], config["lora_alpha"], ",".join(config["target_modules"]), seed=0)
    lora.load_peft(adapter, model)
    out = tempfile.mkdtemp()
    lora.merged_copy(model, torch.float32).save_pretrained(out)
    data.load_tokenizer(base).save_pretrained(out)
    return out

if __name__ == "__main__":
    ours = {a.split("=")[0][2:]: a.split("=", 1)[1] for a in sys.argv[1:]
            if a.startswith(("--show=", "--show_paid=", "--adapter="))}
    show, show_paid = int(ours.get("show", 0)), int(ours.get("show_paid", 0))
    train.configure([a for a in sys.argv[1:] if a.split("=")[0][2:] not in ours])
    # as train.py resolves it
    train.sampler_dtype, why = resolve_dtype(train.sampler_dtype, train.device)
    print(f"the sampler computes in {train.sampler_dtype} ({why})", flush=True)
    torch.manual_seed(train.seed)
    path = train.model_path or train.tiny_model(train.data_seed)
    if "adapter" in ours:
        path = merged_model(path, ours["adapter"])
    layout = distributed.Layout(0, 1, "single", 1, 0, 0, torch.device(train.device), None, None, None, None)
    for data_path in train.data_path.split(","):
        task = data.load_task(data_path, path, 1, train.n_val, train.data_seed, train.prompt_field or None,
                              train.answer_field, train.prompt_template)
        max_len = max(len(p.input_ids) for p in task.val_prompts) + train.think_budget_max + train.answer_budget + \
            len(data.interruption(task.tokenizer))
        sampler = sample.make(train.current_config(), path, task, layout, 0, max_len)
        for i, prompt in enumerate(task.val_prompts):
            sampler.add(i, prompt.input_ids, train.eval_samples)
        groups, tokens, started = [], 0, time.time()
        while sampler.num_unfinished:
            tokens += sampler.step()
            groups += sampler.pop_finished()
        seconds = time.time() - started
        completions = [(task.val_prompts[g.prompt_id], c) for g in groups for c in g.completions]
        texts = [data.decode(task, c.token_ids) for _, c in completions]
        passed = np.array(rewards.score([(p, t, c.finish_reason == "truncated")  # as train.py scores them
                                         for (p, c), t in zip(completions, texts)])).reshape(len(groups), -1) > 0
        print(f"{data_path}: {len(groups)} prompts x {train.eval_samples} | pass@1 {passed.mean():.3f} | "
              f"pass@{train.eval_samples} {passed.any(1).mean():.3f} | groups with signal "
              f"{(passed.any(1) & ~passed.all(1)).mean():.2f} | {np.mean([len(c.token_ids) for _, c in completions]):.0f} "
              f"tokens a completion | truncated {np.mean([c.finish_reason == 'truncated' for _, c in completions]):.2f} | "
              f"{tokens / seconds:.0f} tokens/s ({seconds:.0f} s)", flush=True)
        shown = list(zip(completions, texts, passed.reshape(-1)))
        for (prompt, c), text, ok in shown[:show] + [s for s in shown if s[2]][:show_paid]:
            print(f"--- {prompt.id} (answer {prompt.answer}, {'right' if ok else 'wrong'}): {prompt.text}\n{text}")
