"""log.py: the paper's warnings (the log's rows, the live fit and the compute axis are tested by whole runs:
test_all.py's train.py section, and tests/test_checkpoint.py's resumes).

Run alone: `python -m pytest tests/test_log.py`."""

# tests.helpers first: importing it sets torch to one thread (it says why)
import tests.helpers  # noqa: F401
import log


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
