"""Token streams of the corpus splits and the windows the trainers cut from them.

* ``token_stream(split, tokenizer_dir)``: one int16 tensor, ``<|endoftext|>`` + the tokens of
  each file of the split (``training.data.load_split``), in the split's file order.
* ``step_generator(seed, step)``: the generator of one training step; every trainer draws the
  batch of ``step`` from it, so batches depend only on (seed, step) and a resumed run sees the
  same batches.
* ``random_windows``: ``count`` windows of ``width`` tokens at random offsets (the training
  batches); ``strided_windows``: windows every ``stride`` tokens (validation), and ``spread``:
  an evenly spaced subset of them (the periodic evaluation's).
"""

from __future__ import annotations

from pathlib import Path

import torch

from training.data import load_split

EOS_ID = 0


def token_stream(split: str, tokenizer_path: Path) -> torch.Tensor:
    """One int16 tensor: ``<|endoftext|>`` + tokens of each file of ``split``."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path / "tokenizer.json"))
    ids: list[int] = []
    for enc in tok.encode_batch(load_split(split), add_special_tokens=False):
        ids.append(EOS_ID)
        ids.extend(enc.ids)
    return torch.tensor(ids, dtype=torch.int16)


def step_generator(seed: int, step: int, offset: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step + offset)


def random_windows(stream: torch.Tensor, width: int, count: int,
                   gen: torch.Generator) -> torch.Tensor:
    """[count, width] long: windows starting at uniform offsets drawn from ``gen``."""
    starts = torch.randint(0, len(stream) - width, (count,), generator=gen)
    return torch.stack([stream[s:s + width] for s in starts.tolist()]).long()


def strided_windows(stream: torch.Tensor, width: int, stride: int | None = None) -> torch.Tensor:
    """[n, width] long: every window of ``width`` tokens that starts at a multiple of
    ``stride`` (default ``width``: non-overlapping)."""
    stride = stride or width
    n = (len(stream) - width) // stride + 1
    return torch.stack([stream[i * stride:i * stride + width] for i in range(n)]).long()


def spread(windows: torch.Tensor, limit: int | None) -> torch.Tensor:
    """``limit`` evenly spaced rows of ``windows`` (all of them when there are no more)."""
    if limit is None or limit >= len(windows):
        return windows
    return windows[torch.linspace(0, len(windows) - 1, limit).long()]
