"""The worker side of HixlConnector: one LLM-DataDist instance per worker
(tensor-parallel rank), the KV cache registered once, reads of prefill blocks
on a small thread pool (start_load_kv never waits for the network), and the
prefill side's release of blocks when the decode's read arrived (an
LLM-DataDist transfer event, raised after the data) or its lease ended."""
import collections
import concurrent.futures
import logging
import queue
import threading

import llm_datadist as ldd

from . import _common as c
from ._layerwise import LayerClock, Stream
from ._plan import LayoutError, flat, plan_groups, releases_only
from ._push import Pages, Wait, encode_ask, parse_ask
from ._regions import describe_kv_caches, owners

_log = logging.getLogger(c.LOGGER)

_ROLES = {"kv_producer": ldd.LLMRole.PROMPT, "kv_consumer": ldd.LLMRole.DECODER,
          "kv_both": ldd.LLMRole.MIX}
_LINK_TYPES = {"shm": "SHM", "tcp": "TCP", "ucx": "UCX"}


def _copy_blocks(src, dst, src_blocks, dst_blocks, direction):
    """Copies blocks between {region: tensor} dicts whose first dimension is
    the blocks (used when vLLM gave no copy operation)."""
    import torch
    for k, s in src.items():
        d = dst[k]
        d[torch.tensor(dst_blocks, device=d.device)] = \
            s[torch.tensor(src_blocks, device=s.device)].to(d.device)


