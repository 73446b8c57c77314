"""Jacobi multi-block decoding with rejection recycling, as one verifiable chain per step.

Paper: "AR models can be faster and more accurate parallel decoders than diffusion LLMs"
(pcLLM / Jacobi Forcing), Sec. 2.1 (Jacobi iteration), Sec. 3.2 and Algorithm 1
(multi-block decoding + rejection recycling).

The target model is its own drafter. After a verification forward over
``[last committed token, d_1 .. d_k]`` the target's argmax ``g_i`` at every row is the next
Jacobi iterate of the position that row predicts. Positions at or after the new committed
length take ``g`` as their new draft (Algorithm 1, line 11, "tail update").

What vLLM's single-chain verification forces (and how this module maps Algorithm 1 onto it):

* One chain per request per step. The chain is the real-active (RA) block's remaining
  drafts followed by every pseudo-active block's tokens, in position order (line 4 "assemble
  input"). Causal attention over that chain conditions each pseudo-active block on the noisy
  blocks before it, exactly as in the paper. vLLM's greedy verifier accepts the longest
  prefix of the whole chain that matches the argmax, so when the RA block converges inside a
  step the accepted prefix simply runs on into the next block (line 15 "promote" happens for
  free); pseudo-accepted tokens are still re-verified before they are committed.
* Candidates cannot be verified side by side (the paper verifies the Jacobi tail and up to
  ``pool_size`` recycled n-grams in one batched forward and keeps the longest accepted). Here
  exactly one candidate is chosen *before* verification: with ``recycle="pool_first"`` a
  pooled continuation of the last committed token replaces the head of the RA draft when one
  exists (an n-gram already seen in the committed text first, then the newest recycled
  rejected tail; a text n-gram longer than the blocks in flight runs the chain past them),
  otherwise the Jacobi iterate is kept; ``"jacobi_first"`` uses the pools
  only for positions the iterate has never seen; ``"off"`` disables both pools.
* The chain is capped at ``max_chain`` drafts (vLLM verifies at most 128 per request).

Losslessness does not depend on anything here: vLLM's verifier treats every draft as a point
mass (greedy: accept iff equal to the argmax; sampling: accept with probability p(d)), which
is exact for any draft source. This module only decides *which* tokens to draft.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

RECYCLE_RULES = ("pool_first", "jacobi_first", "off")


@dataclass(frozen=True)
class JacobiSettings:
    block_size: int  # n: positions per block
    max_blocks: int = 2  # K: blocks in flight (1 real-active + K-1 pseudo-active)
    pool_size: int = 4  # recycled continuations kept per key token
    spawn_ratio: float = 0.85  # r: spawn a pseudo-active block once a block has ceil(r*n)
    max_chain: int = 128  # drafts verified per step (vLLM's MAX_SPEC_LEN)
    recycle: str = "pool_first"  # candidate rule, one of RECYCLE_RULES
    max_pool_keys: int = 1024  # bound on distinct key tokens per request

    @property
    def spawn_threshold(self) -> int:
        """s = ceil(r * n) (Algorithm 1, line 2)."""
        return max(1, math.ceil(self.spawn_ratio * self.block_size))


def chain_capacity(block_size: int, max_blocks: int, limit: int = 128) -> int:
    """Longest chain the method can draft: K full blocks, within vLLM's verification limit."""
    return min(limit, block_size * max_blocks)


class RecyclingPool:
    """Bounded n-gram pool keyed by a token (Algorithm 1, lines 7 and 11).

    Each key keeps its ``pool_size`` most recent continuations (the tokens that followed it),
    newest first. Keys are evicted least-recently-used beyond ``max_keys`` so per-request
    memory stays bounded.
    """

    def __init__(self, pool_size: int, max_len: int, max_keys: int) -> None:
        self.pool_size = pool_size
        self.max_len = max_len
        self.max_keys = max_keys
        self._entries: OrderedDict[int, deque[tuple[int, ...]]] = OrderedDict()

    def __len__(self) -> int:
        return sum(len(v) for v in self._entries.values())

    def add_tail(self, tail: list[int]) -> None:
        """Recycle every suffix of a rejected tail: key tail[j] -> tail[j+1 : j+1+max_len]."""
        if self.pool_size <= 0:
            return
        for j in range(len(tail) - 1):
            self._add(tail[j], tuple(tail[j + 1 : j + 1 + self.max_len]))

    def _add(self, key: int, continuation: tuple[int, ...]) -> None:
        bucket = self._entries.get(key)
        if bucket is None:
            bucket = self._entries[key] = deque(maxlen=self.pool_size)
            if len(self._entries) > self.max_keys:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
            if continuation in bucket:
                bucket.remove(continuation)
        bucket.appendleft(continuation)

    def lookup(self, key: int) -> tuple[int, ...]:
        """Newest recycled continuation of ``key`` (empty if none)."""
        bucket = self._entries.get(key)
        return bucket[0] if bucket else ()


