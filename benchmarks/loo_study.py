"""
The paper's leave-one-out study at toy scale, as one command (ScaleRL sec. 4): the recipe and each
config/loo_*.py, over several seeds, on the built-in task at a fixed budget per run; then fit_curve.py's
sigmoid per run and per config, its comparison rule against the recipe, and the extrapolation check.

    python benchmarks/loo_study.py               # 9 configs x 3 seeds, ~2.5 h on 2 cores, then the report
    python benchmarks/loo_study.py --quick       # 2 configs x 1 seed x 12 steps into a temporary dir: minutes
    python benchmarks/loo_study.py --report      # the report again from the logs already there

Runs go to runs/loo/<config>/seed<k>/ (gitignored; two at a time, one thread each). A run whose log already
reaches its last step is kept, one with a checkpoint resumes, any other starts again: stop it and run it
again at will. The report, docs/loo_study/table.md and docs/loo_study.png (docs/loo_study.md reads them), is
written from the logs, which are copied to docs/loo_study/logs/; docs/loo_study/<config>.csv holds each
config's seed-averaged curve, so

    python fit_curve.py docs/loo_study/*.csv --x=flops

refits the table. Choices (ours), stated in the report: compute is `flops` (2N a generated, 6N a trained
token), not gpu_hours: two runs share the two cores, and wall time on a shared machine measures the
neighbours; lr 1e-4 rather than train.py's 3e-5, so that the recipe saturates inside the budget and A is
measured rather than extrapolated; 120 steps, validation every 10 on 200 held-out prompts x 8 samples;
1,000 training prompts rather than 4,000, so that 120 steps of 32 make ~4 epochs and No-Positive-Resampling,
which retires a prompt for the epochs after its pass rate reaches 0.9, can act at all.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import fit_curve  # noqa: E402

BASE = ["--lr=1e-4", "--warmup_steps=5", "--max_steps=120", "--eval_interval=10", "--ckpt_interval=40",
        "--max_minutes=0", "--n_train=1000"]
QUICK = ["--lr=1e-4", "--warmup_steps=2", "--max_steps=12", "--eval_interval=2", "--ckpt_interval=6",
         "--max_minutes=0", "--n_val=40", "--eval_samples=4", "--prompts_per_step=16"]
# what the paper found when it left each choice out (SCALERL.md, the abstract's finding (2), sec. 3-4)
PAPER = {"recipe": "ScaleRL: A 0.610, B 1.92 (8B, 16k GPU-h)",
         "loo_dapo": "A: the loss type is among the choices that moved the asymptote (sec. 3.2)",
         "loo_no_fp32_head": "A: adding the fp32 head raised A 0.52 -> 0.61 (sec. 3.3)",
         "loo_ppo_off_policy": "B: a similar asymptote, PipelineRL much more compute-efficient (sec. 3.1)",
         "loo_sample_avg": "B: loss aggregation modulates efficiency, not the asymptote",
         "loo_prompt_adv_norm": "B: advantage normalisation modulates efficiency, not the asymptote",
         "loo_no_zero_var_filter": "B: within +-0.02 in A (most leave-one-outs)",
         "loo_no_npr": "B: the curriculum modulates efficiency, not the asymptote",
         "loo_length_penalty": "within +-0.02 in A (most leave-one-outs)"}


def configs():
    files = sorted(f[:-3] for f in os.listdir(os.path.join(REPO, "config")) if f.startswith("loo_") and f.endswith(".py"))
    return ["recipe"] + files


def last_step(log):
    """The step of a train.py log's last line (None if the log is missing or empty)."""
    try:
        with open(log) as f:
            return json.loads(f.readlines()[-1]).get("step")
    except (OSError, IndexError, ValueError):
        return None


def finished(out, steps):
    """train.py exited cleanly here (the study marks it: No-Positive-Resampling may stop a run before its last
    step), or the log reaches that step."""
    return os.path.exists(os.path.join(out, "done")) or last_step(os.path.join(out, "log.jsonl")) == steps


def run(config, seed, out, settings):
    """One run of train.py, kept if finished, resumed from its checkpoint, else started afresh -> out."""
    steps = int(next(a for a in settings if a.startswith("--max_steps=")).split("=")[1])
    if finished(out, steps):
        return out
    resume = os.path.isdir(os.path.join(out, "ckpt")) or os.path.isdir(os.path.join(out, "ckpt.old"))
    if not resume:
        shutil.rmtree(out, ignore_errors=True)
    args = ([os.path.join("config", config + ".py")] if config != "recipe" else []) + settings + \
        [f"--seed={seed}", f"--out_dir={out}"] + (["--init_from=resume"] if resume else [])
    env = dict(os.environ, OMP_NUM_THREADS="1")  # two runs share two cores; the tiny model gains nothing from threads
    with open(os.path.join(os.path.dirname(out), f"seed{seed}.txt"), "w") as output:
        subprocess.run([sys.executable, "train.py", *args], cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT,
                       check=True)
    open(os.path.join(out, "done"), "w").close()
    print(f"{config} seed {seed}: done", flush=True)
    return out


def mean_curve(logs):
    """The seed-averaged curve: flops and val_reward averaged at each validation step every seed has."""
    curves = [fit_curve.read_log(path, "flops", "val_reward") for path in logs]
    n = min(len(x) for x, _ in curves)
    return np.mean([x[:n] for x, _ in curves], 0), np.mean([y[:n] for _, y in curves], 0)


