"""
Fit the ScaleRL compute-scaling law to training logs (Khatri et al. 2025, arXiv 2510.13786, sec. 2):

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

C is training compute (gpu_hours by default), R the validation pass rate, R0 its step-0 value (fixed, not
fitted), A the asymptote, B the scaling exponent and C_mid the compute of half the gain A - R0. Read top to
bottom: read_log, fit_window (the early transient and the future left out), fit_sigmoid (the paper's grid
search, refined), bootstrap (95% intervals), rank_runs (the paper's comparison rule), fit_power_law, the plot
and the command line:

    python fit_curve.py out/log.jsonl                            # fit and print the table
    python fit_curve.py out/log.jsonl --fit_until=8000           # fit half, check the rest
    python fit_curve.py a/log.jsonl b/log.jsonl --plot=fit.png   # compare two recipes

From Python (train.py's live fits): fit = fit_sigmoid(gpu_hours, val_rewards) -> fit.A, fit.B, fit.C_mid, ...;
a ValueError while the window has fewer than 4 points. One fit of 100 points takes ~10 ms.
"""
import argparse
import csv
import json
import math
import sys
import warnings
from collections import namedtuple

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit
from scipy.special import expit

A_STEP = 0.005          # grid step of the asymptote A (paper: 0.450..0.800 step 0.005)
A_MARGIN = 0.02         # error margin on A: three repeat runs landed within +-0.015 (paper)
MIN_X_FRACTION = 0.1    # default min_x: skip the first 10% of compute (paper: ~1.5k of 16k GPU-h)
N_C_MID = 100           # C_mid grid size (paper: 100 values in [100, 40000] GPU-h)
C_MID_SPAN = 10.0       # C_mid grid: [first fitted x / 10, last x * 10] (ours; paper ~/15, *2.5: an early run needs more)
B_GRID = np.geomspace(0.1, 10.0, 61)  # (ours) B is gridded too, see fit_sigmoid
MIN_POINTS = 4          # three fitted parameters need at least four points

SigmoidFit = namedtuple("SigmoidFit", "R0 A B C_mid rmse r2 n_points min_x max_x fit_until")  # max_x: last fitted x
PowerLawFit = namedtuple("PowerLawFit", "A B D rmse")

# -----------------------------------------------------------------------------
# reading a log

