"""Layer-wise writes of concurrent routing: the prefill writes each step's
tokens into the decode's blocks layer by layer while the step computes them.

vLLM calls the worker role's save_kv_layer(name) once a layer's KV of the
step is in place and wait_for_save() once the forward is over. A LayerClock
counts the steps and the layers saved in the current one; each write of a
step is one LLM-DataDist layer-wise push (transfer_cache_async), whose gate
lets region i move once every layer owning it was saved in that step -- so
the write of layer i overlaps the compute of layer i + 1. A region shared by
the layers of several KV cache groups (a hybrid model) opens once all of
them were saved; the one region of a block-outer cache, at the end of the
step. The gates are LLM-DataDist's LayerGates, which the task's thread waits
for without the GIL: the thread running the forward holds it most of the
time, and a Python gate would let each layer move only when that thread
next let go of it. With the KV in a CUDA device, each save records an event
on the current stream and a Python gate (Gate) waits for it before the
layer moves.

A Stream is the state of one request's concurrent writes: the decode ranks
that asked (their asks parsed), the writes in flight per rank, and whether
every token has been handed to a write (then each rank is answered once its
writes ended)."""
import threading

import llm_datadist as ldd


class LayerClock:
    """Steps and the layers saved in the current one (thread-safe)."""

    def __init__(self, owners, cuda=False):
        """owners: for each LLM-DataDist layer (a KV region), the set of
        vLLM layer names that write it."""
        self._owners = [frozenset(o) for o in owners]
        self._names = frozenset(n for o in owners for n in o)
        self._regions = {n: [i for i, o in enumerate(self._owners) if n in o]
                         for n in self._names}
        self._cuda = cuda
        self._cv = threading.Condition()
        self._step = 0            # the step in progress (or the last one begun)
        self._ended = 0           # the last step whose forward is over
        self._saved = set()
        self._events = {}         # CUDA: layer name -> its event of this step
        self._end_event = None
        self._closed = False
        self._gates = None        # the current step's (CPU)
        self._overlapped = 0      # layers let through while their step still ran
        self.overlapped_total = 0

    def _event(self):
        if not self._cuda:
            return None
        import torch
        ev = torch.cuda.Event()
        ev.record()
        return ev

    def begin(self):
        gates = None if self._cuda else ldd.LayerGates(len(self._owners))
        with self._cv:
            self._step += 1
            self._saved = set()
            self._events = {}
            self._gates = gates
            self._cv.notify_all()
            return self._step

    def saved(self, name):
        if name not in self._names:
            return
        ev = self._event()
        with self._cv:
            self._saved.add(name)
            if ev is not None:
                self._events[name] = ev
            if self._gates is not None:
                for i in self._regions[name]:
                    if self._owners[i] <= self._saved:
                        self._gates.open(i)
            self._cv.notify_all()

    def end(self):
        ev = self._event()
        with self._cv:
            self._ended = self._step
            self._end_event = ev
            if self._gates is not None:
                self._gates.open_all()
                self._count(self._gates.early)
            self._cv.notify_all()

    def _count(self, n):
        self._overlapped += n
        self.overlapped_total += n

    def gate(self, step):
        """The gate of a write of step `step` (0: steps that ended)."""
        if self._cuda:
            return Gate(self, step)
        with self._cv:
            if step == self._step and self._ended < step and self._gates is not None:
                return self._gates
        return None                 # computed already: no gate

    @property
    def ended(self):
        with self._cv:
            return self._ended

    def take_overlapped(self):
        """Layers let through during their step since the last call."""
        with self._cv:
            n, self._overlapped = self._overlapped, 0
            return n

    def close(self):
        with self._cv:
            self._closed = True
            if self._gates is not None:
                self._gates.fail()
            self._cv.notify_all()

    def wait(self, step, layer, timeout_s):
        """(CUDA) True once region `layer` of step `step` is written (step 0:
        steps that already ended); False when the clock closed or time ran
        out."""
        with self._cv:
            def ready():
                return self._closed or self._ended >= step or self._step > step or \
                    (self._step == step and self._owners[layer] <= self._saved)
            if not self._cv.wait_for(ready, timeout_s) or self._closed:
                return False
            if self._ended >= step or self._step > step:
                events = [self._end_event] if self._ended >= step else []
            else:
                events = [self._events.get(n) for n in self._owners[layer]]
                self._count(1)
        for ev in events:
            if ev is not None:
                ev.synchronize()
        return True


class Gate(ldd.LayerSynchronizer):
    """(CUDA) The gate of one write: region i of step `step` moves once
    written and its event passed."""

    def __init__(self, clock, step):
        self._clock, self._step = clock, step

    def synchronize_layer(self, layer_index, timeout_in_millis):
        t = None if timeout_in_millis is None else timeout_in_millis / 1000.0
        return self._clock.wait(self._step, layer_index, t)


class Stream:
    """One concurrent request on a prefill worker (the worker's lock guards it)."""

    __slots__ = ("req_id", "blocks", "ready", "cur", "total", "asks", "inflight", "failed",
                 "final", "answered", "dropped")

    def __init__(self):
        self.req_id = None
        self.blocks = None        # the request's blocks per KV cache group, as known
        self.ready = 0            # tokens whose every layer is written (steps ended)
        self.cur = None           # the step in progress: (first token, end token, step)
        self.total = None         # the prompt's length
        self.asks = {}            # decode rank -> (cluster, address, ask, expected)
        self.inflight = {}        # decode rank -> writes not ended
        self.failed = {}          # decode rank -> why a write failed
        self.final = set()        # decode ranks every token was handed to a write for
        self.answered = set()
        self.dropped = False      # the prefill request was aborted

    def complete(self):
        """Every token of the prompt has been computed."""
        return self.total is not None and self.ready >= self.total and self.cur is None

    def answerable(self, rank):
        """-> True when decode rank `rank` is to be answered now."""
        return rank in self.asks and rank not in self.answered and \
            not self.inflight.get(rank) and (rank in self.final or self.dropped)
