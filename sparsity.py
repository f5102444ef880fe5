"""sparsity.py: how far post-training moved the weights, how little of that movement matters, what compression does.

Ba et al. (arXiv 2608.27351) report that ES moves the whole parameter vector far (relative L2 40-44x GRPO's), that
78-93% of its updates are nevertheless below 1.5e-3, that its gain lives in a sparse set of large updates, and that
held-out evaluations show no catastrophic forgetting; whether compression keeps or destroys such a gain they leave
open. For any pair of checkpoints (base, tuned: ES, GRPO or a schedule) this script measures:

  1. drift: relative L2 of delta = tuned - base overall, per tensor and per module type; max |delta|; a histogram of
     |delta|; the fraction of weights with |delta| above thresholds; the fraction changed as seen in fp32 and as seen
     after casting both models to bf16 (much of the "update sparsity" reported elsewhere is bf16 rounding);
  2. functional sparsity: keep the largest q% of |delta| (top: global; top-tensor: within each tensor) or a random q%
     (the control), reset the rest to base, evaluate held-out Pass@k; retained gain = (pass@k(q) - base) / (tuned -
     base). Every model is evaluated on the same problems with the same sampling stream (common random numbers);
  3. forgetting: beside the task gain, the change on what the model was not trained for: a held-out problem family
     (--forget-task; for the embedded model by default targets 100..729, never seen in pre- or post-training) and,
     for the embedded model, the language-model loss on fresh text from its pretraining distribution (toy.py's
     generator: the broad mixture of correct, guessed and wrong-number completions);
  4. compression: global magnitude pruning and round-to-nearest int8 / int4 weight quantisation (per output channel)
     of the transformer blocks' weight matrices, applied the same way to base and tuned; retained gain =
     (pass@k(tuned compressed) - pass@k(base compressed)) / (tuned - base).

    python sparsity.py --base models/toy --tuned runs/es --out runs/sparsity-es
    python sparsity.py --base Qwen/Qwen2.5-1.5B-Instruct --tuned runs/es-qwen --task gsm8k --forget-task math

Exact by construction: a kept weight is the tuned model's value and a reset one the base's (a select, not
base + mask * delta), so q = 100 `top` is the tuned model and q = 0 the base, bit for bit.
"""
import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch

import passk
import verify


@dataclass
class Args:
    base: str = passk.DEFAULT_MODEL
    """the model before post-training: directory, hub id, or run directory (its latest checkpoint)"""
    tuned: str = "runs/es"
    """the model after post-training: directory, hub id, run or schedule directory"""
    task: str = "toy"
    """the task the model was tuned on (held-out Pass@k): countdown, gsm8k, math, toy, toy4, options after '?'"""
    data: str = ""
    """local data file for the task (jsonl or a json list); gsm8k and math default to the bundled data/ files"""
    keep: str = "0,0.1,0.3,1,3,10,30,100"
    """comma list of q, the percent of |delta| kept, each in [0, 100]"""
    modes: str = "top,top-tensor,random"
    """comma list of keep modes: top (largest |delta| globally), top-tensor (within each tensor), random (control)"""
    thresholds: str = "1e-4,1e-3,1.5e-3,1e-2"
    """comma list of |delta| thresholds for the fraction of updates above each (the paper: 1.5e-3)"""
    prune: str = "10,30,50,70"
    """comma list of global magnitude-pruning sparsities in percent ('' for none)"""
    quant: str = "8,4"
    """comma list of round-to-nearest weight bit widths, per output channel ('' for none)"""
    forget_task: str = "auto"
    """held-out task for forgetting ('auto': the unseen family of toy or toy4, FORGET below; '' for none)"""
    forget_data: str = ""
    """local data file for --forget-task"""
    forget_problems: int = 0
    """problems of --forget-task (0: --eval-problems); each one's count of correct samples goes in the record, so a
    drop can be paired over problems; in [0, inf)"""
    lm_sequences: int = 2048
    """embedded model: sequences of fresh pretraining text for the language-model loss (0 to skip); in [0, inf)"""
    eval_problems: int = 200
    """held-out problems per evaluation; in [1, inf)"""
    eval_n: int = 16
    """samples per problem (Pass@1..Pass@eval_n); in [1, inf)"""
    max_new_tokens: int = 16
    """generation budget per completion; in [1, inf)"""
    batch_size: int = 256
    """rows per generation batch; in [1, inf)"""
    seed: int = passk.EVAL_SEED
    """sampling seed of every evaluation (the training scripts' eval lines use the same); in [0, inf)"""
    device: str = ""
    """cpu, cuda, cuda:N ('': cuda when available, else cpu)"""
    threads: int = 0
    """torch CPU threads (0: torch's default); in [0, inf)"""
    out: str = "runs/sparsity"
    """output directory: sparsity.jsonl, keep.png, delta_hist.png, compress.png"""


