# A real model that reasons and writes code learns GSM8K and HumanEval on 2 CPU cores, graded honestly
# (docs/real_model.md): Qwen2.5-Coder-0.5B-Instruct, math and code in one run, the whole recipe.
#   python data/qwen_coder/prepare.py && python train.py config/qwen_coder_cpu.py
#   python train.py config/qwen_coder_cpu.py --init_from=resume      # hours: resume it as often as needed
# The model does not think (no <think>): a completion is only capped at think_budget_max + answer_budget.
model_path = ".cache/qwen_coder/model"
data_path = ".cache/qwen_coder/gsm8k_train.jsonl:3,.cache/qwen_coder/humaneval.jsonl:1"  # 3 math : 1 code
out_dir = "out-qwen-coder"
dtype = "auto"                  # fp32 masters and AdamW, the fp32 head (head.py's CPU route);
                                # bf16 compute on a CPU with native bf16, else fp32 (train.py)
sampler_dtype = "auto"
temperature = 1.0
think_budget_min = 368          # a cap of 384 tokens: a GSM8K chain takes ~250, a HumanEval function ~200
think_budget_max = 368
answer_budget = 16
train_truncated = True          # (paper: excluded, at 14k tokens) a third of the chains run out of budget at
                                # first: RL must see them to learn to finish
prompts_per_step = 8
samples_per_prompt = 8
sampler_slots = 192             # three steps of completions decode at once, a fourth queued (scheduler.room)
max_lag = 4                     # >= 192 / 64 + 1: the lag bound never binds first, so the slots stay full
                                # (benchmarks/pipeline.py: 100% busy against 86% at max_lag 2, and no wave
                                # of stragglers every third step; mean lag ~3.9, the log's policy_lag_mean)
micro_batch = 2                 # 2 rows of up to 841 tokens: the plan's 3.9 GiB of activations, beside 11.6 of
                                # weights, gradients and AdamW and the sampler's 5.0: 20.7 GiB. (Steps 1-20 ran
                                # 4 rows, planned 23.1 GiB, and peaked at 23.2 resident of this machine's 23.5)
lr = 2e-6                       # constant after warm-up (paper: 5e-7 for 8B)
warmup_steps = 5
n_train = 0
n_val = 64                      # per domain: 128 held-out problems (64 GSM8K, 64 HumanEval)
eval_samples = 4
eval_interval = 10
ckpt_interval = 5
max_steps = 200
max_minutes = 0.0
