"""toy.py: build the embedded "pretrained" model that every script uses by default.

There is no model hub on a fresh machine, so the project makes its own tiny causal LM in Hugging Face format
(a Qwen2 config with tied embeddings, like Qwen2.5-1.5B; a character-level fast tokenizer) and pretrains it on a
synthetic corpus of the `toy` task of verify.py: prompt "3 5 7:22=", completion an arithmetic expression over the three
numbers. The corpus is built so that the base model has *latent reasoning modes*, as the paper assumes of a pretrained
LLM: every problem has several correct expressions and the training completions are a broad mixture, a fraction
correct (drawn uniformly among all correct expressions), most of them random well-formed guesses, a few using a wrong
number. The result has a low Pass@1 and a much higher Pass@k, and post-training (ES or GRPO) has something to find.

    python toy.py                        # rebuilds models/toy (the committed default) deterministically
    python toy.py --out models/toy-l --hidden 192 --layers 6   # another size, e.g. for "larger model, smaller N"
    python toy.py --task toy4 --out models/toy4 --steps 900 --threads 2   # rebuilds models/toy4 (the headroom setting)

This script stands alone (it does not import verify.py): it knows which expressions are correct because it builds
them. It reproduces verify.py's `toy` and `toy4` problem distributions and splits exactly (test_all.py checks that),
and pretrains on train-split problems only, so held-out evaluation is on problems the model never saw.
"""
import ast
import dataclasses
import hashlib
import inspect
import itertools
import json
import math
import os
import random
import re
import sys
import textwrap
import time
from dataclasses import dataclass

import torch


@dataclass
class Args:
    out: str = ""
    """where to write the model and tokenizer (save_pretrained format; '': models/toy or models/toy4, by --task)"""
    task: str = "toy"
    """toy (3 numbers 1..9, targets 0..99, a quarter held out) or toy4 (4 numbers 1..9, targets 100..999, train /
    val / test 70/10/20: the headroom setting); one of {toy, toy4}"""
    seed: int = 0
    """seeds the corpus and the initialisation: the same seed rebuilds the same model; in [0, inf)"""
    hidden: int = 128
    """hidden size of the Qwen2 model (a multiple of --heads); in [1, inf)"""
    layers: int = 4
    """number of transformer layers; in [1, inf)"""
    heads: int = 4
    """attention heads (key/value heads too); in [1, inf)"""
    intermediate: int = 384
    """MLP width; in [1, inf)"""
    steps: int = 1500
    """optimizer steps of pretraining; in [1, inf)"""
    batch: int = 256
    """sequences per step; in [1, inf)"""
    lr: float = 3e-3
    """peak AdamW learning rate (linear warm-up, cosine decay); in (0, inf)"""
    p_correct: float = 0.3
    """fraction of training completions that are correct (the rest: random guesses, a few wrong numbers); in [0, 1]"""
    p_wrong_number: float = 0.1
    """fraction of training completions that use a number not in the problem; in [0, 1]"""
    eval_problems: int = 200
    """held-out problems for the closing Pass@1 / Pass@16 check (0 to skip); in [0, inf)"""
    threads: int = 0
    """torch CPU threads (0: torch's default); in [0, inf)"""


# ---- expressions (both tasks): a tree is `int | (op, left, right)` ----------------------------------------------
OPS = "+-*"
PREC = {"+": 1, "-": 1, "*": 2}


def apply(op, x, y):
    return x + y if op == "+" else x - y if op == "-" else x * y


def tree_value(tree):
    if isinstance(tree, int):
        return tree
    op, left, right = tree
    return apply(op, tree_value(left), tree_value(right))


def show_tree(tree):
    """A tree `int | (op, left, right)` with only the parentheses that change its value."""
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree
    text_l, text_r = show_tree(left), show_tree(right)
    if not isinstance(left, int) and PREC[left[0]] < PREC[op]:
        text_l = f"({text_l})"
    if not isinstance(right, int) and (PREC[right[0]] < PREC[op] or (PREC[right[0]] == PREC[op] and op == "-")):
        text_r = f"({text_r})"
    return f"{text_l}{op}{text_r}"


def all_trees(leaves):
    if len(leaves) == 1:
        yield leaves[0]
        return
    for cut in range(1, len(leaves)):
        for left in all_trees(leaves[:cut]):
            for right in all_trees(leaves[cut:]):
                for op in OPS:
                    yield op, left, right


def all_expressions(nums):
    """Every (string, value) over the numbers (three for toy, four for toy4): permutations x shapes x operators."""
    return {show_tree(t): tree_value(t) for order in set(itertools.permutations(nums)) for t in all_trees(list(order))}


# ---- the toy task (must match verify.py: `toy` task, toy_split) -------------------------------------------------
def value(a, o1, b, o2, c, left):
    return apply(o2, apply(o1, a, b), c) if left else apply(o1, a, apply(o2, b, c))


