"""The loss guard: drafting may cost at most a small share of the time plain decoding takes.

The controller's models predict; the guard keeps the books. Every drafting step the engine
ran is charged what it cost beyond the time plain decoding would have needed for the tokens
it committed:

    lost += seconds - tokens * plain_seconds(batch) / batch

(negative where the step paid), and every measured step adds its seconds to ``elapsed``.
Drafting (a choice or a probe) is allowed only while ``lost <= share * elapsed``. So whatever
the models got wrong -- a first drafter forward at a batch size never seen (``specdiff`` at
batch 8: a drafter forward over the whole context window costs more than the target's decode
step), a young cost bucket priced optimistically, probes where drafts never pay, acceptance
at T > 0 far below the prior -- the net time lost to drafting stays within ``share`` of the
run, up to one step's overshoot. Where drafting pays, ``lost`` goes negative and the guard
never binds. This is the conservative-exploration rule of the bandit literature (Wu et al.,
"Conservative Bandits", ICML 2016: explore only while the cumulative reward stays above a
fixed fraction of the baseline's), with plain decoding as the baseline arm.

Both sums are exponentially forgotten (``horizon`` measured steps) and credit is capped at
``share * elapsed``, so the guarantee holds over the recent past: what drafting gained while
it paid (batch 1) cannot be spent on a long losing stretch later (the same server under
load). ``plain_seconds`` is the controller's own
prediction of a plain step at that batch size (a low quantile of measured plain steps: noise
only makes drafting look worse, the safe side). Engine-free; every input is shared over TP
ranks, so every rank keeps the same books.
"""

from __future__ import annotations


class LossGuard:
    def __init__(self, share: float = 0.02, horizon: int = 256) -> None:
        self.share = share
        self.keep = 1.0 - 1.0 / max(1, horizon)
        self.elapsed = 0.0  # seconds of the measured steps (forgotten over ``horizon``)
        self.lost = 0.0  # drafting steps' seconds beyond plain decoding's for their tokens

    def observe(self, drafting: bool, seconds: float, tokens: int, batch: int,
                plain_seconds: float | None) -> None:
        """One measured step: ``tokens`` committed over ``batch`` requests in ``seconds``;
        ``plain_seconds``: a plain step at this batch size (None: not known, not charged)."""
        self.elapsed = self.elapsed * self.keep + seconds
        self.lost *= self.keep
        if drafting and plain_seconds and batch > 0:
            self.lost += seconds - tokens * plain_seconds / batch
        # credit is capped at the allowance: steps that paid cannot pay for a long losing
        # stretch later (at most about twice the allowance is lost before the guard binds)
        self.lost = max(self.lost, -self.share * self.elapsed)

    def allows(self) -> bool:
        """Whether the next step may draft."""
        return self.lost <= self.share * self.elapsed

    def lost_share(self) -> float:
        """Net time lost to drafting over the recent past, as a share of it (< 0: it paid)."""
        return self.lost / self.elapsed if self.elapsed > 0 else 0.0

    def state(self) -> list[float]:
        return [round(self.elapsed, 9), round(self.lost, 9)]
