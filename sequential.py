"""sequential.py: the paper's GRPO-then-ES recipe as one command, any schedule of the two, and the switch-point sweep.

Ba et al. (arXiv 2608.27351) propose training GRPO first (for Pass@1) and ES second (for Pass@K), as a strategy; how
much GRPO to run before switching, whether the order can be reversed, and interleaving were left open. This script
runs any schedule of stages on one model in one process, each stage calling grpo.train or es.train with the model in
memory (none of their logic is copied), and sweeps the switch point at an equal budget of sampled generations.

    python sequential.py --schedule grpo:150,es:60                        # the paper's recipe
    python sequential.py --schedule es:50,grpo:50 --es-population 8 --out runs/es-grpo   # any es.py flag X: --es-X
    python sequential.py --schedule grpo:20,es:20,grpo:20,es:20 --out runs/inter        # interleaved
    python sequential.py --sweep --budget 192000 --switch 0,0.25,0.5,0.75,1 --order grpo-es,es-grpo,interleave

Output: OUT/stage-K-ALGO/ (each stage's run directory: its log and its final checkpoint, a loadable model, so
`passk.py --model OUT/stage-2-es` works and `passk.py --model OUT` loads the last stage), OUT/log.jsonl (every line of
every stage with `stage`, `algo`, `step`, and `generations`, `tokens`, `wall` cumulative across stages). The sweep
writes OUT/sweep.jsonl, OUT/sweep.png and one schedule directory per point under OUT/runs/.

Choices this script makes (the paper is silent on them):
- Stage 1 uses --seed itself, so a one-stage schedule is exactly `es.py` or `grpo.py` with the same flags; stage K > 1
  derives its own seed from (--seed, K) for its noise, prompts and rollouts, so that two ES stages of one schedule
  never reuse perturbations. Held-out evaluation uses the same problems and sampling stream in every stage and
  schedule (passk.EVAL_SEED): differences between evaluations are differences between models.
- Each stage starts a fresh optimizer: GRPO's AdamW state is not carried across an ES stage.
- The budget counts sampled generations as the logs do (ES: population x prompts x samples per iteration; GRPO:
  prompts x group per step); held-out evaluation is not counted. --switch s gives the order's first algorithm
  round(s * budget) generations and the second the rest; interleave alternates --blocks GRPO/ES blocks with the
  GRPO share s. Stages that round to zero iterations are dropped and neighbours of one algorithm merged, so s = 0
  and s = 1 are the pure runs, shared by all orders.
"""
import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field

import numpy as np
import torch.distributed as dist

import es
import grpo
import passk
import verify

ALGOS = {"es": es, "grpo": grpo}
SHARED = ("model", "task", "data", "seed", "max_new_tokens", "eval_every", "eval_n", "eval_problems", "eval_split",
          "eval_greedy", "eval_dtype", "device",
          "threads")  # every stage; every other es.py / grpo.py flag X is --es-X / --grpo-X
PER_STAGE = ("iterations", "out", "resume", "replay", "report_to", "run_name")  # set by the schedule (one tracker)


