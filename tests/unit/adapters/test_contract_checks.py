"""The runner hooks' per-step protocol checks (``contract.implements``): the answer of
``isinstance``, from a cache where the class decides it."""

from types import SimpleNamespace as NS

from vllm_anyorder.contract import DraftProbsSource, VerificationObserver, implements


class _Observer:
    def observe_verification(self, view, logits, spec_decode_metadata):
        pass


class _Both(_Observer):
    def take_draft_probs(self):
        return None


def test_implements_answers_as_isinstance_does_and_caches_by_type():
    objects = (None, object(), _Observer(), _Both(), NS(), NS(take_draft_probs=lambda: None),
               NS(observe_verification=lambda v, l, s: None))
    for _ in range(2):  # the second time from the cache
        for obj in objects:
            for protocol in (VerificationObserver, DraftProbsSource):
                assert implements(obj, protocol) == isinstance(obj, protocol), (obj, protocol)
    assert implements(_Both(), DraftProbsSource) and not implements(_Observer(), DraftProbsSource)
