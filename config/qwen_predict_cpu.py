# The paper's central claim on a real model (docs/real_model.md "Fit early, predict late"): a run
# fitted on its first half predicts its second. Qwen2.5-Coder-0.5B-Instruct, GSM8K and HumanEval in one run,
# the whole recipe (PipelineRL-4, CISPO, the fp32 head) with LoRA rank 8, run to its plateau in sittings of
# ~2.5 hours: each stops at its first checkpoint past max_minutes, and its log and state (out_dir, ~52 MB)
# are committed once, at the sitting's end, so that the next sitting resumes it exactly, on any machine.
# The run in out_dir is done (R0 to its plateau at step 52; its outcome in docs/real_model.md); another:
#   python data/qwen_coder/prepare.py
#   python train.py config/qwen_predict_cpu.py --out_dir=out/qwen_predict --max_steps=24  # the first sitting
#   python train.py config/qwen_predict_cpu.py --out_dir=out/qwen_predict --init_from=resume  # the others
#   python fit_curve.py out/qwen_predict/log.jsonl --x=flops --fit_until=<half the flops>
# One state commit a session: the state is rewritten whole each sitting, and a session's submission counts a
# rewritten binary twice (removed and added) against its 256 MiB of diffs; three in one session did not land.
# The compute axis is the log's `flops` (trained and generated tokens' FLOPs): a shared CPU's wall hours move
# with its load and with the machine a sitting gets; flops measure the run. Validation every 4 of the planned
# 48 steps, on 128 held-out problems x 4 samples: the sampling error (val_sampling_se) ~0.012 at these pass
# rates, under the +-0.02 the claim is about.
model_path = ".cache/qwen_coder/model"
data_path = ".cache/qwen_coder/gsm8k_train.jsonl:3,.cache/qwen_coder/humaneval.jsonl:1"  # 3 math : 1 code
out_dir = "docs/real_model/qwen_predict_lr1e-4"  # committed after each sitting: log, config.json, ckpt/
dtype = "auto"                  # bf16 compute on a CPU with native bf16, else fp32 (LoRA's adapters and
sampler_dtype = "auto"          # AdamW in fp32, the fp32 head)
lora_rank = 8                   # docs/lora.md: a checkpoint of 53 MB (rank 32: 211 MB, too big to commit
lora_alpha = 32.0               # each sitting); rank 8 learned GSM8K within the hour as full fine-tuning did
lr = 1e-4                       # the lr at which rank 8 learned this model within the hour (docs/lora.md:
                                # is_ratio_max 1.2-4.1, grad norm <= 1.1 over 16 steps); at 2e-5 the first
                                # half was flat (docs/real_model/qwen_predict_lora: kept, a negative result)
temperature = 1.0
think_budget_min = 240          # a cap of 256 tokens, as the one-hour config (config/qwen_gsm8k_cpu.py):
think_budget_max = 240          # finishing within it is the first lesson; a HumanEval function takes ~200
answer_budget = 16
train_truncated = True          # (paper: excluded, at 14k tokens) RL must see the cut chains to learn to
                                # finish
warn_truncation = 0.8           # most first chains are cut, by design: no warning for it
prompts_per_step = 8
samples_per_prompt = 8
sampler_slots = 192             # three steps of completions decode at once, a fourth queued (scheduler.room)
max_lag = 4                     # >= 192 / 64 + 1: the slots stay full (benchmarks/pipeline.py); the mean lag
                                # is the log's policy_lag_mean (~2-3: really off-policy, as the paper's k = 8)
micro_batch = 4
micro_batch_tokens = 1800       # 4 GSM8K rows of ~450 tokens, or 2 HumanEval rows of up to ~710
warmup_steps = 2
n_train = 0
n_val = 64                      # per domain: 128 held-out problems (64 GSM8K, 64 HumanEval)
eval_samples = 4
eval_interval = 4               # 12 points from R0 to step 48
ckpt_interval = 4               # with exact_resume: the sequences in flight finish, the step validates,
exact_resume = True             # then the checkpoint (docs/resume.md, "Sittings")
max_steps = 48                  # the plan; if the validation still rises over its last ~20%, go on (to 52 here)
max_minutes = 125.0             # a sitting: it stops at the first checkpoint step past this (+ <= ~25 min)
