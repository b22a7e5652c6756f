# A real pretrained model learns real math word problems on a CPU (docs/real_models_cpu.md):
#   python data/smollm2/prepare.py && python train.py config/smollm2_cpu.py
# SmolLM2-135M-Instruct (Q4_1, dequantised) does not think: no <think> is opened, so no interruption, and a
# completion is only capped at think_budget_max + answer_budget tokens (sample.py).
model_path = ".cache/smollm2/model"
data_path = ".cache/smollm2/easy.jsonl"      # small-number MAWPS, SVAMP and ASDiv problems (data/smollm2/prepare.py)
prompt_template = "{problem}\nReply with the number only."
out_dir = "out-smollm2"
dtype = "auto"                  # fp32 masters and AdamW; bf16 compute on a CPU with native bf16
                                # (a step in 0.75x fp32's time here: benchmarks/cpu_dtypes.py), else
                                # fp32
sampler_dtype = "auto"
temperature = 0.7               # (paper: 1.0) at 1.0 this 135M model rambles off any answer
think_budget_min = 24           # only a cap for a model that does not think: 24 + 8 tokens
think_budget_max = 24
answer_budget = 8
train_truncated = True          # (paper: excluded, at 14k tokens) at first the cap cuts most completions, and
                                # RL must see them to learn to stop
prompts_per_step = 16
samples_per_prompt = 8
sampler_slots = 128             # one step's completions at a time: the first step comes after one batch
max_lag = 2                     # (paper: 8) at most 3 steps of groups queued, so that validation waits for few
micro_batch = 16
lr = 5e-5                       # constant after warm-up (paper: 5e-7 for 8B)
warmup_steps = 2
n_val = 64
eval_samples = 4
eval_interval = 5
ckpt_interval = 10
max_steps = 100
max_minutes = 60.0
