"""Remote devices through llama.cpp's RPC backend: reach a worker, register its devices with ggml (as llama.cpp's
`--rpc` does: `ggml_backend_rpc_add_server`, then `ggml_backend_register`), and notice a worker that went away.

Invariants: an endpoint is registered once per process (ggml cannot unregister one, so every model load names its
devices explicitly); an endpoint is probed before llama.cpp connects to it, because llama.cpp's RPC client aborts
the whole process when a connect fails; and once a worker's connection has closed, `RemoteWatch.check` raises
before any llama.cpp call could touch that worker again (its client aborts on a lost connection too), so a runtime
that lost a worker is left as it is, never freed (freeing would talk to the worker).
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import EvokeError, ModelLoadError
from . import device

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 3.0
NO_SECURITY = ("llama.cpp's RPC protocol has no authentication or encryption: use it on a trusted network "
               "or through an SSH tunnel (ssh -L PORT:127.0.0.1:PORT host)")
_LOST_EVENTS = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0x2000)


class RemoteDeviceError(ModelLoadError):
    """A remote device (an RPC worker) could not be used when the model loaded."""


class RemoteDeviceLost(EvokeError):
    """An RPC worker's connection closed while the model used it: the model must be reloaded."""

    def __init__(self, endpoints: list[str]) -> None:
        self.endpoints = endpoints
        super().__init__(
            f"the remote device at {', '.join(endpoints)} went away (its rpc-server stopped or the network "
            "dropped); the model must be reloaded: Settings → Model → Apply, without that worker or once it is back "
            "(a worker lost by this process needs an app restart to be used again)")


@dataclass(frozen=True)
class RemoteDevice:
    endpoint: str
    name: str                    # ggml's device name: "RPC0", "RPC1", ...
    description: str
    handle: int                  # ggml_backend_dev_t


_registered: dict[str, list[RemoteDevice]] = {}
_lost: set[str] = set()              # endpoints whose connection closed under a model of this process
_register_lock = threading.Lock()


def _lib() -> ctypes.CDLL:
    lib = device.ggml_library()
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return lib


