"""
The paper's leave-one-out study at toy scale, as one command (ScaleRL sec. 4): the recipe and each config/loo_*.py
over several seeds on the built-in task; then one report that fits fit_curve.py's sigmoid to every arm from one
fixed compute cut, compares each arm with the recipe by the paper's rule with seed-to-seed intervals, states the
power those seeds give, checks the half-budget extrapolation, and says what each run cost.

    python benchmarks/loo_study.py                              # 9 configs x 5 seeds, then the report
    python benchmarks/loo_study.py --configs=recipe,loo_dapo    # a subset (the recipe is always in it)
    python benchmarks/loo_study.py --quick                      # 2 configs x 1 seed x 12 steps, a temp dir: minutes
    python benchmarks/loo_study.py --report                     # only the report, from the runs already there

Runs go to runs/loo/<config>/seed<k>/ (gitignored), two at a time with one thread each, train.py's output beside
them in seed<k>.txt. A run whose log reaches its last step, or that train.py ended cleanly (No-Positive-Resampling
may stop it early), is kept; one with a checkpoint resumes, and each resume appends the step it resumed from to
seed<k>/resumed.txt; any other starts again. Stop the study and run it again at will.

The report comes from the logs alone: docs/loo_study/table.md (the table, and under it the cut, the power and every
resume), docs/loo_study/summary.json (every number), docs/loo_study.png, the logs copied to
docs/loo_study/logs/<config>-seed<k>.jsonl and each config's seed-mean curve in docs/loo_study/<config>.csv, so

    python fit_curve.py docs/loo_study/*.csv --x=flops --min_x=CUT      # CUT as table.md states it

refits the seed-mean fits. Choices (ours):
- compute is `flops` (2N a generated token, 6N a trained one), not gpu_hours: two runs share the two cores, so wall
  time measures the neighbours. CPU seconds and wall time are reported beside it.
- one compute cut for every fit of every arm and seed: CUT_FRACTION of the recipe's seed-mean final FLOPs (paper:
  every fit starts after ~1.5k of 16k GPU-h, "approximately one epoch", app. A.7).
- seeds play the paper's repeat runs: per-seed fits give Welch t intervals. An arm's A differs from the recipe's only
  beyond the 0.02 margin AND when the interval of the difference excludes 0; otherwise every seed of both is refitted
  at their common A and B decides, again only when its interval excludes 0.
- power: the normal approximation, from the seed-to-seed SD of B at the common A pooled over the arms.
- the extrapolation check (paper: fit 8k, predict 16k GPU-h) is scored against carrying the last value forward.
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
from scipy import stats

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import fit_curve  # noqa: E402

BASE = ["--max_steps=200", "--eval_interval=5", "--eval_samples=4", "--n_val=200", "--n_train=2000",
        "--ckpt_interval=25", "--max_minutes=0"]  # train.py overrides of every run in the study; the rest is its defaults
QUICK = ["--lr=1e-4", "--warmup_steps=2", "--max_steps=12", "--eval_interval=2", "--ckpt_interval=6",
         "--max_minutes=0", "--n_val=40", "--eval_samples=4", "--prompts_per_step=16"]
CUT_FRACTION = 0.1      # fits start at this fraction of the recipe's seed-mean final FLOPs (paper: ~1.5k of 16k GPU-h)
MAX_FIRST_SHARE = 0.40  # the first fitted point may hold at most this share of the gain A - R0 (else the cut is late)
TAIL = 0.2              # interruption and truncation rates: means over this last fraction of a run's steps
EFFECT = 0.25           # the B difference whose detection power the report states
# The paper's leave-one-out results (sec. 4, Figure 7, 8B dense, 16k GPU-h a run). Its per-arm A and B are in the
# figure's table, an image: none were found in the text, whose sentences these are (arXiv 2510.13786v1):
#   sec. 4: "Across all axes, ScaleRL consistently remains the most effective configuration, slightly
#     outperforming LOO variants either in asymptotic reward or in compute efficiency (refer to the last column in
#     the Figure 7 table)."
#   Figure 7: "Most LOO variants reach a similar asymptotic reward, with ScaleRL outperforming slightly overall. The
#     main difference in these methods lies in efficiency."
#   sec. 4: "In Figure 7, reverting to DAPO yields similar asymptotic performance to CISPO within ScaleRL. [...] it's
#     also more efficient than DAPO, as seen in LOO experiment (B = 2.01 vs B = 1.77)."
#   sec. 4: "while the FP32 precision fix makes little difference with dense 8B trained with ScaleRL (Figure 7), it
#     provides large gains in GRPO/DAPO-style losses"; on the Scout MoE "FP32 precision improves overall scalability".
#   app. A.10: "We find that replacing interruption with length penalty in our final ScaleRL recipe does not improve
#     performance."   app. A.11: "Why does PipelineRL consistently outperform the classic PPO-off-policy approach
#     (Sections 3.1 and 4)?"   sec. 3.2, advantage normalization: "This choice is also further corroborated at a
#     larger scale by the leave-one-out experiments in Section 4."
#   sec. 7: "when doing the 'backward' leave-one-out ablations from the ScaleRL recipe, we find very little impact on
#     asymptotic performance from each decision, but each component of the algorithm seems to help efficiency."
SIMILAR = "similar A; ScaleRL slightly better in A or B (Fig. 7, numbers in the figure only)"
PAPER = {"recipe": "the most effective configuration; B 2.01 (vs DAPO's 1.77)",
         "loo_dapo": "similar A to CISPO; less efficient: B 1.77 vs 2.01",
         "loo_no_fp32_head": "makes little difference (dense 8B); helps on the Scout MoE",
         "loo_ppo_off_policy": "PipelineRL outperforms PPO-off-policy (app. A.11)",
         "loo_length_penalty": "the penalty does not improve performance (app. A.10)",
         "loo_prompt_adv_norm": "batch-level normalization corroborated by the LOO (sec. 3.2)",
         "loo_no_zero_var_filter": SIMILAR, "loo_no_npr": SIMILAR, "loo_sample_avg": SIMILAR}

# -----------------------------------------------------------------------------
# statistics of the comparison

def t_interval(a, b=None, level=0.95):
    """-> (estimate, lo, hi) of mean(a), or of mean(a) - mean(b) by Welch's t (unequal variances, Welch-Satterthwaite
    degrees of freedom; one sample: n - 1 of them). lo, hi are None with fewer than 2 values on a side: one seed
    says nothing about the spread. Values that do not vary give the point (the fits' A lies on a 0.005 grid)."""
    samples = [np.asarray(a, float)] + ([np.asarray(b, float)] if b is not None else [])
    estimate = float(samples[0].mean() - (samples[1].mean() if b is not None else 0.0))
    if min(len(s) for s in samples) < 2:
        return estimate, None, None
    parts = [(s.var(ddof=1) / len(s), len(s)) for s in samples]  # (squared standard error, n)
    se2 = sum(v for v, _ in parts)
    if se2 == 0:
        return estimate, estimate, estimate
    df = se2 ** 2 / sum(v ** 2 / (n - 1) for v, n in parts)
    half = float(stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(se2)
    return estimate, estimate - half, estimate + half


def pooled_sd(groups, weights=None):
    """The seed-to-seed SD pooled over groups of per-seed values: sqrt(sum w (n - 1) s^2 / sum w (n - 1)); None
    when no group has 2 values. weights: a group seen several times (the recipe, refitted once per arm) counts once."""
    weights = weights or [1.0] * len(groups)
    pairs = [(w * (len(g) - 1), np.var(g, ddof=1)) for g, w in zip(groups, weights) if len(g) >= 2]
    if not pairs:
        return None
    return math.sqrt(sum(d * v for d, v in pairs) / sum(d for d, _ in pairs))


def power(sd, n, effect=EFFECT):
    """Two arms of n seeds, a two-sided 5% test, the normal approximation -> (the difference detectable with 80%
    power, (1.96 + 0.84) SE, and the power to detect `effect`, Phi(effect / SE - 1.96)), SE = sd sqrt(2 / n)."""
    se = sd * math.sqrt(2 / n)
    return (1.96 + 0.84) * se, float(stats.norm.cdf(effect / se - 1.96)) if se > 0 else 1.0

# -----------------------------------------------------------------------------
# the runs

def configs():
    files = os.listdir(os.path.join(REPO, "config"))
    return ["recipe"] + sorted(f[:-3] for f in files if f.startswith("loo_") and f.endswith(".py"))


def read_rows(log):
    """train.py's log -> its step rows (the config line, and a line a live run is still writing, left out)."""
    try:
        with open(log) as f:
            rows = [json.loads(line) for line in f if line.endswith("\n")]
    except OSError:
        return []
    return [r for r in rows if "step" in r]


def run(config, seed, out, settings):
    """One run of train.py -> out: kept if finished, resumed from its checkpoint (the step recorded), else afresh."""
    steps = int(next(a for a in settings if a.startswith("--max_steps=")).split("=")[1])
    rows = read_rows(os.path.join(out, "log.jsonl"))
    if os.path.exists(os.path.join(out, "done")) or (rows and rows[-1]["step"] == steps):
        return
    resumed = None
    if os.path.isdir(os.path.join(out, "ckpt")) or os.path.isdir(os.path.join(out, "ckpt.old")):
        from log import resume  # torch and transformers: only when a run resumes
        found = resume(out)  # (directory, state, log rows) of the checkpoint train.py will take, or None
        resumed = found[1]["step"] if found else None
    if resumed is None:
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
    else:
        with open(os.path.join(out, "resumed.txt"), "a") as f:
            f.write(f"{resumed}\n")
        print(f"{config} seed {seed}: resuming from step {resumed}", flush=True)
    args = ([os.path.join("config", config + ".py")] if config != "recipe" else []) + settings + \
        [f"--seed={seed}", f"--out_dir={out}"] + (["--init_from=resume"] if resumed is not None else [])
    env = dict(os.environ, OMP_NUM_THREADS="1")  # two runs share two cores; the tiny model gains nothing from threads
    output = os.path.join(os.path.dirname(out), f"seed{seed}.txt")
    with open(output, "a") as f:  # appended: an earlier attempt's output stays readable
        code = subprocess.run([sys.executable, "train.py", *args], cwd=REPO, env=env, stdout=f,
                              stderr=subprocess.STDOUT).returncode
    if code:
        raise RuntimeError(f"{config} seed {seed}: train.py exited with {code}; its output is in {output}")
    open(os.path.join(out, "done"), "w").close()
    print(f"{config} seed {seed}: done", flush=True)

# -----------------------------------------------------------------------------
# reading the runs back

def recount(lines):
    """A log written before 09847fd -> the same log with `tokens` and `flops` counted as train.py now counts them.
    train.py did not reset its count of generated tokens after a step, so row i's `tokens` grew by every step's
    tokens since the last validation (which restarted the count) or the last resume: a step's own tokens are its
    growth less the previous row's, unless that row was a validation, step 0 or the resume point. The values as
    logged stay in `tokens_as_logged` and `flops_as_logged`; a log recounted before is returned as it is."""
    header, rows = lines[0], lines[1:]
    if any("tokens_as_logged" in r for r in rows):
        return lines
    n, out, before, carried = header["n_params"], [header], dict(tokens=0, flops=0.0, time=0.0), 0
    tokens, flops = 0, 0.0  # counted once
    for r in rows:
        carried = 0 if r["time"] < before["time"] else carried  # a resume: a new process, counting from 0
        tokens += r["tokens"] - before["tokens"] - carried
        flops += r["flops"] - before["flops"] - 2 * n * carried
        out.append(dict(r, tokens=tokens, flops=flops, tokens_as_logged=r["tokens"], flops_as_logged=r["flops"]))
        carried = 0 if "val_reward" in r else r["tokens"] - before["tokens"]  # the old count, carried to the next row
        before = r
    return out


def process_total(values):
    """A counter that restarts with each process (train.py's `time`, per resume) -> its total: each process's last
    value, summed. A counter carried over the resume never falls and gives its last value."""
    return sum(before for before, after in zip(values, values[1:]) if after < before) + values[-1]


def run_stats(rows, resumed_from):
    """One run's cost and health from its log rows: the step it ended at, FLOPs, CPU seconds (train.py's cumulative
    `cpu_seconds`, if logged), wall seconds, policy lag, the lag-0 generator/trainer mismatch, the rates at its end."""
    trained = [r for r in rows if "policy_lag_mean" in r]  # rows of optimizer steps (not step 0)
    tail = trained[-max(1, math.ceil(TAIL * len(trained))):]
    mean = lambda rs, key: float(np.mean([r[key] for r in rs if key in r])) if any(key in r for r in rs) else None
    weighted = lambda rs, key: float(np.average([r[key] for r in rs if key in r], weights=[
        r["lag0_tokens"] for r in rs if key in r])) if any(key in r for r in rs) else None
    cpu, wall = [r["cpu_seconds"] for r in rows if "cpu_seconds" in r], [r["time"] for r in rows if "time" in r]
    return dict(steps=rows[-1]["step"], flops=rows[-1]["flops"], cpu_seconds=process_total(cpu) if cpu else None,
                wall_seconds=process_total(wall) if wall else None,
                policy_lag_mean=mean(trained, "policy_lag_mean"),
                policy_lag_max=max((r["policy_lag_max"] for r in trained), default=None),
                # weighted by the lag-0 tokens of each step (a step that trained none logs no figure)
                logprob_mismatch_lag0=weighted(trained, "logprob_mismatch_lag0"), kl_lag0=weighted(trained, "kl_lag0"),
                interruption_rate=mean(tail, "interruption_rate"), truncation_rate=mean(tail, "truncation_rate"),
                resumed_from=resumed_from,  # resumed.txt; and the resumes the log's clock shows (it restarts with
                # each process), which also finds those of runs older than resumed.txt
                resumed_from_log=[before["step"] for before, after in zip(rows, rows[1:])
                                  if after["time"] < before["time"]])


def read_arm(study_dir, doc_dir, name, seeds):
    """One config's runs -> dict(name, runs: each seed's stats, curves: each seed's (flops, val_reward), x, y: the
    seed-mean curve, averaged at each validation every seed has); its logs copied to the docs, its curve written."""
    runs, curves = [], []
    for seed in seeds:
        out = os.path.join(study_dir, name, f"seed{seed}")
        log = os.path.join(doc_dir, "logs", f"{name}-seed{seed}.jsonl")
        shutil.copy(os.path.join(out, "log.jsonl"), log)
        try:
            with open(os.path.join(out, "resumed.txt")) as f:
                resumed_from = [int(line) for line in f if line.strip()]
        except OSError:
            resumed_from = []
        runs.append(dict(seed=seed, **run_stats(read_rows(log), resumed_from)))
        curves.append(fit_curve.read_curve(log, "flops", "val_reward"))
    n = min(len(x) for x, _ in curves)
    x, y = np.mean([x[:n] for x, _ in curves], 0), np.mean([y[:n] for _, y in curves], 0)
    with open(os.path.join(doc_dir, f"{name}.csv"), "w") as f:
        f.write("flops,val_reward\n" + "".join(f"{a:.6g},{b:.6f}\n" for a, b in zip(x, y)))
    return dict(name=name, runs=runs, curves=curves, x=x, y=y)


def try_fit(x, y, **window):
    """fit_curve.fit_sigmoid, or None when the window holds too few points."""
    try:
        return fit_curve.fit_sigmoid(x, y, **window)
    except ValueError:
        return None


def fit_arm(arm, cut):
    """Fit an arm from the cut: its seed-mean curve, each seed alone (A_i, B_i), the first fitted point's share of
    the gain (how much of the rise the cut leaves out) and the extrapolation check."""
    x, y = arm["x"], arm["y"]
    try:
        arm["fit"] = fit = fit_curve.fit_sigmoid(x, y, min_x=cut)
    except ValueError as e:
        raise ValueError(f"{arm['name']}'s seed-mean curve: {e}") from None
    seed_fits = [try_fit(*curve, min_x=cut) for curve in arm["curves"]]
    for run_, seed_fit in zip(arm["runs"], seed_fits):
        run_.update({k: None if seed_fit is None else getattr(seed_fit, k) for k in ("A", "B", "C_mid")})
    arm["seed_A"] = [f.A for f in seed_fits if f]
    arm["A_interval"] = t_interval(arm["seed_A"])[1:] if arm["seed_A"] else (None, None)
    first = int(np.argmax(x >= cut))
    arm["first_share"] = (y[first] - fit.R0) / (fit.A - fit.R0) if fit.A != fit.R0 else None
    arm["extrapolation"] = extrapolation(x, y, cut, fit.A)


def extrapolation(x, y, cut, full_A):
    """The paper's check: fit up to half the compute, predict the rest -> A(half), the mean |prediction - observed|
    over the second half and that of carrying the last observed value forward; None with too few points."""
    half = x[-1] / 2
    fit, later = try_fit(x, y, min_x=cut, fit_until=half), x > half
    if fit is None or not later.any():
        return None
    predicted = fit_curve.sigmoid(x[later], fit.R0, fit.A, fit.B, fit.C_mid)
    carried = y[x <= half][-1]
    return dict(A_half=fit.A, A_full=full_A, error=float(np.abs(predicted - y[later]).mean()),
                carry_forward_error=float(np.abs(carried - y[later]).mean()))


def compare(arm, recipe, cut):
    """The paper's rule, arm against the recipe, seeds as its repeat runs -> (verdict, the numbers behind it)."""
    a_diff = t_interval(arm["seed_A"], recipe["seed_A"])
    free_diff = arm["fit"].A - recipe["fit"].A
    if abs(free_diff) > fit_curve.A_MARGIN and a_diff[1] is not None and not a_diff[1] <= 0 <= a_diff[2]:
        word = "higher" if a_diff[0] > 0 else "lower"
        verdict = f"A {word} by {abs(a_diff[0]):.3f} [{a_diff[1]:+.3f}, {a_diff[2]:+.3f}]"
        return verdict, dict(A_diff=a_diff, common_A=None)
    common_A = (arm["fit"].A + recipe["fit"].A) / 2
    arm_B, recipe_B = ([f.B for f in (try_fit(x, y, a=common_A, min_x=cut) for x, y in side["curves"]) if f]
                       for side in (arm, recipe))
    b_diff = t_interval(arm_B, recipe_B) if arm_B and recipe_B else (None, None, None)
    numbers = dict(A_diff=a_diff, common_A=common_A, B_arm=arm_B, B_recipe=recipe_B, B_diff=b_diff)
    if not (arm_B and recipe_B):
        return f"n/a (too few points to refit at A = {common_A:.3f})", numbers
    B_text = f"B {np.mean(arm_B):.2f} vs {np.mean(recipe_B):.2f} at A = {common_A:.3f}"
    if b_diff[1] is None:
        return f"n/a (1 seed): A {arm['fit'].A:.3f} vs {recipe['fit'].A:.3f}, {B_text}", numbers
    note = "" if abs(free_diff) <= fit_curve.A_MARGIN else f"A {free_diff:+.3f}, within noise; "
    # a difference whose interval holds 0 is a tie, never a loss
    word = "steeper" if b_diff[1] > 0 else "shallower" if b_diff[2] < 0 else "indistinguishable"
    return f"{note}{word} ({B_text}, diff {b_diff[0]:+.2f} [{b_diff[1]:+.2f}, {b_diff[2]:+.2f}])", numbers

# -----------------------------------------------------------------------------
# the report

def fmt(value, spec):
    return "n/a" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, spec)


def table(arms, cut, share_ok, power_text):
    """The markdown table, one row an arm, and under it the cut, the rule, the power and every resume."""
    lines = ["| config | steps | R0 | A [per-seed 95%] | B | C_mid (FLOPs) | first-point gain share | vs the recipe | "
             "A(half)->A(full), extrapolation error vs carry-forward | lag mean/max | mismatch lag 0 | "
             "interrupted / truncated (last 20%) | CPU s/run (wall) | the paper (LOO) |", "|" + "---|" * 14]
    resumes = []
    for a in arms:
        runs, fit, e, (lo, hi) = a["runs"], a["fit"], a["extrapolation"], a["A_interval"]
        mean = lambda key: float(np.mean([r[key] for r in runs])) if all(r[key] is not None for r in runs) else None
        share = fmt(a["first_share"], ".2f")
        if a["first_share"] is not None and a["first_share"] > MAX_FIRST_SHARE:
            share += f" (> {MAX_FIRST_SHARE})"
        check = "n/a" if e is None else \
            f"{e['A_half']:.3f}->{e['A_full']:.3f}, {e['error']:.3f} vs {e['carry_forward_error']:.3f}"
        lag_max = max((r["policy_lag_max"] for r in runs if r["policy_lag_max"] is not None), default=None)
        interval = "n/a (1 seed)" if lo is None else f"{lo:.3f}, {hi:.3f}"
        lines.append(
            f"| {a['name']} | {', '.join(str(r['steps']) for r in runs)} | {fit.R0:.3f} | {fit.A:.3f} [{interval}] | "
            f"{fit.B:.2f} | {fit.C_mid:.3g} | {share} | {a['verdict']} | {check} | "
            f"{fmt(mean('policy_lag_mean'), '.2f')} / {fmt(lag_max, 'g')} | "
            f"{fmt(mean('logprob_mismatch_lag0'), '.2e')} | "
            f"{fmt(mean('interruption_rate'), '.2f')} / {fmt(mean('truncation_rate'), '.2f')} | "
            f"{fmt(mean('cpu_seconds'), '.0f')} ({fmt(mean('wall_seconds'), '.0f')}) | {PAPER.get(a['name'], '')} |")
        for r in runs:
            unrecorded = [step for step in r["resumed_from_log"] if step not in r["resumed_from"]]
            if r["resumed_from"]:
                resumes.append(f"{a['name']} seed {r['seed']} from step {', '.join(map(str, r['resumed_from']))}")
            if unrecorded:
                resumes.append(f"{a['name']} seed {r['seed']} from step {', '.join(map(str, unrecorded))} (seen in "
                               "its log's clock, not in resumed.txt)")
    return lines + [
        "", f"- Compute cut: every fit (each arm's seed-mean curve, each seed alone) uses flops >= CUT = {cut:.4g}, "
        f"{CUT_FRACTION} x the recipe's seed-mean final FLOPs. The first fitted point holds <= {MAX_FIRST_SHARE} of "
        f"the gain A - R0 in every arm: {'yes' if share_ok else 'NO'}.",
        "- A: the seed-mean curve's fit, and the 95% t interval of the mean of the per-seed fits' A. Verdicts: A "
        f"differs only beyond +-{fit_curve.A_MARGIN} and with a Welch 95% interval of the per-seed difference "
        "excluding 0; otherwise every seed of both is refitted at their common A and B decides, by its Welch interval.",
        f"- Power: {power_text}.",
        "- Resumed runs: " + ("; ".join(resumes) if resumes else "none") + "."]


def clean(value):
    """For strict JSON: numpy numbers as Python ones, NaN as null, tuples as lists."""
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value.item() if isinstance(value, np.generic) else value


def report(study_dir, names, seeds, doc_dir, settings):
    """Fit, compare and write table.md, summary.json, the curves, the logs and loo_study.png -> the arms."""
    os.makedirs(os.path.join(doc_dir, "logs"), exist_ok=True)
    arms = [read_arm(study_dir, doc_dir, name, seeds) for name in names]  # arms[0] is the recipe
    cut = CUT_FRACTION * arms[0]["x"][-1]  # one cut for every arm, as the paper's ~1.5k GPU-h
    for arm in arms:
        fit_arm(arm, cut)
    arms[0].update(verdict="-", comparison=None)
    for arm in arms[1:]:
        arm["verdict"], arm["comparison"] = compare(arm, arms[0], cut)

    # the noise of B at a common A, pooled: each arm's seeds, and the recipe's (refitted once per arm) counted once
    refits = [a["comparison"] for a in arms[1:] if a["comparison"]["common_A"] is not None]
    groups = [c["B_arm"] for c in refits] + [c["B_recipe"] for c in refits]
    sd_B = pooled_sd(groups, [1.0] * len(refits) + [1.0 / len(refits)] * len(refits)) if refits else None
    n = len(seeds)
    detectable, chance = power(sd_B, n) if sd_B is not None else (None, None)
    power_text = (f"n/a ({n} seed{'s' * (n != 1)} an arm: no seed-to-seed SD of B)" if sd_B is None else
                  f"seed-to-seed SD of B at the common A {sd_B:.3f} (pooled), {n} seeds an arm: a B difference of "
                  f"{detectable:.2f} is detectable with 80% power (two-sided 5%), and one of {EFFECT} with "
                  f"{100 * chance:.0f}% power")

    share_ok = all(a["first_share"] is not None and a["first_share"] <= MAX_FIRST_SHARE for a in arms)
    lines = table(arms, cut, share_ok, power_text)
    with open(os.path.join(doc_dir, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    fit_curve.plot_fits(os.path.join(os.path.dirname(doc_dir), "loo_study.png"),
                        [dict(name=a["name"], x=a["x"], y=a["y"], fit=a["fit"]) for a in arms],
                        "flops", "val_reward (mean over seeds)")
    summary = dict(settings=settings, seeds=list(seeds), configs=names, cut_fraction=CUT_FRACTION, cut_flops=cut,
                   a_margin=fit_curve.A_MARGIN, max_first_share=MAX_FIRST_SHARE,
                   first_share_ok=share_ok,
                   power=dict(sd_B=sd_B, n=n, detectable_B_diff=detectable, effect=EFFECT, power_at_effect=chance),
                   arms={a["name"]: dict(R0=a["fit"].R0, A=a["fit"].A, B=a["fit"].B, C_mid=a["fit"].C_mid,
                                         rmse=a["fit"].rmse, n_points=a["fit"].n_points, A_interval=a["A_interval"],
                                         first_share=a["first_share"], verdict=a["verdict"], comparison=a["comparison"],
                                         extrapolation=a["extrapolation"],
                                         runs=a["runs"], paper=PAPER.get(a["name"], "")) for a in arms})
    with open(os.path.join(doc_dir, "summary.json"), "w") as f:
        json.dump(clean(summary), f, indent=1, allow_nan=False)
    print("\n".join(lines))
    return arms


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--seeds", type=int, default=5, help="seeds per config (0, 1, ...)")
    parser.add_argument("--configs", help="comma-separated subset, e.g. recipe,loo_dapo (the recipe is always in it)")
    parser.add_argument("--quick", action="store_true", help="2 configs x 1 seed x 12 steps, into a temporary dir")
    parser.add_argument("--report", action="store_true", help="only the report, from the runs already there")
    parser.add_argument("--workers", type=int, default=2, help="runs at a time")
    parser.add_argument("--recount", action="store_true", help="first rewrite the logs of runs made before 09847fd "
                        "with tokens and flops counted once (see recount()); their logged values are kept beside")
    args = parser.parse_args()
    if args.quick and args.report:
        parser.error("--quick runs into a new temporary dir: there is nothing there to report on")
    names, seeds, settings = configs(), range(args.seeds), BASE
    if args.configs:
        unknown = set(args.configs.split(",")) - set(names)
        if unknown:
            parser.error(f"unknown configs {', '.join(sorted(unknown))}; the study has {', '.join(names)}")
        names = ["recipe"] + [n for n in names[1:] if n in args.configs.split(",")]  # CUT and every verdict need it
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
    for log in [os.path.join(study_dir, n, f"seed{k}", "log.jsonl") for n in names for k in seeds] if args.recount else []:
        with open(log) as f:
            lines = recount([json.loads(line) for line in f])
        with open(log + ".tmp", "w") as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))
        os.replace(log + ".tmp", log)  # whole or not at all
    report(study_dir, names, seeds, doc_dir, settings)
    print(f"report: {doc_dir}/table.md and {os.path.dirname(doc_dir)}/loo_study.png")
