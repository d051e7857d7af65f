// The WASI 0.2 interfaces `wasi.ts` imports, as componentize-js binds them (jco's naming): only
// what the agent channel uses. The component's world is `sdk/wit/world.wit`.

declare module "wasi:io/streams@0.2.12" {
  export class InputStream {
    /** Blocks until at least one byte (or end of stream: throws `{ tag: "closed" }`). */
    blockingRead(len: bigint): Uint8Array;
  }
  export class OutputStream {
    /** At most 4096 bytes per call. */
    blockingWriteAndFlush(contents: Uint8Array): void;
  }
}

declare module "wasi:cli/stdin@0.2.12" {
  import type { InputStream } from "wasi:io/streams@0.2.12";
  export function getStdin(): InputStream;
}

declare module "wasi:cli/stdout@0.2.12" {
  import type { OutputStream } from "wasi:io/streams@0.2.12";
  export function getStdout(): OutputStream;
}

declare module "wasi:filesystem/types@0.2.12" {
  import type { OutputStream } from "wasi:io/streams@0.2.12";
  export interface PathFlags {
    symlinkFollow?: boolean;
  }
  export interface OpenFlags {
    create?: boolean;
    directory?: boolean;
    exclusive?: boolean;
    truncate?: boolean;
  }
  export interface DescriptorFlags {
    read?: boolean;
    write?: boolean;
  }
  export class Descriptor {
    openAt(pathFlags: PathFlags, path: string, openFlags: OpenFlags, flags: DescriptorFlags): Descriptor;
    writeViaStream(offset: bigint): OutputStream;
  }
}

declare module "wasi:filesystem/preopens@0.2.12" {
  import type { Descriptor } from "wasi:filesystem/types@0.2.12";
  export function getDirectories(): Array<[Descriptor, string]>;
}
