# The paper's central claim on a real model (docs/real_model.md "Fit early, predict late"): a run
# fitted on its first half predicts its second. Qwen2.5-Coder-0.5B-Instruct, GSM8K and HumanEval in one run,
# the whole recipe (PipelineRL-4, CISPO, the fp32 head), run to its plateau across resumes:
#   python data/qwen_coder/prepare.py && python train.py config/qwen_predict_cpu.py
#   python train.py config/qwen_predict_cpu.py --init_from=resume      # each later segment
#   python fit_curve.py out-qwen-predict/log.jsonl --x=flops --fit_until=<half the planned flops>
# The compute axis is the log's `flops` (trained and generated tokens' FLOPs): a shared CPU's wall hours move
# with its load and with a faster sampler. Validation every 3 of the planned 60 steps (5% of the compute),
# on 128 held-out problems x 4 samples: the sampling error (val_sampling_se) ~0.013 at these pass rates,
# under the +-0.02 the claim is about.
model_path = ".cache/qwen_coder/model"
data_path = ".cache/qwen_coder/gsm8k_train.jsonl:3,.cache/qwen_coder/humaneval.jsonl:1"  # 3 math : 1 code
out_dir = "out-qwen-predict"
dtype = "auto"                  # bf16 compute on a CPU with native bf16, else fp32 (fp32 masters, AdamW,
sampler_dtype = "auto"          # the fp32 head)
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
                                # is the log's policy_lag_mean (~3-4: really off-policy, as the paper's k = 8)
micro_batch = 4
micro_batch_tokens = 1800       # 4 GSM8K rows of ~450 tokens, or 2 HumanEval rows of up to ~710
lr = 2e-6                       # (paper: 5e-7 for 8B) the first run of this config, at the one-hour config's
                                # 1e-5, fell from 0.238 to 0.139 by step 18 (HumanEval 0.371 -> 0.160; docs/
                                # real_model.md); 2e-6 learned steadily for 45 steps on this model and mix
warmup_steps = 2
n_train = 0
n_val = 64                      # per domain: 128 held-out problems (64 GSM8K, 64 HumanEval)
eval_samples = 4
eval_interval = 3               # 21 points from R0 to step 60
ckpt_interval = 3               # a checkpoint before each validation (a run stopped in one loses none)
max_steps = 60
max_minutes = 0.0