# the embedded tasks' unseen families ('auto' --forget-task): targets their models were never pretrained or tuned on
FORGET = {"toy": "toy?min_target=100,max_target=729", "toy4": "toy4?min_target=10,max_target=99"}
MODULE_TYPES = ("embedding", "attention", "mlp", "norm", "head", "other")


def module_type(name: str) -> str:
    n = name.lower()
    for kind, keys in (("embedding", ("embed", "wte", "wpe")), ("head", ("lm_head",)), ("norm", ("norm", "ln_")),
                       ("attention", ("attn", "attention")), ("mlp", ("mlp", "ffn", "fc"))):
        if any(k in n for k in keys):
            return kind
    return "other"


# ---- 1. drift --------------------------------------------------------------------------------------------------------
def drift(base, tuned, thresholds):
    """Per tensor and overall: relative L2, max |delta|, fractions above thresholds and changed (fp32 and bf16)."""
    per, tot = {}, {"n": 0, "d2": 0.0, "b2": 0.0, "max": 0.0, "changed_fp32": 0, "changed_bf16": 0,
                    **{f"above_{t:g}": 0 for t in thresholds}, **{f"above_{t:g}_bf16": 0 for t in thresholds}}
    kinds = {k: {"n": 0, "d2": 0.0, "b2": 0.0} for k in MODULE_TYPES}
    edges = np.arange(-10, 1.25, 0.25)  # log10 |delta| bins
    hist, zeros = np.zeros(len(edges) - 1, dtype=np.int64), 0
    for name, b in base.items():
        d = (tuned[name].double() - b.double()).flatten()
        a = d.abs()
        seen_bf16 = (tuned[name].bfloat16().double() - b.bfloat16().double()).abs().flatten()
        rec = {"n": d.numel(), "d2": float(d.pow(2).sum()), "b2": float(b.double().pow(2).sum()),
               "max": float(a.max()), "changed_fp32": int((a > 0).sum()), "changed_bf16": int((seen_bf16 > 0).sum()),
               **{f"above_{t:g}": int((a > t).sum()) for t in thresholds},
               **{f"above_{t:g}_bf16": int((seen_bf16 > t).sum()) for t in thresholds}}
        per[name] = rec
        for k in tot:
            tot[k] = max(tot[k], rec[k]) if k == "max" else tot[k] + rec[k]
        kind = kinds[module_type(name)]
        for k in kind:
            kind[k] += rec[k]
        nz = a[a > 0]
        zeros += d.numel() - nz.numel()
        hist += np.histogram(np.log10(nz.clamp(min=1e-10).numpy()), bins=edges)[0]

    def summary(r):
        out = {"params": r["n"], "relative_l2": math.sqrt(r["d2"] / max(r["b2"], 1e-300)),
               "delta_l2": math.sqrt(r["d2"])}
        if "max" in r:
            out.update(max_abs_delta=r["max"], changed_fp32=r["changed_fp32"] / r["n"],
                       changed_bf16=r["changed_bf16"] / r["n"],
                       **{k: v / r["n"] for k, v in r.items() if k.startswith("above_")})
        return out
    return {"overall": summary(tot), "by_type": {k: summary(v) for k, v in kinds.items() if v["n"]},
            "by_tensor": {k: summary(v) for k, v in per.items()},
            "histogram": {"log10_edges": edges.tolist(), "counts": hist.tolist(), "zeros": int(zeros)}}


