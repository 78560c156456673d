"""A worker's start-up calls to Temporal wait out a restart (the soak saw a worker exit on "tcp connect
error" while it ensured the Schedules during a Temporal restart): against the session's dev server behind a
TCP proxy that cuts every connection and refuses new ones for a while, a real fault at a named seam."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from runtime.temporal_calls import transient, until_temporal_answers
from testbed.tcp_proxy import TcpProxy


async def proxied_client(dev_env: WorkflowEnvironment, proxy: TcpProxy) -> Client:
    return await Client.connect(f"127.0.0.1:{proxy.port}", namespace=dev_env.client.namespace)


async def system_info(client: Client) -> object:
    return await client.workflow_service.get_system_info(GetSystemInfoRequest())


async def test_a_start_up_call_waits_for_a_restarting_server_and_then_answers(dev_env):
    host, port = dev_env.client.service_client.config.target_host.rsplit(":", 1)
    proxy = TcpProxy(host, int(port)).start()
    try:
        client = await proxied_client(dev_env, proxy)
        proxy.refuse_new_connections()
        proxy.close_all()  # the server "restarts": every connection cut, new ones refused
        with pytest.raises(RPCError) as down:
            await system_info(client)
        assert transient(down.value), down.value  # what a worker met at start: the transport's "not now"

        async def back_in_two_seconds() -> None:
            await asyncio.sleep(2.0)  # the length of the outage, not a race: the call must outlast it
            proxy.refuse_new_connections(False)

        reopening = asyncio.create_task(back_in_two_seconds())
        answer = await until_temporal_answers(lambda: system_info(client), "system info", within=30)
        await reopening
        assert answer is not None
    finally:
        proxy.stop()


async def test_a_call_gives_up_after_its_bound_with_the_servers_last_answer(dev_env):
    host, port = dev_env.client.service_client.config.target_host.rsplit(":", 1)
    proxy = TcpProxy(host, int(port)).start()
    try:
        client = await proxied_client(dev_env, proxy)
        proxy.refuse_new_connections()
        proxy.close_all()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(RPCError) as gave_up:
            await until_temporal_answers(lambda: system_info(client), "system info", within=1.5)
        assert transient(gave_up.value)
        assert 1.4 <= loop.time() - started < 10
    finally:
        proxy.stop()


async def test_an_answer_that_is_a_no_is_not_retried(dev_env):
    calls = 0

    async def refused() -> None:
        nonlocal calls
        calls += 1
        raise RPCError("no such schedule", RPCStatusCode.NOT_FOUND, b"")

    with pytest.raises(RPCError):
        await until_temporal_answers(refused, "a schedule", within=30)
    assert calls == 1
