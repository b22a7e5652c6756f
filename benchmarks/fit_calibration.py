"""How often fit_curve.py's intervals hold the truth: synthetic runs drawn from known curves of the paper's
form, fitted on their first half as a user would (--fit_until), scored on the second. One row per setting.

    python benchmarks/fit_calibration.py                        # the default size: a few minutes on 2 cores
    python benchmarks/fit_calibration.py --runs=100 --compare   # with the older intervals (the residual
                                                                # bootstrap, the F-test profile): ~50 min

A run: R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) over compute 0..1, validated at `points` evenly spaced steps
after R0 (step 0), each validation a binomial draw of `samples` completions, logged with its sampling error as
train.py logs it (val_sampling_se); training rows between validations carry the truncation rate and completion
tokens the regime gate reads. The curves span the paper's fits and ours: R0 0.05-0.45, A 0.30-0.95, B 0.7-4
(log-uniform), C_mid 0.1-1.5 of the run's compute (inside the half, past the half, past the run). Families:

  clean        one curve, a few percent of completions truncated
  early        the same with C_mid 0.08-0.3 of the run, as the paper's fits (2542 of 16k GPU-h): the half
               sees the bend
  jitter       the policy's own pass rate wanders about the curve by one sampling error a point
               (overdispersion)
  two_domains  validation weighs two domains equally, each its own curve and half the samples
  second_rise  two domains; the second is flat over the fit window and rises after the half (nothing else
               in the log shows it)
  length_cap   an early phase held down by a length cap: 40-70% of completions truncated, the model learns
               to finish after the half (the truncation falls, the reward rises a second time)

Rows: each setting's intervals: printed (the one fit_curve.py prints first: for two domains, their mean's),
own curve (two domains: the overall curve's own), and with --compare the F-test profile and the residual
bootstrap. Columns: A cover (share of runs whose interval holds the true A; an end not bounded by the points
counts as open), open (share with no upper bound), width (median of the bounded ones), band (share of later
points inside the prediction band), |err| (mean |prediction - later point|), |z| (that over the point's
sampling error), gate (share of runs where fit_curve's regime gate fires on the fit window).
"""
import argparse
import io
import json
import math
import os
import sys
import tempfile
from contextlib import redirect_stdout
from multiprocessing import Pool

import numpy as np
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fit_curve  # noqa: E402

STEPS_PER_EVAL = 4          # training rows between validations (their truncation and lengths feed the gate)
COMPLETIONS_PER_STEP = 64   # training completions a step (8 prompts x 8), the truncation rate's denominator
CAP = 512                   # the length cap, tokens
HALF = 0.5                  # the fit's end: the first half of the run's compute


def draw_curve(rng, c_mid=(0.1, 1.5)):
    """(R0, A, B, C_mid) of a run whose compute runs 0..1; C_mid log-uniform in c_mid."""
    R0 = rng.uniform(0.05, 0.45)
    A = rng.uniform(max(0.30, R0 + 0.08), 0.95)
    return R0, A, math.exp(rng.uniform(math.log(0.7), math.log(4.0))), \
        math.exp(rng.uniform(*np.log(c_mid)))


def curve(x, params):
    x = np.asarray(x, float)
    return np.where(x > 0, fit_curve.sigmoid(np.maximum(x, 1e-12), *params), params[0])


def simulate(family, points, samples, seed):
    """One run -> (its log's rows, the true A of val_reward)."""
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 1, points * STEPS_PER_EVAL + 1)  # every training step's compute
    truncated = np.full(len(x), rng.uniform(0.0, 0.08))  # the share a step cuts
    # early: the paper's shape, C_mid 1/6 of the run (2542 of 16k GPU-h) give or take: the half sees the bend
    domains = [draw_curve(rng, (0.08, 0.3) if family == "early" else (0.1, 1.5))]
    domains += [draw_curve(rng)] if family in ("two_domains", "second_rise") else []
    rates = [curve(x, d) for d in domains]
    true_A = [d[1] for d in domains]
    if family == "second_rise":  # flat until past the half, then its own rise
        R0, A, B, _ = domains[1]
        start = rng.uniform(0.5, 0.7)
        late = np.clip((x - start) / (1 - start), 0, None)
        c_mid = rng.uniform(0.2, 0.6)  # of what is left of the run
        rates[1] = np.where(late > 0, R0 + (A - R0) / (1 + (c_mid / np.maximum(late, 1e-12)) ** B), R0)
    if family == "length_cap":  # a solved completion only pays when it ends within the cap
        t0, t_mid, width = rng.uniform(0.4, 0.7), rng.uniform(0.55, 0.8), rng.uniform(0.03, 0.08)
        truncated = 0.03 + (t0 - 0.03) * fit_curve.expit(-(x - t_mid) / width)
        rates[0] = rates[0] * (1 - truncated) / (1 - 0.03)
    if family == "jitter":  # the policy itself wanders: one sampling error a validation
        wander = rng.normal(0, 1, len(x)) * np.sqrt(rates[0] * (1 - rates[0]) / samples)
        rates[0] = np.clip(rates[0] + wander, 0, 1)
    rows = []
    for step in range(len(x)):
        row = dict(step=step, flops=float(x[step]))
        if step:
            cut = rng.binomial(COMPLETIONS_PER_STEP, truncated[step]) / COMPLETIONS_PER_STEP
            row.update(truncation_rate=cut, effective_prompts=int(rng.integers(3, 8)),
                       completion_tokens=int(COMPLETIONS_PER_STEP * CAP * (0.55 + 0.45 * cut)))
        if step % STEPS_PER_EVAL == 0:
            per_domain = samples // len(domains)
            drawn = [rng.binomial(per_domain, r[step]) / per_domain for r in rates]
            se = [math.sqrt(max(p * (1 - p), 1 / per_domain) / per_domain) for p in drawn]
            cut = rng.binomial(samples, truncated[step]) / samples
            row.update(val_reward=float(np.mean(drawn)),
                       val_sampling_se=math.sqrt(sum(s * s for s in se)) / len(se), val_truncation_rate=cut,
                       val_completion_tokens=CAP * (0.55 + 0.45 * cut))
            if len(domains) > 1:
                for name, p, s in zip("ab", drawn, se):
                    row.update({f"val_reward_{name}": p, f"val_sampling_se_{name}": s})
        rows.append(row)
    return rows, float(np.mean(true_A))