def rpc_available() -> bool:
    """Whether the installed llama.cpp carries the RPC backend (after run-time backends are loaded)."""
    device.load_backends()
    return bool(_lib().ggml_backend_reg_by_name(b"RPC"))


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> str:
    """'' when something listens at `endpoint`, else why not (refused, timed out, unknown host)."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return ""
    except socket.gaierror as exc:
        return f"unknown host ({exc.strerror or exc})"
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)


def unreachable_message(endpoint: str, reason: str) -> str:
    return (f"the remote device at {endpoint} is not reachable ({reason}). Start its worker there "
            f"(`evoke-desk rpc-worker --port {endpoint.rpartition(':')[2]}`, with --host and --allow-remote for "
            "another machine), remove it under Settings → Model → Remote devices, or turn on \"Load without "
            "unreachable remote devices\" to load without it")


def register(endpoints: list[str], *, skip_unreachable: bool = False) -> tuple[list[RemoteDevice], list[str]]:
    """The devices of each endpoint, registered with ggml (once per process); and a notice per endpoint left
    out (only with `skip_unreachable`; otherwise RemoteDeviceError names the first that cannot be used)."""
    if not endpoints:
        return [], []
    if not rpc_available():
        raise RemoteDeviceError("this llama.cpp build has no RPC backend: reinstall with `make install` "
                                "(native/build_cpu.sh or build_cuda.sh build it with GGML_RPC=ON)")
    lib = _lib()
    devices: list[RemoteDevice] = []
    notices: list[str] = []
    with _register_lock:
        for endpoint in endpoints:
            # llama.cpp aborts the process on a failed connect: never let it try. A lost endpoint's old connection
            # stays held by the model that lost it (it cannot be freed), and llama.cpp would reuse it.
            # An endpoint this process is connected to already (a model kept after a loss) is not probed: its
            # worker serves that connection, and llama.cpp reuses it.
            if endpoint in _lost:
                reason = "it went away under a model earlier; restart the app to use it again"
            else:
                reason = "" if _tcp_inodes_to(_resolve(endpoint)) else probe(endpoint)
            if reason:
                if not skip_unreachable:
                    raise RemoteDeviceError(unreachable_message(endpoint, reason))
                notices.append(f"remote device {endpoint} left out: {reason}")
                continue
            if endpoint not in _registered:
                _registered[endpoint] = _add_server(lib, endpoint)
            devices.extend(_registered[endpoint])
    return devices, notices


def _add_server(lib: ctypes.CDLL, endpoint: str) -> list[RemoteDevice]:
    rpc_reg = lib.ggml_backend_reg_by_name(b"RPC")
    address = lib.ggml_backend_reg_get_proc_address(rpc_reg, b"ggml_backend_rpc_add_server")
    if not address:
        raise RemoteDeviceError("this llama.cpp's RPC backend has no ggml_backend_rpc_add_server")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)
    reg = add_server(endpoint.encode())
    if not reg:
        raise RemoteDeviceError(f"the worker at {endpoint} answered but offers no device")
    lib.ggml_backend_register(reg)
    found = []
    for i in range(lib.ggml_backend_reg_dev_count(reg)):
        handle = lib.ggml_backend_reg_dev_get(reg, i)
        found.append(RemoteDevice(endpoint, lib.ggml_backend_dev_name(handle).decode(),
                                  lib.ggml_backend_dev_description(handle).decode(), handle))
    log.info("registered %s: %s", endpoint, ", ".join(d.name for d in found))
    return found


def any_registered() -> bool:
    return bool(_registered)


def device_memory(handle: int) -> tuple[int, int]:
    """(free, total) bytes of a ggml device (a remote one asks its worker)."""
    lib = device.ggml_library()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    lib.ggml_backend_dev_memory(ctypes.c_void_p(handle), ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


# -- the connections llama.cpp's RPC client holds ----------------------------------------------------------------
def _tcp_inodes_to(addresses: set[tuple[str, int]]) -> dict[int, tuple[str, int]]:
    """Socket inodes of this process's established TCP connections to `addresses` ((ip, port) pairs)."""
    found: dict[int, tuple[str, int]] = {}
    for table, width in (("/proc/self/net/tcp", 8), ("/proc/self/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "01":              # 01: ESTABLISHED
                continue
            ip_hex, port_hex = fields[2].split(":")
            ip = _decode_ip(ip_hex, width)
            key = (ip, int(port_hex, 16))
            if key in addresses:
                found[int(fields[9])] = key
    return found


def _decode_ip(hex_ip: str, width: int) -> str:
    raw = bytes.fromhex(hex_ip)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))     # each 32-bit word in host order
    if width == 8:
        return socket.inet_ntop(socket.AF_INET, words)
    if words[:12] == b"\0" * 10 + b"\xff\xff":                          # IPv4-mapped
        return socket.inet_ntop(socket.AF_INET, words[12:])
    return socket.inet_ntop(socket.AF_INET6, words)


def _resolve(endpoint: str) -> set[tuple[str, int]]:
    host, _, port = endpoint.rpartition(":")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except OSError:
        return set()
    return {(info[4][0], int(port)) for info in infos}


class RemoteWatch:
    """Notices that a worker's connection closed, by polling the sockets llama.cpp's RPC client holds
    (no traffic: a closed peer shows as hang-up on its socket). Built after the model and its contexts exist."""

    def __init__(self, endpoints: list[str]) -> None:
        wanted = {addr: endpoint for endpoint in endpoints for addr in _resolve(endpoint)}
        inodes = _tcp_inodes_to(set(wanted))
        self._fds: dict[int, str] = {}
        for name in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in inodes:
                    self._fds[int(name)] = wanted[inodes[inode]]
        self.unwatched = sorted(set(endpoints) - set(self._fds.values()))
        if self.unwatched:
            log.warning("no connection found to %s: its loss is noticed only by llama.cpp", ", ".join(self.unwatched))
        self._poll = select.poll()
        for fd in self._fds:
            self._poll.register(fd, _LOST_EVENTS)
        self.lost: list[str] = []

    def check(self) -> None:
        """Raise RemoteDeviceLost when a worker's connection has closed (and ever after)."""
        if not self.lost:
            events = self._poll.poll(0)
            if not events:
                return
            self.lost = sorted({self._fds[fd] for fd, _ in events if fd in self._fds})
            _lost.update(self.lost)
            log.error("lost the remote device(s) %s", ", ".join(self.lost))
        raise RemoteDeviceLost(self.lost)
