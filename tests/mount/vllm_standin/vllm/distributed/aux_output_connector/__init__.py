# SPDX-License-Identifier: Apache-2.0
"""Stand-in of upstream vLLM's auxiliary outputs (see ../../../README). As
in vLLM, the package itself imports nothing."""
