"""infra/memory.py: the memory plan, sampler slots, the plan against what FSDP2 holds (slow).

Run alone: `python -m pytest tests/test_memory.py`."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

# tests.helpers first: importing it sets torch to one thread (it says why)
from tests.helpers import REPO, load_tiny_qwen, sampler_knobs
# the fixtures its tests take (pytest finds them by name in this module)
from tests.helpers import tiny_qwen  # noqa: F401
from infra import memory
from infra import policy as P
import train


# =============================================================================
# infra/memory.py


def test_release_hands_the_heaps_free_pages_back_to_the_os():
    # glibc keeps memory freed below the heap's last block in use (a CPU trainer held 7.1 GiB of it)
    resident = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")  # noqa: E731
    blocks = [bytearray(100_000) for _ in range(2000)]  # 200 MB in the heap: each under the mmap threshold
    pin = bytearray(100_000)  # above them: their free space is not the heap's top, which free() trims itself
    del blocks
    before = resident()
    memory.release()
    assert before - resident() > 150e6 and len(pin) == 100_000


def test_memory_plan_names_the_biggest_term_and_its_knob_when_a_role_cannot_fit():
    qwen3_8b = dict(hidden_size=4096, num_hidden_layers=36, intermediate_size=12288, vocab_size=151936,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    shape = memory.shape_of(qwen3_8b)
    assert abs(shape.params - 8.19e9) < 0.01e9  # Qwen3-8B: 8.19B
    gib = 1 << 30
    one_gpu = memory.plan(shape, 1, False, 0, True, 2, 16384, True, 16384, 0.4, gib, 141 * gib)
    problem = memory.check(one_gpu, 141 * gib, one_gpu=True)
    assert problem.count("\n") == 0 and "biggest term is OptState (moments + foreach's temporary, at AdamW's step) " \
        "(91.5 GiB): more trainer ranks" in problem  # 12 bytes a parameter at AdamW's step
    eight = memory.plan(shape, 2, True, 6, False, 2, 16384, True, 16384, 0.85, gib, 141 * gib)
    assert memory.check(eight, 141 * gib, one_gpu=False) is None
    assert "biggest term is" in memory.check(eight, 40 * gib, one_gpu=False)  # a fake 40 GiB device
    no_checkpointing = memory.plan(shape, 8, True, 8, False, 2, 16384 * 4, False, 16384, 0.85, gib, 141 * gib)
    assert "biggest term is Activation + Temp (65,536 tokens)" in memory.check(no_checkpointing, 141 * gib, one_gpu=False)
    assert "checkpoint_activations=True" in memory.check(no_checkpointing, 141 * gib, one_gpu=False)


QWEN3_8B_SHAPE = dict(hidden_size=4096, num_hidden_layers=36, intermediate_size=12288, vocab_size=151936,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128)


def test_sampler_slots_are_what_the_kv_cache_holds_at_the_expected_length_and_the_configs_keep_to_it():
    import configurator
    assert memory.slots_that_fit(480_000, 5_100) == 94 and memory.slots_that_fit(100, 0) == 100
    assert memory.slots_warning(480_000, 5_100, 94) is None
    warning = memory.slots_warning(480_000, 5_100, 256)
    assert warning.startswith("WARNING: sampler_slots=256") and "set sampler_slots <= 94" in warning
    gib = 1 << 30
    qwen3 = dict(hidden_size=2048, num_hidden_layers=28, intermediate_size=6144, vocab_size=151936,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)  # 1.7B
    for name, shape, layout in (("scalerl_1gpu", qwen3, (1, False, 0, True)),
                                ("scalerl_8b", dict(qwen3, **QWEN3_8B_SHAPE), (2, True, 6, False))):
        c = configurator.configure({k: getattr(train, k) for k in train.config_keys},
                                   [os.path.join(REPO, "config", f"{name}.py")], "test")
        prompt = 1024  # a long Polaris prompt
        max_len = prompt + c["think_budget_max"] + c["answer_budget"]
        expected = max_len - (c["think_budget_max"] + c["answer_budget"]) // 2
        share = c["vllm_gpu_memory"] if layout[3] else c["vllm_gpu_memory_own"]
        roles = memory.plan(memory.shape_of(shape), *layout, 2, 16384, True, max_len, share, gib, 141 * gib,
                            expected_len=expected)
        line = memory.describe(roles)
        fit = int(re.search(r"(\d+) of the expected", line).group(1))
        assert c["sampler_slots"] <= fit < 2 * c["sampler_slots"], (name, fit, line)


GiB = 1 << 30
QWEN25_05B_SHAPE = dict(hidden_size=896, num_hidden_layers=24, intermediate_size=4864, vocab_size=151936,
                        num_attention_heads=14, num_key_value_heads=2, head_dim=64)  # untied, as the prepare writes it


def test_a_cpu_plan_holds_the_torch_samplers_kv_cache_fp32_head_and_logits_beside_the_trainer():
    # config/qwen_coder_cpu.py's run: 192 rows of 841 tokens; 24 layers of 2 KV heads of 64, bf16
    shape = memory.shape_of(QWEN25_05B_SHAPE)
    roles = memory.plan(shape, 1, False, 0, True, 2, 3364, False, 841, 0.0, GiB, 0, cpu=True, torch_slots=192)
    terms = {t.split(" (")[0]: b for t, b, _ in roles["torch sampler beside the trainer"]}
    assert terms == {"KV cache": 2 * 192 * 841 * 24 * 128 * 2 * 2,  # room to double: 3.70 GiB
                     "fp32 head": 4 * 151936 * 896, "a decode step's logits": 3 * 4 * 192 * 151936,
                     "Python, torch, transformers, the tokenizer": GiB // 2}
    # the trainer's 18.1 GiB (which the run printed) and the sampler's 5.0: the run peaked at 22.7, then 23.2 GiB
    assert memory.total(roles["trainer"]) / GiB == pytest.approx(18.1, abs=0.05)
    assert memory.total(sum(roles.values(), [])) / GiB == pytest.approx(23.1, abs=0.05)
    assert set(memory.plan(shape, 1, False, 0, True, 2, 3364, False, 841, 0.0, GiB, 0, cpu=True)) == {"trainer"}
    fp32 = memory.plan(shape, 1, False, 0, True, 4, 3364, False, 841, 0.0, GiB, 0, cpu=True, torch_slots=192)
    assert dict((t, b) for t, b, _ in fp32["torch sampler beside the trainer"])["fp32 head"] == 0  # the weight itself


def test_a_cpu_plan_past_the_machines_memory_warns_and_names_the_knobs(tiny_qwen, capsys):
    import types
    layout = types.SimpleNamespace(device=torch.device("cpu"), world=1, trainers=1, samplers=0, rank=0)
    config = {k: getattr(train, k) for k in train.config_keys}
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    # the tiny model's KV cache: 2 layers x 32 x K, V x fp32 = 512 bytes a token, room to double
    for slots, warned in ((1280, False), (ram // (2 * 512 * 100) + 1, True)):
        assert memory.plan_run(tiny_qwen["path"], layout, dict(config, sampler_slots=slots), 100) is None
        out = capsys.readouterr().out
        assert "memory plan, torch sampler beside the trainer: KV cache (" in out
        assert ("WARNING: the plan needs" in out and "fewer sampler_slots or a smaller micro_batch" in out) == warned


def test_the_torch_samplers_kv_cache_never_outgrows_the_plans_room(tiny_qwen):
    """A sampler of 16 slots decoding 48 sequences to their budgets: its cache (every layer's room for keys
    and values, as GrowingLayer allocates it) stays within the plan's term for 16 rows of max_len tokens."""
    from sample import TorchSampler
    sampler = TorchSampler(load_tiny_qwen(tiny_qwen), **sampler_knobs(tiny_qwen, max_seqs=16, temperature=2.0))
    for i, prompt in enumerate(tiny_qwen["prompts"] * 3):
        sampler.add(i, prompt, 4)
    held = []
    while sampler.num_unfinished:
        sampler.step()
        sampler.pop_finished()
        held.append(sum(x.numel() * x.element_size() for layer in sampler.cache.layers if hasattr(layer, "room")
                        for x in (layer.room, layer.room_values)))
    max_len = max(map(len, tiny_qwen["prompts"])) + 10 + 6 + len(tiny_qwen["phrase"])  # think_budget (3, 10)
    shape = memory.shape_of(load_tiny_qwen(tiny_qwen).config)
    planned = dict((t.split(" (")[0], b) for t, b, _ in memory.torch_sampler(shape, 16, max_len, 4, True))
    assert planned["KV cache"] == 2 * 16 * max_len * 2 * 32 * 2 * 4  # 2 layers of 1 KV head of 32, fp32
    assert planned["KV cache"] / 4 < max(held) <= planned["KV cache"], (max(held), planned["KV cache"])


