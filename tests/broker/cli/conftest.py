from __future__ import annotations

import os

# This machine is not a GCE VM: spare each GCP poll google-auth's 3 s metadata-server probe.
os.environ.setdefault("NO_GCE_CHECK", "true")
