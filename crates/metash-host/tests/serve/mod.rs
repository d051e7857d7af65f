mod mcp;
mod rpc;
mod support;
