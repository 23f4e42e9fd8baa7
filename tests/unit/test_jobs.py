"""Reading a job's rows from the formats it accepts (never unpickling)."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

from infaas.errors import InvalidInput
from infaas.jobs import ONLINE_RECENT_S, pause_s, read_rows

ROWS = np.arange(12, dtype=np.float32).reshape(3, 4)


def _npy(arr: np.ndarray, allow_pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=allow_pickle)
    return buf.getvalue()


def test_each_format_gives_the_same_rows() -> None:
    npz = io.BytesIO()
    np.savez(npz, x=ROWS, y=np.zeros(3))
    csv = "\n".join(",".join(str(v) for v in row) for row in ROWS.tolist()).encode()
    jsonl = "".join(json.dumps(row) + "\n" for row in ROWS.tolist()).encode()
    for data, name in [(_npy(ROWS), "r.npy"), (npz.getvalue(), "r.npz"), (csv, "r.csv"), (jsonl, "r.jsonl")]:
        np.testing.assert_array_equal(read_rows(data, name), ROWS)
    one = read_rows(b"1,2,3,4\n", "one.csv")
    assert one.shape == (1, 4)  # a single row stays a row


def test_bad_files_are_refused_with_the_reason() -> None:
    with pytest.raises(InvalidInput, match=r"\.npy, \.npz, \.csv or \.jsonl"):
        read_rows(b"1,2", "rows.txt")
    with pytest.raises(InvalidInput, match="cannot read"):
        read_rows(_npy(np.array([{"a": 1}], dtype=object), allow_pickle=True), "pickled.npy")
    with pytest.raises(InvalidInput, match="cannot read"):
        read_rows(b"[1, 2]\n{not json", "r.jsonl")
    with pytest.raises(InvalidInput, match="cannot read"):
        read_rows(b"\x00garbage", "r.npz")


def test_a_job_paces_itself_only_while_online_queries_flow() -> None:
    assert pause_s(0.002, 0.5, online_idle_s=0.1) == pytest.approx(0.002)  # busy half the time
    assert pause_s(0.002, 0.25, online_idle_s=0.1) == pytest.approx(0.006)
    assert pause_s(0.002, 0.5, online_idle_s=ONLINE_RECENT_S) == 0.0  # alone: flat out
    assert pause_s(0.002, 0.5, online_idle_s=math.inf) == 0.0  # no online query ever
    assert pause_s(0.002, 1.0, online_idle_s=0.0) == 0.0


def test_jobs_have_no_data_path_of_their_own() -> None:
    """Offline jobs go through the router, the batcher and the meter (issue 33): no selection of
    their own, no call to the worker pool, no usage written to the store directly."""
    import ast
    import inspect

    from infaas import jobs

    tree = ast.parse(inspect.getsource(jobs))
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert {"route_async", "submit", "charge_once", "flush_once"} <= used
    assert not used & {"select", "add_usage", "ensure_loaded", "_pool"}
