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
from scipy.stats import chi2, norm
from scipy.stats import f as f_dist

A_STEP = 0.005          # grid step of the asymptote A (paper: 0.450..0.800 step 0.005)
A_MARGIN = 0.02         # error margin on A: three repeat runs landed within +-0.015 (paper)
MIN_X_FRACTION = 0.1    # default min_x: skip the first 10% of compute (paper: ~1.5k of 16k GPU-h)
N_C_MID = 100           # C_mid grid size (paper: 100 values in [100, 40000] GPU-h)
# C_mid grid: [first fitted x / 10, last x * 10] (ours; paper ~/15, *2.5: an early run needs more)
C_MID_SPAN = 10.0
B_GRID = np.geomspace(0.1, 10.0, 61)  # (ours) B is gridded too, see fit_sigmoid
MIN_POINTS = 4          # three fitted parameters need at least four points
LEVEL = 0.95            # the confidence of the printed intervals and bands
# the regime gate (fit_curve.regime; docs/fitting.md says where each comes from)
TRUNCATION_LIMIT = 0.15  # share of completions cut by the cap (paper: 10-15% warns of instability)
TRUNCATION_FALL = 0.10   # the truncation's fall from the window's first third to its last
LENGTH_CHANGE = 0.20     # relative change of the completion length over the window
DOMAIN_FLAT = 1.5        # a domain's gain over its R0 below this many sampling errors: not moved
DOMAIN_MOVED = 3.0       # ... above this many: moved

# max_x: the last fitted x
SigmoidFit = namedtuple("SigmoidFit", "R0 A B C_mid rmse r2 n_points min_x max_x fit_until")
PowerLawFit = namedtuple("PowerLawFit", "A B D rmse")
# A's coarse profile: per A on the grid the best (B, C_mid) and squared error; which are polished
Profile = namedtuple("Profile", "A sse B C_mid refined log_c_range")
# A: (lo, hi), an end None where the points do not bound it; A_set: the set's ends on A's grid;
# curves: (A, B, C_mid) rows; sigma: a point's noise; dispersion: residual over sampling variance
Confidence = namedtuple("Confidence", "A A_set curves R0 sigma dispersion level")

# -----------------------------------------------------------------------------
# reading a log

