"""``python -m committers.delta inspect|vacuum|remove-orphans TABLE_URI``: see
``docs/inspect.md``."""

from committers.delta.inspect._inspect_cli import main

raise SystemExit(main())
