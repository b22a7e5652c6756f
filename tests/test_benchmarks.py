"""benchmarks/: gpu_device.sh on CPU stand-ins, the leave-one-out study.

Run alone: `python -m pytest tests/test_benchmarks.py`."""

import json
import math
import os
import subprocess
import sys

import pytest

# tests.helpers first: importing it sets torch to one thread (it says why)
from tests.helpers import REPO, load_script
# the fixtures its tests take (pytest finds them by name in this module)
from tests.helpers import tiny_model_dir  # noqa: F401


# =============================================================================
# benchmarks/


@pytest.mark.slow
def test_the_gpu_device_script_runs_every_step_on_cpu_stand_ins(tiny_model_dir, tmp_path):
    """benchmarks/gpu_device.sh, the first thing to run on a GPU machine, end to end with --device=cpu: the weight group on
    gloo, gpu_single.py at toy sizes, train.py's one-process loop; every figure in $OUT/summary.json."""
    result = subprocess.run(["bash", "benchmarks/gpu_device.sh", "--device=cpu"], cwd=REPO, capture_output=True,
                            text=True, timeout=900, env={**os.environ, "OUT": str(tmp_path)})
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:])
    summary = json.load(open(tmp_path / "summary.json"))
    assert [line.split(":")[0] for line in summary["steps"]] == ["env", "weight_group", "gpu_single", "train",
                                                                  "train_lora"]
    assert summary["weight_group"]["received"] == ["a", "b", "c"] and summary["weight_group"]["buckets"] == 2
    for path in ("fsdp2", "single"):  # FSDP2 at world size 1 (foreach AdamW on DTensors) and one process
        figures = summary["gpu_single"][path]
        assert figures["push_exact"] and figures["changed"] >= 0.99, figures
        assert figures["logprob_gap_max"] < 1e-2  # bf16 trainer against the bf16 sampler, lag 0
    lora = summary["gpu_single"]["lora"]  # B moves, A not yet (B was zero): about half of the adapters' weights
    assert lora["push_exact"] and 0.3 < lora["changed"] < 0.8 and lora["trained_params"] < 0.1 * summary["gpu_single"]["params"]
    assert lora["logprob_gap_max"] < 1e-2
    for run in ("train", "train_lora"):
        assert [r["step"] for r in summary[run]] == [0, 1, 2, 3, 4] and "val_reward" in summary[run][-1]
        assert os.path.isdir(tmp_path / run / "ckpt")
    assert os.path.isfile(tmp_path / "train_lora" / "ckpt" / "adapter_model.safetensors")


@pytest.mark.slow
def test_the_leave_one_out_study_runs_end_to_end_in_quick_mode(tiny_model_dir):
    # one run at a time: the suite runs two tests at once on two cores
    result = subprocess.run([sys.executable, "benchmarks/loo_study.py", "--quick", "--workers=1"], cwd=REPO,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    table = result.stdout.split("| config |", 1)[1].splitlines()
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in table[2:4]]
    assert [row[0] for row in rows] == ["recipe", "loo_dapo"] and all(len(row) == 14 for row in rows)
    assert rows[0][7] == "-"  # the verdict column: the recipe is what the arms are compared with
    verdicts = ("A higher", "A lower", "indistinguishable", "steeper", "shallower", "n/a")
    assert any(word in rows[1][7] for word in verdicts)
    assert "n/a (1 seed)" in rows[1][3]  # A's per-seed interval needs two seeds
    assert any(line.startswith("- Compute cut: ") and "CUT = " in line for line in table)
    docs = os.path.dirname(result.stdout.strip().splitlines()[-1].split()[1])
    assert os.path.isfile(os.path.join(docs, "recipe.csv"))
    assert os.path.isfile(os.path.join(docs, "logs", "loo_dapo-seed0.jsonl"))
    with open(os.path.join(docs, "summary.json")) as f:
        summary = json.load(f)
    assert summary["seeds"] == [0] and 0 < summary["cut_flops"] and summary["power"]["sd_B"] is None
    arm = summary["arms"]["loo_dapo"]
    assert arm["verdict"] == rows[1][7] and arm["runs"][0]["steps"] == 12 and arm["runs"][0]["resumed_from"] == []
    assert {"A", "B", "C_mid", "R0", "A_interval", "first_share", "comparison", "extrapolation"} <= set(arm)


