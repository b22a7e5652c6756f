# Beside the recipe (not in the paper): the geometric sequence mask, a completion dropped whole when
# exp(mean log ratio to the sampler) leaves [0.99, 1.01] (loss.IS_CORRECTIONS; SkyRL's, and NeMo-RL's
# recommendation for reasoning). Compare: python fit_curve.py out/log.jsonl out-is-geo-mask/log.jsonl
is_correction = "geo_mask"
geo_low = 0.99
geo_high = 1.01
out_dir = "out-is-geo-mask"
