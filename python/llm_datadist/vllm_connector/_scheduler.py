"""The scheduler side of HixlConnector: which requests read their prompt's
KV from a prefill instance (decode), which prefill requests keep their blocks
until a decode read them (prefill), and the kv_transfer_params between them.

The protocol follows vLLM's P/D convention (the keys NIXL's connector uses,
so the same proxies route requests): a request sent to prefill carries
{"do_remote_decode": true}; its answer carries kv_transfer_params with
"do_remote_prefill": true, remote_block_ids, remote_engine_id,
remote_request_id, remote_host, remote_port, and a "hixl" entry (the prefill
workers' engine addresses and cluster ids, a transfer id, the lease's end and
the KV layout); the proxy hands them to decode with the same prompt.

Concurrent routing: a proxy that knows the prefill's "hixl" entry (from an
earlier answer) sends the request to both instances at once, with a transfer
id of its own -- {"do_remote_decode": true, "hixl_xid": N} to the prefill and
the entry with "xid": N and "concurrent": true to the decode. The decode asks
as soon as it allocated its blocks, and the prefill writes each step's
tokens layer by layer as it computes them (the worker's reqs_to_push)."""
import logging
import secrets

from . import _common as c
from ._plan import NULL_BLOCK, flat

_log = logging.getLogger(c.LOGGER)


