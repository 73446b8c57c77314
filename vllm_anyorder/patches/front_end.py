"""Front-end patches: plugin method names in ``speculative_config`` and infill request checks
(every process, applied by ``register()``)."""

from __future__ import annotations

import functools

from vllm_anyorder import _compat

def apply_method_names(on_speculative_config) -> None:
    """Let users name plugin methods in ``speculative_config``.

    Why: vLLM 0.32 validates ``method`` against a closed Literal and has no method registry;
    its extension hook is ``method="custom_class"`` + ``model="<class path>"``. Plugin
    options also need checking before any engine process starts.
    What: wraps ``EngineArgs.create_speculative_config`` (runs in the front-end process for
    ``LLM(...)`` and ``vllm serve`` before ``SpeculativeConfig`` is built) and first calls
    ``on_speculative_config(engine_args, target_model_config)`` (handed by ``register()``:
    ``engine_setup.on_speculative_config``). For a plugin method (by name, or by our class
    path under ``custom_class``) that validates the target and options, rewrites the dict to
    the custom_class hook and stores the resolved options in ``additional_config["anyorder"]``.
    Checked: vLLM 0.32.0 (``engine/arg_utils.py:2060``).
    Remove: when vLLM grows a speculative-method registry, register the names there and
    move validation into the proposers' config hook. It also gives a LLaDA / Dream target
    without a speculative config the ``stepwise`` method (their only decoding path in vLLM).
    """
    cls = _compat.engine_args_cls()
    original = cls.create_speculative_config

    @functools.wraps(original)
    def create_speculative_config(self, target_model_config, target_parallel_config):
        on_speculative_config(self, target_model_config)  # may rewrite self's two fields
        return original(self, target_model_config, target_parallel_config)

    cls.create_speculative_config = create_speculative_config


_INFILL_ERRORS: dict[type, type] = {}


def _validation_error(exc: Exception) -> Exception:
    """``exc`` re-raised as a subclass of both its type and vLLM's ``VLLMValidationError``
    (HTTP 400 from the server, ValueError in ``LLM.generate``)."""
    kind = type(exc)
    if kind not in _INFILL_ERRORS:
        _INFILL_ERRORS[kind] = type("InfillRequestError",
                                    (_compat.validation_error_cls(), kind), {})
    return _INFILL_ERRORS[kind](str(exc), parameter="extra_args")


def apply_infill_requests(screen, complete) -> None:
    """Check infill requests before they reach the engine (never a crash mid-request).

    Why: an infill request (``extra_args["anyorder_infill"]``: the masked positions in
    generation order) is only meaningful for an AS-ARM and only when its positions, the
    prompt length and ``max_tokens`` agree; a bad one must be refused up front (ValueError in
    ``LLM.generate``, HTTP 400 from the server), and workers then trust the table.
    What: wraps ``InputProcessor.process_inputs`` (front-end process; ``LLM`` and the
    server's ``AsyncLLM``; ``process_inputs_async`` binds the wrapped method at construction):
    ``screen(params, model_config)`` (``infill.screen_request``, handed by ``register()``)
    checks that the model is an AS-ARM and the sampling settings of a request with the key,
    the original runs, then ``complete(...)`` (``infill.complete_request``) sets
    ``max_tokens`` to the number of masks when the caller left it unset and checks positions
    against the tokenized prompt and ``max_model_len``. Errors are ``InfillRequestError``, a
    subclass of both ``InfillError`` (a ValueError) and ``VLLMValidationError``. Other
    requests pass through untouched.
    Checked: vLLM 0.32.0 (``v1/engine/input_processor.py:373``, max_tokens default at
    ``:444``; callers ``v1/engine/llm_engine.py:271``, ``v1/engine/async_llm.py:474,491``).
    Remove: when vLLM lets a model validate request ``extra_args`` (or with infill serving).
    """
    cls = _compat.input_processor_cls()
    original = cls.process_inputs

    @functools.wraps(original)
    def process_inputs(self, request_id, prompt, params, *args, **kwargs):
        # screen(params, model_config) -> the request's infill state, None for other requests
        # complete(request, params, state, model_config): fixes max_tokens, checks positions
        try:
            state = screen(params, self.model_config)
        except ValueError as exc:
            raise _validation_error(exc) from None
        request = original(self, request_id, prompt, params, *args, **kwargs)
        if state is not None:
            try:
                complete(request, params, state, self.model_config)
            except ValueError as exc:
                raise _validation_error(exc) from None
        return request

    cls.process_inputs = process_inputs
