# Leave-one-out: uniform prompt sampling (every epoch a fresh permutation) instead of
# No-Positive-Resampling (ScaleRL sec. 4).
npr = False
out_dir = "out-loo-no-npr"
