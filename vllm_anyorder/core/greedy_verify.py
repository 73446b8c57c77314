"""The greedy verification rule of speculative decoding, on plain integers (engine-free).

Leviathan et al. 2023 (Sec. 2.3, the argmax limit of Algorithm 1) and every method of this
plugin at temperature 0: a request's drafts d_1..d_n are checked against the target's argmax
t_1..t_n at the rows that verified them, in order. The step commits t_1..t_j, where j is the
first position with d_j != t_j (its token is the target's, the correction), or, when every
draft matched, t_1..t_n and the bonus token b (the argmax of the row after the last draft).
So each step commits exactly the tokens plain greedy decoding would, one to n + 1 of them.

This is the rule of vLLM's ``rejection_greedy_sample_kernel`` (``v1/sample/rejection_sampler.py``),
written for the CPU build, where that kernel runs behind a Python dispatcher and the whole
greedy path of the rejection sampler took ~0.6-0.75 ms a step at batch 1 (2-core AMD EPYC,
fp32, issue 22) against ~0.15 ms for this one (``patches/cpu_kernels``). A padded draft
(-1: vLLM's scheduler pads a request that joined with one token left) never equals an argmax,
so it is rejected there, as the kernel does.
"""

from __future__ import annotations

PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID: no token at this position


def greedy_verify(drafts: list[int], num_drafts: list[int], target: list[int],
                  bonus: list[int], width: int) -> list[list[int]]:
    """Each request's committed tokens, padded with :data:`PLACEHOLDER` to ``width``.

    ``drafts`` / ``target``: [sum(num_drafts)], request-major (request i's drafts and the
    target's argmax at the rows verifying them); ``bonus``: [batch] the argmax after each
    request's last draft; ``width``: the longest chain + 1 (the output's columns)."""
    out, start = [], 0
    for i, n in enumerate(num_drafts):
        row = []
        for p in range(start, start + n):
            row.append(target[p])  # the target's token at this position, accepted or not
            if drafts[p] != target[p]:
                break  # the first mismatch: its correction is the last committed token
        else:
            row.append(bonus[i])  # every draft matched: the bonus token
        start += n
        out.append(row + [PLACEHOLDER] * (width - len(row)))
    return out
