"""hixl.sglang's control messages and descriptor lists, without SGLang: every
malformed message is refused with a reason, and the descriptors of a chunk
cover exactly the pages asked for."""
import json

import numpy as np
import pytest

from hixl.sglang import _descs, _wire


def reg(**kw):
    d = dict(engine="127.0.0.1:4000", rank_ip="127.0.0.1", rank_port=5000, tp_size=2, tp_rank=1,
             kv_ptrs=[4096, 8192], kv_lens=[1024, 1024], kv_item_lens=[64, 64], aux_ptrs=[65536],
             aux_lens=[256], aux_item_lens=[32], page_size=4)
    d.update(kw)
    return _wire.encode_registration(**d)


def req(**kw):
    d = dict(room=77, engine="127.0.0.1:4000", kv_indices=np.array([3, 4, 9], dtype=np.int32),
             aux_index=2, required_dst_info_num=1, decode_prefix_len=0, is_dummy=False,
             rank_ip="127.0.0.1", rank_port=5000)
    d.update(kw)
    return _wire.encode_request(**d)


def test_registration_round_trip():
    r = _wire.parse_registration(reg())
    assert (r.engine, r.tp_size, r.tp_rank, r.page_size) == ("127.0.0.1:4000", 2, 1, 4)
    assert r.kv_ptrs == [4096, 8192] and r.kv_pages(1) == 16 and r.aux_rows(0) == 8


def test_request_round_trip():
    q = _wire.parse_request(req())
    assert q.room == 77 and list(q.kv_indices) == [3, 4, 9] and q.aux_index == 2
    assert (q.endpoint, q.dst_port, q.is_dummy, q.required_dst_info_num) == \
        ("127.0.0.1", 5000, False, 1)
    d = _wire.parse_request(req(is_dummy=True))
    assert d.is_dummy and d.kv_indices.size == 0


def _mutate(msg, **changes):
    d = json.loads(msg[1])
    for k, v in changes.items():
        if v is KeyError:
            del d[k]
        else:
            d[k] = v
    return [msg[0], json.dumps(d).encode()] + msg[2:]


@pytest.mark.parametrize("changes", [
    dict(v=2), dict(engine=""), dict(engine="a b"), dict(engine="x" * 300), dict(rank_port=0),
    dict(rank_port=70000), dict(tp_size=0), dict(tp_rank=2), dict(kv_ptrs=[1]),
    dict(kv_item_lens=[0, 64]), dict(kv_lens=[-1, 5]), dict(kv_ptrs=[True, 1]),
    dict(kv_ptrs=[(1 << 64) - 10, 1]), dict(aux_ptrs="x"), dict(page_size=0),
    dict(page_size=KeyError), dict(kv_ptrs=list(range(70000))),
])
def test_bad_registrations_are_refused(changes):
    with pytest.raises(_wire.WireError):
        _wire.parse_registration(_mutate(reg(), **changes))


@pytest.mark.parametrize("msg", [
    [], [b"HIXL_REG"], [b"HIXL_REG", b"{"], [b"HIXL_REG", b"[1]"], [b"HIXL_REG", b"\xff"],
    [b"OTHER", b"{}"],
])
def test_bad_registration_frames_are_refused(msg):
    with pytest.raises(_wire.WireError):
        _wire.parse_registration(msg)


@pytest.mark.parametrize("changes", [
    dict(room=-1), dict(room="7"), dict(aux_index=-2), dict(required=0), dict(dummy=1),
    dict(rank_ip="bad ip"), dict(prefix=-1), dict(v=KeyError),
])
def test_bad_requests_are_refused(changes):
    with pytest.raises(_wire.WireError):
        _wire.parse_request(_mutate(req(), **changes))


def test_bad_page_lists_are_refused():
    m = req()
    with pytest.raises(_wire.WireError, match="whole number"):
        _wire.parse_request(m[:2] + [b"\x01\x02\x03"])
    with pytest.raises(_wire.WireError, match="negative"):
        _wire.parse_request(m[:2] + [np.array([1, -5], dtype="<i4").tobytes()])
    with pytest.raises(_wire.WireError, match="dummy"):
        _wire.parse_request(_mutate(m, dummy=True))
    with pytest.raises(_wire.WireError):
        _wire.parse_request(m + [b"extra"])


def test_completion_notification():
    assert _wire.parse_done(_wire.encode_done(77, 3)) == (77, 3)
    for bad in (b"", b"7", b"a:b", b"1:2:3", b"-1:0", b"\xff:1", b"1:99999999"):
        assert _wire.parse_done(bad) is None


def test_page_runs_merge_consecutive_pages():
    s, d, n = _descs.page_runs([3, 4, 5, 9, 10, 2], [0, 1, 2, 3, 4, 8])
    assert list(s) == [3, 9, 2] and list(d) == [0, 3, 8] and list(n) == [3, 2, 1]
    s, d, n = _descs.page_runs([1, 2, 3], [5, 7, 8])
    assert list(n) == [1, 2]
    assert _descs.page_runs([], [])[2].size == 0
    with pytest.raises(ValueError):
        _descs.page_runs([1, 2], [1])


def test_buffer_descs_cover_exactly_the_pages():
    src, dst = [3, 4, 5, 9], [10, 11, 12, 0]
    rows = _descs.buffer_descs([(1000, 50000, 64), (9000, 90000, 64)], src, dst)
    assert rows.dtype == np.uint64 and rows.shape == (4, 3) and rows.flags.c_contiguous
    covered = set()
    for local, remote, n in rows.tolist():
        for off in range(0, n, 64):
            covered.add((local + off, remote + off))
    want = {(b + s * 64, r + d * 64) for b, r in ((1000, 50000), (9000, 90000))
            for s, d in zip(src, dst)}
    assert covered == want
    assert _descs.buffer_descs([(1, 2, 3)], [], []).shape == (0, 3)


def test_merge_blocks_joins_adjacent_head_slices():
    # Two tokens of 16 bytes, adjacent on both sides, then a gap.
    src = np.array([100, 116, 200], dtype=np.uint64)
    dst = np.array([500, 516, 900], dtype=np.uint64)
    rows = _descs.merge_blocks([(src, dst, 16)])
    assert rows.tolist() == [[100, 500, 32], [200, 900, 16]]
    assert _descs.merge_blocks([]).shape == (0, 3)


def test_checks():
    _descs.check_pages([0, 63], 64, "decode")
    with pytest.raises(ValueError, match="outside"):
        _descs.check_pages([0, 64], 64, "decode")
    with pytest.raises(ValueError, match="outside"):
        _descs.check_pages([-1], 64, "decode")
    rows = _descs.aux_descs([1000, 2000], [32, 8], 2, [5000, 6000], [32, 8], 1)
    assert rows.tolist() == [[1064, 5032, 32], [2016, 6008, 8]]
    with pytest.raises(ValueError, match="rows of"):
        _descs.aux_descs([1000], [32], 0, [5000], [16], 0)
