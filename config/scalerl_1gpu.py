# ScaleRL on one GPU: your own model of up to ~2B parameters (a Qwen3-1.7B- or 0.6B-class directory) and a
# local JSONL, vLLM beside the trainer in one process. Memory plan (infra/memory.py) for Qwen3-1.7B on a 141 GiB
# H200: trainer 36.6 GiB (fp32 parameters, gradients and AdamW: 16 bytes a parameter, a bf16 copy, 3 GiB of
# activations), vLLM 0.4 of the GPU (56 GiB: ~480k tokens of KV cache). 8B needs more GPUs (scalerl_8b.py).
#   python train.py config/scalerl_1gpu.py --model_path=/models/Qwen3-1.7B --data_path=/data/polaris.jsonl
out_dir = "out-scalerl-1gpu"
device = "cuda"
dtype = "bfloat16"
sampler_dtype = "bfloat16"      # the paper's generators (vLLM)
sampler = "vllm"
vllm_gpu_memory = 0.4
sampler_slots = 80              # memory.slots_that_fit: ~480k KV tokens / ~5.1k expected a sequence (the
                                # prompt, half the 9.2k budget) = 93; 5 groups of 16. More: vLLM preempts
checkpoint_activations = True
micro_batch = 0
micro_batch_tokens = 16384
n_train = 0
prompts_per_step = 16           # (paper: 48 on 80 GPUs)
samples_per_prompt = 16
lr = 1e-6                       # (paper: 5e-7 for 8B)
warmup_steps = 100
max_lag = 8
think_budget_min = 6144         # shorter thinking than the paper's 10-12k: one GPU generates it all
think_budget_max = 8192
answer_budget = 1024
penalty_cache = 1024
n_val = 500
eval_samples = 8
eval_interval = 50
ckpt_interval = 50
max_steps = 5000
max_minutes = 0.0