# ---- 2. functional sparsity ------------------------------------------------------------------------------------------
def keep_masks(base, tuned, q, mode, seed=0):
    """{name: bool mask} keeping exactly round(q% of N) entries of delta (N over all tensors; for top-tensor, of each
    tensor): the largest |delta| (ties by position), or a seeded uniform random choice."""
    names = list(base)
    sizes = [base[k].numel() for k in names]
    if mode == "top-tensor":
        masks = {}
        for k in names:
            a = (tuned[k] - base[k]).abs().flatten()
            keep = round(q / 100 * a.numel())
            m = torch.zeros(a.numel(), dtype=torch.bool)
            m[torch.argsort(a, descending=True, stable=True)[:keep]] = True
            masks[k] = m.view(base[k].shape)
        return masks
    total = sum(sizes)
    keep = round(q / 100 * total)
    if mode == "top":
        a = torch.cat([(tuned[k] - base[k]).abs().flatten() for k in names])
        chosen = torch.argsort(a, descending=True, stable=True)[:keep]
    elif mode == "random":
        chosen = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:keep]
    else:
        raise verify.UsageError(f"unknown keep mode {mode!r} (choose from: top, top-tensor, random)")
    flat = torch.zeros(total, dtype=torch.bool)
    flat[chosen] = True
    return {k: m.view(base[k].shape) for k, m in zip(names, torch.split(flat, sizes))}


def merged(base, tuned, masks):
    """Kept entries from tuned, the rest from base (a select: q = 100 is tuned and q = 0 base, bit for bit)."""
    return {k: torch.where(masks[k], tuned[k], base[k]) for k in base}


# ---- 4. compression --------------------------------------------------------------------------------------------------
def prune(weights, names, sparsity):
    """Global magnitude pruning: zero exactly round(sparsity% of N) entries with the smallest |w| over `names`."""
    sizes = [weights[k].numel() for k in names]
    a = torch.cat([weights[k].abs().flatten() for k in names])
    flat = torch.ones(a.numel(), dtype=torch.bool)
    flat[torch.argsort(a, stable=True)[:round(sparsity / 100 * a.numel())]] = False
    out = dict(weights)
    for k, m in zip(names, torch.split(flat, sizes)):
        out[k] = weights[k] * m.view(weights[k].shape)
    return out


def quantize(w, bits):
    """Round-to-nearest symmetric quantisation per output channel (row): w ~ scale * round(w / scale), |q| <= 2^(b-1)-1.
    Returns the dequantised weights and the per-row step (scale)."""
    qmax = 2 ** (bits - 1) - 1
    scale = w.abs().amax(dim=1, keepdim=True) / qmax
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.clamp(torch.round(w / safe), -qmax, qmax) * safe * (scale > 0), scale


def compressible(model, weights):
    """The weight matrices of the transformer blocks: 2-D, not the (possibly tied) embedding or output head."""
    skip = {id(model.get_input_embeddings().weight)}
    if model.get_output_embeddings() is not None:
        skip.add(id(model.get_output_embeddings().weight))
    params = dict(model.named_parameters())
    return [k for k, w in weights.items() if w.dim() == 2 and id(params[k]) not in skip]


# ---- 3. forgetting: the embedded model's pretraining text ------------------------------------------------------------
@torch.no_grad()
def toy_lm_loss(model, tok, model_dir, sequences, seed=0):
    """Mean negative log-likelihood per completion token of fresh text from the embedded model's pretraining
    distribution (toy.py's generator, with the corpus mixture recorded in the model's toy_args.json)."""
    import random
    import toy  # the generator of that distribution lives in toy.py, which stands alone; only this measure needs it
    path = os.path.join(model_dir, "toy_args.json")
    saved = json.load(open(path)) if os.path.exists(path) else {}
    targs = toy.Args(**{k: v for k, v in saved.items() if k in {f.name for f in dataclasses.fields(toy.Args)}})
    targs.batch = min(256, sequences)
    rng, nll, count = random.Random(seed), 0.0, 0
    device = next(model.parameters()).device
    for _ in range(math.ceil(sequences / targs.batch)):
        ids, labels = toy.batch_tensors(rng, tok, targs)
        ids, labels = ids.to(device), labels.to(device)
        logits = model(input_ids=ids, attention_mask=(ids != tok.pad_token_id).long()).logits[:, :-1].float()
        target = labels[:, 1:]
        mask = target != -100
        logp = torch.log_softmax(logits, -1).gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        nll += float(-(logp * mask).sum())
        count += int(mask.sum())
    return nll / max(count, 1)


# ---- the run ---------------------------------------------------------------------------------------------------------
def parse_numbers(text, flag, lo, hi, kind=float):
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = None
    if values is None or not all(lo <= v <= hi for v in values):
        raise verify.UsageError(f"{flag} must be a comma list of numbers in [{lo}, {hi}]; got {text!r}")
    return values


