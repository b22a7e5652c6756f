"""configurator.py (through train.configure): every config file, and bad configs.

Run alone: `python -m pytest tests/test_configurator.py`."""

import os

# tests.helpers first: importing it sets torch to one thread (it says why)
from tests.helpers import REPO, config_error
# the fixtures its tests take (pytest finds them by name in this module)
from tests.helpers import train_config  # noqa: F401


# =============================================================================
# configurator.py


def test_every_config_file_parses_and_sets_existing_keys(train_config):
    defaults = {k: getattr(train_config, k) for k in train_config.config_keys}
    files = sorted(f for f in os.listdir(os.path.join(REPO, "config")) if f.endswith(".py"))
    assert len([f for f in files if f.startswith("loo_")]) == 8 and "scalerl_8b.py" in files and "tiny_cpu.py" in files
    for name in files:
        train_config.configure([os.path.join(REPO, "config", name)])  # exits on an unknown key or a wrong type
    # tiny_cpu.py restates the defaults: `python train.py` and `python train.py config/tiny_cpu.py` agree
    namespace = {}
    exec(open(os.path.join(REPO, "config", "tiny_cpu.py")).read(), namespace)
    tiny = {k: v for k, v in namespace.items() if not k.startswith("_")}
    assert len(tiny) >= 20 and tiny == {k: defaults[k] for k in tiny}


def test_bad_configs_fail_before_any_work_with_one_line_errors(train_config, capsys, tmp_path):
    assert "unknown config key 'lr_max'" in config_error(train_config, capsys, "--lr_max=1")
    assert "lr must be float, got 'fast'" in config_error(train_config, capsys, "--lr=fast")
    assert "micro_batch_tokens=-1: must be >= 0" in config_error(train_config, capsys, "--micro_batch_tokens=-1")
    assert "loss_type='ppo': must be one of" in config_error(train_config, capsys, "--loss_type=ppo")
    assert "no such directory" in config_error(train_config, capsys, f"--model_path={tmp_path}/nope")
    assert "no such config file" in config_error(train_config, capsys, "config/nope.py")
    (tmp_path / "log.jsonl").write_text("{}\n")
    assert "holds another run" in config_error(train_config, capsys, f"--out_dir={tmp_path}")
    assert "holds no checkpoint" in config_error(train_config, capsys, f"--out_dir={tmp_path}", "--init_from=resume")
    assert "exact_resume=True needs one process and sampler='torch'" in config_error(
        train_config, capsys, "--exact_resume=True", "--sampler=vllm")
