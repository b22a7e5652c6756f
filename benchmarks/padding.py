"""
Benchmark (not a test): the share of a training step's tokens that are padding, with train.py's
micro-batches (rows sorted by length, packed to micro_batch / micro_batch_tokens, dealt to the trainer
ranks), for a config's batch shape and a distribution of row lengths:

    python benchmarks/padding.py          # the real-model configs and the 8B config, 200 batches each

Qwen configs: the lengths of real rows, the base model's recorded GSM8K and HumanEval completions
(docs/real_model/qwen_*completions.txt) tokenized with their prompts through the chat template (needs
.cache/qwen_coder from data/qwen_coder/prepare.py). The 8B config: an assumed length distribution (the
paper gives no histogram): a 300-token prompt and a log-normal completion of median 4k tokens, cut at the
14,336-token cap, which cuts ~12% (the paper's instability signal is a 10-15% truncation rate).
Packing several rows into one micro-batch (varlen or block-diagonal attention) can only remove this padding.
"""

import glob
import os
import re
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import data  # noqa: E402
import train  # noqa: E402
from infra.policy import micro_batches  # noqa: E402

HEAD = re.compile(r"^--- (\S+\.jsonl):(\d+) \(answer .*?, (?:right|wrong)\): ", re.M)


def recorded_lengths():
    """prompt + completion tokens of every recorded GSM8K and HumanEval completion of the base model."""
    cache = os.path.join(ROOT, ".cache", "qwen_coder")
    tokenizer = data.load_tokenizer(os.path.join(cache, "model"))
    rows, lengths = {}, []
    for path in glob.glob(os.path.join(ROOT, "docs", "real_model", "qwen_*base*completions.txt")):
        text = open(path, encoding="utf-8").read()
        heads = list(HEAD.finditer(text))
        for head, after in zip(heads, heads[1:] + [None]):
            name, line = head.group(1), int(head.group(2))
            if name not in rows:
                rows[name] = {r["line"]: r for r in data.read_jsonl(os.path.join(cache, name))}
            body = text[head.end():after.start() if after else len(text)]
            body = re.split(r"\n\.cache/\S+: \d+ prompts", body)[0]
            problem = rows[name][line]["text"]
            completion = body[len(problem) + 1:]
            lengths.append(len(data.encode_prompt(tokenizer, problem)) + len(tokenizer.encode(completion)))
    return np.array(lengths)


def assumed_8b_lengths(n, rng):
    completion = np.minimum(rng.lognormal(np.log(4096), 0.9, n), 14336).astype(int)
    return 300 + completion


def padding_share(config, draw, batches=200, seed=0):
    """-> (padding share of the padded tokens, rows per micro-batch) over `batches` batches of the config."""
    train.configure([config])
    rng = np.random.default_rng(seed)
    ranks = max(int(os.environ.get("RANKS", 1)), 1)
    real = padded = micro = count = 0
    for _ in range(batches):
        # a group's rows share a prompt, but their lengths are mostly the completions': drawn row by row
        lengths = torch.tensor(draw(train.prompts_per_step * train.samples_per_prompt, rng))
        for rank in range(ranks):
            for rows in micro_batches(lengths, rank, ranks, train.micro_batch, train.micro_batch_tokens):
                if len(rows):
                    real += int(lengths[rows].sum())
                    padded += len(rows) * int(lengths[rows].max())
                    micro, count = micro + len(rows), count + 1
    return 1 - real / padded, micro / count


if __name__ == "__main__":
    recorded = recorded_lengths()
    print(f"recorded Qwen rows: {len(recorded)}, median {np.median(recorded):.0f} tokens, "
          f"p10-p90 {np.percentile(recorded, 10):.0f}-{np.percentile(recorded, 90):.0f}")
    real = lambda n, rng: rng.choice(recorded, n)
    for config, draw in (("config/qwen_gsm8k_cpu.py", real), ("config/qwen_coder_cpu.py", real),
                         ("config/scalerl_8b.py", assumed_8b_lengths)):
        share, rows = padding_share(os.path.join(ROOT, config), draw)
        print(f"{config}: {train.prompts_per_step} x {train.samples_per_prompt} rows a step, "
              f"micro_batch {train.micro_batch}, micro_batch_tokens {train.micro_batch_tokens}: "
              f"{share:.1%} of the padded tokens are padding ({rows:.1f} rows a micro-batch)")
