"""SGLang's transfer backend classes for the name "hixl" (imports SGLang).

The manager of each prefill and decode rank owns one hixl engine and registers
the rank's KV buffers and metadata (aux) buffers with it once. A decode rank
tells each prefill rank it reads from where its buffers are (a registration,
once) and, per request, which of its pages receive the prompt's KV (over the
ZMQ socket SGLang's common code already gives every rank). The prefill then
writes each chunk into those pages as the scheduler calls send(), one hixl
write per decode rank and chunk with every layer's page runs in it; the last
chunk's write also carries the request's metadata row and a notification that
hixl delivers after the data. The decode marks the request Success when that
notification arrives. Failures travel over ZMQ as SGLang's KV_STATUS messages.

A decode that aborts a request tells the prefill (SGLang's ABORT); the prefill
cancels that request's writes in flight -- hixl's cancel returns once nothing
more of it can land -- and, when the decode asked for it (deferred KV release),
answers that the request has drained.

Threads: SGLang's scheduler calls the sender, receiver and manager; the manager
adds a ZMQ reader (bootstrap thread on the prefill, listener on the decode),
transfer workers on the prefill, hixl's notification thread and SGLang's
heartbeat checker on the decode. The room tables are SGLang's, guarded as
SGLang guards them for its own backends.
"""
import logging
import os
import queue
import threading
import time

import hixl
import numpy as np
from sglang.srt.disaggregation.base.conn import KVArgs, KVPoll
from sglang.srt.disaggregation.common.conn import (ABORT_TAG, AbortNotification,
                                                   CommonKVBootstrapServer, CommonKVManager,
                                                   CommonKVReceiver, CommonKVSender)
from sglang.srt.disaggregation.utils import DisaggregationMode

from . import _descs, _wire

_log = logging.getLogger("hixl.sglang")

__all__ = ["HixlKVManager", "HixlKVSender", "HixlKVReceiver", "HixlKVBootstrapServer", "KVArgs"]

_TRANSPORTS = ("AUTO", "SHM", "TCP", "UCX")


def _env_int(name, default, lo, hi):
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        n = int(v)
    except ValueError:
        raise ValueError("%s=%r is not an integer" % (name, v)) from None
    if not lo <= n <= hi:
        raise ValueError("%s=%d is outside [%d, %d]" % (name, n, lo, hi))
    return n


class _Chunk:
    __slots__ = ("room", "pages", "index_slice", "is_last", "aux_index", "wait_event")

    def __init__(self, room, pages, index_slice, is_last, aux_index, wait_event):
        self.room, self.pages, self.index_slice = room, pages, index_slice
        self.is_last, self.aux_index, self.wait_event = is_last, aux_index, wait_event


class _Aborted(Exception):
    pass


