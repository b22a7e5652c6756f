"""
Benchmark (not a test): a dump of completions and their verdicts (benchmarks/pass_rates.py --show=N, the
files under docs/real_model/) scored again by the judges as they are now: how many verdicts change, each way,
and the changed completions printed for reading. The rows come from the dataset the dump names (its file
under --data_dir); a completion is taken as cut by the length cap when it has at least --cap tokens (the
dump does not record how each ended: re-encoding its text counts within a token or two).

    python benchmarks/rescore.py docs/real_model/qwen_gsm8k_step8_completions.txt --cap=256
    python benchmarks/rescore.py docs/real_model/qwen_step40_completions.txt --cap=384 --show=0
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import data  # noqa: E402
import rewards  # noqa: E402

HEADER = re.compile(r"^--- (?P<id>\S+:\d+) \(answer (?P<answer>.*?), (?P<verdict>right|wrong)\): ",
                    re.MULTILINE)

if __name__ == "__main__":
    path, cap, show = sys.argv[1], 0, 20
    data_dir, model = ".cache/qwen_coder", ".cache/qwen_coder/model"
    for arg in sys.argv[2:]:
        key, value = arg.removeprefix("--").split("=", 1)
        if key == "cap":
            cap = int(value)
        elif key == "show":
            show = int(value)
        elif key == "data_dir":
            data_dir = value
        else:
            sys.exit(f"benchmarks/rescore.py: unknown option {arg!r}")
    tokenizer = data.load_tokenizer(model)
    text = open(path, encoding="utf-8").read()
    heads = list(HEADER.finditer(text))
    rows, prompts = {}, {}
    for name in sorted({h["id"].rsplit(":", 1)[0] for h in heads}):
        rows.update({f"{name}:{r['line']}": r for r in data.read_jsonl(os.path.join(data_dir, name))})
    cases = []
    for h, after in zip(heads, heads[1:] + [None]):
        row = rows[h["id"]]
        block = text[h.end():after.start() if after else len(text)]
        assert block.startswith(row["text"] + "\n"), h["id"]  # the problem, then the completion
        completion = block[len(row["text"]) + 1:].removesuffix("\n")
        cut = cap > 0 and len(tokenizer.encode(completion, add_special_tokens=False)) >= cap - 1
        prompt = data.Prompt(h["id"], row["text"], [], row["answer"], domain=row["domain"],
                             kind=row["kind"], code=row["code"])
        cases.append((prompt, completion, cut, h["verdict"] == "right"))
    now = rewards.score([(p, c, cut) for p, c, cut, _ in cases])
    paid = [(case, v > 0) for case, v in zip(cases, now)]
    gained = [case for case, ok in paid if ok and not case[3]]
    lost = [case for case, ok in paid if not ok and case[3]]
    print(f"{path}: {len(cases)} completions, {sum(c[2] for c in cases)} cut at {cap} tokens; paid then "
          f"{sum(c[3] for c in cases)}, now {sum(ok for _, ok in paid)}: {len(gained)} wrong -> right, "
          f"{len(lost)} right -> wrong")
    for label, changed in (("now right", gained), ("now wrong", lost)):
        for prompt, completion, cut, _ in changed[:show]:
            print(f"=== {label}: {prompt.id} (answer {prompt.answer}{', cut' if cut else ''})\n"
                  f"{completion[-600:]}\n")
