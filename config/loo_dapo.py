# Leave-one-out: the DAPO loss (PPO clipped surrogate, clip 0.2 below / 0.28 above) instead of CISPO.
loss_type = "dapo"
out_dir = "out-loo-dapo"
