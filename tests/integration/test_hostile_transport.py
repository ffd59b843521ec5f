"""One client against the HTTP transport of a real `tradeoff serve`: stalled bodies, huge
heads, idle and slow sockets, and more connections or body bytes than its share. Each is
refused or closed with a status that says why, and a normal `mlp` inference from another
client (HTTP and gRPC) still answers while it goes on; the server's memory stays within the
bound each limit sets."""

from __future__ import annotations

import contextlib
import gzip
import resource
import shutil
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc

from benchmarks.slow_clients import HeadDrip, connect, head
from tradeoff.models import build_repository
from tradeoff.server.process import ServerProcess

from .helpers import infer_json, request, rss, running_server, wait_for

pytestmark = pytest.mark.integration

HEADER_TIMEOUT_S = 2
BODY_TIMEOUT_S = 5
BODY_MEMORY = 64 << 20
MiB = 1 << 20


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = Path(tmp_path_factory.mktemp("transport")) / "models"
    build_repository(root, ("mlp",))
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    yield from running_server(repo, extra_args=(
        "--header-timeout", f"{HEADER_TIMEOUT_S}s", "--body-timeout", f"{BODY_TIMEOUT_S}s",
        "--max-body-memory", str(BODY_MEMORY), "--max-json-bytes", str(8 * MiB)))


@pytest.fixture(scope="module", autouse=True)
def open_files() -> Iterator[None]:
    """This process opens more than the usual 1,024 sockets at once."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def answer(sock: socket.socket, timeout: float = 30.0) -> bytes:
    """What the server sent before it closed ``sock`` (b"" for a plain close)."""
    sock.settimeout(timeout)
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            received += chunk
    return received


def assert_mlp_answers(server: ServerProcess) -> None:
    """A normal client's HTTP and gRPC inference of ``mlp`` both succeed."""
    row = np.linspace(0, 1, 256, dtype=np.float32)
    response = infer_json(server.url, "mlp", [{"name": "INPUT0", "datatype": "FP32",
                                               "shape": [1, 256], "data": row.tolist()}])
    assert response.status == 200, response.body
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    try:
        tensor = triton_grpc.InferInput("INPUT0", [1, 256], "FP32")
        tensor.set_data_from_numpy(row[None])
        result = client.infer("mlp", [tensor], client_timeout=30)
        assert result.as_numpy("OUTPUT0").shape == (1, 10)
    finally:
        client.close()


def test_stalled_bodies_hold_no_admission_slot(server: ServerProcess) -> None:
    """1,024 infer requests that send their headers and one body byte of 100,000 used to
    hold every --max-inflight slot (HTTP 503, gRPC UNAVAILABLE for everyone else); a
    request now takes its slot once its body is read, and a stalled body gets 408 after
    --body-timeout."""
    before = rss(server)
    stalled = []
    try:
        for _ in range(1024):
            sock = connect(server, "127.0.0.2")
            sock.sendall(head("/v2/models/mlp/infer", 100_000) + b"{")
            stalled.append(sock)
        assert_mlp_answers(server)
        assert request(server.url, "GET", "/v2/health/ready").status == 200
        held = rss(server) - before
        assert held < 128 * MiB, f"1,024 stalled requests hold {held / MiB:.0f} MiB"
        replies = [answer(sock) for sock in stalled]
    finally:
        for sock in stalled:
            sock.close()
    timed_out = [reply for reply in replies if reply.startswith(b"HTTP/1.1 408")]
    assert len(timed_out) == len(stalled), {reply[:40] for reply in replies}
    assert b"--body-timeout" in timed_out[0]
    assert_mlp_answers(server)


@pytest.mark.parametrize(("where", "status"), [("header", b"431"), ("url", b"414")])
def test_a_huge_request_head_is_refused(server: ServerProcess, where: str,
                                        status: bytes) -> None:
    """A header value or URL streamed without end used to be buffered whole (a 128 MB
    one blocked the loop for 12-22 s and grew the server by up to 240 MiB); it is
    refused once the head passes --max-header-bytes, before any key check."""
    before = rss(server)
    sock = connect(server)
    start = b"GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " \
        if where == "header" else b"GET /v2/health/ready?q="
    refused_at = None
    try:
        sock.sendall(start)
        chunk = b"a" * MiB
        for sent in range(1, 33):  # up to 32 MiB
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                refused_at = sent
                break
        reply = answer(sock, timeout=10)
    finally:
        sock.close()
    assert reply.startswith(b"HTTP/1.1 " + status), (reply[:200], refused_at)
    assert b"--max-header-bytes" in reply
    assert rss(server) - before < 32 * MiB
    assert_mlp_answers(server)


