"""training.distill_mdlm: the corruption puts masks only on kept continuation tokens."""

import torch

from training.distill_mdlm import corrupt, parse_args


def test_masks_only_the_kept_suffix_and_keys_match():
    args = parse_args(["--max-steps", "1", "--context-len", "40", "--gamma", "16",
                       "--min-suffix", "4", "--short-frac", "0.5"])
    x = torch.randint(0, 100, (256, 56))
    noisy, masked, key_mask = corrupt(x, torch.Generator().manual_seed(0), args, mask_id=4096)
    kept = key_mask.sum(1)  # [B]
    assert masked.any(1).all(), "every row has at least one mask"
    assert not masked[:, :40].any(), "context tokens are never masked"
    assert (masked & ~key_mask).sum() == 0, "a mask is always a key"
    assert (noisy[masked] == 4096).all() and (noisy[~masked] == x[~masked]).all()
    last_key = 55 - key_mask.flip(1).long().argmax(1)  # index of each row's last key
    suffix = last_key - 39
    assert suffix.min() >= 4 and suffix.max() <= 16
    assert (key_mask[:, 40:].long().diff(dim=1) <= 0).all(), "suffix keys are one run"
    short = ~key_mask[:, 0]
    assert 0.3 < short.float().mean() < 0.7 and (kept[short] >= 16 + 4).all()


def test_fixed_suffix_and_rate_mask_every_suffix_token():
    args = parse_args(["--max-steps", "1", "--context-len", "40", "--short-frac", "0"])
    x = torch.randint(0, 100, (8, 56))
    _, masked, key_mask = corrupt(x, torch.Generator().manual_seed(0), args, 4096, suffix=8, rate=1.0)
    assert masked[:, 40:48].all() and masked.sum() == 64
    assert key_mask[:, :48].all() and not key_mask[:, 48:].any()
