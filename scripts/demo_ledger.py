"""Write the demo ledger (three clouds, two teams, a migration, fragmentation) into a broker home of its own.

    .venv/bin/python scripts/demo_ledger.py [--home DIR]     # default: ~/.broker-demo
    BROKER_HOME=~/.broker-demo .venv/bin/broker report --from 2026-03-02 --to 2026-03-05

Used to try `broker report` before the engine has written any real minutes. It never touches
your own broker home (``~/.broker`` or ``BROKER_HOME``): the demo's jobs are not real, so none is
left RUNNING for an engine to pick up.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_HOME = Path.home() / ".broker-demo"


def main() -> None:
    from sqlalchemy import update

    from broker.store import open_store
    from broker.store.tables import JobRow
    from tests.broker.reports.ledger import DEMO_START, demo_ledger

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--home", type=Path, default=DEFAULT_HOME,
                        help=f"broker home to write the demo store into (default {DEFAULT_HOME})")
    args = parser.parse_args()
    home = args.home.expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    store = open_store(f"sqlite:///{home / 'broker.db'}")
    try:
        writer = demo_ledger(store)
        with store.transaction() as s:  # the story's last job is mid-run at the window's end: close it
            s.execute(update(JobRow).where(JobRow.state.not_in(("SUCCEEDED", "FAILED", "CANCELLED")))
                      .values(state="SUCCEEDED"))
    finally:
        store.dispose()
    print(f"wrote {len(writer.rows)} ledger rows from {DEMO_START:%Y-%m-%d} (UTC) over 3 days into the broker "
          f"home {home}")
    print(f"read it with: BROKER_HOME={home} broker report --from 2026-03-02 --to 2026-03-05")


if __name__ == "__main__":
    main()