def test_idle_and_slow_heads_are_closed_at_the_header_timeout(server: ServerProcess
                                                              ) -> None:
    """Sockets that never send a byte, and heads sent a byte at a time, used to stay open
    for ever (1,100 idle sockets locked every client out under a 1,024 open-files limit);
    both are closed --header-timeout after they opened or began, the slow ones with 408."""
    idle = [connect(server, "127.0.0.2") for _ in range(300)]
    slow = [connect(server, "127.0.0.3") for _ in range(10)]
    try:
        with HeadDrip(slow, head("/v2/models/mlp/infer", 2), every_s=0.2):
            started = time.monotonic()
            assert_mlp_answers(server)
            idle_replies = [answer(sock) for sock in idle]
            slow_replies = [answer(sock) for sock in slow]
            closed_after = time.monotonic() - started
    finally:
        for sock in idle + slow:
            sock.close()
    assert idle_replies == [b""] * len(idle)  # closed without a word: nothing was asked
    assert all(reply.startswith(b"HTTP/1.1 408") for reply in slow_replies), slow_replies[0]
    assert b"--header-timeout" in slow_replies[0]
    # the drip alone would take 0.2 s x ~110 bytes = 22 s to finish a head
    assert closed_after < 20, closed_after


def refused_for_memory(server: ServerProcess, megabytes: int) -> bool:
    """Whether a body of ``megabytes`` MiB is refused now for --max-body-memory (else it
    is read whole and answered, and what it held is given back)."""
    response = request(server.url, "POST", "/v2/repository/index", b" " * (megabytes * MiB),
                       {"Content-Type": "application/json"})
    return response.status == 503 and b"--max-body-memory" in response.body


@pytest.mark.slow
def test_bodies_held_at_once_are_bounded_by_max_body_memory(server: ServerProcess) -> None:
    """Stalled 48 MB bodies to /v1 and /v2/repository/index used to be held without limit
    (30 of them held 1.55 GiB); bytes of bodies held at once are bounded by
    --max-body-memory, and the body that does not fit gets 503."""
    size = 48 * MiB
    before = rss(server)
    first, second = connect(server, "127.0.0.2"), connect(server, "127.0.0.3")
    try:
        first.sendall(head("/v1/completions", size) + b" " * (40 * MiB))
        wait_for(lambda: refused_for_memory(server, 30), "the first body to be held")
        second.sendall(head("/v2/repository/index", size))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            second.sendall(b" " * (40 * MiB))
        refused = answer(second)
        assert refused.startswith(b"HTTP/1.1 503"), refused[:200]
        assert b"--max-body-memory" in refused
        assert_mlp_answers(server)
        assert rss(server) - before < BODY_MEMORY + 64 * MiB
        timed_out = answer(first)
        assert timed_out.startswith(b"HTTP/1.1 408"), timed_out[:200]
    finally:
        first.close()
        second.close()
    # what the stalled body held is given back: the same body fits again
    third = connect(server, "127.0.0.3")
    try:
        third.sendall(head("/v2/repository/index", 40 * MiB) + b" " * (40 * MiB))
        reply = answer(third)
    finally:
        third.close()
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]  # 40 MB of blanks: no options


@pytest.fixture(scope="module")
def few_connections(repo: Path) -> Iterator[ServerProcess]:
    yield from running_server(repo, extra_args=(
        "--max-connections", "80", "--max-connections-per-client", "50"))


def test_one_client_cannot_take_every_connection(few_connections: ServerProcess) -> None:
    """Past --max-connections-per-client one address gets 503 and a close, while others
    are served; past --max-connections everyone new does, until connections close."""
    server = few_connections
    mine = [connect(server, "127.0.0.2") for _ in range(50)]
    others: list[socket.socket] = []
    try:
        for sock in mine:  # every one of them was accepted: it answers a request
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        extra = connect(server, "127.0.0.2")
        refused = answer(extra)
        extra.close()
        assert refused.startswith(b"HTTP/1.1 503"), refused[:200]
        assert b"--max-connections-per-client" in refused
        assert_mlp_answers(server)  # from 127.0.0.1
        others = [connect(server, "127.0.0.3") for _ in range(30)]
        for sock in others:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        late = connect(server, "127.0.0.4")
        refused = answer(late)
        late.close()
        assert refused.startswith(b"HTTP/1.1 503") and b"--max-connections)" in refused
    finally:
        for sock in mine + others:
            sock.close()
    wait_for(lambda: request(server.url, "GET", "/v2/health/live").status == 200,
             "a new connection to be served once the others closed")


