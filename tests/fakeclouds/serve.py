"""Serve the synthetic market of all three clouds on 127.0.0.1 until interrupted.

    python -m tests.fakeclouds.serve [--latency 0.1] [--fail aws:DescribeSpotPriceHistory:500]

prints the ``export`` lines that point ``broker prices --refresh`` at it.
"""

from __future__ import annotations

import argparse
import contextlib
import threading

from tests.fakeclouds.market import fake_clouds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added to every request")
    parser.add_argument("--fail", action="append", default=[], metavar="CLOUD:CALL:STATUS",
                        help="answer every CALL (e.g. aws:DescribeSpotPriceHistory:500) with STATUS")
    args = parser.parse_args()
    with fake_clouds(args.latency) as clouds:
        for spec in args.fail:
            cloud, call, status = spec.split(":")
            getattr(clouds, cloud).fail(call, int(status), times=None)
        for name, value in clouds.environment().items():
            print(f"export {name}={value}")
        print("# serving; Ctrl-C to stop", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