def check_pair(base_model, base_tok, tuned_model, tuned_tok, args):
    """Two checkpoints of one architecture and one tokenizer, or a one-line error."""
    b = {k: tuple(p.shape) for k, p in base_model.named_parameters()}
    t = {k: tuple(p.shape) for k, p in tuned_model.named_parameters()}
    if base_model.config.model_type != tuned_model.config.model_type or b != t:
        diff = sorted(set(b.items()) ^ set(t.items()))
        raise verify.UsageError(f"--base {args.base} and --tuned {args.tuned} are different architectures "
                                f"({base_model.config.model_type} vs {tuned_model.config.model_type}"
                                + (f"; e.g. {diff[0][0]}" if diff else "") + ")")
    if base_tok.get_vocab() != tuned_tok.get_vocab():
        raise verify.UsageError(f"--base {args.base} and --tuned {args.tuned} have different tokenizers")


def run(args):
    passk.check_fields(args)
    device = passk.check_device(args.device)
    keep = parse_numbers(args.keep, "--keep", 0, 100)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"top", "top-tensor", "random"}:
        raise verify.UsageError(f"--modes must be a comma list of top, top-tensor, random; got {args.modes!r}")
    thresholds = parse_numbers(args.thresholds, "--thresholds", 0, math.inf)
    sparsities = parse_numbers(args.prune, "--prune", 0, 100) if args.prune else []
    bits = parse_numbers(args.quant, "--quant", 2, 16, int) if args.quant else []
    task = verify.get_task(args.task, args.data or None)
    embedded = args.task.split("?")[0]  # toy or toy4: one of this project's own models, else None
    embedded = embedded if embedded in FORGET else None
    forget_name = FORGET.get(embedded, "") if args.forget_task == "auto" else args.forget_task
    forget = verify.get_task(forget_name, args.forget_data or None) if forget_name else None
    saved = os.path.join(passk.resolve_model(args.base), "toy_args.json")
    if embedded and os.path.exists(saved):  # an embedded model knows its task: models/toy is not toy4's base
        built_for = json.load(open(saved)).get("task", "toy")
        if built_for != embedded:
            raise verify.UsageError(f"--base {args.base} was pretrained on {built_for}, not {embedded}: pass the "
                                    f"{embedded} model (models/{embedded}) as --base")
    passk.check_writable(args.out)
    if args.threads:
        torch.set_num_threads(args.threads)
    base_model, tok = passk.load_model(args.base, "fp32", device)
    tuned_model, tuned_tok = passk.load_model(args.tuned, "fp32", device)
    check_pair(base_model, tok, tuned_model, tuned_tok, args)
    base = {k: p.detach().cpu().clone() for k, p in base_model.named_parameters()}
    tuned = {k: p.detach().cpu().clone() for k, p in tuned_model.named_parameters()}
    del tuned_model
    work = base_model  # every evaluated model is these weights written into one model object
    params = dict(work.named_parameters())
    held_out = task.examples("test", args.eval_problems, seed=1234)
    family = forget.examples("test", args.forget_problems or args.eval_problems, seed=1234) if forget else None
    records = []

    def evaluate(weights, t=task, examples=held_out, per_problem=False):
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(weights[k].to(p.device))
        summary, recs = passk.evaluate(work, tok, t, examples, n=args.eval_n, max_new_tokens=args.max_new_tokens,
                                       batch_size=args.batch_size, seed=args.seed)
        return {**{k: v for k, v in summary.items() if k.startswith("pass@") or k.endswith("entropy")
                   or k in ("mean_length", "reward", "problems")},
                **({"correct": [r["correct"] for r in recs]} if per_problem else {})}

    matrices = compressible(work, base)
    jobs = [("eval", "base", None), ("eval", "tuned", None)]
    jobs += [("keep", mode, q) for mode in modes for q in keep]
    jobs += [("compress", f"prune-{s:g}%", s) for s in sparsities] + [("compress", f"int{b}", b) for b in bits]
    jobs += [("forgetting", None, None)] if forget is not None or (embedded and args.lm_sequences) else []
    from tqdm import tqdm
    bar = tqdm(jobs, desc="sparsity", unit="eval", file=sys.stderr)
    for kind, name, value in bar:
        bar.set_postfix_str(f"{kind} {name or ''} {'' if value is None else value}")
        if kind == "eval":
            records.append({"kind": "eval", "model": name, **evaluate(base if name == "base" else tuned)})
        elif kind == "keep":
            records.append({"kind": "keep", "mode": name, "q": value,
                            **evaluate(merged(base, tuned, keep_masks(base, tuned, value, name, seed=args.seed)))})
        elif kind == "compress":
            for which, w in (("base", base), ("tuned", tuned)):
                if name.startswith("prune"):
                    c = prune(w, matrices, value)
                else:
                    c = {**w, **{k: quantize(w[k], value)[0] for k in matrices}}
                records.append({"kind": "compress", "method": name, "model": which, **evaluate(c)})
        else:
            for which, w in (("base", base), ("tuned", tuned)):
                rec = {"kind": "forgetting", "model": which}
                if forget is not None:
                    rec.update(task=forget_name, **{f"forget_{k}": v for k, v in  # per-problem: paired intervals
                                                    evaluate(w, forget, family, per_problem=True).items()})
                if embedded and args.lm_sequences:
                    with torch.no_grad():
                        for k, p in params.items():
                            p.copy_(w[k].to(p.device))
                    rec["lm_loss"] = toy_lm_loss(work, tok, passk.resolve_model(args.base), args.lm_sequences)
                records.append(rec)
    d = drift(base, tuned, thresholds)
    records.insert(0, {"kind": "drift", "base": args.base, "tuned": args.tuned, **d})
    add_retained(records)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sparsity.jsonl.tmp"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    os.replace(os.path.join(args.out, "sparsity.jsonl.tmp"), os.path.join(args.out, "sparsity.jsonl"))
    print_report(records, thresholds)
    plot(records, args.out)
    return records


