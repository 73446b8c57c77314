"""Front-end patches: plugin method names in ``speculative_config`` and ``--spec-method``, the
V1 model runner for the plugin's configurations, and infill request checks (every process,
applied by ``register()``)."""

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
    vLLM's shorthand flags (``--spec-method / --spec-model / --spec-tokens``,
    ``EngineArgs.spec_method`` ...) are merged into the dict first, by vLLM's own rule
    (``engine_setup.merge_shorthand``), because the original merges them only after this
    hook, too late for a plugin method name.
    Checked: vLLM 0.32.0 (``engine/arg_utils.py:2060``, shorthand merge ``:2068-2081``) and
    0.33.0 (``engine/arg_utils.py:2100``, merge ``:2108-2121``: the same).
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


def apply_spec_method_choices(method_names) -> None:
    """Let ``--spec-method`` name plugin methods on the command line.

    Why: vLLM builds ``--spec-method`` with ``choices`` from its closed ``SpeculativeMethod``
    Literal, so argparse refuses ``--spec-method jacobi`` before any config hook runs.
    vLLM loads general plugins before it builds the parser (``AsyncEngineArgs.add_cli_args``:
    "the plugin may add a new kind of ... method to --quantization argument"), the moment to
    extend the choices.
    What: wraps the static ``EngineArgs.add_cli_args``; after it ran, the ``--spec-method``
    action's choices get ``method_names`` (the plugin's method table, handed by
    ``register()``). Nothing else of the parser changes; ``method_names`` then resolves the
    merged dict.
    Checked: vLLM 0.32.0 (``engine/arg_utils.py:934``, ``--spec-method`` at ``:1831``,
    plugins loaded at ``:3202``) and 0.33.0 (``:959``, ``:1869``, ``:3256``).
    Remove: when vLLM's ``--spec-method`` accepts registered or free-form method names.
    """
    cls = _compat.engine_args_cls()
    original = cls.add_cli_args

    @functools.wraps(original)
    def add_cli_args(parser, *args, **kwargs):
        parser = original(parser, *args, **kwargs)
        for action in parser._actions:
            if "--spec-method" in action.option_strings and action.choices is not None:
                action.choices = [*action.choices,
                                  *(m for m in method_names if m not in action.choices)]
        return parser

    cls.add_cli_args = staticmethod(add_cli_args)


def apply_v1_model_runner(needs_v1, forced_v2_message) -> None:
    """Run the plugin's models and methods on vLLM's V1 model runner, also on GPUs.

    Why: vLLM 0.32 / 0.33 default to the V2 model runner (``v1/worker/gpu/``) wherever
    Triton exists (GPU installs) unless a feature V2 lacks is configured; ``custom_class``
    is one, so plugin methods get V1, but an AS-ARM or LLaDA / Dream checkpoint served
    without a speculative config would get V2 and skip every runner patch and attention
    builder of the plugin. ``VLLM_USE_V2_MODEL_RUNNER=1`` (or HiSparse / watermarking)
    forces V2 even for ``custom_class``.
    What: wraps ``VllmConfig._get_v2_model_runner_unsupported_features``: when
    ``needs_v1(vllm_config)`` (``runner_choice.needs_v1``, handed by ``register()``) names
    something, it joins vLLM's list, so vLLM itself chooses V1 and logs "Model Runner V2 does
    not yet support ...". Wraps the ``VllmConfig.use_v2_model_runner`` property: V2 chosen
    for such a configuration anyway (forced) raises ValueError with
    ``forced_v2_message(reason, vllm_config)`` (``runner_choice.forced_v2_message``), at the
    first evaluation in ``VllmConfig.__post_init__`` (front-end, start-up). Applied in every
    process (``register()``), so workers decide as the front-end did. Other configurations
    are untouched.
    Checked: vLLM 0.32.0 (``config/vllm.py:703`` property, ``:2914`` list, evaluated in
    ``__post_init__`` at ``:2016``; workers read it at ``v1/worker/gpu_worker.py:237``) and
    0.33.0 (``config/vllm.py:731``, ``:3053``).
    Remove: when the plugin's runner hooks exist for the V2 runner (or V1 is the only one).
    """
    cls = _compat.vllm_config_cls()
    original_list = cls._get_v2_model_runner_unsupported_features
    original_property = cls.use_v2_model_runner

    @functools.wraps(original_list)
    def _get_v2_model_runner_unsupported_features(self):
        unsupported = original_list(self)
        reason = needs_v1(self)
        return unsupported + [reason] if reason else unsupported

    def use_v2_model_runner(self):
        use_v2 = original_property.fget(self)
        reason = needs_v1(self) if use_v2 else None
        if reason:
            raise ValueError(forced_v2_message(reason, self))
        return use_v2

    cls._get_v2_model_runner_unsupported_features = _get_v2_model_runner_unsupported_features
    cls.use_v2_model_runner = property(functools.wraps(original_property.fget)(
        use_v2_model_runner), doc=original_property.__doc__)


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
    ``:444``; callers ``v1/engine/llm_engine.py:271``, ``v1/engine/async_llm.py:474,491``)
    and 0.33.0 (``:373``, ``:444``; ``llm_engine.py:271``, ``async_llm.py:483,500``).
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
