# The paper's ScaleRL run (Khatri et al. 2025, sec. 4 and appendix): an 8B dense model, 48 prompts x 16
# generations, 12,288 thinking + 2,048 answer tokens, CISPO, prompt-average, batch-normalised advantages.
# GPUs: at least 8 of ~80-141 GiB, e.g. 2 FSDP2 trainers + 6 vLLM samplers (memory plan for Qwen3-8B on
# H200s: 76.3 GiB per trainer, 121 GiB per sampler: python -m infra.memory; docs/many_gpus.md). It does not fit on one GPU.
#   torchrun --standalone --nproc_per_node=8 train.py config/scalerl_8b.py --model_path=... --data_path=... --n_samplers=6
# Paper hardware: 80 GPUs, 64 generating and 16 training.
out_dir = "out-scalerl-8b"
device = "cuda"
dtype = "bfloat16"              # compute; parameters and AdamW state stay fp32
sampler_dtype = "bfloat16"      # the paper's generators (vLLM)
sampler = "vllm"
sampler_slots = 80              # per sampler, memory.slots_that_fit: ~747k KV tokens / ~8.2k expected (the
                                # prompt, half the 14.3k budget) = 91; 5 groups of 16, 480 on 6 samplers
checkpoint_activations = True
micro_batch = 0                 # no row cap: micro-batches by tokens
micro_batch_tokens = 16384      # one full-length completion per forward/backward
n_train = 0                     # every row of the dataset (Polaris-53K) trains
prompts_per_step = 48
samples_per_prompt = 16
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
