"""infra/lora.py: LoRA as one knob (train.py's lora_rank): the base at step 0 bit for bit, only the
adapters trained, the samplers' merged weights, the checkpoint in PEFT's format, the memory plan and the
compute axis.

Run alone: `python -m pytest tests/test_lora.py`."""

import json
import os
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

# tests.helpers first: importing it sets torch to one thread (it says why)
from tests.helpers import (ONE_PROCESS, config_error, fixed_batch, read_train_log, recorded_step,
                           require_vllm, run_train, tiny)
# the fixtures its tests take (pytest finds them by name in this module)
from tests.helpers import tiny_model_dir, train_config  # noqa: F401
import head
import log
from infra import checkpoint, lora, memory
from infra import policy as P
import sample
import train

IDS = torch.tensor([[5, 7, 9, 11, 13, 15, 17, 19], [4, 6, 8, 10, 12, 14, 16, 18]])


def base_model(path, dtype=torch.float32):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(dtype).eval()


def logits(model):
    with torch.no_grad():
        return model(IDS).logits


def lora_policy(model_dir, train_config, *args):
    train_config.configure(["--lora_rank=4", "--warmup_steps=0", *args])
    return train.make_policy(train.current_config(), model_dir, ONE_PROCESS)


def randomise(model, seed=1):
    """B drawn at random (as after training), so the adapters change the model."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in lora.adapted(model).values():
            m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=generator) * 0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_b_zero_gives_the_base_models_logits_bit_for_bit(tiny_model_dir, dtype):
    model = base_model(tiny_model_dir, dtype)
    before = logits(model)
    names = lora.add_adapters(model, 4, 32.0, "all", seed=0)
    assert len(names) == 7 * model.config.num_hidden_layers  # q k v o gate up down in every layer
    assert torch.equal(logits(model), before)
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if "lora_" in n)


def test_only_the_adapters_get_gradients_and_the_base_is_held_once_in_the_compute_dtype(
        tiny_model_dir, train_config):
    policy = lora_policy(tiny_model_dir, train_config, "--dtype=bfloat16")
    assert policy.logprobs.model is policy.model  # no fp32 master copy of the base
    trained = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trained and all(n.endswith((".lora_A", ".lora_B")) for n in trained)
    assert all(p.dtype == torch.bfloat16 for n, p in policy.model.named_parameters() if n not in trained)
    assert sum(len(g["params"]) for g in policy.optimizer.param_groups) == len(trained)
    base = {n: p.detach().clone() for n, p in policy.model.named_parameters() if n not in trained}
    stats = train.train_step(train.current_config(), policy, fixed_batch(len(tiny.build_tokenizer())), 0, 0)
    assert stats["grad_norm"] > 0 and "skipped" not in stats
    params = dict(policy.model.named_parameters())
    assert all(torch.equal(params[n], p) for n, p in base.items())  # the base did not move
    assert all(params[n].abs().max() > 0 for n in trained if n.endswith("lora_B"))  # every B did
    _, grads = recorded_step(tiny_model_dir, fixed_batch(len(tiny.build_tokenizer())))
    assert set(grads) == trained


def test_the_merged_model_equals_the_adapted_one_within_fp32_rounding(tiny_model_dir):
    model = base_model(tiny_model_dir)
    lora.add_adapters(model, 8, 16.0, "all", seed=0)
    randomise(model)
    merged = lora.merged_copy(model, torch.float32)
    assert not lora.adapted(merged) and not any("lora_" in n for n, _ in merged.named_parameters())
    adapted, plain, base = logits(model), logits(merged), logits(base_model(tiny_model_dir))
    assert (adapted - base).abs().max() > 0.1  # the adapters matter
    assert (adapted - plain).abs().max() < 1e-4
    # merged afresh from the frozen base each time: a thousand merges leave the base where it was
    for _ in range(1000):
        lora.merged(next(iter(lora.adapted(model).values())))
    assert torch.equal(logits(lora.merged_copy(model, torch.float32)), plain)


def test_a_torch_sampler_gets_the_merged_adapted_weights_only_and_in_its_own_dtype(
        tiny_model_dir, train_config):
    policy = lora_policy(tiny_model_dir, train_config)
    randomise(policy.model)
    module = P.sampler_module(policy, torch.bfloat16)
    assert module is not policy.model and next(module.parameters()).dtype == torch.bfloat16
    sampler = sample.TorchSampler(module, eos_ids={0}, max_new_tokens=4)
    randomise(policy.model, seed=2)  # a step later
    plan = P.weight_plan(policy.model, 1 << 20, torch.bfloat16)
    pushed = [name for bucket in plan for name, _ in bucket]
    assert pushed == list(lora.adapted(policy.model))  # the embeddings and norms never change
    P.push_weights(policy, sampler, 1, torch.bfloat16, 1 << 20)
    expected = lora.merged_copy(policy.model, torch.bfloat16)
    assert all(torch.equal(p, q) for p, q in zip(module.parameters(), expected.parameters()))
    assert sampler.version == 1


def test_a_checkpoint_holds_the_adapter_in_pefts_files_and_restores_the_run_bit_for_bit(
        tiny_model_dir, train_config, tmp_path):
    batches = [fixed_batch(len(tiny.build_tokenizer()), seed=s) for s in (0, 1)]
    given = os.path.relpath(tiny_model_dir)  # a model_path as a config gives it, relative to the repository
    policy = lora_policy(given, train_config, "--lr=1e-3")
    train.train_step(train.current_config(), policy, batches[0], 0, 0)
    checkpoint.save(tmp_path, policy, tiny.build_tokenizer(), dict(step=1, config=vars(train.current_config())))
    files = sorted(os.listdir(tmp_path / "ckpt"))
    # no model weights, no tokenizer: the base's (model_path) are read on resume
    assert files == ["adapter_config.json", "adapter_model.safetensors", "optimizer.pt", "state.pt"]
    config = json.load(open(tmp_path / "ckpt" / "adapter_config.json"))
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 32.0)
    assert config["target_modules"] == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                               "down_proj"])
    assert config["base_model_name_or_path"] == given  # a committed adapter names no one machine's directories
    resumed = (tmp_path / "ckpt", checkpoint.read_checkpoint(tmp_path / "ckpt"), [])  # log.resume's
    again = train.make_policy(train.current_config(), tiny_model_dir, ONE_PROCESS, resumed)
    for p, q in zip(policy.model.parameters(), again.model.parameters()):
        assert torch.equal(p, q)
    for stepped in (policy, again):
        train.train_step(train.current_config(), stepped, batches[1], 1, 0)
    for p, q in zip(policy.model.parameters(), again.model.parameters()):
        assert torch.equal(p, q)  # AdamW's moments and step count came back too


def test_the_adapter_loads_in_vllms_lora_serving_with_the_merged_models_log_probs(
        tiny_model_dir, train_config, tmp_path):
    """The PEFT files as vLLM serves them (adapter-only, on the base as it is) give the log-probs the
    merged model gives."""
    require_vllm()
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest
    policy = lora_policy(tiny_model_dir, train_config)
    randomise(policy.model)
    checkpoint.save(tmp_path, policy, tiny.build_tokenizer(), dict(step=1))
    merged = lora.merged_copy(policy.model, torch.float32).eval()
    expected = head.token_logprobs(merged, IDS[:1], 1.0)[0]
    engine = sample._VLLMEngine(tiny_model_dir, 1, 0, True, dict(
        dtype="float32", enable_lora=True, max_lora_rank=8, max_model_len=64,
        kv_cache_memory_bytes=1 << 26))
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
    ids = IDS[0].tolist()
    for request, want in ((LoRARequest("adapter", 1, str(tmp_path / "ckpt")), expected),
                          (None, head.token_logprobs(base_model(tiny_model_dir), IDS[:1], 1.0)[0])):
        out, = engine.llm.generate([dict(prompt_token_ids=ids)], params, lora_request=request)
        got = torch.tensor([d[t].logprob for d, t in zip(out.prompt_logprobs[1:], ids[1:])])
        assert (got - want).abs().max() < 1e-4, (got, want)
    assert (expected - head.token_logprobs(base_model(tiny_model_dir), IDS[:1], 1.0)[0]).abs().max() > 0.01


def test_bad_lora_settings_stop_in_one_line_before_anything_is_written(tiny_model_dir, train_config, capsys,
                                                                          tmp_path):
    assert "lora_rank=-1" in config_error(train_config, capsys, "--lora_rank=-1")
    assert "lora_alpha=0.0: must be > 0" in config_error(train_config, capsys, "--lora_alpha=0")
    out = tmp_path / "run"
    result = run_train(out, "--lora_rank=4", "--lora_targets=q_proj,qkv", "--max_steps=1")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert result.stderr.startswith("train.py: error: lora_targets='q_proj,qkv': qkv matches no linear layer")
    assert not out.exists()


def test_a_resume_onto_another_base_or_other_lora_settings_is_refused_in_one_line(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    assert run_train(out, "--lora_rank=4", "--max_steps=1", "--n_val=8").returncode == 0
    before = {name: open(out / name, "rb").read() for name in ("log.jsonl", "ckpt/state.pt")}
    other = tmp_path / "other"  # the same shapes, another model: one weight of the base changed
    shutil.copytree(tiny_model_dir, other)
    model = base_model(tiny_model_dir)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[0, 0] += 1.0
    model.save_pretrained(other)
    for args, said in [([f"--model_path={other}"], "not the base model the checkpoint's adapter was trained on"),
                       (["--lora_rank=8"], "the checkpoint's run had lora_rank=4: resume with its settings"),
                       (["--lora_rank=0"], "the checkpoint's run had lora_rank=4")]:
        result = run_train(out, "--lora_rank=4", "--max_steps=2", "--n_val=8", "--init_from=resume", *args)
        assert result.returncode == 2 and said in result.stderr, result.stderr[-2000:]
        assert result.stderr.count("\n") == 1, result.stderr[-2000:]  # before any model is loaded
        assert all(open(out / name, "rb").read() == data for name, data in before.items())


def test_the_memory_plan_holds_the_frozen_base_in_bf16_and_only_the_adapters_state_in_fp32():
    from tests.test_memory import QWEN25_05B_SHAPE
    shape = memory.shape_of(QWEN25_05B_SHAPE)
    config = dict(QWEN25_05B_SHAPE, model_type="qwen2", tie_word_embeddings=False)
    from transformers import Qwen2Config
    adapter = lora.count(Qwen2Config(**config), 8, "all")
    # r (in + out) over q k v o gate up down, 24 layers: ~550k parameters per unit of rank
    H, I, kv = 896, 4864, 128
    assert adapter == 24 * 8 * ((H + H) * 2 + (H + kv) * 2 + (H + I) * 3)
    full = memory.plan(shape, 1, False, 0, True, 2, 3364, False, 841, 0.0, 1 << 30, 0, cpu=True, torch_slots=192)
    lo = memory.plan(shape, 1, False, 0, True, 2, 3364, False, 841, 0.0, 1 << 30, 0, cpu=True, torch_slots=192,
                     adapter=adapter)
    terms = {t: b for t, b, _ in lo["trainer"]}
    assert terms["frozen base in the compute dtype"] == 2 * shape.params
    assert terms["fp32 adapters and their gradients"] == 8 * adapter
    assert not any("compute copy" in t for t in terms)
    sampler = {t: b for t, b, _ in lo["torch sampler beside the trainer"]}
    assert sampler["the model, adapters merged (LoRA)"] == 2 * shape.params
    saved = memory.total(sum(full.values(), [])) - memory.total(sum(lo.values(), []))
    # fp32 masters, gradients and moments (16 bytes a parameter) and the bf16 copy's gradients, less
    # a merged bf16 copy for the sampler
    assert saved / (1 << 30) > 7.0


def test_a_lora_step_is_counted_without_the_bases_weight_gradients():
    counters = dict(train_seconds=0.0, flops=0.0, tokens=0)
    row = log.count(counters, 1, dict(trained_tokens=100), 50, 1000, 0.0, 0.0, 1, n_adapter=10)
    assert row["flops"] == 2 * 1000 * 50 + (4 * 1000 + 6 * 10) * 100
    full = log.count(dict(train_seconds=0.0, flops=0.0, tokens=0), 1, dict(trained_tokens=100), 50, 1000, 0.0,
                     0.0, 1)
    assert full["flops"] == 2 * 1000 * 50 + 6 * 1000 * 100


@pytest.mark.slow
def test_a_lora_run_learns_the_builtin_task_and_its_checkpoint_is_the_adapter(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    result = run_train(out, "--lora_rank=8", "--lr=2e-3", "--max_steps=20", "--eval_interval=10")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_train_log(out)
    header = json.loads(open(out / "log.jsonl").readline())
    assert header["config"]["lora_rank"] == 8
    assert rows[-1]["val_reward"] > rows[0]["val_reward"] + 0.05, [r.get("val_reward") for r in rows]
    size = sum(os.path.getsize(out / "ckpt" / f) for f in os.listdir(out / "ckpt"))
    assert size < 2e6 and rows[-1]["logprob_mismatch"] < 0.05
