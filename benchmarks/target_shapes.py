"""The target shapes the GPU cost profiles describe (no imports: the roofline, the loader and
the standalone ``gpu_forward_profile.py`` all read these).

* ``llama-8b``: Llama-3-8B (32 layers, d 4096, FFN 14336, 32 query / 8 KV heads of 128,
  vocabulary 128256), an autoregressive target: a step verifies ``rows`` = requests + drafts,
  each row attends causally to its request's cache and the rows before it.
* ``llada-8b``: LLaDA-8B (32 layers, d 4096, FFN 12288 as in the released config, 32 query and
  32 KV heads: no GQA, vocabulary 126464), a diffusion LLM: its forward is block-causal, a
  step evaluates ``canvases`` x ``block`` rows (a canvas = one block of 32 positions; ``ssd``
  verifies N drafted steps as N + 1 canvases), each canvas attending to its request's cache
  and, bidirectionally, to itself.
* ``tiny``: a few-thousand-parameter stand-in for testing the scripts on a CPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class TargetShape:
    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    kind: str = "ar"  # "ar": causal rows; "dllm": block-causal canvases of ``block`` rows
    block: int = 1  # rows of one canvas (dLLM); 1 for AR
    bytes_per_param: int = 2  # bf16

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer: q, k, v, o projections + gated MLP (norms ignored)."""
        d, hd = self.hidden, self.head_dim
        attn = d * self.heads * hd * 2 + d * self.kv_heads * hd * 2
        return attn + 3 * d * self.ffn

    @property
    def matmul_params(self) -> int:
        """Weights every row multiplies: the layers and the output head (the embedding is a
        lookup, not a matmul)."""
        return self.layers * self.layer_params + self.hidden * self.vocab

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one cached position over all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    def as_dict(self) -> dict:
        return asdict(self)


LLAMA_8B = TargetShape("llama-8b", layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8,
                       vocab=128256)
LLADA_8B = TargetShape("llada-8b", layers=32, hidden=4096, ffn=12288, heads=32, kv_heads=32,
                       vocab=126464, kind="dllm", block=32)
TINY_AR = TargetShape("tiny-ar", layers=2, hidden=64, ffn=128, heads=4, kv_heads=2, vocab=256)
TINY_DLLM = TargetShape("tiny-dllm", layers=2, hidden=64, ffn=128, heads=4, kv_heads=4,
                        vocab=256, kind="dllm", block=4)
SHAPES = {s.name: s for s in (LLAMA_8B, LLADA_8B, TINY_AR, TINY_DLLM)}


def shape_from_dict(d: dict) -> TargetShape:
    return TargetShape(**d)