class TextIndex:
    """Where each 1- and 2-token key last occurred in the committed text (prompt included);
    ``lookup`` returns the tokens that followed it (prompt-lookup style, bounded memory)."""

    def __init__(self, max_len: int, window: int) -> None:
        self.max_len, self.window = max_len, window
        self.tokens: list[int] = []  # the most recent text, at least ``window`` tokens
        self.offset = 0  # absolute index of tokens[0]
        self._last1: dict[int, int] = {}  # token -> absolute index of its latest occurrence
        self._last2: dict[tuple[int, int], int] = {}  # (t-1, t) -> same, for 2-token keys

    def extend(self, new_tokens: list[int]) -> None:
        for t in new_tokens:
            n = self.offset + len(self.tokens)  # absolute index t will take
            if self.tokens:  # the previous token now has a successor: index it
                self._last1[self.tokens[-1]] = n - 1
                if len(self.tokens) > 1:
                    self._last2[(self.tokens[-2], self.tokens[-1])] = n - 1
            self.tokens.append(t)
        if len(self.tokens) > 2 * self.window:  # keep memory bounded
            drop = len(self.tokens) - self.window
            self.tokens, self.offset = self.tokens[drop:], self.offset + drop
            self._last1 = {k: i for k, i in self._last1.items() if i >= self.offset}
            self._last2 = {k: i for k, i in self._last2.items() if i >= self.offset}

    def lookup(self, prev: int | None, key: int) -> tuple[int, ...]:
        i = self._last2.get((prev, key)) if prev is not None else None
        if i is None:
            i = self._last1.get(key)
        if i is None:
            return ()
        j = i - self.offset + 1
        return tuple(self.tokens[j : j + self.max_len])


