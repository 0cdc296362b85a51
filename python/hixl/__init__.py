"""hixl: one-sided READ/WRITE into memory another process registered.

Two layers:

* ``hixl.Hixl`` -- the C++ engine ``hixl::Hixl``, every method in snake_case
  (``initialize``, ``register_mem``, ``connect``, ``transfer_sync``, ...),
  including notifications (``send_notify``, ``get_notifies`` -> list of
  ``hixl.NotifyDesc(name, msg, sender)``, ``set_notify_callback``),
  ``cancel_transfer``, ``connect_async``/``get_connect_status`` and
  generations (``generation``, ``get_peer_generation``, and the
  ``remote_generation=`` keyword of the transfers). Option keys for
  ``initialize`` are in ``hixl.options``.
* ``hixl.Context`` -- the seed's convenience API::

      with hixl.Context(device_id=0, peer_device_id=1) as ctx:
          buf = ctx.allocate(64 << 20, flags=hixl.MEM_ZERO_COPY, name="kv")
          ctx.write(src, buf, n)          # src: int address, numpy, bytearray, tensor...

      with hixl.Context(device_id=1, peer_device_id=0) as ctx:   # another process
          buf = ctx.open_buffer("kv")     # the peer's buffer, found by name
          ctx.read(buf, dst, n)

Rendezvous: each Context publishes ``device-<device_id>.json`` (its engine
address, pid and the serialized handles of the buffers it allocated, by name)
in the runtime directory: ``$HIXL_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/hixl``,
else ``/tmp/hixl-<uid>`` (created 0700; it must belong to the user).
``ctx.open_buffer(name)`` waits for the peer's file (and a live pid) and
imports the handle; ``ctx.export(buf)`` / ``ctx.import_buffer(string)`` do the
same through any other channel. Files are removed when the context closes.
A Buffer of one Context passed to another Context's read/write (both in this
process, e.g. handed from one component to another) is imported there
through the handle it carries, once, as if by ``import_buffer(buf.handle)``.

Every failure raises ``hixl.HixlError`` (``.code``: the status number,
``.code_name``: e.g. ``"PARAM_INVALID"``).
"""
import json
import os
import time

from . import _hixl
from ._hixl import (HixlError, Hixl, LinkType, MemDesc, MemType, StatusCode,  # noqa: F401
                    TransferOp, TransferOpDesc, TransferStatus, ConnectStatus, NotifyDesc,
                    MEM_PERM_NONE, MEM_PERM_READ, MEM_PERM_WRITE, MEM_PERM_READ_WRITE,
                    REGISTER_DEFAULT, REGISTER_SHARE_BY_MAPPING,
                    MAX_NOTIFY_NAME_LEN, MAX_NOTIFY_MSG_LEN, address_of, options)

__all__ = ["Hixl", "HixlError", "Context", "Buffer", "MEM_ZERO_COPY", "MEM_DEFAULT", "StatusCode",
           "MemType", "TransferOp", "TransferStatus", "ConnectStatus", "LinkType", "MemDesc",
           "TransferOpDesc", "NotifyDesc", "MEM_PERM_NONE", "MEM_PERM_READ", "MEM_PERM_WRITE",
           "MEM_PERM_READ_WRITE", "REGISTER_DEFAULT", "REGISTER_SHARE_BY_MAPPING",
           "MAX_NOTIFY_NAME_LEN", "MAX_NOTIFY_MSG_LEN", "address_of",
           "options"]

MEM_DEFAULT = 0      # private host memory, registered
MEM_ZERO_COPY = 1    # engine-allocated shareable memory (memfd) local peers map

_PARAM_INVALID = int(StatusCode.PARAM_INVALID)
_TIMEOUT = int(StatusCode.TIMEOUT)
_FAILED = int(StatusCode.FAILED)


def _error(code, msg):
    e = HixlError(msg)
    e.code = code
    e.code_name = StatusCode(code).name
    return e


