"""grpo.py: GRPO post-training of a causal LM, the faithful baseline (DeepSeekMath GRPO, DAPO, Dr. GRPO, TRL defaults).

for step t = 1..T, train() runs one function per step (after setup(): resume, model, reference, optimizer, DDP, log):
  (1) rollouts      G completions for each of this rank's prompts (passk.sample)
  (2) score         rewards and group-relative advantages (advantages; the batch std over every rank's rewards)
  (3) train_batch   the rows worth training, the whole step's normalisers, frozen old / reference log-probabilities;
                    the loss: backward_step (token_logprobs, surrogate, kl_k3, aggregate) over micro-batches
  (4) update        gradient clipping and one AdamW step, --inner-epochs times on the same rollouts
  (5) step_sums, step_record, evaluate, save_checkpoint: the "train" record, held-out Pass@k, the checkpoint

    python grpo.py                                           # the embedded model on the toy task, a few minutes
    torchrun --nproc_per_node 8 grpo.py --model Qwen/Qwen2.5-1.5B-Instruct --task countdown --group 8 --prompts 64 \\
        --lr 1e-6 --beta 0.04 --max-new-tokens 1024 --dtype bf16 --grad-checkpointing

How this differs from the papers and from TRL's GRPOTrainer:
- Rollouts come from passk.sample, the sampler ES and the evaluation use (same temperature / top-p semantics, the same
  budget accounting), under the same --dtype autocast as the loss's forwards; log-probabilities are taken at the
  sampling temperature (logits / T), as TRL does.
- Defaults follow TRL (beta = 0, loss "dapo", scale_rewards "group", std unbiased + 1e-4, eps 0.2 both sides);
  --beta 0.04 --loss grpo gives DeepSeekMath GRPO, --eps-high 0.28 --loss dapo DAPO's clip-higher (without its
  dynamic sampling), --scale-rewards none --loss dr_grpo Dr. GRPO.
- Normalisers (token counts, sequence counts) are computed over the whole step (all micro-batches, all ranks), so
  gradient accumulation and DDP give the gradient of the full-batch loss.
- One generation per step; with --inner-epochs > 1 the same rollouts are reused with the old log-probabilities frozen.
- The loss's forwards compute the head only from the first completion position, and on CPU use eager attention (its
  backward is faster there than SDPA's): 1.4x less time for the loss pass on SmolLM2 (bench.py part j).
- --shared-prompt forwards each distinct prompt once and lets its G completions attend to its keys and values (the
  gradient flows back through them): the same loss and gradient to float rounding for G times fewer prompt positions.
"""
import copy
import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from types import SimpleNamespace

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
    iterations: int = 150
    """optimizer steps in total (with --resume and none given: the saved run's); in [0, inf)"""
    prompts: int = 32
    """prompts per step (split across ranks); in [1, inf)"""
    group: int = 8
    """G, completions per prompt; in [2, inf)"""
    train_problems: int = 2000
    """size of the training pool the prompts are drawn from each step; in [1, inf)"""
    lr: float = 2e-4
    """AdamW learning rate (real 1.5B models: 1e-6); in (0, inf)"""
    weight_decay: float = 0.0
    """AdamW weight decay; in [0, inf)"""
    max_grad_norm: float = 1.0
    """gradient clipping by global norm (0: off); in [0, inf)"""
    temperature: float = 1.0
    """rollout sampling temperature (0, greedy, would give every group identical rollouts); in (0, inf)"""
    top_p: float = 1.0
    """rollout nucleus mass; in (0, 1]"""
    max_new_tokens: int = 16
    """generation budget per completion; in [1, inf)"""
    scale_rewards: str = "group"
    """divide advantages by the group's or the batch's reward std, or not at all; one of {group, batch, none}"""
    loss: str = "dapo"
    """grpo: sequence mean, dapo: token mean, dr_grpo: sum / (G*max_new_tokens); one of {grpo, dapo, dr_grpo}"""
    eps_low: float = 0.2
    """lower clip: ratio >= 1 - eps_low; in [0, 1)"""
    eps_high: float = 0.2
    """upper clip: ratio <= 1 + eps_high (DAPO clip-higher: 0.28); in [0, inf)"""
    beta: float = 0.0
    """KL(policy || reference) coefficient, k3 estimator (TRL: 0, DeepSeekMath: 0.04); in [0, inf)"""
    inner_epochs: int = 1
    """optimizer steps per batch of rollouts (PPO-style reuse, frozen old log-probabilities); in [1, inf)"""
    micro_batch: int = 64
    """rows per forward/backward (gradient accumulation); in [1, inf)"""
    grad_checkpointing: bool = False
    """trade compute for activation memory"""
    shared_prompt: bool = False
    """the loss's forwards run each distinct prompt once and share its keys and values with the rows that continue it
    (a group's G completions): the same loss and gradient to float rounding, G times fewer prompt positions; for
    llama, qwen2, qwen3 models with full attention, not with --grad-checkpointing (its recompute would fill the
    shared cache twice)"""
    dtype: str = "fp32"
    """autocast dtype of the forwards (weights, optimizer stay fp32; fp16 would need a scaler); one of {fp32, bf16}"""
    batch_size: int = 512
    """rows per generation batch; in [1, inf)"""
    seed: int = 0
    """run seed: prompt order and sampling derive from it; in [0, inf)"""
    eval_every: int = 25
    """held-out Pass@k every this many steps (and at start and end; 0 = only at start and end); in [0, inf)"""
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
    save_every: int = 25
    """checkpoint every this many steps (and at the end; 0 = only at the end); in [0, inf)"""
    out: str = "runs/grpo"
    """run directory: log.jsonl, checkpoint-NNNNNN/"""
    resume: str = ""
    """continue the run saved in this directory (its args and total: see --iterations)"""
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


