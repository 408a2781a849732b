"""One window per user and data dir: a second launch hands over to the first and exits.

The first instance listens on a local socket (a Unix socket file, a named pipe on Windows)
whose name is derived from the user and the data dir, so two users, or two HEARTHSIDE_HOME
folders, each get their own instance. A second launch connects, sends one JSON line
(`{"schema": 1, "action": "activate", "model": ...}`), waits for `ok`, and exits 0 without
loading an engine; the first raises its window (and loads the model named, if any).

A crashed instance leaves its socket file behind on Unix, and `listen` then fails with
"address in use". That file is removed only after a connection to it has failed, so a live
instance that started a moment ago is never pushed aside.
"""

from __future__ import annotations

import enum
import getpass
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QByteArray, QObject, QTimer, Signal, Slot
from PySide6.QtNetwork import QAbstractSocket, QLocalServer, QLocalSocket

PROTOCOL_SCHEMA = 1
ACTIVATE = "activate"
ACK = b"ok\n"
MAX_MESSAGE_BYTES = 4096
CONNECT_TIMEOUT_MS = 500
# The first instance may still be building its window (a second or two) before its event
# loop answers; the connection is already accepted by the OS, so waiting is cheap.
REPLY_TIMEOUT_MS = 8000
CLIENT_IDLE_TIMEOUT_MS = 5000


@dataclass(frozen=True)
class ActivationRequest:
    """What a second launch asks the running instance to do."""

    model: str | None = None  # a model the second launch named explicitly

    def encode(self) -> bytes:
        message = {"schema": PROTOCOL_SCHEMA, "action": ACTIVATE, "model": self.model}
        return json.dumps(message).encode("utf-8") + b"\n"

    @classmethod
    def decode(cls, data: bytes) -> ActivationRequest:
        """Parse one message; ValueError for anything that is not a well-formed request."""
        try:
            message = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError("not a JSON message") from exc
        if not isinstance(message, dict) or message.get("action") != ACTIVATE:
            raise ValueError("not an activation request")
        model = message.get("model")
        if model is not None and (not isinstance(model, str) or not model.strip()):
            raise ValueError("model must be a non-empty string")
        return cls(model=model)


class ForwardResult(enum.Enum):
    FORWARDED = "forwarded"  # a running instance took the request
    NO_INSTANCE = "no-instance"  # nobody is listening (or only a stale socket file is left)
    NOT_RESPONDING = "not-responding"  # something accepted the connection but never answered


def instance_key(root: Path, user: str | None = None) -> str:
    """The local-socket name for this user and data dir (short: Unix socket paths are)."""
    who = user if user is not None else _user_name()
    digest = hashlib.sha256(f"{who}\0{root.resolve()}".encode()).hexdigest()
    return f"hearthside-{digest[:24]}"


def _user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER (containers)
        return str(os.getuid()) if hasattr(os, "getuid") else "user"


def forward_to_running_instance(
    key: str,
    request: ActivationRequest,
    *,
    connect_timeout_ms: int = CONNECT_TIMEOUT_MS,
    reply_timeout_ms: int = REPLY_TIMEOUT_MS,
) -> ForwardResult:
    """Hand `request` to the instance listening on `key`, if there is one.

    Blocking, and needs no QCoreApplication, so a second launch can ask before it builds
    anything else.
    """
    socket = QLocalSocket()
    socket.connectToServer(key)
    if not socket.waitForConnected(connect_timeout_ms):
        return ForwardResult.NO_INSTANCE
    try:
        socket.write(QByteArray(request.encode()))
        if not socket.waitForBytesWritten(reply_timeout_ms):
            return ForwardResult.NOT_RESPONDING
        reply = _read_reply(socket, reply_timeout_ms)
    finally:
        socket.abort()
    return ForwardResult.FORWARDED if reply == ACK else ForwardResult.NOT_RESPONDING


def _read_reply(socket: QLocalSocket, timeout_ms: int) -> bytes:
    received = b""
    while not received.endswith(b"\n") and len(received) < MAX_MESSAGE_BYTES:
        if socket.bytesAvailable() == 0 and not socket.waitForReadyRead(timeout_ms):
            break
        received += bytes(socket.readAll().data())
    return received


class InstanceServer(QObject):
    """The first instance's end: accepts activation requests from later launches."""

    activation_requested = Signal(object)  # ActivationRequest

    def __init__(self, key: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.key = key
        self.server = QLocalServer(self)
        # Unix: the socket file is the user's own (0700 dir semantics); nobody else connects.
        self.server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self.server.newConnection.connect(self._accept)
        self._buffers: dict[QLocalSocket, bytes] = {}

    def listen(self) -> bool:
        """Start listening, taking over a socket file a crashed instance left behind.

        False when another live instance holds the name (it answered a connection).
        """
        if self.server.listen(self.key):
            return True
        if self.server.serverError() != QAbstractSocket.SocketError.AddressInUseError:
            return False
        if _someone_listens(self.key):
            return False
        QLocalServer.removeServer(self.key)
        return self.server.listen(self.key)

    @property
    def listening(self) -> bool:
        return self.server.isListening()

    def close(self) -> None:
        self.server.close()

    @Slot()
    def _accept(self) -> None:
        while self.server.hasPendingConnections():
            socket = self.server.nextPendingConnection()
            self._buffers[socket] = b""
            socket.readyRead.connect(lambda s=socket: self._read(s))
            socket.disconnected.connect(lambda s=socket: self._forget(s))
            QTimer.singleShot(CLIENT_IDLE_TIMEOUT_MS, socket, socket.abort)

    def _read(self, socket: QLocalSocket) -> None:
        received = self._buffers.get(socket, b"") + bytes(socket.readAll().data())
        if b"\n" not in received:
            if len(received) > MAX_MESSAGE_BYTES:
                socket.abort()
            else:
                self._buffers[socket] = received
            return
        line = received.split(b"\n", 1)[0]
        try:
            request = ActivationRequest.decode(line)
        except ValueError:
            socket.abort()
            return
        socket.write(QByteArray(ACK))
        socket.flush()
        socket.disconnectFromServer()
        self.activation_requested.emit(request)

    def _forget(self, socket: QLocalSocket) -> None:
        self._buffers.pop(socket, None)
        socket.deleteLater()


def _someone_listens(key: str) -> bool:
    probe = QLocalSocket()
    probe.connectToServer(key)
    alive = probe.waitForConnected(CONNECT_TIMEOUT_MS)
    probe.abort()
    return alive


def claim_instance(
    key: str, request: ActivationRequest, parent: QObject | None = None
) -> InstanceServer | None:
    """Become the running instance, or hand `request` to the one that already is.

    Returns the listening server, or None when another instance took the request (the
    caller then exits). Call it once the QApplication exists.
    """
    if forward_to_running_instance(key, request) is ForwardResult.FORWARDED:
        return None
    server = InstanceServer(key, parent)
    if server.listen():
        return server
    # Lost a race with an instance that started at the same moment: hand over to it.
    if forward_to_running_instance(key, request) is ForwardResult.FORWARDED:
        return None
    return server  # neither works (e.g. no local sockets here): run without the guard
