"""Write the demo ledger (three clouds, two teams, a migration, fragmentation) into a broker's store.

    python scripts/demo_ledger.py [--db-url URL]    # default: the store of BROKER_HOME / settings

Used to try `broker report` before the engine has written any real minutes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.config import load_settings
from broker.store import open_store
from tests.broker.reports.ledger import DEMO_START, demo_ledger


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db-url", help="SQLAlchemy URL of the store (default: from settings)")
    args = parser.parse_args()
    store = open_store(args.db_url or load_settings().database_url)
    writer = demo_ledger(store)
    store.dispose()
    print(f"wrote {len(writer.rows)} ledger rows from {DEMO_START:%Y-%m-%d} (UTC) over 3 days")


if __name__ == "__main__":
    main()
