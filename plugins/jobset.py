"""The trigger's classpath of earlier releases, kept so deferred tasks serialized with it resume."""

from tasks.backends.gke.triggers import JobSetTrigger

__all__ = ["JobSetTrigger"]
