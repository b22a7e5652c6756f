"""infra/policy.py: bf16 compute on fp32 master weights, and the dtype this machine is fast in.

Run alone: `python -m pytest tests/test_policy.py`."""

import json
import os
import platform
import subprocess
import sys

import pytest
import torch

# tests.helpers first: importing it sets torch to one thread (it says why)
from tests.helpers import (ONE_PROCESS, REPO, config_error, fixed_batch, load_script, read_train_log,
                           run_train, tiny)
# the fixtures its tests take (pytest finds them by name in this module)
from tests.helpers import tiny_model_dir, train_config  # noqa: F401
from infra import distributed
import head
from infra import policy as P
import train


# =============================================================================
# infra/policy.py


def bf16_tiny_policy(model_dir, train_config):
    train_config.configure(["--dtype=bfloat16", "--lr=5e-7", "--warmup_steps=0", "--grad_clip=1e9"])
    return train.make_policy(train.current_config(), model_dir, ONE_PROCESS)


def test_bf16_compute_with_fp32_master_weights_moves_every_weight_at_lr_5e_7(tiny_model_dir, train_config):
    policy = bf16_tiny_policy(tiny_model_dir, train_config)
    compute = policy.logprobs.model
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())  # master weights and AdamW state
    assert all(p.dtype == torch.bfloat16 for p in compute.parameters())      # forward and backward
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    stats = train.train_step(train.current_config(), policy, fixed_batch(len(tiny.build_tokenizer())), 0, 0)
    assert "skipped" not in stats
    changed = sum((p != before[n]).sum().item() for n, p in policy.model.named_parameters())
    assert changed >= 0.99 * sum(p.numel() for p in before.values())  # Adam's first step moves each by ~lr
    # what the samplers receive is the bf16 cast of the master weights: the one-process sampler's module...
    assert all(torch.equal(c, p.to(torch.bfloat16)) for c, p in zip(compute.parameters(), policy.model.parameters()))
    # ... and the buckets pushed to other ranks or to vLLM
    plan = P.weight_plan(policy.model, 1 << 16, torch.bfloat16)
    pushed = dict(t for bucket, flat in zip(plan, P.weight_buckets(policy.model, plan, torch.bfloat16))
                  for t in distributed.unflatten(bucket, flat))
    assert all(torch.equal(pushed[n], p.to(torch.bfloat16)) for n, p in policy.model.named_parameters())


def test_a_bf16_compute_copy_keeps_ropes_fp32_frequencies_and_computes_from_pretraineds_bf16_model(tiny_model_dir):
    """policy.cast rounds the parameters only. model.to(bf16) would round RoPE's inv_freq buffer too, which
    from_pretrained(dtype=bfloat16), FSDP2 and vLLM keep in fp32: the trainer would compute another model than its
    samplers (on one H200, a lag-0 log-prob gap of 1.9e-2 against 6.3e-3)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    copy = P.compute_copy(model, torch.bfloat16)
    loaded = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).eval()
    assert {n: b.dtype for n, b in copy.named_buffers()} == {n: b.dtype for n, b in loaded.named_buffers()}
    assert all(b.dtype == torch.float32 for _, b in copy.named_buffers())
    ids = torch.arange(3, 3 + 600).remainder(model.config.vocab_size - 3)[None] + 3  # positions up to 600
    with torch.no_grad():
        assert torch.equal(copy(ids).logits, loaded(ids).logits)
        rounded = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).to(torch.bfloat16)
        assert not torch.equal(rounded(ids).logits, loaded(ids).logits)  # what .to(bf16) did


def test_bf16_weights_stepped_without_an_fp32_master_barely_move_at_lr_5e_7(tiny_model_dir):
    """The failure the fp32 master weights fix: AdamW on bf16 parameters rounds most updates away."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-7, eps=1e-15, foreach=True)
    before = [p.detach().clone() for p in model.parameters()]
    loss = -head.token_logprobs(model, torch.randint(3, 50, (4, 12))).mean()
    loss.backward()
    optimizer.step()
    changed = sum((p != b).sum().item() for p, b in zip(model.parameters(), before))
    assert changed < 0.1 * sum(b.numel() for b in before)