def runtime_dir():
    """The rendezvous directory (created 0700 when missing)."""
    d = os.environ.get("HIXL_RUNTIME_DIR")
    if not d:
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        d = os.path.join(xdg, "hixl") if xdg else "/tmp/hixl-%d" % os.getuid()
    os.makedirs(d, mode=0o700, exist_ok=True)
    st = os.stat(d)
    if st.st_uid != os.getuid():
        raise _error(_FAILED, "FAILED: runtime dir %s belongs to another user" % d)
    return d


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Buffer:
    """A buffer a Context can write to and read from: one it allocated (local,
    usable as a numpy/memoryview source via .view()) or one imported from the
    peer (remote). .handle is its serialized handle."""

    def __init__(self, ctx, hid, size, handle, addr=None, name=None):
        self._ctx = ctx
        self._id = hid
        self.size = size
        self.handle = handle
        self.name = name
        self._hixl_address = addr  # None for remote buffers

    @property
    def local(self):
        return self._hixl_address is not None

    @property
    def address(self):
        if not self.local:
            raise _error(_PARAM_INVALID, "PARAM_INVALID: a remote buffer has no local address")
        return self._hixl_address

    def view(self):
        """A memoryview of a local buffer's bytes (no copy)."""
        self._ctx._check_open()
        return _hixl.view(self.address, self.size)

    def __len__(self):
        return self.size

    def __repr__(self):
        return "<hixl.Buffer %s size=%d%s>" % ("local" if self.local else "remote", self.size,
                                                " name=%r" % self.name if self.name else "")