def toy_split(numbers, target):
    key = f"{numbers[0]} {numbers[1]} {numbers[2]}:{target}".encode()
    return "test" if int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % 4 == 0 else "train"


def draw_problem(rng):
    while True:
        nums = [rng.randint(1, 9) for _ in range(3)]
        a, b, c = rng.sample(nums, 3)
        t = value(a, rng.choice(OPS), b, rng.choice(OPS), c, rng.random() < 0.5)
        if 0 <= t <= 99:
            return nums, t


def toy_examples(split, n, seed):
    rng, out = random.Random(seed), []
    while len(out) < n:
        nums, t = draw_problem(rng)
        if toy_split(nums, t) == split:
            out.append({"numbers": nums, "target": t})
    return out


# ---- the toy4 task (must match verify.py: `toy4` task, toy4_problem, toy4_split) --------------------------------
TOY4_TARGETS = (100, 999)


def random_tree(rng, nums):
    """Join two neighbours of a shuffled list with a random operator until one tree is left."""
    items = rng.sample(nums, len(nums))
    while len(items) > 1:
        i = rng.randrange(len(items) - 1)
        items[i:i + 2] = [(rng.choice(OPS), items[i], items[i + 1])]
    return items[0]


def draw_problem4(rng):
    """(numbers, target, the tree that made it); redrawn until the target is in TOY4_TARGETS."""
    while True:
        nums = [rng.randint(1, 9) for _ in range(4)]
        tree = random_tree(rng, nums)
        t = tree_value(tree)
        if TOY4_TARGETS[0] <= t <= TOY4_TARGETS[1]:
            return nums, t, tree


def toy4_split(numbers, target):
    key = (" ".join(map(str, numbers)) + f":{target}").encode()
    h = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % 10
    return "test" if h < 2 else "val" if h == 2 else "train"


def task_examples(task, split, n, seed):
    """verify.get_task(task).examples(split, n, seed) for toy and toy4 (test_all.py checks the equality)."""
    if task == "toy":
        return toy_examples(split, n, seed)
    rng, out = random.Random(seed), []
    while len(out) < n:
        nums, t, _ = draw_problem4(rng)
        if toy4_split(nums, t) == split:
            out.append({"numbers": nums, "target": t})
    return out


def prompt_text(nums, t):
    return " ".join(map(str, nums)) + f":{t}="


# ---- corpus ------------------------------------------------------------------------------------------------------
def completion(rng, nums, target, args):
    """One training completion from the broad mixture (correct / random guess / wrong number)."""
    exprs = all_expressions(nums)
    u = rng.random()
    if u < args.p_correct:
        return rng.choice(sorted(e for e, v in exprs.items() if v == target))
    if u < args.p_correct + args.p_wrong_number:
        nums = list(nums)
        nums[rng.randrange(3)] = rng.randint(1, 9)
        exprs = all_expressions(nums)
    return rng.choice(sorted(exprs))


def completion4(rng, nums, tree, args):
    """toy4's mixture: the problem's own tree (correct), a random tree over the numbers (a guess) or over one wrong
    number. Enumerating every correct expression of four numbers per row would dominate pretraining time."""
    u = rng.random()
    if u < args.p_correct:
        return show_tree(tree)
    if u < args.p_correct + args.p_wrong_number:
        nums = list(nums)
        nums[rng.randrange(4)] = rng.randint(1, 9)
    return show_tree(random_tree(rng, nums))


def make_tokenizer():
    """One token per character. The vocabulary uses GPT-2's byte-level names for space and newline (Ġ, Ċ) so that
    the Qwen2 tokenizer class, which AutoTokenizer picks from config.json and which byte-level pre-tokenizes,
    gives exactly the ids this script trains on (test_all.py checks the round trip)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    byte_name = {" ": "\u0120", "\n": "\u010a"}
    vocab = {"<pad>": 0, "<eos>": 1}
    for ch in "0123456789+-*/() :=.\n":
        vocab[byte_name.get(ch, ch)] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: one token per character
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")


def batch_tensors(rng, tok, args):
    """(input_ids, labels) of shape [batch, L]; labels are -100 on the prompt and padding (loss on completions)."""
    ids, labels = [], []
    for _ in range(args.batch):
        while True:
            if args.task == "toy":
                nums, t = draw_problem(rng)
                if toy_split(nums, t) == "train":
                    break
            else:
                nums, t, tree = draw_problem4(rng)
                if toy4_split(nums, t) == "train":
                    break
        p = tok(prompt_text(nums, t))["input_ids"]
        text = completion(rng, nums, t, args) if args.task == "toy" else completion4(rng, nums, tree, args)
        c = tok(text)["input_ids"] + [tok.eos_token_id]
        ids.append(p + c)
        labels.append([-100] * len(p) + c)
    L = max(map(len, ids))
    pad = lambda rows, v: torch.tensor([r + [v] * (L - len(r)) for r in rows])
    return pad(ids, tok.pad_token_id), pad(labels, -100)


def quick_eval(model, tok, args, k=16):
    """Pass@1 and Pass@k (unbiased estimator, n=k samples at T=1) on held-out problems, with this file's checker."""
    probs = task_examples(args.task, "test", args.eval_problems, seed=12345)
    tok.padding_side = "left"
    p1, pk = [], []
    for ex in probs:
        nums, t = ex["numbers"], ex["target"]
        good = {e for e, v in all_expressions(nums).items() if v == t}
        enc = tok([prompt_text(nums, t)] * k, return_tensors="pt")
        out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=16,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        c = sum(s.strip() in good for s in texts)
        p1.append(c / k)
        pk.append(1.0 if c > 0 else 0.0)
    return sum(p1) / len(p1), sum(pk) / len(pk)


