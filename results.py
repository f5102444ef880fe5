"""results.py: every claim of the paper, measured on an embedded model with headroom, with a verdict; writes RESULTS.md,
results/summary.json and the plots.

Ba et al. (arXiv 2608.27351) claim that ES, unlike GRPO, raises Pass@1 and Pass@K; that the verifier-projected JS
diversity of the ES population explains it; that GRPO then ES combines the two; that ES's large drift hides a sparse
functional change without forgetting; and that larger models need smaller populations. This script measures each
claim through the project's own scripts (sequential.py runs every schedule, sparsity.py the weight analysis, passk.py
every evaluation), in the order of RESULTS.md, one function per section:

    0. tune             a grid per method (the same number of trials), scored on the val split by a fixed rule
    1. claim_passk      base, GRPO, ES, GRPO->ES, ES->GRPO at equal updates and at equal generations, over seeds
    2. claim_diversity  JS diversity of the ES population against the Pass@K gain, across every ES run
    3. claim_sequential the schedules against GRPO, and the switch-point sweep
    4. claim_sparsity   drift, keep-curves, forgetting, compression: ES against GRPO at a matched pass@1 gain,
                        over seeds
    5. claim_population population size against model size, until the choice is not at the grid's edge
    6. question_cost    generations and seconds to a matched quality; memory of one step
    7. question_temperature  does sampling hotter recover coverage from each model, over seeds
    8. question_llm     the SmolLM2 runs of docs/llm.md (tuned ES and GRPO), from their logs in results/llm/recipe/;
                        llm_stall: does ES stop moving, and why; llm_followups: the runs made about it (recipe/
                        followup/); then the earlier study's in results/llm/

Every section returns plain data; `collect` puts it in summary.json and `render` writes RESULTS.md and the plots from
summary.json alone (`--render` does only that, from a fresh clone).

    python results.py              # 90 minutes on 2 CPU cores (two processes); resumable: finished runs are reused
    python results.py --render     # RESULTS.md and results/*.png again from results/summary.json, no runs
    python results.py --llm        # section 8 again from the SmolLM2 logs in results/llm/, no runs
    python results.py --quick      # the same pipeline, tiny (a test runs it); writes to --out, not RESULTS.md

Verdict rule (fixed before the runs): the difference of the means over seeds (paired by seed where both arms are
trained) with the half-width of its 95% t interval; "holds" when the interval lies on the claimed side of 0, "does not
hold" when it lies on the other side, "within noise" when it contains 0. The half-width is printed beside every
verdict: it is the smallest difference the run could have detected. Tuning rule: the final val pass@1 of a trial, ties
(equal to 3 decimals) broken by val pass@16, then by grid order.
"""
import dataclasses
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

import es
import passk
import sequential
import sparsity
import verify

HERE = os.path.dirname(os.path.abspath(__file__))
ARMS = ("grpo", "es", "grpo-es", "es-grpo")  # with the base model, the paper's five arms
BUDGETS = ("equal-updates", "equal-generations")
LABEL = {"base": "base", "grpo": "GRPO", "es": "ES", "grpo-es": "GRPO->ES", "es-grpo": "ES->GRPO"}
SIZE_FIELDS = ("es_population", "es_prompts", "grpo_prompts", "grpo_group", "val_problems")  # in every run's name
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 11: 2.20,
       12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 16: 2.12, 17: 2.11, 18: 2.10, 19: 2.09, 20: 2.09, 25: 2.06, 30: 2.04}
MARGIN = 0.02  # "keeps pass@1": not lower by more than this (fixed before the runs; the evaluation resolves it)


@dataclass
class Args:
    out: str = "runs/results"
    """working directory: every run, evaluation and cached model (reused when the script is run again)"""
    doc: str = "RESULTS.md"
    """the report to write; summary.json goes in --figures beside it"""
    figures: str = "results"
    """folder for summary.json and the report's PNG plots (relative to the report)"""
    quick: bool = False
    """the whole pipeline at toy sizes, to test it (the figures mean nothing); writes OUT/RESULTS.md"""
    render: bool = False
    """write RESULTS.md and the plots from the figures folder's summary.json only: no runs"""
    task: str = "toy4"
    """the headline task (headroom: the base model's held-out pass@64 is 0.73); it needs a val split"""
    model: str = os.path.join(HERE, "models", "toy4")
    """the headline base model (relative to the repository, or a hub id)"""
    seeds: str = "0,1,2,3,4"
    """comma list of training seeds of every headline arm, at both budgets"""
    sweep_seeds: str = "0,1,2"
    """comma list of training seeds of the switch-point sweep and of every population-size cell"""
    updates: int = 60
    """U: ES iterations = GRPO steps at the equal-updates budget; the equal-generations budget is U ES iterations'
    generations; in [2, inf)"""
    es_population: int = 16
    """N, ES members per iteration (every ES run but the population study); in [2, inf)"""
    es_prompts: int = 32
    """training prompts per ES iteration, scored greedily by every member; in [1, inf)"""
    grpo_prompts: int = 8
    """prompts per GRPO step; in [1, inf)"""
    grpo_group: int = 8
    """completions per prompt (GRPO's group); in [2, inf)"""
    es_sigmas: str = "0.02,0.04,0.08"
    """ES tuning grid: perturbation scales sigma"""
    es_alphas: str = "0.004,0.008,0.02"
    """ES tuning grid: step sizes alpha"""
    grpo_lrs: str = "3e-5,1e-4,3e-4"
    """GRPO tuning grid: learning rates (tuned again for each budget: the steps differ)"""
    grpo_betas: str = "0,0.01,0.04"
    """GRPO tuning grid: KL coefficients beta"""
    val_problems: int = 100
    """val problems of every in-training evaluation (n = 16): the tuning scores and the validation curves"""
    eval_problems: int = 200
    """held-out test problems of every final evaluation; in [1, inf)"""
    eval_n: int = 64
    """samples per problem of the final evaluations (Pass@1..Pass@eval_n, maj@k); in [16, inf)"""
    switches: str = "0.25,0.75"
    """switch points of the GRPO->ES sweep at equal generations (share of the budget spent on GRPO; 0, 0.5 and 1 are
    the headline ES, GRPO->ES and GRPO runs)"""
    temperatures: str = "0.6,1.0,1.3"
    """comma list of sampling temperatures for the inference-time diversity study"""
    sizes: str = "64x2,96x3,128x4"
    """comma list of HIDDENxLAYERS: model sizes for population against model size (toy.py builds those that are not
    --model)"""
    size_steps: int = 900
    """toy.py pretraining steps (batch 256) for those sizes, as for models/toy4; in [1, inf)"""
    populations: str = "4,8,16,32"
    """comma list of ES population sizes N for population against model size (extended by doubling at the edge)"""
    max_population: int = 64
    """the largest N the population grid may extend to; in [2, inf)"""
    pop_iterations: int = 20
    """ES iterations of each population-size run; in [1, inf)"""
    lr_divisors: str = "10,100"
    """GRPO learning rates below the tuned one for the sparsity comparison (tuned lr / each)"""
    sparsity_seeds: str = "0,1,2,3,4"
    """seeds of the equal-updates ES runs the sparsity claims are decided over (each against GRPO of its seed)"""
    forget_problems: int = 1000
    """unseen-family problems of the forgetting measurement (n = 16 each); in [1, inf)"""
    llm_runs: str = os.path.join(HERE, "results", "llm", "recipe")
    """folder of docs/llm.md's SmolLM2 logs (tune/NAME/ and METHOD-seedS/, each a log.jsonl); reported when present"""
    llm_earlier: str = os.path.join(HERE, "results", "llm")
    """folder of the earlier SmolLM2 study (the same layout), reported after --llm-runs' and marked as earlier ('':
    none)"""
    llm: bool = False
    """only refresh summary.json's llm, llm_tuning, llm_verdicts, llm_stall, llm_followups and llm_earlier from
    --llm-runs and --llm-earlier, then write RESULTS.md and the plots"""
    workers: int = 2
    """processes sharing the runs through lock files (this one and workers - 1 helpers it starts; a helper, 0, makes
    runs and writes no report); in [0, inf)"""
    threads: int = 0
    """torch CPU threads per process (0: the cores / workers); in [0, inf)"""


# ---- small statistics ------------------------------------------------------------------------------------------------
def interval(values):
    """(mean, half-width of the 95% t interval), the half-width None with fewer than two values."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return float(v.mean()), None
    t = T95[max(d for d in T95 if d <= len(v) - 1)]  # the next tabled df down: a larger t, conservative
    return float(v.mean()), t * float(v.std(ddof=1)) / math.sqrt(len(v))


def crossed_interval(diffs):
    """(mean, half-width of its 95% interval) of a [seeds, problems] table of paired differences: the variance of the
    mean is that of the per-problem means over problems plus that of the per-seed means over seeds (the seeds'
    training noise, which every problem shares, would not show in the first), the t quantile at the
    Welch-Satterthwaite degrees of freedom of the sum (few seeds and a large seed term give a wide interval)."""
    d = np.asarray(diffs, dtype=float)
    S, P = d.shape
    a = d.mean(axis=0).var(ddof=1) / P if P > 1 else 0.0
    b = d.mean(axis=1).var(ddof=1) / S if S > 1 else 0.0
    if a + b == 0:
        return float(d.mean()), (0.0 if S * P > 1 else None)
    df = (a + b) ** 2 / ((a * a / (P - 1) if P > 1 else 0.0) + (b * b / (S - 1) if S > 1 else 0.0))
    return float(d.mean()), T95[max([k for k in T95 if k <= df] or [1])] * math.sqrt(a + b)


def verdict(claim, diffs, direction=1, margin=0.0):
    """{claim, verdict, difference, half_width, seeds} for 'direction * difference > -margin' (direction +1 / -1;
    margin > 0: a non-inferiority claim, 'not lower by more than margin'). diffs: one value per seed, or a [seeds,
    problems] table (crossed_interval)."""
    m, h = crossed_interval(diffs) if np.ndim(diffs) == 2 else interval(diffs)
    if h is None:
        word = "not testable here (one seed)"
    else:
        lo, hi = sorted((direction * (m - h) + margin, direction * (m + h) + margin))
        word = "holds" if lo > 0 else "does not hold" if hi < 0 else "within noise"
    return {"claim": claim, "verdict": word, "difference": m, "half_width": h, "seeds": len(diffs)}


def rank_correlation(x, y):
    """(Spearman rho, half-width of its 95% Fisher interval), None when it cannot be computed."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 4 or x.std() == 0 or y.std() == 0:
        return None, None
    def rank(v):  # average ranks: ties share theirs
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for value in np.unique(v):
            r[v == value] = r[v == value].mean()
        return r
    rho = float(np.corrcoef(rank(x), rank(y))[0, 1])
    z, h = math.atanh(max(min(rho, 0.999999), -0.999999)), 1.96 / math.sqrt(len(x) - 3)
    return rho, (math.tanh(z + h) - math.tanh(z - h)) / 2


def best_trial(trials):
    """The tuning rule: the highest final val pass@1 (3 decimals), then pass@16, then the first in grid order."""
    key = lambda t: (round(t["score"]["pass@1"], 3), round(t["score"]["pass@16"], 3))  # noqa: E731
    best = max(key(t) for t in trials)
    return next(t for t in trials if key(t) == best)


def fmt(m, h=None, digits=3):
    return "-" if m is None else f"{m:.{digits}f}" + (f" ± {h:.{digits}f}" if h is not None else "")


def numbers(text):
    return [float(x) for x in text.split(",") if x.strip()]


