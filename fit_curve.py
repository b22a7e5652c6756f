"""Fit the ScaleRL law R(C) = R0 + (A - R0) / (1 + (C_mid/C)^B) to logs (Khatri et al. 2025,
arXiv 2510.13786, sec. 2): C compute, R0 the step-0 pass rate (fixed), A the asymptote, B the
exponent, C_mid the half-gain C.

    python fit_curve.py out/log.jsonl                            # fit and print the table
    python fit_curve.py out/log.jsonl --fit_until=8000           # fit half, check the rest
    python fit_curve.py out/log.jsonl --predict=12000,16000      # where the run will be
    python fit_curve.py a/log.jsonl b/log.jsonl --plot=fit.png   # compare two recipes
"""
import argparse
import csv
import json
import math
import warnings
from collections import namedtuple
from contextlib import suppress

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit
from scipy.special import expit
from scipy.stats import f as f_dist

A_STEP = 0.005          # grid step of the asymptote A (paper: 0.450..0.800 step 0.005)
A_MARGIN = 0.02         # error margin on A: three repeat runs landed within +-0.015 (paper)
MIN_X_FRACTION = 0.1    # default min_x: skip the first 10% of compute (paper: ~1.5k of 16k GPU-h)
N_C_MID = 100           # C_mid grid size (paper: 100 values in [100, 40000] GPU-h)
# C_mid grid: [first fitted x / 10, last x * 10] (ours; paper ~/15, *2.5: an early run needs more)
C_MID_SPAN = 10.0
B_GRID = np.geomspace(0.1, 10.0, 61)  # (ours) B is gridded too, see fit_sigmoid
MIN_POINTS = 4          # three fitted parameters need at least four points

# max_x: the last fitted x
SigmoidFit = namedtuple("SigmoidFit", "R0 A B C_mid rmse r2 n_points min_x max_x fit_until")
PowerLawFit = namedtuple("PowerLawFit", "A B D rmse")

# -----------------------------------------------------------------------------
# reading a log

