/**
 * TypeScript SDK for zygote: copy-on-write microVM sandboxes for AI agents.
 *
 * ```ts
 * import { Sandbox } from "@zygote/sdk";
 * await using sb = await Sandbox.create({ image: "minimal" });
 * console.log((await sb.commands.run("uname -r")).stdout);
 * ```
 */
export {
  Client,
  type ClientOptions,
  type Command,
  type ListOptions,
  type OutputCallback,
  type PullSnapshotOptions,
  type RunOptions,
  DEFAULT_COMMAND_TIMEOUT_MS,
  DEFAULT_REQUEST_TIMEOUT_MS,
  VERSION,
} from "./client.js";
export {
  type BackgroundRunOptions,
  CommandHandle,
  type ConnectOptions,
  MAX_OUTPUT_WAIT_MS,
  ProcessCommands,
  type Signal,
  type WaitOptions,
} from "./commands.js";
export { BranchCollector, type BranchProgress, type ProgressCallback } from "./branch.js";
export {
  type RegistryCredentials,
  type Transfer,
  type TransferCallback,
  TransferCollector,
  type TransferOptions,
} from "./transfer.js";
export { DEFAULT_URL, type Config, resolveConfig } from "./config.js";
export {
  type CodeContext,
  Execution,
  type ExecutionError,
  Result,
  type RunCodeOptions,
  createCodeContext,
  listCodeContexts,
  removeCodeContext,
  restartCodeContext,
  runCode,
} from "./code.js";
export * from "./errors.js";
export { type WatchEvent, WatchHandle, type WatchOptions } from "./watch.js";
export { PTY_PROTOCOL, Pty, PtyHandle, type PtyCreateOptions, type PtyExit, parseControl, ptyQuery } from "./pty.js";
export type {
  BranchFailure,
  BranchResult,
  CommandResult,
  ExposedPort,
  FileEntry,
  ForkHook,
  DiffChange,
  Image,
  DiffEntry,
  KeepResult,
  MergeChange,
  MergeConflict,
  MergeReport,
  MetricSample,
  SandboxDiff,
  NetworkInfo,
  PackOrigin,
  ProcessInfo,
  ProcessOutput,
  PushResult,
  SandboxInfo,
  TtlAction,
  SandboxEvent,
  EgressEntry,
  EventLevel,
  EventsOptions,
  SandboxTree,
  Snapshot,
  TreeNode,
  TransferProgress,
  TreeSnapshot,
  Volume,
  WriteResult,
} from "./models.js";
export {
  type BranchOptions,
  Commands,
  type Connection,
  type CreateOptions,
  DEFAULT_IMAGE,
  Files,
  type MergeOptions,
  type MetricsRange,
  type NetworkMode,
  type NetworkPolicyOptions,
  type OnConflict,
  type RestoreOptions,
  Sandbox,
  type SecretSpec,
  type SnapshotMode,
} from "./sandbox.js";
