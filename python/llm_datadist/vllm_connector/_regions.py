"""The block regions of vLLM's KV tensors: what the worker registers, the
layout the two sides compare (_plan), and which layers write each region
(the gates of layer-wise writes, _layerwise). Pure functions of the tensors."""
from ._plan import LayoutError


def describe_kv_caches(kv_caches, layer_names, num_blocks, heads=1, block_tokens=None,
                       mla=False, groups=1):
    """The block regions of vLLM's KV tensors -> (regions, layout).

    regions: [(address, tensor)] of equal-sized regions, each num_blocks
    blocks of layout["block_bytes"] laid end to end. A layer tensor whose
    first dimension is the blocks is one region; one shaped (2, num_blocks,
    ...) -- K and V apart -- is two; layers whose tensors share memory (the KV
    cache groups of vLLM's hybrid allocator overlay each other) give one
    region. Layers laid block by block (a block-outer layout: each block
    holds every layer's page) are one region of blocks that large
    ("cross_layer"). layout: what the two sides compare
    (_plan), with heads (per rank), block_tokens, the order of heads and
    tokens inside a block and the bytes of one row (one head, one token)."""
    if not kv_caches:
        raise LayoutError("HixlConnector: register_kv_caches got no KV tensors")
    names = [n for n in layer_names if n in kv_caches] or list(kv_caches)
    missing = sorted(set(kv_caches) - set(names))
    names += missing
    regions, pages, dtypes, split, seen, strided = [], set(), set(), set(), set(), []
    for name in names:
        t = kv_caches[name]
        if t.dim() >= 3 and t.shape[0] == 2 and t.shape[1] == num_blocks and num_blocks != 2:
            views, split_kv = [t[0], t[1]], True
        else:
            views, split_kv = [t], False
        for v in views:
            if v.dim() < 2 or v.shape[0] != num_blocks:
                raise LayoutError(
                    "HixlConnector: KV tensor of layer %s has shape %s: neither its first "
                    "dimension nor (after a leading 2 for K and V) its second is the %d blocks"
                    % (name, tuple(t.shape), num_blocks))
            page = v[0]
            if not page.is_contiguous():
                raise LayoutError("HixlConnector: the blocks of layer %s are not contiguous "
                                  "inside (strides %s)" % (name, tuple(v.stride())))
            page_bytes = page.numel() * v.element_size()
            if v.stride(0) * v.element_size() != page_bytes:
                strided.append(v)          # one page of a block holding every layer
            elif v.data_ptr() not in seen:      # a region shared by layers of other groups
                seen.add(v.data_ptr())
                regions.append((v.data_ptr(), v))
            pages.add((tuple(page.shape), page_bytes) if groups == 1 else
                      ((tuple(page.shape) if name == names[0] else None), page_bytes))
        dtypes.add(str(t.dtype))
        split.add(split_kv)
    cross = None
    if strided:
        cross = _cross_layer_region(strided, len(regions), groups, pages)
        regions = [cross]
    if groups > 1:
        # The groups' pages are equally large (vLLM's hybrid allocator); the
        # shape named is the first layer's (whole blocks move between alike
        # instances only).
        sizes = {b for _, b in pages}
        pages = {p for p in pages if p[0] is not None} if len(sizes) == 1 else pages
    if len(pages) != 1 or len(dtypes) != 1 or len(split) != 1:
        raise LayoutError("HixlConnector: the layers' KV blocks differ (shapes %s, dtypes %s); "
                          "one block layout for every layer is supported"
                          % (sorted(pages), sorted(dtypes)))
    (shape, page_bytes), = pages
    b = block_tokens or 0
    hn = len(shape) >= 2 and shape[0] == heads and shape[1] == b
    nh = len(shape) >= 2 and shape[0] == b and shape[1] == heads
    if heads == 1 and not hn and shape and shape[0] == b:
        nh = True                   # no heads dimension (MLA: one latent per token)
    order = "HN" if hn and not nh else "NH" if nh and not hn else None
    if cross is not None:
        order, page_bytes = None, cross[1].shape[1] * cross[1].element_size()
    layout = {"layers": len(names), "regions": len(regions), "block_bytes": page_bytes,
              "block_shape": list(shape), "dtype": dtypes.pop(), "split_kv": split.pop(),
              "heads": heads, "block_tokens": b, "order": order, "mla": bool(mla),
              "row_bytes": page_bytes // (heads * b) if order else 0}
    if groups > 1:
        layout["groups"] = groups
    if cross is not None:
        layout["cross_layer"] = True
    return regions, layout


def _cross_layer_region(views, others, groups, pages):
    """The one region of a block-outer KV cache: block b holds the page of
    every layer, laid end to end -> (address, a (blocks, block) view)."""
    stride = {v.stride(0) * v.element_size() for v in views}
    sizes = {b for _, b in pages}
    page_bytes = sizes.pop() if len(sizes) == 1 else None
    ptrs = sorted(v.data_ptr() for v in views)
    if others or groups > 1 or len(stride) != 1 or page_bytes is None or \
            ptrs != [ptrs[0] + i * page_bytes for i in range(len(ptrs))] or \
            stride.pop() != len(ptrs) * page_bytes:
        raise LayoutError(
            "HixlConnector: the layers' blocks are strided (block strides %s bytes for %s-byte "
            "pages) but are not one block-outer KV cache whose every block holds each layer's "
            "page once, end to end" % (sorted({v.stride(0) * v.element_size() for v in views}),
                                       page_bytes))
    first = min(views, key=lambda v: v.data_ptr())
    es = first.element_size()
    n = len(ptrs) * page_bytes // es
    return first.data_ptr(), first.as_strided((first.shape[0], n), (n, 1),
                                              first.storage_offset())


def owners(kv_caches, regions):
    """For each region, the names of the layers whose KV lies in it (a
    region shared by the layers of several KV cache groups, or the one
    region of a block-outer cache, has several)."""
    spans = [(a, a + v.numel() * v.element_size()) for a, v in regions]
    out = [set() for _ in regions]
    for name, t in kv_caches.items():
        ptrs = [t.data_ptr()]
        if t.dim() >= 3 and t.shape[0] == 2:
            ptrs.append(t[1].data_ptr())
        for i, (lo, hi) in enumerate(spans):
            if any(lo <= p < hi for p in ptrs):
                out[i].add(name)
    return out
