"""Acceptance kept apart for young requests (``budget_accept.Acceptance``, issue 22): a
request's drafts are accepted less in its first steps (``assd``'s n-gram drafts know only the
prompt's bigrams), and pooled with the rest those first steps priced every request of a new
batch out of drafting for dozens of plain steps, which measure nothing."""

import random
from collections import Counter

from vllm_anyorder.core.budget import BudgetController
from vllm_anyorder.core.budget_accept import SETTLED, YOUNG, Acceptance
from vllm_anyorder.core.budget_settings import BudgetSettings


def aged(young_steps: int) -> tuple[Acceptance, Counter]:
    """An Acceptance and the step counts it reads ages from (the controller's BatchWatch)."""
    ages: Counter = Counter()
    return Acceptance(4, young_steps=young_steps, age_of=ages.__getitem__), ages


def test_young_requests_are_priced_by_young_drafts_and_the_rest_by_theirs():
    acc, ages = aged(young_steps=2)
    for b in range(30):
        old, new = f"old{b}", f"new{b}"
        ages.update([old])
        ages.update([old])
        ages.update([old, new])  # old: 3 steps (settled), new: 1 (young)
        acc.observe(old, 1, 1)
        acc.observe(new, 1, 0)
    assert acc.engine_rates(SETTLED)[0] > 0.9 and acc.engine_rates(YOUNG)[0] < 0.1
    ages.update(["fresh"])
    assert acc.age_class("fresh") == YOUNG and acc.gains("fresh", 1)[0] < 0.1
    ages.update(["fresh"])
    ages.update(["fresh"])
    assert acc.age_class("fresh") == SETTLED and acc.gains("fresh", 1)[0] > 0.9
    acc.forget(set())
    assert acc.requests == {}


def test_where_young_drafts_were_never_tried_young_requests_are_priced_as_the_rest():
    acc, ages = aged(young_steps=8)
    for i in range(20):
        req = f"r{i}"
        for _ in range(9):
            ages.update([req])
        acc.observe(req, 4, 3)
    assert acc.engine_rates(YOUNG) == acc.engine_rates(SETTLED)
    for _ in range(9):
        ages.update(["late"])
    acc.observe("late", 4, 0)  # a settled rejection moves the young rates it leans on too
    assert acc.engine_rates(YOUNG) == acc.engine_rates(SETTLED)


def cost(rows, drafting):  # a small model on a CPU: most of a step is fixed
    return 0.0055 + 0.00023 * rows + (0.0008 if drafting else 0.0)


def ramp(age: int) -> float:
    """Acceptance by a request's age in steps, as ``assd``'s n-gram drafts showed in the
    engine: poor while the output is new, rising as it starts to repeat."""
    return 0.15 if age <= 4 else min(0.8, 0.15 + 0.65 * (age - 4) / 16)


def run(young_steps: int, batches=6, batch=16, tokens=128, seed=0):
    """Closed batches whose drafts are accepted by ``ramp``; (simulated seconds, plain steps
    of the batches after the first)."""
    rng = random.Random(seed)
    ctl = BudgetController(BudgetSettings(max_drafts=4))
    ctl.accept.young_steps = young_steps
    total, plain_later = 0.0, 0
    for b in range(batches):
        left = {f"b{b}r{i}": tokens for i in range(batch)}
        age = dict.fromkeys(left, 0)
        while left:
            ids = list(left)
            limits = [max(0, min(4, left[r] - 1)) for r in ids]
            caps = ctl.allot(ids, limits, lambda: [left[r] for r in ids])
            rows = len(ids) + sum(caps)
            seconds = cost(rows, any(caps))
            total += seconds
            plain_later += b > 0 and not any(caps)
            committed = 0
            for r, k in zip(ids, caps):
                age[r] += 1
                n = 0
                while n < k and rng.random() < ramp(age[r]):
                    n += 1
                if k:
                    ctl.record_verified(r, k, n)
                committed += n + 1
                left[r] -= n + 1
            ctl.record_step(rows, any(caps), seconds, len(ids), committed)
            left = {r: v for r, v in left.items() if v > 0}
    return total, plain_later


def test_a_new_batch_drafts_again_once_its_requests_settle():
    """Pooled (``young_steps=0``: every request settled), each batch's first steps dragged
    the rate every request is priced by down, and the batch ran plain for most of its steps
    (no drafts, no evidence that acceptance had risen); kept apart, drafting resumes as the
    requests settle."""
    seeds = (0, 1, 2)  # summed: one seed's ratio moves by +-0.02 with any change of rule
    apart, plain_apart = (sum(x) for x in zip(*(run(young_steps=8, seed=s) for s in seeds)))
    pooled, plain_pooled = (sum(x) for x in zip(*(run(young_steps=0, seed=s) for s in seeds)))
    assert plain_apart < 0.5 * plain_pooled
    assert apart < 0.95 * pooled