def read_records(path):
    """-> [(line number, record)] of a headed .csv or train.py's JSONL log (log.py reads it with
    this too); a live run's half-written last line is left for the next read."""
    # bad input raises ValueError, one line naming the line and the field
    try:
        with open(path, newline="") as f:
            lines = f.readlines()
    except OSError as e:
        raise ValueError(f"cannot read the file ({e.strerror})") from None
    if path.endswith(".csv"):
        reader = csv.DictReader(lines)
        # a cell: a str, or None if missing; a long row's extras sit under None
        return [(reader.line_num, {k: v for k, v in record.items() if k is not None and v})
                for record in reader]
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line) if line.strip() else {}  # a blank line holds nothing
        except json.JSONDecodeError as e:
            if number == len(lines) and not line.endswith("\n"):
                break  # a live run's line still being written: the next read will have it
            raise ValueError(f"line {number} is not JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"line {number} is not a JSON object")
        rows.append((number, record))
    return rows


def number(record, col, line):
    """record[col] as a finite float, or a ValueError naming the line."""
    # float() of a list or a word: not a number either
    with suppress(TypeError, ValueError):
        if not isinstance(record[col], bool) and math.isfinite(float(record[col])):
            return float(record[col])
    raise ValueError(f"line {line}: {col} is {record[col]!r}, not a finite number")


def points(rows, x_col="gpu_hours", y_col="val_reward", se_col=None):
    """-> (x, y, se) arrays of the rows with both columns; se NaN where the row lacks se_col."""
    columns = set().union(*(record for _, record in rows))
    if missing := [col for col in (x_col, y_col) if col not in columns]:
        raise ValueError(f"no column {missing[0]!r}; the columns are: "
                         f"{', '.join(sorted(columns)) or 'none'}")
    found = []  # (line number, x, y, se)
    for line, record in rows:
        if record.get(x_col) is None or record.get(y_col) is None:
            continue  # a training step without evaluation, or the config line
        x, y = number(record, x_col, line), number(record, y_col, line)
        se = number(record, se_col, line) if record.get(se_col) is not None else math.nan
        if found and x <= found[-1][1]:
            raise ValueError(f"line {line}: {x_col} {x:g} is not above {found[-1][1]:g} "
                             f"on line {found[-1][0]}; compute must increase")
        found.append((line, x, y, se))
    return tuple(np.array([p[k] for p in found]) for k in (1, 2, 3))


def read_curve(path, x_col="gpu_hours", y_col="val_reward"):
    """-> (x, y) arrays of the rows with both columns, of a headed .csv or train.py's JSONL log."""
    return points(read_records(path), x_col, y_col)[:2]

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


def A_limits(y):
    """The widest range A may take: (0, 1) for a pass rate, else y's range widened by its width."""
    span = y.max() - y.min()
    return (0.0, 1.0) if 0 <= y.min() <= y.max() <= 1 else (y.min() - span, y.max() + span)


def grid_of_A(y, yw, R0):
    """The values A may take, for a curve y and its fit window's part yw."""
    # on A_STEP's grid, within (0, 1) for a pass rate (else y's range widened by its width), and not
    # below what a rising curve's window reached, within noise: the mean of its last tenth, less 3
    # standard errors (the noise sd from successive differences). A falling curve (ours: a
    # collapsing run, or a loss) is allowed, mirrored: A at most what it reached
    lo, hi = A_limits(y)
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
    profile = scan(xw, yw, R0, a_grid)
    # Refine (B, C_mid) continuously. A's profile is flat when B is small and the coarse cells can
    # misplace its minimum by a few steps, so walk along the A grid from the best cell while a
    # refined neighbour does better.
    i = int(profile.sse.argmin())
    while unrefined := [j for j in (i - 1, i, i + 1)
                        if 0 <= j < len(a_grid) and not profile.refined[j]]:
        for j in unrefined:
            refine(xw, yw, R0, profile, j)
        i = min(np.flatnonzero(profile.refined), key=lambda j: profile.sse[j])
    sse, A, B, C_mid = profile.sse[i], *(float(v[i]) for v in (a_grid, profile.B, profile.C_mid))
    sst = float(((yw - yw.mean()) ** 2).sum())
    return SigmoidFit(R0, A, B, C_mid, rmse=math.sqrt(sse / n),
                      r2=1 - sse / sst if sst > 0 else math.nan, n_points=n, min_x=min_x,
                      max_x=float(xw[-1]), fit_until=fit_until)


def scan(xw, yw, R0, a_grid):
    """A's profile on the coarse grid: for each A, the best (B, C_mid) of the grid -> Profile."""
    # Paper (appendix): curve_fit B in every cell of an (A, C_mid) grid, keep the least squares; its
    # table has off-grid C_mid, so C_mid is refined continuously. Ours, for speed (its 14k
    # curve_fits take seconds, this ~10 ms): B is gridded too, then curve_fit polishes (B, C_mid)
    # at fixed A. For fixed (B, C_mid) the law is linear in the gain A - R0, so SSE =
    # |d|^2 - 2 gain (f.d) + gain^2 (f.f), f the sigmoid's shape: one matrix product per B.
    gain = a_grid - R0  # (nA,)
    log_x, d = np.log(xw), yw - R0  # (n,)
    log_c = np.linspace(np.log(xw[0] / C_MID_SPAN), np.log(xw[-1] * C_MID_SPAN), N_C_MID)  # (nC,)
    best_sse, (best_b, best_log_c) = np.full(len(gain), np.inf), np.zeros((2, len(gain)))
    for B in B_GRID:
        shape = expit(B * (log_x[None, :] - log_c[:, None]))  # (nC, n)
        sse = d @ d - 2 * np.outer(gain, shape @ d) + np.outer(gain ** 2, (shape * shape).sum(1))
        j, s = sse.argmin(1), sse.min(1)  # sse: (nA, nC); per A the best C_mid and its SSE
        better = s < best_sse
        best_sse[better], best_b[better], best_log_c[better] = s[better], B, log_c[j[better]]
    return Profile(a_grid, np.maximum(best_sse, 0.0), best_b, np.exp(best_log_c),
                   np.zeros(len(a_grid), bool), (log_c[0], log_c[-1]))


def refine(xw, yw, R0, profile, j):
    """Polish the profile's (B, C_mid) at its j-th A with curve_fit (C_mid as its log: any unit)."""
    curve = lambda x_, B, log_c_mid: sigmoid(x_, R0, profile.A[j], B, math.exp(log_c_mid))
    start = (profile.B[j], math.log(profile.C_mid[j]))
    bounds = ([B_GRID[0] / 2, profile.log_c_range[0]], [B_GRID[-1] * 2, profile.log_c_range[1]])
    with suppress(RuntimeError, ValueError), warnings.catch_warnings():
        # A == R0 leaves B and C_mid undetermined: no covariance
        warnings.simplefilter("ignore", OptimizeWarning)
        params, _ = curve_fit(curve, xw, yw, p0=start, bounds=bounds)
        sse = float(((yw - curve(xw, *params)) ** 2).sum())
        if sse < profile.sse[j]:  # curve_fit may wander off; the grid's cell is kept then
            profile.sse[j], profile.B[j], profile.C_mid[j] = sse, params[0], math.exp(params[1])
    profile.refined[j] = True


def confidence(x, y, fit, se=None, level=LEVEL):
    """The curves the window's points allow at `level` (a profile-likelihood set over A) ->
    Confidence: A's interval (an end None where the points do not bound it) and the curves."""
    # ours, chosen by benchmarks/fit_calibration.py (docs/fitting.md): the A whose best (B, C_mid)
    # leave a squared error within SSE_min + q sigma^2. sigma is the points' sampling error when
    # the log has it (val_sampling_se) and they scatter no more than it says (q: chi^2, 1 dof);
    # otherwise the residuals' own variance, the dispersion scaled up as in quasi-likelihood
    # (q: the F quantile, n - 3 dof)
    xw, yw = in_window(x, y, fit.min_x, fit.fit_until)
    n, sse_min = len(yw), fit.rmse ** 2 * len(yw)
    residual_var = sse_min / max(n - 3, 1)
    logged = np.asarray(se, float)[fit_window(x, fit.min_x, fit.fit_until)[0]] if se is not None \
        else np.array([math.nan])
    sampling_var = float(np.mean(logged ** 2)) if np.isfinite(logged).all() else 0.0
    dispersion = residual_var / sampling_var if sampling_var > 0 else math.inf
    if dispersion <= 1:
        var, q = sampling_var, chi2.ppf(level, 1)
    else:
        var, q = residual_var, f_dist.ppf(level, 1, max(n - 3, 1))
    a_grid = grid_of_A(y, yw, fit.R0)
    profile = scan(xw, yw, fit.R0, a_grid)
    bound = sse_min + q * var
    for j in np.flatnonzero(profile.sse <= bound + 3 * q * var):  # the grid's cells lie above
        refine(xw, yw, fit.R0, profile, j)
    inside = profile.sse <= bound * (1 + 1e-9)
    inside[int(np.abs(a_grid - fit.A).argmin())] = True  # the best fit, whatever the grid says
    kept = np.flatnonzero(inside)
    limits = A_limits(y)
    lo, hi = a_grid[kept[0]], a_grid[kept[-1]]
    curves = np.stack([a_grid[kept], profile.B[kept], profile.C_mid[kept]], 1)  # (k, 3)
    return Confidence(A=(None if lo <= limits[0] + 1e-9 else float(lo),
                         None if hi >= limits[1] - 1e-9 else float(hi)),
                      A_set=(float(lo), float(hi)), curves=curves, R0=fit.R0,
                      sigma=math.sqrt(var), dispersion=dispersion, level=level)


def prediction_band(conf, x):
    """The band a later point at x should lie in -> (lo, hi): the set's curves, widened by a
    point's own noise (sigma, two-sided at the set's level)."""
    x = np.atleast_1d(np.asarray(x, float))
    curves = np.array([sigmoid(x, conf.R0, *c) for c in conf.curves])  # (k, len(x))
    noise = norm.ppf(0.5 + conf.level / 2) * conf.sigma
    return curves.min(0) - noise, curves.max(0) + noise


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


def profile_A(x, y, fit, level=LEVEL):
    """A's profile interval from the residuals alone (F test) -> (lo, hi); hi None where the data
    do not bound A above; lo at worst what y reached."""
    conf = confidence(x, y, fit, level=level)
    return conf.A_set[0], conf.A[1]


def regime(rows, x_col, fit, suffix=""):
    """What the log says about the run's regime over a fit's window -> {figures..., "unsettled":
    the reasons, in words, that the window is not yet a prediction (empty: none found)}."""
    # ours; benchmarks/fit_calibration.py's regime-change runs and docs/fitting.md say why these
    window = [r for _, r in rows if isinstance(r.get(x_col), (int, float))
              and fit.min_x <= r[x_col] <= fit.max_x]

    def ends(key):  # (mean over the window's first third, over its last third) of a column
        values = [float(r[key]) for r in window if isinstance(r.get(key), (int, float))]
        cut = len(values) // 3 or 1
        return (np.mean(values[:cut]), np.mean(values[-cut:])) if len(values) > 1 else None

    # the validation's own figures where the log has them: the same prompts at every point
    truncated = ends(f"val_truncation_rate{suffix}")
    tokens = ends(f"val_completion_tokens{suffix}")
    if not suffix:  # else the training steps' (overall only)
        truncated = truncated or ends("truncation_rate")
        tokens = tokens or ends("completion_tokens")
    change = tokens and float(tokens[1] / max(tokens[0], 1e-9) - 1)
    result = dict(truncation=truncated and float(truncated[1]), tokens_change=change,
                  unsettled=[])
    reasons = result["unsettled"]
    if truncated and truncated[1] > TRUNCATION_LIMIT:
        reasons.append(f"{truncated[1]:.0%} of completions cut by the length cap at the window's "
                       f"end (the paper: over 10-15% is a run that will not scale cleanly)")
    if truncated and truncated[0] - truncated[1] > TRUNCATION_FALL:
        reasons.append(f"truncation still falling ({truncated[0]:.0%} -> {truncated[1]:.0%})")
    if change and abs(change) > LENGTH_CHANGE:
        reasons.append(f"completion length still moving ({change:+.0%} over the window)")
    moved = {d: gain(rows, x_col, fit, f"_{d}") for d in domains_of(rows)} if not suffix else {}
    flat = [d for d, z in moved.items() if z is not None and z < DOMAIN_FLAT]
    rising = [d for d, z in moved.items() if z is not None and z > DOMAIN_MOVED]
    if flat and rising:
        reasons.append(f"{', '.join(flat)} has not moved from its R0 while {', '.join(rising)} "
                       f"has: the overall curve mixes regimes; read each domain's fit")
    # not a rule: points that scatter more than their sampling error says (conf.dispersion) widen
    # the interval instead; a policy noisier than its samples is no regime change (docs/fitting.md)
    return result


def gain(rows, x_col, fit, suffix):
    """A domain's gain over its R0 by the window's last third, in sampling errors (None: no
    sampling error logged)."""
    x, y, se = points(rows, x_col, f"val_reward{suffix}", f"val_sampling_se{suffix}")
    last = np.flatnonzero((x >= fit.min_x) & (x <= fit.max_x))
    last = last[-max(1, len(last) // 3):]
    if not np.isfinite(se[[0, *last]]).all():
        return None
    spread = math.sqrt(se[0] ** 2 + float(np.mean(se[last] ** 2)) / len(last))
    return float((y[last].mean() - y[0]) / max(spread, 1e-9))


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
    """runs: dicts of name, x, y, fit (, conf: the band). Fitted points filled, the rest
    (transient, held out) hollow."""
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
        # the prediction band beyond the window: the curves the points allow, and a point's noise
        if "conf" in run:
            beyond = grid[grid >= fit.max_x]
            ax.fill_between(beyond, *prediction_band(run["conf"], beyond), color=colour, alpha=0.15)
    ax.set(xscale="log", xlabel=f"compute ({x_col}, log scale)", ylabel=y_col,
           title="ScaleRL sigmoid fit: R = R0 + (A - R0) / (1 + (C_mid / C)^B)")
    ax.legend(fontsize=8)
    ax.figure.tight_layout()
    ax.figure.savefig(path, dpi=120)
    return ax


def domains_of(rows):
    """The domains whose curves a log holds (val_reward_<domain>), sorted."""
    keys = set().union(*(record for _, record in rows))
    return sorted(k.removeprefix("val_reward_") for k in keys
                  if k.startswith("val_reward_") and not k.endswith("_se"))


def analyse(rows, name, y_col, args, predict_at):
    """One curve of one log: the fit, its calibrated interval and band, the regime gate, the checks
    -> (the run's dict for the table, --json and the plot, its notes)."""
    suffix = y_col.removeprefix("val_reward")
    x, y, se = points(rows, args.x, y_col, f"val_sampling_se{suffix}")
    fit = fit_sigmoid(x, y, r0=args.r0, min_x=args.min_x, fit_until=args.fit_until)
    conf = confidence(x, y, fit, se)
    result = dict(run=name, **fit._asdict(), x_col=args.x, y_col=y_col, A_profile=list(conf.A),
                  sigma=conf.sigma, dispersion=conf.dispersion,
                  **regime(rows, args.x, fit, suffix), C_mid_beyond_fit=fit.C_mid > fit.max_x)
    intervals = bootstrap(x, y, fit, args.bootstrap, args.seed) if args.bootstrap > 0 else {}
    intervals.pop("fits", None)
    result.update({k + "_ci": [float(v) for v in ci] for k, ci in intervals.items()})
    notes = []
    later = x > args.fit_until if args.fit_until is not None else np.zeros(len(x), bool)
    if result["C_mid_beyond_fit"]:
        notes.append(f"{name}: C_mid lies beyond the last fitted point: the run has not "
                     f"reached half its gain yet, so A is a long extrapolation")
    if args.fit_until is not None:
        xl, yl = x[later], y[later]
        errors = np.abs(yl - sigmoid(xl, *fit[:4]))
        mae, max_err = (float(errors.mean()), float(errors.max())) if len(xl) else (None, None)
        result.update(extrapolation_n=len(errors), extrapolation_mae=mae,
                      extrapolation_max_err=max_err)
        past = f"past {args.x} {fmt_compute(args.fit_until)}"
        notes.append(f"{name}: predicted {past}: mean |error| {mae:.4f}, max {max_err:.4f} "
                     f"over {len(errors)} points" if len(xl) else
                     f"{name}: no points {past} to check the prediction on")
        if len(xl):  # the band a point should lie in: the set's curves, and its noise
            lo, hi = prediction_band(conf, xl)
            inside = float(np.mean((lo <= yl) & (yl <= hi)))
            result["extrapolation_in_band"] = inside
            # |z|: the error over each point's logged sampling error
            z = float((errors / se[later]).mean()) if np.isfinite(se[later]).all() else None
            result["extrapolation_mean_abs_z"] = z
            notes.append(f"{name}: {inside:.0%} of them inside the {LEVEL:.0%} prediction band" +
                         (f"; mean |error| / sampling error {z:.2f}" if z is not None else ""))
    if len(predict_at):
        result["predicted"] = forecast(predict_at, sigmoid(predict_at, *fit[:4]),
                                       prediction_band(conf, predict_at))
        notes += [f"{name}: predicted at {args.x} {said}" for said in in_words(result["predicted"])]
    if args.powerlaw:
        power = fit_power_law(x, y, fit.min_x, fit.fit_until)
        result["powerlaw"] = power._asdict()
        notes.append(f"{name}: power law R = A - D/C^B on the same window: A {power.A:.3f} "
                     f"(sigmoid {fit.A:.3f}), B {power.B:.3f}, RMSE {power.rmse:.4f} (paper: "
                     f"the power law over-predicts A, prefer the sigmoid)")
    return dict(name=name, x=x, y=y, later=later, fit=fit, conf=conf, result=result), notes


def domains_mean(runs, args, predict_at):
    """Where validation weighs the domains equally, the overall curve is their mean, and each domain
    follows the law where their mixture need not: A, the band and the prediction as the mean of the
    domains' -> notes (the figures go into the overall run's result)."""
    whole, parts = runs[0], runs[1:]
    columns = [p["y"] for p in parts]  # each domain's points
    if len({len(c) for c in columns} | {len(whole["y"])}) > 1 or \
            np.abs(np.mean(columns, 0) - whole["y"]).max() > 1e-6:
        return []  # weighed by their prompts' counts: the mean of the domains is not the curve
    mean = lambda values: None if None in values else float(np.mean(values))
    ends = [mean([p["conf"].A[k] for p in parts]) for k in (0, 1)]
    reached = mean([p["conf"].A_set[0] for p in parts])
    curve = lambda at: np.mean([sigmoid(at, *p["fit"][:4]) for p in parts], 0)
    band_of = lambda at: np.mean([prediction_band(p["conf"], at) for p in parts], 0)  # (2, len)
    result, name = whole["result"], whole["name"]
    # printed first on the overall row: benchmarks/fit_calibration.py's two-domain runs
    result["A_domains_mean"] = ends
    whole["domains_words"] = "A of the domains' mean " + interval_words(
        *ends, reached, "(each domain's interval, averaged: validation weighs them equally)")
    notes = []
    if whole["later"].any():
        xl, yl = whole["x"][whole["later"]], whole["y"][whole["later"]]
        lo, hi = band_of(xl)
        result.update(domains_mean_mae=float(np.abs(yl - curve(xl)).mean()),
                      domains_mean_in_band=float(np.mean((lo <= yl) & (yl <= hi))))
        notes.append(f"{name}: the mean of the domains' predictions past {args.x} "
                     f"{fmt_compute(args.fit_until)}: mean |error| "
                     f"{result['domains_mean_mae']:.4f} "
                     f"(the overall curve's own: {result['extrapolation_mae']:.4f}), "
                     f"{result['domains_mean_in_band']:.0%} inside their band")
    if len(predict_at):
        result["domains_mean_predicted"] = forecast(predict_at, curve(predict_at),
                                                    band_of(predict_at))
        notes += [f"{name}: the mean of the domains' predictions at {args.x} {said}"
                  for said in in_words(result["domains_mean_predicted"])]
    return notes


def forecast(at, values, band):
    """A prediction at compute `at` with its band (lo, hi) -> [{x, R, lo, hi}]."""
    return [dict(x=float(v), R=float(r), lo=float(a), hi=float(b))
            for v, r, a, b in zip(at, values, *band)]


def in_words(predicted):
    return [f"{fmt_compute(p['x'])}: {p['R']:.3f} ({LEVEL:.0%} band [{p['lo']:.3f}, {p['hi']:.3f}])"
            for p in predicted]


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Fit the ScaleRL sigmoid R(C) = R0 + (A - R0) / (1 + (C_mid/C)^B) to logs.")
    option = parser.add_argument
    option("logs", nargs="+", metavar="LOG",
           help="train.py's log.jsonl, or a .csv with a header row")
    option("--x", default="gpu_hours", help="compute column: gpu_hours (default), flops, step, ...")
    option("--y", default="val_reward", help="reward column; with the default, each domain's "
           "curve (val_reward_<domain>) is fitted too")
    option("--min_x", type=float, help="drop points below this compute; default: skip the first "
           f"{MIN_X_FRACTION * 100:.0f}%% of the fitted compute range, the early transient "
           "(paper: ~1.5k of 16k GPU-h)")
    option("--fit_until", type=float,
           help="fit x <= this only, and check the prediction of the rest")
    option("--r0", type=float,
           help="reward at zero compute (default: the first logged point, step 0)")
    option("--bootstrap", type=int, default=100, metavar="N",
           help="resamples for the residual bootstrap's intervals of A, B, C_mid (0: none); the "
           "older method, which covers less than it says (docs/fitting.md)")
    option("--seed", type=int, default=0, help="bootstrap seed")
    option("--powerlaw", action="store_true", help="also fit R = A - D/C^B on the same window")
    option("--plot", metavar="FILE.png", help="write a plot (needs matplotlib)")
    option("--predict", metavar="X,X,...",
           help="the fitted curve and its 95%% band (the curves the points allow, a point's "
           "noise) at these x")
    option("--json", action="store_true",
           help="print a JSON list, one object per curve of each run, instead of the table")
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
    # runs: every curve of every log; main_runs: each log's --y curve; notes: below the table
    runs, main_runs, notes = [], [], []
    for path in args.logs:
        try:
            rows = read_records(path)
            domains = domains_of(rows) if args.y == "val_reward" else []
            curves = [analyse(rows, path, args.y, args, predict_at)]
            curves += [analyse(rows, f"{path} [{d}]", f"val_reward_{d}", args, predict_at)
                       for d in domains]
        except ValueError as e:
            parser.exit(2, f"fit_curve.py: error: {path}: {e}\n")
        for run, run_notes in curves:
            runs.append(run)
            notes += run_notes
        if len(curves) > 2:
            notes += domains_mean([run for run, _ in curves], args, predict_at)
        main_runs.append(curves[0][0])
    if len(main_runs) > 1:
        ranking = rank_runs(args.logs, [(r["x"], r["y"]) for r in main_runs],
                            [r["fit"] for r in main_runs])
        notes.append(f"ranking (paper's rule: A is known to +-{A_MARGIN}; runs closer than that "
                     f"are refitted with their average A and ranked by B, the steeper curve "
                     f"reaching it with less compute):")
        for place, entry in enumerate(ranking, 1):
            main_runs[entry["index"]]["result"].update(rank=place, common_A=entry["common_A"],
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
        fit, result, conf = run["fit"], run["result"], run["conf"]
        window = f"{fmt_compute(fit.min_x)}..{fmt_compute(fit.max_x)}"
        print(f"{run['name']:<{width}}  {fit.R0:6.3f}  {fit.A:6.3f}  {fit.B:6.3f}  "
              f"{fmt_compute(fit.C_mid):>10}  {window:>24}  {fit.n_points:4d}  {fit.rmse:7.4f}  "
              f"{fit.r2:6.3f}")
        if "domains_words" in run:
            print(pad + run["domains_words"])
        print(pad + describe_A(conf))
        if result["unsettled"]:  # the regime gate: what the log says against the law's form
            print(f"{pad}NOT YET A PREDICTION: " + "; ".join(result["unsettled"]))
        if "A_ci" in result:
            (a_lo, a_hi), (b_lo, b_hi), (c_lo, c_hi) = map(result.get, ("A_ci", "B_ci", "C_mid_ci"))
            print(f"{pad}residual bootstrap's 95% interval: A [{a_lo:.3f}, {a_hi:.3f}]  "
                  f"B [{b_lo:.3f}, {b_hi:.3f}]  C_mid [{fmt_compute(c_lo)}, {fmt_compute(c_hi)}]  "
                  f"({args.bootstrap} resamples; covers less than it says, docs/fitting.md)")
    for note in notes:
        print(note)


def describe_A(conf):
    """A's calibrated interval in words: an end the points do not bound is said, not printed."""
    noise = f"{conf.sigma:.3f}, " + ("the logged sampling error" if conf.dispersion <= 1 else
                                     "from the residuals")
    return "A profile interval " + interval_words(
        *conf.A, conf.A_set[0], f"({LEVEL:.0%} profile likelihood; noise {noise})")


def interval_words(lo, hi, reached, why):
    """[lo, hi] why, or its open end in words (lo: at worst what the curve reached)."""
    if hi is None:
        lo = reached if lo is None else lo
        return f"[{lo:.3f}, ...]: A at least {lo:.3f}, not bounded above by these points {why}"
    if lo is None:  # a falling curve's A
        return f"[..., {hi:.3f}]: A at most {hi:.3f}, not bounded below by these points {why}"
    return f"[{lo:.3f}, {hi:.3f}] {why}"


if __name__ == "__main__":
    main()
