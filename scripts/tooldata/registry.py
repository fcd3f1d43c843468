#!/usr/bin/env python3
"""Catalogues of real MCP servers' tools, grouped as one agent would connect them.

    scripts/tooldata/registry.py --registry ../shared/tooldata/mcp-registry/servers.json \
        --out scripts/tooldata/written

Writes `registry-X.catalogue.json` for each group below: the servers' tools exactly as their
authors describe them (name, description, inputSchema), each with `_meta.server`. A name two
servers of one group share is prefixed with its server's slug (`slack_search`), as clients that
connect several servers do, so names stay unique. The groups put servers of neighbouring
purposes together (two search engines, three mail and chat servers), so that a catalogue holds
near misses, as a user's does.

Groups `d`, `e` and `h` are the held-out report part (`crates/decide-eval/data/registry/`): no
training, calibration or choice of recipe reads their catalogues or conversations. The others
are training data for the second stage, chosen between by folds of whole groups.
"""
import argparse
import json
import pathlib
import re
import sys

GROUPS = {
    # Operations: containers, clusters, CI, metrics, shells.
    "a": ["gitlab", "docker", "mcp-circleci", "prometheus", "logfire-mcp", "multicluster-mcp-sever",
          "windows-cli", "ssh-exec", "iterm-mcp"],
    # Databases and search indexes.
    "b": ["mongodb", "sqlite", "elasticsearch", "pinecone", "influxdb", "aws-athena",
          "mcp-server-qdrant", "postgresql", "typesense", "firebase"],
    # The web: search engines, scrapers, a browser, maps.
    "c": ["brave-search", "tavily-mcp", "firecrawl", "playwright", "fetcher-mcp",
          "bing-web-search-api", "perplexity", "google-maps", "ticketmaster", "travel-planner"],
    # Messaging and personal productivity (held out).
    "d": ["slack", "gmail", "claudepost", "x-twitter", "calendar", "todoist", "linear", "hubspot",
          "pushover", "mac-messages-mcp"],
    # Notes, documents and knowledge bases (held out).
    "e": ["mcp-obsidian", "anki", "scholarly", "needle-mcp", "notion-mcp", "memory-bank-mcp",
          "kibela", "rememberizer-ai"],
    # Money: accounting, crypto, signatures.
    "f": ["xero-mcp-server", "coin-api-mcp", "crypto-feargreed-mcp", "hyperliquid", "onchain-mcp",
          "mcp-server-esignatures", "agentkit", "base-free-usdc-transfer"],
    # Media, charts and the home.
    "g": ["spotify", "quickchart", "gyazo", "video-editor", "image-generation", "placid-app",
          "cloudinary", "mcp-mermaid", "home-assistant", "excel"],
    # Code: packing, linting, ORMs, sandboxes (held out).
    "h": ["repomix", "nx-mcp", "mcp", "prisma", "sandbox-mcp", "riza-mcp", "python-code-execution",
          "diff-mcp", "git-mcp", "xcodebuild"],
    # Databases and warehouses beyond group b.
    "i": ["airtable", "alicloud-hologres", "azure-adx", "bigquery", "bitable-mcp", "dbhub",
          "greptimedb-mcp-server", "inoyu", "mariadb", "mongodb-lens", "mssql", "mysql", "oceanbase",
          "mcp-server-singlestore", "mcp-server-starrocks", "tinydb", "xiyan-mcp-server",
          "vectorize-mcp-server"],
    # Cloud platforms and developer tools.
    "j": ["aws", "aws-resources-operations", "heroku", "n8n", "postman", "shopify-dev",
          "openapi-anyapi", "openrpc", "edgeone-pages-mcp", "magic-mcp", "vscode-mcp", "codemcp",
          "code-executor", "timer", "json", "llm-context", "jinni"],
    # Search, maps, scraping and social sites beyond group c.
    "k": ["amap", "baidumap", "naver", "exa-mcp-server", "kagimcp", "searxng",
          "openai-websearch-mcp", "oxylabs-mcp", "scrapling-fetch", "rquest", "web-fetch",
          "mcp-browser-use", "txyz-search", "dappier", "virtual-location-google-street-view-etc",
          "mcp-server-weibo", "twitter-mcp", "discourse"],
    # Knowledge bases, retrieval and other models.
    "l": ["atlas-docs-mcp", "aws-kb-retrieval", "graphlit-mcp-server", "langflow-doc-qa-server",
          "llamacloud", "mcp-local-rag", "ragmap", "mediawiki-mcp-server", "obsidian-mcp",
          "any-chat-completions", "deepseek-r1", "deepseek-thinker-mcp", "qwen-max",
          "huggingface-spaces", "phoenix-mcp", "markitdown"],
    # Work management, content, translation, mail and chains.
    "m": ["@john-zhang-dev/xero-mcp-server", "contentful-mcp", "goal-story", "holaspirit",
          "monday-com", "plane-mcp-server", "lara-mcp", "gmail-headless", "chatsum", "mcp-notify",
          "evm-mcp-server", "heurist-mesh-agent"],
    # Analytics, science, games and the MCP tooling itself.
    "n": ["cfbd-api", "data-exploration", "dataset-viewer", "keboola-mcp-server", "mcp-tinybird",
          "materials-project", "nemad", "optimade-mcp-server", "mathematica-check", "dicom", "figma",
          "godot", "unity3d-game-engine", "ida-mcp", "everything", "mcp-compass", "mcp-installer",
          "unifai-mcp-server", "m2m-ssh-gateway"],
}
HELD_OUT = ("d", "e", "h")


def slug(server):
    return re.sub(r"[^a-z0-9]+", "_", server.split("/")[-1].lower()).strip("_")


def catalogue(servers, names):
    tools = []
    counts = {}
    for name in names:
        for tool in servers[name]["tools"]:
            counts[tool["name"]] = counts.get(tool["name"], 0) + 1
    for name in names:
        for tool in servers[name]["tools"]:
            out = tool["name"] if counts[tool["name"]] == 1 else f"{slug(name)}_{tool['name']}"
            tools.append({
                "name": out,
                "description": tool.get("description") or "",
                "inputSchema": tool.get("inputSchema") or {"type": "object", "properties": {}},
                "_meta": {"server": name},
            })
    seen = set()
    for tool in tools:
        if tool["name"] in seen:
            raise SystemExit(f"registry.py: tool name {tool['name']!r} twice after prefixing")
        seen.add(tool["name"])
    return {"tools": tools}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", required=True, type=pathlib.Path)
    parser.add_argument("--out", required=True, type=pathlib.Path)
    args = parser.parse_args()
    try:
        servers = {s["server"]: s for s in json.loads(args.registry.read_text())["servers"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"registry.py: {args.registry}: {e}")
    for group, names in GROUPS.items():
        missing = [n for n in names if n not in servers]
        if missing:
            sys.exit(f"registry.py: {args.registry}: no server {missing[0]!r} (group {group})")
        path = args.out / f"registry-{group}.catalogue.json"
        path.write_text(json.dumps(catalogue(servers, names), indent=2, ensure_ascii=False) + "\n")
        print(f"{path}: {sum(len(servers[n]['tools']) for n in names)} tools of {len(names)} servers",
              file=sys.stderr)


if __name__ == "__main__":
    main()
