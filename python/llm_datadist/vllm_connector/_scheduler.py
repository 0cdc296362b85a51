"""The scheduler side of HixlConnector: which requests read their prompt's
KV from a prefill instance (decode), which prefill requests keep their blocks
until a decode read them (prefill), and the kv_transfer_params between them.

The protocol follows vLLM's P/D convention (the keys NIXL's connector uses,
so the same proxies route requests): a request sent to prefill carries
{"do_remote_decode": true}; its answer carries kv_transfer_params with
"do_remote_prefill": true, remote_block_ids, remote_engine_id,
remote_request_id, remote_host, remote_port, and a "hixl" entry (the prefill
workers' engine addresses and cluster ids, a transfer id, the lease's end and
the KV layout); the proxy hands them to decode with the same prompt."""
import logging
import secrets

from . import _common as c
from ._plan import flat

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
        self._tables = {}         # staged: request id -> [its blocks, prompt length, tokens
                                  # copied to host] for requests a decode will take

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

    def build_meta(self, so=None):
        """-> (reads to start, requests to hold, blocks to copy to host). With
        staging, the prompt blocks of a request a decode will take are copied
        to host as steps compute them (wait_for_save), before vLLM can hand
        out its kv_transfer_params -- from token 0 on: blocks the prefix
        cache supplied were computed earlier, for another request."""
        save = {}
        if self._tables and so is not None:
            steps = [(r.req_id, r.block_ids, r.num_computed_tokens, False)
                     for r in so.scheduled_new_reqs]
            cr = so.scheduled_cached_reqs
            steps += [(rid, cr.new_block_ids[i], cr.num_computed_tokens[i],
                       rid in cr.resumed_req_ids) for i, rid in enumerate(cr.req_ids)]
            for rid, new, start, resumed in steps:
                t = self._tables.get(rid)
                if t is None:
                    continue
                if new is not None:
                    if resumed:
                        t[2] = 0          # preempted: its blocks are new ones
                    t[0] = list(new[0]) if resumed or t[0] is None else t[0] + list(new[0])
                end = min(start + so.num_scheduled_tokens.get(rid, 0), t[1])
                if end > t[2] and t[0]:
                    save[rid] = t[0][t[2] // self._block_size:(end - 1) // self._block_size + 1]
                    t[2] = end
        out = (self._recv, self._send, save)
        self._recv, self._send = {}, {}
        return out

    def request_finished(self, request, block_ids):
        """block_ids: the request's blocks, one list per KV cache group."""
        from vllm.v1.request import RequestStatus
        params = request.kv_transfer_params
        rid = request.request_id
        self._tables.pop(rid, None)
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
        if request.status not in (RequestStatus.FINISHED_LENGTH_CAPPED,
                                  RequestStatus.FINISHED_STOPPED):
            return False, None    # aborted prefill: no decode will ask for it
        groups = [list(g) for g in block_ids]
        if not flat(groups):
            return False, None
        if self._ranks is None:
            _log.warning("HixlConnector: request %s: no worker handshake yet; its KV is not "
                         "offered to a decode", rid)
            return False, None
        xid = secrets.randbits(62)
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
                     "xfer_ms": self._opts["transfer_timeout_ms"]},
        }
