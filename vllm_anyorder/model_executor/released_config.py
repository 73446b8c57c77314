"""``config.json`` <-> typed config for checkpoints in a released format (LLaDA, Dream).

A format's config is a frozen dataclass of the fields the plain-PyTorch model reads, mixed with
:class:`ReleasedConfig`: keys the class does not model are kept in ``extra`` and written back
(``FIXED_KEYS`` gives the released values of those a fresh checkpoint carries), and a
checkpoint whose fixed keys differ from what the implementation runs (``REQUIRED``) is refused
on load. Imports neither torch nor vLLM.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any, ClassVar


class ReleasedConfig:
    MODEL_TYPE: ClassVar[str]
    ARCHITECTURE: ClassVar[str]
    FORMAT: ClassVar[str]  # the format's name in error messages
    FIXED_KEYS: ClassVar[dict[str, Any]]  # released keys this class does not model
    REQUIRED: ClassVar[dict[str, Any]]  # values of those keys this implementation runs

    def to_json(self) -> dict:
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        d = {**self.FIXED_KEYS, **self.extra, **own,
             "model_type": self.MODEL_TYPE, "architectures": [self.ARCHITECTURE]}
        return dict(sorted(d.items()))

    @classmethod
    def from_json(cls, d: dict):
        if d.get("model_type") != cls.MODEL_TYPE:
            raise ValueError(f"model_type {d.get('model_type')!r} is not {cls.MODEL_TYPE!r}")
        bad = {k: d[k] for k, want in cls.REQUIRED.items() if k in d and d[k] != want}
        if bad:
            raise ValueError(f"unsupported {cls.FORMAT} variant {bad}; this class runs "
                             f"{cls.REQUIRED}")
        cls.check_json(d)
        names = {f.name for f in fields(cls)} - {"extra"}
        own = cls.fill_defaults({k: d[k] for k in names if k in d}, d)
        skip = names | {"model_type", "architectures"}
        return cls(**own, extra={k: v for k, v in d.items() if k not in skip})

    @classmethod
    def check_json(cls, d: dict) -> None:
        """Format-specific checks of a config.json (raise ValueError)."""

    @classmethod
    def fill_defaults(cls, own: dict, d: dict) -> dict:
        """Format-specific defaults derived from other keys."""
        return own

    @classmethod
    def read(cls, path):
        return cls.from_json(json.loads((Path(path) / "config.json").read_text()))


def write_config(path, config_json: dict) -> Path:
    """Create the checkpoint directory and write its ``config.json``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    return path