def read_log(path, x_col="gpu_hours", y_col="val_reward"):
    """-> (x, y) arrays of the rows that have both columns, in file order: a .csv with a header row, or
    train.py's JSONL log. Bad input raises ValueError with a one-line message naming the line and the field."""
    rows, columns = [], set()  # rows: (line number, record)
    try:
        with open(path, newline="") as f:
            if path.endswith(".csv"):
                reader = csv.DictReader(f)
                for record in reader:
                    record = {k: v for k, v in record.items() if k is not None and v not in (None, "")}
                    rows.append((reader.line_num, record))
            else:
                lines = f.readlines()
                for line_number, line in enumerate(lines, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as e:
                        if line_number == len(lines) and not line.endswith("\n"):
                            break  # a live run's line still being written: the next read will have it
                        raise ValueError(f"line {line_number} is not JSON ({e.msg})") from None
                    if not isinstance(record, dict):
                        raise ValueError(f"line {line_number} is not a JSON object")
                    rows.append((line_number, {k: v for k, v in record.items() if v is not None}))
    except OSError as e:
        raise ValueError(f"cannot read the file ({e.strerror})") from None
    for _, record in rows:
        columns.update(record)
    for col in (x_col, y_col):
        if col not in columns:
            raise ValueError(f"no column {col!r}; the columns are: {', '.join(sorted(columns)) or 'none'}")
    xs, ys, previous = [], [], None
    for line_number, record in rows:
        if x_col not in record or y_col not in record:
            continue  # a training step without evaluation, or the config line
        values = []
        for col in (x_col, y_col):
            try:
                value = float(record[col]) if not isinstance(record[col], bool) else math.nan
            except (TypeError, ValueError):
                value = math.nan
            if not math.isfinite(value):
                raise ValueError(f"line {line_number}: {col} is {record[col]!r}, not a finite number")
            values.append(value)
        if previous is not None and values[0] <= previous[1]:
            raise ValueError(f"line {line_number}: {x_col} {values[0]:g} is not above "
                             f"{previous[1]:g} on line {previous[0]}; compute must increase")
        previous = (line_number, values[0])
        xs.append(values[0])
        ys.append(values[1])
    return np.array(xs), np.array(ys)

# -----------------------------------------------------------------------------
# the fit

def sigmoid(x, R0, A, B, C_mid):
    """The ScaleRL law at compute x (x > 0). 1 / (1 + (C_mid/x)^B) = expit(B log(x/C_mid)), overflow-free."""
    return R0 + (A - R0) * expit(B * (np.log(x) - np.log(C_mid)))


def fit_window(x, min_x=None, fit_until=None):
    """-> (mask of the points a fit uses, the min_x used). The paper drops its first ~1.5k of 16k GPU-h (the
    first ~epoch, a near-linear transient); logs here come in any unit, so the default cut is a fraction (ours):
    MIN_X_FRACTION of the way to the last fitted point (a --fit_until check never sees the future). x <= 0
    never counts: R(0) = R0 by construction."""
    x = np.asarray(x, float)
    known = x <= fit_until if fit_until is not None else np.ones(len(x), bool)
    if min_x is None:
        last = x[known][-1] if known.any() else x[0]
        min_x = x[0] + MIN_X_FRACTION * (last - x[0])
    return known & (x >= min_x) & (x > 0), float(min_x)


def fit_sigmoid(x, y, r0=None, min_x=None, fit_until=None, a=None, a_range=None):
    """Fit the ScaleRL sigmoid to a whole curve (x increasing, the first point is step 0) -> SigmoidFit.

    r0: the reward at zero compute, default y[0] (fixed, as in the paper). min_x, fit_until: the
    window, see fit_window. a: fix A (the comparison rule refits at a common A). a_range: bounds of
    A, default (0, 1) for a pass rate, else the observed range widened by its own width.

    Paper (appendix): grid A in steps of 0.005 and C_mid over 100 log-spaced values, fit B with
    curve_fit in every cell, keep the lowest sum of squared residuals; its table has off-grid C_mid,
    so C_mid is refined continuously. Ours, for speed (14k curve_fits take seconds, this ~10 ms):
    B is gridded as well; for fixed (B, C_mid) the law is linear in A - R0, so one matrix product
    scores every A of the grid at once. The best cell is then polished by curve_fit over (B, C_mid)
    at its A and at neighbouring A on the grid while they do better; A stays on the 0.005 grid."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) != len(y) or len(x) == 0 or np.any(np.diff(x) <= 0):
        raise ValueError("x and y must have the same, non-zero length and x must increase")
    R0 = float(y[0]) if r0 is None else float(r0)
    mask, min_x = fit_window(x, min_x, fit_until)
    xw, yw = x[mask], y[mask]
    n = len(xw)
    if n < MIN_POINTS:
        raise ValueError(f"only {n} points in the fit window (x >= {min_x:g}"
                         + (f", x <= {fit_until:g}" if fit_until is not None else "")
                         + f"); the fit needs at least {MIN_POINTS}")

    # The A grid. A cannot lie below what a rising curve already reached, within noise: the mean of
    # its last tenth, less 3 standard errors (the noise sd from successive differences). A falling
    # curve (ours: a collapsing run, or a loss) is allowed, mirrored: A at most what it reached.
    if a is not None:
        a_grid = np.array([float(a)])
    else:
        span = y.max() - y.min()
        lo, hi = a_range or ((0.0, 1.0) if y.min() >= 0 and y.max() <= 1 else (y.min() - span, y.max() + span))
        k = max(3, n // 10)
        reached = yw[-k:].mean()
        slack = 3 * np.std(np.diff(yw)) / math.sqrt(2 * k)
        if reached >= R0:
            lo = max(lo, reached - slack)
        else:
            hi = min(hi, reached + slack)
        a_grid = (A_STEP * np.arange(math.ceil(lo / A_STEP - 1e-9), math.floor(hi / A_STEP + 1e-9) + 1)).round(9)
        if len(a_grid) == 0:
            a_grid = np.array([A_STEP * round(reached / A_STEP)])
    gain = a_grid - R0  # (nA,)

    # Score every (A, B, C_mid) cell: SSE = |d|^2 - 2 gain (f.d) + gain^2 (f.f), f the sigmoid's shape.
    log_x, d = np.log(xw), yw - R0  # (n,)
    log_c = np.linspace(np.log(xw[0] / C_MID_SPAN), np.log(xw[-1] * C_MID_SPAN), N_C_MID)  # (nC,)
    best_sse, best_b, best_log_c = np.full(len(gain), np.inf), np.zeros(len(gain)), np.zeros(len(gain))
    for B in B_GRID:
        shape = expit(B * (log_x[None, :] - log_c[:, None]))  # (nC, n)
        sse = d @ d - 2 * np.outer(gain, shape @ d) + np.outer(gain ** 2, (shape * shape).sum(1))  # (nA, nC)
        j = sse.argmin(1)
        s = sse[np.arange(len(gain)), j]
        better = s < best_sse
        best_sse[better], best_b[better], best_log_c[better] = s[better], B, log_c[j[better]]

    # Refine (B, C_mid) continuously, C_mid as its log so that any unit works. A's profile is flat
    # when B is small and the coarse cells can misplace its minimum by a few steps, so walk along
    # the A grid from the best cell while a refined neighbour does better.
    bounds = ([B_GRID[0] / 2, log_c[0]], [B_GRID[-1] * 2, log_c[-1]])
    refined = {}  # grid index of A -> (sse, A, B, C_mid)

    def refine(i):
        A = a_grid[i]
        curve = lambda x_, B, log_c_mid: sigmoid(x_, R0, A, B, math.exp(log_c_mid))
        params = (best_b[i], best_log_c[i])
        try:
            with warnings.catch_warnings():  # A == R0 leaves B and C_mid undetermined: no covariance
                warnings.simplefilter("ignore", OptimizeWarning)
                params, _ = curve_fit(curve, xw, yw, p0=params, bounds=bounds)
        except (RuntimeError, ValueError):
            pass  # keep the grid cell
        refined[i] = (float(((yw - curve(xw, *params)) ** 2).sum()), float(A), float(params[0]), math.exp(params[1]))

    i = int(best_sse.argmin())
    while True:
        for j in (i - 1, i, i + 1):
            if 0 <= j < len(a_grid) and j not in refined:
                refine(j)
        i_next = min(refined, key=lambda j: refined[j][0])
        if i_next == i:
            break
        i = i_next
    sse, A, B, C_mid = refined[i]
    sst = float(((yw - yw.mean()) ** 2).sum())
    return SigmoidFit(R0=R0, A=float(A), B=B, C_mid=C_mid, rmse=math.sqrt(sse / n),
                      r2=1 - sse / sst if sst > 0 else math.nan, n_points=n, min_x=min_x, max_x=float(xw[-1]),
                      fit_until=fit_until)


def bootstrap(x, y, fit, n_resamples=200, seed=0):
    """95% percentile intervals {"A": (lo, hi), "B": ..., "C_mid": ...} of a fit (ours), resampling residuals
    (the compute design stays as logged; R0 and the window fixed). The paper's error bar: repeats, A +-0.015."""
    mask, _ = fit_window(x, fit.min_x, fit.fit_until)
    xw, yw = np.asarray(x, float)[mask], np.asarray(y, float)[mask]
    predicted = sigmoid(xw, fit.R0, fit.A, fit.B, fit.C_mid)
    residuals = yw - predicted
    residuals -= residuals.mean()
    rng = np.random.default_rng(seed)
    fits = [fit_sigmoid(xw, predicted + rng.choice(residuals, len(residuals)), r0=fit.R0, min_x=fit.min_x)
            for _ in range(n_resamples)]
    return {k: tuple(np.percentile([getattr(f, k) for f in fits], [2.5, 97.5])) for k in ("A", "B", "C_mid")}


def rank_runs(names, curves, fits, margin=A_MARGIN):
    """The paper's comparison rule -> [dict(run, index, A, common_A, B_at_common_A)], best first. A is known to
    +-0.02: runs sorted by A are grouped while within that margin of their group's top, boundary included (0.610
    against 0.590 is such a pair), and a group is refitted at its average A and ranked by B: at a common
    asymptote the steeper curve gets there with less compute."""
    order = sorted(range(len(fits)), key=lambda i: -fits[i].A)
    groups = []
    for i in order:
        if groups and fits[groups[-1][0]].A - fits[i].A <= margin + 1e-9:
            groups[-1].append(i)
        else:
            groups.append([i])
    ranking = []
    for group in groups:
        if len(group) == 1:
            ranking.append(dict(run=names[group[0]], index=group[0], A=fits[group[0]].A, common_A=None, B_at_common_A=None))
            continue
        common_A = float(np.mean([fits[i].A for i in group]))
        refits = {i: fit_sigmoid(*curves[i], r0=fits[i].R0, min_x=fits[i].min_x,
                                 fit_until=fits[i].fit_until, a=common_A) for i in group}
        for i in sorted(group, key=lambda i: -refits[i].B):
            ranking.append(dict(run=names[i], index=i, A=fits[i].A, common_A=common_A, B_at_common_A=refits[i].B))
    return ranking


def fit_power_law(x, y, min_x, fit_until=None, a_max=1.0):
    """R = A - D / C^B on the sigmoid's window -> PowerLawFit (the paper's high-compute limit), which over-predicts
    A (paper: 1.0 or 0.74 against the sigmoid's 0.645); A is capped at a_max. Linear in (A, D) at fixed B: grid
    B, solve, polish with curve_fit; D relative to the window's geometric-mean compute (O(1) in any unit)."""
    mask, _ = fit_window(x, min_x, fit_until)
    xw, yw = np.asarray(x, float)[mask], np.asarray(y, float)[mask]
    c_ref = math.exp(np.log(xw).mean())
    best = None
    for B in np.geomspace(1e-3, 10, 200):
        u = (c_ref / xw) ** B  # (n,)
        A, D = np.linalg.lstsq(np.stack([np.ones_like(u), -u], 1), yw, rcond=None)[0]
        if A > a_max:
            A, D = a_max, float((a_max - yw) @ u / (u @ u))
        sse = float(((yw - A + D * u) ** 2).sum())
        if best is None or sse < best[0]:
            best = (sse, A, B, D)
    curve = lambda x_, A, B, D: A - D * (c_ref / x_) ** B
    params = best[1:]
    try:
        params, _ = curve_fit(curve, xw, yw, p0=params, bounds=([-np.inf, 1e-4, -np.inf], [a_max, 20, np.inf]))
    except (RuntimeError, ValueError):
        pass
    A, B, D = (float(p) for p in params)
    rmse = math.sqrt(float(((yw - curve(xw, A, B, D)) ** 2).mean()))
    return PowerLawFit(A=A, B=B, D=D * c_ref ** B, rmse=rmse)

# -----------------------------------------------------------------------------
# plot and command line

def plot_fits(path, runs, x_col, y_col):
    """runs: dicts with name, x, y, fit. Compute on a log axis; fitted points filled, the others
    (early transient, held out) hollow; the law solid over the fit window and dashed beyond; A dotted."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for k, run in enumerate(runs):
        x, y, fit, colour = run["x"], run["y"], run["fit"], f"C{k}"
        used, _ = fit_window(x, fit.min_x, fit.fit_until)
        shown = x > 0  # step 0 (x = 0) has no place on a log axis; it is R0
        ax.scatter(x[used], y[used], s=14, color=colour)
        ax.scatter(x[shown & ~used], y[shown & ~used], s=14, facecolors="none", edgecolors=colour)
        grid = np.geomspace(x[shown].min(), 2 * x.max(), 300)
        inside = (grid >= fit.min_x) & (grid <= fit.max_x)
        label = f"{run['name']}: A={fit.A:.3f} B={fit.B:.2f} C_mid={fmt_compute(fit.C_mid)}"
        ax.plot(grid, sigmoid(grid, fit.R0, fit.A, fit.B, fit.C_mid), "--", color=colour, lw=1)
        ax.plot(grid[inside], sigmoid(grid[inside], fit.R0, fit.A, fit.B, fit.C_mid), "-", color=colour, label=label)
        ax.axhline(fit.A, linestyle=":", color=colour, lw=1)
    ax.set_xscale("log")
    ax.set_xlabel(f"compute ({x_col}, log scale)")
    ax.set_ylabel(y_col)
    ax.set_title("ScaleRL sigmoid fit: R = R0 + (A - R0) / (1 + (C_mid / C)^B)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fmt_compute(v):
    """A compute value for people: whole GPU-hours on a cluster, 4 significant digits on a toy run."""
    return f"{v:.0f}" if 100 <= abs(v) < 1e7 else f"{v:.4g}"


def main(argv=None):
    parser = argparse.ArgumentParser(description="Fit the ScaleRL sigmoid R(C) = R0 + (A - R0) / (1 + (C_mid/C)^B) to logs.")
    parser.add_argument("logs", nargs="+", metavar="LOG", help="train.py's log.jsonl, or a .csv with a header row")
    parser.add_argument("--x", default="gpu_hours", help="compute column: gpu_hours (default), flops, step, ...")
    parser.add_argument("--y", default="val_reward", help="reward column (val_reward_<domain>: one domain's curve)")
    parser.add_argument("--min_x", type=float, help="drop points below this compute; default: skip the first "
                        f"{MIN_X_FRACTION * 100:.0f}%% of the fitted compute range, the early transient (paper: ~1.5k of 16k GPU-h)")
    parser.add_argument("--fit_until", type=float, help="fit x <= this only, and check the prediction of the rest")
    parser.add_argument("--r0", type=float, help="reward at zero compute (default: the first logged point, step 0)")
    parser.add_argument("--bootstrap", type=int, default=200, metavar="N", help="resamples for the 95%% intervals (0: none)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument("--powerlaw", action="store_true", help="also fit R = A - D/C^B on the same window")
    parser.add_argument("--plot", metavar="FILE.png", help="write a plot (needs matplotlib)")
    parser.add_argument("--json", action="store_true", help="print a JSON list, one object per run, instead of the table")
    args = parser.parse_args(argv)

    def fail(message):  # bad input: one line, exit code 2, never a traceback
        print(f"fit_curve.py: error: {message}", file=sys.stderr)
        sys.exit(2)

    if args.plot:
        try:
            import matplotlib  # noqa: F401  (check first: fail before any work)
        except ImportError:
            fail("--plot needs matplotlib, an optional dependency: pip install matplotlib")
    runs = []
    for path in args.logs:
        try:
            x, y = read_log(path, args.x, args.y)
            fit = fit_sigmoid(x, y, r0=args.r0, min_x=args.min_x, fit_until=args.fit_until)
        except ValueError as e:
            fail(f"{path}: {e}")
        result = dict(run=path, **fit._asdict(), x_col=args.x, y_col=args.y)
        if args.bootstrap > 0:
            for k, interval in bootstrap(x, y, fit, args.bootstrap, args.seed).items():
                result[k + "_ci"] = [float(v) for v in interval]
        if args.fit_until is not None:
            later = x > args.fit_until
            errors = np.abs(y[later] - sigmoid(x[later], fit.R0, fit.A, fit.B, fit.C_mid))
            result.update(extrapolation_n=int(later.sum()),
                          extrapolation_mae=float(errors.mean()) if later.any() else None,
                          extrapolation_max_err=float(errors.max()) if later.any() else None)
        if args.powerlaw:
            result["powerlaw"] = fit_power_law(x, y, fit.min_x, fit.fit_until)._asdict()
        runs.append(dict(name=path, x=x, y=y, fit=fit, result=result))
    ranking = [] if len(runs) == 1 else rank_runs(args.logs, [(r["x"], r["y"]) for r in runs], [r["fit"] for r in runs])
    for place, entry in enumerate(ranking, 1):
        runs[entry["index"]]["result"].update(rank=place, common_A=entry["common_A"], B_at_common_A=entry["B_at_common_A"])
    if args.plot:
        plot_fits(args.plot, runs, args.x, args.y)

    if args.json:  # strict JSON: a NaN (R^2 of a flat window) becomes null
        clean = lambda v: None if isinstance(v, float) and not math.isfinite(v) else v
        print(json.dumps([{k: clean(v) for k, v in r["result"].items()} for r in runs], indent=1))
        return
    width = max(len(r["name"]) for r in runs)
    print(f"{'run':<{width}}  {'R0':>6}  {'A':>6}  {'B':>6}  {'C_mid':>10}  {'fit window (' + args.x + ')':>24}"
          f"  {'n':>4}  {'RMSE':>7}  {'R^2':>6}")
    for run in runs:
        fit, result = run["fit"], run["result"]
        window = f"{fmt_compute(fit.min_x)}..{fmt_compute(fit.max_x)}"
        print(f"{run['name']:<{width}}  {fit.R0:6.3f}  {fit.A:6.3f}  {fit.B:6.3f}  {fmt_compute(fit.C_mid):>10}  {window:>24}"
              f"  {fit.n_points:4d}  {fit.rmse:7.4f}  {fit.r2:6.3f}")
        if "A_ci" in result:
            (a_lo, a_hi), (b_lo, b_hi), (c_lo, c_hi) = result["A_ci"], result["B_ci"], result["C_mid_ci"]
            print(f"{'':<{width}}  95% interval: A [{a_lo:.3f}, {a_hi:.3f}]  B [{b_lo:.3f}, {b_hi:.3f}]  "
                  f"C_mid [{fmt_compute(c_lo)}, {fmt_compute(c_hi)}]  ({args.bootstrap} residual-bootstrap resamples)")
    for run in runs:  # notes below the table
        result, name = run["result"], run["name"]
        if run["fit"].C_mid > run["fit"].max_x:
            print(f"{name}: C_mid lies beyond the last fitted point: the run has not reached half its gain "
                  f"yet, so A is a long extrapolation")
        if "extrapolation_n" in result:
            if result["extrapolation_n"]:
                print(f"{name}: predicted past {args.x} {fmt_compute(args.fit_until)}: mean |error| "
                      f"{result['extrapolation_mae']:.4f}, max {result['extrapolation_max_err']:.4f} "
                      f"over {result['extrapolation_n']} points")
            else:
                print(f"{name}: no points past {args.x} {fmt_compute(args.fit_until)} to check the prediction on")
        if "powerlaw" in result:
            p = result["powerlaw"]
            print(f"{name}: power law R = A - D/C^B on the same window: A {p['A']:.3f} (sigmoid {run['fit'].A:.3f}), "
                  f"B {p['B']:.3f}, RMSE {p['rmse']:.4f} (paper: the power law over-predicts A, prefer the sigmoid)")
    if ranking:
        print(f"ranking (paper's rule: A is known to +-{A_MARGIN}; runs closer than that are refitted with their "
              f"average A and ranked by B, the steeper curve reaching it with less compute):")
        for place, entry in enumerate(ranking, 1):
            why = (f"B {entry['B_at_common_A']:.3f} at common A {entry['common_A']:.4f}" if entry["common_A"] is not None
                   else f"A {entry['A']:.3f}, ranked by A")
            print(f"  {place}. {entry['run']}: {why}")
    if args.plot:
        print(f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
