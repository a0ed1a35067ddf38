# SPDX-License-Identifier: Apache-2.0
"""vLLM's logging: one "vllm" logger with its own handler, not propagated."""
import logging
import sys

_root = logging.getLogger("vllm")
if not _root.handlers:
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    _root.addHandler(_handler)
    _root.setLevel(logging.INFO)
    _root.propagate = False


def init_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
