# The default run, spelled out: `python train.py` and `python train.py config/tiny_cpu.py` are the same.
# The built-in running-sum task (data.py) and its 0.38M-parameter Llama, on 2 CPU cores: R0 ~0.21,
# about +0.6 in 8 minutes. The test suite checks that these values equal train.py's defaults.
out_dir = "out"
model_path = ""
data_path = "builtin"
n_train = 4000
n_val = 200
device = "cpu"
dtype = "float32"
sampler_dtype = "auto"
sampler = "torch"
sampler_slots = 1280
loss_type = "cispo"
agg = "prompt"
adv_norm = "batch"
zero_var_filter = True
npr = True
fp32_head = True
off_policy = "pipeline"
max_lag = 8
length_control = "interrupt"
think_budget_min = 44
think_budget_max = 48
answer_budget = 4
prompts_per_step = 32
samples_per_prompt = 8
micro_batch = 64
lr = 5e-5
warmup_steps = 10
max_steps = 400
max_minutes = 8.0
eval_interval = 10
eval_samples = 8
ckpt_interval = 50