# -----------------------------------------------------------------------------
# policy.py: the dtype this machine is fast in ('auto'; the CPU's capability injected, so every fact holds
# on any machine)


def cpu_with(monkeypatch, native):
    """This CPU as the resolution sees it: native is 'avx512_bf16' (Arm: 'BF16'), or '' for none."""
    monkeypatch.setattr(P, "native_bf16", lambda: native)


def test_auto_is_bf16_on_a_cpu_with_native_bf16_and_fp32_on_one_without(monkeypatch):
    cpu_with(monkeypatch, "avx512_bf16")
    assert P.resolve_dtype("auto", "cpu") == ("bfloat16", "auto: this CPU has avx512_bf16")
    cpu_with(monkeypatch, "")  # an AVX2 CPU: bf16 ran 4.5-100x slower than fp32 there
    dtype, why = P.resolve_dtype("auto", "cpu")
    assert dtype == "float32" and why.startswith("auto: this CPU has no avx512_bf16")


def test_an_explicit_dtype_wins_whatever_the_cpu_and_a_slow_bf16_says_so(monkeypatch):
    for native in ("avx512_bf16", ""):
        cpu_with(monkeypatch, native)
        for name in ("float32", "bfloat16"):
            assert P.resolve_dtype(name, "cuda") == (name, "as configured")
        assert P.resolve_dtype("float32", "cpu") == ("float32", "as configured")
    cpu_with(monkeypatch, "avx512_bf16")
    assert P.resolve_dtype("bfloat16", "cpu") == ("bfloat16", "as configured")
    cpu_with(monkeypatch, "")  # it runs, and the start line says why it crawls
    slow = "as configured, though this CPU has no native bf16"
    assert P.resolve_dtype("bfloat16", "cpu") == ("bfloat16", slow)


def test_auto_is_bf16_on_cuda_without_asking_the_cpu(monkeypatch):
    def unasked():
        raise AssertionError("CUDA's dtype does not depend on the host CPU")
    monkeypatch.setattr(P, "native_bf16", unasked)
    assert P.resolve_dtype("auto", "cuda") == ("bfloat16", "auto: CUDA")
    assert P.resolve_dtype("auto", torch.device("cuda", 1))[0] == "bfloat16"


def test_native_bf16_reads_the_cpu_flags_on_x86_and_onednn_on_arm(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    for flag, expected in ((True, "avx512_bf16"), (False, "")):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda flag=flag: flag)
        assert P.native_bf16() == expected
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    for flag, expected in ((True, "BF16"), (False, "")):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda flag=flag: flag)
        assert P.native_bf16() == expected


def test_the_default_run_keeps_an_fp32_trainer_and_bf16_sampling_where_bf16_is_native(
        train_config, monkeypatch):
    # the tiny model's trainer stays IEEE fp32 on every CPU (its numerics do not move); the sampler
    # is bf16 as before on a CPU with native bf16, fp32 on one without
    train_config.configure([])
    defaults = (train_config.dtype, train_config.sampler_dtype)
    assert defaults == ("float32", "auto")
    cpu_with(monkeypatch, "avx512_bf16")
    assert [P.resolve_dtype(d, "cpu")[0] for d in defaults] == ["float32", "bfloat16"]
    cpu_with(monkeypatch, "")
    assert [P.resolve_dtype(d, "cpu")[0] for d in defaults] == ["float32", "float32"]


def test_the_config_accepts_auto_and_rejects_an_unknown_dtype_in_one_line(train_config, capsys):
    train_config.configure(["--dtype=auto", "--sampler_dtype=auto"])
    train_config.check_config(train_config.current_config())
    assert (train_config.dtype, train_config.sampler_dtype) == ("auto", "auto")
    error = config_error(train_config, capsys, "--dtype=float16")
    assert "dtype='float16': must be one of float32, bfloat16, auto" in error
    error = config_error(train_config, capsys, "--sampler_dtype=fast")
    assert "sampler_dtype='fast': must be one of float32, bfloat16, auto" in error