@dataclass
class Args:
    schedule: str = "grpo:150,es:60"
    """stages in order, ALGO:ITERATIONS joined by commas (ALGO grpo or es); the paper's recipe by default"""
    model: str = passk.DEFAULT_MODEL
    """hub id or local directory the first stage starts from; default: the embedded model (models/toy)"""
    task: str = "toy"
    """countdown, gsm8k, math, toy, toy4, or rg:NAME (reasoning-gym); options after '?', e.g. toy?min_target=100"""
    data: str = ""
    """local data file for the task (jsonl or a json list); gsm8k and math default to the bundled data/ files"""
    seed: int = 0
    """run seed (stage 1 uses it, later stages derive theirs from it); in [0, inf)"""
    max_new_tokens: int = 16
    """generation budget per completion, training and evaluation; in [1, inf)"""
    eval_every: int = 25
    """held-out Pass@k every this many iterations of a stage (and at the start and each stage's end); in [0, inf)"""
    eval_n: int = 16
    """samples per held-out problem (Pass@1..Pass@eval_n); in [1, inf)"""
    eval_problems: int = 200
    """held-out problems; in [1, inf)"""
    eval_split: str = "test"
    """problems of those evaluations: test (held out), or val where the task has one (toy4: tuning)"""
    eval_greedy: int = 0
    """greedy pass@1 at each evaluation too, on the first this many held-out problems (the T = 1 evaluation takes
    the first eval_problems of the same list); in [0, inf)"""
    eval_dtype: str = "fp32"
    """weights dtype of the held-out evaluations, the same for every method (fp32: the saved model, exact); one of
    {fp32, bf16}"""
    device: str = ""
    """cpu, cuda, cuda:N ('': cuda when available, else cpu; under torchrun cuda means cuda:LOCAL_RANK)"""
    threads: int = 0
    """torch CPU threads per process (0: cores / local processes); in [0, inf)"""
    report_to: str = ""
    """live trackers, one run per schedule across its stages: comma list of none, tensorboard, trackio, wandb ('':
    none, or with --resume the saved run's)"""
    run_name: str = ""
    """the schedule's name in the trackers ('': the --out folder's name; a sweep adds each point's name)"""
    out: str = "runs/sequential"
    """run directory: args.json, log.jsonl, stage-K-ALGO/ (and with --sweep: sweep.jsonl, sweep.png, runs/)"""
    resume: str = ""
    """continue the schedule or sweep saved in this directory (its settings; --device and --threads may change)"""
    sweep: bool = False
    """run one schedule per --switch fraction (and order, and seed) at an equal budget instead of --schedule"""
    budget: int = 192000
    """sweep: sampled generations per schedule (the default is 50 ES iterations of es.py's defaults); in [1, inf)"""
    switch: str = "0,0.25,0.5,0.75,1"
    """sweep: comma list of the first algorithm's share of the budget, each in [0, 1]"""
    order: str = "grpo-es"
    """sweep: comma list of orders, each grpo-es, es-grpo or interleave (GRPO and ES blocks alternating)"""
    blocks: int = 2
    """sweep with interleave: GRPO/ES pairs of blocks the budget is split into; in [1, inf)"""
    seeds: str = ""
    """sweep: comma list of run seeds, for the spread over seeds ('': --seed only)"""
    es: dict = field(default_factory=dict)
    """es.py flags given as --es-X (population, sigma, alpha, noise, ...)"""
    grpo: dict = field(default_factory=dict)
    """grpo.py flags given as --grpo-X (group, lr, prompts, ...)"""


# ---- schedules ------------------------------------------------------------------------------------------------------
def parse_schedule(text):
    """'grpo:150,es:60' -> [('grpo', 150), ('es', 60)]; anything else is a one-line UsageError."""
    stages = []
    for part in text.split(","):
        algo, _, count = part.strip().partition(":")
        if algo not in ALGOS or not count.strip().isdecimal() or int(count) < 1:
            raise verify.UsageError(f"--schedule must be ALGO:ITERATIONS,... with ALGO grpo or es and ITERATIONS >= 1; "
                                    f"got {part.strip()!r} in {text!r}")
        stages.append((algo, int(count)))
    return stages


def schedule_text(stages):
    return ",".join(f"{a}:{n}" for a, n in stages)


def merge_stages(stages):
    """Drop zero-iteration stages and join neighbours of one algorithm (es:10,es:10 is es:20)."""
    out = []
    for algo, n in stages:
        if n > 0:
            out = out[:-1] + [(algo, out[-1][1] + n)] if out and out[-1][0] == algo else out + [(algo, n)]
    return out