class HixlKVManager(CommonKVManager):
    """One rank's hixl engine and its registered buffers (prefill or decode).

    Environment: SGLANG_HIXL_TRANSPORT (auto, shm, tcp, ucx; default auto:
    shared memory on one host), SGLANG_HIXL_TRANSFER_TIMEOUT_MS (a write's
    deadline, default 30000), SGLANG_HIXL_WORKERS (prefill transfer threads,
    default 2), SGLANG_HIXL_AUTH_SECRET_FILE (hixl's shared-secret
    authentication, the same file on every rank), SGLANG_HIXL_METADATA_SERVER
    (etcd://host:port,...: engines published and reached by name; with
    SGLANG_HIXL_METADATA_PREFIX)."""

    kv_status_msg_tag = b"KV_STATUS"
    kv_status_msg_carries_reason = True
    supports_deferred_decode_kv_release = True

    def __init__(self, args, disaggregation_mode, server_args, is_mla_backend=False):
        super().__init__(args, disaggregation_mode, server_args, is_mla_backend)
        if any(any(p) for p in (getattr(args, "state_data_ptrs", None) or [])):
            raise NotImplementedError(
                "the hixl transfer backend moves KV and metadata buffers; models with extra "
                "state (mamba, SWA or DSA state buffers) are not supported yet")
        transport = os.environ.get("SGLANG_HIXL_TRANSPORT", "auto").upper()
        if transport not in _TRANSPORTS:
            raise ValueError("SGLANG_HIXL_TRANSPORT=%s: one of %s"
                             % (transport.lower(), ", ".join(t.lower() for t in _TRANSPORTS)))
        self._timeout_ms = _env_int("SGLANG_HIXL_TRANSFER_TIMEOUT_MS", 30000, 1, 1 << 30)
        opts = {hixl.options.LINK_TYPE: transport}
        secret = os.environ.get("SGLANG_HIXL_AUTH_SECRET_FILE")
        if secret:
            opts[hixl.options.AUTH_SECRET_FILE] = secret
        etcd = os.environ.get("SGLANG_HIXL_METADATA_SERVER")
        name = None
        if etcd:
            # Published in etcd under a name (unique per host and process: the
            # ZMQ port); peers reach it by that name, generation checked.
            name = "sglang-%s-%s-%d" % (disaggregation_mode.value, self.local_ip, self.rank_port)
            opts[hixl.options.METADATA_SERVER] = etcd
            opts[hixl.options.ENGINE_NAME] = name
            prefix = os.environ.get("SGLANG_HIXL_METADATA_PREFIX")
            if prefix:
                opts[hixl.options.METADATA_PREFIX] = prefix
        self.engine = hixl.Hixl()
        self.engine.initialize("%s:0" % self.local_ip, opts)
        self.engine_address = name or self.engine.local_engine()
        self._handles = []
        self._kv_pages = min((n // i for n, i in zip(args.kv_data_lens, args.kv_item_lens)),
                             default=0)
        decode = disaggregation_mode == DisaggregationMode.DECODE
        perms = hixl.MEM_PERM_WRITE if decode else hixl.MEM_PERM_NONE
        for ptr, n in zip(list(args.kv_data_ptrs) + list(args.aux_data_ptrs),
                          list(args.kv_data_lens) + list(args.aux_data_lens)):
            if n:
                self._handles.append(self._register(ptr, n, perms, share=decode))
        self._lock = threading.Lock()
        if disaggregation_mode == DisaggregationMode.PREFILL:
            self._connected = set()
            self._inflight = {}        # room -> {hixl request}
            n = _env_int("SGLANG_HIXL_WORKERS", 2, 1, 64)
            self.transfer_queues = [queue.Queue() for _ in range(n)]
            for i, q in enumerate(self.transfer_queues):
                threading.Thread(target=self._transfer_worker, args=(q,), daemon=True,
                                 name="hixl-sgl-send-%d" % i).start()
            threading.Thread(target=self._bootstrap_thread, daemon=True,
                             name="hixl-sgl-bootstrap").start()
        else:
            self.engine.set_notify_callback(self._on_notify)
            threading.Thread(target=self._listener_thread, daemon=True,
                             name="hixl-sgl-listen").start()
            self._start_heartbeat_checker_thread()
        _log.info("hixl %s rank %d: engine %s, %d KV and %d metadata buffers registered",
                  disaggregation_mode.value, args.engine_rank, self.engine_address,
                  len(args.kv_data_ptrs), len(args.aux_data_ptrs))

    def _register(self, ptr, n, perms, share):
        mem = hixl.MemDesc(int(ptr), int(n))
        flags = hixl.REGISTER_SHARE_BY_MAPPING if share else hixl.REGISTER_DEFAULT
        try:
            return self.engine.register_mem(mem, type=hixl.MemType.MEM_HOST, perms=perms,
                                            flags=flags)
        except hixl.HixlError as host_error:
            # CUDA memory (the engine asks the driver when one is loaded).
            try:
                return self.engine.register_mem(mem, type=hixl.MemType.MEM_DEVICE, perms=perms)
            except hixl.HixlError as device_error:
                raise RuntimeError("hixl cannot register the buffer at 0x%x (+%d) as host "
                                   "memory (%s) nor as device memory (%s)"
                                   % (ptr, n, host_error, device_error)) from None

    # -- decode side: what a receiver sends
    def build_receiver_registration_message(self):
        a = self.kv_args
        return _wire.encode_registration(
            engine=self.engine_address, rank_ip=self.local_ip, rank_port=self.rank_port,
            tp_size=self.attn_tp_size, tp_rank=a.engine_rank, kv_ptrs=a.kv_data_ptrs,
            kv_lens=a.kv_data_lens, kv_item_lens=a.kv_item_lens, aux_ptrs=a.aux_data_ptrs,
            aux_lens=a.aux_data_lens, aux_item_lens=a.aux_item_lens, page_size=a.page_size)

    def build_receiver_metadata_message(self, *, bootstrap_room, required_dst_info_num,
                                        kv_indices, aux_index, state_indices, decode_prefix_len,
                                        is_dummy, device_kv_indices=None):
        return _wire.encode_request(
            room=bootstrap_room, engine=self.engine_address, kv_indices=kv_indices,
            aux_index=aux_index, required_dst_info_num=required_dst_info_num,
            decode_prefix_len=decode_prefix_len, is_dummy=is_dummy, rank_ip=self.local_ip,
            rank_port=self.rank_port)

    def _listener_thread(self):
        while True:
            msg = self.server_socket.recv_multipart()
            try:
                if self.handle_abort_ack_message(msg):
                    continue
                parsed = self.parse_kv_status_message(msg)
                if parsed is None:
                    _log.warning("hixl decode: dropped a control message tagged %r", msg[:1])
                    continue
                room, status, rank, reason = parsed
                self.apply_prefill_status(bootstrap_room=room, status=status,
                                          prefill_rank=rank, failure_reason=reason)
            except Exception:  # noqa: BLE001 -- one bad message must not stop the thread
                _log.exception("hixl decode: a control message failed")

    def _on_notify(self, note):
        if note.name != _wire.NOTIFY_NAME:
            return
        done = _wire.parse_done(note.msg)
        if done is None:
            _log.warning("hixl decode: a malformed completion from %s", note.sender)
            return
        self.apply_prefill_status(bootstrap_room=done[0], status=KVPoll.Success,
                                  prefill_rank=done[1])

    # -- prefill side: what the decode ranks send
    def _bootstrap_thread(self):
        recv = self._make_worker_recv(self.server_socket)  # SGLang's own messages first
        while True:
            msg = recv()
            if msg is None:
                continue
            try:
                self._on_control(msg)
            except _wire.WireError as e:
                _log.warning("hixl prefill: refused a control message: %s", e)
            except Exception:  # noqa: BLE001
                _log.exception("hixl prefill: a control message failed")

    def _on_control(self, msg):
        if not msg:
            raise _wire.WireError("an empty message")
        if msg[0] == ABORT_TAG:
            self._on_abort(msg)
        elif msg[0] == _wire.REG_TAG:
            reg = _wire.parse_registration(msg)
            with self._lock:
                self.decode_kv_args_table[reg.engine] = reg
            self.check_peer_aux_buffer_count(reg.engine, len(reg.aux_ptrs))
        elif msg[0] == _wire.REQ_TAG:
            q = _wire.parse_request(msg)
            infos = self.transfer_infos.setdefault(q.room, {})
            infos[q.engine] = q
            if len(infos) == q.required_dst_info_num:
                self.resolve_kv_replica_factor(infos)
                self.req_to_decode_prefix_len[q.room] = next(
                    (i.decode_prefix_len for i in infos.values() if i.decode_prefix_len), 0)
                self.update_status(q.room, KVPoll.WaitingForInput)
        else:
            raise _wire.WireError("unknown tag %r" % bytes(msg[0][:32]))

    def _on_abort(self, msg):
        note = AbortNotification.from_zmq(msg)
        if note is None:
            return
        room = note.room
        if room in self.request_status and self.check_status(room) != KVPoll.Success:
            self.record_failure(room, "Aborted by decode-side abort notification.")
            self.update_status(room, KVPoll.Failed)
        self._cancel_room(room)
        if self.enable_deferred_decode_kv_release:
            target = note.deferred_ack_target()
            if target is not None:
                self.register_deferred_ack_target(room, target)
                self._maybe_ack_drained_abort(room)

    def _cancel_room(self, room):
        with self._lock:
            reqs = list(self._inflight.get(room, ()))
        for req in reqs:     # returns once nothing more of the write can land
            try:
                self.engine.cancel_transfer(req)
            except hixl.HixlError:
                pass         # it ended on its own meanwhile

    def add_transfer_request(self, bootstrap_room, kv_indices, index_slice, is_last_chunk,
                             aux_index=None, state_indices=None, num_kv_tokens=None, *,
                             wait_event=None, indices_event=None, trace_ctx=None):
        assert self.disaggregation_mode == DisaggregationMode.PREFILL
        if is_last_chunk and aux_index is None:
            raise ValueError("the last chunk of a request carries its metadata row (aux_index)")
        infos = self.transfer_infos.get(bootstrap_room)
        if not infos:
            return None          # a dummy rank, or the request was cleared
        # One queue per decode endpoint set: a request's chunks stay in order.
        shard = sum(i.dst_port for i in infos.values()) % len(self.transfer_queues)
        self.transfer_queues[shard].put(_Chunk(bootstrap_room, kv_indices, index_slice,
                                               is_last_chunk, aux_index, wait_event))
        return None

    def _transfer_worker(self, q):
        while True:
            chunk = q.get()
            room = chunk.room
            self._staging_outstanding[room] += 1
            try:
                self._send_chunk(chunk)
            except _Aborted:
                pass
            except Exception as e:  # noqa: BLE001 -- reported to both sides as Failed
                _log.warning("hixl prefill: request %s failed: %s", room, e)
                self.conclude_failure(bootstrap_room=room, failure_reason="hixl: %s" % e)
            finally:
                self._staging_outstanding[room] -= 1
                if self._staging_outstanding[room] <= 0:
                    self._staging_outstanding.pop(room, None)
                if self.enable_deferred_decode_kv_release:
                    self._maybe_ack_drained_abort(room)

    def _send_chunk(self, chunk):
        room = chunk.room
        if room not in self.request_status or self.check_status(room) == KVPoll.Failed:
            return
        infos = self.transfer_infos.get(room)
        if not infos:
            return
        if chunk.wait_event is not None:
            chunk.wait_event.synchronize()  # SGLang's early send: the KV is still being computed
        self.update_status(room, KVPoll.Transferring)
        for info in list(infos.values()):
            if info.is_dummy:
                continue
            with self._lock:
                peer = self.decode_kv_args_table.get(info.engine)
            if peer is None:
                raise RuntimeError("decode rank %s asked for request %d without registering"
                                   % (info.engine, room))
            descs = self._kv_descs(peer, chunk.pages, info.kv_indices[chunk.index_slice])
            notify = None
            if chunk.is_last:
                if info.aux_index < 0:
                    raise RuntimeError("decode rank %s gave request %d no metadata row"
                                       % (info.engine, room))
                aux = self._aux_descs(peer, chunk.aux_index, info.aux_index)
                descs = np.concatenate((descs, aux)) if len(descs) else aux
                notify = (_wire.NOTIFY_NAME, _wire.encode_done(room, self._prefill_unique_rank()))
            if len(descs) or notify:
                self._write(room, peer.engine, np.ascontiguousarray(descs), notify)
        if chunk.is_last and self.check_status(room) != KVPoll.Failed:
            self.update_status(room, KVPoll.Success)

    def _kv_descs(self, peer, src_pages, dst_pages):
        a = self.kv_args
        if len(src_pages) == 0 or not a.kv_data_ptrs:
            return _descs.EMPTY
        if len(dst_pages) < len(src_pages):
            raise RuntimeError("the decode gave %d pages for a chunk of %d"
                               % (len(dst_pages), len(src_pages)))
        dst_pages = np.asarray(dst_pages[:len(src_pages)])
        _descs.check_pages(src_pages, self._kv_pages, "prefill")
        dst_cap = getattr(peer, "_kv_pages", None)
        if dst_cap is None:
            dst_cap = peer._kv_pages = min(peer.kv_pages(i) for i in range(len(peer.kv_ptrs)))
        _descs.check_pages(dst_pages, dst_cap, "decode")
        pairs = self._whole_page_pairs(peer)
        if pairs is not None:
            return _descs.buffer_descs(pairs, src_pages, dst_pages)
        blocks = self._get_mha_head_slice_blocks(a.kv_data_ptrs, a.kv_item_lens, peer.kv_ptrs,
                                                 peer.kv_item_lens, src_pages, dst_pages,
                                                 peer.tp_size, peer.tp_rank)
        return _descs.merge_blocks(blocks)

    def _whole_page_pairs(self, peer):
        """(src_ptr, dst_ptr, item_len) of every buffer pair when pages move
        whole (MLA, or equal TP), as an array kept with the peer's
        registration; None when heads are sliced."""
        cached = getattr(peer, "_pairs", None)
        if cached is not None:
            return cached[0]
        a = self.kv_args
        if self.is_mla_backend or self.is_hybrid_mla_backend:
            src, dst, _ = self.get_mla_kv_ptrs_with_pp(a.kv_data_ptrs, peer.kv_ptrs)
            ls, ld, _ = self.get_mla_kv_ptrs_with_pp(a.kv_item_lens, peer.kv_item_lens)
            pairs = np.array(self._pairs(src, dst, ls, ld), dtype=np.uint64)
        elif peer.tp_size == self.attn_tp_size:
            sk, sv, dk, dv, _ = self.get_mha_kv_ptrs_with_pp(a.kv_data_ptrs, peer.kv_ptrs)
            lk, lv, dlk, dlv, _ = self.get_mha_kv_ptrs_with_pp(a.kv_item_lens, peer.kv_item_lens)
            pairs = np.array(self._pairs(sk + sv, dk + dv, lk + lv, dlk + dlv),
                                    dtype=np.uint64)
        else:
            pairs = None
        peer._pairs = (pairs,)
        return pairs

    @staticmethod
    def _pairs(src, dst, src_lens, dst_lens):
        if len(src) != len(dst):
            raise RuntimeError("%d KV buffers here, %d at the decode" % (len(src), len(dst)))
        out = []
        for s, d, ls, ld in zip(src, dst, src_lens, dst_lens):
            if ls != ld:
                raise RuntimeError("KV pages of %d bytes here, %d at the decode (the same "
                                   "model, page size, dtype and TP are needed)" % (ls, ld))
            out.append((s, d, ls))
        return out

    def _aux_descs(self, peer, src_index, dst_index):
        a = self.kv_args
        n = min(len(a.aux_data_ptrs), len(peer.aux_ptrs))
        for i in range(n):
            if dst_index >= peer.aux_rows(i):
                raise RuntimeError("metadata row %d is outside the decode's %d rows"
                                   % (dst_index, peer.aux_rows(i)))
            if src_index >= a.aux_data_lens[i] // a.aux_item_lens[i]:
                raise RuntimeError("metadata row %d is outside this rank's buffer" % src_index)
        return _descs.aux_descs(a.aux_data_ptrs[:n], a.aux_item_lens[:n], src_index,
                                peer.aux_ptrs[:n], peer.aux_item_lens[:n], dst_index)

    def _link(self, engine):
        if engine in self._connected:
            return
        self.engine.connect(engine, timeout_ms=min(self._timeout_ms, 10000))
        with self._lock:
            self._connected.add(engine)

    def _write(self, room, engine, descs, notify):
        try:
            self._link(engine)
            req = self.engine.transfer_async(engine, hixl.TransferOp.WRITE, descs,
                                             timeout_ms=self._timeout_ms, notify=notify)
        except hixl.HixlError:
            with self._lock:
                self._connected.discard(engine)  # connect again next time
            raise
        with self._lock:
            self._inflight.setdefault(room, set()).add(req)
        try:
            if self.check_status(room) == KVPoll.Failed:   # an abort came first
                self.engine.cancel_transfer(req)
            pause = 0.00005
            while True:
                st, _, why = self.engine.get_transfer_status(req, with_reason=True)
                if st == hixl.TransferStatus.COMPLETED:
                    return
                if st == hixl.TransferStatus.CANCELLED:
                    raise _Aborted()
                if st != hixl.TransferStatus.WAITING:
                    with self._lock:
                        self._connected.discard(engine)
                    raise RuntimeError("the write into %s ended %s: %s" % (engine, st.name, why))
                time.sleep(pause)
                pause = min(pause * 2, 0.002)
        finally:
            with self._lock:
                s = self._inflight.get(room)
                if s is not None:
                    s.discard(req)
                    if not s:
                        del self._inflight[room]

    def teardown(self):
        raise NotImplementedError("the hixl transfer backend does not switch roles")


class HixlKVSender(CommonKVSender):
    def abort(self):
        """Fails the request here, stops its writes in flight and tells the
        decode ranks at once (they would otherwise wait for their timeout)."""
        super().abort()
        mgr = self.kv_mgr
        mgr._cancel_room(self.bootstrap_room)
        mgr.conclude_failure(bootstrap_room=self.bootstrap_room,
                             failure_reason="Aborted by the prefill")


class HixlKVReceiver(CommonKVReceiver):
    pass


class HixlKVBootstrapServer(CommonKVBootstrapServer):
    pass
