"""The explorer answers only its user's page, without a browser: raw sockets and http.client
against a server started in this process on 127.0.0.1, port 0 (issue 43, item 4).

Refused: a foreign ``Host`` (DNS rebinding) and ``Origin`` (a cross-site page), an API call
without the session's token, an oversized body, an over-long request line, a client too slow
to send its request; every refusal and every other status is JSON. 300 connections that send
nothing hold no worker thread, and a normal request is answered beside them. A client that
goes away mid-answer is one log line. A cancelled serving replay ends its worker process.
No test bounds wall-clock time; the timeouts below only keep a broken server from hanging.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import struct
import threading
import time

import pytest

from sim.explore import server as explore_server
from sim.explore.server import TOKEN_HEADER, Explorer, make_server

WAIT_S = 60  # generous: only so that a broken server fails instead of hanging


@pytest.fixture
def srv():
    server = make_server(0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def ask(server, method: str, path: str, body: bytes | None = None, headers=None, token=True):
    port = server.server_address[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    sent = {TOKEN_HEADER: server.token} if token else {}
    conn.request(method, path, body=body, headers={**sent, **(headers or {})})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, r.getheader("Content-Type") or "", data


def raw(server, data: bytes, *, slow_s: float = 0.0) -> bytes:
    """Send ``data`` (a byte at a time, ``slow_s`` apart, when slow) and read the answer whole."""
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=WAIT_S) as s:
        if slow_s:
            for i in range(len(data)):
                try:
                    s.sendall(data[i:i + 1])
                except OSError:  # the server gave up on us: read what it said
                    break
                time.sleep(slow_s)
        else:
            s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def json_error(answer: bytes) -> tuple[int, str]:
    head, _sep, body = answer.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    assert b"application/json" in head, head
    return status, json.loads(body)["error"]


def test_the_page_carries_a_token_that_the_api_requires(srv):
    status, kind, page = ask(srv, "GET", "/", token=False)
    assert status == 200 and kind.startswith("text/html")
    token = re.search(rb'<meta name="decodesim-token" content="([^"]+)">', page).group(1).decode()
    assert token == srv.token and len(token) >= 24
    assert make_server(0).token != token  # one per session
    for path in ("/api/options", "/api/serve?job=1"):
        status, kind, data = ask(srv, "GET", path, token=False)
        assert status == 403 and kind.startswith("application/json") and TOKEN_HEADER in json.loads(data)["error"]
    for path in ("/api/view", "/api/curves", "/api/export", "/api/serve", "/api/serve/cancel"):
        status, _kind, data = ask(srv, "POST", path, b'{"setups": [{}]}', token=False)
        assert status == 403, path
        status, _kind, data = ask(srv, "POST", path, b'{"setups": [{}]}', {TOKEN_HEADER: "x" + srv.token[1:]},
                                  token=False)
        assert status == 403, path
    status, _kind, data = ask(srv, "GET", "/api/options")
    assert status == 200 and "weights" in json.loads(data)


@pytest.mark.parametrize("headers", [
    {"Host": "evil.example"}, {"Host": "evil.example:{port}"}, {"Host": "127.0.0.1.evil.example:{port}"},
    {"Host": "127.0.0.1:1"}, {"Host": ""},
    {"Origin": "http://evil.example"}, {"Origin": "http://127.0.0.1:1"}, {"Origin": "null"},
    {"Origin": "https://127.0.0.1:{port}"},
])
def test_a_foreign_host_or_origin_is_refused(srv, headers):
    port = srv.server_address[1]
    headers = {k: v.format(port=port) for k, v in headers.items()}
    for method, path, body in (("GET", "/", None), ("GET", "/api/options", None),
                               ("POST", "/api/view", b'{"setups": [{}]}')):
        status, kind, data = ask(srv, method, path, body, headers)
        assert status == 403 and kind.startswith("application/json"), (headers, path)
        assert json.loads(data)["error"].startswith("decodesim: ")
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):  # its own names pass
        assert ask(srv, "GET", "/api/options", headers={"Host": host, "Origin": f"http://{host.split(':')[0]}:{port}"}
                   )[0] == 200


def test_a_flag_allows_another_name():
    server = make_server(0, allow_hosts=["devbox.lan"])
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        assert ask(server, "GET", "/api/options", headers={"Host": f"devbox.lan:{port}",
                                                           "Origin": f"http://devbox.lan:{port}"})[0] == 200
        assert ask(server, "GET", "/api/options", headers={"Host": "other.lan"})[0] == 403
    finally:
        server.shutdown()
        server.server_close()


def test_every_status_is_json(srv):
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
        status, kind, data = ask(srv, method, "/api/view", b"{}")
        assert status == 405 and kind.startswith("application/json")
        assert json.loads(data)["error"].startswith("decodesim: 405")
    status, kind, data = ask(srv, "BREW", "/")
    assert status == 501 and json.loads(data)["error"].startswith("decodesim: 501")
    assert ask(srv, "GET", "/nope")[0] == 404 and json.loads(ask(srv, "GET", "/nope")[2])["error"]
    assert ask(srv, "POST", "/api/view", b"{")[0] == 400
    status, error = json_error(raw(srv, b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
    assert status == 414 and error.startswith("decodesim: ")
    status, error = json_error(raw(srv, b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * 3000 + b"\r\n"))
    assert status == 431
    status, error = json_error(raw(srv, b"\x16\x03\x01 garbage\r\n\r\n"))  # TLS to a plain port, say
    assert status == 400 and error.startswith("decodesim: ")


def test_an_oversized_body_is_refused(srv):
    big = b'{"setups": [{"overrides": "' + b"x" * (explore_server.MAX_BODY_BYTES + 10) + b'"}]}'
    status, kind, data = ask(srv, "POST", "/api/view", big)
    assert status == 413 and kind.startswith("application/json") and "at most" in json.loads(data)["error"]
    status, error = json_error(raw(srv, b"POST /api/view HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99999999999\r\n"
                                        b"\r\n"))
    assert status == 413
    assert ask(srv, "GET", "/api/options")[0] == 200


def test_a_slow_client_is_cut_off(srv, capsys):
    srv.request_deadline_s = 0.5
    status, error = json_error(raw(srv, b"GET /api/options HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", slow_s=0.05))
    assert status == 408 and "no complete request" in error
    status, error = json_error(raw(srv, b"POST /api/view HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"))
    assert status == 408
    assert "Traceback" not in capsys.readouterr().err


def test_300_half_open_connections_hold_no_thread(srv):
    port = srv.server_address[1]
    baseline = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) for _ in range(300)]
    partial = [socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) for _ in range(20)]
    for s in partial:
        s.sendall(b"POST /api/view HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 50\r\n\r\n{")
    try:
        status, _kind, data = ask(srv, "GET", "/api/options")  # answered beside them
        assert status == 200 and json.loads(data)["hardware"]
        status, _kind, data = ask(srv, "POST", "/api/view", b'{"setups": [{"engine": "analytic", "steps": "1"}]}')
        assert status == 200 and json.loads(data)["views"][0]["summary"]["verdict"] == "meets-target"
        workers = [t for t in threading.enumerate() if t.name.startswith("explore-worker")]
        assert len(workers) <= explore_server.MAX_WORKERS
        assert threading.active_count() <= baseline + explore_server.MAX_WORKERS + 1
    finally:
        for s in idle + partial:
            s.close()
    srv.request_deadline_s = 0.2  # the rest are dropped, and it still answers
    assert ask(srv, "GET", "/api/options")[0] == 200


def test_a_client_that_goes_away_is_a_log_line(srv, capsys):
    port = srv.server_address[1]
    seen = ""
    for _ in range(10):
        s = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"GET /plotly.min.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        s.recv(100)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        s.close()
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and "went away" not in seen:
            time.sleep(0.05)
            seen += capsys.readouterr().err
        if "went away" in seen:
            break
    assert "went away mid-request" in seen and "Traceback" not in seen
    assert len(seen.strip().splitlines()) <= 10
    assert ask(srv, "GET", "/api/options")[0] == 200


def _wait_finished(jobs, job_id: int) -> dict:
    deadline = time.monotonic() + WAIT_S
    while not jobs.status(job_id)["finished"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return jobs.status(job_id)


def test_a_cancelled_replay_ends_its_worker_process():
    explorer = Explorer()
    job = explorer.jobs.start({"setups": [{}, {"kv": "int8"}], "serving": {"rates": "150", "duration_s": "120"}})
    proc = explorer.jobs.jobs[job["id"]]["proc"]
    assert proc.poll() is None  # a replay of 18,000 requests is under way in its own process
    assert explorer.jobs.cancel(job["id"])["cancelled"]
    assert proc.wait(timeout=WAIT_S) is not None  # the process, and its work, ended
    final = _wait_finished(explorer.jobs, job["id"])
    assert final["finished"] and final["done"] < final["total"] and final["error"] is None


def test_a_new_search_ends_the_one_before():
    explorer = Explorer()
    form = {"model": "llama-3-8b", "hardware": "h200-sxm", "rate": "4", "duration_s": "10", "max_replays": "2"}
    first = explorer.searches.start({"search": form})
    proc = explorer.searches.jobs[first["id"]]["proc"]
    second = explorer.searches.start({"search": form})
    assert proc.wait(timeout=WAIT_S) is not None and explorer.searches.status(first["id"])["cancelled"]
    explorer.searches.cancel({"job": second["id"]})
    assert _wait_finished(explorer.searches, second["id"])["cancelled"]


def test_a_replay_is_bounded_before_it_starts():
    from sim.explore.views import FormError

    with pytest.raises(FormError, match="at most 20,000 requests"):
        Explorer().jobs.start({"setups": [{}], "serving": {"rates": "8000", "duration_s": "120"}})
    with pytest.raises(FormError, match="1 to 6 setups"):
        Explorer().jobs.start({"setups": [{}] * 7, "serving": {}})
