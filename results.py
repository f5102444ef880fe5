"""results.py: every claim of the paper, measured on the embedded model, with a verdict; writes RESULTS.md and plots.

Ba et al. (arXiv 2608.27351) claim that ES, unlike GRPO, raises Pass@1 and Pass@K; that the verifier-projected JS
diversity of the ES population explains it; that GRPO then ES combines the two; that ES's large drift hides a sparse
functional change without forgetting; and that larger models need smaller populations. This script runs, at equal
budgets of sampled generations and over several seeds, everything those claims need, through the project's own
scripts (sequential.py runs every schedule, sparsity.py the weight analysis, passk.py every evaluation), and writes
RESULTS.md: for each claim what was measured, the verdict (holds / does not hold / within noise / not testable here),
the tables and the plots (PNGs in --figures). Every number in RESULTS.md is computed by this run.

    python results.py              # under 60 minutes on 2 CPU cores; resumable: finished runs are reused
    python results.py --quick      # the same pipeline, tiny (a test runs it); writes to --out, not RESULTS.md

Verdict rules (fixed in advance, applied to the numbers): a difference is "within noise" when the 95% interval of its
mean over seeds (t distribution) contains 0; with one seed, the paired bootstrap over problems is used instead.
"""
import dataclasses
import json
import math
import os
import platform
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

TOY = passk.DEFAULT_MODEL
SCHEDULES = ("grpo", "es", "grpo-es", "es-grpo")  # with the base model, the paper's five arms
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


@dataclass
class Args:
    out: str = "runs/results"
    """working directory: every run, evaluation and cached model (reused when the script is run again)"""
    doc: str = "RESULTS.md"
    """the report to write"""
    figures: str = "results"
    """folder for the report's PNG plots (relative to the report)"""
    quick: bool = False
    """the whole pipeline at toy sizes, to test it (the figures mean nothing); writes OUT/RESULTS.md"""
    seeds: str = "0,1,2"
    """comma list of training seeds for every headline comparison"""
    budget: int = 76800
    """sampled generations per training run (20 ES iterations of es.py's defaults, 300 GRPO steps); in [1, inf)"""
    eval_problems: int = 200
    """held-out problems of every evaluation; in [1, inf)"""
    eval_n: int = 64
    """samples per problem of the final evaluations (Pass@1..Pass@eval_n, maj@k); in [16, inf)"""
    temperatures: str = "0.6,1.0,1.3"
    """comma list of sampling temperatures for the inference-time diversity study"""
    sizes: str = "64x2,96x3,160x4"
    """comma list of HIDDENxLAYERS: embedded-model sizes for population against model size (built by toy.py)"""
    size_steps: int = 800
    """toy.py pretraining steps for those sizes (batch 128; all sizes alike); in [1, inf)"""
    populations: str = "4,8,16,32"
    """comma list of ES population sizes N for population against model size"""
    pop_iterations: int = 30
    """ES iterations of each population-size run; in [1, inf)"""
    sparsity_iterations: int = 100
    """ES iterations of the model sparsity.py analyses (es.py's default: the headline budget's gain is too small to
    divide); the GRPO model analysed is the seed-0 headline run; in [1, inf)"""
    llm_runs: str = "runs"
    """folder holding smollm2-grpo/ and smollm2-es/ (docs/llm.md's SmolLM2 commands); reported when present"""
    threads: int = 0
    """torch CPU threads (0: torch's default); in [0, inf)"""