def stream_seed(*key) -> int:
    return int.from_bytes(hashlib.blake2b(":".join(map(str, key)).encode(), digest_size=8).digest(), "big") >> 1


# ---- 1. rollouts ----------------------------------------------------------------------------------------------------
def rollouts(model, tokenizer, task, train_pool, args, t, rank=0, world=1):
    """(this rank's share of step t's prompts, passk.Samples of G completions each): every rank draws the same prompts
    from (seed, t); sampled under their global indices, the rollouts do not depend on the world size."""
    rng = random.Random(stream_seed(args.seed, "prompts", t))
    batch = rng.sample(train_pool, min(args.prompts, len(train_pool)))[rank::world]
    model.eval()
    s = passk.sample(model, tokenizer, [task.prompt(ex, tokenizer) for ex in batch], n=args.group,
                     temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                     batch_size=args.batch_size, seed=stream_seed(args.seed, "rollout", t),
                     keys=range(rank, world * len(batch), world))
    return batch, s


# ---- 2. score: rewards and group-relative advantages ----------------------------------------------------------------
def advantages(rewards: torch.Tensor, scale: str = "group") -> torch.Tensor:
    """rewards [P, G] -> (r - group mean) / (std + 1e-4); std unbiased, of the group, the batch, or none (Dr. GRPO).
    A group whose rewards are all equal gets exactly 0: in float32 the mean of eight 0.1s is not 0.1, and the
    rounding error divided by 1e-4 would otherwise push every completion of that group down (TRL has this)."""
    flat = rewards.amax(dim=1, keepdim=True) == rewards.amin(dim=1, keepdim=True)
    centered = torch.where(flat, 0.0, rewards - rewards.mean(dim=1, keepdim=True))
    if scale == "group":
        return centered / (rewards.std(dim=1, keepdim=True) + 1e-4)
    if scale == "batch":
        return centered / (rewards.std() + 1e-4)
    if scale == "none":
        return centered
    raise verify.UsageError(f"unknown --scale-rewards {scale!r} (choose from: group, batch, none)")