class JacobiState:
    """Per-request Jacobi iterate over K blocks plus its recycling pool.

    Invariant: ``canvas[i]`` is the current draft for absolute position ``base + i``;
    ``block_ends`` are the exclusive ends of the blocks in flight (real-active first) and
    ``block_ends[-1] == base + len(canvas)``. ``base`` equals the request's committed length.
    """

    def __init__(self, settings: JacobiSettings, context: list[int]) -> None:
        if not context:
            raise ValueError("Jacobi state needs at least one committed token")
        self.s = settings
        # Two pools, looked up in this order: continuations seen in the committed text and
        # recent prompt (verified n-grams; beyond the paper, so a fresh block is never
        # drafted from nothing), then the rejected tails (the paper's rejection recycling).
        self.text = TextIndex(settings.max_chain, window=max(256, 4 * settings.block_size))
        self.pool = RecyclingPool(settings.pool_size, settings.block_size, settings.max_pool_keys)
        if settings.recycle != "off":
            self.text.extend(context[-self.text.window :])
        self.base = len(context)
        self.last_token = context[-1]
        self.ra_start = self.base
        self.block_ends = [self.base + settings.block_size]
        self.stationary = [0]  # leading converged count per block (pseudo-accepted; RA unused)
        self.canvas = self._initial_draft(context, settings.block_size)
        self.spliced = 0  # leading drafts of the last chain that a pooled n-gram replaced

    # ----------------------------------------------------------------------------- propose
    def next_chain(self, limit: int | None = None) -> list[int]:
        """Drafts for the next verification: RA remainder then pseudo-active blocks."""
        cap = max(0, self.s.max_chain if limit is None else min(limit, self.s.max_chain))
        beyond: tuple[int, ...] = ()
        self.spliced = 0
        if self.s.recycle == "pool_first":
            beyond = self._splice_recycled()
        return (self.canvas[:cap] + list(beyond))[:cap]

    def _splice_recycled(self) -> tuple[int, ...]:
        """Put the pooled continuation of the last committed token over the head of the
        chain (it may run past the RA block into pseudo-active ones); returns the part of it
        that runs past the blocks in flight. The chain may carry that part too: under the
        speculation budget the chain's length is the budget's choice, and an n-gram found in
        the text is as good a guess there as inside a block (verification is exact for any
        draft; the iterate itself never holds those positions)."""
        prev = self.text.tokens[-2] if len(self.text.tokens) > 1 else None
        candidate = self._lookup(prev, self.last_token)
        n = min(len(candidate), len(self.canvas))
        self.canvas[:n] = candidate[:n]
        self.spliced = len(candidate)
        return candidate[n:]

    def _lookup(self, prev: int | None, key: int) -> tuple[int, ...]:
        return self.text.lookup(prev, key) or self.pool.lookup(key)

    # ----------------------------------------------------------------------------- advance
    def advance(self, drafts: list[int], greedy: list[int], committed: list[int]) -> None:
        """Fold one verification into the iterate.

        drafts:    [k]   drafts the verifier actually saw (may be a prefix of the chain)
        greedy:    [k+1] target argmax at each verified row; row i predicts position base+i
        committed: [m+1] accepted drafts + recovered/bonus token (m = accepted count)
        """
        k, m = len(drafts), len(committed) - 1
        if len(greedy) != k + 1 or not 0 <= m <= k:
            raise ValueError(f"inconsistent verification: k={k}, |g|={len(greedy)}, m={m}")
        old_base, new_base = self.base, self.base + m + 1
        if self.s.recycle != "off":
            self.pool.add_tail(drafts[m:])  # the rejected tail d_{m+1}..d_k (line 11)
            self.text.extend(committed)
        # pseudo-acceptance (line 7): a draft past the commit point that equals its argmax
        stationary_at = {
            p: drafts[p - old_base] == greedy[p - old_base] for p in range(new_base, old_base + k)
        }
        # spawn trigger (line 14) is judged before a completed RA block retires
        ra_reached = new_base - self.ra_start >= self.s.spawn_threshold
        self.canvas = self.canvas[m + 1 :]
        self.base, self.last_token = new_base, committed[-1]
        self._retire_blocks()
        self._count_stationary(stationary_at)
        self._maybe_spawn(ra_reached)
        # Jacobi update (line 11 "tail update"): each verified row at or past the new base
        # is the next iterate of the position it predicts; row k predicts base_old + k.
        for p in range(new_base, old_base + k + 1):
            if p - new_base < len(self.canvas):
                self.canvas[p - new_base] = greedy[p - old_base]

    def catch_up(self, tokens: list[int]) -> None:
        """Fold steps without drafts, one committed token each: exactly ``advance([], [t],
        [t])`` per token (with no drafts the argmax row refines nothing, so it is not read)."""
        for t in tokens:
            self.advance([], [t], [t])

    def _retire_blocks(self) -> None:
        """Drop completed blocks; the next one becomes real-active (line 15 'promote')."""
        while self.block_ends and self.block_ends[0] <= self.base:
            start = self.block_ends.pop(0)
            self.stationary.pop(0)
            self.ra_start = start
        if not self.block_ends:  # nothing in flight: open a fresh RA block at the base
            self.ra_start = self.base
            self.block_ends = [self.base + self.s.block_size]
            self.stationary = [0]
            self.canvas = self._fresh_tokens(self.last_token, self.s.block_size)
        # the committed run may have overshot ra_start into the promoted block
        self.ra_start = min(self.ra_start, self.base)

    def _count_stationary(self, stationary_at: dict[int, bool]) -> None:
        """Pseudo-accepted count a_b: leading drafts that equal their new argmax (line 7)."""
        start = self.block_ends[0]
        for b in range(1, len(self.block_ends)):
            count = 0
            for p in range(start, self.block_ends[b]):
                if not stationary_at.get(p, False):
                    break
                count += 1
            self.stationary[b] = count
            start = self.block_ends[b]

    def _maybe_spawn(self, ra_reached: bool) -> None:
        """Open a pseudo-active block when some block reached s converged tokens (line 14):
        the RA block's accepted count (even if it just completed) or a pseudo-accepted run."""
        if len(self.block_ends) >= self.s.max_blocks:
            return
        if not ra_reached and max(self.stationary[1:], default=0) < self.s.spawn_threshold:
            return
        end = self.block_ends[-1]
        prev = self.canvas[-1] if self.canvas else self.last_token
        self.canvas.extend(self._fresh_tokens(prev, self.s.block_size))
        self.block_ends.append(end + self.s.block_size)
        self.stationary.append(0)

    # ----------------------------------------------------------------------------- drafts
    def _fresh_tokens(self, prev: int, length: int) -> list[int]:
        """Draft for never-seen positions: chained recycled continuations, then the RA
        iterate cloned (the paper's "clone and pad q_RA"), then repeats of ``prev``."""
        out: list[int] = []
        if self.s.recycle != "off":
            before, key = None, prev
            while len(out) < length:
                cont = self._lookup(before, key)
                if not cont:
                    break
                out.extend(cont[: length - len(out)])
                before, key = (out[-2] if len(out) > 1 else key), out[-1]
        ra = self.canvas[: self.block_ends[0] - self.base] if self.canvas else []
        while len(out) < length and ra:
            out.extend(ra[: length - len(out)])
        return out + [prev] * (length - len(out))

    def _initial_draft(self, context: list[int], length: int) -> list[int]:
        """First iterate of a new request: the context that followed the most recent earlier
        occurrence of the last token (a cheap guess; the paper initialises randomly)."""
        last = context[-1]
        for j in range(len(context) - 2, -1, -1):
            if context[j] == last:
                guess = context[j + 1 : j + 1 + length]
                return guess + [last] * (length - len(guess))
        return [last] * length