# ---- small statistics ------------------------------------------------------------------------------------------------
def interval(values):
    """(mean, half-width of the 95% interval over seeds), half-width None with one value."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return float(v.mean()), None
    return float(v.mean()), T95.get(len(v) - 1, 1.96) * float(v.std(ddof=1)) / math.sqrt(len(v))


def bootstrap(deltas, draws=4000, seed=0):
    """95% interval of the mean of per-problem differences (paired bootstrap)."""
    d = np.asarray(deltas, dtype=float)
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(draws, len(d)))].mean(1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def diff_verdict(diffs, per_problem=None):
    """'higher' / 'lower' / 'within noise' for a list of per-seed differences (or per-problem when one seed)."""
    m, h = interval(diffs)
    if h is None and per_problem is not None:
        lo, hi = bootstrap(per_problem)
    elif h is None:
        return "within noise", m, None
    else:
        lo, hi = m - h, m + h
    return ("higher" if lo > 0 else "lower" if hi < 0 else "within noise"), m, (lo, hi)


def fmt(m, h=None, digits=3):
    return f"{m:.{digits}f}" + (f" ± {h:.{digits}f}" if h is not None else "")


# ---- the pipeline ----------------------------------------------------------------------------------------------------
class Results:
    def __init__(self, args, given=None):
        self.args, self.given = args, given or args  # given: the flags as typed (before --quick's sizes)
        self.seeds = [int(s) for s in args.seeds.split(",")]
        self.temps = [float(t) for t in args.temperatures.split(",")]
        self.task = verify.get_task("toy")
        self.held_out = self.task.examples("test", args.eval_problems, seed=1234)
        self.figdir = os.path.join(os.path.dirname(os.path.abspath(args.doc)), args.figures)
        self.es_cfg = dict(population=4, prompts=16) if args.quick else {}
        self.grpo_cfg = dict(prompts=4, group=4) if args.quick else {}
        a = es.Args(**self.es_cfg)
        g = sequential.grpo.Args(**self.grpo_cfg)
        self.per_it = {"es": a.population * a.prompts, "grpo": g.prompts * g.group}
        self.t0 = time.time()

    def path(self, *parts):
        """A path under OUT whose parent folder exists."""
        p = os.path.join(self.args.out, *parts)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p

    def folder(self, *parts):
        p = os.path.join(self.args.out, *parts)
        os.makedirs(p, exist_ok=True)
        return p

    def cached(self, name, fn):
        """fn() once; its JSON result is kept in OUT/cache so that a rerun (or a resume) reuses it."""
        path = self.path("cache", name + ".json")
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
        value = fn()
        with open(path + ".tmp", "w") as f:
            json.dump(value, f)
        os.replace(path + ".tmp", path)
        return value

    # 1. the five arms at equal budgets ------------------------------------------------------------------------------
    def stages(self, name):
        G, it = self.args.budget, self.per_it
        if name in ("grpo", "es"):
            return [(name, max(1, round(G / it[name])))]
        first, second = name.split("-")
        return [(first, max(1, round(G / 2 / it[first]))), (second, max(1, round(G / 2 / it[second])))]

    def run_dir(self, name, seed):
        return self.path("runs", f"{name}-s{seed}")

    def train_all(self):
        es_every = max(1, self.stages("es")[0][1] // 4)
        grpo_every = max(1, self.stages("grpo")[0][1] // 4)
        for seed in self.seeds:
            for name in SCHEDULES:
                stages = self.stages(name)
                print(f"[results] {name} seed {seed}: {sequential.schedule_text(stages)}", flush=True)
                args = sequential.Args(schedule=sequential.schedule_text(stages), seed=seed, eval_n=16,
                                       eval_problems=self.args.eval_problems, threads=self.args.threads,
                                       out=self.run_dir(name, seed),
                                       es={**self.es_cfg, "eval_every": es_every, "save_every": 0},
                                       grpo={**self.grpo_cfg, "eval_every": grpo_every, "save_every": 0})
                sequential.run_schedule(args, stages, args.out)

    def log(self, name, seed):
        return es.read_log(os.path.join(self.run_dir(name, seed), "log.jsonl"))

    def final_eval(self, model_name, T, seed_label):
        """Pass@k and maj@k (n = eval_n) of one model at temperature T, cached."""
        def go():
            model, tok = passk.load_model(model_name)
            summary, records = passk.evaluate(model, tok, self.task, self.held_out, n=self.args.eval_n,
                                              temperature=T, batch_size=512, seed=passk.EVAL_SEED, maj=True)
            return {"summary": summary, "correct": [r["correct"] for r in records]}
        return self.cached(f"eval-{seed_label}-T{T:g}", go)

    def evaluate_all(self):
        """T = 1 for every arm and seed; the other temperatures for base, GRPO, ES and GRPO->ES of the first seed."""
        self.evals = {("base", s, 1.0): self.final_eval(TOY, 1.0, "base") for s in self.seeds}
        for s in self.seeds:
            for name in SCHEDULES:
                self.evals[name, s, 1.0] = self.final_eval(self.run_dir(name, s), 1.0, f"{name}-s{s}")
        s0 = self.seeds[0]
        for T in self.temps:
            self.evals["base", s0, T] = self.final_eval(TOY, T, "base")
            for name in ("grpo", "es", "grpo-es"):
                self.evals[name, s0, T] = self.final_eval(self.run_dir(name, s0), T, f"{name}-s{s0}")

    # 3. functional sparsity and forgetting ---------------------------------------------------------------------------
    def sparsity_all(self):
        self.sparse = {}
        s0, es_dir = self.seeds[0], self.path("runs", f"es-long-s{self.seeds[0]}")
        stages = [("es", self.args.sparsity_iterations)]
        print(f"[results] es-long seed {s0}: {sequential.schedule_text(stages)}", flush=True)
        sequential.run_schedule(sequential.Args(schedule=sequential.schedule_text(stages), seed=s0, eval_n=16,
                                                eval_problems=self.args.eval_problems, threads=self.args.threads,
                                                out=es_dir, es={**self.es_cfg, "eval_every": 0, "save_every": 0}),
                                stages, es_dir)
        tuned = {"es": es_dir, "grpo": self.run_dir("grpo", s0)}
        for name in ("es", "grpo"):
            out = self.folder("sparsity", name)
            done = os.path.join(out, "sparsity.jsonl")
            if not os.path.exists(done):
                kw = dict(eval_n=4, eval_problems=10, keep="0,10,100", prune="50", quant="4", lm_sequences=64) \
                    if self.args.quick else dict(eval_n=16, eval_problems=self.args.eval_problems)
                sparsity.run(sparsity.Args(base=TOY, tuned=tuned[name], out=out,
                                           threads=self.args.threads, **kw))
            self.sparse[name] = [json.loads(x) for x in open(done)]

    # 4. population against model size --------------------------------------------------------------------------------
    def size_model(self, spec):
        hidden, layers = (int(x) for x in spec.split("x"))
        path = os.path.join(self.folder("models"), f"toy-h{hidden}-l{layers}")
        if not os.path.exists(os.path.join(path, "config.json")):
            import toy
            toy.main(toy.Args(out=path, hidden=hidden, layers=layers, intermediate=3 * hidden,
                              heads=4 if hidden % 4 == 0 else 2, steps=self.args.size_steps, batch=128,
                              eval_problems=0, threads=self.args.threads))
        return path

    def population_all(self):
        self.pop = []
        pops = [int(x) for x in self.args.populations.split(",")]
        for spec in self.args.sizes.split(","):
            model = self.size_model(spec)
            for N in pops:
                out = os.path.join(self.folder("popsize"), f"{spec}-N{N}")
                if es.latest_checkpoint(out) is None:
                    es.train(es.Args(model=model, population=N, iterations=self.args.pop_iterations, eval_every=0,
                                     eval_n=16, eval_problems=self.args.eval_problems, save_every=0, out=out,
                                     threads=self.args.threads, **{k: v for k, v in self.es_cfg.items()
                                                                   if k != "population"}))
                lines = es.read_log(os.path.join(out, "log.jsonl"))
                ev = [r for r in lines if r["type"] == "eval"]
                train = [r for r in lines if r["type"] == "train"]
                params = next(r for r in lines if r["type"] == "config")["trained_params"]
                self.pop.append({"size": spec, "params": params, "N": N, "base": ev[0]["pass@1"],
                                 "final": ev[-1]["pass@1"], "gain": ev[-1]["pass@1"] - ev[0]["pass@1"],
                                 "gain16": ev[-1]["pass@16"] - ev[0]["pass@16"],
                                 "js": float(np.mean([r["js_diversity"] for r in train]))})

    # 5. memory of one ES iteration and one GRPO step (bench.py's worker, fresh processes) ---------------------------
    def memory(self):
        def go():
            rec = {}
            for job in ("es-full", "grpo"):
                cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench.py"),
                       "--worker", job, "--threads", str(self.args.threads)]
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
                rec[job] = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
            return rec
        return self.cached("memory", go)

    # ---- analysis ------------------------------------------------------------------------------------------------
    def metric(self, name, k, T=1.0, kind="pass"):
        return [self.evals[name, s, T]["summary"][f"{kind}@{k}"] for s in self.seeds]

    def compare(self, name, other, k):
        """Verdict of name - other at pass@k (T = 1), over seeds; per-problem bootstrap with one seed."""
        diffs = [a - b for a, b in zip(self.metric(name, k), self.metric(other, k))]
        per_problem = None
        if len(self.seeds) == 1:
            n = self.args.eval_n
            a = [passk.pass_at_k(n, c, k) for c in self.evals[name, self.seeds[0], 1.0]["correct"]]
            b = [passk.pass_at_k(n, c, k) for c in self.evals[other, self.seeds[0], 1.0]["correct"]]
            per_problem = [x - y for x, y in zip(a, b)]
        return diff_verdict(diffs, per_problem)

    def curves(self, name, seed):
        """(generations, seconds, pass@1, pass@16, token_entropy, answer_entropy, step) at each eval of a run."""
        return [(r["generations"], r["wall"], r["pass@1"], r["pass@16"], r["token_entropy"], r["answer_entropy"],
                 r["step"]) for r in self.log(name, seed) if r["type"] == "eval"]

    def matched_cost(self):
        """For pass@1 and pass@16: the highest level both ES and GRPO reach after their start (mean over seeds of
        the per-seed curves), and the generations and seconds each first needs for it."""
        out = {}
        for k in ("pass@1", "pass@16"):
            col = 2 if k == "pass@1" else 3
            base = self.curves("es", self.seeds[0])[0][col]
            best = {a: np.mean([max(p[col] for p in self.curves(a, s)[1:]) for s in self.seeds]) for a in
                    ("es", "grpo")}
            target = min(best.values())
            rec = {"target": target, "base": base}
            for a in ("es", "grpo"):
                firsts = []
                for s in self.seeds:
                    hit = next((p for p in self.curves(a, s)[1:] if p[col] >= target), None)
                    firsts.append(hit)
                rec[a] = None if any(h is None for h in firsts) else (float(np.mean([h[0] for h in firsts])),
                                                                      float(np.mean([h[1] for h in firsts])))
                rec[f"{a}_best"] = float(best[a])
            rec["gain_exists"] = target > base + 1e-9
            out[k] = rec
        return out

    # ---- figures ---------------------------------------------------------------------------------------------------
    def figures(self):
        os.makedirs(self.figdir, exist_ok=True)
        plt = passk.pyplot("results.py's figures")
        ks = passk.default_ks(self.args.eval_n)
        names = ["base"] + list(SCHEDULES)
        fig, ax = plt.subplots(figsize=(6, 4))
        for name in names:
            m = [interval(self.metric(name, k)) for k in ks]
            ax.errorbar(ks, [x[0] for x in m], yerr=[x[1] or 0 for x in m], marker="o", capsize=2,
                        label={"grpo-es": "GRPO->ES", "es-grpo": "ES->GRPO"}.get(name, name.upper()
                                                                               if name != "base" else "base"))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k")
        ax.set_ylabel(f"held-out pass@k (T = 1, n = {self.args.eval_n})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(self.figdir, "passk.png"), dpi=100)
        plt.close(fig)

        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
        for name, style in (("grpo", "-"), ("es", "--")):
            for s in self.seeds:
                c = self.curves(name, s)
                lab = name.upper() if s == self.seeds[0] else None
                axes[0].plot([p[0] for p in c], [p[4] for p in c], style, marker="o", label=lab)
                axes[1].plot([p[0] for p in c], [p[5] for p in c], style, marker="o", label=lab)
        s0 = self.seeds[0]
        train = [r for r in self.log("es", s0) if r["type"] == "train"]
        axes[2].plot([r["iteration"] for r in train], [r["js_diversity"] for r in train], label="JS diversity (bits)")
        axes[2].plot([r["iteration"] for r in train], [r["coverage"] for r in train], label="coverage")
        for ax, title in zip(axes, ("token entropy (nats), held-out", "answer entropy (bits), held-out",
                                    f"ES population, seed {s0}")):
            ax.set_title(title, fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        axes[0].set_xlabel("generations")
        axes[1].set_xlabel("generations")
        axes[2].set_xlabel("ES iteration")
        fig.tight_layout()
        fig.savefig(os.path.join(self.figdir, "entropy.png"), dpi=100)
        plt.close(fig)

        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for name in ("grpo", "es"):
            for s in self.seeds:
                c = self.curves(name, s)
                lab = name.upper() if s == self.seeds[0] else None
                axes[0].plot([max(p[0], 1) for p in c], [p[2] for p in c], marker="o", label=lab,
                             color="C0" if name == "grpo" else "C1")
                axes[1].plot([p[1] for p in c], [p[2] for p in c], marker="o", label=lab,
                             color="C0" if name == "grpo" else "C1")
        axes[0].set_xscale("log")
        axes[0].set_xlabel("sampled generations")
        axes[1].set_xlabel("training seconds (this machine)")
        for ax in axes:
            ax.set_ylabel("held-out pass@1")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(self.figdir, "cost.png"), dpi=100)
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(6, 4))
        for spec in dict.fromkeys(r["size"] for r in self.pop):
            rs = [r for r in self.pop if r["size"] == spec]
            ax.plot([r["N"] for r in rs], [r["gain"] for r in rs], marker="o",
                    label=f"{spec} ({rs[0]['params'] / 1e6:.2f}M)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("population N")
        ax.set_ylabel(f"held-out pass@1 gain after {self.args.pop_iterations} iterations")
        ax.axhline(0, color="gray", linestyle=":")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(self.figdir, "popsize.png"), dpi=100)
        plt.close(fig)

        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for i, name in enumerate(("base", "grpo", "es", "grpo-es")):
            for j, T in enumerate(self.temps):
                summ = self.evals[name, s0, T]["summary"]
                kw = dict(color=f"C{i}", alpha=0.4 + 0.6 * (j + 1) / len(self.temps))
                axes[0].plot(ks, [summ[f"pass@{k}"] for k in ks], marker="o", label=f"{name} T={T:g}", **kw)
                axes[1].plot(ks, [summ[f"maj@{k}"] for k in ks], marker="o", label=f"{name} T={T:g}", **kw)
        for ax, t in zip(axes, ("pass@k", "maj@k (majority vote)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("k")
            ax.set_title(t, fontsize=9)
            ax.grid(alpha=0.3)
        axes[1].legend(fontsize=6, ncol=2)
        fig.tight_layout()
        fig.savefig(os.path.join(self.figdir, "temperature.png"), dpi=100)
        plt.close(fig)
        import shutil
        for name in ("es", "grpo"):
            for png in ("keep.png", "delta_hist.png", "compress.png"):
                src = os.path.join(self.args.out, "sparsity", name, png)
                if os.path.exists(src):
                    shutil.copy(src, os.path.join(self.figdir, f"sparsity-{name}-{png}"))

    # ---- the report -------------------------------------------------------------------------------------------------
    def llm_section(self):
        """Section 8, from docs/llm.md's SmolLM2 runs (LLM_RUNS/smollm2-grpo, smollm2-es) where they exist."""
        runs = {n: es.read_log(os.path.join(self.args.llm_runs, f"smollm2-{n}", "log.jsonl")) for n in ("grpo", "es")}
        rows = []
        for n, recs in runs.items():
            evals = [r for r in recs if r.get("type") == "eval"]
            train = [r for r in recs if r.get("type") == "train"]
            if len(evals) < 2 or not train or evals[0]["iteration"] != 0:
                continue  # not run (or not finished): nothing to report
            cfg, b, f = recs[0], evals[0], evals[-1]
            K = max(int(k[5:]) for k in b if k.startswith("pass@"))
            rows.append(f"| {n.upper()} | {cfg['task']} | {f['iteration']} | {train[-1]['generations']:,} | "
                        f"{train[-1]['wall'] / 60:.1f} | {b['pass@1']:.3f} -> {f['pass@1']:.3f} | "
                        f"{b[f'pass@{K}']:.3f} -> {f[f'pass@{K}']:.3f} | {b['token_entropy']:.3f} -> "
                        f"{f['token_entropy']:.3f} | {b['answer_entropy']:.2f} -> {f['answer_entropy']:.2f} |")
        if not rows:
            return []
        return ["## 8. A real LLM: SmolLM2-135M-Instruct, offline (one seed)", "",
                "The runs of the SmolLM2 commands in `docs/llm.md` (`--model smollm2-135m`, bf16, 32 new tokens; "
                f"held-out evaluation at T = 1 with n = {K} samples per problem), read from `{self.args.llm_runs}`.", "",
                f"| | task | iterations | generations | wall (min) | pass@1 | pass@{K} | token entropy | "
                "answer entropy |", "|---|---|---|---|---|---|---|---|---|"] + rows + [
                "", "One seed and a short run on 2 CPU cores: a direction, not a verdict.", ""]

    def flags(self):
        """The command-line flags this report was made with (those that differ from the defaults)."""
        given = [f for f in dataclasses.fields(Args) if getattr(self.given, f.name) != f.default]
        return "".join(f" --{f.name.replace('_', '-')}" + ("" if f.type is bool or isinstance(f.default, bool) else
                                                            f" {getattr(self.given, f.name)}") for f in given)

    def report(self):
        a, s0, K = self.args, self.seeds[0], self.args.eval_n
        ks = sorted({k for k in (1, 16, K) if k <= K})
        label = {"base": "base", "grpo": "GRPO", "es": "ES", "grpo-es": "GRPO->ES", "es-grpo": "ES->GRPO"}
        fig = lambda f: f"![{f}]({a.figures}/{f})"  # noqa: E731
        L = [f"# RESULTS: the paper's claims, measured", "",
             f"Generated by `python results.py{self.flags()}` on {time.strftime('%Y-%m-%d')}, "
             f"{platform.machine()} CPU, {os.cpu_count()} cores, torch {torch.__version__}, no GPU; "
             f"{(time.time() - self.t0) / 60:.0f} minutes for the work this invocation did (cached runs are reused). "
             f"Every number below comes from that run; the raw runs are under `{a.out}`.", "",
             "Setting: the embedded model (`models/toy`, 0.86M parameters, Qwen2 architecture), the `toy` task "
             f"(compact Countdown), {a.eval_problems} held-out problems never seen in pre- or post-training. "
             f"Each arm gets the same budget of {a.budget:,} sampled generations "
             f"(ES: {self.stages('es')[0][1]} iterations of N = {es.Args(**self.es_cfg).population} members x "
             f"{es.Args(**self.es_cfg).prompts} greedy prompts; GRPO: {self.stages('grpo')[0][1]} steps of "
             f"{self.per_it['grpo']} completions; the schedules half and half), seeds {a.seeds}. Final evaluations: "
             f"n = {K} samples per problem at T = 1 with passk.py's seed (the same random numbers for every model).",
             ""]
        # claim 1
        L += ["## 1. ES raises Pass@1 and Pass@K; GRPO raises Pass@1 and lowers Pass@K", "",
              "| | " + " | ".join(f"pass@{k}" for k in ks) + " | token entropy | answer entropy |",
              "|---|" + "---|" * (len(ks) + 2)]
        for name in ["base"] + list(SCHEDULES):
            row = [fmt(*interval(self.metric(name, k))) for k in ks]
            te = interval([self.evals[name, s, 1.0]["summary"]["token_entropy"] for s in self.seeds])
            ae = interval([self.evals[name, s, 1.0]["summary"]["answer_entropy"] for s in self.seeds])
            L.append(f"| {label[name]} | " + " | ".join(row) + f" | {fmt(*te)} | {fmt(*ae, digits=2)} |")
        L += ["", "Mean over seeds ± the half-width of the 95% interval. " + fig("passk.png"), ""]
        verdicts = {}
        for name in SCHEDULES:
            for k in ks:
                verdicts[name, k] = self.compare(name, "base", k)
        L.append("Against the base model (difference of the means, 95% interval):")
        L.append("")
        for name in SCHEDULES:
            L.append(f"- {label[name]}: " + "; ".join(
                f"pass@{k} {verdicts[name, k][1]:+.3f} ({verdicts[name, k][0]})" for k in ks))
        es_up1, es_upK = verdicts["es", 1][0] == "higher", verdicts["es", K][0] == "higher"
        g_up1, g_downK = verdicts["grpo", 1][0] == "higher", verdicts["grpo", K][0] == "lower"
        g_te = [self.evals["grpo", s, 1.0]["summary"]["token_entropy"] for s in self.seeds]
        b_te = self.evals["base", s0, 1.0]["summary"]["token_entropy"]
        L += ["", f"**Verdict, GRPO collapses entropy and narrows:** "
              + ("holds" if g_up1 and g_downK else "does not hold" if not g_up1 else "partly: Pass@1 rises, "
                 f"Pass@{K} is {verdicts['grpo', K][0]}")
              + f" (token entropy {b_te:.3f} -> {np.mean(g_te):.3f} nats, pass@1 {verdicts['grpo', 1][0]}, "
                f"pass@{K} {verdicts['grpo', K][0]}).",
              f"**Verdict, ES raises Pass@1 and Pass@K:** "
              + ("holds" if es_up1 and es_upK else "partly: only Pass@1 rises" if es_up1 else
                 "within noise" if verdicts["es", 1][0] == "within noise" else "does not hold")
              + f" at this budget (pass@1 {verdicts['es', 1][0]}, pass@{K} {verdicts['es', K][0]}).", ""]
        # claim 2: entropy over training and diversity
        runs = [(r["js"], r["gain16"]) for r in self.pop]
        for s in self.seeds:
            train = [r for r in self.log("es", s) if r["type"] == "train"]
            ev = [r for r in self.log("es", s) if r["type"] == "eval"]
            runs.append((float(np.mean([r["js_diversity"] for r in train])), ev[-1]["pass@16"] - ev[0]["pass@16"]))
        js, gk = np.array([x for x, _ in runs]), np.array([y for _, y in runs])
        r_p = float(np.corrcoef(js, gk)[0, 1]) if len(runs) > 2 and js.std() > 0 and gk.std() > 0 else float("nan")
        rank = lambda v: np.argsort(np.argsort(v))  # noqa: E731
        r_s = float(np.corrcoef(rank(js), rank(gk))[0, 1]) if not math.isnan(r_p) else float("nan")
        L += ["## 2. The mechanism: entropy over training, and the JS diversity of the ES population", "",
              fig("entropy.png"), "",
              f"Across {len(runs)} ES runs (the {len(self.seeds)} seeds above and the {len(self.pop)} population-size "
              f"runs of section 4), mean JS diversity of the population over training against the run's held-out "
              f"pass@16 gain: Pearson r = {r_p:.2f}, Spearman rho = {r_s:.2f}.", "",
              "**Verdict, higher population diversity goes with higher Pass@K:** "
              + ("not testable here (too few runs or no spread)" if math.isnan(r_p) else
                 "holds" if r_s > 0.5 else "does not hold" if r_s < -0.2 else "within noise (no clear relation)")
              + ".", ""]
        # claim 3: sequential
        v1 = self.compare("grpo-es", "grpo", 1)
        vK = self.compare("grpo-es", "es", K)
        vKg = self.compare("grpo-es", "grpo", K)
        seq = ("holds" if v1[0] != "lower" and vKg[0] == "higher" else
               "does not hold" if v1[0] == "lower" or vKg[0] == "lower" else "within noise")
        L += ["## 3. GRPO first, then ES", "",
              f"GRPO->ES against GRPO at pass@1: {v1[1]:+.3f} ({v1[0]}); against GRPO at pass@{K}: {vKg[1]:+.3f} "
              f"({vKg[0]}); against ES at pass@{K}: {vK[1]:+.3f} ({vK[0]}).", "",
              "**Verdict, the schedule keeps GRPO's Pass@1 and adds Pass@K:** " + seq + " (rule: holds when its "
              f"pass@1 is not below GRPO's and its pass@{K} is above GRPO's). "
              "The full switch-point sweep (both orders, interleaved) is `sequential.py --sweep`; its measured table "
              "is in docs/sequential.md.", ""]
        # claim 4: sparsity, forgetting, compression
        L += ["## 4. Functional sparsity, forgetting, compression (sparsity.py)", "",
              f"The models: ES trained for {a.sparsity_iterations} iterations (es.py's defaults, seed {s0}; at the "
              "headline budget its gain is too small to divide) and the seed-0 headline GRPO run. The evaluation: "
              f"n = 16 samples on the {a.eval_problems} held-out problems.", ""]
        d = {n: self.sparse[n][0]["overall"] for n in ("es", "grpo")}
        ratio = d["es"]["relative_l2"] / max(d["grpo"]["relative_l2"], 1e-12)
        L += ["| | relative L2 drift | max abs delta | share of updates above 1.5e-3 (fp32) | same, seen in bf16 | "
              "changed in bf16 |", "|---|---|---|---|---|---|"]
        for n in ("es", "grpo"):
            L.append(f"| {label[n]} | {d[n]['relative_l2']:.4f} | {d[n]['max_abs_delta']:.3g} | "
                     f"{d[n]['above_0.0015']:.3f} | {d[n]['above_0.0015_bf16']:.3f} | {d[n]['changed_bf16']:.3f} |")
        keep_rows = {}
        for n in ("es", "grpo"):
            recs = self.sparse[n]
            keep_rows[n] = {m: sparsity.q_text(sparsity.first_q(recs, m, "pass@1")) for m in ("top", "top-tensor",
                                                                                              "random")}
        L += ["", f"Drift ratio ES / GRPO: {ratio:.1f}x (the paper: 40-44x). Smallest kept share q (percent of "
              "|delta|, largest first; random as the control) that keeps 90% of the pass@1 gain: "
              + "; ".join(f"{label[n]}: top {keep_rows[n]['top']}, top-tensor {keep_rows[n]['top-tensor']}, "
                          f"random {keep_rows[n]['random']}" for n in ("es", "grpo")) + ".", "",
              fig("sparsity-es-keep.png"), fig("sparsity-grpo-keep.png"), ""]
        forget = {}
        for n in ("es", "grpo"):
            fr = {r["model"]: r for r in self.sparse[n] if r["kind"] == "forgetting"}
            forget[n] = fr
        es_big = max((k for k in forget["es"]["base"] if k.startswith("forget_pass@")),
                     key=lambda k: int(k.split("@")[1]))
        L += [f"| | pretraining-text LM loss, base -> tuned | unseen targets 100..729: pass@1 | {es_big[7:]} |",
              "|---|---|---|---|"]
        for n in ("es", "grpo"):
            fr = forget[n]
            big = max((k for k in fr["base"] if k.startswith("forget_pass@")), key=lambda k: int(k.split("@")[1]))
            L.append(f"| {label[n]} | {fr['base']['lm_loss']:.4f} -> {fr['tuned']['lm_loss']:.4f} | "
                     f"{fr['base']['forget_pass@1']:.3f} -> {fr['tuned']['forget_pass@1']:.3f} | "
                     f"{fr['base'][big]:.3f} -> {fr['tuned'][big]:.3f} |")
        es_forgot = forget["es"]["tuned"][es_big] < forget["es"]["base"][es_big] - 0.03
        es_ev = {r["model"]: r for r in self.sparse["es"] if r["kind"] == "eval"}
        es_gain = es_ev["tuned"]["pass@1"] - es_ev["base"]["pass@1"]
        top, rnd = (sparsity.first_q(self.sparse["es"], m, "pass@1") for m in ("top", "random"))
        sparse_verdict = ("not testable here: the ES model's pass@1 gain in this evaluation is "
                          f"{es_gain:+.3f}, too small to divide" if es_gain < 0.01 else
                          "holds" if ratio > 1 and top is not None and top <= 30 and (rnd is None or top < rnd)
                          else "does not hold")
        L += ["", "**Verdict, ES drifts far but its gain is sparse:** " + sparse_verdict
              + f" (drift ratio {ratio:.1f}x; 90% of the gain from the top {keep_rows['es']['top']} vs random "
                f"{keep_rows['es']['random']}).",
              "**Verdict, no catastrophic forgetting under ES:** "
              + ("does not hold" if es_forgot else "holds") + f" (unseen-target {es_big[7:]} "
              f"{forget['es']['base'][es_big]:.3f} -> {forget['es']['tuned'][es_big]:.3f}; LM loss "
              f"{forget['es']['base']['lm_loss']:.4f} -> {forget['es']['tuned']['lm_loss']:.4f}).", ""]
        comp = {n: [r for r in self.sparse[n] if r["kind"] == "compress" and r["model"] == "tuned"] for n in
                ("es", "grpo")}
        L += ["Compression, retained pass@1 gain (compressed tuned vs compressed base, over the uncompressed gain):",
              "", "| method | ES | GRPO |", "|---|---|---|"]
        for i, r in enumerate(comp["es"]):
            g = comp["grpo"][i]
            show = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
            L.append(f"| {r['method']} | {show(r.get('retained_pass@1'))} | {show(g.get('retained_pass@1'))} |")
        L += ["", fig("sparsity-es-compress.png"), ""]
        # claim 5: population vs size
        L += [f"## 5. Population size against model size (ES, {a.pop_iterations} iterations each)", "",
              "| size | params | " + " | ".join(f"N={N}" for N in dict.fromkeys(r["N"] for r in self.pop))
              + " | smallest N with 90% of the best gain |", "|---|---|" + "---|" * (len(set(r["N"] for r in
                                                                                           self.pop)) + 1)]
        smallest = []
        for spec in dict.fromkeys(r["size"] for r in self.pop):
            rs = [r for r in self.pop if r["size"] == spec]
            best = max(r["gain"] for r in rs)
            n90 = next((r["N"] for r in rs if best > 0 and r["gain"] >= 0.9 * best), None)
            smallest.append((rs[0]["params"], n90, best))
            L.append(f"| {spec} | {rs[0]['params'] / 1e6:.2f}M | " + " | ".join(f"{r['gain']:+.3f}" for r in rs)
                     + f" | {'none' if n90 is None else n90} |")
        clear = all(b > 0.01 for _, _, b in smallest)
        falls = all(x[1] is not None and y[1] is not None and y[1] <= x[1] for x, y in zip(smallest, smallest[1:]))
        L += ["", "Held-out pass@1 gain over each size's own base (n = 16). " + fig("popsize.png"), "",
              "**Verdict, a larger model needs a smaller population:** "
              + ("not testable here: the best gains are within the evaluation's noise (0.01)" if not clear else
                 "holds" if falls and smallest[0][1] != smallest[-1][1] else "does not hold") + ".", ""]
        # open question: cost
        mc, mem = self.matched_cost(), self.memory()
        L += ["## 6. Cost at matched quality (the paper's missing figure)", "", fig("cost.png"), ""]
        for k, rec in mc.items():
            if not rec["gain_exists"]:
                L.append(f"- {k}: no level above the base ({rec['base']:.3f}) is reached by both (best: ES "
                         f"{rec['es_best']:.3f}, GRPO {rec['grpo_best']:.3f}), so there is no matched-quality point.")
                continue
            parts = []
            for algo in ("es", "grpo"):
                parts.append(f"{label[algo]} never reaches it" if rec[algo] is None else
                             f"{label[algo]} after {rec[algo][0]:,.0f} generations, {rec[algo][1]:.0f} s")
            L.append(f"- {k} = {rec['target']:.3f} (the highest level both reach): " + "; ".join(parts) + ".")
        if mem.get("es-full") and mem.get("grpo"):
            L.append(f"- Peak memory over the loaded model (fresh processes, bench.py's worker): one ES iteration "
                     f"{mem['es-full']['peak_rss_mb_over_model']:.0f} MB, one GRPO step "
                     f"{mem['grpo']['peak_rss_mb_over_model']:.0f} MB RSS.")
        L.append("")
        # open question: inference-time diversity
        L += ["## 7. Does an ES-trained model make inference-time diversity methods work again?", "",
              "| model | T | pass@1 | pass@16 | pass@" + str(K) + " | maj@16 | maj@" + str(K) + " |",
              "|---|---|---|---|---|---|---|"]
        for name in ("base", "grpo", "es", "grpo-es"):
            for T in self.temps:
                sm = self.evals[name, s0, T]["summary"]
                L.append(f"| {label[name]} | {T:g} | {sm['pass@1']:.3f} | {sm['pass@16']:.3f} | {sm[f'pass@{K}']:.3f}"
                         f" | {sm['maj@16']:.3f} | {sm[f'maj@{K}']:.3f} |")
        hot = max(self.temps)
        gain = {n: self.evals[n, s0, hot]["summary"][f"pass@{K}"] - self.evals[n, s0, 1.0]["summary"][f"pass@{K}"]
                for n in ("grpo", "es")}
        L += ["", f"Seed {s0}. maj@k: the most frequent canonical answer of k samples (for this task an expression, "
              "so majority voting means the most frequent expression is right). " + fig("temperature.png"), "",
              f"**Answer:** raising T to {hot:g} changes pass@{K} by {gain['es']:+.3f} for ES and {gain['grpo']:+.3f} "
              "for GRPO; " + ("sampling hotter recovers more coverage from the ES model" if gain["es"] > gain["grpo"]
                              else "sampling hotter recovers more coverage from the GRPO model") + " (one seed: "
              "a direction, not a verdict).", ""]
        L += self.llm_section()
        with open(a.doc + ".tmp", "w") as f:
            f.write("\n".join(L) + "\n")
        os.replace(a.doc + ".tmp", a.doc)
        print(f"wrote {a.doc}")