def score(task, batch, texts, args, t=0, rank=0, world=1, device="cpu"):
    """(reward parts, rewards [P, G] of all ranks: for the batch std and the log, advantages [B]) of this rank's
    completions texts, args.group per example of batch, prompt-major."""
    ex_of = [batch[r // args.group] for r in range(len(texts))]
    parts = [task.parts(c, ex) for c, ex in zip(texts, ex_of)]
    rewards = torch.tensor([task.reward_from(p) for p in parts], dtype=torch.float32).view(-1, args.group)
    if not torch.isfinite(rewards).all():
        raise RunError(f"non-finite reward at step {t + 1}; last good checkpoint: {latest_checkpoint(args.out)}")
    all_rewards = rewards
    if world > 1:
        everyone = [torch.zeros_like(rewards, device=device) for _ in range(world)]
        dist.all_gather(everyone, rewards.to(device))
        all_rewards = torch.cat(everyone).cpu()
    if args.scale_rewards == "batch":
        adv = advantages(all_rewards, "batch")[rank * len(batch):(rank + 1) * len(batch)]
    else:
        adv = advantages(rewards, args.scale_rewards)
    return parts, all_rewards, adv.reshape(-1)  # one advantage per completion


# ---- 3. log-probabilities and the loss -------------------------------------------------------------------------------
def pack(prompt_ids, completion_ids, pad):
    """Right-padded [B, L] ids, attention mask, and the completion mask over the L-1 predicted positions."""
    seqs = [p + c for p, c in zip(prompt_ids, completion_ids)]
    L = max(map(len, seqs))
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    attn = torch.zeros((len(seqs), L), dtype=torch.long)
    comp = torch.zeros((len(seqs), L - 1), dtype=torch.bool)  # comp[b, j]: position j predicts a completion token
    for b, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        ids[b, :len(p) + len(c)] = torch.tensor(p + c)
        attn[b, :len(p) + len(c)] = 1
        comp[b, len(p) - 1:len(p) + len(c) - 1] = True
    return ids, attn, comp


@contextmanager
def loss_attention(model, device):
    """The attention of the loss's forwards: transformers' eager attention on CPU, whose backward beats SDPA's CPU
    flash kernel at these lengths (bench.py part j), and SDPA elsewhere (the fused GPU kernels); rollouts keep SDPA.
    Held over the backward too: --grad-checkpointing recomputes the forward there."""
    cfg = getattr(model, "module", model).config  # DDP wraps the model
    saved = getattr(cfg, "_attn_implementation", None)
    swap = torch.device(device).type == "cpu" and saved == "sdpa"
    if swap:
        cfg._attn_implementation = "eager"
    try:
        yield
    finally:
        if swap:
            cfg._attn_implementation = saved


def token_logprobs(model, ids, attn, temperature, start=0):
    """log p(token_{j+1} | prefix) [B, L-1] at the sampling temperature, 0 at positions j < start: the head and the
    log-softmax over the vocabulary run only from `start`, the first position that predicts a completion token
    (on SmolLM2 they were a quarter of the step when every prompt position paid for them)."""
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False,
                   logits_to_keep=ids.shape[1] - start).logits[:, :-1].float()
    logits = passk.at_temperature(logits, temperature)
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, start + 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(logp, (start, 0))


def shared_token_logprobs(model, ids, attn, comp, temperature):
    """token_logprobs of pack's rows (ids, attn, comp [B, L-1]) with each distinct prompt forwarded once: its keys and
    values, computed on its own, are shared by every row that continues it (a GRPO group's G completions), and the
    gradient flows back through them. Same layout and, up to float rounding, same values and gradient, for G times
    fewer prompt positions (SmolLM2's chain_sum: 47 prompt tokens a row against 24 completion tokens from the base
    model, 13 once trained; bench.py part j). Under DDP the prompts' forward is the one call through the wrapper (it
    runs in every micro-batch, even one of single-token completions, and arms the gradient all-reduce); the
    completions' forward goes around it, its parameters' gradients summed into the same all-reduce."""
    cpu_ids = ids.cpu()  # the prompts' tokens once, not a device sync per row
    n_comp = comp.sum(1).long()
    n_prompt = (attn.sum(1) - n_comp).tolist()
    rows = [tuple(cpu_ids[b, :n].tolist()) for b, n in enumerate(n_prompt)]
    index = {p: i for i, p in enumerate(dict.fromkeys(rows))}  # each distinct prompt's row in the prompts' batch
    which = torch.tensor([index[p] for p in rows], device=ids.device)
    p_ids, p_valid = passk.left_pad(list(index), 0, ids.device)  # pads are masked: any id will do
    p_pos = (p_valid.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=p_ids, attention_mask=p_valid.long(), position_ids=p_pos, use_cache=True, logits_to_keep=1)
    logits = [out.logits[:, -1:].index_select(0, which)]  # predicts each row's first completion token
    Lc = int(n_comp.max()) if len(n_comp) else 0
    starts = torch.tensor(n_prompt, device=ids.device)
    cols = starts[:, None] + torch.arange(max(Lc, 1), device=ids.device)
    c_valid = torch.arange(max(Lc, 1), device=ids.device) < n_comp[:, None]
    c_ids = torch.where(c_valid, ids.gather(1, cols.clamp(max=ids.shape[1] - 1)), 0)  # [B, Lc] right-padded
    if Lc > 1:  # the completions, but their last token (it predicts nothing here), after the shared keys and values
        cache = out.past_key_values
        cache.batch_select_indices(which)
        mask = torch.cat([p_valid.index_select(0, which), c_valid[:, :-1]], 1).long()
        logits.append(getattr(model, "module", model)(input_ids=c_ids[:, :-1], attention_mask=mask,
                                                      position_ids=cols[:, :-1], past_key_values=cache,
                                                      use_cache=True).logits)
    logits = passk.at_temperature(torch.cat(logits, 1).float(), temperature)
    logp = torch.log_softmax(logits, -1).gather(-1, c_ids[:, :logits.shape[1]].unsqueeze(-1)).squeeze(-1)
    return logp.new_zeros(comp.shape).masked_scatter(comp > 0, logp[c_valid[:, :logits.shape[1]]])


def shares_prompts(model) -> bool:
    """Whether --shared-prompt's forwards are right for this model: a Llama-style decoder (passk.Decoder's kinds) with
    full attention in every layer, whose forward places tokens by the position_ids it is given (a model that ignored
    them, or a sliding window counted from the cache, would shift the shorter prompts' completions silently)."""
    return passk.Decoder.full_attention(model)


def row_logprobs(model, ids, attn, comp, args):
    """The loss's log-probabilities [B, L-1]: with --shared-prompt one forward per distinct prompt, else per row."""
    if args.shared_prompt:
        return shared_token_logprobs(model, ids, attn, comp, args.temperature)
    return token_logprobs(model, ids, attn, args.temperature, first_completion(comp))


def kl_k3(logp, ref_logp):
    """k3 estimator of KL(policy || ref) per token: exp(ref - logp) - (ref - logp) - 1 (>= 0, 0 when equal)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def surrogate(logp, old_logp, adv, eps_low, eps_high):
    """Per-token clipped objective to maximise, and whether the clip was active. adv broadcasts over tokens."""
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    obj = torch.minimum(ratio * adv, clipped * adv)
    return obj, (clipped * adv < ratio * adv)


def aggregate(per_token, mask, kind, n_seqs, n_tokens, max_new_tokens):
    """Sum of this micro-batch's share of the step loss; n_seqs / n_tokens are the whole step's counts.

    grpo: mean over each sequence's tokens, then over sequences; dapo: mean over all tokens of the step;
    dr_grpo: sum over tokens / (sequences * max_new_tokens), a constant normaliser (no length bias).
    """
    per_token = per_token * mask
    if kind == "grpo":
        return (per_token.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / n_seqs
    if kind == "dapo":
        return per_token.sum() / max(n_tokens, 1)
    if kind == "dr_grpo":
        return per_token.sum() / (n_seqs * max_new_tokens)
    raise verify.UsageError(f"unknown --loss {kind!r} (choose from: grpo, dapo, dr_grpo)")


def informative_rows(adv: torch.Tensor, beta: float) -> torch.Tensor:
    """The rows worth a forward and backward pass. With no KL term (beta = 0) a completion whose advantage is exactly
    0 (every completion of a group with no reward spread) adds exactly nothing to the gradient, at any ratio:
    min(r * 0, clip(r) * 0) = 0. So it is not forwarded; the normalisers still count it, and the gradient is that of
    the whole batch (tested). At least one row is kept, so that every DDP rank joins the gradient all-reduce."""
    if beta > 0:
        return torch.arange(len(adv), device=adv.device)
    keep = (adv != 0).nonzero().squeeze(-1)
    return keep if keep.numel() else keep.new_zeros(1)


def first_completion(comp):
    """The first position at which any row of a micro-batch predicts a completion token (comp [B, L-1])."""
    cols = comp.any(0).nonzero()
    return int(cols[0]) if cols.numel() else 0


def backward_step(model, batch, old_logp, ref_logp, args, n_seqs, n_tokens, world=1, autocast=None):
    """Accumulate the gradient of the step loss over micro-batches of args.micro_batch rows; returns sums for logging.

    batch = (ids [B, L], attention [B, L], completion mask [B, L-1], advantages [B]). old_logp / ref_logp: [B, L-1]
    or None (old = the current policy, detached: ratio 1; no reference: no KL). n_seqs, n_tokens: whole-step counts.
    """
    ids, attn, comp, adv = batch
    B, mb = ids.shape[0], args.micro_batch
    stats = {"loss": 0.0, "clip": 0.0, "kl": 0.0}
    for i in range(0, B, mb):
        sl = slice(i, i + mb)
        sync = model.no_sync() if world > 1 and i + mb < B else nullcontext()  # all-reduce once, at the end
        with sync, autocast or nullcontext(), loss_attention(model, ids.device):
            logp = row_logprobs(model, ids[sl], attn[sl], comp[sl], args)
            valid = comp[sl] > 0  # zero the prompt and pad positions *before* any exp: no inf * 0 = NaN there
            logp = torch.where(valid, logp, 0.0)
            old = torch.where(valid, old_logp[sl], 0.0) if old_logp is not None else logp.detach()
            obj, clipped = surrogate(logp, old, adv[sl].unsqueeze(-1), args.eps_low, args.eps_high)
            per_token = -obj
            if ref_logp is not None:
                kl = kl_k3(logp, torch.where(valid, ref_logp[sl], 0.0))
                per_token = per_token + args.beta * kl
            loss = aggregate(per_token, comp[sl], args.loss, n_seqs, n_tokens, args.max_new_tokens) * world
            loss.backward()
        m = comp[sl]
        with torch.no_grad():
            stats["kl"] += float((kl * m).sum()) if ref_logp is not None else 0.0
            stats["clip"] += float((clipped.float() * m).sum())
            stats["loss"] += loss.item() / world
    return stats


def train_batch(s, adv, pad, model, ref, args, world=1, device="cpu", autocast=None):
    """backward_step's (batch, old_logp, ref_logp, n_seqs, n_tokens) of rollouts s and advantages adv: the rows worth a
    forward, packed; the whole step's counts (all ranks); frozen log-probs of model (inner epochs) and ref, or None."""
    ids, attn, comp = pack(s.prompt_ids, s.completion_ids, pad)
    ids, attn, comp, adv = ids.to(device), attn.to(device), comp.to(device).float(), adv.to(device)
    # normalisers over the whole step: all micro-batches, all ranks (DDP averages gradients, hence * world)
    counts = torch.tensor([len(s.texts), float(comp.sum())], dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(counts)
    rows = informative_rows(adv, args.beta)  # skip what contributes exactly nothing
    width = int(attn[rows].sum(1).max())  # and the padding columns no kept row reaches
    ids, attn, comp, adv = ids[rows, :width], attn[rows, :width], comp[rows, :width - 1], adv[rows]
    mb = args.micro_batch

    def frozen(m):  # log-probs of m, no gradient, in micro-batches
        with loss_attention(m, device):
            return torch.cat([row_logprobs(m, ids[i:i + mb], attn[i:i + mb], comp[i:i + mb], args)
                              for i in range(0, ids.shape[0], mb)])
    with torch.no_grad(), autocast or nullcontext():
        old_logp = frozen(model) if args.inner_epochs > 1 else None
        ref_logp = frozen(ref) if ref is not None else None
    return (ids, attn, comp, adv), old_logp, ref_logp, float(counts[0]), float(counts[1])


# ---- 4. update ------------------------------------------------------------------------------------------------------
def update(model, opt, batch, old_logp, ref_logp, args, n_seqs, n_tokens, world=1, autocast=None, ddp=None):
    """args.inner_epochs AdamW steps, each on the clipped accumulated gradient (backward_step, through ddp if given).
    Returns this rank's loss and clip sums over the epochs and kl sum of the first (of the rollout policy)."""
    model.train()
    stats = {"loss": 0.0, "clip": 0.0, "kl": 0.0}
    for epoch in range(args.inner_epochs):
        opt.zero_grad(set_to_none=True)
        for k, v in backward_step(model if ddp is None else ddp, batch, old_logp, ref_logp, args, n_seqs, n_tokens,
                                  world, autocast).items():
            stats[k] += v if k in ("loss", "clip") or epoch == 0 else 0.0
        if args.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        opt.step()
    return stats


# ---- 5. log, evaluate, checkpoint -----------------------------------------------------------------------------------
def step_sums(s, parts, stats, n_rows, n_seqs, n_tokens, world=1, device="cpu"):
    """The step's sums over ranks: generated tokens (EOS included), format, answer, entropy (the sampler's, exact),
    clip, kl, rows forwarded; and train_batch's completions and completion tokens (already over all ranks)."""
    sums = torch.tensor([s.tokens, sum(p["format"] for p in parts), sum(p["answer"] for p in parts),
                         sum(s.entropy_sum), stats["clip"], stats["kl"], float(n_rows)], dtype=torch.float64,
                        device=device)
    if world > 1:
        dist.all_reduce(sums)
    return {**dict(zip(("generated", "format", "answer", "entropy", "clip", "kl", "rows"), sums.tolist())),
            "completions": n_seqs, "completion_tokens": n_tokens}


def step_record(t, all_rewards, sums, loss, inner_epochs, totals, t_gen, t_update, dtype="fp32"):
    """Step t's "train" record from score's all_rewards, step_sums, update's loss, the totals so far, the timings
    (dtype: the forwards', for passk.products_note)."""
    n_comp, n_tok = sums["completions"], sums["completion_tokens"]
    return {"type": "train", "iteration": t + 1, "reward": float(all_rewards.mean()),
            "reward_std": float(all_rewards.std()), "reward_min": float(all_rewards.min()),
            "reward_max": float(all_rewards.max()), "format": sums["format"] / n_comp,
            "answer": sums["answer"] / n_comp, "token_entropy": sums["entropy"] / max(n_tok, 1),
            "clip_frac": sums["clip"] / max(n_tok * inner_epochs, 1), "kl": sums["kl"] / max(n_tok, 1),
            "loss": loss / inner_epochs, "zero_std_frac": float((all_rewards.std(dim=1) == 0).float().mean()),
            "trained_frac": sums["rows"] / n_comp, "mean_length": n_tok / n_comp,
            "generations": totals["generations"], "tokens": totals["tokens"], "wall": totals["wall"],
            "time_generate": t_gen, "time_update": t_update, **passk.products_note(dtype)}


def progress(bar, rec):
    """A "train" record on the progress bar and as one line on stderr."""
    bar.set_postfix(reward=f"{rec['reward']:.3f}", H=f"{rec['token_entropy']:.2f}")
    bar.write(f"step {rec['iteration']:4d}  reward {rec['reward']:.3f}  answer {rec['answer']:.3f}  "
              f"H {rec['token_entropy']:.3f}  clip {rec['clip_frac']:.3f}  kl {rec['kl']:.4f}  "
              f"zero-std {rec['zero_std_frac']:.2f}  len {rec['mean_length']:.1f}", file=sys.stderr)


def evaluate(run, t):
    """Held-out Pass@1..eval_n of run's policy after t steps: the one place that writes "eval" records (rank 0)."""
    run.model.eval()
    model = run.model
    if run.args.eval_dtype != "fp32":  # a copy in eval_dtype: what es.py evaluates of its master too
        model = copy.deepcopy(run.model)
        passk.cast_params(model, passk.DTYPES[run.args.eval_dtype])
    summary = passk.held_out(model, run.tokenizer, run.task, run.held_out, run.greedy_set, run.args.eval_n,
                             run.args.max_new_tokens, run.args.batch_size, run.rank, run.world)
    if run.rank == 0:
        log_line(run.log_path, {"type": "eval", "iteration": t, **summary,
                                **passk.products_note(run.args.eval_dtype)}, run.tracker)
        print(f"[eval {t:4d}] " + passk.eval_line(summary), flush=True)
    return summary


# ---- setup, checkpoints ---------------------------------------------------------------------------------------------
def check_args(args, world=1):
    """Every flag against the range or choices in its doc (passk.check_fields), then what no single flag shows."""
    if args.temperature <= 0:  # checked first for its reason; the range in the doc says the same
        raise verify.UsageError(f"--temperature must be > 0: at {args.temperature} (greedy) every completion of a "
                                f"group is the same, every advantage is 0 and GRPO learns nothing")
    passk.check_fields(args)
    passk.parse_report_to(args.report_to)
    if args.shared_prompt and args.grad_checkpointing:
        raise verify.UsageError("--shared-prompt and --grad-checkpointing do not go together: the recompute in the "
                                "backward would write the shared prompt's keys and values again; choose one")
    per_step = min(args.prompts, args.train_problems)
    if per_step < 1 or per_step % world:
        raise verify.UsageError(f"--prompts (at most --train-problems) must be a positive multiple of the world size "
                                f"{world}, got {per_step}")


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
        raise verify.UsageError(f"--resume: {ckpt} was not written by this grpo.py (unexpected args.json/state.json)")
    return found


def save_checkpoint(model, tok, opt, args, state):
    """OUT/checkpoint-NNNNNN: weights, tokenizer, optimizer.pt, args.json, state.json: written to a temp dir then
    renamed, so a kill or a failed write (disk full) never leaves a half checkpoint and the previous one stays."""
    final = os.path.join(args.out, f"checkpoint-{state['iteration']:06d}")
    tmp = os.path.join(args.out, f".tmp-{state['iteration']:06d}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        torch.save(opt.state_dict(), os.path.join(tmp, "optimizer.pt"))
        for fname, obj in (("args.json", dataclasses.asdict(args)), ("state.json", state)):
            with open(os.path.join(tmp, fname), "w") as f:
                json.dump(obj, f, indent=1)
        os.replace(tmp, final)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RunError(f"cannot write {final}: {e.strerror or e}; the last good checkpoint is "
                       f"{latest_checkpoint(args.out)}: fix the cause, then --resume {args.out}") from None
    for old in os.listdir(args.out):
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
    """(rank, world, device). Under torchrun (RANK set): nccl on GPU, gloo on CPU; prompts are split across ranks."""
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


def resumed(args):
    """(args, checkpoint, state): --resume continues the saved run (its flags, its latest checkpoint), else none."""
    if not args.resume:
        if latest_checkpoint(args.out):
            raise verify.UsageError(f"{args.out} already holds a run: --resume {args.out} to continue it, "
                                    f"or a new --out")
        if args.iterations is None:  # no --iterations given (parse_args): the default
            args = dataclasses.replace(args, iterations=Args.iterations)
        return args, None, {}
    ckpt = latest_checkpoint(args.resume)
    if ckpt is None:
        raise verify.UsageError(f"--resume {args.resume}: no checkpoint-* in that directory")
    saved, state = read_checkpoint(ckpt)
    default, free = Args(), ("iterations", "resume", "out", "device", "threads", "report_to", "run_name")
    changed = [k for k, v in dataclasses.asdict(args).items()
               if k not in free and v != getattr(default, k) and v != saved.get(k)]
    if changed:
        raise verify.UsageError(f"--resume continues the saved run; only --iterations, --device, --threads, "
                                f"--report-to and --run-name may change (got --{changed[0].replace('_', '-')})")
    # no --iterations: the saved run's total, so that a killed run ends where it meant to
    total = saved.get("iterations", default.iterations) if args.iterations is None else args.iterations
    logged = max((r["iteration"] for r in read_log(os.path.join(args.resume, "log.jsonl"))
                  if r.get("type") == "train" and isinstance(r.get("iteration"), int)), default=0)
    if logged > max(total, state.get("iteration", 0)):  # its steps past the total would be dropped: refuse instead
        raise verify.UsageError(f"--resume {args.resume}: its log holds {logged} steps, more than --iterations {total} "
                                f"(a run extended and killed before its next checkpoint: give the total it was "
                                f"extended to); nothing was changed")
    args = Args(**{**saved, "iterations": total, "resume": args.resume, "out": args.resume,
                   **{k: getattr(args, k) or saved.get(k, getattr(default, k))
                      for k in ("device", "threads", "run_name", "report_to")}})
    return args, ckpt, state


def open_log(args, rank, start_it):
    """OUT/log.jsonl: a new run's "config" record (rank 0); resumed, the lines after the checkpoint are dropped."""
    log_path = os.path.join(args.out, "log.jsonl")
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        if start_it == 0:
            open(log_path, "w").write(json.dumps({"type": "config", "algo": "grpo", **dataclasses.asdict(args)}) + "\n")
        else:  # those lines are about to be redone
            with open(log_path + ".tmp", "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in read_log(log_path) if r.get("iteration", 0) <= start_it)
            os.replace(log_path + ".tmp", log_path)
    return log_path


def setup(args, model=None, tokenizer=None, tracker=None):
    """What the steps share, as a namespace: args (a resumed run's), rank, world, device, task, model (unless given or
    resumed: args.model's), tokenizer, ddp (model, under DDP when world > 1), ref (the frozen reference when beta > 0,
    else None), opt (AdamW), autocast, train_pool, held_out, greedy_set (greedy pass@1's problems), pad, log_path,
    start_it (steps done), state (resumed), tracker (the given one, else the run's own --report-to, opened before the
    log is written), own_tracker."""
    args, ckpt, state = resumed(args)
    check_args(args, int(os.environ.get("WORLD_SIZE", "1")))
    passk.check_writable(args.out)
    rank, world, device = setup_distributed(args)
    task = verify.get_task(args.task, args.data or None)
    # the held-out problems before the model loads: a split too small for them is one line, at once
    held_out, greedy_set = passk.held_out_problems(task, args.eval_split, args.eval_problems, args.eval_greedy)
    if model is None or ckpt:
        model, tokenizer = passk.load_model(ckpt or args.model, "fp32", device)
    model.float().to(device)
    if args.shared_prompt and not shares_prompts(model):
        raise verify.UsageError(f"--shared-prompt: {args.model} is a {getattr(model.config, 'model_type', '?')} model; "
                                f"shared prompts are for {', '.join(passk.Decoder.KINDS)} models with full attention "
                                f"in every layer: leave the flag off")
    ref = None
    if args.beta > 0:  # the frozen reference is the model we start from (the base, also when resuming)
        ref = passk.load_model(args.model, "fp32", device)[0] if ckpt else copy.deepcopy(model)
        ref.requires_grad_(False).eval()
    if args.grad_checkpointing:  # transformers 5 name of gradient checkpointing; the backward's recompute runs
        # outside any torch function mode (the mode is off inside its own handler, which the backward call went
        # through), so passk.Bf16Products is entered again for it: else its bf16 products differ from the forward's
        again = {"activation_checkpointing_kwargs": {"use_reentrant": False, "context_fn": lambda: (
            nullcontext(), passk.Bf16Products())}} if passk.Bf16Products.active else {}
        model.activation_checkpointing_enable(**again)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    if ckpt:
        try:
            opt.load_state_dict(torch.load(os.path.join(ckpt, "optimizer.pt"), map_location=device))
        except Exception as e:  # truncated, foreign or missing file: many exception types, one meaning
            raise verify.UsageError(f"--resume: {os.path.join(ckpt, 'optimizer.pt')} is damaged "
                                    f"({' '.join(str(e).split())[:200]}); nothing was changed") from None
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    autocast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16) if args.dtype == "bf16" else nullcontext()
    train_pool = task.examples("train", args.train_problems, seed=stream_seed(args.seed, "train"))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    start_it = state.get("iteration", 0)
    own_tracker = tracker is None
    if own_tracker:  # a tracker that cannot start is a one-line error, before the log is written
        tracker = passk.open_tracker(args, {"algo": "grpo", **dataclasses.asdict(args)}, rank=rank,
                                     resume_from=passk.redo_from(start_it, args.iterations))
    return SimpleNamespace(args=args, rank=rank, world=world, device=device, task=task, model=model,
                           tokenizer=tokenizer, ddp=ddp, ref=ref, opt=opt, autocast=autocast, train_pool=train_pool,
                           held_out=held_out, greedy_set=greedy_set, pad=pad,
                           log_path=open_log(args, rank, start_it), start_it=start_it, state=state,
                           tracker=tracker, own_tracker=own_tracker)


# ---- the loop -------------------------------------------------------------------------------------------------------
def train(args, model=None, tokenizer=None, evaluate_start=True, tracker=None):
    """Run GRPO; returns (model, tokenizer). model/tokenizer: already loaded (e.g. by a schedule), else args.model is
    loaded; evaluate_start=False skips the held-out evaluation at step 0; tracker: a schedule's passk.Tracker (else
    --report-to opens this run's own)."""
    run = setup(args, model, tokenizer, tracker)
    args, model, rank, world, device = run.args, run.model, run.rank, run.world, run.device
    totals = {k: run.state.get(k, zero) for k, zero in (("generations", 0), ("tokens", 0), ("wall", 0.0))}
    if run.start_it == 0 and evaluate_start:  # a schedule's later stage starts from an evaluated model
        evaluate(run, 0)
    from tqdm import tqdm
    bar = tqdm(range(run.start_it, args.iterations), desc="grpo", disable=rank != 0, file=sys.stderr,
               initial=run.start_it, total=args.iterations)
    for t in bar:
        t0 = time.time()
        # ---- 1. this rank's share of the step's prompts, G completions each
        with run.autocast:  # rollouts in the numerics of the loss's forwards (bf16: 1.6x faster than fp32 here)
            batch, s = rollouts(model, run.tokenizer, run.task, run.train_pool, args, t, rank, world)
        t_gen = time.time() - t0
        # ---- 2. rewards and group-relative advantages
        parts, all_rewards, adv = score(run.task, batch, s.texts, args, t, rank, world, device)
        # ---- 3. the rows to train, the whole step's normalisers, frozen old / reference log-probabilities
        rows, old_logp, ref_logp, n_seqs, n_tokens = train_batch(s, adv, run.pad, model, run.ref, args, world,
                                                                 device, run.autocast)
        # ---- 4. the loss's accumulated gradient, one AdamW step per inner epoch
        stats = update(model, run.opt, rows, old_logp, ref_logp, args, n_seqs, n_tokens, world, run.autocast,
                       run.ddp)
        # ---- 5. log, evaluate, checkpoint
        sums = step_sums(s, parts, stats, len(rows[0]), n_seqs, n_tokens, world, device)
        bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
        if bad:
            raise RunError(f"non-finite weights after step {t + 1} ({bad[0]}); "
                           f"last good checkpoint: {latest_checkpoint(args.out)}")
        totals["generations"] += int(n_seqs)
        totals["tokens"] += int(sums["generated"])
        totals["wall"] += time.time() - t0
        if rank == 0:
            rec = step_record(t, all_rewards, sums, stats["loss"], args.inner_epochs, totals, t_gen,
                              time.time() - t0 - t_gen, args.dtype)
            log_line(run.log_path, rec, run.tracker)  # the one place that writes "train" records
            progress(bar, rec)
        done = t + 1 == args.iterations
        if args.eval_every and (t + 1) % args.eval_every == 0 or done:
            evaluate(run, t + 1)
        if (args.save_every and (t + 1) % args.save_every == 0 or done) and rank == 0:
            save_checkpoint(model, run.tokenizer, run.opt, args, {"iteration": t + 1, **totals})
        if world > 1:
            dist.barrier()
    if run.own_tracker and run.tracker is not None:  # ours, not a schedule's
        run.tracker.close()
    return model, run.tokenizer


def main(args):
    try:
        with passk.run_products(args):
            return train(args)
    except verify.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (RunError, OSError) as e:  # OSError: e.g. the disk filled up while logging; checkpoints are atomic
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


def parse_args(argv=None):
    return passk.parse_flags(Args, argv, __doc__, unset=("iterations",))  # None: not given (resumed() resolves it)


if __name__ == "__main__":
    main(parse_args())