def test_malformed_requests_cannot_fill_the_log(server: ServerProcess) -> None:
    """Each malformed request used to add a warning line to the log, without limit."""
    for _ in range(200):
        with connect(server) as sock:
            sock.sendall(b"GARBAGE \x00\x01 NOT HTTP\r\n\r\n")
            answer(sock)
    assert_mlp_answers(server)
    logged = server.log_text().count("Invalid HTTP request")
    assert 1 <= logged <= 11, logged  # the burst, then one line that says the rest count


def json_tensor(megabytes: float) -> bytes:
    """An mlp infer request of about ``megabytes`` MB of JSON numbers, in a shape the
    model refuses (so a decoded one answers 400)."""
    count = int(megabytes * MiB) // 2
    return (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, %d], "data": ['
            % count) + b"0," * (count - 1) + b"0]}]}"


def test_json_tensors_are_charged_what_decoding_them_takes(server: ServerProcess) -> None:
    """A 57 MB JSON body used to peak at ~970 MiB (14x) before its shape was refused,
    as many at once as clients sent. Decoding JSON is charged to --max-body-memory at
    40x its size first: a body that can never fit gets 413, one that does not fit now
    503, and binary tensors are the way to send big ones."""
    before = rss(server)
    fits = request(server.url, "POST", "/v2/models/mlp/infer", json_tensor(1),
                   {"Content-Type": "application/json"})
    assert fits.status == 400 and "shape" in fits.json()["error"], fits.body[:200]
    never = request(server.url, "POST", "/v2/models/mlp/infer", json_tensor(6),
                    {"Content-Type": "application/json"})
    assert never.status == 413, never.body[:200]
    assert "binary" in never.json()["error"] and "--max-body-memory" in never.json()["error"]
    # JSON decoding holds the interpreter: past --max-json-bytes it is refused outright
    over = request(server.url, "POST", "/v2/models/mlp/infer", json_tensor(10),
                   {"Content-Type": "application/json"})
    assert over.status == 413 and "--max-json-bytes" in over.json()["error"], over.body[:200]
    stalled = connect(server, "127.0.0.2")
    try:
        stalled.sendall(head("/v2/repository/index", 40 * MiB) + b" " * (30 * MiB))
        wait_for(lambda: refused_for_memory(server, 40), "the stalled body to be held")
        later = request(server.url, "POST", "/v2/models/mlp/infer", json_tensor(1),
                        {"Content-Type": "application/json"})
        assert later.status == 503 and later.header("Retry-After"), later.body[:200]
        assert_mlp_answers(server)
    finally:
        stalled.close()
    assert rss(server) - before < BODY_MEMORY + 64 * MiB


def empty_objects(megabytes: float) -> bytes:
    """A JSON object whose decoding takes 36x its size: a list of empty objects."""
    count = int(megabytes * MiB) // 3
    return b'{"prompt": [' + b"{}," * (count - 1) + b"{}]}"


def test_every_json_body_is_charged_what_decoding_it_takes(server: ServerProcess) -> None:
    """40 bodies of 7 MB sent to /v1 and /v2/repository/index used to grow RSS by 284
    MiB against a 64 MiB --max-body-memory: their JSON was decoded uncharged, and a list
    of empty objects takes 36x its text. Every JSON body is now charged 40x before it is
    decoded (in a worker thread when large): one that can never fit gets 413, one that
    does not fit now 503."""
    before = rss(server)
    never = request(server.url, "POST", "/v1/completions", empty_objects(7),
                    {"Content-Type": "application/json"})
    assert never.status == 413 and "--max-body-memory" in never.json()["error"]["message"]

    def send(path: str) -> int:
        return request(server.url, "POST", path, empty_objects(1.4),
                       {"Content-Type": "application/json"}).status

    paths = ["/v1/completions", "/v2/repository/index", "/v1/chat/completions",
             "/v2/repository/index"] * 10
    with ThreadPoolExecutor(40) as pool:
        statuses = list(pool.map(send, paths))
    assert set(statuses) <= {200, 400, 503} and 503 in statuses, statuses  # or refused
    assert_mlp_answers(server)
    assert rss(server) - before < BODY_MEMORY + 64 * MiB


