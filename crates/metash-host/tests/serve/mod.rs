mod claude;
mod mcp;
mod rpc;
mod spawn;
mod support;