def report(study_dir, names, seeds, doc_dir, settings):
    """Fit, compare, write docs/loo_study.md, .png, the logs and the curves."""
    os.makedirs(os.path.join(doc_dir, "logs"), exist_ok=True)
    rows, curves, fits = [], {}, {}
    for name in names:
        logs = []
        for seed in seeds:
            log = os.path.join(doc_dir, "logs", f"{name}-seed{seed}.jsonl")
            shutil.copy(os.path.join(study_dir, name, f"seed{seed}", "log.jsonl"), log)
            logs.append(log)
        x, y = curves[name] = mean_curve(logs)
        with open(os.path.join(doc_dir, f"{name}.csv"), "w") as f:
            f.write("flops,val_reward\n" + "".join(f"{a:.6g},{b:.6f}\n" for a, b in zip(x, y)))
        fit = fits[name] = fit_curve.fit_sigmoid(x, y)
        interval = fit_curve.bootstrap(x, y, fit)
        seed_A = [fit_curve.fit_sigmoid(*fit_curve.read_log(log, "flops", "val_reward")).A for log in logs]
        try:  # the paper's check: fit up to half the compute, predict the rest
            half = fit_curve.fit_sigmoid(x, y, fit_until=x[-1] / 2)
            later = x > x[-1] / 2
            error = float(np.abs(fit_curve.sigmoid(x[later], half.R0, half.A, half.B, half.C_mid) - y[later]).mean())
        except ValueError:  # fewer than 4 points in the first half (--quick)
            error = float("nan")
        steps = [last_step(log) for log in logs]  # a run may stop early (NPR)
        rows.append(dict(name=name, R0=fit.R0, A=fit.A, A_lo=interval["A"][0], A_hi=interval["A"][1], B=fit.B,
                         B_lo=interval["B"][0], B_hi=interval["B"][1], C_mid=fit.C_mid, seed_A=seed_A,
                         extrapolation_error=error, steps=steps))
    for row in rows[1:]:  # the paper's rule, each against the recipe
        ranking = fit_curve.rank_runs(["recipe", row["name"]], [curves["recipe"], curves[row["name"]]],
                                      [fits["recipe"], fits[row["name"]]])
        if ranking[0]["common_A"] is None:
            dA = fits[row["name"]].A - fits["recipe"].A
            row["verdict"] = f"A {'higher' if dA > 0 else 'lower'} by {abs(dA):.3f}"
        else:
            B = {r["run"]: r["B_at_common_A"] for r in ranking}
            row["verdict"] = (f"A within 0.02; at A = {ranking[0]['common_A']:.3f}, B {B[row['name']]:.2f} vs the "
                              f"recipe's {B['recipe']:.2f}: {'steeper' if B[row['name']] > B['recipe'] else 'shallower'}")
    fit_curve.plot_fits(os.path.join(os.path.dirname(doc_dir), "loo_study.png"),
                        [dict(name=n, x=curves[n][0], y=curves[n][1], fit=fits[n]) for n in names],
                        "flops", "val_reward (mean over seeds)")
    lines = ["| config | steps | R0 | A [95% bootstrap] | B [95%] | C_mid (FLOPs) | A per seed (spread) | vs the recipe | "
             "extrapolation error | the paper |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        spread = f"{', '.join(f'{a:.3f}' for a in r['seed_A'])} ({max(r['seed_A']) - min(r['seed_A']):.3f})"
        error = "n/a" if math.isnan(r["extrapolation_error"]) else f"{r['extrapolation_error']:.3f}"
        lines.append(f"| {r['name']} | {', '.join(map(str, r['steps']))} | {r['R0']:.3f} | {r['A']:.3f} [{r['A_lo']:.3f}, "
                     f"{r['A_hi']:.3f}] | {r['B']:.2f} [{r['B_lo']:.2f}, {r['B_hi']:.2f}] | {r['C_mid']:.3g} | {spread} | "
                     f"{r.get('verdict', '-')} | {error} | {PAPER.get(r['name'], '')} |")
    with open(os.path.join(doc_dir, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(doc_dir, "settings.json"), "w") as f:
        json.dump(dict(settings=settings, seeds=list(seeds)), f)
    print("\n".join(lines))
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 configs x 1 seed x 12 steps, into a temporary dir")
    parser.add_argument("--report", action="store_true", help="only the report, from the runs already there")
    parser.add_argument("--workers", type=int, default=2, help="runs at a time")
    args = parser.parse_args()
    names, seeds, settings = configs(), range(args.seeds), BASE
    study_dir, doc_dir = os.path.join(REPO, "runs", "loo"), os.path.join(REPO, "docs", "loo_study")
    if args.quick:
        names, seeds, settings = ["recipe", "loo_dapo"], range(1), QUICK
        study_dir = tempfile.mkdtemp(prefix="loo-quick-")
        doc_dir = os.path.join(study_dir, "docs", "loo_study")
    if not args.report:
        jobs = [(name, seed, os.path.join(study_dir, name, f"seed{seed}")) for seed in seeds for name in names]
        for _, _, out in jobs:
            os.makedirs(os.path.dirname(out), exist_ok=True)
        with ThreadPoolExecutor(args.workers) as pool:
            list(pool.map(lambda job: run(*job, settings), jobs))
    report(study_dir, names, seeds, doc_dir, settings)
    print(f"report: {doc_dir}/table.md and {os.path.dirname(doc_dir)}/loo_study.png")
