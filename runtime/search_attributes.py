"""Registering the keyword search attributes the Web UI filters exports by."""

from __future__ import annotations

import logging

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from workflows.models import SEARCH_ATTRIBUTE_NAMES

log = logging.getLogger(__name__)


async def register_search_attributes(client: Client, namespace: str) -> bool:
    """Register ``ExportJobId``, ``ExportTenantId`` and ``ExportOutcome``; True when they exist afterwards.

    Existing ones are left alone. A server that refuses (no operator permission, no support) is logged
    and tolerated: the workflow sets the attributes only where the server has them.
    """
    wanted = {name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for name in SEARCH_ATTRIBUTE_NAMES}
    try:
        existing = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
        wanted = {k: v for k, v in wanted.items() if k not in existing.custom_attributes}
    except RPCError as exc:
        log.info("cannot list search attributes (%s); trying to add them", exc.status.name)
    if not wanted:
        return True
    try:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=namespace, search_attributes=wanted)
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.ALREADY_EXISTS:
            return True
        log.warning(
            "search attributes not registered (%s); the Web UI cannot filter by them", exc.status.name
        )
        return False
    return True