def read_log(path, x_col="gpu_hours", y_col="val_reward"):
    """-> (x, y) arrays of the rows with both columns, of a headed .csv or train.py's JSONL log."""
    # bad input raises ValueError, one line naming the line and the field
    try:
        with open(path, newline="") as f:
            lines = f.readlines()
    except OSError as e:
        raise ValueError(f"cannot read the file ({e.strerror})") from None
    rows = []  # (line number, record)
    if path.endswith(".csv"):
        reader = csv.DictReader(lines)
        # a cell: a str, or None if missing; a long row's extras sit under None
        rows = [(reader.line_num, {k: v for k, v in record.items() if k is not None and v})
                for record in reader]
    else:
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line) if line.strip() else {}  # a blank line holds nothing
            except json.JSONDecodeError as e:
                if number == len(lines) and not line.endswith("\n"):
                    break  # a live run's line still being written: the next read will have it
                raise ValueError(f"line {number} is not JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"line {number} is not a JSON object")
            rows.append((number, {k: v for k, v in record.items() if v is not None}))
    columns = set().union(*(record for _, record in rows))
    if missing := [col for col in (x_col, y_col) if col not in columns]:
        raise ValueError(f"no column {missing[0]!r}; the columns are: "
                         f"{', '.join(sorted(columns)) or 'none'}")
    points = []  # (line number, x, y)
    for number, record in rows:
        if x_col not in record or y_col not in record:
            continue  # a training step without evaluation, or the config line
        for col in (x_col, y_col):
            # float() of a list or a word: not a number either
            with suppress(TypeError, ValueError):
                if not isinstance(record[col], bool) and math.isfinite(float(record[col])):
                    continue
            raise ValueError(f"line {number}: {col} is {record[col]!r}, not a finite number")
        x, y = float(record[x_col]), float(record[y_col])
        if points and x <= points[-1][1]:
            raise ValueError(f"line {number}: {x_col} {x:g} is not above {points[-1][1]:g} "
                             f"on line {points[-1][0]}; compute must increase")
        points.append((number, x, y))
    return np.array([p[1] for p in points]), np.array([p[2] for p in points])

# -----------------------------------------------------------------------------
# the fit

def sigmoid(x, R0, A, B, C_mid):
    """The ScaleRL law at x > 0; 1 / (1 + (C_mid/x)^B) = expit(B log(x/C_mid)), overflow-free."""
    return R0 + (A - R0) * expit(B * (np.log(x) - np.log(C_mid)))


def fit_window(x, min_x=None, fit_until=None):
    """-> (mask of the points a fit uses: min_x <= x <= fit_until and x > 0, the min_x used)."""
    x = np.asarray(x, float)
    known = x <= fit_until if fit_until is not None else np.ones(len(x), bool)
    # default min_x, skipping the near-linear early transient: MIN_X_FRACTION of the way to the last
    # x kept (ours: logs come in any unit), so that a --fit_until check never sees the future
    if min_x is None:
        last = x[known][-1] if known.any() else x[0]
        min_x = x[0] + MIN_X_FRACTION * (last - x[0])
    return known & (x >= min_x) & (x > 0), float(min_x)  # x > 0: R(0) = R0 by construction


def in_window(x, y, min_x, fit_until):
    """-> (x, y) of the points in a fit's window, as float arrays."""
    mask, _ = fit_window(x, min_x, fit_until)
    return np.asarray(x, float)[mask], np.asarray(y, float)[mask]


def grid_of_A(y, yw, R0):
    """The values A may take, for a curve y and its fit window's part yw."""
    # on A_STEP's grid, within (0, 1) for a pass rate (else y's range widened by its width), and not
    # below what a rising curve's window reached, within noise: the mean of its last tenth, less 3
    # standard errors (the noise sd from successive differences). A falling curve (ours: a
    # collapsing run, or a loss) is allowed, mirrored: A at most what it reached
    span = y.max() - y.min()
    lo, hi = (0.0, 1.0) if 0 <= y.min() <= y.max() <= 1 else (y.min() - span, y.max() + span)
    k = max(3, len(yw) // 10)
    reached = yw[-k:].mean()
    slack = 3 * np.std(np.diff(yw)) / math.sqrt(2 * k)
    lo, hi = (max(lo, reached - slack), hi) if reached >= R0 else (lo, min(hi, reached + slack))
    steps = np.arange(math.ceil(lo / A_STEP - 1e-9), math.floor(hi / A_STEP + 1e-9) + 1)
    grid = (A_STEP * steps).round(9)
    return grid if len(grid) else np.array([A_STEP * round(reached / A_STEP)])


def fit_sigmoid(x, y, r0=None, min_x=None, fit_until=None, a=None):
    """A curve from step 0 -> its SigmoidFit. R0: r0 or y[0], fixed (paper); a fixes A."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) != len(y) or len(x) == 0 or np.any(np.diff(x) <= 0):
        raise ValueError("x and y must have the same, non-zero length and x must increase")
    R0 = float(y[0]) if r0 is None else float(r0)
    mask, min_x = fit_window(x, min_x, fit_until)
    xw, yw = x[mask], y[mask]
    n = len(xw)
    if n < MIN_POINTS:
        window = f"x >= {min_x:g}" + (f", x <= {fit_until:g}" if fit_until is not None else "")
        raise ValueError(f"only {n} points in the fit window ({window}); "
                         f"the fit needs at least {MIN_POINTS}")

    a_grid = np.array([float(a)]) if a is not None else grid_of_A(y, yw, R0)
    gain = a_grid - R0  # (nA,)

    # Paper (appendix): curve_fit B in every cell of an (A, C_mid) grid, keep the least squares; its
    # table has off-grid C_mid, so C_mid is refined continuously. Ours, for speed (its 14k
    # curve_fits take seconds, this ~10 ms): B is gridded too, then curve_fit polishes (B, C_mid);
    # A stays on the grid.
    # Score every (A, B, C_mid) cell: for fixed (B, C_mid) the law is linear in the gain A - R0, so
    # SSE = |d|^2 - 2 gain (f.d) + gain^2 (f.f), f the sigmoid's shape: one matrix product per B.
    log_x, d = np.log(xw), yw - R0  # (n,)
    log_c = np.linspace(np.log(xw[0] / C_MID_SPAN), np.log(xw[-1] * C_MID_SPAN), N_C_MID)  # (nC,)
    best_sse, (best_b, best_log_c) = np.full(len(gain), np.inf), np.zeros((2, len(gain)))
    for B in B_GRID:
        shape = expit(B * (log_x[None, :] - log_c[:, None]))  # (nC, n)
        sse = d @ d - 2 * np.outer(gain, shape @ d) + np.outer(gain ** 2, (shape * shape).sum(1))
        j, s = sse.argmin(1), sse.min(1)  # sse: (nA, nC); per A the best C_mid and its SSE
        better = s < best_sse
        best_sse[better], best_b[better], best_log_c[better] = s[better], B, log_c[j[better]]

    # Refine (B, C_mid) continuously, C_mid as its log so that any unit works. A's profile is flat
    # when B is small and the coarse cells can misplace its minimum by a few steps, so walk along
    # the A grid from the best cell while a refined neighbour does better.
    bounds = ([B_GRID[0] / 2, log_c[0]], [B_GRID[-1] * 2, log_c[-1]])
    refined = {}  # grid index of A -> (sse, A, B, C_mid)
    i = int(best_sse.argmin())
    while unrefined := [j for j in (i - 1, i, i + 1) if 0 <= j < len(a_grid) and j not in refined]:
        for j in unrefined:
            curve = lambda x_, B, log_c_mid: sigmoid(x_, R0, a_grid[j], B, math.exp(log_c_mid))
            params = (best_b[j], best_log_c[j])  # kept if curve_fit fails
            with suppress(RuntimeError, ValueError), warnings.catch_warnings():
                # A == R0 leaves B and C_mid undetermined: no covariance
                warnings.simplefilter("ignore", OptimizeWarning)
                params, _ = curve_fit(curve, xw, yw, p0=params, bounds=bounds)
            sse = float(((yw - curve(xw, *params)) ** 2).sum())
            refined[j] = (sse, float(a_grid[j]), float(params[0]), math.exp(params[1]))
        i = min(refined, key=lambda j: refined[j][0])
    sse, A, B, C_mid = refined[i]
    sst = float(((yw - yw.mean()) ** 2).sum())
    return SigmoidFit(R0, A, B, C_mid, rmse=math.sqrt(sse / n),
                      r2=1 - sse / sst if sst > 0 else math.nan, n_points=n, min_x=min_x,
                      max_x=float(xw[-1]), fit_until=fit_until)


def bootstrap(x, y, fit, n_resamples=200, seed=0):
    """A fit's 95% percentile intervals {"A": (lo, hi), "B", "C_mid"}, from resampled residuals."""
    # ours (the paper's error bar is repeat runs, A +-0.015); the logged compute, R0 and window stay
    # fixed
    xw, yw = in_window(x, y, fit.min_x, fit.fit_until)
    predicted = sigmoid(xw, *fit[:4])
    residuals = yw - predicted
    residuals -= residuals.mean()  # centred
    rng = np.random.default_rng(seed)
    fits = [fit_sigmoid(xw, predicted + rng.choice(residuals, len(residuals)), fit.R0, fit.min_x)
            for _ in range(n_resamples)]
    return dict(fits=fits, **{k: tuple(np.percentile([getattr(f, k) for f in fits], [2.5, 97.5]))
                              for k in ("A", "B", "C_mid")})


def band(fits, x, rmse=0.0):
    """The 95% band of the resampled fits' curves at x -> (lo, hi), widened by 1.96 rmse."""
    # rmse, a point's own noise: the band a later point should lie in
    curves = [sigmoid(np.asarray(x, float), *f[:4]) for f in fits]
    lo, hi = np.percentile(curves, [2.5, 97.5], axis=0)
    return lo - 1.96 * rmse, hi + 1.96 * rmse


def profile_A(x, y, fit, level=0.95):
    """A's profile interval (ours) -> (lo, hi); hi None where the data do not bound A above."""
    # the A whose best (B, C_mid) leave a squared error within the F test's bound of the best fit's;
    # hi None at the top of A's grid (a window that ends before C_mid); lo at worst what y reached
    _, yw = in_window(x, y, fit.min_x, fit.fit_until)
    y, n = np.asarray(y, float), len(yw)
    error = lambda a: fit_sigmoid(x, y, fit.R0, fit.min_x, fit.fit_until, a=a).rmse ** 2 * n
    bound = fit.rmse ** 2 * n * (1 + f_dist.ppf(level, 1, n - 3) / (n - 3))
    grid = grid_of_A(y, yw, fit.R0)
    ends, start = [], int(np.abs(grid - fit.A).argmin())
    for step in (-1, 1):
        i = start
        while 0 <= i + step < len(grid) and error(grid[i + step]) <= bound:
            i += step
        ends.append(float(grid[i]) if step < 0 or i + 1 < len(grid) else None)
    return tuple(ends)


def rank_runs(names, curves, fits, margin=A_MARGIN):
    """The paper's comparison rule, best first: runs within margin of their group's top A rank by B
    at its mean A."""
    groups = []
    for i in sorted(range(len(fits)), key=lambda i: -fits[i].A):
        # exactly margin apart: within
        if not groups or fits[groups[-1][0]].A - fits[i].A > margin + 1e-9:
            groups.append([])
        groups[-1].append(i)
    ranking = []
    # a run alone in its group has no common A and no refit: it is ranked by its A
    for group in groups:
        common_A = float(np.mean([fits[i].A for i in group])) if len(group) > 1 else None
        refit_B = {i: fit_sigmoid(*curves[i], fits[i].R0, fits[i].min_x, fits[i].fit_until,
                                  common_A).B
                   for i in group if common_A is not None}
        ranking += [dict(run=names[i], index=i, A=fits[i].A, common_A=common_A,
                         B_at_common_A=refit_B.get(i))
                    for i in sorted(group, key=lambda i: -refit_B.get(i, 0))]
    return ranking


def fit_power_law(x, y, min_x, fit_until=None, a_max=1.0):
    """R = A - D / C^B, the paper's high-compute limit, on the sigmoid's window -> PowerLawFit."""
    # grid B, solve (A, D), polish with curve_fit
    xw, yw = in_window(x, y, min_x, fit_until)
    # D relative to the window's geometric-mean compute, then rescaled
    c_ref = math.exp(np.log(xw).mean())
    candidates = []  # (sse, A, B, D)
    for B in np.geomspace(1e-3, 10, 200):  # at a fixed B the law is linear in (A, D)
        u = (c_ref / xw) ** B  # (n,)
        A, D = np.linalg.lstsq(np.stack([np.ones_like(u), -u], 1), yw, rcond=None)[0]
        if A > a_max:  # the power law over-predicts A (paper: 1.0 or 0.74 vs the sigmoid's 0.645)
            A, D = a_max, float((a_max - yw) @ u / (u @ u))
        candidates.append((float(((yw - A + D * u) ** 2).sum()), A, B, D))
    curve = lambda x_, A, B, D: A - D * (c_ref / x_) ** B
    params = min(candidates, key=lambda c: c[0])[1:]  # kept if curve_fit fails
    bounds = ([-np.inf, 1e-4, -np.inf], [a_max, 20, np.inf])
    with suppress(RuntimeError, ValueError):
        params, _ = curve_fit(curve, xw, yw, p0=params, bounds=bounds)
    A, B, D = (float(p) for p in params)
    return PowerLawFit(A=A, B=B, D=D * c_ref ** B,
                       rmse=math.sqrt(((yw - curve(xw, A, B, D)) ** 2).mean()))

# -----------------------------------------------------------------------------
# plot and command line

def fmt_compute(v):
    """A compute value for people: whole GPU-hours on a cluster, 4 significant digits on a toy."""
    return f"{v:.0f}" if 100 <= abs(v) < 1e7 else f"{v:.4g}"


def plot_fits(path, runs, x_col, y_col):
    """runs: dicts of name, x, y, fit (, fits). Fitted points filled, the rest (transient, held out)
    hollow."""
    # not pyplot: a file, no display and no global figure to close
    from matplotlib.figure import Figure
    ax = Figure(figsize=(8, 5)).subplots()
    for k, run in enumerate(runs):
        x, y, fit, colour = run["x"], run["y"], run["fit"], f"C{k}"
        used, _ = fit_window(x, fit.min_x, fit.fit_until)
        shown = x > 0  # step 0 (x = 0) has no place on a log axis; it is R0
        ax.scatter(x[used], y[used], s=14, color=colour)
        ax.scatter(x[shown & ~used], y[shown & ~used], s=14, facecolors="none", edgecolors=colour)
        grid = np.geomspace(x[shown].min(), 2 * x.max(), 300)
        curve = sigmoid(grid, *fit[:4])
        inside = (grid >= fit.min_x) & (grid <= fit.max_x)
        label = f"{run['name']}: A={fit.A:.3f} B={fit.B:.2f} C_mid={fmt_compute(fit.C_mid)}"
        # the law dashed beyond the fit window, solid over it
        ax.plot(grid, curve, "--", color=colour, lw=1)
        ax.plot(grid[inside], curve[inside], "-", color=colour, label=label)
        ax.axhline(fit.A, linestyle=":", color=colour, lw=1)  # the asymptote A
        # the prediction band beyond the window: the curves' and a point's noise
        if run.get("fits"):
            beyond = grid[grid >= fit.max_x]
            ax.fill_between(beyond, *band(run["fits"], beyond, fit.rmse), color=colour, alpha=0.15)
    ax.set(xscale="log", xlabel=f"compute ({x_col}, log scale)", ylabel=y_col,
           title="ScaleRL sigmoid fit: R = R0 + (A - R0) / (1 + (C_mid / C)^B)")
    ax.legend(fontsize=8)
    ax.figure.tight_layout()
    ax.figure.savefig(path, dpi=120)
    return ax


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Fit the ScaleRL sigmoid R(C) = R0 + (A - R0) / (1 + (C_mid/C)^B) to logs.")
    option = parser.add_argument
    option("logs", nargs="+", metavar="LOG",
           help="train.py's log.jsonl, or a .csv with a header row")
    option("--x", default="gpu_hours", help="compute column: gpu_hours (default), flops, step, ...")
    option("--y", default="val_reward",
           help="reward column (val_reward_<domain>: one domain's curve)")
    option("--min_x", type=float, help="drop points below this compute; default: skip the first "
           f"{MIN_X_FRACTION * 100:.0f}%% of the fitted compute range, the early transient "
           "(paper: ~1.5k of 16k GPU-h)")
    option("--fit_until", type=float,
           help="fit x <= this only, and check the prediction of the rest")
    option("--r0", type=float,
           help="reward at zero compute (default: the first logged point, step 0)")
    option("--bootstrap", type=int, default=200, metavar="N",
           help="resamples for the 95%% intervals (0: none)")
    option("--seed", type=int, default=0, help="bootstrap seed")
    option("--powerlaw", action="store_true", help="also fit R = A - D/C^B on the same window")
    option("--plot", metavar="FILE.png", help="write a plot (needs matplotlib)")
    option("--predict", metavar="X,X,...",
           help="the fitted curve and its 95%% band (resampled curves, a point's noise) at these x")
    option("--json", action="store_true",
           help="print a JSON list, one object per run, instead of the table")
    args = parser.parse_args(argv)
    try:
        predict_at = np.array([float(v) for v in args.predict.split(",")]) if args.predict else ()
    except ValueError:
        parser.exit(2, f"fit_curve.py: error: --predict={args.predict}: not a list of numbers\n")

    # bad input: one line on stderr, exit code 2, never a traceback
    if args.plot:
        try:
            import matplotlib  # noqa: F401  (check first: fail before any work)
        except ImportError:
            parser.exit(2, "fit_curve.py: error: --plot needs matplotlib, an optional dependency: "
                        "pip install matplotlib\n")
    runs, notes = [], []  # notes: the lines printed below the table
    for path in args.logs:
        try:
            x, y = read_log(path, args.x, args.y)
            fit = fit_sigmoid(x, y, r0=args.r0, min_x=args.min_x, fit_until=args.fit_until)
        except ValueError as e:
            parser.exit(2, f"fit_curve.py: error: {path}: {e}\n")
        result = dict(run=path, **fit._asdict(), x_col=args.x, y_col=args.y,
                      A_profile=profile_A(x, y, fit), C_mid_beyond_fit=fit.C_mid > fit.max_x)
        intervals = bootstrap(x, y, fit, args.bootstrap, args.seed) if args.bootstrap > 0 else {}
        fits = intervals.pop("fits", [])
        result.update({k + "_ci": [float(v) for v in ci] for k, ci in intervals.items()})
        if result["C_mid_beyond_fit"]:
            notes.append(f"{path}: C_mid lies beyond the last fitted point: the run has not "
                         f"reached half its gain yet, so A is a long extrapolation")
        if args.fit_until is not None:
            later = x > args.fit_until
            xl, yl = x[later], y[later]
            errors = np.abs(yl - sigmoid(xl, *fit[:4]))
            mae, max_err = (float(errors.mean()), float(errors.max())) if len(xl) else (None, None)
            result.update(extrapolation_n=len(errors), extrapolation_mae=mae,
                          extrapolation_max_err=max_err)
            past = f"past {args.x} {fmt_compute(args.fit_until)}"
            notes.append(f"{path}: predicted {past}: mean |error| {mae:.4f}, max {max_err:.4f} "
                         f"over {len(errors)} points" if len(xl) else
                         f"{path}: no points {past} to check the prediction on")
            if fits and len(xl):  # the band a point should lie in: the curves', and its noise
                lo, hi = band(fits, xl, fit.rmse)
                inside = float(np.mean((lo <= yl) & (yl <= hi)))
                result["extrapolation_in_band"] = inside
                notes.append(f"{path}: {inside:.0%} of them inside the 95% prediction band")
        if len(predict_at):
            lo, hi = band(fits, predict_at, fit.rmse) if fits else ([None] * len(predict_at),) * 2
            result["predicted"] = [dict(x=float(v), R=float(sigmoid(v, *fit[:4])),
                                        lo=a and float(a), hi=b and float(b))
                                   for v, a, b in zip(predict_at, lo, hi)]
            notes += [f"{path}: predicted at {args.x} {fmt_compute(p['x'])}: {p['R']:.3f}" +
                      (f" (95% band [{p['lo']:.3f}, {p['hi']:.3f}])" if fits else "")
                      for p in result["predicted"]]
        if args.powerlaw:
            power = fit_power_law(x, y, fit.min_x, fit.fit_until)
            result["powerlaw"] = power._asdict()
            notes.append(f"{path}: power law R = A - D/C^B on the same window: A {power.A:.3f} "
                         f"(sigmoid {fit.A:.3f}), B {power.B:.3f}, RMSE {power.rmse:.4f} (paper: "
                         f"the power law over-predicts A, prefer the sigmoid)")
        runs.append(dict(name=path, x=x, y=y, fit=fit, fits=fits, result=result))
    if len(runs) > 1:
        ranking = rank_runs(args.logs, [(r["x"], r["y"]) for r in runs], [r["fit"] for r in runs])
        notes.append(f"ranking (paper's rule: A is known to +-{A_MARGIN}; runs closer than that "
                     f"are refitted with their average A and ranked by B, the steeper curve "
                     f"reaching it with less compute):")
        for place, entry in enumerate(ranking, 1):
            runs[entry["index"]]["result"].update(rank=place, common_A=entry["common_A"],
                                                  B_at_common_A=entry["B_at_common_A"])
            why = (f"B {entry['B_at_common_A']:.3f} at common A {entry['common_A']:.4f}"
                   if entry["common_A"] is not None else f"A {entry['A']:.3f}, ranked by A")
            notes.append(f"  {place}. {entry['run']}: {why}")
    if args.plot:
        plot_fits(args.plot, runs, args.x, args.y)
        notes.append(f"plot written to {args.plot}")

    if args.json:  # strict JSON: a NaN (R^2 of a flat window) becomes null
        clean = lambda v: None if isinstance(v, float) and not math.isfinite(v) else v
        print(json.dumps([{k: clean(v) for k, v in r["result"].items()} for r in runs], indent=1))
        return
    width = max(len(r["name"]) for r in runs)
    pad = " " * (width + 2)
    print(f"{'run':<{width}}  {'R0':>6}  {'A':>6}  {'B':>6}  {'C_mid':>10}  "
          f"{'fit window (' + args.x + ')':>24}  {'n':>4}  {'RMSE':>7}  {'R^2':>6}")
    for run in runs:
        fit, result = run["fit"], run["result"]
        window = f"{fmt_compute(fit.min_x)}..{fmt_compute(fit.max_x)}"
        print(f"{run['name']:<{width}}  {fit.R0:6.3f}  {fit.A:6.3f}  {fit.B:6.3f}  "
              f"{fmt_compute(fit.C_mid):>10}  {window:>24}  {fit.n_points:4d}  {fit.rmse:7.4f}  "
              f"{fit.r2:6.3f}")
        lo, hi = result["A_profile"]
        shown = f"{hi:.3f}]" if hi is not None else "...]: not bounded above by the data"
        print(f"{pad}A profile interval [{lo:.3f}, {shown} (F test, 95%)")
        if "A_ci" in result:
            (a_lo, a_hi), (b_lo, b_hi), (c_lo, c_hi) = map(result.get, ("A_ci", "B_ci", "C_mid_ci"))
            print(f"{pad}95% interval: A [{a_lo:.3f}, {a_hi:.3f}]  "
                  f"B [{b_lo:.3f}, {b_hi:.3f}]  C_mid [{fmt_compute(c_lo)}, {fmt_compute(c_hi)}]  "
                  f"({args.bootstrap} residual-bootstrap resamples)")
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
