"""Drives `decide mcp` with the official MCP Python SDK (`mcp` from PyPI), as an MCP client nobody here wrote.

    mcp_client.py stdio DECIDE_BINARY CONFIG PIDFILE   # starts `decide mcp --expose found --config CONFIG` itself
    mcp_client.py http URL PIDFILE API_KEY             # talks to a running `decide mcp --http --api-key API_KEY`
    mcp_client.py http-found URL ALWAYS                # talks to a running `decide mcp --http --expose found
                                                       # --always-include ALWAYS` whose upstreams include
                                                       # server-everything over streamable HTTP (--mcp-url)
    mcp_client.py upstream                             # a tiny stdio MCP server with a tool named like one of
                                                       # server-everything's (the name clash) and one that
                                                       # never answers (decide-mcp's hanging-upstream test)

The upstreams (CONFIG) are the npm servers @modelcontextprotocol/server-everything (started through `sh`, which
writes its pid to PIDFILE so that it can be killed mid-session) and @modelcontextprotocol/server-memory, and the
tiny server. Every check is an assert; on success the script prints one JSON line of what it saw.
"""

import asyncio
import json
import os
import signal
import sys
import time



def upstream():
    """A minimal MCP server over stdio (plain Python, no SDK): `echo`, whose name server-everything has too, and
    `hang`, which never answers."""
    for line in sys.stdin:
        message = json.loads(line)
        method = message.get("method")
        if "id" not in message:
            continue
        if method == "initialize":
            result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                      "serverInfo": {"name": "tiny", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "echo", "description": "Repeats a word backwards",
                                 "inputSchema": {"type": "object", "properties": {"word": {"type": "string"}}}},
                                {"name": "hang", "description": "Never answers", "inputSchema": {"type": "object"}}]}
        elif method == "tools/call" and message["params"]["name"] == "hang":
            continue
        elif method == "tools/call":
            word = message["params"].get("arguments", {}).get("word", "")
            result = {"content": [{"type": "text", "text": word[::-1]}]}
        else:
            result = {}
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)


def text_of(result):
    return "\n".join(block.text for block in result.content if block.type == "text")


def pid_of(pidfile):
    with open(pidfile) as f:
        return int(f.read().strip())


async def told(changed, how):
    """Waits up to 5 s for a notifications/tools/list_changed."""
    for _ in range(50):
        if changed:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no notifications/tools/list_changed{how}")


async def exercise(session, found_mode, pidfile, changed):
    seen = {}
    init = await session.initialize()
    assert init.server_info.name == "decide", init.server_info
    assert init.capabilities.tools is not None and init.capabilities.tools.list_changed is True, init.capabilities
    seen["protocol"] = init.protocol_version
    assert (await session.send_ping()) is not None

    listed = [t.name for t in (await session.list_tools()).tools]
    assert listed == (["search_tools"] if found_mode else ["search_tools", "call_tool"]), listed

    async def search(query, **extra):
        result = await session.call_tool("search_tools", {"query": query, **extra})
        assert not result.is_error, text_of(result)
        tools = result.structured_content["tools"]
        # The text block carries the same answer, for clients that read only text.
        assert json.loads(text_of(result))["tools"] == tools
        for tool in tools:
            assert set(tool) == {"name", "description", "inputSchema", "probability", "server"}, tool
            assert 0.0 <= tool["probability"] <= 1.0
        probabilities = [t["probability"] for t in tools]
        assert probabilities == sorted(probabilities, reverse=True), probabilities
        return tools

    async def call(name, arguments):
        if found_mode:
            return await session.call_tool(name, arguments)
        return await session.call_tool("call_tool", {"name": name, "arguments": arguments})

    # The sum tool of server-everything, found by what it does.
    sums = await search("add two numbers")
    names = [t["name"] for t in sums]
    assert "get-sum" in names, sums
    seen["add two numbers"] = names
    get_sum = sums[names.index("get-sum")]
    assert get_sum["server"] == "everything", get_sum
    assert get_sum["inputSchema"]["properties"].keys() >= {"a", "b"}, get_sum
    if found_mode:
        # The list grew by what the search found, and the client was told.
        await told(changed, "")
        listed = [t.name for t in (await session.list_tools()).tools]
        assert listed[0] == "search_tools" and "get-sum" in listed, listed
        seen["listed after the search"] = listed
    result = await call("get-sum", {"a": 19, "b": 23})
    assert not result.is_error and "42" in text_of(result), result

    # A second real server: the memory server's knowledge graph, written then read.
    create = await search("create new entities in the knowledge graph")
    seen["create new entities in the knowledge graph"] = [t["name"] for t in create]
    assert "create_entities" in seen["create new entities in the knowledge graph"], create
    result = await call("create_entities", {"entities": [
        {"name": "Anna", "entityType": "person", "observations": ["lives in Berlin"]}]})
    assert not result.is_error, text_of(result)
    # Its structured content comes back as the server sent it.
    assert result.structured_content["entities"][0]["name"] == "Anna", result.structured_content
    result = await call("open_nodes", {"names": ["Anna"]})
    assert not result.is_error and "lives in Berlin" in text_of(result), text_of(result)

    # A tool error is the server's own, passed back as a result marked isError.
    result = await call("add_observations", {"observations": [{"entityName": "Nobody", "contents": ["x"]}]})
    assert result.is_error, result
    assert "Nobody" in text_of(result), text_of(result)
    seen["tool error"] = text_of(result)

    # Unknown tools are a result marked isError too, naming the way to find tools.
    result = await call("no-such-tool", {})
    assert result.is_error and "search_tools" in text_of(result), text_of(result)

    # The name both server-everything and the tiny server have is prefixed with each server's name.
    echoes = await search("echo back a message", max_results=20)
    echo_names = {t["name"] for t in echoes}
    seen["echo back a message"] = sorted(echo_names)
    assert "echo" not in echo_names, echo_names
    result = await call("tiny__echo", {"word": "drawer"})
    assert not result.is_error and text_of(result) == "reward", text_of(result)
    result = await call("everything__echo", {"message": "hi"})
    assert not result.is_error and text_of(result) == "Echo: hi", text_of(result)

    # The upstream killed mid-session: the next call fails naming it, and after the backoff it is back.
    first = pid_of(pidfile)
    os.kill(first, signal.SIGKILL)
    await asyncio.sleep(0.5)
    result = await call("get-sum", {"a": 1, "b": 2})
    assert result.is_error and "everything" in text_of(result), text_of(result)
    seen["killed"] = text_of(result)
    deadline = time.monotonic() + 30
    while True:
        await asyncio.sleep(1.0)
        result = await call("get-sum", {"a": 1, "b": 2})
        if not result.is_error:
            break
        assert time.monotonic() < deadline, text_of(result)
    assert "3" in text_of(result), text_of(result)
    assert pid_of(pidfile) != first, "the server was not restarted"
    # The other servers were not disturbed.
    result = await call("open_nodes", {"names": ["Anna"]})
    assert not result.is_error and "lives in Berlin" in text_of(result), text_of(result)
    return seen