class Scheduler:
    def __init__(self, opts, engine_id, block_size, tp_size, full_group=0):
        self._opts = opts
        self._full_group = full_group   # a KV cache group of full attention (its hits count)
        self._engine_id = engine_id
        self._block_size = block_size
        self._tp_size = tp_size
        self._ranks = None        # [(address, cluster id)] by tp rank, from the workers
        self._layout = None
        self._recv = {}           # this step: request id -> (spec, local blocks per KV cache
                                  # group, the token they start at, whether vLLM waits)
        self._send = {}           # this step: request id -> (xid, expires_at)
        self._specs = {}          # request id -> RemoteSpec, between matching and allocation
        self._bad = set()         # request ids whose kv_transfer_params were refused
        self._staged = False      # the workers keep the KV in a device, transfer a host copy
        self._tables = {}         # staged: request id -> [its blocks per group, prompt length,
                                  # tokens copied to host] for requests a decode will take
        self._lw = {}             # concurrent: request id -> [its blocks per group, prompt
                                  # length, tokens handed to the workers, transfer id]
        self._xids = {}           # concurrent: transfer id -> request id, while in use
        self._drop = []           # this step: transfer ids of concurrent requests aborted

    def set_handshake(self, metadata):
        """metadata: {tp rank: handshake dict} from every worker."""
        ranks = sorted(metadata)
        if ranks != list(range(self._tp_size)):
            raise ValueError("HixlConnector: handshake metadata for ranks %s, expected 0..%d"
                             % (ranks, self._tp_size - 1))
        self._ranks = [[metadata[r]["address"], metadata[r]["cluster_id"]] for r in ranks]
        self._layout = metadata[0]["layout"]
        self._staged = bool(metadata[0].get("host_buffer"))

    def _spec(self, request):
        """The RemoteSpec of a decode request, None when it has none (or an
        unusable one: then it is computed here, and the reason logged once)."""
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill"):
            return None
        rid = request.request_id
        if rid in self._specs:
            return self._specs[rid]
        if rid in self._bad:
            return None
        try:
            spec = c.RemoteSpec.parse(params)
        except ValueError as e:
            self._bad.add(rid)
            _log.warning("HixlConnector: request %s: unusable kv_transfer_params (%s); its "
                         "prompt is computed here", rid, e)
            return None
        self._specs[rid] = spec
        return spec

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        spec = self._spec(request)
        if spec is None:
            return 0, False
        # Every prompt token the prefill computed; vLLM computes the last one
        # again here, to sample the next.
        count = len(request.prompt_token_ids or ()) - num_computed_tokens
        if count > 0:
            return count, True
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        params = request.kv_transfer_params
        if params and params.get("do_remote_decode") and self._staged:
            # Its blocks come with the step's scheduler output.
            self._tables[request.request_id] = [None, len(request.prompt_token_ids or ()), 0]
        if params and params.get("do_remote_decode") and "hixl_xid" in params and \
                request.request_id not in self._lw:
            self._concurrent(request, params["hixl_xid"])
        if not params or not params.get("do_remote_prefill"):
            return
        spec = self._spec(request)
        params["do_remote_prefill"] = False   # one read per request
        self._specs.pop(request.request_id, None)
        self._bad.discard(request.request_id)
        if spec is None:
            return
        # The local prefix cache covers the first blocks (hashed, in a
        # full-attention group); the others, in every KV cache group, are
        # filled from the prefill's blocks holding the same tokens (_plan
        # pairs them). With none to fill, the read only releases the
        # prefill's blocks and vLLM does not wait for it.
        full = blocks.blocks[min(self._full_group, len(blocks.blocks) - 1)]
        cached = 0
        while cached < len(full) and full[cached].block_hash is not None and \
                not full[cached].is_null:
            cached += 1
        local = [list(g[cached:]) for g in blocks.get_block_ids()] \
            if num_external_tokens > 0 else [[] for _ in blocks.blocks]
        report = bool(flat(local))
        self._recv[request.request_id] = (spec, local, cached * self._block_size, report)

    def _concurrent(self, request, xid):
        rid = request.request_id
        if not c.transfer_id(xid):
            _log.warning("HixlConnector: request %s: hixl_xid %r is not a transfer id; its KV "
                         "waits for the decode's ask after the prefill", rid, xid)
            return
        if xid in self._xids:
            _log.warning("HixlConnector: request %s: transfer id %d is taken by request %s; "
                         "its KV is not written while it is computed", rid, xid,
                         self._xids[xid])
            return
        self._xids[xid] = rid
        self._lw[rid] = [None, len(request.prompt_token_ids or ()), 0, xid]

    @staticmethod
    def _steps(tables, so):
        """[(request id, its table, first token, end token)] of this step's
        requests in tables: what they computed, from token 0 on the first
        time (blocks the prefix cache supplied were computed earlier)."""
        steps = [(r.req_id, r.block_ids, r.num_computed_tokens, False)
                 for r in so.scheduled_new_reqs]
        cr = so.scheduled_cached_reqs
        steps += [(rid, cr.new_block_ids[i], cr.num_computed_tokens[i],
                   rid in cr.resumed_req_ids) for i, rid in enumerate(cr.req_ids)]
        out = []
        for rid, new, start, resumed in steps:
            t = tables.get(rid)
            if t is None:
                continue
            if new is not None:
                if resumed:
                    t[2] = 0          # preempted: its blocks are new ones
                if resumed or t[0] is None:
                    t[0] = [list(g) for g in new]
                else:
                    t[0] = [a + list(b) for a, b in zip(t[0], new)]
            end = min(start + so.num_scheduled_tokens.get(rid, 0), t[1])
            if end > t[2] and t[0] and any(t[0]):
                out.append((rid, t, t[2], end))
                t[2] = end
        return out

    def build_meta(self, so=None):
        """-> (reads to start, requests to hold, blocks to copy to host). With
        staging, the prompt blocks of a request a decode will take are copied
        to host as steps compute them (wait_for_save), before vLLM can hand
        out its kv_transfer_params -- from token 0 on: blocks the prefix
        cache supplied were computed earlier, for another request."""
        save, push = {}, {}
        if self._tables and so is not None:
            for rid, t, t0, t1 in self._steps(self._tables, so):
                # Every KV cache group's blocks holding those tokens (a hybrid
                # model's groups overlay the same memory; the null block is none).
                lo, hi = t0 // self._block_size, (t1 - 1) // self._block_size + 1
                save[rid] = sorted({b for g in t[0] for b in g[lo:hi] if b != NULL_BLOCK})
        if self._lw and so is not None:
            # Concurrent: the workers write tokens t0..t1 of each layer as
            # the step computes it, into the decode blocks it asked for.
            for rid, t, t0, t1 in self._steps(self._lw, so):
                push[rid] = (t[3], [list(g) for g in t[0]], t0, t1, t[1])
        out = (self._recv, self._send, save, push, self._drop)
        self._recv, self._send, self._drop = {}, {}, []
        return out

    def request_finished(self, request, block_ids):
        """block_ids: the request's blocks, one list per KV cache group."""
        from vllm.v1.request import RequestStatus
        params = request.kv_transfer_params
        rid = request.request_id
        self._tables.pop(rid, None)
        lw = self._lw.pop(rid, None)
        if lw is not None:
            self._xids.pop(lw[3], None)
        if not params:
            return False, None
        if params.get("do_remote_prefill"):
            # Finished (aborted) before its blocks were allocated: nothing to
            # read, but the prefill's blocks are released now.
            spec = self._spec(request)
            params["do_remote_prefill"] = False
            self._specs.pop(rid, None)
            self._bad.discard(rid)
            if spec is not None:
                self._recv[rid] = (spec, [[] for _ in spec.block_ids], 0, False)
            return False, None
        if not params.get("do_remote_decode"):
            return False, None
        cxid = lw[3] if lw is not None else params.get("hixl_xid")
        if request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED,
                                  RequestStatus.FINISHED_STOPPED):
            if c.transfer_id(cxid):  # a decode may ask (or have asked): it is refused
                self._drop.append(cxid)
            return False, None    # aborted prefill: no decode will ask for it
        groups = [list(g) for g in block_ids]
        if not flat(groups):
            if c.transfer_id(cxid):
                self._drop.append(cxid)
            return False, None
        if self._ranks is None:
            _log.warning("HixlConnector: request %s: no worker handshake yet; its KV is not "
                         "offered to a decode", rid)
            return False, None
        # Concurrent: the proxy's transfer id, which the decode asks by.
        xid = lw[3] if lw is not None else secrets.randbits(62)
        expires_at = c.now() + self._opts["lease_ms"] / 1000.0
        self._send[rid] = (xid, expires_at, groups)
        host, _, port = self._ranks[0][0].rpartition(":")
        return True, {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            # One list (as vLLM's P/D convention has it), or one per group.
            "remote_block_ids": groups[0] if len(groups) == 1 else groups,
            "remote_engine_id": self._engine_id,
            "remote_request_id": rid,
            "remote_host": host,
            "remote_port": int(port),
            "remote_num_tokens": len(request.prompt_token_ids or ()),
            "hixl": {"v": c.PARAMS_VERSION, "ranks": [list(r) for r in self._ranks],
                     "xid": xid, "expires_at": expires_at, "block_size": self._block_size,
                     "tp_size": self._tp_size, "layout": self._layout,
                     "xfer_ms": self._opts["transfer_timeout_ms"],
                     "lease_ms": self._opts["lease_ms"]},
        }
