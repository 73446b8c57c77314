"""The ``drafts_with_output`` patch (``patches/engine_core.py``) on fake vLLM classes: the
drafts ride on the step's output instead of a second RPC, and a step whose chains are all
empty (a plain step) skips vLLM's per-request ``update_draft_token_ids`` loop."""

from types import SimpleNamespace

from vllm_anyorder import _compat
from vllm_anyorder.patches import engine_core


class FakeOutput:
    pass


class FakeRunner:
    def __init__(self, drafts):
        self.execute_model_state = object()  # a full step
        self.drafter = SimpleNamespace(observe_verification=lambda *a: None)
        self._drafts = drafts

    def sample_tokens(self, grammar_output):
        return FakeOutput()

    def take_draft_token_ids(self):
        return self._drafts


class FakeScheduler:
    def __init__(self):
        self.updates = []

    def update_from_output(self, scheduler_output, model_runner_output):
        return "outputs"

    def update_draft_token_ids(self, drafts):
        self.updates.append(drafts)


class FakeCore:
    check_for_draft_tokens = True
    async_scheduling = False

    def __init__(self):
        self.scheduler = FakeScheduler()
        self.rpcs = 0

    def post_step(self, model_executed):
        self.rpcs += 1  # vLLM's path: ask the worker for its drafts


def _patched(monkeypatch):
    for name, cls in (("gpu_model_runner_cls", FakeRunner), ("scheduler_cls", FakeScheduler),
                      ("engine_core_cls", FakeCore), ("model_runner_output_cls", FakeOutput)):
        monkeypatch.setattr(_compat, name, lambda cls=cls: cls)
    for cls, attr in ((FakeRunner, "sample_tokens"), (FakeScheduler, "update_from_output"),
                      (FakeCore, "post_step")):
        monkeypatch.setattr(cls, attr, getattr(cls, attr))  # undone after the test
    engine_core.apply_drafts_with_output()


def _step(drafts):
    core, runner = FakeCore(), FakeRunner(drafts)
    output = runner.sample_tokens(None)
    core.scheduler.update_from_output(None, output)
    core.post_step(model_executed=True)
    return core


def test_drafts_ride_on_the_output_and_plain_steps_skip_the_update(monkeypatch):
    _patched(monkeypatch)
    drafted = SimpleNamespace(req_ids=["a", "b"], draft_token_ids=[[5, 6], []])
    core = _step(drafted)
    assert core.rpcs == 0 and core.scheduler.updates == [drafted]
    plain = SimpleNamespace(req_ids=["a", "b"], draft_token_ids=[[], []])
    core = _step(plain)
    assert core.rpcs == 0 and core.scheduler.updates == []  # nothing to write
    core = _step(None)  # the drafter had nothing: neither RPC nor update
    assert core.rpcs == 0 and core.scheduler.updates == []


def test_an_output_without_drafts_takes_vllms_rpc(monkeypatch):
    _patched(monkeypatch)
    core = FakeCore()
    core.scheduler.update_from_output(None, FakeOutput())  # not from an anyorder drafter
    core.post_step(model_executed=True)
    assert core.rpcs == 1 and core.scheduler.updates == []