def covers(interval, truth):
    lo, hi = interval
    return (lo is None or lo <= truth + 1e-9) and (hi is None or truth <= hi + 1e-9)


def score(family, points, samples, seed, compare):
    """One run fitted on its first half by `fit_curve.py LOG --x=flops --fit_until=0.5 --json` ->
    {interval: (covered, open, width, band share, |err|, |z|)}, whether the gate fired."""
    rows, true_A = simulate(family, points, samples, seed)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "log.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        printed = io.StringIO()
        with redirect_stdout(printed):
            fit_curve.main([path, "--x=flops", f"--fit_until={HALF}", "--bootstrap=0", "--json"])
        whole = json.loads(printed.getvalue())[0]
        records = fit_curve.read_records(path)
    x, y, se = fit_curve.points(records, "flops", "val_reward", "val_sampling_se")
    later = x > HALF
    common = (whole["extrapolation_mae"], whole["extrapolation_mean_abs_z"])
    width = lambda lo, hi: None if lo is None or hi is None else hi - lo
    own = (covers(whole["A_profile"], true_A), whole["A_profile"][1] is None, width(*whole["A_profile"]),
           whole["extrapolation_in_band"], *common)
    results = {"printed": own}
    if "A_domains_mean" in whole:  # the overall row of two domains prints their mean's interval first
        ends, err = whole["A_domains_mean"], whole["domains_mean_mae"]
        printed = (covers(ends, true_A), ends[1] is None, width(*ends), whole["domains_mean_in_band"], err,
                   float(np.mean(err / se[later])))
        results = {"printed": printed, "own curve": own}
    if compare:
        fit = fit_curve.fit_sigmoid(x, y, fit_until=HALF)
        conf = fit_curve.confidence(x, y, fit)
        lo, hi = fit_curve.prediction_band(conf, x[later])
        inside = float(np.mean((lo <= y[later]) & (y[later] <= hi)))
        results["F profile"] = (covers(conf.A, true_A), conf.A[1] is None, width(*conf.A), inside, *common)
        boot = fit_curve.bootstrap(x, y, fit, n_resamples=100, seed=seed)
        lo, hi = fit_curve.band(boot["fits"], x[later], fit.rmse)
        inside = float(np.mean((lo <= y[later]) & (y[later] <= hi)))
        results["residual bootstrap"] = (covers(boot["A"], true_A), False, width(*boot["A"]), inside, *common)
    return results, bool(whole["unsettled"])


def score_job(job):
    return score(*job)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=60, help="runs per setting")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare", action="store_true",
                        help="also the older intervals: the residual bootstrap and the F-test profile")
    parser.add_argument("--families", default="clean,early,jitter,two_domains,second_rise,length_cap")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    settings = []
    for family in args.families.split(","):
        sizes = [(12, 512), (24, 2048)]  # (validations after R0, samples each)
        if family in ("clean", "early", "two_domains"):
            sizes = [(12, 128), (12, 512), (12, 2048), (24, 512), (48, 512)]
        settings += [(family, points, samples) for points, samples in sizes]
    jobs = [(*s, args.seed * 1_000_003 + 7919 * k + r, args.compare)
            for k, s in enumerate(settings) for r in range(args.runs)]
    with Pool(args.workers) as pool:
        scored = list(tqdm(pool.imap(score_job, jobs, chunksize=4), total=len(jobs), desc="runs"))
    print(f"{'family':<12} {'points':>6} {'samples':>7}  {'method':<19} {'A cover':>7} {'open':>5} "
          f"{'width':>6} {'band':>5} {'|err|':>6} {'|z|':>5} {'gate':>5}")
    for k, (family, points, samples) in enumerate(settings):
        mine = scored[k * args.runs:(k + 1) * args.runs]
        gate = np.mean([g for _, g in mine])
        for method in mine[0][0]:
            rows = [r[method] for r, _ in mine]
            widths = [r[2] for r in rows if r[2] is not None]
            width = f"{np.median(widths):6.3f}" if widths else "     -"
            print(f"{family:<12} {points:>6} {samples:>7}  {method:<19} {np.mean([r[0] for r in rows]):7.0%} "
                  f"{np.mean([r[1] for r in rows]):5.0%} {width} {np.mean([r[3] for r in rows]):5.0%} "
                  f"{np.mean([r[4] for r in rows]):6.3f} {np.mean([r[5] for r in rows]):5.2f} {gate:5.0%}")


if __name__ == "__main__":
    main()
