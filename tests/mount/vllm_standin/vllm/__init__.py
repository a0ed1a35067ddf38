"""Stand-in for vLLM (see ../README): only what artfs.vllm meets."""
