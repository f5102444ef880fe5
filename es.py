"""es.py: Evolution Strategies post-training of a causal LM, exact, seed-replayed, one to many GPUs.

The algorithm of Qiu et al. 2025 ("Evolution Strategies at Scale"), analysed by Ba et al. 2026 (arXiv 2608.27351):
for t = 1..T:  (1) seeds for the N members,  (2) perturb theta_n = theta + sigma * eps_n,  (3) score each member with
the verifier,  (4) shape the rewards into fitness f_n,  (5) theta += alpha * mean_n(f_n * eps_n)  (1/sigma in alpha).

    python es.py                                             # the embedded model on the toy task, a few minutes
    python es.py --replay runs/es/log.jsonl --out runs/es-replayed   # the final weights from the log alone
    torchrun --nproc_per_node 8 es.py --model Qwen/Qwen2.5-1.5B-Instruct --task countdown --population 30 \\
        --sigma 1e-3 --alpha 5e-4 --prompts 200 --iterations 500 --dtype bf16 --max-new-tokens 1024

How this differs from the public reference code of Qiu et al., whose known defects are avoided on purpose:
- fp32 master weights; a member's working weights are *written* as master + sigma*eps (in the working dtype) and the
  restore is a copy of the master, so perturb/restore never drifts (their bf16 in-place add/subtract does).
- eps_n is drawn tensor by tensor from an independent stream seeded by (run seed, iteration, member, tensor name):
  same-shaped tensors get different noise, and the noise is defined on the logical parameter (not on a fused or sharded
  buffer). Only one tensor-sized noise buffer is alive at a time. Streams come from torch.Generator on the master's
  device: bit-identical for a given device type, not between CPU and CUDA.
- Seeds are derived, not drawn: no collisions, nothing broadcast. Only the N member rewards (plus per-member answers
  for the diversity log, a few KB) cross the network; every rank applies the same update from the seeds, so world
  size 1 and world size K give bit-identical weights.
- Rewards score the completion only; ties get equal fitness; all-equal rewards give a zero update.
- Options beyond the paper: centered-rank or raw fitness, antithetic pairs, weight decay, anchored weight decay toward
  the initial weights (arXiv 2605.30148), sampled scoring with common random numbers, a parameter subset.
"""
import dataclasses
import hashlib
import json
import math
import os
import random
import re
import shutil
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

import passk
import verify


@dataclass
class Args:
    model: str = passk.DEFAULT_MODEL
    """hub id or local directory; default: the embedded model (models/toy)"""
    task: str = "toy"
    """countdown, gsm8k, math, toy, toy4, or rg:NAME (reasoning-gym); options after '?', e.g. toy?min_target=100"""
    data: str = ""
    """local data file for the task (jsonl or a json list); gsm8k and math default to the bundled data/ files"""
    iterations: int = 100
    """ES iterations in total (with --resume and none given: the saved run's); in [0, inf)"""
    population: int = 30
    """N, members per iteration (paper recipe: 30); in [2, inf)"""
    sigma: float = 0.02
    """perturbation scale (paper recipe for 0.5B-7B models: 1e-3); in (0, inf)"""
    alpha: float = 0.008
    """step size, 1/sigma folded in: theta += alpha * mean(f * eps) (paper recipe: 5e-4); in (0, inf)"""
    prompts: int = 128
    """training prompts per iteration, every member scores all of them; in [1, inf)"""
    train_problems: int = 2000
    """training pool the prompts are drawn from each iteration (the paper: 200 fixed prompts); in [1, inf)"""
    fitness: str = "zscore"
    """fitness shaping: z-score, centered ranks (ties averaged) or raw r - mean; one of {zscore, rank, raw}"""
    noise: str = "full"
    """full-rank eps, members one by one; lowrank: EGGROLL rank-R noise, members in one batch; one of {full, lowrank}"""
    rank: int = 1
    """R, rank of a member's perturbation of each weight matrix with --noise lowrank (EGGROLL: 1 works); in [1, inf)"""
    antithetic: bool = False
    """mirrored pairs eps, -eps (needs an even population)"""
    params: str = "all"
    """which parameters ES trains: all, matrices (2-D tensors only), or a regex on parameter names"""
    dtype: str = "fp32"
    """dtype of the working weights (the master is always fp32); one of {fp32, bf16, fp16}"""
    weight_decay: float = 0.0
    """decoupled decay theta -= alpha * wd * theta; in [0, inf)"""
    anchor_decay: float = 0.0
    """decay toward the initial weights: theta -= alpha * ad * (theta - theta_0); in [0, inf)"""
    temperature: float = 0.0
    """scoring: 0 greedy (the paper), > 0 sampled with one seed for every member (common random numbers); in [0, inf)"""
    samples: int = 4
    """completions per prompt and member when sampling; in [1, inf)"""
    max_new_tokens: int = 16
    """generation budget per completion; in [1, inf)"""
    batch_size: int = 512
    """rows per generation batch; in [1, inf)"""
    seed: int = 0
    """run seed: noise, prompt order and sampling all derive from it; in [0, inf)"""
    eval_every: int = 25
    """held-out Pass@k every this many iterations (and at start and end; 0 = only at start and end); in [0, inf)"""
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
    probe: bool = False
    """log the unperturbed model's reward on the iteration's prompts before and after its update (probe_before,
    probe_after: 2 x prompts more rows an iteration); a step that does not raise it is too large, noisy or wrong"""
    save_every: int = 25
    """checkpoint every this many iterations (and at the end; 0 = only at the end); in [0, inf)"""
    out: str = "runs/es"
    """run directory: log.jsonl, checkpoint-NNNNNN/"""
    resume: str = ""
    """continue the run saved in this directory (its args and total: see --iterations): from its newest
    checkpoint and the iterations its log.jsonl holds past it, or from the log alone (nothing a kill interrupted is
    lost)"""
    replay: str = ""
    """a run's log.jsonl: rebuild its final weights from its base model (--model, default the logged one) and the
    member rewards it logged, no checkpoint needed, and write them to --out (save_pretrained format)"""
    device: str = ""
    """cpu, cuda, cuda:N ('': cuda when available, else cpu; under torchrun cuda means cuda:LOCAL_RANK)"""
    threads: int = 0
    """torch CPU threads per process (0: cores / local processes); in [0, inf)"""
    report_to: str = ""
    """live trackers that get every log.jsonl record too: comma list of none, tensorboard, trackio, wandb ('': none,
    or with --resume the saved run's)"""
    run_name: str = ""
    """the run's name in the trackers ('': the --out folder's name)"""


