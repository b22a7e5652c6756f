# Leave-one-out: PPO-off-policy-k instead of PipelineRL-k: generate k x P prompts with one policy,
# then take k optimizer steps of P prompts each; generation and training alternate (ScaleRL sec. 3.1).
off_policy = "ppo"
out_dir = "out-loo-ppo-off-policy"
