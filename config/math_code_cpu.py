# Math and code in one run, on CPU: the paper's multi-task study (sec. 5) in miniature. The built-in
# task beside data/example_code.jsonl, whose programs run in rewards/sandbox.py. The tiny model cannot write
# Python, so val_reward_example_code stays at 0 (every code reward is -1, and the zero-variance filter
# drops those groups) while val_reward_builtin climbs as in the default run: this shows the plumbing
# (two domains, weights, per-domain validation, the sandbox beside the loop), not learning to code.
#   python train.py config/math_code_cpu.py
#   python fit_curve.py out-math-code/log.jsonl --y=val_reward_builtin
data_path = "builtin:3,data/example_code.jsonl:1"  # a quarter of each step's prompts are code problems
n_val = 16                     # held out per domain: the code file has 31 problems
out_dir = "out-math-code"
max_steps = 150
max_minutes = 4.0
