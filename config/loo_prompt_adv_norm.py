# Leave-one-out: advantages normalised per prompt (GRPO) instead of over the batch (ScaleRL sec. 4).
# Composes with any base config: python train.py [config/scalerl_8b.py] config/loo_prompt_adv_norm.py
adv_norm = "prompt"
out_dir = "out-loo-prompt-adv-norm"
