# Leave-one-out: the LM head in the model's dtype on sampler and trainer (the paper's A fell from
# 0.61 to 0.52 without the FP32 head). On a CPU with native bf16 the sampler decodes in bf16
# (sampler_dtype 'auto') against fp32 trainer weights: without the FP32 head its logits are rounded
# to bf16 as well (logprob_mismatch_lag0).
fp32_head = False
out_dir = "out-loo-no-fp32-head"
