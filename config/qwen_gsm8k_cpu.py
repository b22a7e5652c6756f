# A real model on GSM8K within an hour on 2 CPU cores: +0.055 (~1.8 standard errors) in its one run, short of a
# clear gain (docs/real_models_cpu.md;
# docs/real_model.md):
#   python data/qwen_coder/prepare.py && python train.py config/qwen_gsm8k_cpu.py
# Qwen2.5-Coder-0.5B-Instruct, GSM8K's train split only, the whole recipe, validation included in the hour.
# The model does not think (no <think>): a completion is only capped at think_budget_max + answer_budget.
model_path = ".cache/qwen_coder/model"
data_path = ".cache/qwen_coder/gsm8k_train.jsonl"
n_train = 0                     # all of it (7,473 problems less the held-out ones)
out_dir = "out-qwen-gsm8k"
dtype = "auto"                  # bf16 compute on a CPU with native bf16, else fp32 (fp32 masters, AdamW,
                                # the fp32 head)
sampler_dtype = "auto"
temperature = 1.0
think_budget_min = 240          # a cap of 256 tokens: 39-45% of the base model's GSM8K chains end within
think_budget_max = 240          # it, 11% within it and right (its 256 completions in docs/real_model/):
answer_budget = 16              # the first thing RL teaches is to finish the chain it can do
train_truncated = True          # (paper: excluded, at 14k tokens) RL must see the cut chains to learn to
                                # finish
warn_truncation = 0.8           # two thirds of the first steps' chains are cut, by design: no warning for it
prompts_per_step = 8
samples_per_prompt = 8
sampler_slots = 192             # three steps of completions decode at once, a fourth queued (scheduler.room)
max_lag = 4                     # >= 192 / 64 + 1: the lag bound never binds first, so the slots stay full
                                # (benchmarks/pipeline.py: 100% busy against 86% at max_lag 2, and no wave
                                # of stragglers every third step; mean lag ~3.9, the log's policy_lag_mean)
micro_batch = 4                 # rows of up to ~450 tokens
lr = 1e-5                       # (paper: 5e-7 for 8B; the 4-hour config: 2e-6) a dozen steps must move it
warmup_steps = 2
n_val = 128                     # held-out GSM8K-train problems x 2 samples: 256 completions, ~5 minutes
eval_samples = 2
eval_interval = 5
ckpt_interval = 10              # a checkpoint (~7.5 GB with AdamW) costs seconds; one is also written at
                                # the end
max_steps = 100
max_minutes = 48.0              # the budget ends at ~48 minutes; the last validation follows: ~55-58 in all