def test_no_sync_holds_every_gradient_unsharded_in_fp32_on_every_trainer():
    shape = memory.shape_of(QWEN3_8B_SHAPE)
    every, no_sync = (memory.trainer_phases(shape, 2, True, 2, 16384, True, sync_every=sync)["backward"]
                      for sync in (True, False))
    total = lambda phase: sum(b for _, b, _ in phase)
    assert total(no_sync) - total(every) == pytest.approx(4 * shape.params - 4 * shape.params / 2)  # 4N, not 4N/T
    roles = memory.plan(shape, 2, True, 6, False, 2, 16384, True, 16384, 0.85, 1 << 30, 141 * GiB)
    assert [t for t, _, _ in roles["trainer"]][-1].startswith("OptState")  # 2 trainers peak in AdamW's step


# -----------------------------------------------------------------------------
# memory.py: the plan against what torch measures (benchmarks/memory_check.py, slow)


def memory_check(tmp_path, *args):
    """benchmarks/memory_check.py with `args` -> its JSON results (every row: phase, term, plan, measured, agrees)."""
    out = tmp_path / "results.json"
    command = [sys.executable, os.path.join(REPO, "benchmarks", "memory_check.py"), *args, f"--json={out}"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900,  # a hang guard: ~1-4 minutes
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(result.stdout)  # the tables, in the test's log
    return json.loads(out.read_text())


def terms(result, phase):
    """{term: (plan bytes, measured bytes)} of one phase, the plan's term names without their parenthesis."""
    return {term.split(" (")[0]: (plan, measured) for p, term, plan, measured, _ in result["rows"] if p == phase}


@pytest.mark.slow
def test_a_decoder_layer_saves_about_8h_5i_2kv_values_a_token_for_its_backward(tmp_path):
    rows = memory_check(tmp_path, "--per_layer")["per_layer"]
    assert {(name, dtype) for name, dtype, _, _ in rows} == {(m, d) for m in ("SmolLM2-135M", "Qwen3-8B")
                                                             for d in ("float32", "bfloat16")}
    for name, dtype, measured, planned in rows:  # SDPA: no T x T; Qwen3's q / k norms save fp32 copies (0.89)
        assert planned == pytest.approx(measured, rel=0.2), (name, dtype)


@pytest.mark.slow
def test_the_plan_is_what_fsdp2_holds_for_qwen3_8b_on_fake_tensors(tmp_path):
    results = memory_check(tmp_path, "--fake", "--fake_layouts=2:every,2:no-sync")["fake"]
    n = memory.shape_of(QWEN3_8B_SHAPE).params
    for r in results:
        off = [row[:4] for row in r["rows"] if not row[4]]
        assert not off, (r["trainers"], r["sync_every"], off)  # every term within 20% (or a one-layer buffer)
        backward, step = terms(r, "backward"), terms(r, "step")
        assert step["OptState"][1] == pytest.approx(12 * n / r["trainers"], rel=0.01)  # moments + foreach's temporary
        if not r["sync_every"]:  # FSDP2's fp32 accumulators: the whole model's gradients, unsharded
            assert backward["Unsharded Grad"][1] == pytest.approx(4 * n, rel=0.05)
    every, no_sync = (max(r["peaks"][p]["Total"] for p in ("backward", "step")) for r in results[:2])
    assert no_sync - every > 12 * GiB  # 8 GPUs: syncing every micro-batch saves 13 GiB of the trainer's peak


@pytest.mark.slow
def test_the_plan_is_what_fsdp2_holds_for_smollm2_on_real_tensors(tmp_path):
    # the config's compute (dtype "auto": bf16 on a CPU with native bf16, else fp32, where bf16 ran this
    # test 5x slower), no checkpointing; the fake-tensor test above plans bf16 on every machine
    variant = f"{P.resolve_dtype('auto', 'cpu')[0]}:full:every"
    results = memory_check(tmp_path, "--real", "--real_tokens=256", "--no_timing",
                           f"--real_variants={variant}")["real"]
    assert [r["variant"] for r in results] == [variant]
    for r in results:
        off = [row[:4] for row in r["rows"] if not row[4]]
        assert not off, (r["variant"], off)