def budget_schedule(order, s, budget, per_iteration, blocks):
    """The schedule of one sweep point: per_iteration = {algo: generations per iteration or step}."""
    def iters(algo, share):
        return round(share * budget / per_iteration[algo])
    if order == "grpo-es":
        return merge_stages([("grpo", iters("grpo", s)), ("es", iters("es", 1 - s))])
    if order == "es-grpo":
        return merge_stages([("es", iters("es", s)), ("grpo", iters("grpo", 1 - s))])
    block = [("grpo", iters("grpo", s / blocks)), ("es", iters("es", (1 - s) / blocks))]
    return merge_stages(block * blocks)


def stage_args(args, k, algo, iterations, start_model, out):
    """Stage k's es.Args / grpo.Args: the shared flags, the --ALGO-X overrides, its seed, its place on disk."""
    seed = args.seed if k == 1 else es.stream_seed(args.seed, "stage", k) % 2 ** 31
    values = {**{f: getattr(args, f) for f in SHARED}, **getattr(args, algo), "seed": seed, "iterations": iterations,
              "model": start_model, "out": os.path.join(out, f"stage-{k}-{algo}"), "resume": ""}
    return ALGOS[algo].Args(**values)


def stage_done(module, stage_out):
    """Iterations saved in a stage's latest checkpoint (None: the stage has not saved one)."""
    ckpt = module.latest_checkpoint(stage_out)
    return module.read_checkpoint(ckpt)[1]["iteration"] if ckpt else None


