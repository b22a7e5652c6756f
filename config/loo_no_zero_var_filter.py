# Leave-one-out: keep groups whose rewards are all equal in the loss (they add zero-advantage tokens
# that still count in the aggregation denominators) (ScaleRL sec. 4).
zero_var_filter = False
out_dir = "out-loo-no-zero-var-filter"
