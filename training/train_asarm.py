"""Trains the any-subset autoregressive model (AS-ARM) of ``method="assd"`` on one CPU core.

Owns ``models/asarm/``: a two-stream Llama in the ``anyorder_llama`` format of
``vllm_anyorder.model_executor.asarm`` (content stream = Llama decoder over decoded tokens,
query stream = rows that start from ``model.query_embed`` and predict a position from the
tokens decoded before it), over the project tokenizer's 4096 tokens, saved in bf16.

Objective: the ASSD paper's teacher-forced joint loss (Guo & Ermon, Sec. 6, Eq. 7): draw a
prompt size m and an order sigma, then maximise log p(x_sigma(>=m) | x_sigma(<m)) = the sum
over generated positions of log p(x_sigma(i) | x_sigma(<i)), all in ONE forward: the content
stream attends bidirectionally over the prompt and causally in generation order (Eq. 4:
prompt positions and generated positions each sorted ascending), and the query row of
sigma(i) sees the tokens of rank < i. Loss: cross-entropy summed over the generated
positions, divided by their count. Rows of a ``--length``-token window, two kinds:

* continuation rows (1 - ``--subset-frac``): the prompt is a prefix of m ~ U{``--min-prompt``
  ..``--max-prompt``} tokens and sigma is the identity after it: left-to-right decoding after
  a bidirectional prompt, what the engine serves and what ``assd`` continuation drafts for;
* subset rows: the paper's protocol: a uniformly random subset of m = round(r N) positions,
  r ~ U(``--min-subset``, ``--max-subset``), is the prompt; the rest is generated left to
  right (sigma_pre ~ U(S_N), each part sorted ascending).

Beyond Eq. 7 (``--draft-weight``): self-drafting (Algorithm 1, lines 5-8) asks the query
stream for x_sigma(n+j) given only x_sigma(<n), j = 1..k-1, a context Eq. 7 never shows the
model (there, a query always sees every generated position before it). So each generated
rank r also gets one *draft query* at sigma(r + j), j ~ U{1..``--draft-span`` - 1}, that sees
the ranks < r, with its cross-entropy weighted by ``--draft-weight``. The joint conditionals
(what verification and sequential decoding use) are trained exactly as in Eq. 7.

Data, schedule, checkpoints and budgets: ``training.loop``. At the end the bf16 model is
saved, reloaded and evaluated (``training.eval_asarm``): validation loss left-to-right and in
random orders, and ``core.assd`` tokens per forward on benchmark prompts, in the model card.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from training import loop  # noqa: E402
from training.windows import (  # noqa: E402
    random_windows, spread, step_generator, strided_windows)
from vllm_anyorder.model_executor.asarm import AsArmConfig, random_asarm, rotary  # noqa: E402

EOS_ID, PAD_ID = 0, 1


def parse_args(argv=None):
    ap = loop.parser(__doc__, "asarm")
    a = ap.add_argument
    loop.add_size_args(ap)
    a("--length", type=int, default=128, help="window length N")
    a("--subset-frac", type=float, default=0.4, help="rows with a random-subset prompt")
    a("--min-prompt", type=int, default=4)
    a("--max-prompt", type=int, default=96)
    a("--min-subset", type=float, default=0.05)
    a("--max-subset", type=float, default=0.9)
    a("--draft-span", type=int, default=5, help="draft queries reach 1..span-1 ranks ahead")
    a("--draft-weight", type=float, default=0.5)
    return loop.parse_model_trainer(ap, argv, eval_windows=48)


def build_model(args):
    config = AsArmConfig(
        vocab_size=4096, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.heads, head_dim=args.hidden // args.heads,
        max_position_embeddings=1024, tie_word_embeddings=True,
        extra={"eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "bos_token_id": None})
    return random_asarm(config, seed=args.seed, std=0.02).train()


# ---------------------------------------------------------------------------- orders
def make_row(x, gen, args, subset: bool, prompt_len: int | None = None):
    """One window's order and query rows: (order [N], query positions [Q], query ranks [Q],
    targets [Q], weights [Q], is_draft [Q]). order: 0 prompt, 1.. generation rank."""
    n = len(x)
    if subset:
        r = args.min_subset + (args.max_subset - args.min_subset) * float(torch.rand(1, generator=gen))
        m = max(1, min(n - 1, round(r * n)))
        prompt = torch.zeros(n, dtype=torch.bool)
        prompt[torch.randperm(n, generator=gen)[:m]] = True
    else:
        m = prompt_len or int(torch.randint(args.min_prompt, args.max_prompt + 1, (1,), generator=gen))
        prompt = torch.arange(n) < m
    sigma = torch.arange(n)[~prompt]  # generated positions, ascending = generation order
    g = len(sigma)
    order = torch.zeros(n, dtype=torch.long)
    order[sigma] = torch.arange(1, g + 1)
    ranks = torch.arange(1, g + 1)
    # draft queries: rank r's context, the position of rank r + j
    j = torch.randint(1, args.draft_span, (g,), generator=gen)
    ok = ranks + j <= g
    d_ranks, d_pos = ranks[ok], sigma[(ranks + j)[ok] - 1]
    qpos, qrank = torch.cat([sigma, d_pos]), torch.cat([ranks, d_ranks])
    w = torch.cat([torch.full((g,), 1.0 / g), torch.full((len(d_pos),), args.draft_weight / g)])
    is_draft = torch.cat([torch.zeros(g, dtype=torch.bool), torch.ones(len(d_pos), dtype=torch.bool)])
    return order, qpos, qrank, x[qpos], w, is_draft


def collate(x, rows):
    """Pad the query rows; padding queries see rank-0 tokens only and carry no loss."""
    b, qmax = len(rows), max(len(r[1]) for r in rows)
    order = torch.stack([r[0] for r in rows])
    qpos = torch.zeros(b, qmax, dtype=torch.long)
    qrank = torch.ones(b, qmax, dtype=torch.long)
    target = torch.full((b, qmax), -100)
    weight = torch.zeros(b, qmax)
    draft = torch.zeros(b, qmax, dtype=torch.bool)
    for i, (_, qp, qr, tg, w, d) in enumerate(rows):
        q = len(qp)
        qpos[i, :q], qrank[i, :q], target[i, :q], weight[i, :q], draft[i, :q] = qp, qr, tg, w, d
    return x, order, qpos, qrank, target, weight, draft


def corrupt(x, gen, args, subset=None, prompt_len=None):
    if subset is None:
        subset = (torch.rand(len(x), generator=gen) < args.subset_frac).tolist()
    elif isinstance(subset, bool):
        subset = [subset] * len(x)
    return collate(x, [make_row(row, gen, args, s, prompt_len) for row, s in zip(x, subset)])


# ---------------------------------------------------------------------------- forward
def query_logits(model, x, order, qpos, qrank):
    """Batched two-stream forward with gradients (the model's ``streams`` is per sequence and
    no_grad): the same weights, rotary and masks as ``asarm.AnySubsetLlamaForCausalLM``."""
    c, m = model.config, model.model
    b, n = x.shape
    q_rows = qpos.shape[1]
    h = torch.cat([m.embed_tokens(x), m.query_embed.expand(b, q_rows, -1)], 1)  # [B, R, H]
    pos = torch.cat([torch.arange(n).expand(b, n), qpos], 1)
    mask = torch.cat([order[:, None, :] <= order[:, :, None],  # content [B, N, N]
                      order[:, None, :] < qrank[:, :, None]], 1)  # query [B, Q, N]
    nh, nkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    flat_pos = pos.reshape(-1)
    for layer in m.layers:
        a = layer.self_attn
        y = layer.input_layernorm(h)
        q = rotary(a.q_proj(y).view(-1, nh, d), flat_pos, c.rope_theta).view(b, -1, nh, d)
        kv_y = y[:, :n]
        k = rotary(a.k_proj(kv_y).view(-1, nkv, d), flat_pos.view(b, -1)[:, :n].reshape(-1),
                   c.rope_theta).view(b, n, nkv, d)
        v = a.v_proj(kv_y).view(b, n, nkv, d)
        k, v = k.repeat_interleave(nh // nkv, 2), v.repeat_interleave(nh // nkv, 2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), attn_mask=mask[:, None])
        h = h + a.o_proj(out.transpose(1, 2).reshape(b, -1, nh * d))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.lm_head(m.norm(h[:, n:]))  # [B, Q, V]


def losses(model, batch, bf16: bool):
    x, order, qpos, qrank, target, weight, draft = batch
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = query_logits(model, x, order, qpos, qrank)
    ce = F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), ignore_index=-100,
                         reduction="none").view(target.shape)
    return ce, weight, target, draft


def sample_batch(stream, args, step: int):
    gen = step_generator(args.seed, step)
    return corrupt(random_windows(stream, args.length, args.batch_size, gen), gen, args)


def val_sets(stream, args, limit: int | None = None, batch_size: int = 16) -> dict:
    """Validation windows with fixed orders (seed 1234): ``l2r`` = 16-token prompt then left
    to right, ``random`` = the paper's random-subset prompts (training's subset rows)."""
    x = spread(strided_windows(stream, args.length), limit)
    out = {}
    for name, subset, plen in (("l2r", False, 16), ("random", True, None)):
        gen = torch.Generator().manual_seed(1234)
        out[name] = [corrupt(x[i:i + batch_size], gen, args, subset, plen)
                     for i in range(0, len(x), batch_size)]
    return out


@torch.no_grad()
def evaluate(model, sets: dict, bf16: bool) -> dict:
    """nats per generated token of the joint queries (Eq. 7), and of the draft queries."""
    out = {}
    for name, batches in sets.items():
        sums = [0.0, 0, 0.0, 0]
        for batch in batches:
            ce, _, target, draft = losses(model, batch, bf16)
            joint, dq = (target >= 0) & ~draft, (target >= 0) & draft
            sums[0] += ce[joint].sum().item()
            sums[1] += int(joint.sum())
            sums[2] += ce[dq].sum().item()
            sums[3] += int(dq.sum())
        out[f"val_{name}"] = round(sums[0] / max(sums[1], 1), 4)
        out[f"val_{name}_draft"] = round(sums[2] / max(sums[3], 1), 4)
    return out


def step_loss(model, train, args, step: int, bf16: bool):
    batch = sample_batch(train, args, step)
    ce, weight, target, _ = losses(model, batch, bf16)
    return (ce * weight).sum() / len(weight), {
        "tokens_seen": batch[0].numel(), "query_rows_seen": int((target >= 0).sum())}


def main(argv=None) -> None:
    from training.eval_asarm import final_checks

    args = parse_args(argv)
    # asarm's save_pretrained writes torch_dtype float32 whatever it holds
    loop.train_then_check(args, "train_asarm", build_model, val_sets, step_loss, evaluate,
                          final_checks, counter="query_rows_seen", bf16_config={"indent": 2})


if __name__ == "__main__":
    main()
