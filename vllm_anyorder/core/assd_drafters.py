"""The two ASSD drafters as data (torch-free, so ``config`` can validate with them).

Guo & Ermon draft either with the AS-ARM itself (Alg. 1 lines 5-8: parallel queries of the
model's query stream, each seeing the decoded set) or, App. E.4 Alg. 2, from bigram counts
of the context. What the algorithm does differently follows from one property,
``queries_target``:

* the first draft of a round is exact (Lemma 1: its query sees exactly what the verifier's
  first row sees), so a round commits >= 1 token per forward; a single remaining position is
  decoded without verification (lines 9-11); k must be >= 2 (a round of draft + verify with
  k = 1 commits exactly 2 tokens in 2 forwards, no gain);
* the verifying forward's look-ahead rows can draft the whole next round (k rows), where the
  bigram drafter takes only the bonus token (1 row);
* the drafting forward needs the model's query stream (the vLLM model's ``query_logits``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AssdDrafter:
    name: str
    queries_target: bool  # drafts with the AS-ARM's own query stream (see module docstring)
    paper: str


DRAFTERS: dict[str, AssdDrafter] = {
    d.name: d for d in (
        AssdDrafter("self", True, "Guo & Ermon, Alg. 1 lines 5-8"),
        AssdDrafter("ngram", False, "Guo & Ermon, App. E.4 Alg. 2 (context bigrams)"),
    )
}