MIN_GAIN = 0.01  # below this tuned-minus-base difference a retained share is noise divided by noise: not reported


def add_retained(records):
    """retained@k = (pass@k - base) / (tuned - base) on keep and compress records (compress: against the compressed
    base); None where the tuned model's gain at that k is under MIN_GAIN."""
    ev = {r["model"]: r for r in records if r["kind"] == "eval"}
    ks = [k for k in ev["base"] if k.startswith("pass@")]
    comp_base = {r["method"]: r for r in records if r["kind"] == "compress" and r["model"] == "base"}
    for r in records:
        if r["kind"] == "keep" or (r["kind"] == "compress" and r["model"] == "tuned"):
            ref = ev["base"] if r["kind"] == "keep" else comp_base[r["method"]]
            for k in ks:
                gain = ev["tuned"][k] - ev["base"][k]
                r[f"retained_{k}"] = (r[k] - ref[k]) / gain if abs(gain) >= MIN_GAIN else None


def first_q(records, mode, k, level=0.9):
    """Smallest q whose retained gain at k reaches level (None if none does)."""
    qs = sorted((r["q"], r.get(f"retained_{k}")) for r in records if r["kind"] == "keep" and r["mode"] == mode)
    return next((q for q, v in qs if v is not None and v >= level), None)


def q_text(q):
    """first_q's answer for a reader: '30%', or 'never'."""
    return "never" if q is None else f"{q:g}%"


