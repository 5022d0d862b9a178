"""``python -m spark_connector``: print the provider jar's path (see ``statestore spark-jar``)."""

from __future__ import annotations

from . import main

raise SystemExit(main())
