# Leave-one-out: sample-average loss aggregation (each completion weighs the same) instead of
# prompt-average (ScaleRL sec. 4).
agg = "sample"
out_dir = "out-loo-sample-avg"
