"""hixl as an SGLang disaggregation transfer backend.

Installed with the ``hixl`` Python package, which declares the entry point
``hixl = hixl.sglang:register`` in SGLang's plugin group ``sglang.srt.plugins``.
SGLang calls ``register()`` in every process it starts; from then on
``--disaggregation-transfer-backend hixl`` works with SGLang as installed
(nothing in SGLang changes). See docs/SGLANG.md for the launch commands.

``register()`` does three things, each at most once per process:

1. adds "hixl" to the choices of ``--disaggregation-transfer-backend``;
2. adds the member ``HIXL = "hixl"`` to SGLang's ``TransferBackend`` enum (a
   closed ``Enum``: SGLang looks backends up by value);
3. wraps ``sglang.srt.disaggregation.utils.get_kv_class`` through SGLang's hook
   registry, so that the name returns this package's classes and every other
   name SGLang's own.

The classes are in ``hixl.sglang._conn`` (imported only when SGLang asks for
them): ``HixlKVManager``, ``HixlKVSender``, ``HixlKVReceiver`` and
``HixlKVBootstrapServer``; ``KVArgs`` is SGLang's own.

Thread safety: ``register()`` may be called from any thread; SGLang calls it
before it starts serving.
"""
import threading

NAME = "hixl"
_lock = threading.Lock()
_done = False


def classes():
    """{class type name: class} of the backend, as get_kv_class returns them."""
    from . import _conn
    return {"kvargs": _conn.KVArgs, "manager": _conn.HixlKVManager,
            "sender": _conn.HixlKVSender, "receiver": _conn.HixlKVReceiver,
            "bootstrap_server": _conn.HixlKVBootstrapServer}


def _add_enum_member(enum_cls, name, value):
    """Adds a member to a closed Enum so that enum_cls(value) finds it."""
    if value in enum_cls._value2member_map_:
        return enum_cls._value2member_map_[value]
    member = object.__new__(enum_cls)
    member._name_ = name
    member._value_ = value
    member.__objclass__ = enum_cls
    enum_cls._value2member_map_[value] = member
    enum_cls._member_map_[name] = member
    enum_cls._member_names_.append(name)
    type.__setattr__(enum_cls, name, member)
    return member


def _get_kv_class(original, transfer_backend, class_type):
    if getattr(transfer_backend, "value", transfer_backend) != NAME:
        return original(transfer_backend, class_type)
    return classes().get(getattr(class_type, "value", class_type))


def register():
    """SGLang's plugin entry point (called with no arguments)."""
    global _done
    with _lock:
        if _done:
            return
        from sglang.srt.disaggregation import utils
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
        from sglang.srt.server_args import (DISAGG_TRANSFER_BACKEND_CHOICES,
                                            add_disagg_transfer_backend_choices)
        if NAME not in DISAGG_TRANSFER_BACKEND_CHOICES:
            add_disagg_transfer_backend_choices([NAME])
        _add_enum_member(utils.TransferBackend, NAME.upper(), NAME)
        HookRegistry.register("sglang.srt.disaggregation.utils.get_kv_class", _get_kv_class,
                              HookType.AROUND)
        _done = True
