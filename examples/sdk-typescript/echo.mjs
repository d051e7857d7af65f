#!/usr/bin/env node
// The smallest agent: one output chunk per input. (The SDK benchmark's TypeScript agent.)
import { runAgent } from "@metash/sdk";

await runAgent((session, input) => session.output("text/plain", `echo: ${input.prompt}`));
