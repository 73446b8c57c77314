"""The speculation budget's reality check: what the controller's choices really committed.

Where the drafting steps the controller chose at a batch size really committed fewer tokens
per second than plain steps did (:class:`Realized`), it stops drafting there, whatever the
cost and acceptance models predict, and tries its prediction again once that figure is
``stale_after`` steps old, judged on the retry's own steps (not spaced out with the probes:
while drafting is stopped, probes keep leaving the choice at plain, back off, and would
postpone the retry for good; what retries lose, the books bound: ``core/budget_guard``).

The mirror, for a lone request (:meth:`RealityCheck.paying`): where the drafting steps chosen
at batch 1 lately committed more tokens per second than plain steps by the decision margin,
a prediction to stop drafting is overruled and the last drafting count kept. Why (issue 22,
``specdiff`` at batch 1 on Zen 4, traced): the drafting steps accepted 1.9-2.0 drafts of four,
and on them the predictions matched; once a few rejections had tipped one choice to plain,
the request's own counts faded to engine-wide rates that no chain had judged since (a
looping prompt had left position 3 at 0.27 against 0.63), plain steps judged nothing, and
engines ran 77-98% plain at 0.82-0.93 of four drafts fixed. A plain step measures nothing
of the drafts; a drafting step measures what drafting gives, so the figure the drafting steps
left stands until they say otherwise (the check above) or it is ``stale_after`` steps old.
"""

from __future__ import annotations


class Realized:
    """Committed tokens per second the engine really got, per batch size and arm (drafting
    or plain), exponentially forgotten: the check on the models' prediction. A model that
    over-predicts drafting is overruled by what its choices actually gave (``RealityCheck``).
    It is fed the drafting steps the controller chose (not its probes: a probe's one-off
    chain shows what a chain gives when it was never drafted for before) and every plain
    step."""

    def __init__(self, decay: float = 0.05, min_drafting: float = 6.0,
                 min_plain: float = 2.0) -> None:
        self.decay = decay
        # steps before a figure counts: about 7 drafting steps (a chain drafted afresh
        # needs a few to settle), 2 plain ones (a plain step is what it is; they are rare)
        self.min_weight = {True: min_drafting, False: min_plain}
        # (batch, drafting) -> [tokens, seconds, weight, step of the last observation]
        self.table: dict[tuple[int, bool], list[float]] = {}

    def observe(self, batch: int, drafting: bool, tokens: int, seconds: float,
                step: int, restart_after: int | None = None) -> None:
        """One step; a figure last observed more than ``restart_after`` steps ago starts
        afresh (the retry :meth:`rate` allows then is judged on its own steps, not drowned
        in the stale figure that stopped drafting)."""
        t = self.table.get((batch, bool(drafting)))
        if t is None or (restart_after is not None and step - t[3] > restart_after):
            t = self.table[(batch, bool(drafting))] = [0.0, 0.0, 0.0, 0.0]
        keep = 1.0 - self.decay
        t[0], t[1], t[2] = t[0] * keep + tokens, t[1] * keep + seconds, t[2] * keep + 1.0
        t[3] = step

    def rate(self, batch: int, drafting: bool, now: int, max_age: int) -> float | None:
        """Tokens per second of this arm at this batch size; None until enough steps, or
        when the last one is more than ``max_age`` steps old (then the prediction is tried
        again for real)."""
        t = self.table.get((batch, bool(drafting)))
        if t is None or t[2] < self.min_weight[bool(drafting)] or t[1] <= 0 or \
                now - t[3] > max_age:
            return None
        return t[0] / t[1]


class RealityCheck:
    """Whether drafting at a batch size lost in reality (:meth:`lost`); fed every measured
    step (:meth:`observe`).

    Not for drafts cold after plain steps (``cold_after_plain``: Jacobi iterates, refined
    only where verified; then ``realized`` is None and nothing is kept): a retry there drafts
    cold chains for its first steps, so its figure says how warm the chains were, not what
    drafting them gives. At batch 1 the check held ``jacobi`` plain ~100 steps at a time,
    judged each retry's cold chains and held it again (20-24% of steps plain, 0.79-0.95 of
    ``cycle:16`` on a 2-core Xeon, issue 22); what an optimistic model can lose there, the
    books bound (traced at T=0.8 under load: 0.1-2% of the time, against 0-0.7% with it)."""

    def __init__(self, stale_after: int, cold_after_plain: bool = False,
                 margin: float = 0.0) -> None:
        self.stale_after = stale_after
        self.margin = margin  # the decision margin: both verdicts need reality to beat it
        self.realized = None if cold_after_plain else Realized()
        self.run = 0  # measured drafting steps in a row the controller chose (no probes)
        self.lone_rows = 0  # the last drafting count chosen for a lone request (paying)

    def observe(self, batch: int, drafting: bool, probe: bool, tokens: int, seconds: float,
                now: int) -> None:
        """One measured step (``probe``: the controller probed in it). Fed: plain steps, and
        drafting steps the controller chose after one it also chose (the first after plain
        or a probe drafts a cold chain)."""
        self.run = self.run + 1 if drafting and not probe else 0
        if self.realized is not None and batch and tokens and (not drafting or self.run > 1):
            self.realized.observe(batch, drafting, tokens, seconds, now,
                                  self.stale_after if drafting else None)

    def lost(self, batch: int, now: int) -> bool:
        """The drafting steps chosen at this batch size lately really committed fewer tokens
        per second than plain steps, by more than the margin (a drafting figure older than
        ``stale_after`` steps does not count: the prediction is then tried again, a few steps
        every ``stale_after``; the plain one counts at any age, as plain steps are rare while
        drafting pays). Within the margin the models decide: two traced ``specdiff`` engines
        at batch 1 (Zen 4) stopped drafting ten times on ties (154 against 157 tokens / s,
        132 against 133), each for ~100 steps, where drafting gave 1.2x plain on average."""
        drafting, plain = self._rates(batch, now)
        return drafting is not None and plain is not None and \
            drafting < plain * (1 - self.margin)

    def _rates(self, batch: int, now: int) -> tuple[float | None, float | None]:
        """(drafting, plain) realised tokens per second at this batch size: the drafting
        figure within ``stale_after`` steps, the plain one at any age; None where unknown."""
        if self.realized is None:
            return None, None
        return (self.realized.rate(batch, True, now, self.stale_after),
                self.realized.rate(batch, False, now, now))

    def chose(self, batch: int, rows: int) -> None:
        """A decision (not a probe) to draft ``rows`` at this batch size."""
        if batch == 1 and rows:
            self.lone_rows = rows

    def paying(self, batch: int, now: int) -> int:
        """Draft rows reality asks a lone request to keep: the last drafting count chosen
        at batch 1 where the drafting steps chosen there lately (within ``stale_after``
        steps) committed more than ``1 + margin`` times plain steps' tokens per second;
        0 elsewhere."""
        if batch != 1 or not self.lone_rows:
            return 0
        drafting, plain = self._rates(batch, now)
        if drafting is None or plain is None or drafting <= plain * (1 + self.margin):
            return 0
        return self.lone_rows
