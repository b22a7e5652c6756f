#!/usr/bin/env bash
# The first thing to run on a GPU machine (one H200; its image: torch 2.11, transformers 5.17, no vLLM), within ~8
# minutes, every output under $OUT (the device tool brings that folder back):
#
#   bash benchmarks/gpu_device.sh                 # on the GPU
#   bash benchmarks/gpu_device.sh --device=cpu    # the same steps on a CPU at toy sizes (tests/ runs it)
#
# 1. versions and the GPU (nvidia-smi), 2. the weight group at world size 1 as infra/distributed.py builds it (NCCL
# on a GPU, gloo on a CPU): connect, a 2-bucket push through broadcast / receive_buckets, abort, 3. benchmarks/
# gpu_single.py (trainer and torch sampler on a Qwen3-0.6B-shaped model, full fine-tuning and LoRA; --small on a
# CPU), 4. train.py's one-process loop on the built-in task for 4 steps (memory plan, bf16 compute, fp32 head in
# sampler and trainer, validation, a checkpoint), 5. the same with LoRA (rank 8). Each step's output goes to
# $OUT/<step>.log; summary.json holds every figure.
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda
[ "${1:-}" = "--device=cpu" ] && DEVICE=cpu
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export NCCL_CUMEM_ENABLE=0 PYTHONUNBUFFERED=1  # as the layouts set it (distributed.place): vLLM's setting
status=0
step() {  # name, seconds, command...: run it with a time limit, its output in $OUT/name.log
    local name=$1 limit=$2
    shift 2
    local started=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc in $((SECONDS - started)) s (limit $limit s)" | tee -a "$OUT/steps.txt"
    [ $rc -eq 0 ] || status=1
}

step env 60 python -c "import torch, transformers, platform; print(platform.python_version(), 'torch', torch.__version__,
'transformers', transformers.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available() and
torch.cuda.get_device_name(0))"
[ "$DEVICE" = cuda ] && nvidia-smi >> "$OUT/env.log" 2>&1

step weight_group 120 python - "$DEVICE" <<'EOF'
import datetime, json, sys, time
import torch, torch.distributed as dist
from infra import distributed
device = torch.device("cuda:0" if sys.argv[1] == "cuda" else "cpu")
store = dist.HashStore()
if device.type == "cuda":  # as distributed.setup builds it
    torch.cuda.set_device(device)
    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream, options._timeout = False, datetime.timedelta(seconds=600)
    group = dist.ProcessGroupNCCL(store, 0, 1, options)
else:
    group = dist.ProcessGroupGloo(store, 0, 1, datetime.timedelta(seconds=60))
t = time.perf_counter()
distributed.connect(group, device, 60.0, "nobody (world size 1)")
connect_s = time.perf_counter() - t
plan = distributed.bucket_plan([("a", (1024, 256)), ("b", (4096,)), ("c", (512, 512))], 1 << 20, 2)
weights = {name: torch.randn(shape, device=device, dtype=torch.bfloat16) for bucket in plan for name, shape in bucket}
t = time.perf_counter()
for bucket in plan:  # the master's side: each bucket flat, then broadcast
    flat = torch.cat([weights[name].reshape(-1) for name, _ in bucket])
    distributed.broadcast(group, flat, 60.0, "nobody")
received = dict(distributed.receive_buckets(group, plan, torch.bfloat16, device, 60.0))  # a sampler's side
push_s = time.perf_counter() - t
group.abort()
print(json.dumps(dict(backend=type(group).__name__, connect_s=round(connect_s, 3), push_s=round(push_s, 3),
                      buckets=len(plan), received=sorted(received), aborted=True)))
EOF

if [ "$DEVICE" = cuda ]; then
    step gpu_single 360 python benchmarks/gpu_single.py --budget_minutes=5.5
else
    step gpu_single 360 python benchmarks/gpu_single.py --small --device=cpu
fi

step train 240 python train.py --device="$DEVICE" --dtype=bfloat16 --out_dir="$OUT/train" --max_steps=4 \
    --eval_interval=2 --ckpt_interval=2 --n_val=16 --eval_samples=4 --prompts_per_step=8 --sampler_slots=256 \
    --max_minutes=3
step train_lora 120 python train.py --device="$DEVICE" --dtype=bfloat16 --out_dir="$OUT/train_lora" --max_steps=4 \
    --eval_interval=2 --ckpt_interval=2 --n_val=16 --eval_samples=4 --prompts_per_step=8 --sampler_slots=256 \
    --max_minutes=1.5 --lora_rank=8 --lr=1e-3

python - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
last_json = lambda name: next((json.loads(line) for line in reversed(open(os.path.join(out, name)).read().splitlines())
                               if line.startswith("{")), None) if os.path.exists(os.path.join(out, name)) else None
def rows(run):
    log = os.path.join(out, run, "log.jsonl")
    return [json.loads(line) for line in open(log)][1:] if os.path.exists(log) else []
summary = dict(steps=open(os.path.join(out, "steps.txt")).read().splitlines(), weight_group=last_json("weight_group.log"),
               gpu_single=last_json("gpu_single.log"), train=rows("train"), train_lora=rows("train_lora"),
               env=open(os.path.join(out, "env.log")).read()[:3000])
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(json.dumps(dict(steps=summary["steps"], train_steps=[r["step"] for r in summary["train"]])))
EOF
exit $status
