"""Every driver, imported so that each registers itself (and its settings table): import this
module, not a driver's, where a backend is needed by name (the DAG files' job nodes, the
submission's checks, the RCP view). Lookups are those of `tasks.backend_api.protocol`, whose
`DRIVER_MODULES` names each module."""

from __future__ import annotations

import importlib

from tasks.backend_api.protocol import (
    DRIVER_MODULES,
    driver_for,
    driver_type,
    form_defaults,
    registered,
)

# Imported for their registration: each module registers its driver class (and table).
for _module in DRIVER_MODULES.values():
    importlib.import_module(_module)

__all__ = ["driver_for", "driver_type", "form_defaults", "registered"]
