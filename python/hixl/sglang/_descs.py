"""Descriptor lists for the writes of one chunk: (local, remote, len) rows as
an N x 3 uint64 array (hixl takes it without a Python object per row).

Pages are SGLang's page indices; a buffer's page i starts at
ptr + i * item_len. Runs of pages that follow each other on both sides become
one descriptor, so a request laid out contiguously costs one descriptor per
buffer whatever its length.
"""
import numpy as np

EMPTY = np.zeros((0, 3), dtype=np.uint64)


def page_runs(src, dst):
    """(src_starts, dst_starts, lengths) of the runs in which both page lists
    go up by one."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if src.shape != dst.shape:
        raise ValueError("%d source pages against %d destination pages" % (src.size, dst.size))
    if src.size == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    brk = np.flatnonzero((np.diff(src) != 1) | (np.diff(dst) != 1)) + 1
    starts = np.concatenate(([0], brk))
    ends = np.concatenate((brk, [src.size]))
    return src[starts], dst[starts], ends - starts


def check_pages(pages, capacity, what):
    """Refuses page indices outside [0, capacity) before any byte moves."""
    pages = np.asarray(pages)
    if pages.size and (pages.min() < 0 or pages.max() >= capacity):
        raise ValueError("%s page %d is outside the buffer's %d pages"
                         % (what, int(pages.max() if pages.max() >= capacity else pages.min()),
                            capacity))


def buffer_descs(pairs, src_pages, dst_pages):
    """Rows for whole pages: pairs is [(src_ptr, dst_ptr, item_len)] -- one per
    buffer (a layer's K or V, or an MLA layer) -- or the same as an N x 3
    uint64 array; the same pages in each buffer. Buffer-major: all runs of the
    first buffer, then the second's, ..."""
    s0, d0, n = page_runs(src_pages, dst_pages)
    p = np.asarray(pairs, dtype=np.uint64).reshape(-1, 3)
    if n.size == 0 or p.shape[0] == 0:
        return EMPTY
    item = p[:, 2:3]
    r = np.empty((p.shape[0], n.size, 3), dtype=np.uint64)
    r[:, :, 0] = p[:, 0:1] + s0.astype(np.uint64)[None, :] * item
    r[:, :, 1] = p[:, 1:2] + d0.astype(np.uint64)[None, :] * item
    r[:, :, 2] = n.astype(np.uint64)[None, :] * item
    return r.reshape(-1, 3)


def merge_blocks(blocks):
    """Rows for SGLang's head-slice blocks [(src_addrs, dst_addrs, length)]:
    blocks that follow each other on both sides become one row."""
    rows = []
    for src, dst, length in blocks:
        src = np.asarray(src, dtype=np.uint64)
        dst = np.asarray(dst, dtype=np.uint64)
        if src.size == 0:
            continue
        step = np.uint64(length)
        brk = np.flatnonzero((np.diff(src) != step) | (np.diff(dst) != step)) + 1
        starts = np.concatenate(([0], brk))
        ends = np.concatenate((brk, [src.size]))
        r = np.empty((starts.size, 3), dtype=np.uint64)
        r[:, 0] = src[starts]
        r[:, 1] = dst[starts]
        r[:, 2] = (ends - starts).astype(np.uint64) * step
        rows.append(r)
    return np.ascontiguousarray(np.concatenate(rows)) if rows else EMPTY


def aux_descs(src_ptrs, src_item_lens, src_index, dst_ptrs, dst_item_lens, dst_index):
    """Rows for one request's metadata row in each aux buffer, paired by
    position (SGLang's convention); each buffer's row sizes must agree."""
    n = min(len(src_ptrs), len(dst_ptrs))
    r = np.empty((n, 3), dtype=np.uint64)
    for i in range(n):
        if src_item_lens[i] != dst_item_lens[i]:
            raise ValueError("metadata buffer %d: rows of %d bytes here, %d at the decode"
                             % (i, src_item_lens[i], dst_item_lens[i]))
        r[i] = (src_ptrs[i] + src_index * src_item_lens[i],
                dst_ptrs[i] + dst_index * dst_item_lens[i], src_item_lens[i])
    return r