def run(args):
    passk.check_fields(args)
    for flag, text in (("--seeds", args.seeds), ("--temperatures", args.temperatures),
                       ("--populations", args.populations)):
        try:
            values = [float(x) for x in text.split(",")]
        except ValueError:
            values = []
        if not values or min(values) < 0:
            raise verify.UsageError(f"{flag} must be a comma list of non-negative numbers; got {text!r}")
    if 1.0 not in [float(t) for t in args.temperatures.split(",")]:
        raise verify.UsageError("--temperatures must include 1.0 (the temperature of every other table)")
    if not all(len(s.split("x")) == 2 and all(p.isdecimal() for p in s.split("x")) for s in args.sizes.split(",")):
        raise verify.UsageError(f"--sizes must be a comma list of HIDDENxLAYERS; got {args.sizes!r}")
    given = args
    if args.quick:
        args = dataclasses.replace(args, seeds=args.seeds.split(",")[0], budget=256, eval_problems=10, eval_n=16,
                                   temperatures="1.0,1.3", sizes="32x1,48x1", size_steps=5, populations="2,4",
                                   sparsity_iterations=2, pop_iterations=2, doc=os.path.join(args.out, "RESULTS.md"))
    passk.check_writable(args.out)
    passk.check_writable(args.doc, "--doc", directory=False)
    if args.threads:
        torch.set_num_threads(args.threads)
    r = Results(args, given)
    for step in (r.train_all, r.evaluate_all, r.sparsity_all, r.population_all):
        t0 = time.time()
        step()
        print(f"[results] {step.__name__}: {time.time() - t0:.0f} s", flush=True)
    r.figures()
    r.report()
    return r


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
