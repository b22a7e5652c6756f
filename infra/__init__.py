"""infra/: what runs the recipe fast, on many processes, and keeps it running. Skip it on a first read
of ScaleRL. It sits beneath the recipe: it imports nothing from the top level (what it needs is
handed in; its errors are ValueErrors the caller words), tests/test_codebase.py says so.

    control.py       when the loop checkpoints, validates and stops: signals, the time budget,
                     max_steps, exact_resume's drain, the data-parallel ranks' agreement
    distributed.py   the processes: roles, placement, the control group (rollouts as arrays),
                     heartbeats, stop signals, the weight broadcast, a follower's life
    policy.py        the policy's parameters on the trainers: fp32 masters with bf16 compute (FSDP2
                     or a bf16 copy), gradients synced, the weights gathered for checkpoints and
                     bucketed for the samplers
    lora.py          LoRA adapters: added, merged for the samplers, saved in PEFT's files
    checkpoint.py    out_dir's checkpoints: written beside the old one and swapped in, checked and
                     read on resume
    speed.py         the samplers' and the fp32 head's CPU speed work, each piece beside its plain torch
                     equivalent and the measurement that justifies it
    memory.py        the memory plan of every role from a model's config.json, checked before any
                     work (`python -m infra.memory --hidden_size=4096 ... --gpus=8 --n_samplers=6`)

A reader needs it when a run spans several GPUs or nodes, must survive a kill, does not fit, or is
too slow; train.py calls into it at a handful of named places (RunControl, load_policy,
push_weights, checkpoint.save_run, memory.plan_run, the roles' distributed.setup, serve and follow).
"""
