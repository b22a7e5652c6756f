# Beside the recipe (not in the paper): IcePop, tokens whose ratio to the sampler leaves [0.5, 2] dropped
# (loss.IS_CORRECTIONS). Compare: python fit_curve.py out/log.jsonl out-is-icepop/log.jsonl
is_correction = "icepop"
icepop_low = 0.5
icepop_high = 2.0
out_dir = "out-is-icepop"