def print_report(records, thresholds):
    d = records[0]["overall"]
    ev = {r["model"]: r for r in records if r["kind"] == "eval"}
    ks = [k for k in ev["base"] if k.startswith("pass@")]
    K = ks[-1]
    print(f"\ndrift: relative L2 {d['relative_l2']:.4g}  max |delta| {d['max_abs_delta']:.3g}  changed: fp32 "
          f"{d['changed_fp32']:.3f}, bf16-visible {d['changed_bf16']:.3f}")
    print("  |delta| > " + "  ".join(f"{t:g}: {d[f'above_{t:g}']:.3f} (bf16 {d[f'above_{t:g}_bf16']:.3f})"
                                     for t in thresholds))
    print("  relative L2 by module type: " + "  ".join(f"{k} {v['relative_l2']:.3g}"
                                                       for k, v in records[0]["by_type"].items()))
    print(f"\n{'':22s} {'pass@1':>7s} {K:>9s}")
    for m in ("base", "tuned"):
        print(f"{m:22s} {ev[m]['pass@1']:7.3f} {ev[m][K]:9.3f}")
    print(f"\nkeep (retained gain at pass@1 / {K}):")
    for r in (r for r in records if r["kind"] == "keep"):
        ret = [r.get(f"retained_{k}") for k in ("pass@1", K)]
        print(f"  {r['mode']:10s} q={r['q']:<6g} pass@1 {r['pass@1']:.3f}  {K} {r[K]:.3f}  retained "
              + " / ".join("-" if v is None else f"{v + 0.0:.2f}" for v in ret))
    for mode in dict.fromkeys(r["mode"] for r in records if r["kind"] == "keep"):
        print(f"  {mode}: 90% of the gain kept from q: {q_text(first_q(records, mode, 'pass@1'))} (pass@1), "
              f"{q_text(first_q(records, mode, K))} ({K})")
    comp = [r for r in records if r["kind"] == "compress"]
    if comp:
        print(f"\ncompression (base -> tuned, retained gain at pass@1 / {K}):")
        for r in (r for r in comp if r["model"] == "tuned"):
            b = next(x for x in comp if x["method"] == r["method"] and x["model"] == "base")
            ret = [r.get(f"retained_{k}") for k in ("pass@1", K)]
            print(f"  {r['method']:10s} pass@1 {b['pass@1']:.3f} -> {r['pass@1']:.3f}  {K} {b[K]:.3f} -> {r[K]:.3f}"
                  "  retained " + " / ".join("-" if v is None else f"{v + 0.0:.2f}" for v in ret))
    for r in (r for r in records if r["kind"] == "forgetting"):
        fk = [k for k in r if k.startswith("forget_pass@")]
        print(f"forgetting ({r['model']}): " + (f"lm_loss {r['lm_loss']:.4f}  " if "lm_loss" in r else "")
              + (f"{r['task']}: pass@1 {r['forget_pass@1']:.3f}  {fk[-1][7:]} {r[fk[-1]]:.3f}" if fk else ""))


def plot(records, out):
    plt = passk.pyplot("sparsity.py's plots")
    ev = {r["model"]: r for r in records if r["kind"] == "eval"}
    K = [k for k in ev["base"] if k.startswith("pass@")][-1]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, k in zip(axes, ("pass@1", K)):
        for mode in dict.fromkeys(r["mode"] for r in records if r["kind"] == "keep"):
            pts = sorted((r["q"], r.get(f"retained_{k}")) for r in records if r["kind"] == "keep" and r["mode"] == mode)
            ax.plot([q for q, v in pts if v is not None], [v for q, v in pts if v is not None], marker="o", label=mode)
        ax.set_xscale("symlog", linthresh=0.1)
        ax.axhline(1.0, color="gray", linestyle="--")
        ax.axhline(0.0, color="gray", linestyle=":")
        ax.set_xlabel("q: percent of |delta| kept")
        ax.set_ylabel("retained gain")
        ax.set_title(f"{k}: tuned {ev['tuned'][k]:.3f} vs base {ev['base'][k]:.3f}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "keep.png"), dpi=120)
    plt.close(fig)
    h = records[0]["histogram"]
    fig, ax = plt.subplots(figsize=(6, 3.8))
    edges = np.array(h["log10_edges"])
    ax.bar(edges[:-1], h["counts"], width=np.diff(edges), align="edge")
    ax.axvline(math.log10(1.5e-3), color="red", linestyle="--", label="1.5e-3 (the paper's threshold)")
    ax.set_yscale("log")
    ax.set_xlabel("log10 |delta|")
    ax.set_ylabel("weights")
    ax.set_title(f"|tuned - base| ({h['zeros']} exactly zero)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "delta_hist.png"), dpi=120)
    plt.close(fig)
    comp = [r for r in records if r["kind"] == "compress" and r["model"] == "tuned"]
    if comp:
        fig, ax = plt.subplots(figsize=(6, 3.8))
        x = np.arange(len(comp))
        for i, k in enumerate(("pass@1", K)):
            ax.bar(x + (i - 0.5) * 0.38, [r.get(f"retained_{k}") or 0 for r in comp], 0.38, label=k)
        ax.set_xticks(x, [r["method"] for r in comp])
        ax.axhline(1.0, color="gray", linestyle="--")
        ax.set_ylabel("retained gain (compressed tuned vs compressed base)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "compress.png"), dpi=120)
        plt.close(fig)


def main(args):
    try:
        return run(args)
    except verify.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def parse_args(argv=None):
    return passk.parse_flags(Args, argv, __doc__)


if __name__ == "__main__":
    main(parse_args())