def test_the_loo_study_t_intervals_match_hand_computed_quantiles():
    loo = load_script("benchmarks/loo_study.py", "loo_study")
    # arm [4, 5, 6] against the recipe's [1, 2, 3]: difference 3, variances 1 and 1, SE = sqrt(1/3 + 1/3) = 0.8165,
    # Welch's df = (2/3)^2 / ((1/3)^2 / 2 + (1/3)^2 / 2) = 4, t(0.975, 4) = 2.7764: 3 -+ 2.2669
    estimate, lo, hi = loo.t_interval([4, 5, 6], [1, 2, 3])
    assert estimate == pytest.approx(3) and (lo, hi) == pytest.approx((0.7331, 5.2669), abs=1e-4)
    # one sample [1, 2, 3]: mean 2, SE sqrt(1/3) = 0.5774, df 2, t(0.975, 2) = 4.3027: 2 -+ 2.4841
    assert loo.t_interval([1, 2, 3]) == pytest.approx((2, -0.4841, 4.4841), abs=1e-4)
    assert loo.t_interval([0.9], [0.8]) == (pytest.approx(0.1), None, None)  # one seed: no interval, no crash
    assert loo.t_interval([0.9, 0.9], [0.8, 0.8]) == pytest.approx((0.1, 0.1, 0.1))  # no spread: the point


def test_the_loo_study_power_and_pooled_sd_match_hand_computed_values():
    loo = load_script("benchmarks/loo_study.py", "loo_study")
    # SD 0.5, 8 seeds an arm: SE = 0.5 sqrt(2/8) = 0.25; detectable at 80% power: (1.96 + 0.84) x 0.25 = 0.70;
    # the power to detect 0.25: Phi(0.25 / 0.25 - 1.96) = Phi(-0.96) = 0.1685
    assert loo.power(0.5, 8) == pytest.approx((0.70, 0.1685), abs=1e-4)
    # variances 1 ([1, 2, 3]) and 4 ([2, 4, 6]), 2 degrees of freedom each: sqrt((2 x 1 + 2 x 4) / 4) = 1.5811
    assert loo.pooled_sd([[1, 2, 3], [2, 4, 6]]) == pytest.approx(1.5811, abs=1e-4)
    # the second counted half (the recipe, refitted once per arm): sqrt((2 x 1 + 1 x 4) / (2 + 1)) = sqrt(2)
    assert loo.pooled_sd([[1, 2, 3], [2, 4, 6]], [1, 0.5]) == pytest.approx(math.sqrt(2))
    assert loo.pooled_sd([[0.9], [0.8]]) is None  # one seed an arm: no spread to measure


def test_the_loo_study_recounts_tokens_and_flops_of_logs_from_before_the_counter_fix():
    loo = load_script("benchmarks/loo_study.py", "loo_study")
    # N = 10 parameters, 10 trained tokens a step (60 FLOPs each side: 6N x 10 = 600). The steps generated 100, 50,
    # then 30 (decoded during step 2's validation) + 20, then a resume, 40 and 5 tokens. The old counter carried its
    # count on until a validation (after step 2) or a new process (step 4): it logged 100, 250, 300, 340, 385.
    rows = [dict(step=0, tokens=0, flops=0, time=0, val_reward=0.2)]
    for step, logged, generated, time in [(1, 100, 100, 1), (2, 250, 150, 2), (3, 300, 50, 3), (4, 340, 40, 1),
                                          (5, 385, 45, 2)]:
        rows.append(dict(step=step, tokens=logged, flops=rows[-1]["flops"] + 2 * 10 * generated + 600, time=time))
    rows[2]["val_reward"] = 0.3
    lines = loo.recount([dict(config={}, n_params=10)] + rows)
    assert [r["tokens"] for r in lines[1:]] == [0, 100, 150, 200, 240, 245]
    assert [r["flops"] for r in lines[1:]] == [0, 2600, 4200, 5800, 7200, 7900]  # 2N x tokens + 600 a step
    assert [r["tokens_as_logged"] for r in lines[1:]] == [0, 100, 250, 300, 340, 385]
    assert loo.recount(lines) == lines  # once only


def test_fit_calibration_runs_of_a_known_truth_and_the_gate_on_the_regime_changes():
    """benchmarks/fit_calibration.py draws its runs as train.py logs them: a clean run's true A inside the printed
    interval and the gate silent; a run held down by a length cap trips the gate; two domains print their mean's
    interval first, beside the overall curve's own."""
    calibration = load_script("benchmarks/fit_calibration.py", "fit_calibration")
    rows, true_A = calibration.simulate("clean", 12, 2048, seed=3)
    validations = [r for r in rows if "val_reward" in r]
    assert len(validations) == 13 and 0.30 <= true_A <= 0.95 and rows[-1]["flops"] == 1.0
    assert all(abs(r["val_sampling_se"] - math.sqrt(r["val_reward"] * (1 - r["val_reward"]) / 2048)) < 1e-9
               for r in validations if 0 < r["val_reward"] < 1)
    results, fired = calibration.score("clean", 12, 2048, 3, False)
    covered, _, _, band, error, z = results["printed"]
    assert covered and not fired and band >= 0.5 and error < 0.1 and z > 0
    results, fired = calibration.score("length_cap", 12, 512, 3, False)
    assert fired
    results, _ = calibration.score("two_domains", 12, 512, 3, False)
    assert set(results) == {"printed", "own curve"}
