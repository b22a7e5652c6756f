# Leave-one-out: the LM head in the model's dtype on sampler and trainer (the paper's A fell from
# 0.61 to 0.52 without the FP32 head). On CPU in fp32 the two are the same: this ablation bites in bf16.
fp32_head = False
out_dir = "out-loo-no-fp32-head"
