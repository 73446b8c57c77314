"""What the speculation budget (``core/budget.py``) tells the outside: the periodic log line
in words, and the fingerprint of everything its decisions depend on (TP ranks must agree;
``diagnostics`` compares it)."""

from __future__ import annotations


def describe(c) -> str:
    """One line, in words, of what controller ``c`` chose last and why."""
    d, t = c.last, c.totals
    acc = t["accepted"] / t["drafted"] if t["drafted"] else 0.0
    gain = d.goodput / d.plain_goodput if d.plain_goodput else 0.0
    why = ("measuring" if not d.plain_goodput else
           f"predicted {gain:.2f}x the tokens/s of no drafts"
           + (", closed batch: valued by its time to finish" if d.closed else ""))
    return (f"budget {c.kind}: {d.rows} draft rows for {d.batch} requests "
            f"({why}); {t['steps_without_drafts']}/{t['steps']} steps without drafts, "
            f"{acc:.0%} of {t['drafted']} drafts accepted, "
            f"cost {c.cost.slope() * 1e3:.3f} ms per extra row, "
            f"a probe every {c.explore.schedule.gap(d.batch)} steps, "
            f"net {c.guard.lost_share(d.batch):+.1%} of the time lost to drafting "
            f"at this batch size "
            f"({t['guarded']} choices to draft held back)")


def fingerprint(c) -> dict:
    """Controller ``c``'s decision state, rounded so that ranks measuring alike agree."""
    return {"decisions": c.decisions, "measured": c.measured, "chosen": c.chosen,
            "probes": c.explore.state(), "guard": c.guard.state(),
            "trust": sorted(c.trust.widest.items()), "closed": c.closed.state(),
            "kept": c.kept.state(), "switch": c.switch.state(),
            "after_drafting": c.after_drafting,
            "prices": c.prices.state(),
            "realized": sorted([list(k), [round(x, 9) for x in v]]
                               for k, v in c.reality.realized.table.items())
            if c.reality.realized is not None else None,
            "lone_rows": c.reality.lone_rows,
            "cost": {str(k): sorted((b, round(m.rows, 6), round(m.seconds, 9))
                                    for b, m in v.items())
                     for k, v in c.cost.tables.items()},
            "accept": [[[round(h, 9), round(n, 9)] for h, n in table]
                       for table in c.accept.engine],
            "after": sorted(c.accept.after.items()),
            "calibration": c.calibration.state(),
            "shapes": sorted(c._shapes)}