class Context:
    """An engine for one device id that finds its peer through the runtime
    directory. Use as ``with hixl.Context(device_id=0, peer_device_id=1) as ctx``;
    close() releases every buffer it allocated."""

    def __init__(self, device_id=0, peer_device_id=None, link_type="AUTO", ip="127.0.0.1"):
        if not isinstance(device_id, int) or device_id < 0:
            raise _error(_PARAM_INVALID, "PARAM_INVALID: device_id must be an int >= 0")
        if peer_device_id is not None and (not isinstance(peer_device_id, int) or peer_device_id < 0
                                           or peer_device_id == device_id):
            raise _error(_PARAM_INVALID,
                         "PARAM_INVALID: peer_device_id must be an int >= 0 other than device_id")
        self.device_id = device_id
        self.peer_device_id = peer_device_id
        self._dir = runtime_dir()
        self._file = os.path.join(self._dir, "device-%d.json" % device_id)
        other = self._read(device_id)
        if other is not None and _pid_alive(other.get("pid", 0)):
            raise _error(_FAILED, "FAILED: device %d is in use by process %d" % (device_id, other["pid"]))
        self._ep = _hixl.Endpoint(ip, 0, link_type)
        self._buffers = {}    # name -> handle string (published)
        self._owned = []      # Buffers to release on close
        self._imported = {}   # handle -> Buffer: other contexts' Buffers used here
        self._count = 0
        self._closed = False
        self._publish()

    # -- rendezvous
    def _read(self, dev):
        try:
            with open(os.path.join(self._dir, "device-%d.json" % dev)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _publish(self):
        tmp = "%s.%d.tmp" % (self._file, os.getpid())
        with open(tmp, "w") as f:
            json.dump({"pid": os.getpid(), "engine": self._ep.address, "buffers": self._buffers}, f)
        os.replace(tmp, self._file)

    def _peer(self, timeout, want=None):
        if self.peer_device_id is None:
            raise _error(_PARAM_INVALID, "PARAM_INVALID: this context has no peer_device_id")
        deadline = time.monotonic() + timeout
        while True:
            info = self._read(self.peer_device_id)
            if info and _pid_alive(info.get("pid", 0)) and (want is None or want in info["buffers"]):
                return info
            if time.monotonic() >= deadline:
                what = "buffer %r of " % want if want is not None else ""
                raise _error(_TIMEOUT, "TIMEOUT: no %sdevice %d in %s after %.1f s" %
                             (what, self.peer_device_id, self._dir, timeout))
            time.sleep(0.01)

    @property
    def engine(self):
        """This context's engine address "ip:port"."""
        self._check_open()
        return self._ep.address

    def peer_engine(self, timeout=30.0):
        """The peer's engine address, once it has published it."""
        return self._peer(timeout)["engine"]

    # -- buffers
    def allocate(self, size, flags=MEM_ZERO_COPY, name=None):
        """A local buffer the peer can access, published under `name`
        (default: "0", "1", ... in allocation order)."""
        self._check_open()
        if not isinstance(size, int) or size <= 0:
            raise _error(_PARAM_INVALID, "PARAM_INVALID: size must be an int > 0")
        if flags not in (MEM_ZERO_COPY, MEM_DEFAULT):
            raise _error(_PARAM_INVALID, "PARAM_INVALID: flags must be MEM_ZERO_COPY or MEM_DEFAULT")
        if name is None:
            name = str(self._count)
        name = str(name)
        if name in self._buffers:
            raise _error(_PARAM_INVALID, "PARAM_INVALID: a buffer named %r exists" % name)
        self._count += 1
        addr, hid, handle = self._ep.alloc(size, flags == MEM_ZERO_COPY)
        buf = Buffer(self, hid, size, handle, addr=addr, name=name)
        self._owned.append(buf)
        self._buffers[name] = handle
        self._publish()
        return buf

    def export(self, buf):
        """The serialized handle of a buffer (give it to the peer's import_buffer)."""
        self._check_open()
        if not isinstance(buf, Buffer):
            raise _error(_PARAM_INVALID, "PARAM_INVALID: not a hixl.Buffer: %s" % type(buf).__name__)
        return buf.handle

    def import_buffer(self, handle):
        """A Buffer for a handle string from the peer's export()."""
        self._check_open()
        if not isinstance(handle, str):
            raise _error(_PARAM_INVALID, "PARAM_INVALID: handle must be a str")
        hid, size = self._ep.import_handle(handle)
        return Buffer(self, hid, size, handle)

    def open_buffer(self, name="0", timeout=30.0):
        """The peer's buffer published under `name`, waiting up to `timeout` s."""
        self._check_open()
        info = self._peer(timeout, str(name))
        return self.import_buffer(info["buffers"][str(name)])

    # -- transfers (no copies: the engine reads/writes the objects' memory)
    def write(self, src, buf, n, offset=0):
        """Writes n bytes from src (int address, buffer-protocol object or tensor)
        into buf at offset. One-sided: the peer takes no part. buf may also be a
        Buffer of another Context (e.g. one passed between threads or objects):
        it is imported here through its handle (once)."""
        buf = self._check_buffer(buf)
        self._check_range(buf, n, offset)
        if buf.local:
            _hixl.memmove(buf._hixl_address + offset, src, n)
        else:
            self._ep.write(src, buf._id, offset, n)

    def read(self, buf, dst, n, offset=0):
        """Reads n bytes of buf at offset into dst (int address, writable buffer or tensor);
        buf may be a Buffer of another Context, as for write."""
        buf = self._check_buffer(buf)
        self._check_range(buf, n, offset)
        if buf.local:
            _hixl.memmove(dst, buf._hixl_address + offset, n)
        else:
            self._ep.read(buf._id, dst, offset, n)

    # -- lifetime
    def close(self):
        """Releases the engine and every buffer; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            info = self._read(self.device_id)
            if info and info.get("pid") == os.getpid():
                os.unlink(self._file)
        except OSError:
            pass
        self._ep.close()
        self._owned = []
        self._imported = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _check_open(self):
        if self._closed:
            raise _error(_FAILED, "FAILED: the context is closed")

    def _check_buffer(self, buf):
        """buf as a Buffer of this context: a Buffer of another Context (local
        there or imported there) is imported here once through its handle, or
        is this context's own buffer when the handle is one of ours."""
        self._check_open()
        if not isinstance(buf, Buffer):
            raise _error(_PARAM_INVALID, "PARAM_INVALID: not a hixl.Buffer: %s" % type(buf).__name__)
        if buf._ctx is self:
            return buf
        for own in self._owned:   # another context's view of one of ours
            if own.handle == buf.handle:
                return own
        mine = self._imported.get(buf.handle)
        if mine is None:
            mine = self.import_buffer(buf.handle)
            self._imported[buf.handle] = mine
        return mine

    @staticmethod
    def _check_range(buf, n, offset):
        if not isinstance(n, int) or not isinstance(offset, int) or n <= 0 or offset < 0 \
                or offset + n > buf.size:
            raise _error(_PARAM_INVALID, "PARAM_INVALID: offset %r + n %r outside the %d-byte buffer"
                         % (offset, n, buf.size))
