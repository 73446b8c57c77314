"""specdiff at start-up: option parsing, the drafter directory and its match with the target.

Drafter directories are written by hand in the released MDLM / SEDD layouts (config.json and
a weights file; read_spec reads JSON only), the target is a fake model config."""

import json
import os
from types import SimpleNamespace as NS

import pytest

from vllm_anyorder import config, engine_setup
from vllm_anyorder.config import AnyOrderConfigError, SpecDiffConfig

PROPOSER = "vllm_anyorder.proposers.specdiff.SpecDiffProposer"


def write_tokenizer(path, vocab):
    (path / "tokenizer.json").write_text(json.dumps(
        {"model": {"type": "WordLevel", "vocab": {t: i for i, t in enumerate(vocab)}},
         "added_tokens": []}))


def mdlm_dir(path, vocab_size=65, length=64, tokenizer=None):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "architectures": ["MDLM"], "model_type": "mdlm", "vocab_size": vocab_size,
        "model_length": length, "hidden_dim": 64, "cond_dim": 32, "n_blocks": 2, "n_heads": 2,
        "dropout": 0.1, "time_conditioning": False, "return_dict": False,
        "torch_dtype": "float32"}))
    (path / "model.safetensors").write_bytes(b"")
    if tokenizer is not None:
        write_tokenizer(path, tokenizer)
    return str(path)


def sedd_dir(path, tokens=64, graph="absorb"):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "tokens": tokens, "graph": {"type": graph}, "noise": {"type": "loglinear"},
        "model": {"name": "tiny", "type": "ddit", "hidden_size": 64, "cond_dim": 32,
                  "length": 64, "n_blocks": 2, "n_heads": 2, "scale_by_sigma": True,
                  "dropout": 0.1}}))
    (path / "pytorch_model.bin").write_bytes(b"")
    return str(path)


def target(tmp_path, vocab_size=64, tokenizer=None):
    tok_dir = tmp_path / "target"
    tok_dir.mkdir(exist_ok=True)
    if tokenizer is not None:
        write_tokenizer(tok_dir, tokenizer)
    return NS(hf_config=NS(architectures=["LlamaForCausalLM"], model_type="llama",
                           vocab_size=vocab_size),
              runner_type="generate", model=str(tok_dir), tokenizer=str(tok_dir))


VOCAB = [f"t{i}" for i in range(64)]


def resolve(spec, options=None, tgt=None, tmp_path=None):
    extra = {"anyorder": {"specdiff": options}} if options is not None else None
    return engine_setup.resolve(spec, extra, tgt)


def test_specdiff_maps_onto_custom_class_with_the_drafter_in_the_options(tmp_path):
    drafter = mdlm_dir(tmp_path / "d", tokenizer=VOCAB)
    resolved, additional = resolve(
        {"method": "specdiff", "model": drafter, "num_speculative_tokens": 12},
        {"steps": 3, "schedule": "random"}, target(tmp_path, tokenizer=VOCAB))
    assert resolved == {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 12}
    assert additional["anyorder"]["resolved"] == "specdiff"
    cfg = config.load(additional, "specdiff")
    assert cfg == SpecDiffConfig(drafter=drafter, num_draft_tokens=12, steps=3, schedule="random")
    again, _ = engine_setup.resolve(resolved, additional, target(tmp_path))  # idempotent
    assert again == resolved


def test_relative_drafter_path_is_made_absolute(tmp_path, monkeypatch):
    mdlm_dir(tmp_path / "rel")
    monkeypatch.chdir(tmp_path)
    _, additional = resolve({"method": "specdiff", "model": "rel", "num_speculative_tokens": 4},
                            tgt=target(tmp_path))
    assert additional["anyorder"]["specdiff"]["drafter"] == os.path.join(str(tmp_path), "rel")


def test_sedd_absorbing_directory_is_accepted(tmp_path):
    _, additional = resolve({"method": "specdiff", "model": sedd_dir(tmp_path / "s"),
                             "num_speculative_tokens": 8}, tgt=target(tmp_path))
    assert config.load(additional, "specdiff").num_draft_tokens == 8


