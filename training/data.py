"""Offline corpus for every model in this project: CPython's own standard library.

This module owns:
  * which files make up the corpus (``corpus_files``): every ``.py`` file under
    ``sysconfig.get_paths()["stdlib"]`` of the running interpreter, minus
    third-party code and test suites (see ``EXCLUDED_DIRS``/``EXCLUDED_PREFIXES``);
  * the deterministic split BY FILE into train / validation / benchmark, decided
    only by the sha1 of the relative path (``split_of``), and its manifest
    ``training/splits.json`` (``write_manifest`` / ``read_manifest``);
  * loading the texts of a split (``load_split``);
  * cutting deterministic benchmark prompts (``benchmark_prompts``).

Run ``python -m training.data`` to (re)write the manifest and print its sizes.
No network access is needed: the data is whatever the interpreter ships with.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import sysconfig
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
MANIFEST = REPO_ROOT / "training" / "splits.json"
DEFAULT_TOKENIZER = REPO_ROOT / "models" / "tokenizer"

SPLITS = ("train", "validation", "benchmark")
# Buckets of sha1(path) % 100: [0, 94) train, [94, 97) validation, [97, 100) benchmark.
SPLIT_BOUNDS = {"train": 94, "validation": 97, "benchmark": 100}
# Any path component equal to one of these excludes the file.
EXCLUDED_DIRS = {"site-packages", "test", "tests", "idlelib", "__pycache__"}
# Generated data rather than code: a 750 kB dict of doc strings and the
# machine-specific build configuration.
EXCLUDED_PREFIXES = ("pydoc_data/", "_sysconfigdata")


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _excluded(rel: str) -> bool:
    parts = rel.split("/")
    return bool(EXCLUDED_DIRS.intersection(parts[:-1])) or rel.startswith(EXCLUDED_PREFIXES)


def corpus_files(root: Path | None = None) -> list[str]:
    """Sorted POSIX relative paths of the corpus files under ``root``."""
    root = root or stdlib_root()
    rels = (p.relative_to(root).as_posix() for p in root.rglob("*.py") if p.is_file())
    return sorted(r for r in rels if not _excluded(r))


def split_of(rel_path: str) -> str:
    """Split of one file; depends on nothing but its relative path."""
    bucket = int(hashlib.sha1(rel_path.encode("utf-8")).hexdigest(), 16) % 100
    return next(name for name in SPLITS if bucket < SPLIT_BOUNDS[name])


def _read(root: Path, rel: str) -> str | None:
    try:
        return (root / rel).read_bytes().decode("utf-8")
    except UnicodeDecodeError:  # a handful of stdlib files are latin-1 on purpose
        return None


def build_manifest(root: Path | None = None) -> dict:
    root = root or stdlib_root()
    files: dict[str, list[str]] = {name: [] for name in SPLITS}
    digests = {name: hashlib.sha256() for name in SPLITS}
    nbytes = dict.fromkeys(SPLITS, 0)
    skipped = []
    for rel in corpus_files(root):
        text = _read(root, rel)
        if text is None or not text.strip():
            skipped.append(rel)
            continue
        name = split_of(rel)
        files[name].append(rel)
        data = text.encode("utf-8")
        digests[name].update(rel.encode("utf-8") + b"\0" + data + b"\0")
        nbytes[name] += len(data)
    return {
        "description": "CPython stdlib .py files split by sha1(relative path) % 100: "
        "<94 train, <97 validation, else benchmark.",
        "python_version": sys.version.split()[0],
        "excluded_dirs": sorted(EXCLUDED_DIRS),
        "excluded_prefixes": list(EXCLUDED_PREFIXES),
        "skipped_non_utf8_or_empty": skipped,
        "bytes": nbytes,
        "num_files": {k: len(v) for k, v in files.items()},
        "sha256": {k: d.hexdigest() for k, d in digests.items()},
        "splits": files,
    }


def write_manifest(path: Path = MANIFEST) -> dict:
    manifest = build_manifest()
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def read_manifest(path: Path = MANIFEST) -> dict:
    if not path.exists():
        return write_manifest(path)
    return json.loads(path.read_text())


def load_split(split: str, root: Path | None = None, strict: bool = False) -> list[str]:
    """Texts of the files of ``split`` (in manifest order).

    Files missing from this interpreter are skipped with a warning; a content
    hash different from the manifest (another CPython patch release) warns, or
    raises with ``strict=True``.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    root = root or stdlib_root()
    manifest = read_manifest()
    texts, digest, missing = [], hashlib.sha256(), []
    for rel in manifest["splits"][split]:
        text = _read(root, rel) if (root / rel).is_file() else None
        if text is None:
            missing.append(rel)
            continue
        texts.append(text)
        digest.update(rel.encode("utf-8") + b"\0" + text.encode("utf-8") + b"\0")
    if missing or digest.hexdigest() != manifest["sha256"][split]:
        msg = (f"split {split!r} differs from training/splits.json (built with Python "
               f"{manifest['python_version']}, running {sys.version.split()[0]}; "
               f"{len(missing)} files missing)")
        if strict:
            raise RuntimeError(msg)
        print("warning: " + msg, file=sys.stderr)
    return texts


_DEF_RE = re.compile(r"^[ \t]*(?:async[ \t]+def|def|class)[ \t]+\w", re.M)


def benchmark_prompts(n: int, prompt_tokens: int = 48, tokenizer=None,
                      min_tokens: int | None = None) -> list[str]:
    """``n`` deterministic prompts cut from the benchmark split.

    Each prompt starts at a ``def``/``class`` line of a benchmark file and takes
    whole lines while the total stays within ``prompt_tokens`` tokens (so it
    ends with a newline, a natural place to continue); prompts shorter than
    ``min_tokens`` (default ``prompt_tokens // 2``) are dropped. Candidates are
    taken round-robin over the sorted benchmark files so that consecutive
    prompts come from different modules. Dedented so that methods read like
    top-level code. ``tokenizer`` defaults to ``models/tokenizer``.
    """
    import textwrap

    if tokenizer is None:
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(str(DEFAULT_TOKENIZER))
    min_tokens = prompt_tokens // 2 if min_tokens is None else min_tokens

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    per_file: list[list[str]] = []
    for text in load_split("benchmark"):
        lines = text.splitlines(keepends=True)
        starts = [text.count("\n", 0, m.start()) for m in _DEF_RE.finditer(text)]
        prompts = []
        for start in starts:
            chunk = ""
            for line in lines[start:]:
                candidate = textwrap.dedent(chunk + line)
                if count(candidate) > prompt_tokens:
                    break
                chunk += line
            chunk = textwrap.dedent(chunk)
            if chunk.strip() and count(chunk) >= min_tokens:
                prompts.append(chunk)
        per_file.append(prompts)

    out: list[str] = []
    depth = 0
    while len(out) < n and any(depth < len(p) for p in per_file):
        out.extend(p[depth] for p in per_file if depth < len(p))
        depth += 1
    if len(out) < n:
        raise ValueError(f"only {len(out)} benchmark prompts of <= {prompt_tokens} tokens exist")
    return out[:n]


if __name__ == "__main__":
    m = write_manifest()
    print(f"wrote {MANIFEST.relative_to(REPO_ROOT)} (Python {m['python_version']})")
    for name in SPLITS:
        print(f"  {name:<10} {m['num_files'][name]:>4} files {m['bytes'][name] / 1e6:7.2f} MB")
    if m["skipped_non_utf8_or_empty"]:
        print("  skipped:", ", ".join(m["skipped_non_utf8_or_empty"]))