def main(args):
    if not args.out:  # the committed model of the task: never one task's corpus over the other's model
        args = dataclasses.replace(args, out=os.path.join(os.path.dirname(os.path.abspath(__file__)), "models",
                                                          args.task))
    check_args(args)
    from transformers import Qwen2Config, Qwen2ForCausalLM
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tok = make_tokenizer()
    config = Qwen2Config(vocab_size=32, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.heads, max_position_embeddings=64, tie_word_embeddings=True,
                         bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = Qwen2ForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"toy model: {n_params / 1e6:.2f}M parameters, {args.steps} steps of {args.batch}")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warm = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps))))
    t0 = time.time()
    model.train()
    for step in range(args.steps):
        x, y = batch_tensors(rng, tok, args)
        loss = model(input_ids=x, attention_mask=(x != tok.pad_token_id).long(), labels=y).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {loss.item():.4f}  {time.time() - t0:6.1f}s", flush=True)
    model.eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    tmp = args.out.rstrip("/") + ".tmp"  # atomic: write beside, then rename
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    with open(os.path.join(tmp, "toy_args.json"), "w") as f:
        json.dump(dataclasses.asdict(args) | {"params": n_params, "train_seconds": round(time.time() - t0, 1)}, f,
                  indent=1)
    if os.path.isdir(args.out):
        import shutil
        shutil.rmtree(args.out)
    os.replace(tmp, args.out)
    print(f"saved {args.out}")
    if args.eval_problems:  # evaluate what was written, reloaded the way every script loads it
        from transformers import AutoModelForCausalLM, AutoTokenizer
        with torch.no_grad():
            p1, p16 = quick_eval(AutoModelForCausalLM.from_pretrained(args.out).eval(),
                                 AutoTokenizer.from_pretrained(args.out), args)
        print(f"held-out ({args.eval_problems} problems, 16 samples, T=1): pass@1 {p1:.3f}  pass@16 {p16:.3f}")
    return model, tok


# ---- command line (a copy of passk.py's generator, kept here so that this script stands alone) ------------------
_RULE = re.compile(r";\s*in ([\[(])\s*([^,\s]+)\s*,\s*([^\])\s]+)\s*([\])])\s*$")


def field_docs(cls) -> dict:
    """{field name: the docstring under it}, read from the class source: the --help text of each flag."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {a.target.id: b.value.value.strip() for a, b in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)}


def fail(message):
    """Bad input: one line on stderr, exit 2, nothing written."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def check_args(args):
    """Each flag against the interval its doc ends with ("; in [1, inf)"), then the cross-flag rules and --out."""
    for name, doc in field_docs(Args).items():
        m, v = _RULE.search(doc), getattr(args, name)
        if m and not ((float(m[2]) <= v if m[1] == "[" else float(m[2]) < v) and
                      (v <= float(m[3]) if m[4] == "]" else v < float(m[3]))):
            fail(f"--{name.replace('_', '-')} must be in {m[1]}{m[2]}, {m[3]}{m[4]}; got {v}")
    if args.task not in ("toy", "toy4"):
        fail(f"--task must be toy or toy4; got {args.task!r}")
    if args.hidden % args.heads:
        fail(f"--hidden {args.hidden} must be a multiple of --heads {args.heads}")
    if args.p_correct + args.p_wrong_number > 1:
        fail("--p-correct + --p-wrong-number must be at most 1")
    parent = os.path.dirname(os.path.abspath(args.out))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK) or os.path.isfile(args.out):
        fail(f"--out {args.out} cannot be written ({parent} is not a writable directory, or --out is a file)")


def parse_args(argv=None):
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            fail(message)
    p, docs = Parser(description=__doc__.split("\n")[0]), field_docs(Args)
    for f in dataclasses.fields(Args):
        shown = "''" if f.default == "" else f.default
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default, metavar=f.name.upper(),
                       help=f"{docs[f.name]} (default: {shown})".replace("%", "%%"))
    return Args(**vars(p.parse_args(argv)))


if __name__ == "__main__":
    main(parse_args())