def test_cpu_configs_ask_for_auto_and_gpu_configs_for_bf16(train_config):
    for name, expected in [("smollm2_cpu", ("auto", "auto")), ("qwen_coder_cpu", ("auto", "auto")),
                           ("tiny_cpu", ("float32", "auto")),
                           ("scalerl_1gpu", ("bfloat16", "bfloat16")),
                           ("scalerl_8b", ("bfloat16", "bfloat16"))]:
        train_config.configure([os.path.join(REPO, "config", f"{name}.py")])  # each sets both
        assert (train_config.dtype, train_config.sampler_dtype) == expected, name


def test_the_roofline_probes_a_dtype_and_skips_shapes_that_would_take_minutes(monkeypatch, capsys):
    roofline = load_script("benchmarks/step_roofline.py", "step_roofline")
    calls = []

    def rate(gflops):
        def matmul_rate(m, k, n, dtype, repeats, seconds=None):
            calls.append((m, k, n))
            return gflops
        return matmul_rate
    shapes = [(4096, 576, 1536), (4096, 1536, 576), (4096, 576, 49152)]  # SmolLM2-135M's
    monkeypatch.setattr(roofline, "matmul_rate", rate(1.0))  # bf16 a @ b on an AVX2 CPU
    assert roofline.matmul_peak(shapes, torch.bfloat16) == (1.0, False)
    assert calls == [(256, 512, 512)]  # the probe alone
    assert "would take ~1479 s: skipped" in capsys.readouterr().out  # 1.48 TFLOP at 1 GFLOP/s
    calls.clear()
    monkeypatch.setattr(roofline, "matmul_rate", rate(1000.0))
    assert roofline.matmul_peak(shapes, torch.bfloat16) == (1000.0, True)
    assert calls == [(256, 512, 512), *shapes]


@pytest.mark.slow
def test_the_samplers_benchmark_measures_each_engine_in_a_process_of_its_own():
    knobs = ["--engines=torch,torch_before", "--repeats=2", "--batch=4", "--new_tokens=4",
             "--prompt_len=4", "--dtype=float32"]
    result = subprocess.run([sys.executable, "benchmarks/samplers.py", *knobs], cwd=REPO,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].endswith("float32 (as configured) on cpu; each engine in its own process")
    ran = [line.split()[2].rstrip(":") for line in lines if line.startswith("repeat ")]
    assert ran == ["torch", "torch_before", "torch", "torch_before"]  # interleaved
    assert [line.split()[0] for line in lines[-2:]] == ["torch", "torch_before"]


@pytest.mark.slow
def test_a_run_prints_and_saves_the_resolved_dtypes_and_a_resume_names_the_checkpoints(
        tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    first = run_train(out, "--max_steps=1", "--eval_interval=1", "--dtype=float32",
                      "--sampler_dtype=auto")
    assert first.returncode == 0, first.stderr[-3000:]
    line, = [l for l in first.stdout.splitlines() if l.startswith("dtypes: ")]
    sampler = json.load(open(out / "config.json"))["sampler_dtype"]  # what this CPU resolved it to
    assert sampler in ("float32", "bfloat16")
    assert line.startswith(f"dtypes: trainer float32, sampler {sampler} ")
    assert "trainer as configured; sampler auto: this CPU has " in line
    with open(out / "log.jsonl") as f:
        assert json.loads(f.readline())["config"]["sampler_dtype"] == sampler  # the log's header
    other = "float32" if sampler == "bfloat16" else "bfloat16"
    resumed = run_train(out, "--max_steps=2", "--eval_interval=2", "--init_from=resume",
                        "--dtype=float32", f"--sampler_dtype={other}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    line, = [l for l in resumed.stdout.splitlines() if l.startswith("dtypes: ")]
    assert line.endswith(f"; the checkpoint's run had sampler_dtype {sampler}"), line
    assert [r["step"] for r in read_train_log(out)] == [0, 1, 2]
