# Beside the recipe (not in the paper): token-level truncated importance sampling, each token's ratio to the
# sampler capped at 2 (loss.IS_CORRECTIONS). Compare: python fit_curve.py out/log.jsonl out-is-tis/log.jsonl
is_correction = "tis"
tis_cap = 2.0
out_dir = "out-is-tis"