class Worker:
    """The worker role. Methods are called from vLLM's model-runner thread;
    reads finish on the pool's threads and transfer events arrive on an
    LLM-DataDist thread, so the shared sets are guarded by one lock."""

    def __init__(self, opts, engine_id, kv_role, tp_rank, tp_size, num_blocks, layer_names,
                 heads=1, block_tokens=None, mla=False, groups=1, kv_buffer_device="cpu"):
        self._opts = opts
        self._groups = groups
        self._buffer_device = kv_buffer_device
        self._host = None         # host staging: {region: host copy}, {region: device view}
        self._dev = None
        self._copy_op = None      # vLLM's (set_host_xfer_buffer_ops), else _copy_blocks
        self._to_device = {}      # decode, staged: request id -> blocks arrived in the host copy
        self._tp_rank, self._tp_size = tp_rank, tp_size
        self._num_blocks = num_blocks
        self._layer_names = list(layer_names)
        self._shape = (heads, block_tokens, mla)
        self._cluster = c.cluster_id(engine_id, tp_rank)
        self._lock = threading.Lock()
        self._sending = {}        # xid -> (request id, expires_at)
        self._notified = {}       # xid -> [decode ranks heard from, expected, time of the first]
        self._done_recv = set()
        self._failed_recv = set()
        self._bad_blocks = set()
        self._links = {}          # cluster id -> address linked
        self._link_locks = {}
        self._waits = {}          # decode, push mode: xid -> Wait
        self._pushing = collections.Counter()   # prefill: xid -> writes in flight
        self._served = {}         # prefill: xid -> decode ranks whose ask was taken
        self._said_push = False
        self._said_layers = self._said_overlap = False
        self._early = {}          # prefill: xid -> [(ask, time)] come before the step that
                                  # tells this worker of the request
        self._lw = {}             # prefill, concurrent routing: xid -> Stream (_layerwise)
        self._dropped = {}        # prefill: xid -> time, concurrent requests aborted
        self._clock = None        # the steps and layers saved (register_kv_caches)
        self._tasks = queue.Queue()   # layer-wise writes in flight: (xid, rank, CacheTask)
        self._waiter = None
        self._stats = {"reads": 0, "read_blocks": 0, "read_failures": 0, "releases": 0,
                       "lease_expiries": 0, "pushes": 0, "pushed_blocks": 0,
                       "push_failures": 0, "layer_writes": 0, "layers_overlapped": 0}
        self.recent_errors = collections.deque(maxlen=32)   # the last failures, said plainly
        self._closed = False
        self._kv = self._rows = None
        self._layout = None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=opts["transfer_workers"], thread_name_prefix="hixl-vllm-read")

        self._dd = ldd.LLMDataDist(_ROLES[kv_role], self._cluster)
        cfg = ldd.LLMConfig()
        port = opts["listen_port"] + tp_rank if opts["listen_port"] else 0
        cfg.listen_ip_info = "%s:%d" % (opts["listen_host"], port)
        cfg.sync_kv_timeout = opts["transfer_timeout_ms"]
        engine = {}
        if opts["transport"]:
            engine["LinkType"] = _LINK_TYPES[opts["transport"]]
        if opts["metadata_server"]:
            # Published as llm-cluster-<cluster id>: decode links by that name.
            engine["MetadataServer"] = opts["metadata_server"]
        if engine:
            cfg.global_resource_config = engine
        self._dd.init(cfg.generate_options())
        cm = self._dd.cache_manager
        # The mailbox: one block a decode reads to release a prefill request
        # whose blocks it will not read (aborted, or all found locally).
        self._mailbox_mem = ldd.allocate_host_memory(2 * c.MAILBOX_BYTES)
        self._mailbox = cm.register_blocks_cache(
            ldd.CacheDesc(1, [2, c.MAILBOX_BYTES], ldd.DataType.DT_UINT8, ldd.Placement.HOST),
            [self._mailbox_mem], ldd.BlocksCacheKey(self._cluster, c.MAILBOX_MODEL_ID))
        # Push mode's asks (_push): a decode writes them here, a prefill reads
        # them from there into its own pages.
        self._asks_mem = cm.allocate_host_memory(c.ASK_PAGES * c.ASK_PAGE)
        self._asks_view = memoryview(self._asks_mem)
        self._asks = cm.register_blocks_cache(
            ldd.CacheDesc(1, [c.ASK_PAGES, c.ASK_PAGE], ldd.DataType.DT_UINT8,
                          ldd.Placement.HOST),
            [self._asks_mem], ldd.BlocksCacheKey(self._cluster, c.ASKS_MODEL_ID))
        self._pages = Pages(c.ASK_PAGES)
        cm.set_transfer_callback(self._on_event)

    # -- registration
    def register_kv_caches(self, kv_caches):
        if self._kv is not None or getattr(self, "_asleep", False):
            raise RuntimeError("HixlConnector: register_kv_caches called twice")
        heads, block_tokens, mla = self._shape
        regions, layout = describe_kv_caches(kv_caches, self._layer_names, self._num_blocks,
                                             heads, block_tokens, mla, groups=self._groups)
        where = ldd.Placement.DEVICE if regions[0][1].is_cuda else ldd.Placement.HOST
        self._host = self._dev = None
        region_owners = owners(kv_caches, regions)
        if self._stages(regions[0][1]):
            # Host staging: peers move a host copy; the blocks are copied
            # from the device after each step that wrote them (prefill) and to
            # it before a read is reported done (decode).
            import torch
            pin = torch.cuda.is_available() and regions[0][1].is_cuda
            self._dev = {str(i): v for i, (_, v) in enumerate(regions)}
            self._host = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=pin)
                          for k, v in self._dev.items()}
            regions = [(h.data_ptr(), h) for h in self._host.values()]
            where = ldd.Placement.HOST
        addrs = [a for a, _ in regions]
        cm = self._dd.cache_manager
        self._kv = cm.register_blocks_cache(
            ldd.CacheDesc(len(regions), [self._num_blocks, layout["block_bytes"]],
                          ldd.DataType.DT_UINT8, where),
            addrs, ldd.BlocksCacheKey(self._cluster, c.KV_MODEL_ID))
        if layout["order"]:
            # The same memory as rows, for a peer whose layout differs.
            rows = self._num_blocks * layout["block_bytes"] // layout["row_bytes"]
            self._rows = cm.register_blocks_cache(
                ldd.CacheDesc(len(regions), [rows, layout["row_bytes"]], ldd.DataType.DT_UINT8,
                              where),
                addrs, ldd.BlocksCacheKey(self._cluster, c.ROWS_MODEL_ID))
        self._kv_tensors = dict(kv_caches)   # the memory stays alive while registered
        self._layout = layout
        if self._clock is None:
            self._clock = LayerClock(region_owners, cuda=where == ldd.Placement.DEVICE)
        _log.info("HixlConnector rank %d: %d KV regions of %d blocks x %d bytes registered; "
                  "engine at %s", self._tp_rank, len(regions), self._num_blocks,
                  layout["block_bytes"], self._dd.local_address)

    def unregister_kv_caches(self):
        """Before vLLM's sleep mode frees the KV memory: no peer may touch it
        any more (unregistering waits for peers' transfers in flight)."""
        cm = self._dd.cache_manager
        for cache in (self._rows, self._kv):
            if cache is not None:
                cm.unregister_cache(cache)
        self._kv = self._rows = None
        self._asleep = True

    def restore_kv_caches(self):
        """After wake-up: the same tensors registered again."""
        if getattr(self, "_asleep", False):
            self._asleep = False
            tensors, self._kv_tensors = self._kv_tensors, None
            self.register_kv_caches(tensors)

    def handshake(self):
        return {"address": self._dd.local_address, "cluster_id": self._cluster,
                "tp_rank": self._tp_rank, "layout": self._layout,
                "host_buffer": self._host is not None}

    # -- host staging
    def _stages(self, tensor):
        """host_buffer "on", or "auto" with vLLM's kv_buffer_device "cpu" and
        the KV in a device."""
        how = self._opts["host_buffer"]
        return how == "on" or (how == "auto" and self._buffer_device == "cpu"
                               and tensor.device.type != "cpu")

    def set_copy_op(self, op):
        self._copy_op = op

    def _stage(self, blocks, direction):
        if self._host is None or not blocks:
            return
        src, dst = (self._dev, self._host) if direction == "d2h" else (self._host, self._dev)
        if self._copy_op is not None:
            try:
                self._copy_op(src, dst, list(blocks), list(blocks), direction)
                return
            except (AttributeError, NotImplementedError, TypeError) as e:
                # vLLM's operation copies through its platform, and a CPU
                # platform has none (missing, or None): a plain tensor copy from now on.
                _log.info("HixlConnector rank %d: vLLM's KV copy operation is not available "
                          "here (%s); copying blocks with torch", self._tp_rank, e)
                self._copy_op = None
        _copy_blocks(src, dst, list(blocks), list(blocks), direction)

    def save(self, reqs_to_save):
        """Prefill, after a step: the blocks it wrote, copied to host."""
        self._stage(sorted({b for blocks in reqs_to_save.values() for b in blocks}), "d2h")

    # -- one engine step
    def start(self, meta):
        """Takes this step's metadata: new prefill requests to release later,
        and reads to start (returns at once; they run on the pool)."""
        early = []
        with self._lock:
            for req_id, (xid, expires_at, blocks) in meta.reqs_to_send.items():
                self._sending[xid] = (req_id, expires_at, blocks)
                early += [a for a, _ in self._early.pop(xid, ())]
        for ask in early:
            self._take_ask(ask)
        for req_id, (spec, local, local_start, report) in meta.reqs_to_recv.items():
            self._pool.submit(self._read, req_id, spec, local, local_start, report)

    def _link(self, address, cluster):
        with self._lock:
            lk = self._link_locks.setdefault(cluster, threading.Lock())
        with lk:
            have = self._links.get(cluster)
            if have == address:
                return
            info = ldd.LLMClusterInfo()
            info.remote_cluster_id = cluster
            if have is not None:  # the prefill worker moved: drop the old link
                self._dd.unlink_clusters([info], force=True)
                self._links.pop(cluster, None)
            if not self._opts["metadata_server"]:   # else by name, through etcd
                host, _, port = address.rpartition(":")
                info.append_remote_ip_info(host, int(port))
            ret, rets = self._dd.link_clusters([info], timeout=self._opts["link_timeout_ms"])
            if rets[0] not in (ldd.LLMStatusCode.LLM_SUCCESS, ldd.LLMStatusCode.LLM_ALREADY_LINK):
                raise ldd.LLMException("cannot link to prefill worker %s (cluster %d): %s"
                                       % (address, cluster, rets[0].name), rets[0])
            self._links[cluster] = address

    def _forget_link(self, cluster):
        with self._lock:
            lk = self._link_locks.setdefault(cluster, threading.Lock())
        with lk:
            if self._links.pop(cluster, None) is not None:
                info = ldd.LLMClusterInfo()
                info.remote_cluster_id = cluster
                try:
                    self._dd.unlink_clusters([info], force=True)
                except ldd.LLMException:
                    pass

    def _read(self, req_id, spec, local, local_start, report):
        """Reads the prefill blocks (or rows) this rank holds into local
        blocks, or, with none, only releases the prefill request. Failures
        are logged, the prefill ranks still released where they can be and,
        when vLLM waits for the read, reported: the blocks as load errors,
        the request finished."""
        r = self._tp_rank
        done = set()       # prefill ranks told (read or released)
        failed = None
        try:
            if flat(local) and self._kv is None:
                raise RuntimeError("no KV cache registered on this worker")
            remote = spec.block_ids
            if spec.concurrent and flat(local):
                # The prefill's blocks are not known yet (it computes them
                # now); whom to ask depends on their count only.
                tokens = local_start + max(len(g) for g in local) * self._layout["block_tokens"]
                n = -(-tokens // spec.block_size) if spec.block_size else 0
                remote = [list(range(1, n + 1)) for _ in local]
            actions = plan_groups(self._layout or {}, spec.layout, self._tp_size, r,
                                  spec.tp_size, local, local_start, remote)
            data = any(kind != "release" for _, kind, _, _, _ in actions)
            if data and not spec.concurrent and c.now() >= spec.expires_at:
                raise TimeoutError("the prefill's lease on its blocks ended %.1f s ago"
                                   % (c.now() - spec.expires_at))
            if data and (self._opts["mode"] == "push" or spec.concurrent):
                if self._ask(req_id, spec, local, local_start, report, actions):
                    return
                if spec.concurrent:
                    raise RuntimeError("no free ask pages for the prefill to write by (a "
                                       "concurrent request cannot be read instead)")
            moved = 0
            for q, kind, rem, loc, expected in actions:
                address, cluster = spec.ranks[q]
                try:
                    self._link(address, cluster)
                    if kind == "release":
                        self._pull(cluster, c.MAILBOX_MODEL_ID, self._mailbox, [0], [1],
                                   c.tag(spec.xid, r, expected))
                        with self._lock:
                            self._stats["releases"] += 1
                    else:
                        cache, model = (self._kv, c.KV_MODEL_ID) if kind == "blocks" else \
                            (self._rows, c.ROWS_MODEL_ID)
                        self._pull(cluster, model, cache, rem, loc, c.tag(spec.xid, r, expected))
                        moved += 1
                    done.add(q)
                except Exception as e:  # noqa: BLE001
                    if isinstance(e, ldd.LLMException):
                        self._forget_link(cluster)
                    raise RuntimeError("%s (prefill rank %d at %s): %s"
                                       % (kind, q, address, e)) from e
            if moved and c.now() >= spec.expires_at:
                # The prefill may have reused the blocks while we read them.
                raise TimeoutError("the read ended after the prefill's lease on its blocks")
            if moved:
                with self._lock:
                    self._stats["reads"] += 1
                    self._stats["read_blocks"] += len(flat(local))
                    if self._host is not None and report:
                        self._to_device[req_id] = flat(local)
        except Exception as e:  # noqa: BLE001 -- no failure may reach vLLM's engine
            failed = e
        if failed is not None:
            msg = "request %s: reading %d blocks from the prefill failed: %s" % (
                req_id, len(flat(local)), failed)
            _log.warning("HixlConnector: %s", msg)
            self.recent_errors.append(msg)
            self._release_rest(spec, done)
            with self._lock:
                self._stats["read_failures"] += 1
                if report:
                    self._failed_recv.add(req_id)
                    self._bad_blocks.update(flat(local))
        if report:
            with self._lock:
                self._done_recv.add(req_id)

    def _pull(self, cluster, model, cache, remote, local, user_tag):
        self._dd.cache_manager.pull_blocks(ldd.BlocksCacheKey(cluster, model), cache, remote,
                                           local, tensor_num_per_layer=1, user_tag=user_tag)

    def _release_rest(self, spec, done):
        """After a failure: releases the prefill ranks this rank owes word
        to and has not told yet (best effort; else their lease frees them)."""
        try:
            owed = [q for q, _, _, _, _ in releases_only(spec.tp_size, self._tp_size,
                                                         self._tp_rank)]
        except Exception:  # noqa: BLE001
            return
        for q in owed:
            if q in done or q >= len(spec.ranks):
                continue
            address, cluster = spec.ranks[q]
            try:
                self._link(address, cluster)
                self._pull(cluster, c.MAILBOX_MODEL_ID, self._mailbox, [0], [1],
                           c.tag(spec.xid, self._tp_rank, 1))
            except Exception as e:  # noqa: BLE001
                _log.info("HixlConnector: releasing prefill rank %d at %s failed too (%s); "
                          "its lease frees the blocks", q, address, e)

    # -- push mode, decode side
    def _ask(self, req_id, spec, local, local_start, report, actions):
        """Asks the prefill ranks holding the request's data to write it into
        local (and releases the others). False when the ask does not fit the
        free pages: the caller reads instead."""
        r = self._tp_rank
        rec = encode_ask(spec.xid, r, self._tp_size, self._layout, local, local_start,
                         (self._kv.cache_id, self._rows.cache_id if self._rows else 0))
        n = -(-len(rec) // c.ASK_PAGE)
        # Concurrent: the prefill has yet to compute the prompt, and its lease
        # starts when it has.
        end = c.now() + spec.lease_ms / 1000.0 if spec.concurrent else spec.expires_at
        deadline = end + spec.xfer_ms / 1000.0 + 2.0
        with self._lock:
            page = self._pages.alloc(n) if n <= c.ASK_MAX_PAGES else None
            if page is None or spec.xid in self._waits:
                if page is not None:
                    self._pages.free(page, n)
                return False
            w = self._waits[spec.xid] = Wait(req_id, deadline, flat(local), report, page, n)
        at = page * c.ASK_PAGE
        self._asks_view[at:at + n * c.ASK_PAGE] = rec + bytes(n * c.ASK_PAGE - len(rec))
        my_tag = c.ask_tag(spec.xid, r, page, n, self._cluster, self._dd.local_address)
        for q, kind, _, _, expected in actions:
            address, cluster = spec.ranks[q]
            data = kind != "release"
            try:
                self._link(address, cluster)
            except Exception as e:  # noqa: BLE001 -- not linked: it was not asked
                self._note_ask_failure(w, data, q, address, e)
                continue
            if data:
                with self._lock:
                    w.asked.add(q)    # before the ask: its answer may come at once
            try:
                self._pull(cluster, c.MAILBOX_MODEL_ID, self._mailbox, [0], [1],
                           my_tag if data else c.tag(spec.xid, r, expected))
            except Exception as e:  # noqa: BLE001 -- it may have heard: wait for it
                self._forget_link(cluster)
                self._note_ask_failure(w, data, q, address, e)
        with self._lock:
            w.asking = False
        return True

    def _note_ask_failure(self, w, data, q, address, e):
        if data:
            with self._lock:
                w.errors.append("asking prefill rank %d at %s: %s" % (q, address, e))
        else:     # a release only: that rank's lease frees its blocks
            _log.info("HixlConnector: releasing prefill rank %d at %s failed (%s); its lease "
                      "frees the blocks", q, address, e)

    def _settle_waits(self, t):
        """Decode, push mode: asks every asked rank answered (or whose
        deadline passed) end; their requests are reported. Lock held."""
        for xid, w in list(self._waits.items()):
            if not w.settled(t):
                continue
            del self._waits[xid]
            self._pages.free(w.page, w.pages)
            why = w.failure()
            if not why:
                self._stats["reads"] += 1
                self._stats["read_blocks"] += len(w.local)
                if self._host is not None and w.report:
                    self._to_device[w.req_id] = w.local
            else:
                msg = "request %s: the prefill did not write %d blocks: %s" % (
                    w.req_id, len(w.local), why)
                _log.warning("HixlConnector: %s", msg)
                self.recent_errors.append(msg)
                self._stats["read_failures"] += 1
                if w.report:
                    self._failed_recv.add(w.req_id)
                    self._bad_blocks.update(w.local)
            if w.report:
                self._done_recv.add(w.req_id)

    # -- push mode, prefill side
    def _take_ask(self, ask):
        xid, rank = ask[0], ask[1]
        with self._lock:
            if xid in self._dropped or (xid in self._lw and self._lw[xid].dropped):
                job = (self._refuse, xid, rank, ask[4], ask[5])
            elif xid in self._lw:
                served = self._served.setdefault(xid, set())
                if rank in served:
                    return     # asked twice
                served.add(rank)
                self._pushing[xid] += 1
                job = (self._accept,) + tuple(ask)
            else:
                job = None
        if job is not None:
            try:
                self._pool.submit(*job)
            except RuntimeError:    # shutting down
                if job[0] == self._accept:
                    with self._lock:
                        self._pushing[xid] -= 1
            return
        with self._lock:
            if xid not in self._sending:
                # The decode may ask before this worker's next step tells it of
                # the request: kept a while (bounded; its lease frees the rest).
                if len(self._early) < 4096:
                    self._early.setdefault(xid, []).append((ask, c.now()))
                return
            served = self._served.setdefault(xid, set())
            if rank in served:
                return     # asked twice
            served.add(rank)
            self._pushing[xid] += 1
        try:
            self._pool.submit(self._serve, *ask)
        except RuntimeError:    # shutting down
            with self._lock:
                self._pushing[xid] -= 1

    def _serve(self, xid, rank, page, pages, cluster, address):
        """Reads a decode rank's ask, writes this rank's part of the request
        into its blocks, or answers that it will not."""
        expected = 1
        try:
            ask = self._read_ask(xid, rank, page, pages, cluster, address)
            with self._lock:
                held = self._sending.get(xid)
            if held is None or self._kv is None:
                raise RuntimeError("the request's blocks are no longer held here")
            req_id, expires_at, blocks = held
            part = [a for a in plan_groups(ask["layout"], self._layout, ask["tp"], rank,
                                           self._tp_size, ask["local"], ask["start"], blocks)
                    if a[0] == self._tp_rank]
            if not part or part[0][1] == "release":
                raise LayoutError("decode rank %d asked this rank for data it does not hold"
                                  % rank)
            _, kind, src, dst, expected = part[0]
            if c.now() >= expires_at:
                raise TimeoutError("the lease on request %s's blocks ended" % req_id)
            cache, model = (self._kv, c.KV_MODEL_ID) if kind == "blocks" else \
                (self._rows, c.ROWS_MODEL_ID)
            self._dd.cache_manager.push_blocks(
                ldd.BlocksCacheKey(cluster, model), cache, src, dst, tensor_num_per_layer=1,
                user_tag=c.answer_tag(True, xid, self._tp_rank))
            with self._lock:
                first, self._said_push = not self._said_push, True
                self._stats["pushes"] += 1
                self._stats["pushed_blocks"] += len(flat(ask["local"]))
            if first:
                _log.info("HixlConnector rank %d: wrote %d blocks of request %s into decode rank "
                          "%d (push mode; once per worker)", self._tp_rank, len(flat(ask["local"])),
                          req_id, rank)
        except Exception as e:  # noqa: BLE001 -- no failure may reach vLLM's engine
            self._write_failed(xid, rank, cluster, address, e)
        finally:
            self._served_one(xid, rank, expected)

    def _read_ask(self, xid, rank, page, pages, cluster, address):
        """Links to the asking decode worker and reads its ask into pages of
        our own -> the ask, checked (parse_ask)."""
        self._link(address, cluster)
        with self._lock:
            mine = self._pages.alloc(pages)
        if mine is None:
            raise RuntimeError("no free ask pages on this prefill worker")
        try:
            self._dd.cache_manager.pull_blocks(
                ldd.BlocksCacheKey(cluster, c.ASKS_MODEL_ID), self._asks,
                list(range(page, page + pages)), list(range(mine, mine + pages)),
                tensor_num_per_layer=1)
            return parse_ask(self._asks_view[mine * c.ASK_PAGE:(mine + pages) * c.ASK_PAGE],
                             xid, rank)
        finally:
            with self._lock:
                self._pages.free(mine, pages)

    # -- concurrent routing, prefill side (_layerwise)
    def bind(self, meta):
        """A step begins (vLLM binds its metadata before the forward pass;
        start_load_kv may come only after it): the step's layer-wise writes
        of concurrent requests whose decode has asked are posted, each
        layer gated until the forward computed it."""
        if self._clock is None:
            return
        push, drop = getattr(meta, "reqs_to_push", None), getattr(meta, "reqs_to_drop", None)
        if not push and not drop and not self._lw:
            return
        step = self._clock.begin()
        early, posts, answers = [], [], []
        with self._lock:
            for xid in drop or ():
                self._drop(xid, answers)
                early += [a for a, _ in self._early.pop(xid, ())]
            for req_id, (xid, blocks, t0, t1, total) in (push or {}).items():
                st = self._lw.setdefault(xid, Stream())
                st.req_id, st.blocks, st.total = req_id, blocks, total
                st.ready = min(st.ready, t0)      # lower after a preemption
                st.cur = (t0, t1, step)
                for rank in st.asks:
                    if rank not in st.answered:
                        st.inflight[rank] = st.inflight.get(rank, 0) + 1
                        posts.append((xid, rank, (t0, t1), step))
                early += [a for a, _ in self._early.pop(xid, ())]
        for a in answers:
            self._submit_answer(*a)
        for p in posts:
            self._post(*p)
        for ask in early:
            self._take_ask(ask)

    def layer_saved(self, name):
        """vLLM's save_kv_layer: the layer's KV of this step is in place (a
        host copy is written at the step's end only)."""
        if self._lw and self._host is None and self._clock is not None:
            self._clock.saved(name)

    def step_saved(self):
        """vLLM's wait_for_save: the step's forward is over."""
        if self._clock is None:
            return
        self._clock.end()
        answers = []
        with self._lock:
            for xid, st in self._lw.items():
                if st.cur is None:
                    continue
                st.ready, st.cur = st.cur[1], None
                if st.complete():
                    st.final.update(st.asks)
                    answers += self._answerable(xid, st)
        for a in answers:
            self._submit_answer(*a)

    def _answerable(self, xid, st, ranks=None):
        """The answers due now (lock held): [(xid, rank, written?, expected)]."""
        out = []
        for rank in (st.asks if ranks is None else ranks):
            if st.answerable(rank):
                st.answered.add(rank)
                ok = not st.dropped and rank not in st.failed
                out.append((xid, rank, ok, st.asks[rank][4]))
        return out

    def _drop(self, xid, answers):
        """A concurrent request was aborted on the prefill (lock held): its
        asks are refused, now or when their writes in flight ended."""
        self._dropped[xid] = c.now()
        st = self._lw.get(xid)
        if st is not None:
            st.dropped = True
            answers += self._answerable(xid, st)

    def _accept(self, xid, rank, page, pages, cluster, address):
        """Reads a decode rank's ask for a concurrent request and writes
        what is computed of it; later steps write the rest as they run."""
        expected = 1
        try:
            ask = self._read_ask(xid, rank, page, pages, cluster, address)
            if self._kv is None:
                raise RuntimeError("no KV cache registered on this worker")
            with self._lock:
                st = self._lw.get(xid)
                total = st.total if st is not None else None
            if st is None or st.dropped:
                raise RuntimeError("the request was aborted here")
            # Which part this rank writes does not depend on the block numbers.
            n = -(-total // self._layout["block_tokens"])
            part = [a for a in plan_groups(ask["layout"], self._layout, ask["tp"], rank,
                                           self._tp_size, ask["local"], ask["start"],
                                           [list(range(1, n + 1)) for _ in ask["local"]])
                    if a[0] == self._tp_rank]
            if not part or part[0][1] == "release":
                raise LayoutError("decode rank %d asked this rank for data it does not hold"
                                  % rank)
            kind, expected = part[0][1], part[0][4]
            if (kind == "rows" and not ask["rows_cache"]) or not ask["kv_cache"]:
                raise LayoutError("decode rank %d named no cache to write into" % rank)
            posts, answers = [], []
            with self._lock:
                if st.dropped:
                    raise RuntimeError("the request was aborted here")
                st.asks[rank] = (cluster, address, ask, kind, expected)
                windows = []
                if st.ready > 0:
                    windows.append(((0, st.ready), 0))    # computed: no gate
                if st.cur is not None:
                    windows.append(((st.cur[0], st.cur[1]), st.cur[2]))
                st.inflight[rank] = len(windows)
                posts = [(xid, rank, w, step) for w, step in windows]
                if st.complete():
                    st.final.add(rank)
                answers = self._answerable(xid, st, [rank])
            for p in posts:
                self._post(*p)
            for a in answers:
                self._submit_answer(*a)
        except Exception as e:  # noqa: BLE001 -- no failure may reach vLLM's engine
            self._write_failed(xid, rank, cluster, address, e)
            self._served_one(xid, rank, expected)

    def _post(self, xid, rank, window, step):
        """One layer-wise write of a concurrent request: tokens window[0] ..
        window[1] of every layer into decode rank `rank`, each layer once
        the step `step` has computed it (step 0: computed already)."""
        with self._lock:
            st = self._lw.get(xid)
            info = st.asks.get(rank) if st is not None else None
            blocks = st.blocks if st is not None else None
        if info is None:
            return
        cluster, _, ask, _, _ = info
        try:
            acts = plan_groups(ask["layout"], self._layout, ask["tp"], rank, self._tp_size,
                               ask["local"], ask["start"], blocks, window)
            part = [a for a in acts if a[0] == self._tp_rank and a[1] != "release" and a[2]]
            if not part:
                self._task_ended(xid, rank, None)     # nothing of this rank's in the window
                return
            _, kind, src, dst, _ = part[0]
            cache, dst_id = (self._kv, ask["kv_cache"]) if kind == "blocks" else \
                (self._rows, ask["rows_cache"])
            cfg = ldd.TransferWithCacheKeyConfig(ldd.CacheKeyByIdAndIndex(cluster, dst_id, 0))
            task = self._dd.cache_manager.transfer_cache_async(
                cache, self._clock.gate(step), [cfg], src, dst, tensor_num_per_layer=1)
        except Exception as e:  # noqa: BLE001
            self._task_ended(xid, rank, "tokens %d..%d: %s" % (window[0], window[1], e))
            return
        with self._lock:
            self._stats["layer_writes"] += 1
            if self._waiter is None:
                self._waiter = threading.Thread(target=self._wait_tasks, daemon=True,
                                                name="hixl-vllm-layers")
                self._waiter.start()
        self._tasks.put((xid, rank, task))

    def _wait_tasks(self):
        """The layer-wise writes' ends, in the order they were posted."""
        while True:
            item = self._tasks.get()
            if item is None:
                return
            xid, rank, task = item
            err = None
            try:
                task.synchronize()
            except Exception as e:  # noqa: BLE001
                err = str(e)
            self._task_ended(xid, rank, err)

    def _task_ended(self, xid, rank, err):
        with self._lock:
            st = self._lw.get(xid)
            if st is None:
                return
            st.inflight[rank] = st.inflight.get(rank, 1) - 1
            if err is not None:
                st.failed.setdefault(rank, err)
            answers = self._answerable(xid, st, [rank])
        for a in answers:
            self._submit_answer(*a)

    def _submit_answer(self, xid, rank, ok, expected):
        try:
            self._pool.submit(self._answer, xid, rank, ok, expected)
        except RuntimeError:    # shutting down: the decode's deadline ends its wait
            pass

    def _answer(self, xid, rank, ok, expected):
        """Tells decode rank `rank` whether every token of the request is in
        its blocks (after the data: every write has ended)."""
        with self._lock:
            st = self._lw.get(xid)
            cluster, address, ask = st.asks[rank][:3] if st is not None else (None, None, None)
            why = st.failed.get(rank) if st is not None else None
            first = overlap = False
            if ok:
                first, self._said_layers = not self._said_layers, True
                if self._clock.overlapped_total and not self._said_overlap:
                    overlap = self._said_overlap = True
                self._stats["pushes"] += 1
                self._stats["pushed_blocks"] += len(flat(ask["local"]))
            else:
                self._stats["push_failures"] += 1
        try:
            if cluster is None:
                return
            if not ok:
                msg = "transfer %d: request %s was not written into decode rank %d at %s: %s" % (
                    xid, st.req_id, rank, address, why or "the request was aborted here")
                _log.warning("HixlConnector: %s", msg)
                self.recent_errors.append(msg)
            if first:
                _log.info("HixlConnector rank %d: wrote request %s into decode rank %d as it "
                          "was computed (concurrent routing; once per worker)", self._tp_rank,
                          st.req_id, rank)
            if overlap:
                _log.info("HixlConnector rank %d: request %s: %d layers moved while their step "
                          "was still computing the next (layer by layer; once per worker)",
                          self._tp_rank, st.req_id, self._clock.overlapped_total)
            self._dd.cache_manager.push_blocks(
                ldd.BlocksCacheKey(cluster, c.MAILBOX_MODEL_ID), self._mailbox, [1], [1],
                tensor_num_per_layer=1, user_tag=c.answer_tag(ok, xid, self._tp_rank))
        except Exception as e:  # noqa: BLE001 -- the decode's deadline ends its wait
            _log.info("HixlConnector: answering decode rank %d for transfer %d failed (%s)",
                      rank, xid, e)
        finally:
            self._served_one(xid, rank, expected)

    def _write_failed(self, xid, rank, cluster, address, e):
        """A write into a decode rank could not be made: logged, counted, and
        the decode told (hvx1)."""
        msg = "transfer %d: writing into decode rank %d at %s failed: %s" % (
            xid, rank, address, e)
        _log.warning("HixlConnector: %s", msg)
        self.recent_errors.append(msg)
        with self._lock:
            self._stats["push_failures"] += 1
        self._refuse(xid, rank, cluster, address)

    def _served_one(self, xid, rank, expected):
        """Decode rank `rank`'s ask of transfer xid is over (written or
        refused): one write fewer in flight, and the decode rank heard from."""
        with self._lock:
            self._pushing[xid] -= 1
            if self._pushing[xid] <= 0:
                del self._pushing[xid]
        self._heard(xid, rank, expected)

    def _refuse(self, xid, rank, cluster, address):
        """Answers a decode rank that this worker will not write (best effort)."""
        try:
            self._link(address, cluster)
            self._dd.cache_manager.push_blocks(
                ldd.BlocksCacheKey(cluster, c.MAILBOX_MODEL_ID), self._mailbox, [1], [1],
                tensor_num_per_layer=1, user_tag=c.answer_tag(False, xid, self._tp_rank))
        except Exception:  # noqa: BLE001 -- the decode's deadline ends its wait
            pass

    # -- events
    def _heard(self, xid, rank, expected):
        """Prefill: decode rank `rank` is done with transfer xid (read it,
        released it, or was written to)."""
        with self._lock:
            n = self._notified.get(xid)
            if n is None:
                if len(self._notified) >= 1 << 20:
                    return              # a flood of unknown ids: the leases still free
                n = self._notified[xid] = [set(), expected, c.now()]
            n[0].add(rank)

    def _on_event(self, ev):
        if ev.kind == ldd.TransferEventKind.PUSHED:
            a = c.parse_answer_tag(ev.user_tag)
            if a is not None:
                pushed, xid, q = a
                with self._lock:
                    w = self._waits.get(xid)
                    if w is not None and q in w.asked:
                        w.answers[q] = pushed
            return
        if ev.kind != ldd.TransferEventKind.PULLED:
            return
        ask = c.parse_ask_tag(ev.user_tag)
        if ask is not None:
            self._take_ask(ask)
            return
        t = c.parse_tag(ev.user_tag)
        if t is not None:
            self._heard(*t)

    def finished(self):
        """-> (finished sending, finished receiving) since the last call."""
        t = c.now()
        sent, stale = set(), []
        with self._lock:
            for xid, (ranks, expected, first) in list(self._notified.items()):
                if xid in self._sending and len(ranks) >= expected and \
                        not self._pushing.get(xid):
                    sent.add(self._sending.pop(xid)[0])
                    self._lw.pop(xid, None)
                    del self._notified[xid]
                elif t - first > self._opts["lease_ms"] / 1000.0 + 60:
                    del self._notified[xid]  # a read of a request never sent here
            for xid, (req_id, expires_at, _) in list(self._sending.items()):
                if t >= expires_at and not self._pushing.get(xid):
                    del self._sending[xid]
                    self._lw.pop(xid, None)
                    sent.add(req_id)
                    self._stats["lease_expiries"] += 1
                    _log.warning("HixlConnector: request %s: no decode read its KV before its "
                                 "lease ended; its blocks are freed", req_id)
            for xid in [x for x in self._served if x not in self._sending]:
                del self._served[xid]
            lease = self._opts["lease_ms"] / 1000.0
            for xid in [x for x, a in self._early.items() if t - a[0][1] > lease]:
                stale += self._early.pop(xid)     # never heard of here: refused
            for xid, st in list(self._lw.items()):
                if st.dropped and not self._pushing.get(xid) and xid not in self._sending:
                    del self._lw[xid]
            for xid in [x for x, d in self._dropped.items() if t - d > lease]:
                del self._dropped[xid]
            self._settle_waits(t)
            recv, self._done_recv = self._done_recv, set()
            arrived = [self._to_device.pop(r) for r in recv if r in self._to_device]
        for ask, _ in stale:
            try:
                self._pool.submit(self._refuse, ask[0], ask[1], ask[4], ask[5])
            except RuntimeError:
                pass
        # Host staging: what arrived goes to the device before vLLM hears of it.
        self._stage(sorted({b for blocks in arrived for b in blocks}), "h2d")
        return sent, recv

    def failed_recv(self):
        with self._lock:
            out, self._failed_recv = self._failed_recv, set()
        return out

    def load_errors(self):
        with self._lock:
            out, self._bad_blocks = self._bad_blocks, set()
        return out

    def take_stats(self):
        if self._clock is not None:
            n = self._clock.take_overlapped()
            with self._lock:
                self._stats["layers_overlapped"] += n
        with self._lock:
            out = dict(self._stats)
            for k in self._stats:
                self._stats[k] = 0
        return out

    def pending_sends(self):
        with self._lock:
            return len(self._sending)

    def shutdown(self):
        if self._closed:
            return
        self._closed = True
        if self._clock is not None:
            self._clock.close()       # gates still waiting give up
        self._pool.shutdown(wait=True, cancel_futures=True)
        try:
            self._dd.cache_manager.set_transfer_callback(None)
        finally:
            self._dd.finalize()
            if self._waiter is not None:
                self._tasks.put(None)
                self._waiter.join(timeout=30)