class UnderOpenFilesLimit(ServerProcess):
    """A `tradeoff serve` started with 1,024 open files at most (soft and hard)."""

    def command(self) -> list[str]:
        return ["prlimit", "--nofile=1024:1024", *super().command()]


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux prlimit")
def test_idle_sockets_cannot_lock_everyone_out_under_1024_open_files(repo: Path) -> None:
    """With the common limit of 1,024 open files, 1,100 idle sockets used to take every
    descriptor: no one else could connect. The server fits its connection limits to the
    descriptors it has (a quarter for one client), says so, and serves the others."""
    with contextlib.contextmanager(running_server)(repo, cls=UnderOpenFilesLimit) as server:
        assert "serving at most 768 HTTP connections (192 per client)" in server.log_text()
        idle = [connect(server, "127.0.0.2") for _ in range(1100)]
        try:
            assert_mlp_answers(server)
            replies = [answer(sock, timeout=0.5) for sock in idle[-10:]]
        except TimeoutError:
            replies = []
        finally:
            for sock in idle:
                sock.close()
        assert replies and all(r.startswith(b"HTTP/1.1 503") for r in replies), replies[:1]
        assert b"--max-connections-per-client" in replies[0]


def test_a_refused_upload_still_gets_its_answer(server: ServerProcess) -> None:
    """A refusal sent while the client is still sending its body (an unknown model, from
    the head alone) used to be followed by an immediate close: the kernel answered the
    unread bytes with a reset, and the client lost the answer. The server now lingers,
    reading and dropping the rest, before it closes."""
    body = b" " * (8 * MiB)
    for _ in range(10):
        with connect(server) as sock:
            sock.sendall(head("/v2/models/nothing/infer", len(body)))
            sock.sendall(body)  # a reset would fail this, or the read below
            reply = answer(sock)
        assert reply.startswith(b"HTTP/1.1 404"), reply[:100]
    assert_mlp_answers(server)


def test_chunked_trailers_are_bounded_like_a_head(server: ServerProcess) -> None:
    """Trailer lines after the last chunk were appended to the request's headers without
    limit (48 MB of them grew the server by 120 MB): past --max-header-bytes, 431."""
    before = rss(server)
    with connect(server) as sock:
        sock.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n0\r\n")
        with contextlib.suppress(OSError):
            for _ in range(64):  # 64 x 256 KiB of trailer lines
                sock.sendall(b"X-T: " + b"t" * 250 + b"\r\n" * 1 + b"X-U: v\r\n" * 32000)
        reply = answer(sock)
    assert reply.startswith(b"HTTP/1.1 431") and b"trailers" in reply, reply[:200]
    assert rss(server) - before < 32 * MiB
    assert_mlp_answers(server)


