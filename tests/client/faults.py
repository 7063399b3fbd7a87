"""A TCP proxy in front of the real server that breaks chosen connections, as a flaky network
or a restarting load balancer would: the client's retries and resumption are tested against
the service itself, not against a mock of it."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

# cut(connection number, request bytes so far, response bytes so far) -> how many of the
# response bytes to forward before closing the connection, or None to pass everything
Cut = Callable[[int, bytes, bytes], int | None]


class FaultyProxy:
    def __init__(self, upstream: str, cut: Cut) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.cut = cut
        self.requests: list[bytes] = []  # what each connection sent (its first bytes)
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                n = len(self.requests)
                self.requests.append(b"")
            threading.Thread(target=self._serve, args=(n, client), daemon=True).start()

    def _serve(self, n: int, client: socket.socket) -> None:
        up = socket.create_connection(self.upstream)
        threading.Thread(target=self._upload, args=(n, client, up), daemon=True).start()
        sent = b""
        try:
            while chunk := up.recv(65536):
                sent += chunk
                keep = self.cut(n, self.requests[n], sent)
                if keep is not None:
                    client.sendall(chunk[: max(0, keep - (len(sent) - len(chunk)))])
                    return
                client.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (client, up):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def _upload(self, n: int, client: socket.socket, up: socket.socket) -> None:
        try:
            while chunk := client.recv(65536):
                self.requests[n] += chunk
                up.sendall(chunk)
        except OSError:
            pass


def drop_answers(first: int) -> Cut:
    """The first ``first`` connections reach the server, which answers; the answer is lost."""
    return lambda n, _req, _resp: 0 if n < first else None


def drop_after_first_event(n: int, _req: bytes, resp: bytes) -> int | None:
    """The first connection is cut right after its first server-sent event."""
    if n > 0:
        return None
    head = resp.find(b"\r\n\r\n")
    if head < 0:
        return None
    end = resp.find(b"\n\n", head + 4)
    return None if end < 0 else end + 2
