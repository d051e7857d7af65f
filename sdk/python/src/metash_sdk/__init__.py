"""metash's Python SDK: agents (`run_agent`) and orchestrators (`MetashClient`), with the protocol's
types generated from the JSON Schemas of `metash-protocol` (`metash_sdk.protocol`)."""

from .agent import PROTOCOL_VERSION, AgentError, Consent, Context, Input, Session, StateView, run_agent
from .rpc import MetashClient, RpcError

__all__ = [
    "PROTOCOL_VERSION",
    "AgentError",
    "Consent",
    "Context",
    "Input",
    "MetashClient",
    "RpcError",
    "Session",
    "StateView",
    "run_agent",
]
