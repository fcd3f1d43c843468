"""Measures what `decide mcp` saves in tool-definition tokens on a real catalogue: LiveMCPBench's 526 MCP tools (from
crates/decide-eval/data/livemcpbench), served by one upstream (this script, in `upstream` mode) behind `decide mcp`,
driven by the official MCP Python SDK.

    python scripts/mcp-token-saving.py DECIDE_BINARY

Tokens are counted with OpenAI's o200k_base encoding (the `bpe-openai` package, which ships it), over the JSON the
client would put in its LLM request:

* before: every upstream tool definition (name, description, inputSchema), as the client lists them without decide;
* after: `decide mcp`'s own `tools/list` (search_tools and call_tool), plus, per task, the text of the
  `search_tools` result for the task (the 5 tools found, with their schemas), which enters the conversation.

Needs: `pip install mcp==2.3.0 bpe-openai==0.1.4`. Prints one JSON object.
"""

import asyncio
import json
import os
import statistics
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DATA = os.path.join(ROOT, "crates/decide-eval/data/livemcpbench")


def catalogue():
    with open(os.path.join(DATA, "catalogue.json")) as f:
        tools = json.load(f)["tools"]
    return [{"name": t["name"], "description": t.get("description", ""), "inputSchema": t["inputSchema"]}
            for t in tools]


def upstream():
    """A stdio MCP server listing the catalogue (calls are not needed to count definitions)."""
    tools = catalogue()
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue
        method = message.get("method")
        if method == "initialize":
            result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                      "serverInfo": {"name": "livemcpbench", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": tools}
        else:
            result = {"content": [{"type": "text", "text": "not served"}], "isError": True}
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)


async def measure(binary):
    from bpe_openai import get_encoding
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    encoding = get_encoding("o200k_base")

    def tokens(value):
        return len(encoding.encode(value if isinstance(value, str) else json.dumps(value)))

    tasks = []
    with open(os.path.join(DATA, "report.jsonl")) as f:
        for line in f:
            case = json.loads(line)
            tasks.append(next(m["content"] for m in case["messages"] if m["role"] == "user"))
    params = StdioServerParameters(
        command=binary,
        args=["mcp", "--mcp", f"{sys.executable} {os.path.abspath(__file__)} upstream"],
        cwd=ROOT)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            listed = (await session.list_tools()).tools
            offered = [t.model_dump(by_alias=True, exclude_none=True) for t in listed]
            results = []
            for task in tasks:
                result = await session.call_tool("search_tools", {"query": task})
                assert not result.is_error, result
                results.append(tokens(result.content[0].text))
    before = tokens(catalogue())
    after = tokens(offered)
    return {
        "catalogue": f"LiveMCPBench, {len(catalogue())} tools",
        "tokenizer": "o200k_base (bpe-openai 0.1.4)",
        "tasks": len(tasks),
        "before_tokens_every_request": before,
        "after_tokens_every_request": after,
        "search_result_tokens_median": statistics.median(results),
        "search_result_tokens_max": max(results),
        "after_with_one_search_median": after + statistics.median(results),
        "ratio_before_to_after_with_one_search": round(before / (after + statistics.median(results)), 1),
    }


if __name__ == "__main__":
    if sys.argv[1] == "upstream":
        upstream()
    else:
        print(json.dumps(asyncio.run(measure(sys.argv[1])), indent=1))
