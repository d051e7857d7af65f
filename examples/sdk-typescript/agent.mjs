#!/usr/bin/env node
// The notes agent (notes.mjs) as a native program: metash runs it in its native sandbox.
import { runAgent } from "@metash/sdk";

import { notes } from "./notes.mjs";

await runAgent(notes);