# ---- the runs and evaluations, cached in OUT ------------------------------------------------------------------------
class Runs:
    """Every training run and evaluation the report needs, each made once: a run's folder is named by its full
    configuration, so two sections asking for the same run share it, and a rerun (or a resume) reuses it."""

    def __init__(self, args):
        self.args, self.used = args, set()  # used: the cache entries this report reads
        self.task = verify.get_task(args.task)
        self.test = self.task.examples("test", args.eval_problems, seed=1234)
        q = args.quick
        self.es_cfg = dict(population=args.es_population, prompts=args.es_prompts, save_every=0)
        self.grpo_cfg = dict(prompts=args.grpo_prompts, group=args.grpo_group, save_every=0)
        self.per_it = {"es": args.es_population * args.es_prompts, "grpo": args.grpo_prompts * args.grpo_group}
        self.sparsity_kw = (dict(eval_n=4, eval_problems=10, keep="0,10,100", prune="50", quant="4", lm_sequences=64)
                            if q else dict(eval_n=16, eval_problems=args.eval_problems, keep="0,0.3,1,3,10,30,100",
                                           modes="top,random", lm_sequences=512))

    def path(self, *parts):
        p = os.path.join(self.args.out, *parts)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p

    def cached(self, name, fn, wait=True):
        """fn() once: its JSON result (and the seconds it took) is kept in OUT/cache/NAME.json. While one process
        makes it, NAME.json.lock holds its pid: another process waits for it (wait=False: returns None at once), and
        takes the lock over if that process is gone. So two `python results.py` share the work of one report."""
        path = self.path("cache", name + ".json")
        lock = path + ".lock"
        self.used.add(name + ".json")
        while not os.path.exists(path):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                try:
                    os.kill(int(open(lock).read() or 0), 0)  # the owner is alive (pid 0: still being written)
                except PermissionError:
                    pass  # alive, another user's
                except (ProcessLookupError, ValueError, FileNotFoundError):
                    try:  # a killed run's lock: take it over (its run resumes from its checkpoint). The rename is
                        os.rename(lock, f"{lock}.stale{os.getpid()}")  # atomic: one process wins, the other retries
                        os.remove(f"{lock}.stale{os.getpid()}")
                    except FileNotFoundError:
                        pass
                    continue
                if not wait:
                    return None
                time.sleep(1)
                continue
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            try:
                t0 = time.time()
                value = fn()
                with open(path + ".tmp", "w") as f:
                    json.dump({"value": value, "seconds": time.time() - t0}, f)
                os.replace(path + ".tmp", path)
            finally:
                if os.path.exists(lock):
                    os.remove(lock)
        with open(path) as f:
            return json.load(f)["value"]

    def all(self, fn, items):
        """[fn(item, wait=True) for item in items], after a first pass that makes what no other process is making."""
        for item in items:
            fn(item, wait=False)
        return [fn(item, wait=True) for item in items]

    def compute_minutes(self):
        """The recorded time of every run and evaluation behind this report (each measured when it was made)."""
        folder = os.path.join(self.args.out, "cache")
        total = 0.0
        for name in sorted(self.used):
            with open(os.path.join(folder, name)) as f:
                total += json.load(f).get("seconds", 0.0)
        return total / 60

    def schedule(self, stages, params, seed, model=None, population=None, eval_every=None, wait=True):
        """Train stages [(algo, iterations)] from model with params {es: {...}, grpo: {...}}; returns (folder, log).
        In-training evaluations: on val (n = 16, val_problems), about six times a stage or every eval_every updates.
        population: an ES population other than --es-population (the population study). wait=False: None when
        another process is making it."""
        model = model or self.args.model
        name = "-".join(f"{a}{n}" for a, n in stages) + "".join(
            f"-{k}{v:g}" for a in ("es", "grpo") if any(s[0] == a for s in stages) for k, v in params[a].items())
        name += ("" if population is None else f"-N{population}") + f"-seed{seed}" + "".join(
            f"-{f.replace('_', '')}{getattr(self.args, f)}" for f in SIZE_FIELDS
            if getattr(self.args, f) != getattr(Args, f))  # other per-iteration sizes than the defaults
        name += "" if model == self.args.model else "-" + os.path.basename(model.rstrip("/"))
        out = self.path("runs", name, "x")[:-2]
        es_cfg = {**self.es_cfg, **({} if population is None else {"population": population})}

        def go():
            every = {a: eval_every or max(1, n // 6) for a, n in stages}
            a = sequential.Args(schedule=sequential.schedule_text(stages), model=model, task=self.args.task, seed=seed,
                                eval_n=16, eval_split="val", eval_problems=self.args.val_problems,
                                threads=self.args.threads, out=out,
                                es={**es_cfg, **params.get("es", {}), "eval_every": every.get("es", 1)},
                                grpo={**self.grpo_cfg, **params.get("grpo", {}), "eval_every": every.get("grpo", 1)})
            print(f"[results] {name}", flush=True)
            sequential.run_schedule(a, stages, out)
            return {"done": True}
        if self.cached("train-" + name, go, wait) is None:
            return None
        return out, es.read_log(os.path.join(out, "log.jsonl"))

    def evaluate(self, model_dir, T=1.0, n=None, wait=True):
        """Pass@k, maj@k and entropies of one model on the held-out test problems at temperature T (cached)."""
        n = n or self.args.eval_n
        name = os.path.relpath(model_dir, self.args.out).replace(os.sep, "_") if model_dir != self.args.model else \
            "base"
        name += "" if len(self.test) == Args.eval_problems else f"-p{len(self.test)}"

        def go():
            model, tok = passk.load_model(model_dir)
            summary, records = passk.evaluate(model, tok, self.task, self.test, n=n, temperature=T, batch_size=512,
                                              seed=passk.EVAL_SEED, maj=True)
            return {"summary": summary, "correct": [r["correct"] for r in records]}
        r = self.cached(f"eval-{name}-n{n}-T{T:g}", go, wait)
        return r and r["summary"]


def evals(log):
    return [r for r in log if r["type"] == "eval"]


def val_score(log):
    last = evals(log)[-1]
    return {"pass@1": last["pass@1"], "pass@16": last["pass@16"]}


def curve(log):
    """[(updates so far, generations, training seconds, pass@1, pass@16, token entropy)] at each in-training eval."""
    return [[r["step"], r["generations"], r["wall"], r["pass@1"], r["pass@16"], r["token_entropy"]] for r in evals(log)]


# ---- 0. the budgets and the tuning -----------------------------------------------------------------------------------
def budgets(runs):
    """Iterations of each stage of each arm at each budget (GRPO->ES and ES->GRPO: half the budget each)."""
    U, per = runs.args.updates, runs.per_it
    G = U * per["es"]
    rest = lambda es_its: (G - es_its * per["es"]) // per["grpo"]  # GRPO steps the ES iterations leave  # noqa: E731
    out = {"equal-updates": {"grpo": [("grpo", U)], "es": [("es", U)],
                             "grpo-es": [("grpo", U // 2), ("es", U - U // 2)],
                             "es-grpo": [("es", U // 2), ("grpo", U - U // 2)]},
           "equal-generations": {"grpo": [("grpo", rest(0))], "es": [("es", U)],
                                 "grpo-es": [("grpo", rest(U - U // 2)), ("es", U - U // 2)],
                                 "es-grpo": [("es", U // 2), ("grpo", rest(U // 2))]}}
    return out, G


def tune(runs):
    """One grid per method, the same number of trials for each, every trial seed 0 scored on val by best_trial's
    rule. ES has one grid (its runs are the same at both budgets); GRPO one per budget (its step counts differ)."""
    a, (plan, _) = runs.args, budgets(runs)
    es_grid = [{"sigma": s, "alpha": al} for s in numbers(a.es_sigmas) for al in numbers(a.es_alphas)]
    grpo_grid = [{"lr": lr, "beta": b} for lr in numbers(a.grpo_lrs) for b in numbers(a.grpo_betas)]
    jobs = [("es", "both", plan["equal-updates"]["es"], p) for p in es_grid] + [
        ("grpo", b, plan[b]["grpo"], p) for b in BUDGETS for p in grpo_grid]
    done = runs.all(lambda j, wait: runs.schedule(j[2], {j[0]: j[3]}, 0, wait=wait), jobs)
    tuning = {"es": [], "grpo": []}
    for (algo, budget, _, p), (_, log) in zip(jobs, done):
        tuning[algo].append({"budget": budget, "params": p, "score": val_score(log)})
    chosen_es = best_trial(tuning["es"])["params"]
    chosen = {"es": {b: chosen_es for b in BUDGETS},
              "grpo": {b: best_trial([t for t in tuning["grpo"] if t["budget"] == b])["params"] for b in BUDGETS}}
    return {"tuning": tuning, "chosen": chosen, "trials": {"es": len(es_grid), "grpo": len(grpo_grid)}}


def params_for(chosen, budget):
    return {"es": chosen["es"][budget], "grpo": chosen["grpo"][budget]}


# ---- 1. Pass@1 and Pass@K of the five arms at both budgets -----------------------------------------------------------
def claim_passk(runs, chosen):
    """Every arm, seed and budget: the final held-out evaluation (n = eval_n, T = 1) and the val curve."""
    a, (plan, G) = runs.args, budgets(runs)
    base = runs.evaluate(a.model)
    arms, curves = [], {}
    jobs = [(b, seed, name) for b in BUDGETS for seed in [int(s) for s in a.seeds.split(",")] for name in ARMS]
    done = runs.all(lambda j, wait: runs.schedule(plan[j[0]][j[2]], params_for(chosen, j[0]), j[1], wait=wait), jobs)
    scores = runs.all(lambda d, wait: runs.evaluate(d[0], wait=wait), done)
    for (budget, seed, name), (folder, log), ev in zip(jobs, done, scores):
        train = [r for r in log if r["type"] == "train"]
        arms.append({"name": name, "budget": budget, "seed": seed,
                     "es_iterations": sum(n for al, n in plan[budget][name] if al == "es"),
                     "grpo_steps": sum(n for al, n in plan[budget][name] if al == "grpo"),
                     "generations": train[-1]["generations"], "train_seconds": train[-1]["wall"],
                     **{k: ev[k] for k in ev if k.startswith(("pass@", "maj@")) or k.endswith("entropy")}})
        curves[f"{name}|{budget}|{seed}"] = curve(log)
    K = a.eval_n
    verdicts = []
    for budget in BUDGETS:
        def diffs(name, key, other=None):
            mine = [r for r in arms if r["name"] == name and r["budget"] == budget]
            if other is None:
                return [r[key] - base[key] for r in mine]
            theirs = {r["seed"]: r[key] for r in arms if r["name"] == other and r["budget"] == budget}
            return [r[key] - theirs[r["seed"]] for r in mine]
        verdicts += [verdict(f"ES raises pass@1 over the base ({budget})", diffs("es", "pass@1")),
                     verdict(f"ES raises pass@{K} over the base ({budget})", diffs("es", f"pass@{K}")),
                     verdict(f"GRPO raises pass@1 over the base ({budget})", diffs("grpo", "pass@1")),
                     verdict(f"GRPO lowers pass@{K} below the base ({budget})", diffs("grpo", f"pass@{K}"), -1),
                     verdict(f"GRPO lowers token entropy ({budget})", diffs("grpo", "token_entropy"), -1),
                     verdict(f"ES beats GRPO at pass@{K} ({budget})", diffs("es", f"pass@{K}", "grpo"))]
    return {"base": base, "arms": arms, "curves": curves, "verdicts": verdicts, "generations": G,
            "plan": {b: {n: sequential.schedule_text(s) for n, s in plan[b].items()} for b in BUDGETS}}


# ---- 2. the mechanism: JS diversity of the population against the Pass@K gain ---------------------------------------
def claim_diversity(es_logs):
    """Across every ES-only run (tuning, headline seeds, population cells): the mean JS diversity of the population
    over training against the run's val pass@16 gain, Spearman rho with its Fisher interval."""
    points = []
    for key, log in es_logs.items():
        train, ev = [r for r in log if r["type"] == "train"], evals(log)
        if train and len(ev) >= 2:
            points.append({"run": key, "js": float(np.mean([r["js_diversity"] for r in train])),
                           "gain16": ev[-1]["pass@16"] - ev[0]["pass@16"]})
    rho, h = rank_correlation([p["js"] for p in points], [p["gain16"] for p in points])
    v = {"claim": "higher population JS diversity goes with a higher pass@16 gain (Spearman rho)", "difference": rho,
         "half_width": h, "runs": len(points),  # the interval is over runs; seeds: the training seeds they span
         "seeds": len({m.group(1) for p in points for m in [re.search(r"seed(\d+)", p["run"])] if m}),
         "verdict": "not testable here (too few runs or no spread)" if rho is None else
         "holds" if rho - h > 0 else "does not hold" if rho + h < 0 else "within noise"}
    return {"points": points, "rho": rho, "verdicts": [v]}


# ---- 3. GRPO first, then ES; the switch-point sweep ------------------------------------------------------------------
def claim_sequential(runs, chosen, passk_data):
    a, (plan, G) = runs.args, budgets(runs)
    K, arms = a.eval_n, passk_data["arms"]
    verdicts = []
    for budget in BUDGETS:
        def paired(name, other, key):
            theirs = {r["seed"]: r[key] for r in arms if r["name"] == other and r["budget"] == budget}
            return [r[key] - theirs[r["seed"]] for r in arms if r["name"] == name and r["budget"] == budget]
        verdicts += [verdict(f"GRPO->ES adds pass@{K} over GRPO ({budget})", paired("grpo-es", "grpo", f"pass@{K}")),
                     verdict(f"GRPO->ES keeps GRPO's pass@1, within {MARGIN} ({budget})",
                             paired("grpo-es", "grpo", "pass@1"), margin=MARGIN),
                     verdict(f"GRPO->ES beats ES at pass@1 ({budget})", paired("grpo-es", "es", "pass@1"))]
    # the sweep: share s of the equal-generations budget spent on GRPO first, the rest on ES
    per, U = runs.per_it, a.updates
    p = params_for(chosen, "equal-generations")
    cells = []
    for s in sorted({0.0, 0.5, 1.0} | set(numbers(a.switches))):
        e_its = U - math.floor(s * U + 1e-9)  # s = 0.5: the headline GRPO->ES's U - U // 2
        g_steps = (G - e_its * per["es"]) // per["grpo"]
        stages = [st for st in (("grpo", g_steps), ("es", e_its)) if st[1] > 0]
        seeds = [int(x) for x in (a.seeds if s in (0.0, 0.5, 1.0) else a.sweep_seeds).split(",")]
        cells += [(s, stages, seed) for seed in seeds]
    done = runs.all(lambda c, wait: runs.schedule(c[1], p, c[2], wait=wait), cells)
    scores = runs.all(lambda d, wait: runs.evaluate(d[0], wait=wait), done)
    sweep = []
    for s in dict.fromkeys(c[0] for c in cells):
        mine = [ev for c, ev in zip(cells, scores) if c[0] == s]
        stages = next(c[1] for c in cells if c[0] == s)
        sweep.append({"grpo_share": s, "schedule": sequential.schedule_text(stages), "seeds": len(mine),
                      **{k: interval([ev[k] for ev in mine]) for k in {"pass@1": 0, "pass@16": 0, f"pass@{K}": 0}}})
    return {"verdicts": verdicts, "sweep": sweep}


# ---- 4. sparsity, forgetting and compression at a matched gain -------------------------------------------------------
def matched_grpo(runs, lr, beta, target, max_steps, start, wait=True, seed=0):
    """GRPO at lr (and seed), continued in chunks until its held-out pass@1 (n = 16) gain reaches target - 0.01 or
    max_steps: resuming is exact, so the final checkpoint is the first one at that gain. Returns (folder, steps,
    gain)."""
    marks = sorted({m for m in (2, 4, 6, 8, 10, 14, 18, 24, 30, 40, 50, 65, 80, 100, 130, 160, 200, 250, 300, 380,
                                480, 600, 800, 1000) if m < max_steps} | {max_steps})
    tag = f"lr{lr:g}-beta{beta:g}" + (f"-seed{seed}" if seed else "")
    out = runs.path("matched", f"grpo-{tag}", "x")[:-2]

    def go():
        shutil.rmtree(out, ignore_errors=True)  # a killed search starts again (its chunks are cheap)
        gain, steps = None, 0
        for m in marks:  # eval_every = save_every = 0: each chunk evaluates and saves at its end, same flags
            g = sequential.grpo.Args(model=runs.args.model, task=runs.args.task, iterations=m, lr=lr, beta=beta,
                                     seed=seed, eval_every=0, eval_n=16, eval_split="test",
                                     eval_problems=runs.args.eval_problems,
                                     threads=runs.args.threads, out=out, resume=out if steps else "",
                                     **runs.grpo_cfg)
            print(f"[results] matched-gain GRPO lr {lr:g} seed {seed}: to step {m}", flush=True)
            sequential.grpo.train(g)
            last = evals(es.read_log(os.path.join(out, "log.jsonl")))[-1]
            gain, steps = last["pass@1"] - start, m
            if gain >= target - 0.01:
                break
        return {"steps": steps, "gain": gain}
    r = runs.cached(f"matched-grpo-lr{lr:g}" + (f"-seed{seed}" if seed else ""), go, wait)
    return r and (out, r["steps"], r["gain"])


def sparsity_seed(runs, chosen, seed):
    """One seed of claim 4: the seed's equal-updates ES run; GRPO of that seed at the tuned lr (equal generations) and
    lr / each divisor, each trained to the same held-out pass@1 gain (or to the equal-generations budget); sparsity.py
    on each, with --forget-problems unseen-family problems."""
    a, (plan, G) = runs.args, budgets(runs)
    p = params_for(chosen, "equal-updates")
    es_dir, _ = runs.schedule(plan["equal-updates"]["es"], p, seed)
    base16, es16 = runs.evaluate(a.model, n=16), runs.evaluate(es_dir, n=16)
    target = es16["pass@1"] - base16["pass@1"]
    lr, beta = chosen["grpo"]["equal-generations"]["lr"], chosen["grpo"]["equal-generations"]["beta"]
    models = {"es": {"folder": es_dir, "label": f"ES ({a.updates} iterations)", "steps": a.updates,
                     "search_gain": target}}
    lrs = [lr / d for d in [1.0] + numbers(a.lr_divisors)]
    found = runs.all(lambda x, wait: matched_grpo(runs, x, beta, target, G // runs.per_it["grpo"], base16["pass@1"],
                                                  wait, seed), lrs)
    for (folder, steps, gain), d in zip(found, [1.0] + numbers(a.lr_divisors)):
        models[f"grpo-lr{lr / d:g}"] = {"folder": folder, "label": f"GRPO lr {lr / d:g} ({steps} steps)",
                                        "steps": steps, "search_gain": gain, "lr": lr / d}
    tag = f"-seed{seed}" if seed else ""

    def analyse(key, wait):
        folder = runs.path("sparsity", f"{key}{tag}-f{a.forget_problems}", "x")[:-2]

        def go():
            sparsity.run(sparsity.Args(base=a.model, tuned=models[key]["folder"], task=a.task, out=folder,
                                       threads=a.threads, forget_problems=a.forget_problems, **runs.sparsity_kw))
            return [json.loads(x) for x in open(os.path.join(folder, "sparsity.jsonl"))]
        return runs.cached(f"sparsity-{key}{tag}-f{a.forget_problems}", go, wait)
    out, forget = {}, {}
    for key, recs in zip(models, runs.all(analyse, list(models))):
        m, folder = models[key], runs.path("sparsity", f"{key}{tag}-f{a.forget_problems}", "x")[:-2]
        ev = {r["model"]: r for r in recs if r["kind"] == "eval"}
        fr = {r["model"]: r for r in recs if r["kind"] == "forgetting"}
        big = max((k for k in fr["base"] if k.startswith("forget_pass@")), key=lambda k: int(k.split("@")[1]))
        big_k = big.split("@")[1]
        d = recs[0]["overall"]
        out[key] = {**{k: v for k, v in m.items() if k != "folder"}, "folder": folder,
                    "gain": ev["tuned"]["pass@1"] - ev["base"]["pass@1"], "relative_l2": d["relative_l2"],
                    "max_abs_delta": d["max_abs_delta"], "above_0.0015": d["above_0.0015"],
                    "above_0.0015_bf16": d["above_0.0015_bf16"], "changed_bf16": d["changed_bf16"],
                    "keep_top": sparsity.first_q(recs, "top", "pass@1"),
                    "keep_random": sparsity.first_q(recs, "random", "pass@1"),
                    "lm_loss": [fr["base"]["lm_loss"], fr["tuned"]["lm_loss"]], "forget_k": big_k,
                    "forget_pass@1": [fr["base"]["forget_pass@1"], fr["tuned"]["forget_pass@1"]],
                    "forget_pass@k": [fr["base"][big], fr["tuned"][big]],
                    "forget_problems": len(fr["base"]["forget_correct"]),
                    "compress": [{"method": r["method"], "retained": r.get("retained_pass@1")}
                                 for r in recs if r["kind"] == "compress" and r["model"] == "tuned"]}
        n, k = runs.sparsity_kw["eval_n"], int(big_k)  # per problem: the unseen family's pass@k, base and tuned
        forget[key] = [[passk.pass_at_k(n, c, k) for c in fr[w]["forget_correct"]] for w in ("base", "tuned")]
    e = out["es"]
    pairs = []
    for key in out:
        if key != "es":
            g = out[key]
            pairs.append({"grpo": key, "ratio": e["relative_l2"] / max(g["relative_l2"], 1e-12),
                          "gain_gap": e["gain"] - g["gain"], "matched": abs(e["gain"] - g["gain"]) <= 0.02})
    return {"seed": seed, "target": target, "models": out, "pairs": pairs, "forget": forget}


def claim_sparsity(runs, chosen):
    """Claim 4 over --sparsity-seeds (sparsity_seed for each), every verdict a mean over seeds with its interval: the
    drift ratio as the mean of log10(ES / GRPO relative L2) over seeds, each seed's smallest over its matched pairs;
    the sparsity as the random share minus the top share (%) that keeps 90% of the gain, holding only where the top
    share is 30% or less in every seed; forgetting paired over problems and seeds (crossed_interval): the change of
    each unseen-family problem's pass@k under ES, and ES against its seed's GRPO at a matched gain, each against the
    0.03 rule. The table and the plots are seed 0's."""
    seeds = [int(x) for x in runs.args.sparsity_seeds.split(",")]
    per = [sparsity_seed(runs, chosen, s) for s in seeds]
    first = per[0]
    grpo_key = next(k for k in first["models"] if k != "es")  # the tuned lr: the pair a user would compare
    ratios = [math.log10(min(p["ratio"] for p in r["pairs"] if p["matched"])) for r in per
              if any(p["matched"] for p in r["pairs"])]
    share = lambda q: 100.0 if q is None else q  # noqa: E731  (None: not even the whole update keeps 90%)
    grown = [r["models"]["es"] for r in per if r["models"]["es"]["gain"] >= 0.01]
    sparse = [share(m["keep_random"]) - share(m["keep_top"]) for m in grown]  # the control: a random share
    K = first["models"]["es"]["forget_k"]
    drop = [np.asarray(r["forget"]["es"][1]) - np.asarray(r["forget"]["es"][0]) for r in per]

    def matched(r):  # each seed's GRPO at a matched gain: the tuned lr where it matched, else the first that did
        keys = [p["grpo"] for p in r["pairs"] if p["matched"]]
        return grpo_key if grpo_key in keys else (keys[0] if keys else None)
    versus = [np.asarray(r["forget"]["es"][1]) - np.asarray(r["forget"][matched(r)][1]) for r in per if matched(r)]
    def over_seeds(claim, values, why):
        if len(values) >= 2:
            return verdict(claim, values)
        return {"claim": claim, "verdict": f"not testable here ({why})", "difference": values[0] if values else None,
                "half_width": None, "seeds": len(values)}
    drift_v = over_seeds("ES drifts farther than GRPO at a matched gain (log10 of the relative L2 ratio ES / GRPO, "
                         "each seed's smallest over its matched pairs)", ratios,
                         f"{len(ratios)} seed(s) with a pair matched within 0.02")
    sparse_v = over_seeds("ES's gain lives in a sparse set of large updates (90% of it from the top 30% of updates or "
                          "fewer, and fewer than a random share: random share - top share, %)", sparse,
                          f"{len(sparse)} seed(s) with a gain of 0.01 or more")
    if grown and min(share(m["keep_top"]) for m in grown) > 30:
        sparse_v["verdict"] = "does not hold"  # more than 30% of the update needed in every seed
    elif sparse_v["verdict"] == "holds" and max(share(m["keep_top"]) for m in grown) > 30:
        sparse_v["verdict"] = "within noise"  # fewer than random, but above 30% in some seed
    forget_v = verdict(f"no catastrophic forgetting under ES (unseen-family pass@{K} falls by 0.03 or less; paired "
                       "over problems and seeds)", np.stack(drop), margin=0.03)
    forget_v.update(seeds=len(drop), problems=len(drop[0]))
    versus_v = {"claim": f"ES keeps the unseen family as well as GRPO at a matched gain (pass@{K}, ES - GRPO, not lower "
                         "by more than 0.03)", "verdict": "not testable here (no pair matched within 0.02)",
                "difference": None, "half_width": None, "seeds": 0}
    if versus:
        versus_v = verdict(versus_v["claim"], np.stack(versus), margin=0.03)
        versus_v.update(seeds=len(versus), problems=len(versus[0]))
    verdicts = [drift_v, sparse_v, forget_v, versus_v]
    return {"target": first["target"], "models": first["models"], "pairs": first["pairs"],
            "seeds": [{"seed": r["seed"], "target": r["target"], "pairs": r["pairs"],
                       **{k: r["models"]["es"][k] for k in ("gain", "keep_top", "keep_random", "relative_l2")},
                       "forget_change": float(np.mean(r["forget"]["es"][1]) - np.mean(r["forget"]["es"][0])),
                       "grpo_forget_change": float(np.mean(r["forget"][grpo_key][1])
                                                   - np.mean(r["forget"][grpo_key][0]))} for r in per],
            "verdicts": verdicts}


# ---- 5. population size against model size ---------------------------------------------------------------------------
def size_model(runs, spec):
    """The base model of one size: --model itself when it has that shape, else built by toy.py (same recipe)."""
    hidden, layers = (int(x) for x in spec.split("x"))
    cfg_path = os.path.join(passk.resolve_model(runs.args.model), "config.json")
    if os.path.exists(cfg_path):
        cfg = json.load(open(cfg_path))
        if (cfg["hidden_size"], cfg["num_hidden_layers"]) == (hidden, layers):
            return runs.args.model
    path = runs.path("models", f"{runs.args.task}-h{hidden}-l{layers}", "x")[:-2]

    def go():
        import toy
        if os.path.exists(os.path.join(path, "config.json")):
            return path  # built before its cache entry was written (a killed run, or by hand with the same recipe)
        toy.main(toy.Args(task=runs.args.task, out=path, hidden=hidden, layers=layers, intermediate=3 * hidden,
                          heads=4 if hidden % 4 == 0 else 2, steps=runs.args.size_steps, batch=256, eval_problems=0,
                          threads=runs.args.threads))
        return path
    return runs.cached(f"model-{os.path.basename(path)}", go)


def claim_population(runs, chosen):
    """ES at each size and N (tuned sigma and alpha, sweep seeds), val pass@1 gain over pop_iterations; the grid
    doubles N at a size while its choice (the smallest N with 90% of the best mean gain) is the largest tried (up to
    --max-population), and halves it while the choice is the smallest (down to 2)."""
    a = runs.args
    seeds = [int(s) for s in a.sweep_seeds.split(",")]
    p = {"es": chosen["es"]["equal-updates"]}
    cells, logs, choice = [], {}, {}
    for spec in a.sizes.split(","):
        model = size_model(runs, spec)
        pops = [int(x) for x in a.populations.split(",")]
        while True:
            todo = [(N, seed) for N in pops if not any(c["size"] == spec and c["N"] == N for c in cells)
                    for seed in seeds]
            done = runs.all(lambda j, wait: runs.schedule([("es", a.pop_iterations)], p, j[1], model=model,
                                                          population=j[0], eval_every=a.pop_iterations, wait=wait),
                            todo)
            for N in dict.fromkeys(j[0] for j in todo):
                mine = [(folder, log) for j, (folder, log) in zip(todo, done) if j[0] == N]  # its seeds
                logs.update({os.path.basename(folder): log for folder, log in mine})
                gains = [evals(log)[-1]["pass@1"] - evals(log)[0]["pass@1"] for _, log in mine]
                stage = es.read_log(os.path.join(mine[0][0], "stage-1-es", "log.jsonl"))
                params = next(r for r in stage if r["type"] == "config")["trained_params"]
                cells.append({"size": spec, "params": params, "N": N, "gain": interval(gains),
                              "base": evals(mine[0][1])[0]["pass@1"]})
            mine = sorted((c for c in cells if c["size"] == spec), key=lambda c: c["N"])
            best = max(c["gain"][0] for c in mine)
            n90 = next((c["N"] for c in mine if best > 0 and c["gain"][0] >= 0.9 * best), None)
            if n90 == max(pops) and 2 * max(pops) <= a.max_population:
                pops.append(2 * max(pops))
                continue
            if n90 == min(pops) and min(pops) // 2 >= 2:
                pops.append(min(pops) // 2)
                continue
            choice[spec] = {"N": n90, "edge": n90 in (max(pops), min(pops)), "best": best,
                            "params": mine[0]["params"],
                            "range": None if n90 is None else plausible_choices(mine, best)}
            break
    specs = list(choice)
    clear = all(choice[s]["best"] > 0.01 for s in specs)
    hw = [c["gain"][1] for c in cells if c["gain"][1] is not None]
    v = {"claim": "a larger model needs a smaller population (the smallest N with 90% of the best gain falls with "
                  "size, for every N each size's 95% intervals allow)",
         "verdict": "not testable here (best gains under 0.01)" if not clear else
         population_verdict([choice[s]["range"] for s in specs]), "difference": None,  # clear: every range set
         "half_width": float(np.median(hw)) if hw else None, "seeds": len(seeds)}
    return {"cells": cells, "choice": choice, "verdicts": [v]}, logs


def plausible_choices(mine, best):
    """[lo, hi]: the choices 'the smallest N with 90% of the best mean gain' that the cells' 95% intervals allow: lo
    the smallest N whose interval reaches 0.9 * best, hi the smallest N whose whole interval does (else the largest
    N). The point choice lies in between; a cell of one seed (no interval) allows anything. The bar is taken as
    exact (the best cell's own spread is not added), so the range is if anything narrower than the data allow."""
    bar = 0.9 * best
    hw = lambda c: math.inf if c["gain"][1] is None else c["gain"][1]  # noqa: E731
    lo = next((c["N"] for c in mine if c["gain"][0] + hw(c) >= bar), mine[-1]["N"])
    hi = next((c["N"] for c in mine if c["gain"][0] - hw(c) >= bar), mine[-1]["N"])
    return [lo, max(lo, hi)]


def population_verdict(ranges):
    """The claim over the sizes in order, given each size's plausible choices [lo, hi]: holds when every choice the
    intervals allow falls (never rises from one size to the next, lower at the largest than at the smallest); does
    not hold when no allowed choice does (the highest non-increasing chain, hi of the first size then each size's
    min(hi, the previous), drops below a size's lo, or cannot end below the first size's hi); within noise otherwise.
    Before issue 37 the verdict read the point choices alone, and a rebuilt model flipped it."""
    if len(ranges) < 2:
        return "not testable here (one size)"
    pairs = list(zip(ranges, ranges[1:]))
    if all(b[1] <= a[0] for a, b in pairs) and ranges[-1][1] < ranges[0][0]:
        return "holds"
    chain, possible = ranges[0][1], ranges[-1][0] < ranges[0][1]
    for lo, hi in ranges[1:]:
        chain = min(hi, chain)
        possible = possible and chain >= lo
    return "within noise" if possible else "does not hold"


# ---- 6. cost at matched quality, memory --------------------------------------------------------------------------------
def question_cost(runs, passk_data):
    """From the equal-generations val curves averaged over seeds (every seed evaluates at the same updates): the
    highest pass@1 (and pass@16) both ES and GRPO reach, and the generations and training seconds each first needs
    for it."""
    seeds = [int(s) for s in runs.args.seeds.split(",")]
    mean = {n: np.mean([passk_data["curves"][f"{n}|equal-generations|{s}"] for s in seeds], axis=0).tolist()
            for n in ("es", "grpo")}  # [evals, (updates, generations, seconds, pass@1, pass@16, token entropy)]
    out = {}
    for k, col in (("pass@1", 3), ("pass@16", 4)):
        start = mean["es"][0][col]
        best = {n: max(p[col] for p in mean[n][1:]) for n in mean}
        target = min(best.values())
        rec = {"target": target, "start": start, "best": best, "gain_exists": target > start + 1e-9}
        for n in mean:
            hit = next(p for p in mean[n][1:] if p[col] >= target)
            rec[n] = [hit[1], hit[2]]
        out[k] = rec

    def mem():
        rec = {}
        for job in ("es-full", "grpo"):
            cmd = [sys.executable, os.path.join(HERE, "bench.py"), "--worker", job, "--threads", str(runs.args.threads)]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            rec[job] = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
        return rec
    return {"matched": out, "memory": runs.cached("memory", mem)}


# ---- 7. sampling temperature ------------------------------------------------------------------------------------------
def question_temperature(runs, chosen):
    """The equal-generations models of every seed (and the base) at each temperature: rows are means over seeds.
    Verdicts: raising T from 1 to the hottest recovers pass@K for GRPO, for ES (each seed's change), and ES gains
    more from it than GRPO (paired by seed): the paper's open question, does an ES-trained model make
    inference-time diversity methods work again?"""
    a, (plan, _) = runs.args, budgets(runs)
    p = params_for(chosen, "equal-generations")
    seeds, temps = [int(x) for x in a.seeds.split(",")], numbers(a.temperatures)
    jobs = [("base", None, a.model, T) for T in temps] + [
        (name, seed, runs.schedule(plan["equal-generations"][name], p, seed)[0], T)
        for name in ("grpo", "es", "grpo-es") for seed in seeds for T in temps]
    done = runs.all(lambda j, wait: runs.evaluate(j[2], T=j[3], wait=wait), jobs)
    per = [{"name": j[0], "seed": j[1], "T": j[3], **{k: sm[k] for k in sm if k.startswith(("pass@", "maj@"))}}
           for j, sm in zip(jobs, done)]
    rows = []
    for name in ("base", "grpo", "es", "grpo-es"):
        for T in temps:
            mine = [r for r in per if r["name"] == name and r["T"] == T]
            rows.append({"name": name, "T": T, "seeds": len(mine) if name != "base" else 0,
                         **{k: float(np.mean([r[k] for r in mine])) for k in mine[0]
                            if k.startswith(("pass@", "maj@"))}})
    K, hot = a.eval_n, max(temps)
    gain = {name: [next(r for r in per if r["name"] == name and r["seed"] == s and r["T"] == hot)[f"pass@{K}"]
                   - next(r for r in per if r["name"] == name and r["seed"] == s and r["T"] == 1.0)[f"pass@{K}"]
                   for s in seeds] for name in ("grpo", "es")}
    verdicts = [verdict(f"raising T from 1 to {hot:g} recovers pass@{K} for GRPO", gain["grpo"]),
                verdict(f"raising T from 1 to {hot:g} recovers pass@{K} for ES", gain["es"]),
                verdict(f"an ES-trained model gains more pass@{K} than GRPO's from raising T to {hot:g} (the open "
                        "question: does ES make inference-time diversity work again?)",
                        [e - g for e, g in zip(gain["es"], gain["grpo"])])]
    return {"rows": rows, "per_seed": per, "verdicts": verdicts}


# ---- 8. the SmolLM2 runs of docs/llm.md --------------------------------------------------------------------------------
LLM_METHODS = ("es", "grpo", "grpo-es")


def llm_params(cfg):
    """The tuned settings of one run, from its log's config line (a schedule: its stages and per-algorithm flags)."""
    if cfg["algo"] == "sequential":
        return {"schedule": cfg["schedule"], "es": cfg["es"], "grpo": cfg["grpo"]}
    if cfg["algo"] == "es":
        return {k: cfg[k] for k in ("sigma", "alpha", "population", "prompts", "noise", "rank")}
    return {k: cfg[k] for k in ("lr", "beta", "prompts", "group") if k != "beta" or cfg.get("beta")}


def llm_point(rec):
    K = max(int(k[5:]) for k in rec if k.startswith("pass@"))
    return {k: rec[k] for k in ("pass@1", "pass@16", f"pass@{K}", "token_entropy", "answer_entropy") if k in rec}


def llm_log(path):
    """(config, evaluations with the generations sampled before each, train lines) of a finished es.py, grpo.py or
    sequential.py run, else None: finished means every planned update logged and an evaluation before and after."""
    recs = es.read_log(os.path.join(path, "log.jsonl")) if os.path.isdir(path) else []
    cfg = recs[0] if recs and recs[0].get("type") == "config" else None
    if cfg is None:
        return None
    planned = sum(int(x.split(":")[1]) for x in cfg["schedule"].split(",")) if cfg["algo"] == "sequential" \
        else cfg["iterations"]
    ev, train = llm_log_evals(recs), [r for r in recs if r.get("type") == "train"]
    done = len(train) == planned and len(ev) >= 2 and ev[0]["generations"] == 0 and recs.index(train[-1]) < \
        max(i for i, r in enumerate(recs) if r.get("type") == "eval")
    return (cfg, ev, train) if done else None


def llm_held_out(folder):
    """FOLDER's finished held-out runs, each log read once: {name: (method, seed, (config, evaluations, train lines))}
    for FOLDER/METHOD-seedS/log.jsonl, METHOD one of LLM_METHODS; unfinished runs (llm_log) are left out."""
    out = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        method, _, seed = name.rpartition("-seed")
        got = llm_log(os.path.join(folder, name)) if method in LLM_METHODS and seed.isdecimal() else None
        if got:
            out[name] = (method, int(seed), got)
    return out


def question_llm(folder, held):
    """docs/llm.md's SmolLM2 runs from their committed logs: FOLDER/tune/NAME/log.jsonl (short runs scored on the val
    split: {method, params, score}) and held = llm_held_out(FOLDER), the held-out runs FOLDER/METHOD-seedS/
    (grpo-es: a sequential.py schedule, or es.py from a GRPO run's checkpoint-NNNNNN, whose generations, wall time
    and evaluations up to that step count as the run's first part). Unfinished runs are left out. A run's population
    and prompts are ES's (members, prompts each member is scored on; a schedule's ES stage), or for GRPO none and its
    prompts per step (its group size in params)."""
    tuning, runs, figures = [], [], {}
    tune_dir = os.path.join(folder, "tune")
    for name in sorted(os.listdir(tune_dir)) if os.path.isdir(tune_dir) else []:
        got = llm_log(os.path.join(tune_dir, name))
        if got:
            cfg, ev, train = got
            key = "greedy_pass@1" if "greedy_pass@1" in ev[-1] else "pass@1"  # issue 38's protocol: greedy
            tuning.append({"method": cfg["algo"], "run": name, "task": cfg["task"], "params": llm_params(cfg),
                           "score": ev[-1][key],
                           "base_score": ev[0][key], "score_kind": key, "split": cfg["eval_split"],
                           "problems": ev[-1].get("greedy_problems", cfg["eval_problems"]), "iterations": len(train),
                           "generations": train[-1]["generations"], "wall_minutes": train[-1]["wall"] / 60,
                           **llm_diagnostics(train)})
    for method, seed, (cfg, ev, train) in held.values():
        start = llm_start(folder, cfg) if method == "grpo-es" and cfg["algo"] == "es" else None
        before, prefix, wall = 0, [], 0.0  # what the GRPO run this ES run started from had done
        if start:
            src, step = start
            at = next(r for r in src if r.get("type") == "train" and r["iteration"] == step)
            before, wall = at["generations"], at["wall"]
            prefix = [e for e in llm_log_evals(src) if e["iteration"] < step]
        ev_all = prefix + [{**e, "generations": before + e["generations"], "wall": wall + e["wall"],
                            "iteration": e["iteration"] + (start[1] if start else 0)} for e in ev]
        params = llm_params(cfg)
        es_params = params.get("es", params) if method != "grpo" else params  # a schedule nests each stage's flags
        runs.append({"method": method, "seed": seed, "task": cfg["task"], "iterations": len(train),
                     "population": es_params.get("population"), "prompts": es_params.get("prompts"),
                     **llm_diagnostics(train),
                     **({"grpo_steps": start[1]} if start else {}),
                     "generations": before + train[-1]["generations"], "wall_minutes": (wall + train[-1]["wall"]) / 60,
                     "eval": {"split": cfg["eval_split"], "problems": cfg["eval_problems"], "n": cfg["eval_n"]},
                     "base": llm_point(ev_all[0]), "final": llm_point(ev[-1]), "params": params,
                     "curve": [[e["generations"], e["pass@1"], e.get("pass@16")] for e in ev_all],
                     **({"greedy_curve": [[e["generations"], e["wall"] / 60, e["greedy_pass@1"], e["iteration"]]
                                          for e in ev_all if "greedy_pass@1" in e]} if "greedy_pass@1" in ev[-1]
                        else {})})
        if "correct" in ev[-1]:  # issue 38's logs: per-problem figures, for verdicts paired over problems and seeds
            figures[method, seed] = {"base": per_problem(ev_all[0]), "final": per_problem(ev[-1])}
    grid = lambda t: (t["method"], *(t["params"].get(k, 0) for k in ("sigma", "alpha", "lr")))  # noqa: E731
    return runs, sorted(tuning, key=grid), llm_verdicts(figures)  # a grid reads in order of its values


def llm_studies(args):
    """summary.json's llm, llm_tuning and llm_verdicts (--llm-runs), llm_stall and llm_followups (the same logs and
    FOLDER/followup/) and llm_earlier (--llm-earlier: the first three)."""
    held = llm_held_out(args.llm_runs)
    runs, tuning, verdicts = question_llm(args.llm_runs, held)
    earlier = question_llm(args.llm_earlier, llm_held_out(args.llm_earlier)) if args.llm_earlier else ([], [], [])
    return {"llm": runs, "llm_tuning": tuning, "llm_verdicts": verdicts, "llm_stall": llm_stall(held),
            "llm_followups": llm_followups(args.llm_runs, held),
            "llm_earlier": dict(zip(("runs", "tuning", "verdicts"), earlier))}


STALL_RELIABILITY = 0.3  # below it the members' ranking is mostly noise (set after the ES runs, before a follow-up)


def greedy_diff(a, b):
    """Per-problem greedy outcomes of evaluation a minus b's, as a [1, problems] table (one run's pairs)."""
    return np.asarray(a["greedy_correct"], float)[None] - np.asarray(b["greedy_correct"], float)[None]


def llm_stall(held):
    """Issue 38's "if ES stops moving, the diagnostics name why", over the late part of the finished ES runs of held =
    llm_held_out(FOLDER) (FOLDER/es-seedS/): from each run's last greedy evaluation at or before its middle iteration to
    its last one, did held-out greedy pass@1 still rise (a verdict paired over problems and seeds)? Where it did not,
    issue 38's rule names the cause from the diagnostics of the same iterations (the threshold and the span set here,
    after the ES runs and before any follow-up): mean fitness reliability below STALL_RELIABILITY, the signal; a probe
    gain (the master's reward on an iteration's own prompts after its update minus before) above 0 at 95%, the training
    pool (the step still pays where it was estimated, and that does not carry to new problems); else the step (it no
    longer raises even the reward it was estimated on). The probe gain's interval is the verdicts' own, over iterations
    and seeds (crossed_interval on [seeds, iterations]). None unless every ES run has two greedy evaluations, the same
    held-out problems, the same number of iterations in its span, and both diagnostics."""
    diffs, rel, gain, spans = [], [], [], []
    for method, seed, got in held.values():
        greedy = [e for e in got[1] if "greedy_correct" in e] if method == "es" else []
        mid = [e for e in greedy if e["iteration"] <= len(got[2]) / 2]
        if not mid or greedy[-1] is mid[-1]:
            continue
        a, b = mid[-1], greedy[-1]
        diffs.append(greedy_diff(b, a)[0])
        late = [r for r in got[2] if a["iteration"] < r["iteration"] <= b["iteration"]]
        rel += [r["fitness_reliability"] for r in late if r.get("fitness_reliability") is not None]
        gain.append([r["probe_after"] - r["probe_before"] for r in late if "probe_after" in r])
        spans.append([seed, a["iteration"], b["iteration"], a["greedy_pass@1"], b["greedy_pass@1"]])
    if not diffs or not rel or len({len(d) for d in diffs}) != 1 or len({len(g) for g in gain}) != 1 or \
            len(gain[0]) * len(gain) < 2:
        return None
    v = verdict("ES's held-out greedy pass@1 still rises late in its run", np.stack(diffs))
    g = verdict("the probe gain is above 0", np.asarray(gain))
    cause = None if v["verdict"] == "holds" else "the signal" if np.mean(rel) < STALL_RELIABILITY else \
        "the training pool" if g["verdict"] == "holds" else "the step"
    return {**v, "problems": len(diffs[0]), "spans": spans, "reliability": float(np.mean(rel)),
            "probe_gain": g["difference"], "probe_half_width": g["half_width"], "iterations": len(gain[0]),
            "cause": cause}


def read_origin(path):
    """A follow-up's origin.json: {"run", "iteration", "change"}; None, with one line on stderr, where it is not."""
    try:
        with open(path) as f:
            o = json.load(f)
        if isinstance(o.get("run"), str) and isinstance(o.get("iteration"), int) and isinstance(o.get("change"), str):
            return o
    except (OSError, ValueError, AttributeError):
        pass
    print(f"warning: {path} is not {{\"run\": NAME, \"iteration\": N, \"change\": TEXT}}: its follow-up is left out",
          file=sys.stderr)
    return None


def llm_followups(folder, held):
    """The runs made to address what llm_stall names: FOLDER/followup/NAME/ holds an es.py log.jsonl and origin.json
    ({"run": a held-out run's folder name, its log in held = llm_held_out(FOLDER), "iteration": the parent's iteration
    whose weights it started from, replayed from the parent's log, "change": what it changes, in words}). Each finished
    one against its parent at the same iterations (the follow-up's t counted as the parent's iteration + t): its greedy
    curve beside the parent's, and greedy pass@1 paired over problems at its end against the parent at that iteration
    (where the parent has it) and against its own start (whose evaluation, beside the parent's, also checks the replay).
    No paired figure where the follow-up was not evaluated on its parent's problems (task, split and count)."""
    out, base = [], os.path.join(folder, "followup")
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        got = llm_log(os.path.join(base, name))
        o = read_origin(os.path.join(base, name, "origin.json")) if got else None
        parent = held[o["run"]][2] if o and o["run"] in held else None
        if not parent:
            continue
        cfg, ev, train = got
        ev = [{**e, "iteration": o["iteration"] + e["iteration"]} for e in ev if "greedy_correct" in e]
        if len(ev) < 2 or ev[0]["iteration"] != o["iteration"]:
            continue
        same = all(cfg[k] == parent[0][k] for k in ("task", "eval_split")) and \
            all(len(e["greedy_correct"]) == len(ev[0]["greedy_correct"]) for e in parent[1] if "greedy_correct" in e)
        at = {e["iteration"]: e for e in parent[1] if "greedy_correct" in e} if same else {}
        end, start = ev[-1], at.get(o["iteration"])
        vs = ([verdict(f"the follow-up beats {o['run']} at iteration {end['iteration']}",
                       greedy_diff(end, at[end["iteration"]]))] if end["iteration"] in at else []) + \
            [verdict(f"the follow-up raises greedy pass@1 over its start (iteration {o['iteration']})",
                     greedy_diff(end, ev[0]))]
        out.append({"name": name, **o, "task": cfg["task"], "params": llm_params(cfg),
                    "train_problems": cfg["train_problems"], "seed": cfg["seed"], "iterations": len(train),
                    "generations": train[-1]["generations"], "wall_minutes": train[-1]["wall"] / 60,
                    **llm_diagnostics(train), "problems": len(end["greedy_correct"]),
                    "start": {"greedy": ev[0]["greedy_pass@1"], "parent": start and start["greedy_pass@1"],
                              "same": start and int(np.sum(greedy_diff(ev[0], start) == 0))},
                    "curve": [[e["iteration"], e["greedy_pass@1"], at[e["iteration"]]["greedy_pass@1"]
                               if e["iteration"] in at else None] for e in ev],
                    "verdicts": vs})
    return out


def llm_diagnostics(train):
    """The means of an ES log's diagnostics over its iterations (issue 38): fitness_reliability, and with --probe the
    master's reward gain on each iteration's prompts (probe_after - probe_before); {} where a log has neither."""
    rel = [r["fitness_reliability"] for r in train if r.get("fitness_reliability") is not None]
    probe = [r["probe_after"] - r["probe_before"] for r in train if "probe_after" in r]
    return {**({"reliability": float(np.mean(rel))} if rel else {}),
            **({"probe_gain": float(np.mean(probe))} if probe else {})}


def llm_log_evals(recs):
    """A log's evaluations, each with the generations sampled and the training seconds spent before it."""
    out, gens, wall = [], 0, 0.0
    for r in recs:
        if r.get("type") == "train":
            gens, wall = r["generations"], r["wall"]
        elif r.get("type") == "eval":
            out.append({**r, "generations": gens, "wall": wall})
    return out


def per_problem(rec):
    """An eval record's per-problem figures: greedy (0/1), pass@1 and pass@K at T = 1 (K = its n), answer entropy."""
    n = rec["n"]
    out = {"pass@1": [c / n for c in rec["correct"]], f"pass@{n}": [float(c > 0) for c in rec["correct"]]}
    if "answer_entropies" in rec:
        out["answer_entropy"] = rec["answer_entropies"]
    if "greedy_correct" in rec:
        out["greedy_pass@1"] = [float(c) for c in rec["greedy_correct"]]
    return out


def llm_paired(figures, claim, method, key, other=None, direction=1, margin=0.0):
    """A verdict paired over problems and seeds: per seed and problem, method's final minus the base (other None;
    each run's own base evaluation) or minus other's final of the same seed; the interval of their mean counts both
    the problems' and the seeds' spread (crossed_interval). None when no seed of method has what it needs."""
    diffs = []
    for (m, seed), f in sorted(figures.items()):
        ref = f["base"] if other is None else figures.get((other, seed), {}).get("final")
        if m == method and ref is not None and key in f["final"] and key in ref and \
                len(f["final"][key]) == len(ref[key]):  # the same problems, or no pair
            diffs.append(np.asarray(f["final"][key]) - np.asarray(ref[key]))
    if not diffs or len({len(d) for d in diffs}) != 1:
        return None
    v = verdict(claim, np.stack(diffs), direction, margin)
    return {**v, "seeds": len(diffs), "problems": len(diffs[0])}


def llm_verdicts(figures):
    """Issue 38's claims on the real model, each paired over problems and seeds (llm_paired)."""
    if not figures:
        return []
    K = max(int(k[5:]) for f in figures.values() for k in f["final"] if k.startswith("pass@"))
    claims = [("ES raises greedy pass@1 over the base", "es", "greedy_pass@1", None, 1, 0.0),
              ("ES raises pass@1 (T = 1) over the base", "es", "pass@1", None, 1, 0.0),
              (f"ES raises pass@{K} (T = 1) over the base", "es", f"pass@{K}", None, 1, 0.0),
              (f"GRPO lowers pass@{K} below the base", "grpo", f"pass@{K}", None, -1, 0.0),
              ("GRPO lowers answer entropy below the base", "grpo", "answer_entropy", None, -1, 0.0),
              (f"ES beats GRPO at pass@{K}", "es", f"pass@{K}", "grpo", 1, 0.0),
              (f"GRPO->ES adds pass@{K} over GRPO", "grpo-es", f"pass@{K}", "grpo", 1, 0.0),
              (f"GRPO->ES keeps GRPO's greedy pass@1 (within {MARGIN})", "grpo-es", "greedy_pass@1", "grpo", 1,
               MARGIN)]
    return [v for v in (llm_paired(figures, *c) for c in claims) if v is not None]


def llm_start(folder, cfg):
    """(log lines, step) of the GRPO run whose checkpoint-NNNNNN an es.py run started from (its --model), its log
    read from FOLDER/RUN/ (committed beside) or from beside the checkpoint; None when it is not such a run."""
    model = cfg["model"].rstrip("/")
    m = re.fullmatch(r"checkpoint-(\d+)", os.path.basename(model))
    if not m:
        return None
    run = os.path.dirname(model)
    for d in (os.path.join(folder, os.path.basename(run)), run):
        if os.path.isfile(os.path.join(d, "log.jsonl")):
            recs = es.read_log(os.path.join(d, "log.jsonl"))
            if recs and recs[0].get("algo") == "grpo":
                return recs, int(m.group(1))
    return None


def llm_moved(runs, method):
    """Did `method` move held-out pass@1? Each seed's change against twice a conservative standard error of one
    evaluation, sqrt(p (1 - p) / problems) (the variance of a mean of per-problem rates is at most that of a mean of
    Bernoullis; base and final share their problems, so the error of the change is smaller still)."""
    rows = [r for r in runs if r["method"] == method]
    if not rows:
        return None
    out = []
    for r in rows:
        p0, p1, P = r["base"]["pass@1"], r["final"]["pass@1"], r["eval"]["problems"]
        se = math.sqrt(max(p0 * (1 - p0), p1 * (1 - p1)) / P)
        out.append({"seed": r["seed"], "change": p1 - p0, "two_se": 2 * se,
                    "moved": "up" if p1 - p0 > 2 * se else "down" if p0 - p1 > 2 * se else "within noise"})
    return out


# ---- the whole run -----------------------------------------------------------------------------------------------------
def collect(args, typed):
    """Every section's data, in RESULTS.md's order, as one JSON-able dict (summary.json)."""
    runs = Runs(args)
    t = tune(runs)
    chosen = t["chosen"]
    model = os.path.relpath(args.model, HERE) if os.path.exists(args.model) else args.model
    s = {"task": args.task, "model": model,
         "eval": {"problems": len(runs.test), "n": args.eval_n, "split": "test", "seed": passk.EVAL_SEED,
                  "temperature": 1.0},
         "val": {"problems": args.val_problems, "n": 16, "split": "val"},
         "sizes": {"es": {"population": args.es_population, "prompts": args.es_prompts,
                          "generations_per_iteration": runs.per_it["es"]},
                   "grpo": {"prompts": args.grpo_prompts, "group": args.grpo_group,
                            "generations_per_step": runs.per_it["grpo"]}, "updates": args.updates},
         "guess_rate": float(np.mean([verify.toy4_guess_rate(e["numbers"], e["target"]) for e in runs.test]))
         if args.task.split("?")[0] == "toy4" else None,
         **t}
    pk = claim_passk(runs, chosen)
    s.update(base=pk["base"], arms=pk["arms"], curves=pk["curves"], plan=pk["plan"], generations=pk["generations"],
             passk={"verdicts": pk["verdicts"]})
    s["sequential"] = claim_sequential(runs, chosen, pk)
    s["sparsity"] = claim_sparsity(runs, chosen)
    s["population"], pop_logs = claim_population(runs, chosen)
    s["cost"] = question_cost(runs, pk)
    es_plan = budgets(runs)[0]["equal-updates"]["es"]
    es_runs = [runs.schedule(es_plan, {"es": tr["params"]}, 0) for tr in s["tuning"]["es"]] + [
        runs.schedule(es_plan, params_for(chosen, "equal-updates"), int(seed)) for seed in args.seeds.split(",")]
    es_logs = {**{os.path.basename(folder): log for folder, log in es_runs}, **pop_logs}  # by folder: each run once
    s["diversity"] = claim_diversity(es_logs)
    s["temperature"] = question_temperature(runs, chosen)
    s.update(llm_studies(args))
    s["verdicts"] = [v for sec in ("passk", "diversity", "sequential", "sparsity", "population", "temperature")
                     for v in s[sec]["verdicts"]]
    s["compute_minutes"] = runs.compute_minutes()
    s["flags"] = flags_text(typed)
    s["machine"] = f"{platform.machine()} CPU, {os.cpu_count()} cores, torch {torch.__version__}, " + (
        "no GPU" if not torch.cuda.is_available() else f"GPU {torch.cuda.get_device_name(0)} (unused: CPU runs)")
    s["date"] = time.strftime("%Y-%m-%d")
    return s


def flags_text(args):
    """The command-line flags this report was made with (those that differ from the defaults)."""
    given = [f for f in dataclasses.fields(Args) if getattr(args, f.name) != f.default and f.name != "workers"]
    return "".join(f" --{f.name.replace('_', '-')}" + ("" if isinstance(f.default, bool) else
                                                       f" {getattr(args, f.name)}") for f in given)


# ---- the report, from summary.json alone -------------------------------------------------------------------------------
def mean_of(s, name, budget, key):
    if name == "base":
        return s["base"][key], None
    return interval([r[key] for r in s["arms"] if r["name"] == name and r["budget"] == budget])


def vline(v):
    hw = "" if v["half_width"] is None else f" ± {v['half_width']:.3f}"
    d = "" if v["difference"] is None else f", difference {v['difference']:+.3f}{hw}"
    n = f"{v['runs']} runs" if "runs" in v else f"{v['seeds']} seed" + "s" * (v["seeds"] != 1)
    n = f"{v['problems']} problems x {n}, paired" if "problems" in v else n
    return f"- **{v['claim']}: {v['verdict']}**{d} ({n})."


def plot_llm(runs, tuning, plt, save, prefix="llm", followups=()):
    """Section 8's figures of one study (summary.json's llm and llm_tuning, or llm_earlier's): PREFIX-curves.png
    (held-out pass@1 and pass@16 over generations), PREFIX-greedy.png (greedy pass@1 over updates, with the
    follow-ups of llm_followups at their parents' iterations, and over generations), PREFIX-grid.png (issue 38's
    grids)."""
    if runs:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        for r in runs:
            c = r["curve"]
            for ax, j in zip(axes, (1, 2)):
                ax.plot([p[0] for p in c], [p[j] for p in c], marker="o", color=f"C{LLM_METHODS.index(r['method'])}",
                        linestyle="-" if r["seed"] == 0 else "--", label=f"{LABEL[r['method']]} seed {r['seed']}")
        for ax, k in zip(axes, ("pass@1", "pass@16")):
            ax.set_xlabel("sampled generations")
            ax.set_ylabel(f"held-out {k} (T = 1)")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        save(fig, f"{prefix}-curves.png")
        greedy = [r for r in runs if "greedy_curve" in r]
        if greedy:  # issue 38's runs: greedy pass@1 over updates and over generations, every method side by side
            fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
            for r in greedy:
                c = r["greedy_curve"]
                for ax, j in zip(axes, (3, 0)):
                    ax.plot([p[j] for p in c], [p[2] for p in c], marker="o",
                            color=f"C{LLM_METHODS.index(r['method'])}", linestyle="-" if r["seed"] == 0 else "--",
                            label=f"{LABEL[r['method']]} seed {r['seed']}")
            for i, f in enumerate(followups):
                axes[0].plot([p[0] for p in f["curve"]], [p[1] for p in f["curve"]], marker="s", linestyle=":",
                             color=f"C{len(LLM_METHODS) + i}", label=f"follow-up {f['name']} (from {f['run']})")
            for ax, x in zip(axes, ("updates (ES iterations, GRPO steps)", "sampled generations")):
                ax.set_xlabel(x)
                ax.set_ylabel("held-out greedy pass@1")
                ax.grid(alpha=0.3)
            axes[1].set_xscale("symlog", linthresh=1000)
            axes[0].legend(fontsize=7)
            save(fig, f"{prefix}-greedy.png")
    grids = {m: llm_grid(tuning, m) for m in ("es", "grpo")}
    grids = {m: g for m, g in grids.items() if g[0]}
    if grids:  # issue 38's grids: each cell's val greedy pass@1, the rule's choice outlined
        fig, axes = plt.subplots(1, len(grids), figsize=(5.2 * len(grids), 3.8), squeeze=False)
        every = [t[k] for cells, _ in grids.values() for t in cells for k in ("base_score", "score")]
        lo, hi = min(every), max(every)  # one scale for both grids, from the base's score or the lowest cell
        for ax, (m, (cells, xy)) in zip(axes[0], grids.items()):
            xy = [(float(f"{x:.4g}"), float(f"{y:.4g}")) for x, y in xy]  # alpha / sigma without float noise
            xs, ys = sorted({x for x, _ in xy}), sorted({y for _, y in xy})
            grid = np.full((len(ys), len(xs)), np.nan)
            for (x, y), t in zip(xy, cells):
                grid[ys.index(y), xs.index(x)] = t["score"]
            im = ax.imshow(grid, origin="lower", cmap="viridis", vmin=lo, vmax=max(hi, lo + 1e-6))
            for (i, j), v in np.ndenumerate(grid):
                if not np.isnan(v):
                    ax.text(j, i, f"{v:.3f}", ha="center", va="center", fontsize=8,
                            color="k" if v > lo + 0.6 * (hi - lo) else "w")
            best = llm_chosen(cells, m)
            (bx, by), = [p for p, t in zip(xy, cells) if t is best]
            ax.add_patch(plt.Rectangle((xs.index(bx) - 0.5, ys.index(by) - 0.5), 1, 1,
                                       fill=False, edgecolor="r", linewidth=2))
            ax.set_xticks(range(len(xs)), [f"{x:g}" for x in xs])
            ax.set_yticks(range(len(ys)), [f"{y:g}" for y in ys])
            ax.set_xlabel("sigma" if m == "es" else "lr")
            ax.set_ylabel("alpha / sigma" if m == "es" else "beta")
            ax.set_title(f"{LABEL[m]}: val greedy pass@1 after {cells[0]['iterations']} updates "
                         f"(base {cells[0]['base_score']:.3f})", fontsize=9)
            fig.colorbar(im, ax=ax, fraction=0.046)
        save(fig, f"{prefix}-grid.png")


def plots(s, figdir):
    plt = passk.pyplot("results.py's figures")
    os.makedirs(figdir, exist_ok=True)

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(os.path.join(figdir, name), dpi=100)
        plt.close(fig)
    K = s["eval"]["n"]
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= K]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, budget in zip(axes, BUDGETS):
        for name in ("base",) + ARMS:
            m = [mean_of(s, name, budget, f"pass@{k}") for k in ks]
            ax.errorbar(ks, [x[0] for x in m], yerr=[x[1] or 0 for x in m], marker="o", capsize=2, label=LABEL[name])
        ax.set_xscale("log", base=2)
        ax.set_title(budget, fontsize=9)
        ax.set_xlabel("k")
        ax.set_ylabel(f"held-out pass@k (T = 1, n = {K})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, "passk.png")

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, budget, x in ((axes[0], "equal-updates", 0), (axes[1], "equal-generations", 1),
                          (axes[2], "equal-generations", 2)):
        for i, name in enumerate(ARMS):
            cs = [c for key, c in s["curves"].items() if key.startswith(f"{name}|{budget}|")]
            n = min(len(c) for c in cs)
            ax.plot([np.mean([c[j][x] for c in cs]) for j in range(n)],
                    [np.mean([c[j][3] for c in cs]) for j in range(n)], marker="o", color=f"C{i}", label=LABEL[name])
        ax.set_xlabel(("updates (ES iterations or GRPO steps)", "sampled generations", "training seconds")[x])
        ax.set_ylabel("val pass@1 (n = 16), mean over seeds")
        ax.set_title(budget, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, "curves.png")

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, name in enumerate(ARMS):
        cs = [c for key, c in s["curves"].items() if key.startswith(f"{name}|equal-generations|")]
        n = min(len(c) for c in cs)
        axes[0].plot([np.mean([c[j][1] for c in cs]) for j in range(n)],
                     [np.mean([c[j][5] for c in cs]) for j in range(n)], marker="o", color=f"C{i}", label=LABEL[name])
    pts = s["diversity"]["points"]
    axes[1].scatter([p["js"] for p in pts], [p["gain16"] for p in pts], s=12)
    axes[0].set_xlabel("sampled generations")
    axes[0].set_ylabel("val token entropy (nats)")
    axes[1].set_xlabel("mean JS diversity of the ES population (bits)")
    axes[1].set_ylabel("val pass@16 gain of the run")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    save(fig, "entropy.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    sw = s["sequential"]["sweep"]
    for j, k in enumerate(f"pass@{k}" for k in sorted({1, 16, K})):
        ax.errorbar([r["grpo_share"] for r in sw], [r[k][0] for r in sw], yerr=[r[k][1] or 0 for r in sw],
                    marker="o", capsize=2, label=k, color=f"C{j}")
    ax.set_xlabel("share of the equal-generations budget spent on GRPO first (then ES)")
    ax.set_ylabel("held-out")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, "switch.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    cells = s["population"]["cells"]
    for spec in s["population"]["choice"]:
        rs = sorted((c for c in cells if c["size"] == spec), key=lambda c: c["N"])
        ax.errorbar([r["N"] for r in rs], [r["gain"][0] for r in rs], yerr=[r["gain"][1] or 0 for r in rs],
                    marker="o", capsize=2, label=f"{spec} ({rs[0]['params'] / 1e6:.2f}M)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("population N")
    ax.set_ylabel("val pass@1 gain, mean over seeds")
    ax.axhline(0, color="gray", linestyle=":")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, "popsize.png")

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    temps = sorted({r["T"] for r in s["temperature"]["rows"]})
    for i, name in enumerate(("base", "grpo", "es", "grpo-es")):
        for j, T in enumerate(temps):
            r = next(x for x in s["temperature"]["rows"] if x["name"] == name and x["T"] == T)
            kw = dict(color=f"C{i}", alpha=0.4 + 0.6 * (j + 1) / len(temps), marker="o", label=f"{name} T={T:g}")
            axes[0].plot(ks, [r[f"pass@{k}"] for k in ks], **kw)
            axes[1].plot(ks, [r[f"maj@{k}"] for k in ks], **kw)
    for ax, t in zip(axes, ("pass@k", "maj@k (majority vote)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k")
        ax.set_title(t, fontsize=9)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=6, ncol=2)
    save(fig, "temperature.png")
    plot_llm(s.get("llm", []), s.get("llm_tuning", []), plt, save, followups=s.get("llm_followups", []))
    earlier = s.get("llm_earlier") or {}
    plot_llm(earlier.get("runs", []), earlier.get("tuning", []), plt, save, "llm-earlier")
    for key, m in s["sparsity"]["models"].items():
        for png in ("keep.png", "compress.png"):
            src = os.path.join(m["folder"], png)
            if os.path.exists(src):
                shutil.copy(src, os.path.join(figdir, f"sparsity-{key}-{png}"))


def llm_chosen(tuning, method):
    """The selection rule, fixed before the runs: the highest val score after the equal-length short run. Issue 20's
    grid (T = 1 pass@1): a tie goes to the smaller step (alpha, or lr), then to the smaller sigma. Issue 38's (greedy
    pass@1, and only its runs where both kinds are present): a tie goes to the higher mean fitness_reliability (ES),
    or to the smaller lr, then beta (GRPO). Scores within 1e-6 of the best tie with it (the same count of solved
    samples can differ in its last float bits: 38/256 as 0.1484375 and 0.14843749999999997, which rounding to 6
    places would split, as 0.148438 and 0.148437; distinct counts differ by 1/samples)."""
    rows = [t for t in tuning if t["method"] == method]
    if not rows:
        return None
    greedy = [t for t in rows if t.get("score_kind") == "greedy_pass@1"]
    rows = greedy or rows  # scores of two protocols are not compared: issue 38's grid, where there is one
    best = max(t["score"] for t in rows)
    tied = [t for t in rows if t["score"] > best - 1e-6]
    if greedy:
        if method == "es":
            return max(tied, key=lambda t: t.get("reliability", -math.inf))  # the first of equals, in grid order
        return min(tied, key=lambda t: (t["params"]["lr"], t["params"].get("beta", 0.0)))
    step = "alpha" if method == "es" else "lr"
    return min(tied, key=lambda t: (t["params"][step], t["params"].get("sigma", 0)))


def llm_grid(tuning, method):
    """Issue 38's grid of one method: its cells scored by greedy pass@1 and each cell's two coordinates (ES: sigma,
    alpha / sigma; GRPO: lr, beta, 0 where the log has none)."""
    cells = [t for t in tuning if t["method"] == method and t.get("score_kind") == "greedy_pass@1"]
    if method == "es":
        return cells, [(t["params"]["sigma"], t["params"]["alpha"] / t["params"]["sigma"]) for t in cells]
    return cells, [(t["params"]["lr"], t["params"].get("beta", 0.0)) for t in cells]


def llm_extensions(tuning, method):
    """The cells issue 38's rule still needs before the runs: its choice must have a finished cell on both sides along
    each axis of its grid, the other coordinate held (ES: sigma and alpha / sigma; GRPO: lr and beta). Each side with
    none gets the cell one step past it (sigma and lr along 1, 3, 10, 30, ...; alpha / sigma x or / 2; beta along 0,
    0.01, 0.04, 0.1, 0.25, 0.5, 1, where 0 has no lower side), as that method's params. [] when the choice is inside
    its grid, or on a grid scored another way (issue 20's); a side at a ladder's end (sigma or lr 30, alpha / sigma
    1/256 or 32, beta 1) proposes nothing. Cells are told apart by these two coordinates only: a grid holds one
    population, prompt count and noise."""
    best = llm_chosen(tuning, method)
    if best is None or best.get("score_kind") != "greedy_pass@1":
        return []
    half_decades = [float(f"{m}e{e}") for e in range(-9, 2) for m in (1, 3)]  # sigma, lr
    if method == "es":
        make = lambda c: {"sigma": c[0], "alpha": float(f"{c[0] * c[1]:.6g}")}  # noqa: E731
        ladders = (half_decades, [2.0 ** e for e in range(-8, 6)])
    else:
        make = lambda c: {"lr": c[0], "beta": c[1]}  # noqa: E731
        ladders = (half_decades, [0.0, 0.01, 0.04, 0.1, 0.25, 0.5, 1.0])
    close = lambda a, b: math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-12)  # noqa: E731  ladder steps are >= x2
    grid, cells = llm_grid(tuning, method)
    here = next(c for t, c in zip(grid, cells) if t is best)
    out = []
    for axis in (0, 1):
        line = [c[axis] for c in cells if close(c[1 - axis], here[1 - axis])]
        for side in (1, -1):
            if any(side * (v - here[axis]) > 0 and not close(v, here[axis]) for v in line):
                continue  # a neighbour on this side
            past = [v for v in ladders[axis] if side * (v - here[axis]) > 0 and not close(v, here[axis])]
            if past:
                cell = list(here)
                cell[axis] = min(past) if side > 0 else max(past)
                out.append(make(cell))
    return out


def llm_cost(runs):
    """Cost at matched quality on the real model: the highest greedy pass@1 that ES's and GRPO's seed-mean curves
    both reach, and the generations and training minutes (seed means) each needs to first reach it. None without
    greedy curves on the same evaluation points for both."""
    mean = {}
    for m in ("es", "grpo"):
        curves = [r["greedy_curve"] for r in runs if r["method"] == m and "greedy_curve" in r]
        if not curves or len({len(c) for c in curves}) != 1:
            return None
        mean[m] = np.mean(np.asarray(curves, dtype=float), axis=0)  # [points, (generations, minutes, greedy)]
    target = min(float(mean[m][:, 2].max()) for m in mean)
    first = {m: next(p for p in mean[m] if p[2] >= target - 1e-9) for m in mean}
    return {"target": target, **{m: {"generations": float(p[0]), "minutes": float(p[1])} for m, p in first.items()}}


def render_llm(runs, tuning, figures, verdicts=(), prefix="llm", later=None, stall=None, followups=()):
    """RESULTS.md's section 8 from summary.json's llm, llm_tuning and llm_verdicts, then llm_stall's and
    llm_followups' lines (stall, followups); with later (the llm_tuning of the study that replaced it), llm_earlier's
    runs as a marked subsection, its figures named PREFIX-*.png."""
    fig = lambda f: (lambda g: f"![{g}]({figures}/{g})")(f.replace("llm-", prefix + "-", 1))  # noqa: E731
    diag = any("reliability" in t or "probe_gain" in t for t in tuning)  # issue 38's grids log both
    if later is None:
        L = ["## 8. A real LLM: SmolLM2-135M-Instruct, tuned ES against GRPO at equal generations", ""]
    else:  # the step that explains it: alpha / sigma and the population, against the later study's choice
        es_was, es_now = llm_chosen(tuning, "es"), llm_chosen(later, "es")
        step = lambda t: t["params"]["alpha"] / t["params"]["sigma"]  # noqa: E731
        L = ["### The earlier study (kept for the record)", "",
             "Made before the study above and superseded by it" + (
                 f": ES's tuned step there was alpha / sigma = {step(es_was):.3g} with N = "
                 f"{es_was['params']['population']} members x {es_was['params']['prompts']} prompts each, against "
                 f"{step(es_now):.3g} with {es_now['params']['population']} x {es_now['params']['prompts']} above "
                 f"({step(es_now) / step(es_was):.3g}x the step)" if es_was and es_now else "") + ".", ""]
    if not runs and not tuning:
        return L + ["No runs yet.", ""]
    L += [f"Task `{(runs or tuning)[0]['task']}`; commands and wall times in [docs/llm.md](docs/llm.md). "
          "Tuning: equal-length short runs from the base model, scored on the val split; the rule "
          "(fixed before the runs): the highest val pass@1 wins, a tie goes to the smaller step" + (
              "; on issue 38's grid the score is greedy pass@1 and a tie goes to the higher fitness reliability (ES), "
              "the smaller lr, then beta (GRPO)" if diag else "") + ".", ""]
    L += ["| method | settings | val " + ("score" if diag else "pass@1") + " before -> after | " + (
        "fitness reliability | probe gain | " if diag else "") + "generations | minutes |",
          "|---|---|---|" + ("---|---|" if diag else "") + "---|---|"]
    chosen = [llm_chosen(tuning, m) for m in LLM_METHODS]
    for t in tuning:  # before the runs exist, the rule's choice among the cells finished so far
        mark = (" **(chosen)**" if runs else " (leading)") if any(t is c for c in chosen) else ""
        p = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in t["params"].items())
        extra = "".join(f"{t[k]:+.3f} | " if k == "probe_gain" and k in t else f"{t[k]:.2f} | " if k in t else
                        "- | " for k in ("reliability", "probe_gain")) if diag else ""
        L.append(f"| {LABEL[t['method']]}{mark} | {p} | {t['base_score']:.3f} -> {t['score']:.3f} | {extra}"
                 f"{t['generations']:,} | {t['wall_minutes']:.1f} |")
    pending = [(m, c) for m in LLM_METHODS for c in llm_extensions(tuning, m)]
    if pending:
        L += ["", "The rule's choice is at an edge of its grid; the cells it still needs before the runs: " + "; ".join(
            f"{LABEL[m]} " + ", ".join(f"{k} {v:g}" for k, v in c.items()) for m, c in pending) + "."]
    if any(t.get("score_kind") == "greedy_pass@1" for t in tuning):
        L += ["", "The grids, the rule's choice outlined: " + fig("llm-grid.png")]
    if not runs:
        return L + ["", "The held-out runs at the chosen settings are not made yet.", ""]
    e = runs[0]["eval"]
    K = max(int(k[5:]) for k in runs[0]["final"] if k.startswith("pass@"))
    L += ["", f"Held-out: {e['problems']} {e['split']} problems x {e['n']} samples at T = 1. " + fig("llm-curves.png"),
          "", f"| method | seed | iterations | generations | minutes | pass@1 | pass@16 | pass@{K} | token entropy | "
          "answer entropy |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        b, f = r["base"], r["final"]
        its = f"{r['grpo_steps']} + {r['iterations']}" if "grpo_steps" in r else r["iterations"]  # GRPO's, then ES's
        L.append(f"| {LABEL[r['method']]} | {r['seed']} | {its} | {r['generations']:,.0f} | "
                 f"{r['wall_minutes']:.0f} | " + " | ".join(f"{b[k]:.3f} -> {f[k]:.3f}" if k in b else "-" for k in
                 ("pass@1", "pass@16", f"pass@{K}", "token_entropy", "answer_entropy")) + " |")
    L.append("")
    for method in LLM_METHODS:
        moved = llm_moved(runs, method)
        if moved:
            L.append(f"- {LABEL[method]} held-out pass@1: " + "; ".join(
                f"seed {m['seed']} {m['change']:+.3f} ({m['moved']}; 2 SE {m['two_se']:.3f})" for m in moved) + ".")
    mean = {m: {k: np.mean([r["final"].get(k, np.nan) for r in runs if r["method"] == m]) for k in ("pass@1", "pass@16")}
            for m in ("es", "grpo") if any(r["method"] == m for r in runs)}
    if len(mean) == 2:
        gens = {m: sorted({round(r["generations"]) for r in runs if r["method"] == m}) for m in mean}
        same = "At equal generations" if gens["es"] == gens["grpo"] else "At the end of each run"
        L.append(f"- {same} ({', '.join(f'{g:,}' for g in gens['es'])} generations ES, "
                 f"{', '.join(f'{g:,}' for g in gens['grpo'])} GRPO), mean over seeds: pass@1 ES "
                 f"{mean['es']['pass@1']:.3f} vs GRPO {mean['grpo']['pass@1']:.3f}; pass@16 ES "
                 f"{mean['es']['pass@16']:.3f} vs GRPO {mean['grpo']['pass@16']:.3f}.")
    for v in verdicts:
        L.append(f"- {v['claim']}: **{v['verdict']}** ({fmt(v['difference'], v['half_width'])}; {v['problems']} "
                 f"problems x {v['seeds']} seed{'s' if v['seeds'] > 1 else ''}, paired).")
    if any("greedy_curve" in r for r in runs):
        L += ["", "Greedy pass@1 over updates and over generations: " + fig("llm-greedy.png"), ""]
    cost = llm_cost(runs)
    if cost:
        L.append(f"- Cost at matched quality (greedy pass@1 {cost['target']:.3f}, the highest both reach): ES "
                 f"{cost['es']['generations']:,.0f} generations and {cost['es']['minutes']:.0f} minutes, GRPO "
                 f"{cost['grpo']['generations']:,.0f} and {cost['grpo']['minutes']:.0f} (minutes: each run's own "
                 "wall clock on the machines it ran on, which docs/llm.md names; generations do not depend on them).")
    return L + render_stall(stall, followups) + [""]


def render_stall(stall, followups):
    """Section 8's lines on whether ES stops moving and why (llm_stall), and the runs made about it (llm_followups)."""
    L = []
    if stall:
        spans = "; ".join(f"seed {s}, iteration {a} -> {b}: {ga:.3f} -> {gb:.3f}" for s, a, b, ga, gb in stall["spans"])
        seeds = f"{stall['seeds']} seed{'s' if stall['seeds'] > 1 else ''}"
        moved = {"holds": "it still rises", "does not hold": "it falls", "within noise": "no rise shown"}
        L.append(f"- Does ES stop moving? Held-out greedy pass@1 from each ES run's last evaluation at or before its "
                 f"middle to its end ({spans}): {fmt(stall['difference'], stall['half_width'])} ({stall['problems']} "
                 f"problems x {seeds}, paired): **{moved.get(stall['verdict'], stall['verdict'])}**. The diagnostics "
                 f"of those iterations ({stall['iterations']} x {seeds}): fitness reliability "
                 f"{stall['reliability']:.2f}, probe gain {fmt(stall['probe_gain'], stall['probe_half_width'], 4)} "
                 "an iteration (over iterations and seeds)" + (
                     f". Issue 38's rule (reliability below {STALL_RELIABILITY}: the signal; a probe gain above 0 at "
                     "95% with held-out flat: the training pool; else the step; the threshold and the span set "
                     f"after the ES runs) names **{stall['cause']}**." if stall["cause"] else "."))
    for f in followups:
        curve = ", ".join(f"{it}: {g:.3f}" + (f" (parent {p:.3f})" if p is not None else "") for it, g, p in f["curve"])
        diag = ", ".join(f"{label} {fmt(f[k], digits=d)}" for k, label, d in (
            ("reliability", "fitness reliability", 2), ("probe_gain", "probe gain", 3)) if k in f)
        said = "; ".join(f"{v['claim']}: **{v['verdict']}** ({fmt(v['difference'], v['half_width'])})"
                         for v in f["verdicts"])
        check = (f" (at the start the same outcome as the parent's evaluation on {f['start']['same']} of "
                 f"{f['problems']} problems)" if f["start"]["same"] is not None else "")
        L.append(f"- Follow-up `{f['name']}`: {f['change']}, from `{f['run']}` at iteration {f['iteration']} (its "
                 f"weights replayed from the log), seed {f['seed']}, {f['train_problems']:,} training problems; "
                 f"its own {f['iterations']} iterations, {f['generations']:,} generations, {f['wall_minutes']:.0f} "
                 f"minutes{'; ' + diag if diag else ''}. Greedy pass@1 by the parent's iteration: {curve}{check}. "
                 + said[0].upper() + said[1:]
                 + " (one run each, paired over problems: the interval does not count the noise of training seeds).")
    return L


def render(s, doc, figures):
    """RESULTS.md from the summary (every number in it comes from summary.json)."""
    K, fig = s["eval"]["n"], (lambda f: f"![{f}]({figures}/{f})")
    ks = sorted({1, 16, K})
    L = ["# RESULTS: the paper's claims, measured", "",
         f"Generated by `python results.py{s['flags']}` on {s['date']}, {s['machine']}; {s['compute_minutes']:.0f} "
         "minutes of compute in the runs and evaluations behind it (each timed when it was made; cached ones are "
         f"reused). Every number below is in [{figures}/summary.json]({figures}/summary.json).", "",
         f"**Setting.** Task `{s['task']}`" + (" (four numbers 1..9, `+ - *`, a target in 100..999; the split of "
                                              "every problem fixed by a hash)" if s["task"] == "toy4" else "")
         + f", base model `{s['model']}`. Final evaluations: {s['eval']['problems']} held-out "
         f"test problems never seen in pre- or post-training, n = {K} samples each at T = 1, passk.py's seed (the same "
         f"random numbers for every model). Validation: {s['val']['problems']} val problems, n = 16. The base model: "
         f"pass@1 {s['base']['pass@1']:.3f}, pass@16 {s['base']['pass@16']:.3f}, pass@{K} "
         f"{s['base'][f'pass@{K}']:.3f}" + ("" if s["guess_rate"] is None else
                                             f"; a blind guess among well-formed answers solves "
                                             f"{100 * s['guess_rate']:.2f}% of problems per sample") + ".", "",
         f"**Budgets.** ES: N = {s['sizes']['es']['population']} members x {s['sizes']['es']['prompts']} greedy "
         f"prompts = {s['sizes']['es']['generations_per_iteration']} generations per iteration; GRPO: "
         f"{s['sizes']['grpo']['prompts']} prompts x {s['sizes']['grpo']['group']} = "
         f"{s['sizes']['grpo']['generations_per_step']} per step. Equal updates: ES iterations = GRPO steps = "
         f"{s['sizes']['updates']} (how the paper compares). Equal generations: {s['generations']:,} each (the cost "
         "view). Schedules: " + "; ".join(f"{b}: " + ", ".join(f"{LABEL[n]} `{t}`" for n, t in s["plan"][b].items())
                                          for b in BUDGETS) + ". Every arm runs its whole budget; its val curve is "
         "plotted below, so it shows whether it was still rising.", ""]
    # tuning
    L += ["## 0. Tuning, on the val split", "",
          f"Each method gets the same number of trials ({s['trials']['es']} per budget), seed 0, scored by a rule "
          "fixed before the runs: the final val pass@1, ties (3 decimals) broken by val pass@16. ES's trials are "
          "the same runs at both budgets (ES iterations are equal in both); GRPO is tuned again for each.", "",
          "| method | budget | params | val pass@1 | val pass@16 | chosen |", "|---|---|---|---|---|---|"]
    for m in ("es", "grpo"):
        for t in s["tuning"][m]:
            b = "equal-updates" if t["budget"] == "both" else t["budget"]
            ch = "yes" if t["params"] == s["chosen"][m][b] else ""
            L.append(f"| {m.upper()} | {t['budget']} | " + ", ".join(f"{k} {v:g}" for k, v in t["params"].items())
                     + f" | {t['score']['pass@1']:.3f} | {t['score']['pass@16']:.3f} | {ch} |")
    L += ["", "Chosen: ES " + ", ".join(f"{k} {v:g}" for k, v in s["chosen"]["es"]["equal-updates"].items())
          + "; GRPO " + "; ".join(f"{b}: " + ", ".join(f"{k} {v:g}" for k, v in s["chosen"]["grpo"][b].items())
                                  for b in BUDGETS) + ".", ""]
    # claim 1
    seeds = len({r["seed"] for r in s["arms"]})
    L += ["## 1. ES raises Pass@1 and Pass@K; GRPO raises Pass@1 and lowers Pass@K", "",
          f"Mean over {seeds} seeds ± the half-width of the 95% interval (held-out test, T = 1, n = {K}).", "",
          "| budget | arm | " + " | ".join(f"pass@{k}" for k in ks) + " | token entropy |",
          "|---|---|" + "---|" * (len(ks) + 1)]
    for b in BUDGETS:
        for name in ("base",) + ARMS:
            L.append(f"| {b} | {LABEL[name]} | " + " | ".join(fmt(*mean_of(s, name, b, f"pass@{k}")) for k in ks)
                     + f" | {fmt(*mean_of(s, name, b, 'token_entropy'))} |")
    L += ["", fig("passk.png"), "", "Validation curves (mean over seeds):", "", fig("curves.png"), ""]
    L += [vline(v) for v in s["passk"]["verdicts"]] + [""]
    # claim 2
    d = s["diversity"]
    L += ["## 2. The mechanism: entropy over training, and the JS diversity of the ES population", "",
          f"Every ES-only run ({len(d['points'])}: the ES tuning trials, the headline ES seeds and the population "
          "cells): the mean verifier-projected JS diversity of its population over training against its val pass@16 "
          "gain.", "", fig("entropy.png"), ""] + [vline(v) for v in d["verdicts"]] + [""]
    # claim 3
    sq = s["sequential"]
    L += ["## 3. GRPO first, then ES", ""] + [vline(v) for v in sq["verdicts"]] + [
        "", "The switch point at equal generations (share of the budget on GRPO first, then ES; held-out test):", "",
        "| GRPO share | schedule | seeds | " + " | ".join(f"pass@{k}" for k in ks) + " |",
        "|---|---|---|" + "---|" * len(ks)]
    for r in sq["sweep"]:
        L.append(f"| {r['grpo_share']:g} | `{r['schedule']}` | {r['seeds']} | "
                 + " | ".join(fmt(*r[f"pass@{k}"]) for k in ks) + " |")
    L += ["", fig("switch.png"), ""]
    # claim 4
    sp = s["sparsity"]
    L += ["## 4. Functional sparsity, forgetting, compression at a matched gain (sparsity.py)", "",
          f"The ES model is the seed-0 equal-updates ES run; its held-out pass@1 gain (n = 16) is {sp['target']:+.3f}. "
          "Each GRPO model (the tuned lr, and lower ones) was trained until its gain reached that level (less 0.01), "
          "or to the equal-generations budget. The table is sparsity.py's own evaluation (n = 16, the held-out "
          "problems); a pair is matched when the two gains there are within 0.02.", "",
          "| model | pass@1 gain | relative L2 drift | max abs delta | updates above 1.5e-3 | 90% of the gain from "
          "top | random | LM loss base -> tuned | unseen family pass@1 | pass@k |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for key, m in sp["models"].items():
        L.append(f"| {m['label']} | {m['gain']:+.3f} | {m['relative_l2']:.4f} | {m['max_abs_delta']:.3g} | "
                 f"{m['above_0.0015']:.3f} | {sparsity.q_text(m['keep_top'])} | {sparsity.q_text(m['keep_random'])} "
                 f"| {m['lm_loss'][0]:.4f} -> {m['lm_loss'][1]:.4f} | {m['forget_pass@1'][0]:.3f} -> "
                 f"{m['forget_pass@1'][1]:.3f} | @{m['forget_k']} {m['forget_pass@k'][0]:.3f} -> "
                 f"{m['forget_pass@k'][1]:.3f} |")
    L += ["", "Drift ratio (ES / GRPO relative L2) for each pair: " + "; ".join(
        f"{sp['models'][p['grpo']]['label']}: {p['ratio']:.1f}x (gain gap {p['gain_gap']:+.3f}, "
        f"{'matched' if p['matched'] else 'not matched'})" for p in sp["pairs"]) + ". The paper's 40-44x compares ES "
        "with GRPO run by its own LLM recipe, a learning rate far below what a tuned run on this small model uses: "
        "the lower-learning-rate pairs are the nearer analogue; the tuned pair is what a user would compare.", "",
        "Compression (retained pass@1 gain of the compressed tuned model over the compressed base):", "",
        "| method | " + " | ".join(m["label"] for m in sp["models"].values()) + " |",
        "|---|" + "---|" * len(sp["models"])]
    first = next(iter(sp["models"].values()))
    for i, c in enumerate(first["compress"]):
        cells = [m["compress"][i]["retained"] if i < len(m["compress"]) else None for m in sp["models"].values()]
        L.append(f"| {c['method']} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in cells) + " |")
    if "seeds" in sp:  # claim 4 over seeds: each seed's figures, then the verdicts over them
        L += ["", "Over seeds (ES of each seed against GRPO of the same seed; forgetting on "
              f"{sp['verdicts'][2].get('problems', '')} unseen-family problems):", "",
              "| seed | ES gain | drift ratio (matched pairs) | 90% of the gain from top | random | unseen pass@k "
              "change ES | GRPO (tuned lr) |", "|---|---|---|---|---|---|---|"]
        for r in sp["seeds"]:
            ratios = ", ".join(f"{p['ratio']:.0f}x" for p in r["pairs"] if p["matched"]) or "none matched"
            L.append(f"| {r['seed']} | {r['gain']:+.3f} | {ratios} | {sparsity.q_text(r['keep_top'])} | "
                     f"{sparsity.q_text(r['keep_random'])} | {r['forget_change']:+.3f} | "
                     f"{r['grpo_forget_change']:+.3f} |")
    L += ["", fig("sparsity-es-keep.png"), ""] + [vline(v) for v in sp["verdicts"]] + [""]
    drift = sp["verdicts"][0]
    if "seeds" in sp and drift["half_width"] is not None:  # the log10 verdict read back as a ratio
        d, h = drift["difference"], drift["half_width"]
        L += [f"The drift verdict as a ratio: ES drifts {10 ** d:.0f}x as far as GRPO at a matched gain (geometric "
              f"mean over seeds, 95% interval {10 ** (d - h):.0f}x..{10 ** (d + h):.0f}x).", ""]
    # claim 5
    po = s["population"]
    Ns = sorted({c["N"] for c in po["cells"]})
    L += ["## 5. Population size against model size", "",
          "Val pass@1 gain of ES over each size's own base (mean over seeds ± half-width); the grid doubles N at a "
          "size while its choice is at the edge.", "",
          "| size | params | " + " | ".join(f"N={N}" for N in Ns) + " | smallest N with 90% of the best gain |",
          "|---|---|" + "---|" * (len(Ns) + 1)]
    for spec, ch in po["choice"].items():
        by = {c["N"]: c for c in po["cells"] if c["size"] == spec}
        L.append(f"| {spec} | {ch['params'] / 1e6:.2f}M | " + " | ".join(
            fmt(*by[N]["gain"]) if N in by else "" for N in Ns)
            + f" | {'none' if ch['N'] is None else ch['N']}{' (edge)' if ch['edge'] else ''}"
            + (f" ({ch['range'][0]}..{ch['range'][1]} within the intervals)" if ch.get("range") else "") + " |")
    L += ["", fig("popsize.png"), ""] + [vline(v) for v in po["verdicts"]] + [""]
    # cost
    c = s["cost"]
    L += ["## 6. Cost at matched quality (the paper's missing figure)", ""]
    for k, rec in c["matched"].items():
        if not rec["gain_exists"]:
            L.append(f"- {k}: no level above the start ({rec['start']:.3f}) is reached by both (best: ES "
                     f"{rec['best']['es']:.3f}, GRPO {rec['best']['grpo']:.3f}).")
            continue
        parts = [f"{LABEL[n]} never reaches it" if rec[n] is None else
                 f"{LABEL[n]} after {rec[n][0]:,.0f} generations, {rec[n][1]:.0f} s" for n in ("es", "grpo")]
        L.append(f"- val {k} = {rec['target']:.3f} (the highest level both reach, mean over seeds): "
                 + "; ".join(parts) + ".")
    mem = c["memory"]
    if mem.get("es-full") and mem.get("grpo"):
        L.append(f"- Peak memory over the loaded model (fresh processes, bench.py's worker, models/toy): one ES "
                 f"iteration {mem['es-full']['peak_rss_mb_over_model']:.0f} MB, one GRPO step "
                 f"{mem['grpo']['peak_rss_mb_over_model']:.0f} MB RSS.")
    L += ["", "Training seconds per run are in the curves (right panel of the validation curves above).", ""]
    # temperature
    rows = s["temperature"]["rows"]
    L += ["## 7. Does an ES-trained model make inference-time diversity methods work again?", "",
          f"| model | T | pass@1 | pass@16 | pass@{K} | maj@16 | maj@{K} |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append(f"| {LABEL[r['name']]} | {r['T']:g} | {r['pass@1']:.3f} | {r['pass@16']:.3f} | {r[f'pass@{K}']:.3f} "
                 f"| {r['maj@16']:.3f} | {r[f'maj@{K}']:.3f} |")
    hot = max(r["T"] for r in rows)
    gain = {n: next(r for r in rows if r["name"] == n and r["T"] == hot)[f"pass@{K}"]
            - next(r for r in rows if r["name"] == n and r["T"] == 1.0)[f"pass@{K}"] for n in ("grpo", "es")}
    if "verdicts" in s["temperature"]:  # over seeds
        n = max(r["seeds"] for r in rows)
        L += ["", f"Equal-generations models, mean over {n} seeds (the base model is one). " + fig("temperature.png"),
              ""] + [vline(v) for v in s["temperature"]["verdicts"]] + [""]
    else:
        L += ["", f"Equal-generations models, seed 0. " + fig("temperature.png"), "",
              f"Raising T to {hot:g} changes pass@{K} by {gain['es']:+.3f} for ES and {gain['grpo']:+.3f} for GRPO "
              "(one seed: a direction, not a verdict).", ""]
    earlier = s.get("llm_earlier") or {}
    if s.get("llm") or s.get("llm_tuning") or earlier.get("runs") or earlier.get("tuning"):
        L += render_llm(s.get("llm", []), s.get("llm_tuning", []), figures, s.get("llm_verdicts", []),
                        stall=s.get("llm_stall"), followups=s.get("llm_followups", []))
    if earlier.get("runs") or earlier.get("tuning"):
        L += render_llm(earlier["runs"], earlier["tuning"], figures, earlier["verdicts"], "llm-earlier",
                        s.get("llm_tuning", []))
    L += ["## Every verdict", "", "| claim | verdict | difference | half-width |", "|---|---|---|---|"]
    for v in s["verdicts"] + [{**v, "claim": f"SmolLM2: {v['claim']}"} for v in s.get("llm_verdicts", [])]:
        L.append(f"| {v['claim']} | {v['verdict']} | {fmt(v['difference'])} | {fmt(v['half_width'])} |")
    with open(doc + ".tmp", "w") as f:
        f.write("\n".join(L) + "\n")
    os.replace(doc + ".tmp", doc)
    print(f"wrote {doc}")


# ---- entry point -------------------------------------------------------------------------------------------------------
QUICK = dict(seeds="0,1", sweep_seeds="0,1", updates=2, es_population=4, es_prompts=4, grpo_prompts=2, grpo_group=4,
             es_sigmas="0.02", es_alphas="0.008,0.03", grpo_lrs="2e-4,1e-3", grpo_betas="0", val_problems=8,
             eval_problems=10, eval_n=16, switches="0.25", temperatures="1.0,1.3", sizes="32x1,48x1", size_steps=5,
             populations="2,4", max_population=8, pop_iterations=2, sparsity_seeds="0,1", forget_problems=12)


def check(args):
    passk.check_fields(args)
    rules = {"seeds": (0, math.inf, True), "sweep_seeds": (0, math.inf, True), "populations": (2, math.inf, True),
             "es_sigmas": (1e-12, math.inf, False), "es_alphas": (1e-12, math.inf, False),
             "grpo_lrs": (1e-12, math.inf, False), "grpo_betas": (0, math.inf, False),
             "switches": (1e-9, 1 - 1e-9, False), "temperatures": (1e-9, math.inf, False),
             "lr_divisors": (1, math.inf, False), "sparsity_seeds": (0, math.inf, True)}
    for flag, (lo, hi, whole) in rules.items():
        text = getattr(args, flag)
        try:
            values = [float(x) for x in text.split(",")]
        except ValueError:
            values = []
        if not values or not all(lo <= v <= hi and (not whole or v == int(v)) for v in values) or (
                whole and len(set(values)) != len(values)):  # a seed given twice would count twice
            kind = "distinct whole numbers" if whole else "numbers"
            raise verify.UsageError(f"--{flag.replace('_', '-')} must be a comma list of {kind} in "
                                    f"[{lo:g}, {hi:g}]; got {text!r}")
    if args.eval_n & (args.eval_n - 1):
        raise verify.UsageError(f"--eval-n must be a power of 2 (pass@eval_n is a reported k); got {args.eval_n}")
    es_trials = len(numbers(args.es_sigmas)) * len(numbers(args.es_alphas))
    grpo_trials = len(numbers(args.grpo_lrs)) * len(numbers(args.grpo_betas))
    if es_trials != grpo_trials:
        raise verify.UsageError(f"the tuning grids must have the same number of trials (ES {es_trials}, GRPO "
                                f"{grpo_trials}): change --es-sigmas/--es-alphas or --grpo-lrs/--grpo-betas")
    if 1.0 not in numbers(args.temperatures):
        raise verify.UsageError("--temperatures must include 1.0 (the temperature of every other table)")
    if not all(len(s.split("x")) == 2 and all(p.isdecimal() for p in s.split("x")) for s in args.sizes.split(",")):
        raise verify.UsageError(f"--sizes must be a comma list of HIDDENxLAYERS; got {args.sizes!r}")
    if "val" not in verify.get_task(args.task).splits:
        raise verify.UsageError(f"--task {args.task} has no val split to tune on (toy4 has one)")


def start_helper(typed, threads, out, k):
    """Another `python results.py` with the same flags as a helper (--workers 0): it takes the runs no process is
    making yet, so the two share the work; its output goes to OUT/worker-K.log."""
    argv = []
    for f in dataclasses.fields(Args):
        v = getattr(typed, f.name)
        if v != f.default and f.name not in ("workers", "threads"):
            argv += [f"--{f.name.replace('_', '-')}"] + ([] if isinstance(v, bool) else [str(v)])
    os.makedirs(out, exist_ok=True)
    log = open(os.path.join(out, f"worker-{k}.log"), "w")
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv, "--workers", "0", "--threads",
                             str(threads)], stdout=log, stderr=subprocess.STDOUT)


def run(args):
    check(args)
    typed = args
    if args.quick:
        out = args.out if args.out != Args.out else args.out + "-quick"  # never the full run's cache
        args = dataclasses.replace(args, **QUICK, out=out, doc=os.path.join(out, "RESULTS.md"))
    figdir = os.path.join(os.path.dirname(os.path.abspath(args.doc)), args.figures)
    path = os.path.join(figdir, "summary.json")
    if args.render or args.llm:
        if not os.path.exists(path):
            raise verify.UsageError(f"--{'render' if args.render else 'llm'} needs {path} (written by a full run)")
        s = json.load(open(path))
        if args.llm:
            s.update(llm_studies(args))
            with open(path + ".tmp", "w") as f:
                json.dump(s, f, indent=1)
            os.replace(path + ".tmp", path)
    else:
        passk.check_writable(args.out)
        passk.check_writable(args.doc, "--doc", directory=False)
        threads = args.threads or max(1, (os.cpu_count() or 1) // max(1, args.workers))
        torch.set_num_threads(threads)
        helpers = [start_helper(typed, threads, args.out, k) for k in range(1, args.workers)]
        try:
            s = collect(args, typed)
        except BaseException:
            for h in helpers:
                h.terminate()  # no helper outlives a failed or interrupted report
            raise
        for h in helpers:
            h.wait()  # done or nearly: every run this process waited for is made
        if args.workers == 0:
            return None
        os.makedirs(figdir, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(s, f, indent=1)
        os.replace(path + ".tmp", path)
    plots(s, figdir)
    render(s, args.doc, args.figures)
    return s


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
