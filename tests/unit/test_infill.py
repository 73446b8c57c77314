"""Infill requests: the user-side helper (``vllm_anyorder.infill``), the per-row true
positions the AS-ARM reads (``attention_backends.asarm_positions``) and the front-end
refusal of infill on a left-to-right model (patch ``infill_requests``). No engine."""

from types import SimpleNamespace as NS

import pytest
import torch

from vllm_anyorder import infill
from vllm_anyorder.infill import InfillError


def test_request_round_trip_any_spans_and_orders():
    seq = [None, 4, 5, None, None, 8, None]
    req = infill.make_request(seq)
    assert req.prompt_token_ids == (4, 5, 8) and req.masked == (0, 3, 4, 6)
    assert req.max_tokens == 4 and req.extra_args == {"anyorder_infill": [0, 3, 4, 6]}
    assert infill.position_table(3, req.masked) == [1, 2, 5, 0, 3, 4, 6]
    assert req.merge([10, 13, 14, 16]) == [10, 4, 5, 13, 14, 8, 16]
    rev = infill.make_request(seq, order=[6, 4, 3, 0])
    assert rev.merge([16, 14, 13, 10]) == [10, 4, 5, 13, 14, 8, 16]
    assert infill.make_request([7, 99, 99, 3], mask_id=99).masked == (1, 2)
    # continuation is the special case: masks after the prompt, table = identity
    cont = infill.make_request([1, 2, 3, None, None])
    assert infill.position_table(3, cont.masked) == [0, 1, 2, 3, 4]
    with pytest.raises(InfillError, match="order"):
        infill.make_request(seq, order=[0, 3, 4])
    with pytest.raises(InfillError, match="expected 4"):
        req.merge([1, 2])


@pytest.mark.parametrize("masked, num_prompt, max_tokens, max_len, match", [
    ([], 3, None, None, "at least one masked"),
    ([0, 1], 0, None, None, "at least one visible"),
    ([1, 1], 3, None, None, "repeated: \\[1\\]"),
    ([1, 5], 3, None, None, "outside the sequence"),
    ([-1, 2], 3, None, None, "outside the sequence"),
    ([1, 2], 3, 3, None, "max_tokens \\(3\\)"),
    ([1, 2], 30, 2, 31, "exceeds max_model_len"),
])
def test_malformed_requests(masked, num_prompt, max_tokens, max_len, match):
    with pytest.raises(InfillError, match=match):
        infill.check(masked, num_prompt, max_tokens, max_len)


def test_extra_args_parsing_and_sampling_settings():
    assert infill.parse(None) is None and infill.parse({"other": 1}) is None
    assert infill.parse({"anyorder_infill": [3, 1]}) == [3, 1]
    for bad in ("1,2", [1.0, 2], [True], 5):
        with pytest.raises(InfillError, match="list of integer"):
            infill.parse({"anyorder_infill": bad})
    infill.check_sampling(NS(ignore_eos=True, stop=None, stop_token_ids=[]))
    with pytest.raises(InfillError, match="ignore_eos"):
        infill.check_sampling(NS(ignore_eos=False, stop=None, stop_token_ids=None))
    with pytest.raises(InfillError, match="stop"):
        infill.check_sampling(NS(ignore_eos=True, stop=None, stop_token_ids=[2]))


def test_row_positions_of_a_mixed_batch():
    """Request 0: infill (prompt [a, b] at positions 0 and 3, masks 1, 2, 4 in that order),
    decoding 2 rows at sequence indices 3, 4 (+ one placeholder past the table); request 1:
    a continuation prefilling 3 rows. Query rows: the last 2 of request 0, the last of 1."""
    from vllm_anyorder.attention_backends.asarm_positions import request_table, row_positions

    state = NS(sampling_params=NS(extra_args={"anyorder_infill": [1, 2, 4]}),
               num_prompt_tokens=2)
    table = request_table(state)
    assert table.tolist() == [0, 3, 1, 2, 4, 5] and request_table(state) is table  # cached
    assert request_table(NS(sampling_params=NS(extra_args=None))) is None
    bad = NS(sampling_params=NS(extra_args={"anyorder_infill": [1, 1]}), num_prompt_tokens=2)
    assert request_table(bad) is None  # bypassed the front end: logged, never a crash
    cm = NS(num_reqs=2, query_start_loc_cpu=torch.tensor([0, 3, 6]),
            seq_lens=torch.tensor([6, 3]))
    content, query = row_positions(cm, [table, None], torch.tensor([1, 2, 5]))
    assert content.tolist() == [2, 4, 5, 0, 1, 2]  # indices 3, 4, 5 (clamped), then 0, 1, 2
    assert query.tolist() == [5, 5, 3]  # next positions of rows 1, 2 (clamped) and row 5


def test_infill_on_a_left_to_right_model_is_refused_in_the_front_end():
    from vllm_anyorder import _compat, infill, patches

    patches.apply("infill_requests", screen=infill.screen_request,
                  complete=infill.complete_request)
    processor = NS(model_config=NS(hf_config=NS(architectures=["LlamaForCausalLM"],
                                                model_type="llama"), model="tiny-llama"))
    params = NS(extra_args={"anyorder_infill": [1, 2]}, ignore_eos=True)
    with pytest.raises(ValueError, match="AS-ARM") as err:
        _compat.input_processor_cls().process_inputs(processor, "r", {"prompt_token_ids": [1]},
                                                     params, ())
    assert isinstance(err.value, _compat.validation_error_cls())  # the server's HTTP 400
