# SPDX-License-Identifier: Apache-2.0
"""Stand-in for vLLM (see ../README): only what artfs.vllm meets."""
