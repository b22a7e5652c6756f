"""log.py: the paper's warnings and validation's figures (the log's rows, the live fit and the compute axis
are tested by whole runs: test_all.py's train.py section, and tests/test_checkpoint.py's resumes).

Run alone: `python -m pytest tests/test_log.py`."""

import math
import time

import pytest

# tests.helpers first: importing it sets torch to one thread (it says why)
import tests.helpers  # noqa: F401
import log
from data import Prompt
from scheduler import Completion, Group


def test_the_papers_warnings_are_said_once_each_with_what_to_do(capsys):
    warned = dict(limit=0.15)  # warn_truncation
    rows = [dict(step=0, gpu_hours=0.0, logprob_mismatch_lag0=0.01), dict(step=1, gpu_hours=0.1, truncation_rate=0.1),
            dict(step=2, gpu_hours=0.2, truncation_rate=0.2),
            dict(step=3, gpu_hours=0.3, truncation_rate=0.3, logprob_mismatch_lag0=0.04),  # under 5x the first
            dict(step=4, gpu_hours=0.4, logprob_mismatch_lag0=0.06, fit_C_mid=0.9),
            dict(step=5, gpu_hours=0.5, logprob_mismatch_lag0=0.07, fit_C_mid=0.3, truncation_rate=0.5)]
    for row in rows:
        log.warnings(warned, row)
    assert [r["step"] for r in rows if "warning" in r] == [2, 4]
    assert rows[2]["warning"].startswith("truncation rate 20% > warn_truncation=0.15: the paper saw instability")
    assert "mismatch at lag 0 0.06, over 5x its first 0.01" in rows[4]["warning"]
    assert "C_mid 0.9 lies beyond the data (0.4 gpu_hours)" in rows[4]["warning"]
    assert capsys.readouterr().out.count("warning: ") == 3


def test_validation_logs_truncation_lengths_and_sampling_error_per_domain():
    def group(rewards, lengths, truncated):  # a scored held-out group: one completion per reward
        completions = [Completion(token_ids=[7] * n, finish_reason="truncated" if cut else "eos")
                       for n, cut in zip(lengths, truncated)]
        return Group(None, [1], completions, rewards=rewards)

    prompts = [Prompt("m0", "", [1], "0", domain="math"), Prompt("m1", "", [1], "0", domain="math"),
               Prompt("c0", "", [1], "0", domain="code")]
    groups = [group([1.0, -1.0], [4, 10], [False, True]),  # math: pass rate 1/2
              group([1.0, 1.0], [2, 6], [False, False]),  # math: pass rate 1
              group([1.0, -1.0], [3, 5], [True, True])]  # code: pass rate 1/2
    row = log.validation(prompts, groups, 2, ["code", "math"], time.time())
    # 3 of the 6 completions cut; 30 tokens in all
    assert row["val_truncation_rate"] == 3 / 6 and row["val_completion_tokens"] == 30 / 6
    assert row["val_truncation_rate_math"] == 1 / 4 and row["val_completion_tokens_math"] == 22 / 4
    assert row["val_truncation_rate_code"] == 2 / 2 and row["val_completion_tokens_code"] == 8 / 2
    # sqrt(sum p (1 - p) / 2) / prompts: p (1 - p) / 2 is 1/8 at p = 1/2 and 0 at p = 1
    assert row["val_sampling_se"] == pytest.approx(math.sqrt(1 / 8 + 0 + 1 / 8) / 3)
    assert row["val_sampling_se_math"] == pytest.approx(math.sqrt(1 / 8 + 0) / 2)
    assert row["val_sampling_se_code"] == pytest.approx(math.sqrt(1 / 8) / 1)
    # the live fits read every val_reward_* key as a domain's curve: no new one
    curves = sorted(k for k in row if k.startswith("val_reward_"))
    assert curves == ["val_reward_code", "val_reward_math", "val_reward_se"]