class RunError(Exception):
    """The run cannot go on (non-finite rewards or weights, a checkpoint that cannot be written): exit 1, and the
    last good checkpoint stays, so that --resume can continue once the cause is fixed."""


# ---- 1. seeds ---------------------------------------------------------------------------------------------------
def stream_seed(*key) -> int:
    """A 63-bit seed from a tuple: distinct keys give independent streams, nothing is drawn or broadcast."""
    return int.from_bytes(hashlib.blake2b(":".join(map(str, key)).encode(), digest_size=8).digest(), "big") >> 1


def member_noise(n: int, antithetic: bool):
    """(noise index, sign) of member n: antithetic pairs (2k, 2k+1) share eps_k with signs +1, -1."""
    return (n // 2, 1.0 - 2.0 * (n % 2)) if antithetic else (n, 1.0)


def noise(seed, t, k, name, like: torch.Tensor) -> torch.Tensor:
    """eps for (run seed, iteration t, noise index k, tensor name): fp32 N(0, 1), the shape of the parameter."""
    g = torch.Generator(like.device).manual_seed(stream_seed(seed, t, k, name))
    return torch.randn(like.shape, generator=g, device=like.device, dtype=torch.float32)


# ---- 2. perturb and restore -------------------------------------------------------------------------------------
def perturb(params, master, seed, t, n, sigma, antithetic):
    """Write master + sigma * sign * eps_n into the working weights, one tensor (and one noise buffer) at a time."""
    k, sign = member_noise(n, antithetic)
    with torch.no_grad():
        for name, p in params.items():  # one fused add (in fp32, rounded once to the working dtype) per tensor
            torch.add(master[name], noise(seed, t, k, name, master[name]), alpha=sigma * sign, out=p)


def restore(params, master):
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(master[name])


# ---- 2'. low-rank noise (EGGROLL, arXiv 2511.16652): perturbations applied per row inside the forward pass --------
def lowrank_factors(seed, t, k, name, like: torch.Tensor, rank: int):
    """(A [out, R], B [in, R]) of noise index k for the matrix `name`: its perturbation is A B^T / sqrt(R), whose
    entries are N(0, 1) like eps's. One stream per (seed, t, k, name), as for full-rank noise."""
    g = torch.Generator(like.device).manual_seed(stream_seed(seed, t, k, name, "lowrank"))
    ab = torch.randn(like.shape[0] + like.shape[1], rank, generator=g, device=like.device, dtype=torch.float32)
    return ab[:like.shape[0]], ab[like.shape[0]:]


def lowrank_noise(seed, t, k, name, like, rank):
    """The full [out, in] perturbation direction A B^T / sqrt(R) of a matrix (for tests and the dense check)."""
    a, b = lowrank_factors(seed, t, k, name, like, rank)
    return a @ b.T / math.sqrt(rank)


class MemberRows:
    """Member n's perturbation applied to the rows of one batched generation that belong to member n.

    Forward hooks add, for every row, its member's term to the output of each module it perturbs: a Linear gets
    sigma/sqrt(R) * (x B_n) A_n^T (+ sigma * eps_n for its bias), an Embedding sigma/sqrt(R) * A_n[ids] B_n^T (a
    tied output head reuses the same A, B), an elementwise norm sigma * eps_n * (f(x; w=1) - f(x; w=0)) (its output
    is affine in its weight; an RMSNorm's, w * x-hat, is one multiply by 1 + sigma * eps_n / w). The shared x W^T is
    computed once for all rows; a Linear's per-row term takes each row's own member's factors and adds (x . b_r) a_r
    for r < R with elementwise ops over the whole batch: O(R) work per row and token whatever the population, and a
    fixed number of kernel launches per module (a loop over runs of one member's rows cost 2 launches per member,
    which on a small model is most of a decode step). Each row's factors, bias and norm vectors are gathered once
    per batch, in set_rows (at the start and when finished rows leave the batch), not at every decode step: that
    costs [B, R * sum(in + out)] floats for all modules together (about 40 M for SmolLM2-135M at 128 rows, 1.2 G for
    a 1.5B model at 512 rows in bf16), and saves an index_select per module and token (measured: 5-8% of a decode
    step on SmolLM2's layers). Working weights stay equal to the master.
    """

    def __init__(self, model, params, master, members, args, t):
        self.M, self.R, self.hooks = len(members), args.rank, []
        self.per_row = []  # (holder, table) pairs that set_rows refreshes
        name_of = {id(p): name for name, p in params.items()}
        dtype = next(model.parameters()).dtype
        scale = args.sigma / math.sqrt(args.rank)
        signs = [member_noise(n, args.antithetic) for n in members]
        factors, vectors = {}, {}  # name -> (A_all * scale [M*R, out], B_all [in, M*R]) / sigma * eps_all [M, dim]
        for name in params:
            if master[name].dim() == 2:
                ab = [lowrank_factors(args.seed, t, k, name, master[name], args.rank) for k, _ in signs]
                factors[name] = (torch.cat([a * (sign * scale) for (a, _), (_, sign) in zip(ab, signs)], 1).T
                                 .contiguous().to(dtype), torch.cat([b for _, b in ab], 1).to(dtype))
            else:
                vectors[name] = torch.stack([noise(args.seed, t, k, name, master[name]) * (sign * args.sigma)
                                             for k, sign in signs])  # fp32: a norm's factor 1 + eps / w needs it
        for mod_name, module in model.named_modules():
            mine = {pn: name_of[id(p)] for pn, p in module.named_parameters(recurse=False) if id(p) in name_of}
            if not mine:
                continue
            if isinstance(module, torch.nn.Linear):
                ab = self._by_member(factors.get(mine.get("weight")))
                bias = vectors.get(mine.get("bias"))
                hook = self._linear(None if ab is None else (self._rows(ab[0]), self._rows(ab[1])),
                                    None if bias is None else self._rows(bias.to(dtype)))
            elif isinstance(module, torch.nn.Embedding):
                hook = self._embedding(*factors[mine["weight"]])
            elif all(p.dim() == 1 for p in module.parameters(recurse=False)):
                hook = self._norm(module, {pn: vectors[name] for pn, name in mine.items()}, dtype)
            else:
                raise verify.UsageError(f"--noise lowrank cannot perturb {mod_name} ({type(module).__name__}) per row; "
                                        f"use --noise full or leave it out with --params")
            self.hooks.append(module.register_forward_hook(hook))
        self.member = None

    def _rows(self, table):
        """A per-row view of a [M, dim] or [M, R, dim] table, refreshed by set_rows: holder[0] is [B, 1, dim] or
        [B, R, dim]."""
        if table is None:
            return None
        holder = [None]
        self.per_row.append((holder, table.unsqueeze(1) if table.dim() == 2 else table))
        return holder

    def _by_member(self, ab):
        """A Linear's factors as tables indexed by member: [M, R, out] (scaled A_m^T) and [M, R, in] (B_m^T)."""
        if ab is None:
            return None
        a_t, b_all = ab
        return (a_t.view(self.M, self.R, -1), b_all.T.reshape(self.M, self.R, -1).contiguous())

    def set_rows(self, member_index: torch.Tensor):
        """member_index [B]: the position in `members` of each row of the batch about to run (passk.sample's
        on_batch, mapped from prompt index to member). Every row's factors and vectors are gathered here, once per
        batch shape (an Embedding's per token, in its hook: its rows are token ids)."""
        self.member = member_index
        for holder, table in self.per_row:
            holder[0] = table.index_select(0, member_index)

    def _linear(self, ab, bias_rows):
        def hook(module, inputs, out):
            if ab is not None:
                x = inputs[0]  # [B, T, in]; out [B, T, out]
                a, b = ab[0][0], ab[1][0]  # [B, R, out], [B, R, in]: each row's member's, from set_rows
                for r in range(self.R):  # out += (x . b_r) a_r, row by row: [B, T, 1] * [B, 1, out]
                    out.addcmul_((x * b[:, r:r + 1]).sum(-1, keepdim=True), a[:, r:r + 1])
            if bias_rows is not None:
                out.add_(bias_rows[0])
            return out
        return hook

    def _embedding(self, a_t, b_all):
        a_all = a_t.T.reshape(a_t.shape[1], self.M, self.R)  # [V, M, R] (scaled)
        b_rows = self._rows(b_all.view(b_all.shape[0], self.M, self.R).permute(1, 2, 0).contiguous())  # [B, R, H]

        def hook(module, inputs, out):
            a = a_all[inputs[0], self.member.unsqueeze(1)]  # [B, T, R]: token rows of each row's member
            for r in range(self.R):  # out += A[ids, r] b_r, row by row: [B, T, 1] * [B, 1, H]
                out.addcmul_(a[..., r:r + 1], b_rows[0][:, r:r + 1])
            return out
        return hook

    def _norm(self, module, eps, dtype):
        """eps: {weight name: sigma * eps_m [M, dim] (fp32)}. out is affine in each weight, so a member's term is
        eps_m * (f(x; w=1) - f(x; w=0)); for out = w * x-hat (RMSNorm) that is out * (eps_m / w), and the hook is one
        multiply, out *= 1 + eps_m / w, its factor gathered per row in set_rows. The factor stays fp32 (in bf16
        1 + 1e-3 is 1); the product is still rounded to the working dtype, as any bf16 activation is."""
        import copy
        units = {}  # per weight: ("scale", factor rows) or ("unit", eps rows, module with w = 1, with w = 0 or None)
        for pn, table in eps.items():
            one, zero = copy.deepcopy(module), copy.deepcopy(module)
            one._forward_hooks.clear()
            zero._forward_hooks.clear()
            with torch.no_grad():
                getattr(one, pn).fill_(1.0)
                getattr(zero, pn).zero_()
            w = getattr(module, pn)
            probe = torch.randn(2, 3, w.shape[0], dtype=w.dtype, device=w.device)
            with torch.no_grad():
                linear = len(eps) == 1 and bool((zero(probe) == 0).all())  # out = w * x-hat, as RMSNorm
                weight = w.detach().float()
                units[pn] = ("scale", self._rows(1 + table / weight)) if linear and bool((weight != 0).all()) else \
                    ("unit", self._rows(table.to(dtype)), one, None if linear else zero)

        def hook(module, inputs, out):
            for unit in units.values():
                if unit[0] == "scale":
                    out = out.mul_(unit[1][0])
                else:
                    direction = unit[2](inputs[0]) if unit[3] is None else unit[2](inputs[0]) - unit[3](inputs[0])
                    out = out.addcmul_(unit[1][0], direction)
            return out
        return hook

    def close(self):
        for h in self.hooks:
            h.remove()


# ---- 3. score members ---------------------------------------------------------------------------------------------
def member_scores(task, examples, texts, tokens, S, memo):
    """One member's completions (prompt-major, S per prompt) -> reward, its parts, answers and solved per prompt.
    memo caches the verdict of each (completion, prompt) across the members of an iteration: they often agree."""
    verdicts = []
    for r, c in enumerate(texts):
        key = (c, r // S)
        if key not in memo:
            memo[key] = task.judge(c, examples[r // S])
        verdicts.append(memo[key])
    return {"reward": float(np.mean([v[0] for v in verdicts])),
            "per_prompt": [float(np.mean([v[0] for v in verdicts[i * S:(i + 1) * S]])) for i in range(len(examples))],
            "format": float(np.mean([v[1]["format"] for v in verdicts])),
            "answer": float(np.mean([v[1]["answer"] for v in verdicts])), "tokens": tokens,
            "answers": [[v[2] for v in verdicts[i * S:(i + 1) * S]] for i in range(len(examples))],
            "solved": [any(v[1]["answer"] >= 1 for v in verdicts[i * S:(i + 1) * S]) for i in range(len(examples))]}


def score_members(model, tok, task, examples, members, master, params, args, t, timing):
    """Members in, rewards out: {n: dict(reward, format, answer, answers=[per prompt: [answer, ...]], solved=[...])}.

    Full-rank noise: one member after another (perturb, generate, restore). Low-rank noise: every member of this
    rank in one batched generation, rows n*P .. n*P+P-1 belonging to member n. Either way every member sees the same
    sampling uniforms for prompt i (common random numbers)."""
    prompts = [task.prompt(ex, tok) for ex in examples]
    P, S = len(prompts), (args.samples if args.temperature > 0 else 1)
    kw = dict(n=S, temperature=args.temperature, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
              seed=stream_seed(args.seed, "score", t), entropy=False)
    out, memo = {}, {}
    if args.noise == "lowrank":
        t0 = time.time()
        rows = MemberRows(model, params, master, members, args, t)
        t1 = time.time()
        try:
            s = passk.sample(model, tok, prompts * len(members), keys=list(range(P)) * len(members),
                             on_batch=lambda prompt_index: rows.set_rows(prompt_index // P),
                             groups=[i // P for i in range(P * len(members))], **kw)  # a member's rows share a prefix
        finally:
            rows.close()
        for m, n in enumerate(members):
            ids = s.completion_ids[m * P * S:(m + 1) * P * S]
            out[n] = member_scores(task, examples, s.texts[m * P * S:(m + 1) * P * S], sum(map(len, ids)), S, memo)
        timing["perturb"] += t1 - t0
        timing["generate"] += time.time() - t1
        return out
    for n in members:
        t0 = time.time()
        perturb(params, master, args.seed, t, n, args.sigma, args.antithetic)
        t1 = time.time()
        s = passk.sample(model, tok, prompts, **kw)
        out[n] = member_scores(task, examples, s.texts, s.tokens, S, memo)
        timing["perturb"] += t1 - t0
        timing["generate"] += time.time() - t1
    t0 = time.time()
    restore(params, master)
    timing["perturb"] += time.time() - t0
    return out


def probe_reward(model, tok, task, examples, args, t, rank=0, world=1):
    """The unperturbed model's mean reward on the iteration's prompts, scored as a member is (same sampling seed):
    --probe's before/after. Each rank scores its share of the prompts; the sum crosses the network."""
    mine = examples[rank::world]
    S = args.samples if args.temperature > 0 else 1
    s = passk.sample(model, tok, [task.prompt(ex, tok) for ex in mine], n=S, temperature=args.temperature,
                     max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                     seed=stream_seed(args.seed, "score", t), entropy=False,
                     keys=list(range(rank, len(examples), world)))
    total = torch.tensor([sum(task.reward(c, mine[r // S]) for r, c in enumerate(s.texts))], dtype=torch.float64)
    if world > 1:
        total = total.to(next(model.parameters()).device)
        dist.all_reduce(total)
    return float(total) / (len(examples) * S)


# ---- 4. fitness shaping -------------------------------------------------------------------------------------------
def shape_fitness(rewards, kind="zscore"):
    """Rewards [N] -> fitness [N] (float64). All-equal rewards give zeros, never NaN."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.max() == r.min():
        return np.zeros_like(r)
    if kind == "zscore":
        return (r - r.mean()) / (r.std() + 1e-8)
    if kind == "rank":  # centered ranks in [-0.5, 0.5], tied rewards share their average rank
        order = np.argsort(r, kind="stable")
        ranks = np.empty_like(r)
        ranks[order] = np.arange(len(r), dtype=np.float64)
        for v in np.unique(r):
            ranks[r == v] = ranks[r == v].mean()
        return ranks / (len(r) - 1) - 0.5
    if kind == "raw":
        return r - r.mean()
    raise verify.UsageError(f"unknown --fitness {kind!r} (choose from: zscore, rank, raw)")


# ---- 5. update ----------------------------------------------------------------------------------------------------
def es_update(master, fitness, args, t, init=None):
    """master += alpha * mean_n(f_n * eps_n) (+ decays), regenerating eps tensor by tensor (with --noise lowrank a
    matrix's eps_n is A_n B_n^T / sqrt(R)). Returns the step's L2 norm."""
    N, sq = len(fitness), 0.0
    coef = {}  # noise index -> sum of sign * f over the members that use it (an antithetic pair is one draw)
    for n, f in enumerate(fitness):
        k, sign = member_noise(n, args.antithetic)
        coef[k] = coef.get(k, 0.0) + sign * float(f)
    used = [k for k, c in coef.items() if c != 0.0]
    with torch.no_grad():
        for name, w in master.items():
            if args.noise == "lowrank" and w.dim() == 2 and used:  # sum_k c_k A_k B_k^T as one [out, K*R] matmul
                ab = [lowrank_factors(args.seed, t, k, name, w, args.rank) for k in used]
                c = torch.tensor([coef[k] for k in used], dtype=w.dtype, device=w.device).repeat_interleave(args.rank)
                step = (torch.cat([a for a, _ in ab], 1) * c) @ torch.cat([b for _, b in ab], 1).T
                step.mul_(1 / math.sqrt(args.rank))
            else:
                step = torch.zeros_like(w)
                for k in used:
                    step.add_(noise(args.seed, t, k, name, w), alpha=coef[k])
            step.mul_(args.alpha / N)
            if args.weight_decay:
                step.sub_(w, alpha=args.alpha * args.weight_decay)
            if args.anchor_decay:
                step.sub_(w - init[name], alpha=args.alpha * args.anchor_decay)
            w.add_(step)
            sq += float(step.double().pow(2).sum())
    return math.sqrt(sq)


def relative_drift(master, init):
    num = sum(float((master[k].double() - init[k].double()).pow(2).sum()) for k in master)
    den = sum(float(init[k].double().pow(2).sum()) for k in master)
    return math.sqrt(num / max(den, 1e-30))


# ---- setup, checkpoints -------------------------------------------------------------------------------------------
def select_params(model, spec):
    """{name: parameter} to train: all, matrices (2-D), or those whose name matches a regex."""
    named = dict(model.named_parameters())  # tied weights appear once
    if spec == "all":
        return named
    if spec == "matrices":
        return {k: p for k, p in named.items() if p.dim() == 2}
    try:
        chosen = {k: p for k, p in named.items() if re.search(spec, k)}
    except re.error as e:
        raise verify.UsageError(f"--params {spec!r} is not a valid regex: {e}") from None
    if not chosen:
        raise verify.UsageError(f"--params {spec!r} matches no parameter")
    return chosen


def check_args(args):
    """Every flag against the range or choices in its doc (passk.check_fields), then what no single flag shows."""
    passk.check_fields(args)
    passk.parse_report_to(args.report_to)
    if args.antithetic and args.population % 2:
        raise verify.UsageError(f"--antithetic needs an even --population, got {args.population}")


def latest_checkpoint(out):
    ckpts = sorted(d for d in os.listdir(out) if re.fullmatch(r"checkpoint-\d+", d)) if os.path.isdir(out) else []
    return os.path.join(out, ckpts[-1]) if ckpts else None


def read_checkpoint(ckpt):
    """(saved args, state) of a checkpoint; a damaged one is a one-line error that changes nothing on disk."""
    found = []
    for fname in ("args.json", "state.json"):
        path = os.path.join(ckpt, fname)
        try:
            with open(path) as f:
                found.append(json.load(f))
        except (OSError, ValueError) as e:
            raise verify.UsageError(f"--resume: {path} is damaged ({e}); nothing was changed: restore that file from "
                                    f"a copy, or start again with a new --out") from None
    if not isinstance(found[1].get("iteration"), int) or set(found[0]) - {f.name for f in dataclasses.fields(Args)}:
        raise verify.UsageError(f"--resume: {ckpt} was not written by this es.py (unexpected args.json/state.json)")
    return found


def save_checkpoint(model, tok, master, args, state):
    """OUT/checkpoint-NNNNNN with fp32 weights, tokenizer, args.json, state.json: written to a temp dir then renamed,
    so a kill or a failed write (disk full) never leaves a half checkpoint and the previous one stays."""
    final = os.path.join(args.out, f"checkpoint-{state['iteration']:06d}")
    tmp = os.path.join(args.out, f".tmp-{state['iteration']:06d}")
    shutil.rmtree(tmp, ignore_errors=True)
    dtype = next(model.parameters()).dtype
    try:
        passk.cast_params(model, torch.float32)  # save the exact fp32 master, whatever the working dtype
        restore(dict(model.named_parameters()), master)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        for fname, obj in (("args.json", dataclasses.asdict(args)), ("state.json", state)):
            with open(os.path.join(tmp, fname), "w") as f:
                json.dump(obj, f, indent=1)
        os.replace(tmp, final)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RunError(f"cannot write {final}: {e.strerror or e}; the last good checkpoint is "
                       f"{latest_checkpoint(args.out)}: fix the cause, then --resume {args.out}") from None
    finally:
        passk.cast_params(model, dtype)
        restore(dict(model.named_parameters()), master)
    for old in os.listdir(args.out):  # keep only the newest checkpoint
        if re.fullmatch(r"checkpoint-\d+", old) and os.path.join(args.out, old) != final:
            shutil.rmtree(os.path.join(args.out, old))
    return final


def read_log(path):
    """The records of a log.jsonl; a line cut short by a kill (the last one) is dropped, as it is about to be redone."""
    records = []
    if os.path.exists(path):
        for line in open(path):
            try:
                records.append(json.loads(line))
            except ValueError:
                pass
    return records


def log_line(path, rec, tracker=None):
    """Append one record to log.jsonl, and send it to the live trackers (--report-to) under the same names."""
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")
    if tracker is not None:
        tracker.log(rec)


def setup_distributed(args):
    """(rank, world, device). Under torchrun (RANK set): nccl on GPU, gloo on CPU; members are split across ranks."""
    rank, world, local, local_world = 0, 1, 0, 1
    if "RANK" in os.environ:
        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() and args.device != "cpu" else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        local, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    device = passk.check_device(args.device)
    if device == "cuda" and world > 1:
        device = f"cuda:{local}"
    if device.startswith("cuda"):
        torch.cuda.set_device(device)  # so that nccl collectives and all_gather_object use this rank's GPU
    if device.startswith("cpu"):
        torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // local_world))
    return rank, world, device


def fitness_reliability(per_prompt):
    """How much the members' ranking is signal: the members' mean rewards on the even and on the odd prompts of the
    iteration, correlated across members (Pearson), Spearman-Brown corrected to the whole set: 2r / (1 + r). Near 0
    the ranking is noise; None when a half gives every member the same reward (nothing to rank)."""
    r = np.asarray(per_prompt, dtype=np.float64)  # [members, prompts]
    if r.shape[1] < 2:
        return None
    a, b = r[:, 0::2].mean(1), r[:, 1::2].mean(1)
    if a.std() == 0 or b.std() == 0:
        return None
    rho = float(np.corrcoef(a, b)[0, 1])
    return 2 * rho / (1 + rho) if rho > -1 else -1.0


def weights_digest(params):
    """sha256 (16 hex digits) of fp32 weights, tensor by tensor in name order: names a log's base model."""
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def whole_rewards(got, population):
    """Whether a train record's `rewards` can be replayed: all N members' rewards, finite numbers."""
    return isinstance(got, list) and len(got) == population and all(
        isinstance(x, (int, float)) and math.isfinite(x) for x in got)


def read_replay_log(path):
    """(config, rewards per iteration 1..T) of an es.py log; anything that cannot be replayed is a UsageError."""
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        raise verify.UsageError(f"--replay: cannot read {path}: {e.strerror or e}") from None
    records = []
    for i, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except ValueError:
            raise verify.UsageError(f"--replay: {path} line {i} is not JSON (a log cut short?)") from None
    if not records or not all(isinstance(r, dict) for r in records) or records[0].get("type") != "config" \
            or records[0].get("algo") != "es" or not isinstance(records[0].get("population"), int):
        raise verify.UsageError(f"--replay: {path} is not an es.py log (its first line is not es.py's config)")
    config, rewards = records[0], {}
    for r in records[1:]:
        if r.get("type") == "train" and isinstance(r.get("iteration"), int):
            rewards[r["iteration"]] = r.get("rewards")  # a resumed run's redone iteration: the last record counts
    last = max(rewards, default=0)
    for t in range(1, last + 1):
        if not whole_rewards(rewards.get(t), config["population"]):
            raise verify.UsageError(f"--replay: {path} has no member rewards for iteration {t} (a log written before "
                                    "es.py logged them, or a damaged one)")
    if not last:
        raise verify.UsageError(f"--replay: {path} has no training iteration")
    return config, [rewards[t] for t in range(1, last + 1)]


def log_tail(records, run, start, stop):
    """The train records of a log (its records) past iteration `start` that --resume replays instead of redoing: each
    with all N member rewards, in order, the last one only if the evaluation due after it (run: the saved args) was
    logged too, none past `stop`. A run killed between checkpoints, or whose folder kept only its log, continues from
    its last iteration."""
    train = {r["iteration"]: r for r in records if r.get("type") == "train" and isinstance(r.get("iteration"), int)}
    evals = {r.get("iteration") for r in records if r.get("type") == "eval"}
    tail, t = [], start + 1
    while t <= stop and t in train and whole_rewards(train[t].get("rewards"), run.population):
        if (run.eval_every and t % run.eval_every == 0 or t in (run.iterations, stop)) and t not in evals:
            break  # its evaluation was cut short (or is the end's, still to come): the iteration is redone
        tail.append(train[t])
        t += 1
    return tail


def replay(args):
    """The final weights of a run from its base model and its log alone: the members' noise is a function of the
    seeds, the update a function of the noise and the logged rewards, so replaying es_update over the log gives the
    checkpoint's fp32 master bit for bit on the same device type. Written to --out (save_pretrained), atomically."""
    config, rewards = read_replay_log(args.replay)
    run = Args(**{k: v for k, v in config.items() if k in Args.__dataclass_fields__})
    if os.path.exists(args.out) and os.listdir(args.out):
        raise verify.UsageError(f"--out {args.out} is not empty; --replay writes a new model folder")
    passk.check_writable(args.out)
    device = passk.check_device(args.device or config.get("device_type", ""))
    if torch.device(device).type != config.get("device_type"):  # the noise streams differ between CPU and CUDA
        raise verify.UsageError(f"--replay: {args.replay} was trained on {config.get('device_type')}; replay it on "
                                f"that device type (--device {config.get('device_type')})")
    base = args.model if args.model != Args.model else run.model
    model, tok = passk.load_model(base, "fp32", device)
    master = {k: p.detach().float().clone() for k, p in model.named_parameters()}
    if config.get("base_digest") != weights_digest(master):
        raise verify.UsageError(f"--replay: {base} is not the base model of {args.replay} (its weights' digest is not "
                                f"the logged {config.get('base_digest')})")
    init = {k: v.clone() for k, v in master.items()}
    trained = {k: master[k] for k in select_params(model, run.params)}
    for t, r in enumerate(rewards):
        es_update(trained, shape_fitness(np.asarray(r, dtype=np.float64), run.fitness), run, t, init)
    restore(dict(model.named_parameters()), master)
    tmp = args.out.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if os.path.isdir(args.out):
        os.rmdir(args.out)  # empty (checked above)
    os.replace(tmp, args.out)
    print(f"replayed {len(rewards)} iterations of {args.replay} -> {args.out}")
    return model, tok


# ---- the loop -----------------------------------------------------------------------------------------------------
def train(args, model=None, tokenizer=None, evaluate_start=True, tracker=None):
    """Run ES; returns (model, tokenizer), the model holding the fp32 master weights. model/tokenizer: already loaded
    (e.g. by a schedule), else args.model is loaded; evaluate_start=False skips the held-out eval at iteration 0;
    tracker: a schedule's passk.Tracker (else --report-to opens this run's own)."""
    start_it, state, ckpt = 0, {}, None
    if args.resume:
        ckpt = latest_checkpoint(args.resume)
        log = read_log(os.path.join(args.resume, "log.jsonl"))  # read once: its config, then the iterations past ckpt
        config = log[0] if log and log[0].get("type") == "config" and log[0].get("algo") == "es" else None
        if ckpt is not None:
            saved, state = read_checkpoint(ckpt)
        elif config is None:
            raise verify.UsageError(f"--resume {args.resume}: no checkpoint-* and no es.py log.jsonl in that "
                                    "directory")
        else:  # the log alone (a committed log, a run folder without checkpoints): the model is replayed from it
            saved, state = {k: v for k, v in config.items() if k in Args.__dataclass_fields__}, {"iteration": 0}
        default, free = Args(), ("iterations", "resume", "out", "device", "threads", "report_to", "run_name")
        changed = [k for k, v in dataclasses.asdict(args).items()
                   if k not in free and v != getattr(default, k) and v != saved.get(k)]
        if changed:
            raise verify.UsageError(f"--resume continues the saved run; only --iterations, --device, --threads, "
                                    f"--report-to and --run-name may change (got --{changed[0].replace('_', '-')})")
        # no --iterations: the saved run's total, so that a killed run ends where it meant to
        total = saved.get("iterations", default.iterations) if args.iterations is None else args.iterations
        args = Args(**{**saved, "iterations": total, "resume": args.resume, "out": args.resume,
                       **{k: getattr(args, k) or saved.get(k, getattr(default, k))
                          for k in ("device", "threads", "run_name", "report_to")}})
        start_it = state["iteration"]
    elif latest_checkpoint(args.out):
        raise verify.UsageError(f"{args.out} already holds a run: --resume {args.out} to continue it, or a new --out")
    if args.iterations is None:  # a new run, no --iterations given (parse_args): the default
        args = dataclasses.replace(args, iterations=Args.iterations)
    check_args(args)
    passk.check_writable(args.out)
    rank, world, device = setup_distributed(args)
    task = verify.get_task(args.task, args.data or None)
    # the held-out problems before the model loads: a split too small for them is one line, at once
    held_out, greedy_set = passk.held_out_problems(task, args.eval_split, args.eval_problems, args.eval_greedy)
    if model is None or args.resume:
        model, tokenizer = passk.load_model(ckpt or args.model, "fp32", device)
    model.to(device)
    base = passk.load_model(args.model, "fp32", device)[0] if ckpt else model
    # fp32 master (and initial) copies of every parameter; the working weights live in the model, in args.dtype
    master = {k: p.detach().float().clone() for k, p in model.named_parameters()}
    init = {k: p.detach().float().clone() for k, p in base.named_parameters()}
    del base
    if {k: v.shape for k, v in init.items()} != {k: v.shape for k, v in master.items()}:
        raise verify.UsageError(f"--resume: checkpoint {ckpt} does not fit the architecture of --model {args.model}")
    passk.cast_params(model, passk.DTYPES[args.dtype])
    model.eval()
    params = select_params(model, args.params)
    trained = {k: master[k] for k in params}  # the update touches only these (same tensors as in master)
    if args.resume:  # 5. again for each iteration logged past the checkpoint: the same update, so the same weights
        config = config or {}
        same_device = config.get("device_type") == torch.device(device).type  # the noise streams are per device type
        if ckpt is None and (not same_device or config.get("base_digest") != weights_digest(init)):
            raise verify.UsageError(f"--resume {args.resume}: its log was written on {config.get('device_type')} "
                                    f"from a model whose digest is {config.get('base_digest')}; resume it there, "
                                    f"from that --model")
        logged = max((r["iteration"] for r in log if r.get("type") == "train" and isinstance(r.get("iteration"), int)
                      ), default=0)
        if logged > max(args.iterations, start_it):
            raise verify.UsageError(f"--resume {args.resume}: its log holds {logged} iterations, more than "
                                    f"--iterations {args.iterations} (a run extended and killed before its next "
                                    f"checkpoint: give the total it was extended to); nothing was changed")
        # a log from another device type is redone from the checkpoint, not replayed
        tail = log_tail(log, Args(**{**dataclasses.asdict(args), **saved}), start_it, args.iterations) \
            if same_device else []
        if ckpt is None and not tail and logged > 1:
            raise verify.UsageError(f"--resume {args.resume}: no checkpoint, and its log's first iteration cannot be "
                                    "replayed (no member rewards: a log written before es.py logged them?); nothing "
                                    "was changed")
        for r in tail:
            es_update(trained, shape_fitness(np.asarray(r["rewards"], dtype=np.float64), args.fitness), args,
                      r["iteration"] - 1, init)
        restore(params, master)
        if tail:
            start_it, state = tail[-1]["iteration"], {k: tail[-1][k] for k in ("generations", "tokens", "wall")}
        if world > 1:  # every rank has read the log before rank 0 rewrites it
            dist.barrier()
    train_pool = task.examples("train", args.train_problems, seed=stream_seed(args.seed, "train"))
    mine = [n for n in range(args.population) if n % world == rank]
    own_tracker = tracker is None  # a schedule passes its own (one run across its stages) and closes it
    if own_tracker:  # before anything is written: a tracker that cannot start is a one-line error
        tracker = passk.open_tracker(args, {"algo": "es", **dataclasses.asdict(args)}, rank=rank,
                                     resume_from=passk.redo_from(start_it, args.iterations))
    log_path = os.path.join(args.out, "log.jsonl")
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        if start_it == 0:
            open(log_path, "w").write(json.dumps({"type": "config", "algo": "es", **dataclasses.asdict(args),
                                                  "trained_params": sum(p.numel() for p in params.values()),
                                                  "base_digest": weights_digest(init),
                                                  "device_type": torch.device(device).type}) + "\n")
        else:  # drop lines logged after the checkpoint we resume from: they are about to be redone
            with open(log_path + ".tmp", "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in read_log(log_path) if r.get("iteration", 0) <= start_it)
            os.replace(log_path + ".tmp", log_path)
    gens, tokens, wall = state.get("generations", 0), state.get("tokens", 0), state.get("wall", 0.0)

    def evaluate(t):
        # the master in --eval-dtype, as grpo.py evaluates its weights: one numerics for every method's evaluations
        # (SmolLM2's base model: greedy pass@1 0.0625 in fp32, 0.047 in bf16 weights, on the same 128 problems)
        every = dict(model.named_parameters())
        passk.cast_params(model, passk.DTYPES[args.eval_dtype])
        restore(every, master)
        try:
            summary = passk.held_out(model, tokenizer, task, held_out, greedy_set, args.eval_n, args.max_new_tokens,
                                     args.batch_size, rank, world)
        finally:  # the working weights again, args.dtype(master) exactly (a cast back from a coarser eval dtype
            passk.cast_params(model, passk.DTYPES[args.dtype])  # would keep its rounding)
            restore(every, master)
        if rank == 0:
            log_line(log_path, {"type": "eval", "iteration": t, **summary, **passk.products_note(args.eval_dtype)},
                     tracker)
            print(f"[eval {t:4d}] " + passk.eval_line(summary), flush=True)

    if start_it == 0 and evaluate_start:  # a schedule's later stage starts from an evaluated model
        evaluate(0)
    from tqdm import tqdm
    bar = tqdm(range(start_it, args.iterations), desc="es", disable=rank != 0, file=sys.stderr,
               initial=start_it, total=args.iterations)
    for t in bar:
        t0 = time.time()
        # 1. the iteration's prompts and the members' seeds derive from (seed, t): nothing to draw or broadcast
        rng = random.Random(stream_seed(args.seed, "prompts", t))
        batch = rng.sample(train_pool, min(args.prompts, len(train_pool)))
        # 2.-3. perturb, score, restore: this rank's members only
        timing = {"perturb": 0.0, "generate": 0.0}
        t_probe = time.time()
        probe = [probe_reward(model, tokenizer, task, batch, args, t, rank, world)] if args.probe else []
        t_probe = time.time() - t_probe  # a diagnostic: logged apart, not counted in wall
        scores = score_members(model, tokenizer, task, batch, mine, master, params, args, t, timing)
        table = torch.zeros(args.population, 4, dtype=torch.float64, device=device)  # reward, format, answer, tokens
        for n, s in scores.items():
            table[n] = torch.tensor([s["reward"], s["format"], s["answer"], s["tokens"]], dtype=torch.float64,
                                    device=device)
        logs = [{n: (s["answers"], s["solved"], s["per_prompt"]) for n, s in scores.items()}]
        if world > 1:  # only the N rewards are needed for the update; the rest is for the log's diagnostics
            dist.all_reduce(table)  # each row is filled by exactly one rank, the rest add exact zeros
            logs = [None] * world
            dist.all_gather_object(logs, {n: (s["answers"], s["solved"], s["per_prompt"]) for n, s in scores.items()})
        table = table.cpu()
        rewards = table[:, 0].numpy()
        if not np.isfinite(rewards).all():
            raise RunError(f"non-finite reward at iteration {t + 1}; last good checkpoint: "
                           f"{latest_checkpoint(args.out)}")
        # 4. fitness shaping; 5. the update, identical on every rank
        fitness = shape_fitness(rewards, args.fitness)
        t1 = time.time()
        update_norm = es_update(trained, fitness, args, t, init)
        if not all(torch.isfinite(w).all() for w in trained.values()):
            raise RunError(f"non-finite weights after iteration {t + 1}; "
                           f"last good checkpoint: {latest_checkpoint(args.out)}")
        restore(params, master)
        t_update = time.time() - t1
        if args.probe:  # the same prompts (and sampling uniforms) on the updated model: did the step help them?
            t2 = time.time()
            probe.append(probe_reward(model, tokenizer, task, batch, args, t, rank, world))
            t_probe += time.time() - t2
        gens += args.population * len(batch) * (args.samples if args.temperature > 0 else 1)
        tokens += int(table[:, 3].sum())
        wall += time.time() - t0 - t_probe
        if rank == 0:
            merged = {n: v for part in logs for n, v in part.items()}
            answers = [[merged[n][0][i] for n in range(args.population)] for i in range(len(batch))]
            rec = {"type": "train", "iteration": t + 1, "reward": float(rewards.mean()),
                   "reward_std": float(rewards.std()), "reward_min": float(rewards.min()),
                   "reward_max": float(rewards.max()), "format": float(table[:, 1].mean()),
                   "answer": float(table[:, 2].mean()),
                   "js_diversity": float(np.mean([passk.js_diversity(passk.class_counts(a)) for a in answers])),
                   "coverage": float(np.mean([any(merged[n][1][i] for n in merged) for i in range(len(batch))])),
                   "fitness_reliability": fitness_reliability([merged[n][2] for n in range(args.population)]),
                   "rewards": [float(x) for x in rewards],  # every member's, in member order: --replay needs them
                   **({"probe_before": probe[0], "probe_after": probe[1], "time_probe": t_probe} if probe else {}),
                   "update_norm": update_norm, "drift": relative_drift(trained, init), "generations": gens,
                   "tokens": tokens, "wall": wall, "evals_per_s": args.population / (time.time() - t0 - t_probe),
                   "time_perturb": timing["perturb"], "time_generate": timing["generate"], "time_update": t_update,
                   **passk.products_note(args.dtype)}
            log_line(log_path, rec, tracker)
            bar.set_postfix(reward=f"{rec['reward']:.3f}", js=f"{rec['js_diversity']:.2f}",
                            cov=f"{rec['coverage']:.2f}")
            tqdm.write(f"it {t + 1:4d}  reward {rec['reward']:.3f}±{rec['reward_std']:.3f}  answer {rec['answer']:.3f}"
                       f"  js {rec['js_diversity']:.3f}  cov {rec['coverage']:.2f}  |step| {update_norm:.3g}"
                       f"  drift {rec['drift']:.3g}  {rec['evals_per_s']:.1f} evals/s", file=sys.stderr)
        done = t + 1 == args.iterations
        if args.eval_every and (t + 1) % args.eval_every == 0 or done:
            evaluate(t + 1)
        if (args.save_every and (t + 1) % args.save_every == 0 or done) and rank == 0:
            save_checkpoint(model, tokenizer, master, args, {"iteration": t + 1, "generations": gens,
                                                             "tokens": tokens, "wall": wall})
        if world > 1:
            dist.barrier()
    if args.resume and tail and start_it == args.iterations and rank == 0:  # all of it replayed: its checkpoint
        save_checkpoint(model, tokenizer, master, args, {"iteration": start_it, **state})
    if own_tracker and tracker is not None:
        tracker.close()
    passk.cast_params(model, torch.float32)  # hand back the exact fp32 master (the checkpoint), e.g. to a schedule
    restore(dict(model.named_parameters()), master)
    return model, tokenizer


def main(args):
    try:
        with passk.run_products(args):
            return replay(args) if args.replay else train(args)
    except verify.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (RunError, OSError) as e:  # OSError: e.g. the disk filled up while logging; checkpoints are atomic
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


def parse_args(argv=None):
    return passk.parse_flags(Args, argv, __doc__, unset=("iterations",))  # None: not given (train() resolves it)


if __name__ == "__main__":
    main(parse_args())
