"""How every process reaches Temporal: the one place a client is built.

Workers, the API, the command line, the demo and the tests all connect through ``connect_client``, so
every client carries the pydantic data converter (payloads are pydantic models of IDs, sizes, hashes and
codes) and the same connection options.
"""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter

from settings import Settings

DATA_CONVERTER: DataConverter = pydantic_data_converter


async def connect_client(settings: Settings) -> Client:
    """A Temporal client for ``settings.temporal_address`` and ``settings.temporal_namespace``."""
    return await Client.connect(
        settings.temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=DATA_CONVERTER,
    )
