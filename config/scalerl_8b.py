# The paper's ScaleRL run (Khatri et al. 2025, sec. 4 and appendix): an 8B dense model, 48 prompts x 16
# generations, 12,288 thinking + 2,048 answer tokens, CISPO, prompt-average, batch-normalised advantages.
# Pass the model and data: python train.py config/scalerl_8b.py --model_path=/models/... --data_path=/data/polaris.jsonl
# Paper hardware: 80 GPUs, 64 generating and 16 training; here one GPU time-shares unless run under
# torchrun with --n_samplers (see README).
out_dir = "out-scalerl-8b"
device = "cuda"
dtype = "bfloat16"
sampler = "vllm"
sampler_slots = 768
prompts_per_step = 48
samples_per_prompt = 16
micro_batch = 16
lr = 5e-7
warmup_steps = 100
weight_decay = 0.01
adam_eps = 1e-15
grad_clip = 1.0
max_lag = 8
think_budget_min = 10240
think_budget_max = 12288
answer_budget = 2048
penalty_cache = 2048
temperature = 1.0
n_val = 1000
eval_samples = 16
eval_interval = 100
ckpt_interval = 100
max_steps = 10000
max_minutes = 0.0
