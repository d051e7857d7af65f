// A real MCP client (the npm registry's TypeScript SDK) driving `metash mcp` over stdio, for
// mcp_revisions.rs: the same steps and output as mcp_client.py.
//
// Usage: node mcp_client.cjs TOOLS MODE VALUE -- SERVER_COMMAND...
//
// TOOLS is the directory whose node_modules hold the libraries (.tools, from scripts/setup).
// MODE `legacy` uses @modelcontextprotocol/sdk 1.x (the `initialize` handshake, newest revision
// 2025-11-25); MODE `auto` uses @modelcontextprotocol/client 2.x with
// `versionNegotiation: {mode: 'auto'}`: it probes with `server/discover` and speaks 2026-07-28
// when the server offers it. Prints one JSON object: the library, the negotiated protocol version,
// the tool names and each call's text.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const { createRequire } = require('node:module');

function usage() {
  process.stderr.write('usage: node mcp_client.cjs TOOLS MODE VALUE -- SERVER_COMMAND...\n');
  process.exit(2);
}

/** `NAME VERSION` from the package's own package.json (which its `exports` do not expose). */
function libraryVersion(load, name) {
  const dir = path.join(path.dirname(load.resolve('./package.json')), 'node_modules', name);
  const pkg = JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8'));
  return `${name} ${pkg.version}`;
}

function textOf(result) {
  return { text: result.content[0].text, is_error: Boolean(result.isError) };
}

async function exercise(client, value) {
  const { tools } = await client.listTools();
  const update = await client.callTool({
    name: 'update_state',
    arguments: { key: 'variables.revision_probe', value },
  });
  const got = await client.callTool({
    name: 'get_state',
    arguments: { key: 'variables.revision_probe' },
  });
  const logged = await client.callTool({
    name: 'log_progress',
    arguments: { message: `revision probe ${value}`, level: 'info' },
  });
  return {
    tools: tools.map((t) => t.name).sort(),
    update_state: textOf(update),
    get_state: textOf(got),
    log_progress: textOf(logged),
  };
}

/** SDK 1.x: the version comes back through the transport hook the client calls after `initialize`. */
async function runLegacy(load, command, value) {
  const { Client } = load('@modelcontextprotocol/sdk/client/index.js');
  const { StdioClientTransport } = load('@modelcontextprotocol/sdk/client/stdio.js');
  class Transport extends StdioClientTransport {
    setProtocolVersion(version) {
      this.negotiated = version;
    }
  }
  const transport = new Transport({ command: command[0], args: command.slice(1) });
  const client = new Client({ name: 'metash-test', version: '0' });
  await client.connect(transport);
  const out = await exercise(client, value);
  out.protocol_version = transport.negotiated;
  out.server_name = client.getServerVersion()?.name ?? null;
  out.library = libraryVersion(load, '@modelcontextprotocol/sdk');
  await client.close();
  return out;
}

/** Client 2.x in `auto` mode. The transport is a subclass so that the probe runs on the same
 * process (the SDK probes on a throw-away sibling process only for its base class), which keeps
 * the recorded wire one conversation. */
async function runModern(load, command, value) {
  const { Client } = load('@modelcontextprotocol/client');
  const { StdioClientTransport } = load('@modelcontextprotocol/client/stdio');
  class Transport extends StdioClientTransport {}
  const transport = new Transport({ command: command[0], args: command.slice(1) });
  const client = new Client(
    { name: 'metash-test', version: '0' },
    { versionNegotiation: { mode: 'auto' } },
  );
  await client.connect(transport);
  const out = await exercise(client, value);
  out.protocol_version = client.getNegotiatedProtocolVersion() ?? null;
  out.server_name = client.getServerVersion()?.name ?? null;
  out.library = libraryVersion(load, '@modelcontextprotocol/client');
  await client.close();
  return out;
}

async function main() {
  const args = process.argv.slice(2);
  if (args.length < 5 || args[3] !== '--') usage();
  const [tools, mode, value] = args;
  const command = args.slice(4);
  const load = createRequire(path.join(path.resolve(tools), 'package.json'));
  let out;
  if (mode === 'legacy') out = await runLegacy(load, command, value);
  else if (mode === 'auto') out = await runModern(load, command, value);
  else usage();
  process.stdout.write(`${JSON.stringify(out)}\n`);
}

main().catch((e) => {
  process.stderr.write(`${e && e.stack ? e.stack : e}\n`);
  process.exit(1);
});
