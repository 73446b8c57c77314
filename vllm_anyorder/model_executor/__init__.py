"""Out-of-tree model classes (AS-ARM, XLNet, LLaDA, Dream, diffusion drafters), one
architecture per file, registered with vLLM's ModelRegistry by ``register()``. Empty until a
method needs one; ``jacobi`` serves any autoregressive model vLLM already supports."""
