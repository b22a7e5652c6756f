"""infra/: what runs the recipe fast, on many processes, and keeps it running. Skip it on a first read
of ScaleRL.

    distributed.py   the processes: roles, placement, the control group (rollouts as arrays),
                     heartbeats, stop signals, the weight broadcast to sampler ranks
    policy.py        the policy's parameters on the trainers: fp32 masters with bf16 compute (FSDP2
                     or a bf16 copy), gradients synced, the weights gathered for checkpoints and
                     bucketed for the samplers
    checkpoint.py    out_dir's checkpoints: written beside the old one and swapped in, checked and
                     read on resume
    speed.py         the samplers' and the fp32 head's CPU speed work, each piece beside its plain torch
                     equivalent and the measurement that justifies it
    memory.py        the memory plan of every role from a model's config.json, checked before any
                     work
                     (`python -m infra.memory --hidden_size=4096 ... --gpus=8 --n_samplers=6`)

A reader needs it when a run spans several GPUs or nodes, must survive a kill, does not fit, or is
too slow; train.py calls into it at a handful of named places (load_policy, push_weights,
checkpoint.save_run and resume, memory.plan_run, the roles' distributed.setup and serve).
"""
