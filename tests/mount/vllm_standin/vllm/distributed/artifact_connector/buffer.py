# SPDX-License-Identifier: Apache-2.0
"""The worker's rows of each request not yet published as full blocks."""
import numpy as np


class RoutedExpertsArtifactBuffer:
    def __init__(self, dtype, shape_per_token):
        self.dtype = dtype
        self.shape_per_token = shape_per_token
        self._requests = {}  # request id -> [first token, rows]

    def capture(self, request_id, token_start, rows):
        rows = np.asarray(rows)
        if rows.shape[1:] != self.shape_per_token:
            raise RuntimeError("routed-experts capture profile changed")
        rows = rows.astype(self.dtype, copy=False)
        if token_start < 0:
            raise ValueError("artifact token start must be non-negative")
        if len(rows) == 0:
            return
        held = self._requests.get(request_id)
        if held is None:
            self._requests[request_id] = [token_start, rows.copy()]
            return
        start, kept = held
        end = start + len(kept)
        if token_start + len(rows) <= start:
            return  # all of it already released
        if token_start < start:
            rows, token_start = rows[start - token_start:], start
        if token_start > end:
            raise RuntimeError(f"artifact capture is not contiguous: request={request_id}")
        # Recomputed rows replace what was captured before; new ones append.
        overlap = min(end - token_start, len(rows))
        kept[token_start - start:token_start - start + overlap] = rows[:overlap]
        if overlap < len(rows):
            held[1] = np.concatenate((kept, rows[overlap:]))

    def read(self, request_id, token_start, token_end):
        held = self._requests.get(request_id)
        if held is None:
            raise RuntimeError(f"artifact buffer is missing request {request_id}")
        start, kept = held
        lo, hi = token_start - start, token_end - start
        if lo < 0 or hi > len(kept) or lo >= hi:
            raise RuntimeError(f"artifact range is unavailable: request={request_id}, "
                               f"range=[{token_start}, {token_end})")
        return kept[lo:hi].copy()

    def release_through(self, request_id, token_end):
        held = self._requests.get(request_id)
        if held is None or token_end <= held[0]:
            return
        drop = min(token_end - held[0], len(held[1]))
        held[0] += drop
        held[1] = held[1][drop:]
        if len(held[1]) == 0:
            del self._requests[request_id]

    def discard(self, request_id):
        self._requests.pop(request_id, None)
