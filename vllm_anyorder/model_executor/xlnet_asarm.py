"""XLNet as an any-subset autoregressive model (the paper's own checkpoint family).

Guo & Ermon fine-tune ``XLNetLMHeadModel`` as their AS-ARM (Sec. 6, App. D): XLNet's
content stream is the causal-in-generation-order stream, its query stream (``mask_emb`` +
relative positions) predicts a target position without seeing that position's token. This
wrapper drives ``transformers.XLNetLMHeadModel`` through the same interface as
``asarm.AnySubsetLlamaForCausalLM``::

    content_and_query(tokens [L], positions [L], order [L], query_positions [Q]) -> logits [Q, V]

How the interface maps onto XLNet's inputs (one forward over a canvas of every position
0 .. max position; positions are canvas indices because XLNet's encodings are relative):

* canvas[p] = the token at p, or ``fill_token_id`` where no token is (never attended to);
* rank[p] = order of the token at p (visible 0, generated 1, 2, ...), +inf where none;
* ``perm_mask[i, j] = 0`` (i may attend to j) iff rank[j] < rank[i], or both are visible.
  XLNet's content stream adds "itself" to every row, its query stream uses the row as is, so
  one row gives both streams' masks; visible tokens are never queried, which is what lets
  their row be "all visible" for the content stream;
* ``target_mapping[q] = one_hot(query_positions[q])``.

``banned_token_ids`` get -inf logits (the paper zeroes XLNet's ``<mask>`` id 6).
"""

from __future__ import annotations

from pathlib import Path

import torch

from vllm_anyorder.model_executor.asarm import INF_RANK, check_inputs, query_ranks


class XLNetAsArm:
    def __init__(self, model, fill_token_id: int = 0, banned_token_ids=()) -> None:
        self.model = model.eval()
        self.config = model.config
        self.fill_token_id = fill_token_id
        self.banned_token_ids = list(banned_token_ids)

    @classmethod
    def from_pretrained(cls, path, **kw) -> "XLNetAsArm":
        from transformers import XLNetLMHeadModel

        return cls(XLNetLMHeadModel.from_pretrained(str(path), dtype=torch.float32), **kw)

    def save_pretrained(self, path) -> Path:
        self.model.save_pretrained(str(path), safe_serialization=True)
        return Path(path)

    def inputs(self, tokens, positions, order, query_positions):
        """(input_ids [1, N], perm_mask [1, N, N], target_mapping [1, Q, N]) for XLNet."""
        check_inputs(tokens, positions, order)
        query_ranks(positions, order, query_positions)  # refuses visible queries
        if query_positions.unique().numel() != query_positions.numel():
            raise ValueError("XLNet predicts one query per position")
        n = int(torch.cat([positions, query_positions]).max()) + 1
        ids = torch.full((n,), self.fill_token_id, dtype=torch.long)
        rank = torch.full((n,), INF_RANK, dtype=torch.long)
        ids[positions], rank[positions] = tokens, order
        visible = rank == 0
        allowed = (rank[None, :] < rank[:, None]) | (visible[None, :] & visible[:, None])
        perm_mask = (~allowed).float()  # [N, N] 1 = may not attend
        target = torch.zeros(query_positions.numel(), n)
        target[torch.arange(query_positions.numel()), query_positions] = 1.0
        return ids[None], perm_mask[None], target[None]

    @torch.no_grad()
    def content_and_query(self, tokens, positions, order, query_positions):
        if query_positions.numel() == 0:
            return torch.zeros(0, self.config.vocab_size)
        ids, perm_mask, target = self.inputs(tokens, positions, order, query_positions)
        out = self.model(input_ids=ids, perm_mask=perm_mask, target_mapping=target,
                         use_mems=False)
        logits = out.logits[0].float()  # [Q, V]
        if self.banned_token_ids:
            logits[:, self.banned_token_ids] = float("-inf")
        return logits


def random_xlnet(vocab_size: int, seed: int = 0, d_model: int = 32, n_layer: int = 2,
                 n_head: int = 2, d_inner: int = 64, std: float = 0.2, path=None,
                 **kw) -> XLNetAsArm:
    """Tiny random fp32 XLNet AS-ARM (saved to ``path`` when given)."""
    from transformers import XLNetConfig, XLNetLMHeadModel

    torch.manual_seed(seed)
    cfg = XLNetConfig(vocab_size=vocab_size, d_model=d_model, n_layer=n_layer, n_head=n_head,
                      d_inner=d_inner, d_head=d_model // n_head, initializer_range=std,
                      dropout=0.0, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    model = XLNetLMHeadModel(cfg).to(torch.float32).eval()
    wrapper = XLNetAsArm(model, **kw)
    if path is not None:
        wrapper.save_pretrained(path)
    return wrapper