async def exercise_found(session, always, changed):
    """`--expose found` over HTTP: the always-included tool is listed from the start, found tools join the list
    (announced with list_changed) and are called by their own names, and the list only ever grows."""
    seen = {}
    init = await session.initialize()
    assert init.capabilities.tools.list_changed is True, init.capabilities
    listed = [t.name for t in (await session.list_tools()).tools]
    assert listed == ["search_tools", always], listed
    seen["listed at the start"] = listed
    result = await session.call_tool(always, {})
    assert not result.is_error, text_of(result)

    result = await session.call_tool("search_tools", {"query": "add two numbers"})
    assert not result.is_error, text_of(result)
    found = result.structured_content["tools"]
    names = [t["name"] for t in found]
    assert "get-sum" in names, found
    # The sum tool comes from the upstream reached by URL, named by its own server info.
    server = found[names.index("get-sum")]["server"]
    assert server.startswith("mcp-servers"), found
    seen["add two numbers"] = {"tools": names, "server": server}
    await told(changed, " over HTTP")
    grown = [t.name for t in (await session.list_tools()).tools]
    assert grown[:2] == listed and "get-sum" in grown, grown
    # The search tool found itself is not listed twice.
    assert len(grown) == len(set(grown)), grown
    result = await session.call_tool("get-sum", {"a": 19, "b": 23})
    assert not result.is_error and "42" in text_of(result), result

    # A second search adds to the list; nothing found before leaves it, and the order is kept.
    result = await session.call_tool("search_tools", {"query": "create new entities in the knowledge graph"})
    assert not result.is_error, text_of(result)
    later = [t.name for t in (await session.list_tools()).tools]
    assert later[:len(grown)] == grown, (grown, later)
    assert "create_entities" in later, later
    seen["listed at the end"] = later
    return seen


async def main():
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client

    mode = sys.argv[1]
    changed = []

    async def on_message(message):
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            changed.append(message)

    if mode == "stdio":
        binary, config, pidfile = sys.argv[2:5]
        params = StdioServerParameters(command=binary,
                                       args=["mcp", "--expose", "found", "--config", config],
                                       cwd=os.getcwd())
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write, message_handler=on_message) as session:
                seen = await exercise(session, True, pidfile, changed)
    elif mode == "http-found":
        url, always = sys.argv[2:4]
        async with streamable_http_client(url) as streams:
            async with ClientSession(streams[0], streams[1], message_handler=on_message) as session:
                seen = await exercise_found(session, always, changed)
    else:
        import httpx2

        url, pidfile, key = sys.argv[2:5]
        # Without the key the endpoint refuses the request before any MCP is read.
        async with httpx2.AsyncClient() as bare:
            refused = await bare.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                                      headers={"accept": "application/json, text/event-stream"})
            assert refused.status_code == 401, refused
        client = httpx2.AsyncClient(headers={"authorization": f"Bearer {key}"},
                                    timeout=httpx2.Timeout(60.0, read=300.0))
        async with client, streamable_http_client(url, http_client=client) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write, message_handler=on_message) as session:
                seen = await exercise(session, False, pidfile, changed)
    print(json.dumps(seen))


if __name__ == "__main__":
    if sys.argv[1] == "upstream":
        upstream()
    else:
        asyncio.run(main())
