"""The worker stream's framing, without a socket."""

from __future__ import annotations

import numpy as np

from infaas.workers.stream import _FrameReader, encode


def test_frames_split_anywhere_decode_the_same() -> None:
    objs = [("v", np.arange(12, dtype=np.float32).reshape(3, 4)), (True, None), (False, ValueError("x"))]
    wire = b"".join(bytes(piece) for obj in objs for piece in encode(obj))
    reader = _FrameReader()
    decoded = [frame for i in range(len(wire)) for frame in reader.feed(wire[i : i + 1])]
    assert len(decoded) == 3
    np.testing.assert_array_equal(decoded[0][1], objs[0][1])
    assert decoded[1] == (True, None) and str(decoded[2][1]) == "x"
