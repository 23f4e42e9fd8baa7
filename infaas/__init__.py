"""infaas: a model-less inference service.

Send a task, inputs and targets; infaas picks the cheapest model variant that meets them.
"""

from __future__ import annotations

from infaas.client import Client, QueryResult
from infaas.errors import InfaasError
from infaas.settings import Settings

__all__ = ["Client", "InfaasError", "QueryResult", "Settings", "__version__"]

__version__ = "0.1.0"
