"""
Benchmark (not a test): the single-process loop (torch sampler sharing the trainer's module) on one
device, for two models, back to back:

    python benchmarks/gpu_single.py [--device=cuda] [--max_steps=30] [any train.py --key=value]

  - the built-in tiny model (0.67M parameters, fp32), which learns: its figures are overhead-bound;
  - a "small" model: the same tokenizer under a randomly initialised 12-layer Llama (~90M
    parameters, bf16). It cannot solve the task, so every reward is -1; zero-variance filtering is
    switched off so that every step still trains on the full batch: step time and throughput are
    those of a real step, the learning is not.

For each it prints the wall time per training step (validation excluded), the trainer's tokens/s
inside the training step (trained_tokens / step_time), the sampler's generated tokens/s over the
whole wall time, and the trainer's idle fraction, from the runs' log.jsonl.
"""

import os
import sys
import tempfile

from layouts import run  # the same run-and-read-the-log as the layouts benchmark

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def make_small_model(path, tiny_dir):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                         num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=256,
                         tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


if __name__ == "__main__":
    import data
    args = ["--device=cuda", "--max_steps=30", "--eval_interval=1000", "--n_val=64", "--eval_samples=4",
            "--max_minutes=0"]
    tiny_dir = data.build_tiny_model()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        results.append(("tiny (0.67M, fp32)", run(os.path.join(tmp, "tiny"), [sys.executable], args + sys.argv[1:])))
        n = make_small_model(os.path.join(tmp, "small_model"), tiny_dir)
        small = args + [f"--model_path={os.path.join(tmp, 'small_model')}", "--dtype=bfloat16",
                        "--zero_var_filter=False"] + sys.argv[1:]
        results.append((f"small ({n / 1e6:.0f}M, bf16, random)", run(os.path.join(tmp, "small"), [sys.executable], small)))
    print(f"{'model':28s} {'s / step':>9s} {'trainer tok/s':>14s} {'sampler tok/s':>14s} {'trainer idle':>13s}"
          f" {'final val':>10s}")
    for name, r in results:
        print(f"{name:28s} {r['per_step']:9.3f} {r['trainer_tps']:14.0f} {r['sampler_tps']:14.0f} {r['idle']:13.1%}"
              f" {r['val']:10.3f}")
