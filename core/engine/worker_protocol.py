"""The frames between `WorkerEngine` (the app's side) and its engine worker process.

A frame is a 4-byte big-endian length and a pickle of one message tuple. Both ends are this
program, started by the app over the child's own pipes, so pickle carries the typed configs,
results and errors as they are. Messages (first item is the kind, second the request id):

app → worker   ("load", id, config_dict, verbose)       load the model; the reply is a Snapshot
               ("call", id, method, args, kwargs)        an Engine method, e.g. "tokenize"
               ("stream", id, method, args, kwargs)      "chat"/"generate": text comes as it is
               ("run", id, function, args)               function(engine, *args), module-level
               ("cancel", id)                            stop request `id` between two tokens
               ("close", 0)                              unload and exit
worker → app   ("text", id, piece, speculation)          a piece of a streamed reply
               ("logprobs", id, entries)                  logprob entries, before their text
               ("result", id, value) / ("error", id, exception)
"""

from __future__ import annotations

import contextlib
import pickle
import struct
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.load_report import LoadReport

HEADER = struct.Struct(">I")
MAX_FRAME = 256 << 20  # a frame this long is a broken stream, not a message


class FramedPipe:
    """Reads and writes whole frames; writes from several threads do not interleave."""

    def __init__(self, reader: BinaryIO, writer: BinaryIO) -> None:
        self._reader = reader
        self._writer = writer
        self._write_lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._write_lock:
            self._writer.write(HEADER.pack(len(payload)) + payload)
            self._writer.flush()

    def receive(self) -> tuple[Any, ...] | None:
        """The next message; None when the other end has gone (end of file)."""
        header = self._read_exactly(HEADER.size)
        if header is None:
            return None
        (length,) = HEADER.unpack(header)
        if length > MAX_FRAME:
            raise ValueError(f"a frame of {length} bytes")
        payload = self._read_exactly(length)
        if payload is None:
            return None
        message = pickle.loads(payload)
        return message if isinstance(message, tuple) else None

    def _read_exactly(self, size: int) -> bytes | None:
        chunks = []
        while size:
            chunk = self._reader.read(size)
            if not chunk:
                return None
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        for stream in (self._writer, self._reader):
            with contextlib.suppress(OSError):
                stream.close()


@dataclass(frozen=True)
class Snapshot:
    """What the app side keeps of the loaded engine, so reading it costs no round trip."""

    config: EngineConfig
    n_ctx: int
    n_vocab: int
    load_report: LoadReport
