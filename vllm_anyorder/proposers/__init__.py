"""vLLM adapters that draft tokens: one proposer per method, each buildable by vLLM's
``custom_class`` hook (``Class(vllm_config)``, ``load_model(target)``, ``propose(...)``).
They marshal engine buffers into ``vllm_anyorder.core`` calls and back, nothing more."""
