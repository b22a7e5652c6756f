# Leave-one-out: DAPO's overlong length penalty instead of forced interruption (ScaleRL sec. 4).
# No "</think>" is forced in training; completions end at L_max = think_budget_max + answer_budget, and
# correct ones lose up to 1 over the last penalty_cache tokens. Validation samples as every run does.
length_control = "penalty"
out_dir = "out-loo-length-penalty"
