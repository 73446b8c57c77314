"""Engine-free algorithm core: pure Python / PyTorch, never imports vLLM.

Each module implements one paper's box and is tested against a slow reference decoder in
``tests/reference/``. The vLLM adapters in ``vllm_anyorder.proposers`` only marshal engine
buffers into these functions and back.

Vocabulary used throughout the package (one meaning each):

drafted
    A token proposed for a position the target has not committed yet.
accepted
    A drafted token the verifier kept (greedy: equal to the target's argmax; sampling:
    kept by the rejection rule).
recovered
    The token the verifier emits at the first rejected position (argmax, or a sample from
    the residual distribution).
bonus
    The token sampled after the last drafted position when every draft was accepted.
committed
    Accepted + recovered/bonus tokens of one step; they enter the KV cache and the output.
recycled
    A rejected drafted tail kept in an n-gram pool and proposed again later (Jacobi).
block
    A fixed-size span of future positions decoded together (Jacobi blocks, dLLM blocks).
canvas
    The current guess for every future position in flight (the Jacobi iterate, or a dLLM
    block with mask tokens).
node
    One candidate sequence verified in a batched forward (SSD chain nodes, FreeDave drafts).
"""
