"""Every backend, imported so that each registers itself (and its settings table): import this
module, not a backend's, where a backend is needed by name (the DAG files, the submission's
checks, the RCP view). Lookups are those of `tasks.backend_api.protocol`."""

from __future__ import annotations

# Imported for their registration: each module registers its backend class (and table).
import tasks.backends.gke.backend
import tasks.backends.local
import tasks.backends.slurm.backend
from tasks.backend_api.protocol import backend_for, backend_type, form_defaults, registered

BACKEND_MODULES = (
    tasks.backends.local.__name__,
    tasks.backends.gke.backend.__name__,
    tasks.backends.slurm.backend.__name__,
)

__all__ = ["BACKEND_MODULES", "backend_for", "backend_type", "form_defaults", "registered"]
