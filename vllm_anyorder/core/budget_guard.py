"""The loss guard: drafting may cost at most a small share of the time plain decoding takes.

The controller's models predict; the guard keeps the books. Every drafting step the engine
ran is charged what it cost beyond the time plain decoding would have needed for the tokens
it committed:

    lost += seconds - tokens * plain_seconds(batch) / batch

(negative where the step paid; ``plain_seconds``: the running mean of plain steps at that
batch size, ``StepCost.typical``, so a step is charged against time as it really passes, not
against the low figure the decisions use), and every measured step adds its seconds to
``elapsed``. The plain steps right after a drafting one are charged the same way
(``budget_measure.AFTER_DRAFTING``): they run slower than plain steps further on, and that is
drafting's cost too (at T=0.8, concurrency 8, ``jacobi`` passes that drafted 11-22% of their
steps ran their plain steps 9-13% slower than drafts off's beside them; charged only for its
own steps, drafting stayed within the books while it ran 15-25% dearer a token, issue 22).
Drafting (a choice or a probe) is allowed only while ``lost <= share * elapsed``. So whatever
the models got wrong -- a first drafter forward at a batch size never seen (``specdiff`` at
batch 8: a drafter forward over the whole context window costs more than the target's decode
step), a young cost bucket priced optimistically, probes where drafts never pay, acceptance
at T > 0 far below the prior -- the net time lost to drafting stays within ``share`` of the
run, up to one step's overshoot. The overshoot is bounded too: a step drafts no more rows
than it could lose within what is left of the allowance if it accepted nothing
(:meth:`LossGuard.allowance`, priced by the cost model: at T = 0.8 under load, one step of
139 rows at a batch size whose book had just opened took 56 ms against 12 ms plain steps and
accepted nothing). Where drafting pays, ``lost`` goes negative and the guard
never binds. This is the conservative-exploration rule of the bandit literature (Wu et al.,
"Conservative Bandits", ICML 2016: explore only while the cumulative reward stays above a
fixed fraction of the baseline's), with plain decoding as the baseline arm.

The books are kept per batch size (where drafting pays differs with the load, and so does
what a wrong prediction costs), both sums exponentially forgotten over ``horizon`` steps of
that batch size: the guarantee holds over the recent past, and what drafting gained at batch
1 cannot be spent on a losing stretch at batch 8. Credit within a book is capped at
``credit * elapsed``: drafting that pays on average in bursts (Jacobi at batch 1: a cold chain
accepts nothing for a few steps, then a converged one a dozen tokens at once) is not stopped
by its cold steps, while a stretch where it stopped paying loses at most that share of a
horizon before the guard binds. A new book opens as if ``horizon`` plain steps had passed,
so an allowance is there from its first drafting step (at the default share about two and a
half plain steps' worth of loss: where a drafting step costs about a plain one, dozens of
steps to learn whether drafting pays; where it costs several plain steps, one or two); it
refills at ``share`` of each step. A new book opens with the standing of the book of the
nearest batch size (its loss share): under load the batch size moves by one as requests come
and go, and a fresh allowance at each would let every new batch size spend one whole
allowance on what its neighbour has just learnt does not pay. Credit carries over as debt
does, from a batch size one away only and within the same ``credit`` cap (what drafting gained
at batch 1 is still not spent at batch 8): a fresh engine's book at batch 1 opened at zero beside
its warm-up's book at batch 2 in credit (drafting had gained 24% of its time there), spent its
two and a half plain steps' allowance on its first request's cold chains, and that request
ran 103 of its 128 steps held plain (84 steps against 44 for a fixed chain of 8), so the
engine's first round ran at 0.75-0.84 of the best fixed chain (``jacobi``, batch 1, issue 22).

No baseline, no drafting: a book opens once there is a plain cost to charge against
(:meth:`LossGuard.open`; the controller opens it at its decision), and a batch size without a
book may not draft (a caller that never reports a step keeps no books, and the guard does not
bind). The baseline is measured, never predicted: the running mean of plain steps at that
batch size once ``YOUNG_SAMPLES`` were measured, before that the one of the nearest smaller
batch size measured (``StepCost.baseline``: a lower bound, so a drafting step is charged at
least what it lost). A plain cost predicted from other batch sizes can be far off (10.5 ms
predicted for a 6.6 ms step at batch 8), and against it losing steps were booked as gains.
"""

from __future__ import annotations

import math


class LossGuard:
    def __init__(self, share: float = 0.01, horizon: int = 256, credit: float = 0.25) -> None:
        self.share = share
        self.credit = credit  # the most a book's gains can bank, as a share of its time
        self.horizon = max(1, horizon)
        self.keep = 1.0 - 1.0 / self.horizon
        # batch size -> [elapsed, lost]: seconds of its measured steps, and what its
        # drafting steps lost (both forgotten over ``horizon`` of its steps)
        self.books: dict[int, list[float]] = {}
        self.keeping = False  # a step was reported: the books are kept

    def observe(self, drafting: bool, seconds: float, tokens: int, batch: int,
                plain_seconds: float | None) -> None:
        """One measured step: ``tokens`` committed over ``batch`` requests in ``seconds``;
        ``plain_seconds``: a plain step at this batch size (None: not known, not charged)."""
        self.keeping = True
        book = self.books.get(batch) or self.open(batch, plain_seconds)
        if book is None:
            return
        book[0] = book[0] * self.keep + seconds
        book[1] *= self.keep
        if drafting and plain_seconds and batch > 0:
            book[1] += seconds - tokens * plain_seconds / batch
        # credit is capped: steps that paid cannot pay for an unbounded losing stretch later
        book[1] = max(book[1], -self.credit * book[0])

    def open(self, batch: int, plain_seconds: float | None) -> list[float] | None:
        """This batch size's book, opened (once there is a baseline) as if a horizon of plain
        steps had passed, with the nearest book's loss share (a credit only from a batch size
        one away, and no more than ``credit``, the most a book banks); None: no baseline
        yet."""
        book = self.books.get(batch)
        if book is None and plain_seconds:
            elapsed = self.horizon * plain_seconds
            near, share = self._near_share(batch)
            if share < 0 and abs(near - batch) > 1:  # credit from a batch size one away only
                share = 0.0
            book = self.books[batch] = [elapsed, max(-self.credit, share) * elapsed]
        return book

    def _near_share(self, batch: int) -> tuple[int, float]:
        """The book nearest this batch size (the larger on a tie) and its loss share; (batch,
        0) when there is none."""
        if not self.books:
            return batch, 0.0
        near = min(self.books, key=lambda b: (abs(b - batch), -b))
        return near, self.lost_share(near)

    def allowance(self, batch: int) -> float:
        """Seconds the next drafting step at this batch size may lose while the books hold
        (< 0: none; inf where no books are kept; -inf before this batch size's book opens).
        The controller drafts no more rows than a step that accepts nothing could lose
        within it, so the books hold step by step up to the cost model's error."""
        book = self.books.get(batch)
        if book is None:
            return -math.inf if self.keeping else math.inf
        return self.share * book[0] - book[1]

    def allows(self, batch: int) -> bool:
        """Whether the next step, at this batch size, may draft (not before its book opens)."""
        return self.allowance(batch) >= 0

    def lost_share(self, batch: int) -> float:
        """Net time lost to drafting over the recent past at this batch size, as a share
        of it (< 0: it paid; 0 before any step)."""
        elapsed, lost = self.books.get(batch, (0.0, 0.0))
        return lost / elapsed if elapsed > 0 else 0.0

    def state(self) -> list:
        return sorted([b, round(e, 9), round(x, 9)] for b, (e, x) in self.books.items())
