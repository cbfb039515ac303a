"""Write broker/data/skypilot_schema.json: SkyPilot's task and resources YAML schemas, as the installed
SkyPilot builds them, for ``broker.spec.sky_schema`` (which checks a job file by them without importing
SkyPilot). Run it after upgrading SkyPilot; tests/broker/spec/test_sky_schema.py fails until it is run.

    python scripts/skypilot_schema.py
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "broker" / "data" / "skypilot_schema.json"


def current() -> dict[str, object]:
    """The schemas of the installed SkyPilot (imports it: seconds)."""
    import sky
    from sky import resources
    from sky.utils import schemas

    return {"skypilot": sky.__version__, "task": schemas.get_task_schema(),
            "resources": schemas.get_resources_schema(), "resource_aliases": dict(resources.RESOURCE_CONFIG_ALIASES)}


def render(schemas: dict[str, object]) -> str:
    return json.dumps(schemas, indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    OUT.write_text(render(current()))
    print(f"wrote {OUT}")
