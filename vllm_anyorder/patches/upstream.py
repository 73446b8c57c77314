"""What the plugin expects of vLLM's source, in one table, and the check that reads a vLLM
tree against it: ``python -m vllm_anyorder.patches --check DIR``.

Expectations come from :data:`SIGNATURES` (written here: every attribute a patch replaces,
with the parameter names its wrapper passes on, and the runner / batch fields the patches
and ``contract.RunnerView`` read by name, which no import reveals) and from the plugin's own
source (``plugin_uses.derived``: ``_compat.py``, ``from vllm ... import``, overrides).

The ledger's ``wraps`` column must be covered (:func:`uncovered_wraps`; a test runs it), so a
new patch without an expectation fails CI. Nothing is imported from the tree: the 0.33 GPU
wheel cannot be imported on the CPU-only machines this runs on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from vllm_anyorder.patches.plugin_uses import Expect, derived
from vllm_anyorder.patches.source_tree import Found, SourceTree

RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
BATCH = "vllm.v1.worker.gpu_input_batch:InputBatch"
CPU_UTILS = "vllm.utils.cpu_triton_utils"
# wrapped attributes outside vLLM (not in a vLLM tree; checked by the plugin's own tests)
FOREIGN = {"importlib.metadata.version": "Python standard library",
           "importlib.metadata.metadata": "Python standard library",
           "RuntimeContext.get_accelerator_ids": "Ray 2.60.0 (runtime_context.py)"}


def _fields(owner: str, used_by: str, *names: str) -> tuple[Expect, ...]:
    return tuple(Expect(f"{owner}.{n}", used_by) for n in names)


SIGNATURES: tuple[Expect, ...] = (
    Expect("vllm.engine.arg_utils:EngineArgs.create_speculative_config", "method_names",
           ("self", "target_model_config", "target_parallel_config")),
    Expect(f"{CPU_UTILS}:_expand_kernel_impl", "cpu_expand_kernel",
           ("output", "input_val", "cu_num_tokens", "replace_from", "replace_to",
            "MAX_NUM_TOKENS")),
    Expect(f"{CPU_UTILS}:_rejection_random_sample_kernel_impl", "cpu_padded_drafts",
           contains=("output_token_ids", "cu_num_draft_tokens", "draft_token_ids",
                     "recovered_token_ids", "is_greedy")),
    Expect("vllm.v1.sample.rejection_sampler:RejectionSampler.forward",
           "cpu_greedy_verification",
           ("self", "metadata", "draft_probs", "logits", "sampling_metadata")),
    Expect("vllm.v1.sample.rejection_sampler:RejectionSampler.synthetic_mode",
           "cpu_greedy_verification"),
    *_fields("vllm.v1.spec_decode.metadata:SpecDecodeMetadata", "cpu_greedy_verification",
             "draft_token_ids", "num_draft_tokens", "max_spec_len", "target_logits_indices",
             "bonus_logits_indices"),
    *_fields("vllm.v1.sample.metadata:SamplingMetadata", "cpu_greedy_verification",
             "all_greedy", "max_num_logprobs", "logprob_token_ids", "no_penalties",
             "bad_words_token_ids", "allowed_token_ids_mask", "logitsprocs",
             "thinking_budget_state_holder"),
    *_fields("vllm.v1.sample.logits_processor.state:LogitsProcessors",
             "cpu_greedy_verification", "non_argmax_invariant"),
    *_fields("vllm.v1.sample.metadata:SamplingMetadata", "cpu_sampled_verification",
             "temperature", "top_k", "top_p", "generators"),
    *_fields("vllm.v1.sample.logits_processor.state:LogitsProcessors",
             "cpu_sampled_verification", "argmax_invariant"),
    # a seeded request without drafts is drawn by the bonus sampler's own TopKTopPSampler
    Expect("vllm.v1.sample.rejection_sampler:RejectionSampler.sampler",
           "cpu_sampled_verification"),
    Expect("vllm.v1.sample.sampler:Sampler.topk_topp_sampler", "cpu_sampled_verification"),
    Expect("vllm.v1.sample.ops.topk_topp_sampler:TopKTopPSampler.forward_cpu",
           "cpu_sampled_verification", ("self", "logits", "generators", "k", "p")),
    *_fields("vllm.v1.sample.logits_processor.builtin:MinTokensLogitsProcessor",
             "cpu_greedy_verification", "min_toks"),
    *_fields("vllm.v1.outputs:SamplerOutput", "cpu_greedy_verification",
             "sampled_token_ids", "logprobs_tensors"),
    Expect("vllm.v1.engine.input_processor:InputProcessor.process_inputs", "infill_requests",
           ("self", "request_id", "prompt", "params", "...")),
    Expect("vllm.v1.engine.input_processor:InputProcessor.model_config", "infill_requests"),
    Expect("vllm.exceptions:VLLMValidationError.__init__", "infill_requests",
           contains=("message", "parameter")),
    Expect(f"{RUNNER}._sample", "verification_hook", ("self", "logits", "spec_decode_metadata")),
    Expect(f"{RUNNER}.sample_tokens", "drafts_with_output", ("self", "grammar_output")),
    Expect(f"{RUNNER}.take_draft_token_ids", "drafts_with_output", ("self",)),
    *_fields(RUNNER, "drafts_with_output", "execute_model_state"),
    Expect("vllm.v1.core.sched.scheduler:Scheduler.update_from_output", "drafts_with_output",
           ("self", "scheduler_output", "model_runner_output")),
    Expect("vllm.v1.core.sched.scheduler:Scheduler.update_draft_token_ids",
           "drafts_with_output", ("self", "draft_token_ids")),
    Expect("vllm.v1.engine.core:EngineCore.post_step", "drafts_with_output",
           ("self", "model_executed")),
    *_fields("vllm.v1.engine.core:EngineCore", "drafts_with_output", "check_for_draft_tokens",
             "async_scheduling", "scheduler", "model_executor"),
    Expect(f"{RUNNER}._prepare_inputs", "plain_decode_steps",
           ("self", "scheduler_output", "num_scheduled_tokens")),
    *_fields(RUNNER, "plain_decode_steps", "speculative_config", "model_config"),
    Expect(f"{RUNNER}.execute_model", "step_timing",
           ("self", "scheduler_output", "intermediate_tensors")),
    Expect(f"{RUNNER}._model_forward", "step_timing", ("self", "input_ids", "positions", "...")),
    Expect(f"{RUNNER}.propose_draft_token_ids", "draft_probs", ("self", "...")),
    Expect(f"{RUNNER}._get_spec_decode_draft_probs", "draft_probs",
           ("self", "spec_decode_metadata")),
    Expect(f"{RUNNER}._build_attention_metadata", "asarm_prompt_lens, asarm_infill_positions",
           ("self", "...")),
    *_fields(RUNNER, "draft_probs", "_draft_probs", "_draft_prob_req_ids"),
    *_fields(RUNNER, "contract.RunnerView", "drafter", "input_batch", "requests",
             "attn_groups"),
    *_fields(BATCH, "contract.RunnerView", "req_ids", "block_table", "token_ids_cpu",
             "num_tokens_no_spec", "num_computed_tokens_cpu", "sampling_metadata"),
    *_fields(BATCH, "asarm_prompt_lens", "num_prompt_tokens_cpu_tensor"),
    *_fields("vllm.v1.spec_decode.metadata:SpecDecodeMetadata", "draft_probs",
             "draft_token_ids", "num_draft_tokens"),
    # the V1 CPU runner must inherit what the runner patches wrap
    *(Expect(f"vllm.v1.worker.cpu_model_runner:CPUModelRunner.{m}", "runner patches on CPU",
             same_as=f"{RUNNER}.{m}")
      for m in ("_sample", "propose_draft_token_ids", "_get_spec_decode_draft_probs",
                "_build_attention_metadata", "_prepare_inputs", "sample_tokens",
                "execute_model", "_model_forward")),
    Expect("vllm.entrypoints.cli.main:main", "cli_version_lookup (calls version('vllm'))"),
    Expect("vllm.utils.import_utils:get_vllm_optional_dependencies",
           "cli_version_lookup (calls metadata('vllm'))"),
    Expect("vllm.v1.executor.ray_executor_v2:RayExecutorV2._get_actor_resource_kwargs",
           "ray_cpu", (), decorator="staticmethod"),
    Expect("vllm.platforms.interface:Platform.ray_device_key", "ray_cpu (cpu_platform.py)"),
    Expect("vllm.distributed.device_communicators.cpu_communicator:"
           "_CPUSHMDistributed.make_group_name", "cpu_shm_per_node", ("communicator",),
           decorator="staticmethod"),
    Expect("vllm.distributed.device_communicators.cpu_communicator:"
           "_CPUSHMDistributed._init_cpu_shm", "cpu_shm_stale_segments", ("self",)),
    # the CPU linear layers' matmul the row warm-up drives (model_executor/cpu_row_warmup)
    Expect("vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm",
           "cpu_row_warmup (reads the layer.cpu_linear it sets)", ("layer", "remove_weight")),
    Expect("vllm.model_executor.layers.utils:cpu_unquantized_gemm",
           "cpu_row_warmup (forwards call layer.cpu_linear(x, weight, bias))",
           ("layer", "x", "weight", "bias")),
    # the fallback cpu_shm_per_node relies on: ranks whose group names differ use gloo
    Expect("vllm.distributed.device_communicators.cpu_communicator:"
           "CpuCommunicator._all_group_ranks_share_shm_group_name", "cpu_shm_per_node",
           ("self",)),
)


def expectations() -> list[Expect]:
    """Every expectation once (hand-written ones first; ``used_by`` merged)."""
    merged: dict[str, Expect] = {}
    for e in [*SIGNATURES, *derived()]:
        if e.symbol in merged:
            old = merged[e.symbol]
            users = old.used_by if e.used_by in old.used_by else f"{old.used_by}, {e.used_by}"
            merged[e.symbol] = replace(old, used_by=users)
        else:
            merged[e.symbol] = e
    return list(merged.values())


def wrapped_symbols(wraps: str) -> list[str]:
    """A ledger ``wraps`` cell as full names: ``"A.f, .g"`` -> ``["A.f", "A.g"]``."""
    out: list[str] = []
    for part in (p.strip() for p in wraps.split(",")):
        if part.startswith(".") and out:
            part = out[-1].rsplit(".", 1)[0] + part
        out.append(part)
    return out


def uncovered_wraps(ledger, expects: list[Expect]) -> list[str]:
    """Ledger ``wraps`` names that neither an expectation nor :data:`FOREIGN` covers."""
    known = set(FOREIGN)
    for e in expects:
        if e.qualname:
            known |= {e.qualname, f"{e.module.rsplit('.', 1)[-1]}.{e.qualname}"}
    return [f"{p.name}: {w}" for p in ledger for w in wrapped_symbols(p.wraps) if w not in known]


@dataclass(frozen=True)
class Result:
    expect: Expect
    found: Found | None
    problem: str  # "" when the expectation holds


def _params_problem(e: Expect, found: Found) -> str:
    if e.params is None and not e.contains:
        return ""
    if found.kind != "function":
        return f"is a {found.kind}, expected a function"
    actual = found.params()
    want = list(e.params or ())
    if want and want[-1] == "...":
        ok = actual[: len(want) - 1] == want[:-1]
    else:
        ok = e.params is None or actual == want
    missing = [n for n in e.contains if n not in actual]
    if ok and not missing:
        return ""
    return f"parameters ({', '.join(actual)}); expected " + \
        (f"({', '.join(want)})" if e.params is not None else f"to include {missing}")


def check_one(tree: SourceTree, e: Expect) -> Result:
    found = tree.resolve(e.module, e.qualname) if e.qualname else \
        (Found("module", module=e.module) if tree.module(e.module) else None)
    if found is None:
        return Result(e, None, "missing")
    problem = _params_problem(e, found)
    if not problem and e.decorator and e.decorator not in found.decorators():
        problem = f"not decorated with @{e.decorator}"
    if not problem and e.same_as:
        module, _, qual = e.same_as.partition(":")
        other = tree.resolve(module, qual)
        if other is None or (other.file, other.line) != (found.file, found.line):
            problem = f"overridden at {found.where(tree.root)} (expected {e.same_as})"
    return Result(e, found, problem)


def check(root: Path) -> list[Result]:
    tree = SourceTree(root)
    return [check_one(tree, e) for e in expectations()]


def package_root(directory: Path) -> Path:
    """The directory that holds ``vllm/``: ``DIR`` itself, or its parent when ``DIR`` is
    the ``vllm`` package."""
    directory = Path(directory)
    if (directory / "vllm" / "__init__.py").is_file():
        return directory
    if directory.name == "vllm" and (directory / "__init__.py").is_file():
        return directory.parent
    raise FileNotFoundError(f"{directory}: no vllm package (vllm/__init__.py) here")