# ---- one schedule ---------------------------------------------------------------------------------------------------
def merge_logs(args, stages, out, upto=None):
    """OUT/log.jsonl from the stages' own logs: each line gets stage, algo, step (iterations so far, all stages), and
    generations / tokens / wall cumulative across stages (eval lines: the counts when they were taken).
    upto=K: write nothing, return the offset that stage K's lines get (what stages 1..K-1 ran)."""
    lines = [{"type": "config", "algo": "sequential", "schedule": schedule_text(stages),
              **{k: v for k, v in dataclasses.asdict(args).items() if k not in ("schedule",)}}]
    offset = {"generations": 0, "tokens": 0, "wall": 0.0, "step": 0}
    for k, (algo, n) in enumerate(stages, 1):
        records = es.read_log(os.path.join(out, f"stage-{k}-{algo}", "log.jsonl"))
        if k == upto or not records:
            break
        last = {"generations": 0, "tokens": 0, "wall": 0.0}
        for r in records:
            if r.get("type") == "config":
                lines.append({"type": "stage", "stage": k, "algo": algo, "iterations": n, "seed": r["seed"]})
                continue
            if r.get("type") == "train":
                last = {key: r[key] for key in last}
            lines.append({**r, "stage": k, "algo": algo, "step": offset["step"] + r["iteration"],
                          **{key: offset[key] + last[key] for key in last}})
        offset = {**{key: offset[key] + last[key] for key in last}, "step": offset["step"] + n}
    if upto is not None:
        return offset
    with open(os.path.join(out, "log.jsonl.tmp"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in lines)
    os.replace(os.path.join(out, "log.jsonl.tmp"), os.path.join(out, "log.jsonl"))
    return lines


def open_tracker(args, stages, out, run_name):
    """One passk.Tracker for the whole schedule (--report-to; rank 0), its x axis the merged log's step; None when
    every stage is already done. When the schedule continues after a stop, tensorboard hides what the stopped run
    logged past its last checkpoint."""
    total = sum(n for _, n in stages)
    done = total  # steps saved so far, up to the first stage still to (re)run
    for k, (algo, n) in enumerate(stages, 1):
        saved = stage_done(ALGOS[algo], os.path.join(out, f"stage-{k}-{algo}"))
        if saved != n:
            done = merge_logs(args, stages, out, upto=k)["step"] + (saved or 0)
            break
    config = {"algo": "sequential", **dataclasses.asdict(args), "schedule": schedule_text(stages)}
    return passk.open_tracker(dataclasses.replace(args, out=out, run_name=run_name), config,
                              passk.redo_from(done, total), int(os.environ.get("RANK", "0")))


def run_schedule(args, stages, out, run_name=""):
    """Run (or continue) the stages in out/: a finished stage is skipped, a killed one resumed from its checkpoint,
    the next one started from the model in memory. Returns the merged log lines."""
    rank = int(os.environ.get("RANK", "0"))  # torchrun's (the process group itself starts in the first stage)
    model = tok = None
    start = args.model
    tracker = open_tracker(args, stages, out, run_name or args.run_name)
    for k, (algo, n) in enumerate(stages, 1):
        module, a = ALGOS[algo], stage_args(args, k, algo, n, start, out)
        done = stage_done(module, a.out)
        if tracker is not None:  # stage k's records go to the trackers at the merged log's step and counters
            tracker.offset = merge_logs(args, stages, out, upto=k)
        if done == n:  # finished before a resume: the next stage starts from its checkpoint
            model = None
        elif done is not None:  # killed inside this stage: its own --resume continues it exactly
            model, tok = module.train(dataclasses.replace(a, resume=a.out), tracker=tracker)
        else:
            if model is None:  # the first stage, or the first one run after a resume (train moves it to its device)
                model, tok = passk.load_model(start, "fp32", "cpu")
            model, tok = module.train(a, model, tok, evaluate_start=(k == 1), tracker=tracker)
        start = a.out  # the next stage's --model: this stage's final checkpoint (what `model` holds in memory)
        if rank == 0:
            merge_logs(args, stages, out)
        if dist.is_initialized():
            dist.barrier()  # every rank reads the merged log below
    if tracker is not None:
        tracker.close()
    return es.read_log(os.path.join(out, "log.jsonl"))


def summary(lines):
    """The schedule's final held-out evaluation and its totals."""
    last_eval = [r for r in lines if r.get("type") == "eval"][-1]
    totals = [r for r in lines if r.get("type") == "train"][-1]
    keep = {k: v for k, v in last_eval.items() if k.startswith("pass@") or k.endswith("entropy") or k == "mean_length"}
    return {**keep, "generations": totals["generations"], "tokens": totals["tokens"], "wall": totals["wall"]}


# ---- the sweep ------------------------------------------------------------------------------------------------------
def sweep_lists(args):
    """(switches, orders, seeds) of the sweep flags; a malformed list is a UsageError."""
    switches = parse_list(args.switch, float, "--switch", lambda x: 0 <= x <= 1, "in [0, 1]")
    orders = parse_list(args.order, str, "--order", lambda x: x in ("grpo-es", "es-grpo", "interleave"),
                        "grpo-es, es-grpo or interleave")
    seeds = parse_list(args.seeds, int, "--seeds", lambda x: x >= 0, ">= 0") if args.seeds else [args.seed]
    return switches, orders, seeds


def sweep(args):
    switches, orders, seeds = sweep_lists(args)
    rank = int(os.environ.get("RANK", "0"))
    per_it = {}
    for algo in ALGOS:
        a = stage_args(args, 1, algo, 1, args.model, args.out)
        per_it[algo] = (a.population * a.prompts * (a.samples if a.temperature > 0 else 1) if algo == "es"
                        else a.prompts * a.group)
    records, done, base = [], {}, None
    points = [(seed, order, s) for seed in seeds for order in orders for s in switches]
    for i, (seed, order, s) in enumerate(points, 1):
        stages = budget_schedule(order, s, args.budget, per_it, args.blocks)
        if not stages:
            raise verify.UsageError(f"--budget {args.budget} is too small for one iteration of either algorithm")
        text = schedule_text(stages)
        name = f"{text.replace(':', '-').replace(',', '_')}-seed{seed}"
        if (text, seed) not in done:
            if rank == 0:
                print(f"[sweep {i}/{len(points)}] order {order}  switch {s}  seed {seed}:  {text}", flush=True)
            lines = run_schedule(dataclasses.replace(args, seed=seed), stages, os.path.join(args.out, "runs", name),
                                 f"{args.run_name or os.path.basename(os.path.normpath(args.out))}/{name}")
            done[text, seed] = summary(lines)
            base = base or next(r for r in lines if r.get("type") == "eval")
        grpo_share = s if order in ("grpo-es", "interleave") else 1 - s
        records.append({"switch": s, "order": order, "seed": seed, "schedule": text, "grpo_share": grpo_share,
                        "run": name, **done[text, seed]})
        if rank == 0:
            write_jsonl(os.path.join(args.out, "sweep.jsonl"), records)
    ks = sorted(int(k[5:]) for k in records[0] if k.startswith("pass@"))
    base_curve = {k: base[f"pass@{k}"] for k in ks}
    if rank == 0:
        print_table(records, ks, base_curve)
        plot_sweep(records, ks, base_curve, os.path.join(args.out, "sweep.png"))
    return records


def parse_list(text, kind, flag, ok, rule):
    try:
        values = [kind(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or not all(ok(v) for v in values):
        raise verify.UsageError(f"{flag} must be a comma list, each {rule}; got {text!r}")
    return values


def write_jsonl(path, records):
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    os.replace(path + ".tmp", path)


def grouped(records):
    """{(order, switch): [records over seeds]} in the sweep's order."""
    groups = {}
    for r in records:
        groups.setdefault((r["order"], r["switch"]), []).append(r)
    return groups


def print_table(records, ks, base):
    K = ks[-1]
    print(f"\nbase model: pass@1 {base[1]:.3f}  pass@{K} {base[K]:.3f}")
    print(f"{'order':11s} {'switch':>6s}  {'schedule':28s} {'pass@1':>13s} {f'pass@{K}':>13s} {'ans H':>6s} "
          f"{'tok H':>6s} {'generations':>11s} {'wall s':>7s}")
    for (order, s), rs in grouped(records).items():
        def cell(key):
            v = [r[key] for r in rs]
            return f"{np.mean(v):.3f}" + (f" ±{np.std(v, ddof=1):.3f}" if len(v) > 1 else " " * 7)
        print(f"{order:11s} {s:6.2f}  {rs[0]['schedule']:28s} {cell('pass@1'):>13s} {cell(f'pass@{K}'):>13s} "
              f"{np.mean([r['answer_entropy'] for r in rs]):6.2f} {np.mean([r['token_entropy'] for r in rs]):6.3f} "
              f"{np.mean([r['generations'] for r in rs]):11.0f} {np.mean([r['wall'] for r in rs]):7.0f}")


def plot_sweep(records, ks, base, path):
    """Pass@1 and Pass@K against the GRPO share of the budget, one line per order, the base model dashed."""
    plt = passk.pyplot("--sweep")
    K = ks[-1]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, k in zip(axes, (1, K)):
        for order in dict.fromkeys(r["order"] for r in records):
            pts = [(rs[0]["grpo_share"], [r[f"pass@{k}"] for r in rs]) for (o, _), rs in grouped(records).items()
                   if o == order]
            pts.sort()
            ax.errorbar([x for x, _ in pts], [np.mean(v) for _, v in pts], marker="o", capsize=3, label=order,
                        yerr=[np.std(v, ddof=1) if len(v) > 1 else 0 for _, v in pts])
        ax.axhline(base[k], color="gray", linestyle="--", label="base")
        ax.set_xlabel("GRPO share of the generation budget")
        ax.set_title(f"held-out pass@{k}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- command line ----------------------------------------------------------------------------------------------------
def check_args(args):
    """Own flags against their docs' rules, then each stage's flags (named --ALGO-X) against es.py's / grpo.py's."""
    passk.check_fields(args)
    passk.parse_report_to(args.report_to)
    passk.check_device(args.device)
    # the held-out problems drawn here, as the stages draw them: a split the task lacks, one too small for them, or a
    # range none reaches fails before args.json is written
    passk.held_out_problems(verify.get_task(args.task, args.data or None), args.eval_split, args.eval_problems,
                            args.eval_greedy)
    stages = [] if args.sweep else parse_schedule(args.schedule)
    for algo, module in ALGOS.items():
        unknown = set(getattr(args, algo)) - {f.name for f in dataclasses.fields(module.Args)} - set(SHARED + PER_STAGE)
        if unknown:
            raise verify.UsageError(f"unknown stage flag --{algo}-{sorted(unknown)[0].replace('_', '-')}")
        a = stage_args(args, 1, algo, 1, args.model, args.out)
        passk.check_fields(a, prefix=f"--{algo}-")  # so that a bad value is named by its --ALGO-X flag
        if algo == "es":
            es.check_args(a)
        else:
            grpo.check_args(a, int(os.environ.get("WORLD_SIZE", "1")))
    if args.sweep:
        sweep_lists(args)
    passk.check_writable(args.out)
    return stages


def main(args):
    rank = int(os.environ.get("RANK", "0"))  # torchrun's; the process group starts in the first stage
    try:
        if args.resume:
            path = os.path.join(args.resume, "args.json")
            try:
                with open(path) as f:
                    saved = json.load(f)
            except (OSError, ValueError) as e:
                raise verify.UsageError(f"--resume: cannot read {path} ({e}); nothing was changed") from None
            free, default = ("resume", "out", "device", "threads", "report_to", "run_name"), Args()
            changed = [k for k, v in dataclasses.asdict(args).items() if k not in free
                       and v != getattr(default, k) and v != saved.get(k)]
            if changed:
                raise verify.UsageError(f"--resume continues the saved run; only --device, --threads, --report-to and "
                                        f"--run-name may change (got --{changed[0].replace('_', '-')})")
            args = Args(**{**saved, "resume": args.resume, "out": args.resume,
                           **{k: getattr(args, k) or saved.get(k, getattr(default, k))
                              for k in ("device", "threads", "run_name", "report_to")}})
        elif os.path.exists(os.path.join(args.out, "args.json")) and rank == 0:
            raise verify.UsageError(f"{args.out} already holds a run: --resume {args.out} to continue it, "
                                    f"or a new --out")
        stages = check_args(args)
        if rank == 0:  # rewritten on --resume too: the flags that may change (--report-to, ...) hold from now on
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "args.json.tmp"), "w") as f:
                json.dump(dataclasses.asdict(dataclasses.replace(args, resume="")), f, indent=1)
            os.replace(os.path.join(args.out, "args.json.tmp"), os.path.join(args.out, "args.json"))
        dtypes = (args.eval_dtype, args.es.get("dtype", "fp32"), args.grpo.get("dtype", "fp32"))
        with passk.bf16_products(args.device, *dtypes):  # bf16 on a CPU without bf16 support: fp32 products
            if args.sweep:
                return sweep(args)
            lines = run_schedule(args, stages, args.out)
        s = summary(lines)
        if rank == 0:
            print(f"schedule {args.schedule}: " + "  ".join(f"{k}={v:.3f}" for k, v in s.items()
                                                            if k.startswith("pass@"))
                  + f"  generations={s['generations']}  wall={s['wall']:.0f}s")
        return lines
    except verify.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (es.RunError, grpo.RunError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


def parse_args(argv=None):
    """Own flags, then --es-X for every es.py flag X and --grpo-X for every grpo.py flag X (not the shared ones)."""
    p = passk._Parser(description=__doc__.split("\n")[0])
    passk.add_flags(p, Args)
    for algo, module in ALGOS.items():
        passk.add_flags(p, module.Args, prefix=f"{algo}-", skip=SHARED + PER_STAGE)
    ns, defaults = vars(p.parse_args(argv)), {a: module.Args() for a, module in ALGOS.items()}
    own = {f.name: ns.pop(f.name) for f in dataclasses.fields(Args) if f.name in ns}
    overrides = {a: {k[len(a) + 1:]: v for k, v in ns.items() if k.startswith(a + "_")
                     and v != getattr(defaults[a], k[len(a) + 1:])} for a in ALGOS}
    return Args(**own, **overrides)


if __name__ == "__main__":
    main(parse_args())
