"""What one hostile request costs the service: the body depth check, and /v1/health under attack.

    python benchmarks/request_limits.py [--pairs 1000,4000,16000,32000] [--slow 1000] [--health 400]

Part 1 times the JSON depth check on the body that stalled the service: '"' followed by N escaped
quotes, plus the scanner's own worst bodies at the 2 MB limit. The baseline is the former check
(a regular expression that removed strings, restarted at every quote), measured in the same run;
it is skipped for bodies where it would take more than a minute.

Part 2 starts the API with the service's server settings on 127.0.0.1 and measures GET /v1/health
latency while one client posts the worst 2 MB body the limits allow over and over and another holds
`--slow` half-sent requests from 50 addresses (their headers never finish). Baseline: the same health requests with
no attack, in the same run.
"""

from __future__ import annotations

import argparse
import re
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker.api.limits import MAX_BODY_BYTES, json_depth  # noqa: E402

_FORMER_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_FORMER_BRACKETS = re.compile(rb"[\[\]{}]")


def former_json_depth(body: bytes) -> int:
    depth = deepest = 0
    for bracket in _FORMER_BRACKETS.findall(_FORMER_STRING.sub(b'""', body)):
        if bracket in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth = max(0, depth - 1)
    return deepest


def timed(check: object, body: bytes) -> float:
    started = time.perf_counter()
    check(body)  # type: ignore[operator]
    return time.perf_counter() - started


def depth_part(pairs: list[int]) -> None:
    print("depth check on '\"' + N x '\\\"' (the stall); seconds")
    print(f"{'N':>8} {'bytes':>9} {'former':>9} {'now':>9} {'former/now':>11}")
    former_s = 0.0
    for n in pairs:
        body = b'"' + b'\\"' * n
        now = timed(json_depth, body)
        former = timed(former_json_depth, body) if former_s < 15 else float("nan")
        former_s = former
        print(f"{n:>8} {len(body):>9} {former:>9.3f} {now:>9.4f} {former / now:>11.0f}")
    half = MAX_BODY_BYTES // 2
    print("the scanner's worst bodies at the 2 MB limit; seconds (ms per KB)")
    for name, body in (("'[]' repeated", b"[]" * half), ("'\"' repeated", b'"' * MAX_BODY_BYTES),
                       ("'[\"\"],' repeated", b"[" + b'[""],' * ((MAX_BODY_BYTES - 3) // 5) + b"1]"),
                       ("'{\"\":1}' repeated", b'{"":1}' * (MAX_BODY_BYTES // 6)),
                       ("escaped quotes", b'"' + b'\\"' * (half - 1))):
        seconds = timed(json_depth, body)
        print(f"  {name:<16} {seconds:.3f} s ({seconds * 1000 / (len(body) / 1024):.3f} ms/KB)")


SERVER = """
import sys, tempfile, time
from pathlib import Path
from broker.api.app import BackgroundServer, create_app
from broker.api.jobs import JobIntake
from broker.clock import WallClock
from broker.store import open_store
from broker.tokens import create_api_token
home = tempfile.mkdtemp()
store = open_store(f"sqlite:///{home}/broker.db")
server = BackgroundServer(create_app(store, WallClock(), JobIntake(Path(home), "local"))).start()
print(server.port, create_api_token(store, "bench").token, flush=True)
sys.stdin.read()
server.stop()
"""


def health_part(slow: int, health: int) -> None:
    import subprocess

    import httpx

    # The service in a process of its own, as `broker serve` runs: the clients here do not share its GIL.
    process = subprocess.Popen([sys.executable, "-c", SERVER], cwd=ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        port_text, token = process.stdout.readline().split()
        host, port = "127.0.0.1", int(port_text)
        url = f"http://{host}:{port}"
        # The health client has its own loopback address, as a user beside the attackers would.
        with httpx.Client(base_url=url, timeout=30, transport=httpx.HTTPTransport(local_address="127.0.0.2")) as client:
            while True:
                try:
                    client.get("/v1/health")
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
            baseline = _latencies(client, health)
            stop = threading.Event()
            # 2 MB of the cheapest values to scan and the costliest to validate the limits let through
            # (arrays of arrays, the costliest, are refused past 10,000)
            worst = b'{"spec": [' + b'"",' * ((MAX_BODY_BYTES - 14) // 3) + b"1]}"
            posted: dict[int, int] = {}

            def attacker() -> None:
                with httpx.Client(base_url=url, timeout=60) as hostile:
                    while not stop.is_set():
                        status = hostile.post("/v1/jobs", content=worst, headers={
                            "Authorization": f"Bearer {token}", "Content-Type": "application/json"}).status_code
                        posted[status] = posted.get(status, 0) + 1

            holders = _slow_connections(host, port, slow)
            thread = threading.Thread(target=attacker, daemon=True)
            thread.start()
            attacked = _latencies(client, health)
            stop.set()
            thread.join(timeout=120)
            held = sum(1 for sock in holders if _still_open(sock))
            for sock in holders:
                sock.close()
    finally:
        process.communicate("", timeout=30)
    print(f"GET /v1/health, {health} requests; ms")
    print(f"{'':<34} {'p50':>8} {'p99':>8} {'max':>8}")
    for name, values in (("no attack (baseline)", baseline),
                         (f"2 MB bodies + {slow} slow connections", attacked)):
        ordered = sorted(values)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        print(f"{name:<34} {statistics.median(ordered) * 1000:>8.1f} {p99 * 1000:>8.1f} {ordered[-1] * 1000:>8.1f}")
    print(f"hostile 2 MB bodies posted during the run, by answer: {posted}")
    print(f"slow connections the server still held at the end: {held} of {slow}")


def _latencies(client: object, count: int) -> list[float]:
    values = []
    for _ in range(count):
        started = time.perf_counter()
        response = client.get("/v1/health")  # type: ignore[attr-defined]
        values.append(time.perf_counter() - started)
        assert response.status_code == 200
        time.sleep(0.01)
    return values


def _slow_connections(host: str, port: int, count: int) -> list[socket.socket]:
    holders = []
    for _ in range(count):
        # spread over 50 loopback addresses, 20 each: under the per-client cap, so only the header
        # time limit and the cap on all connections can close them
        sock = socket.create_connection((host, port), timeout=5, source_address=(f"127.0.1.{len(holders) % 50 + 1}", 0))
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        holders.append(sock)
    return holders


def _still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", default="1000,4000,16000,32000")
    parser.add_argument("--slow", type=int, default=1000)
    parser.add_argument("--health", type=int, default=400)
    parser.add_argument("--depth-only", action="store_true", help="part 1 only")
    args = parser.parse_args()
    depth_part([int(n) for n in args.pairs.split(",")])
    if not args.depth_only:
        health_part(args.slow, args.health)


if __name__ == "__main__":
    main()
