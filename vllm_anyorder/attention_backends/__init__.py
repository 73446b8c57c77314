"""Attention backends for masks vLLM's stock CPU op cannot express (block-bidirectional
spans, verification trees, XLNet relative scores) over the paged KV cache. Empty until a
method needs one; ``jacobi`` verifies with vLLM's own causal attention."""