def test_pipelined_requests_are_not_mistaken_for_a_long_head(server: ServerProcess) -> None:
    """1,500 small pipelined requests in one write (74 KB, more than a head may hold)
    used to get a 431: the head limit counted the whole read, not one request's head."""
    one = b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with connect(server) as sock:
        sock.sendall(one * 1499 + b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Connection: close\r\n\r\n")
        replies = answer(sock)
    assert replies.count(b"HTTP/1.1 200") == 1500, replies.count(b"HTTP/1.1 ")
    assert b"HTTP/1.1 431" not in replies


def _responses(received: bytes) -> list[tuple[bytes, bytes, bytes]]:
    """Split what a connection received into (status line, head, body) by Content-Length."""
    found = []
    while received:
        end = received.index(b"\r\n\r\n") + 4
        head = received[:end].lower()
        length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
        found.append((received[:received.index(b"\r\n")], head, received[end:end + length]))
        received = received[end + length:]
    return found


def test_pipelined_infers_answer_in_order_whichever_path_takes_them(
        server: ServerProcess) -> None:
    """Infer requests answered without ASGI, pipelined in one write with requests that go
    through it (a health check, an infer whose URL has a query), each get their own
    answer, in the order sent; an HTTP/1.0 infer last ends the connection."""
    rows = [np.full(256, i / 4, dtype=np.float32) for i in range(3)]
    bodies = [orjson.dumps({"id": f"r{i}", "inputs": [{"name": "INPUT0", "datatype": "FP32",
                                                       "shape": [1, 256], "data": row}]},
                           option=orjson.OPT_SERIALIZE_NUMPY) for i, row in enumerate(rows)]
    alone = [orjson.loads(infer_json(server.url, "mlp", orjson.loads(body)["inputs"]).body)
             for body in bodies]

    def infer(path: str, body: bytes, version: str = "1.1") -> bytes:
        return (f"POST {path} HTTP/{version}\r\nHost: 127.0.0.1\r\nContent-Type: "
                f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body

    with connect(server) as sock:
        sock.sendall(infer("/v2/models/mlp/infer", bodies[0])
                     + b"GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                     + infer("/v2/models/mlp/infer?trace=1", bodies[1])
                     + infer("/v2/models/mlp/infer", bodies[2], version="1.0"))
        replies = _responses(answer(sock))  # the HTTP/1.0 request closes the connection
    assert [status for status, _, _ in replies] == [b"HTTP/1.1 200 OK"] * 4, replies
    assert replies[1][2] == b""  # ready: 200, no body
    for reply, sent, lone in zip((0, 2, 3), range(3), alone, strict=True):
        got = orjson.loads(replies[reply][2])
        assert got["id"] == f"r{sent}"
        assert got["outputs"] == lone["outputs"]
    assert b"connection: close" in replies[3][1]
    assert b"connection: close" not in replies[0][1]


def test_a_request_pipelined_behind_a_refusal_is_not_started(server: ServerProcess) -> None:
    """A refusal that closes the connection while the next pipelined request is queued
    used to start that request on the closing connection: its writes failed and each
    logged a traceback (2,147 log lines for 30 connections)."""
    before = server.log_text().count("Traceback")
    for _ in range(30):
        with connect(server) as sock:
            sock.sendall(b"POST /v2/models/nope/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
                         b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Length: 10\r\nExpect: 100-continue\r\n\r\n")
            reply = answer(sock, timeout=10)
        assert reply.startswith(b"HTTP/1.1 404"), reply[:100]
        assert b"100 Continue" not in reply
    assert_mlp_answers(server)
    assert server.log_text().count("Traceback") == before


def test_a_compressed_body_is_charged_what_it_inflates_to(server: ServerProcess) -> None:
    """A 40 KB gzip body inflating to 40 MB used to be free of --max-body-memory (only the
    bytes on the wire were counted) and was inflated on the event loop."""
    inflating = gzip.compress(b" " * (40 * MiB))
    assert len(inflating) < 64 * 1024
    gzipped = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    alone = request(server.url, "POST", "/v2/repository/index", inflating, gzipped)
    assert alone.status == 200, alone.body[:200]  # fits the 64 MiB budget on its own
    stalled = connect(server, "127.0.0.2")
    try:
        stalled.sendall(head("/v2/repository/index", 40 * MiB) + b" " * (30 * MiB))
        wait_for(lambda: refused_for_memory(server, 40), "the stalled body to be held")
        refused = request(server.url, "POST", "/v2/repository/index", inflating, gzipped)
        assert refused.status == 503 and b"--max-body-memory" in refused.body, refused.body
    finally:
        stalled.close()


def test_a_binary_header_longer_than_the_body_is_a_400(server: ServerProcess) -> None:
    """An Inference-Header-Content-Length past the body used to be charged as JSON first
    (413 for a 20 MB claim on a 13-byte body)."""
    response = request(server.url, "POST", "/v2/models/mlp/infer", b'{"inputs": []}',
                       {"Inference-Header-Content-Length": "20000000"})
    assert response.status == 400, response.body
    assert "Inference-Header-Content-Length" in response.json()["error"]


def read_response(sock: socket.socket) -> bytes:
    """One whole response (head and Content-Length body) from a kept-alive ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed mid-response after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed mid-body"
        body += chunk
    assert len(body) == length, "more than one response arrived"
    return head + b"\r\n\r\n" + body


@pytest.mark.slow
def test_a_kept_alive_connection_closes_after_the_keep_alive_timeout(
        server: ServerProcess) -> None:
    """An answered connection stays open while requests keep coming (gaps shorter than
    the 5 s keep-alive timeout, 7 s in all) and closes once idle for the timeout."""
    payload = ('{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 256], '
               f'"data": [{", ".join(["0.5"] * 256)}]}}]}}').encode()
    infer = head("/v2/models/mlp/infer", len(payload)) + payload
    with connect(server) as sock:
        for gap_s in (0, 3.5, 3.5):
            time.sleep(gap_s)
            sock.sendall(infer)
            assert read_response(sock).startswith(b"HTTP/1.1 200")
        idle_from = time.monotonic()
        assert answer(sock, timeout=20) == b""  # closed without a word
        assert time.monotonic() - idle_from >= 4.0  # not before the timeout
