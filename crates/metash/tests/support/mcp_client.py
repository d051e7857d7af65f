"""A real MCP client (PyPI's `mcp` package) driving `metash mcp` over stdio, for mcp_revisions.rs.

Usage: mcp_client.py MODE VALUE -- SERVER_COMMAND...

MODE is `legacy` (the `initialize` handshake of 2025-11-25 and before) or `auto` (mcp 2.x: probe
with `server/discover`, speak the stateless 2026-07-28 revision when the server offers it). The
script lists the tools, sets `variables.revision_probe` to VALUE with `update_state`, reads it
back with `get_state` and logs a progress line, then prints one JSON object on stdout: the
library's version, the negotiated protocol version, the tool names and each call's text.

It uses each major version's own public API (1.x: `ClientSession` over `stdio_client`; 2.x:
`Client`), so what reaches metash is exactly what that library sends.
"""

import asyncio
import json
import sys
from importlib.metadata import version


def text_of(result):
    """The first text block of a tool result, and whether the server flagged it an error."""
    is_error = bool(getattr(result, "isError", None) or getattr(result, "is_error", None))
    return {"text": result.content[0].text, "is_error": is_error}


async def exercise(session_like, value):
    tools = await session_like.list_tools()
    names = sorted(t.name for t in tools.tools)
    update = await session_like.call_tool(
        "update_state", {"key": "variables.revision_probe", "value": value}
    )
    got = await session_like.call_tool("get_state", {"key": "variables.revision_probe"})
    logged = await session_like.call_tool(
        "log_progress", {"message": f"revision probe {value}", "level": "info"}
    )
    return {
        "tools": names,
        "update_state": text_of(update),
        "get_state": text_of(got),
        "log_progress": text_of(logged),
    }


async def run_v1(command, value):
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=command[0], args=command[1:])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            out = await exercise(session, value)
            out["protocol_version"] = init.protocolVersion
            out["server_name"] = init.serverInfo.name
            return out


async def run_v2(mode, command, value):
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=command[0], args=command[1:])
    async with Client(params, mode=mode) as client:
        out = await exercise(client, value)
        out["protocol_version"] = client.protocol_version
        info = client.server_info
        out["server_name"] = info.name if info is not None else None
        return out


def main():
    args = sys.argv[1:]
    if len(args) < 4 or args[2] != "--":
        sys.exit(__doc__)
    mode, value, command = args[0], args[1], args[3:]
    lib = version("mcp")
    if lib.startswith("1."):
        if mode != "legacy":
            sys.exit(f"mcp {lib} speaks only the initialize handshake (mode legacy)")
        out = asyncio.run(run_v1(command, value))
    else:
        out = asyncio.run(run_v2(mode, command, value))
    out["library"] = f"mcp {lib}"
    print(json.dumps(out))


if __name__ == "__main__":
    main()