def test_defaults(tmp_path):
    resolved, additional = resolve({"method": "specdiff", "model": mdlm_dir(tmp_path / "d")},
                                   tgt=target(tmp_path))
    assert resolved["num_speculative_tokens"] == 16
    cfg = config.load(additional, "specdiff")
    assert (cfg.steps, cfg.context_window, cfg.schedule, cfg.temperature, cfg.dtype) == (
        4, 0, "confidence", 0.0, "auto")


@pytest.mark.parametrize("make,match", [
    (lambda p: None, "speculative_config.model"),
    (lambda p: str(p / "missing"), "drafter"),
    (lambda p: str(p), "config.json"),  # a directory without a config
    (lambda p: sedd_dir(p / "u", graph="uniform"), "absorb"),
])
def test_bad_drafter_directories_fail_with_a_clear_message(tmp_path, make, match):
    spec = {"method": "specdiff", "num_speculative_tokens": 4}
    model = make(tmp_path)
    if model is not None:
        spec["model"] = model
    with pytest.raises(AnyOrderConfigError, match=match):
        resolve(spec, tgt=target(tmp_path))


def test_malformed_config_json_is_refused(tmp_path):
    path = tmp_path / "bad"
    mdlm_dir(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(AnyOrderConfigError, match="drafter"):
        resolve({"method": "specdiff", "model": str(path)}, tgt=target(tmp_path))


@pytest.mark.parametrize("drafter_vocab,target_vocab,tokenizer_len,match", [
    (129, 64, None, "target's vocabulary has 64"),  # drafter tokens are not target ids
    (33, 64, 64, "tokenizer has 64"),  # drafter cannot read every context token
])
def test_vocabulary_mismatch_is_refused(tmp_path, drafter_vocab, target_vocab, tokenizer_len,
                                        match):
    tok = VOCAB[:tokenizer_len] if tokenizer_len else None
    with pytest.raises(AnyOrderConfigError, match=match):
        resolve({"method": "specdiff", "model": mdlm_dir(tmp_path / "d", drafter_vocab)},
                tgt=target(tmp_path, target_vocab, tokenizer=tok))


def test_padded_target_vocabulary_is_fine(tmp_path):
    # e.g. Qwen pads its embedding past the tokenizer: drafter covers the tokenizer only
    resolve({"method": "specdiff", "model": mdlm_dir(tmp_path / "d", 65)},
            tgt=target(tmp_path, 80, tokenizer=VOCAB))


def test_different_tokenizer_is_refused(tmp_path):
    other = VOCAB[:10] + ["x"] + VOCAB[11:]
    with pytest.raises(AnyOrderConfigError, match="tokenizer differs"):
        resolve({"method": "specdiff", "model": mdlm_dir(tmp_path / "d", tokenizer=other)},
                tgt=target(tmp_path, tokenizer=VOCAB))


@pytest.mark.parametrize("k,options,match", [
    (4, {"steps": 5}, "steps"),  # T > gamma
    (4, {"steps": 0}, "steps"),
    (8, {"context_window": 57}, "trained length 64"),  # 57 + 8 > 64
    (64, {}, "no room for context"),
    (129, {}, "MAX_SPEC_LEN"),
    (0, {}, "positive integer"),
    (4, {"dtype": "int8"}, "dtype"),
    (4, {"schedule": "best"}, "schedule"),
    (4, {"temperature": -1.0}, "temperature"),
    (4, {"drafter": "/x"}, "model"),  # comes from speculative_config.model
    (4, {"num_draft_tokens": 4}, "num_speculative_tokens"),
    (4, {"gamma": 4}, "unknown option"),
])
def test_out_of_range_options_are_refused(tmp_path, k, options, match):
    with pytest.raises(AnyOrderConfigError, match=match):
        resolve({"method": "specdiff", "model": mdlm_dir(tmp_path / "d"),
                 "num_speculative_tokens": k}, options, target(tmp_path))


def test_context_window_at_the_limit_is_accepted(tmp_path):
    resolve({"method": "specdiff", "model": mdlm_dir(tmp_path / "d"),
             "num_speculative_tokens": 8}, {"context_window": 56}, target(tmp_path))


def test_specdiff_refuses_diffusion_targets(tmp_path):
    tgt = target(tmp_path)
    tgt.hf_config.architectures = ["LLaDAModelLM"]
    with pytest.raises(AnyOrderConfigError, match="autoregressive target"):
        resolve({"method": "specdiff", "model": mdlm_dir(tmp_path / "d")}, tgt=tgt)
